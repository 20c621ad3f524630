"""Fault injection on a real emulator subprocess, and what the driver makes of each fault."""

from __future__ import annotations

import time

import pytest

from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.emulator_control import EmulatorControl, start_emulator_process, stop_emulator_process
from orchestrl.fabric.ocs.errors import OcsAborted, OcsPortFailed, OcsTimeout
from orchestrl.fabric.ocs.model import PortState

from .conftest import N


def test_a_failed_port_refuses_connects_and_shows_failed_until_repaired(make_driver, control):
    drv = make_driver(ports=N)
    drv.connect([(3, 20)])
    control.fail_ports([3, 21], alarm="LOS; fibre cut")
    with pytest.raises(OcsPortFailed, match=r"port 21.*SWFA.*LOS; fibre cut.*mask the failed port") as info:
        drv.connect([(4, 21)])
    assert info.value.ports == (21,)
    status = drv.port_status()
    assert (status[3].state, status[3].alarm) == (PortState.FAILED, "LOS (-60.00 dBm)")  # no light in (power read)
    assert status[4].state is PortState.NORMAL
    assert drv.alarms() == {3: "MJ,LOS; fibre cut", 21: "MJ,LOS; fibre cut"}
    assert any("3:MJ,LOS; fibre cut" in a.data for a in drv.autonomous)  # the alarm report was skipped, kept
    assert drv.disconnect([3]).applied == [(3, 20)]  # a failed circuit can still be cleared
    control.repair_ports([21])
    assert drv.connect([(4, 21)]).ok


def test_a_dropped_reply_times_out_but_the_command_was_applied(make_driver, control):
    drv = make_driver(ports=N, timeout_s=0.5)
    drv.open()
    control.drop_replies(next_n=1)
    with pytest.raises(OcsTimeout, match="no reply within 0.5 s.*read it back"):
        drv.connect([(5, 22), (6, 23)])
    drv.timeout_s = 10.0
    assert drv.cross_connects() == {5: 22, 6: 23}  # nothing lost: read back on a fresh session
    assert drv.sessions == 2
    assert control.settings()["DROPPED"] == "1"


def test_a_delayed_reply_is_waited_for_or_times_out(make_driver, control):
    control.delay_replies(300)
    patient = make_driver(ports=N, timeout_s=10)
    patient.open()
    t0 = time.monotonic()
    assert patient.connect([(7, 24)]).ok
    assert time.monotonic() - t0 >= 0.3
    hasty = make_driver(ports=N, timeout_s=0.1)
    hasty.open()
    with pytest.raises(OcsTimeout):
        hasty.disconnect([7])
    control.delay_replies(0)
    assert hasty.cross_connects() == {}  # the late DLT-PATCH reply is never taken for this one


def test_a_partial_bulk_raises_aborted_with_the_pairs_that_were_applied(make_driver, control):
    drv = make_driver(ports=N)
    control.partial_bulk(2)
    pairs = [(1, 17), (2, 18), (3, 19), (4, 20)]
    with pytest.raises(OcsAborted, match=r"SABT.*read back: 2 of 4 pairs applied \(1->17, 2->18\)") as info:
        drv.connect(pairs)
    assert info.value.applied == ((1, 17), (2, 18))
    assert info.value.unapplied == ((3, 19), (4, 20))
    assert drv.cross_connects() == {1: 17, 2: 18}
    assert drv.connect([(3, 19), (4, 20)]).ok  # a bulk of at most k pairs is not cut


@pytest.mark.parametrize("keep", [True, False])
def test_after_a_restart_the_driver_reconnects_and_logs_in_again(make_driver, control, keep):
    drv = make_driver(ports=N)
    drv.connect([(8, 25), (9, 26)])
    control.restart(keep_table=keep, down_ms=300)
    assert drv.cross_connects() == ({8: 25, 9: 26} if keep else {})
    assert drv.sessions == 2
    assert drv.connect([(10, 27)]).ok  # writes work on the new session too


def test_faults_set_from_the_command_line():
    emu = start_emulator_process(N, "rotor", extra_args=["--fail-ports", "3,7", "--partial-bulk", "1",
                                                         "--delay-replies-ms", "200", "--drop-replies", "1.0",
                                                         "--seed", "1"])
    try:
        control = EmulatorControl(emu.host, emu.port)  # control verbs are never dropped or delayed
        settings = control.settings()
        assert (settings["FAILED"], settings["PARTIAL"], settings["DELAYMS"], settings["DROP"]) == \
            ("3&7", "1", "200", "1.0")
        with Tl1Driver(emu.host, emu.port, password="admin", ports=N, timeout_s=0.5) as drv:
            drv.open()  # replies to ACT-USER are never dropped, so a session opens
            with pytest.raises(OcsTimeout):
                drv.connect([(1, 17)])
            control.drop_replies(0)
            drv.timeout_s = 10
            assert drv.cross_connects() == {1: 17}  # the command ran; only its reply was lost
            status = drv.port_status([3, 7, 4])
            assert [s.state for s in status.values()] == [PortState.FAILED, PortState.FAILED, PortState.NORMAL]
            t0 = time.monotonic()
            with pytest.raises(OcsAborted) as info:
                drv.connect([(2, 18), (5, 21)])
            assert time.monotonic() - t0 >= 0.2  # the delayed DENY
            assert info.value.applied == ((2, 18),)
    finally:
        stop_emulator_process(emu.process)
