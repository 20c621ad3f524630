"""Tl1Driver against a real emulator subprocess over TCP: sessions, bulks, DENY codes, ctags."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.emulator_control import start_emulator_process, stop_emulator_process
from orchestrl.fabric.ocs.errors import (
    OcsAuthError, OcsCommandError, OcsConnectionError, OcsInvalidPort, OcsPortBlocked, OcsPortBusy, OcsPortFailed,
    OcsPortInUse, OcsRequestError, OcsTimeout, denied_from_code,
)
from orchestrl.fabric.ocs.model import PortState
from orchestrl.fabric.ocs.tl1 import Autonomous, Response, Tl1Splitter, format_response, parse_command, parse_response

from .conftest import N
from .tuning import port_tuning


def _raw(host: str, port: int, *commands: str) -> list[Response]:
    """Send raw TL1 text on a fresh connection; return the responses, in order."""
    out: list[Response] = []
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall("".join(commands).encode())
        splitter = Tl1Splitter()
        while len(out) < len(commands):
            for block in splitter.feed(sock.recv(65536)):
                msg = parse_response(block)
                if isinstance(msg, Response):
                    out.append(msg)
    return out


def test_connect_list_disconnect(make_driver, control):
    drv = make_driver()
    assert drv.ports is None and drv.open().ports == N  # read from the device (RTRV-EQPT) at login
    result = drv.connect([(1, 17), (2, 18), (3, 30)])
    assert result.ok and result.applied == [(1, 17), (2, 18), (3, 30)]
    assert drv.cross_connects() == {1: 17, 2: 18, 3: 30}
    removed = drv.disconnect([17, 3, 5])  # either side; a port without a cross-connect is a no-op
    assert [(s.ingress, s.egress) for s in removed.statuses] == [(1, 17), (3, 30)]
    assert drv.cross_connects() == {2: 18}
    assert drv.sessions == 1


def test_a_bulk_of_k_pairs_is_one_command(make_driver, control):
    drv = make_driver(ports=N).open()
    before = int(control.settings()["COMMANDS"])
    drv.connect([(i, N + i) for i in range(1, N + 1)])
    assert int(control.settings()["COMMANDS"]) - before == 2  # one ENT-PATCH + the RTRV-EMUL itself


def test_one_bulk_costs_one_switching_delay_on_mems():
    k = 128
    emu = start_emulator_process(k, "mems-3d")  # 10 ms per reconfiguration (Table 2)
    try:
        with Tl1Driver(emu.host, emu.port, password="admin", timeout_s=10, switch_delay_s=0.01) as drv:
            drv.open()
            t0 = time.monotonic()
            assert drv.connect([(i, k + i) for i in range(1, k + 1)]).ok
            bulk_s = time.monotonic() - t0
            t0 = time.monotonic()
            for i in range(1, 5):
                drv.disconnect([i])
                drv.connect([(i, k + i)])
            four_s = time.monotonic() - t0
    finally:
        stop_emulator_process(emu.process)
    assert bulk_s >= 0.01  # the bulk waited for the mirrors...
    assert bulk_s < k * 0.01 / 2  # ...once: 128 pairs one at a time would take 1.28 s
    assert four_s >= 0.04  # four separate connects pay four delays


@pytest.mark.parametrize("setup, pair, exc, code, port", [
    (lambda ctl, drv: drv.connect([(1, 17)]), (1, 18), OcsPortInUse, "SAAL", 1),
    (lambda ctl, drv: ctl.fail_ports([2]), (2, 18), OcsPortFailed, "SWFA", 2),
    (lambda ctl, drv: drv.block([19]), (3, 19), OcsPortBlocked, "SROF", 19),
])
def test_each_refusal_raises_its_exception_and_changes_nothing(make_driver, control, setup, pair, exc, code, port):
    drv = make_driver(ports=N)
    setup(control, drv)
    before = drv.cross_connects()
    with pytest.raises(exc) as info:
        drv.connect([(10, 26), pair])  # the good pair in the same bulk is not applied either
    assert (info.value.code, info.value.device, info.value.ports) == (code, "emu0", (port,))
    assert f"port {port}" in str(info.value)
    assert drv.cross_connects() == before


def test_ports_outside_the_device_are_refused_by_the_device(make_driver, control):
    drv = make_driver(ports=2 * N)  # misconfigured: thinks the switch is 32x32
    with pytest.raises(OcsInvalidPort, match=r"port 40 is outside 1\.\.32.*use ingress ports 1\.\.N") as info:
        drv.connect([(1, 40)])
    assert info.value.code == "IIAC" and info.value.ports == (40,)


def test_bad_requests_are_refused_before_sending():
    drv = Tl1Driver("127.0.0.1", 9, ports=N)  # nothing listens: any send would fail
    with pytest.raises(OcsRequestError, match="not an egress port"):
        drv.connect([(1, 2)])
    with pytest.raises(OcsRequestError, match="named twice"):
        drv.connect([(1, 17), (1, 18)])
    with pytest.raises(OcsRequestError, match="stop-on-error"):
        drv.connect([(1, 17)], mode="later")


def test_continue_mode_reports_each_refused_pair_and_applies_the_rest(make_driver, control):
    drv = make_driver(ports=N)
    drv.connect([(1, 17)])
    control.fail_ports([4])
    result = drv.connect([(2, 18), (1, 19), (4, 20), (5, 21)], mode="continue")
    assert [s.status for s in result.statuses] == ["ok", "SAAL", "SWFA", "ok"]
    assert result.statuses[1].port == 1 and "already" in result.statuses[1].message
    assert drv.cross_connects() == {1: 17, 2: 18, 5: 21}


def test_wrong_password_is_an_auth_error(make_driver, control):
    with pytest.raises(OcsAuthError, match="PIUI.*check the user and password") as info:
        make_driver(password="nope").cross_connects()
    assert info.value.code == "PIUI"


def test_a_forgotten_login_is_renewed_transparently(make_driver, control):
    drv = make_driver(ports=N).open()
    drv._command("CANC-USER", drv.user)  # the device now refuses us with PLNA
    assert drv.cross_connects() == {}
    assert drv.sessions == 2


@pytest.mark.parametrize("login, command, code, exc", [
    (False, "RTRV-PATCH:::5:;", "PLNA", OcsAuthError),
    (False, "ACT-USER::admin:5::wrong;", "PIUI", OcsAuthError),
    (True, "FLY-AWAY:::5:;", "ICNV", OcsCommandError),
    (True, "ENT-PATCH::1&2,17:5:;", "IIPG", OcsCommandError),
    (True, "ENT-PATCH::x,17:5:;", "IISP", OcsCommandError),
    (True, "ENT-PATCH::1&1,17&18:5:;", "IDNV", OcsCommandError),
])
def test_raw_refusals_map_to_their_exceptions(emulator, control, login, command, code, exc):
    commands = ["ACT-USER::admin:1::admin;"] * login + [command]
    resp = _raw(emulator.host, emulator.port, *commands)[-1]
    assert (resp.ctag, resp.status, resp.code) == ("5", "DENY", code)
    assert isinstance(denied_from_code("emu0", command.split(":")[0], resp.code, resp.comment), exc)


def test_tuning_ports_refuse_commands_until_the_mirror_settles(make_driver, control):
    slow, other = make_driver(ports=N, timeout_s=20), make_driver(ports=N)
    with port_tuning(control, slow, other, (1, 17)) as done:  # slow mirrors: the second client sees them move
        with pytest.raises(OcsPortBusy, match="SNVS.*retry after the switching delay"):
            other.connect([(1, 18)])
        with pytest.raises(OcsPortBusy):
            other.disconnect([17])
    assert done and done[0].ok
    assert {s.state for s in other.port_status([1, 17]).values()} == {PortState.NORMAL}
    assert other.cross_connects() == {1: 17}


def test_unreachable_device_is_a_connection_error_naming_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    drv = Tl1Driver("127.0.0.1", port, name="core0", ports=N, connect_attempts=2, backoff_s=0.01, timeout_s=2)
    with pytest.raises(OcsConnectionError, match=rf"OCS 'core0'.*127.0.0.1:{port} after 2 attempts.*devices.yaml"):
        drv.cross_connects()


def _fake_device(replies_for_patch) -> tuple[socket.socket, threading.Thread]:
    """A TL1 server that logs anyone in and answers RTRV-PATCH with ``replies_for_patch(ctag)``."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            splitter = Tl1Splitter()
            while data := conn.recv(65536):
                for text in splitter.feed(data):
                    cmd = parse_command(text)
                    if cmd.verb == "RTRV-PATCH":
                        conn.sendall("".join(format_response(r) for r in replies_for_patch(cmd.ctag)).encode())
                    else:
                        conn.sendall(format_response(Response(cmd.ctag, "COMPLD")).encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_stale_replies_and_alarms_are_skipped_by_ctag():
    server, thread = _fake_device(lambda ctag: [
        Response("999", "COMPLD", ("9,25",)),  # a late answer to some earlier command
        Autonomous("1", "**", "REPT ALM OCS", ("3:MJ,LOS",)),
        Response(ctag, "COMPLD", ("1,17",)),
    ])
    try:
        with Tl1Driver("127.0.0.1", server.getsockname()[1], ports=N, timeout_s=10) as drv:
            assert drv.cross_connects() == {1: 17}
            assert [a.data for a in drv.autonomous] == [("3:MJ,LOS",)]
    finally:
        server.close()
        thread.join(5)


def test_disconnect_then_connect_is_one_round_trip_and_reuses_the_freed_ports(make_driver, control):
    drv = make_driver(ports=N).open()
    drv.connect([(1, 17), (2, 18)])
    writes: list[list[str]] = []
    write = drv._write
    drv._write = lambda cmds: writes.append([c.verb for c in cmds]) or write(cmds)
    removed, added = drv.disconnect_then_connect([1, 2], [(1, 18), (2, 17)])  # the ports the removal frees
    assert writes == [["DLT-PATCH", "ENT-PATCH"]]  # both sent before any reply was read
    assert [(s.ingress, s.egress) for s in removed.statuses] == [(1, 17), (2, 18)]
    assert added.applied == [(1, 18), (2, 17)]
    assert drv.cross_connects() == {1: 18, 2: 17}


def test_a_refused_removal_raises_its_exception_and_the_connect_sent_with_it_still_runs(make_driver, control):
    slow, drv = make_driver(ports=N, timeout_s=20), make_driver(ports=N)
    drv.connect([(2, 18)])
    with port_tuning(control, slow, drv, (1, 17)):  # port 1's cross-connect is still moving below
        with pytest.raises(OcsPortBusy, match="DLT-PATCH.*SNVS") as info:
            drv.disconnect_then_connect([1, 2], [(3, 19)])
        assert info.value.command == "DLT-PATCH" and info.value.code == "SNVS"
    assert drv.cross_connects() == {1: 17, 2: 18, 3: 19}  # nothing removed (atomic), the connect applied


def test_a_refused_connect_after_a_removal_raises_its_exception(make_driver, control):
    drv = make_driver(ports=N)
    drv.connect([(1, 17), (2, 18)])
    control.fail_ports([4])
    with pytest.raises(OcsPortFailed, match="ENT-PATCH.*SWFA") as info:
        drv.disconnect_then_connect([1], [(4, 20)])
    assert info.value.ports == (4,)
    assert drv.cross_connects() == {2: 18}  # the removal went through, the connect did not
    with pytest.raises(OcsRequestError, match="not an egress port"):  # checked before anything is sent
        drv.disconnect_then_connect([2], [(3, 4)])
    assert drv.cross_connects() == {2: 18}


def test_send_then_collect_drives_two_sessions_at_once_and_returns_what_the_one_call_method_does(
        make_driver, control):
    first, second = make_driver(ports=N).open(), make_driver(ports=N).open()
    first.connect([(1, 17), (2, 18)])
    pending = [first.send_disconnect_then_connect([1, 2], [(1, 18), (2, 17)]),  # both written before either reply
               second.send_disconnect_then_connect([], [(3, 19)])]  # an addition alone: one command
    assert len(pending[0].ctags) == 2 and len(pending[1].ctags) == 1
    (removed, added), (nothing, added_too) = first.collect(pending[0]), second.collect(pending[1])
    assert [(s.ingress, s.egress) for s in removed.statuses] == [(1, 17), (2, 18)]
    assert added.applied == [(1, 18), (2, 17)] and nothing.statuses == [] and added_too.applied == [(3, 19)]
    assert first.cross_connects() == {1: 18, 2: 17, 3: 19}
    with pytest.raises(ValueError, match="collected already"):
        first.collect(pending[0])
    assert first.sessions == second.sessions == 1


def test_a_reply_another_command_reads_first_is_kept_for_its_handle(make_driver, control):
    drv = make_driver(ports=N).open()
    pending = drv.send_disconnect_then_connect([], [(1, 17)])
    assert drv.cross_connects() == {1: 17}  # this read meets the pending reply first, and keeps it
    assert drv.collect(pending)[1].applied == [(1, 17)]


def test_a_lost_reply_times_out_at_collect_and_a_refusal_raises_there(make_driver, control):
    drv = make_driver(ports=N, timeout_s=0.3).open()
    control.drop_replies(next_n=1)
    pending = drv.send_disconnect_then_connect([], [(1, 17)])
    with pytest.raises(OcsTimeout, match="ENT-PATCH.*no reply within 0.3 s.*read it back"):
        drv.collect(pending)
    assert drv.cross_connects() == {1: 17} and drv.sessions == 2  # applied; the next command opened a new session
    control.fail_ports([4])
    pending = drv.send_disconnect_then_connect([1], [(4, 20)])  # the refusal comes with the reply
    with pytest.raises(OcsPortFailed, match="ENT-PATCH.*SWFA"):
        drv.collect(pending)
