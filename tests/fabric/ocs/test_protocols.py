"""Every adapter against its emulator, and third-party clients (ncclient, pygnmi, raw TL1) against our emulators.

Each emulator is a real subprocess on the shared device core; what our adapter writes must read back
identically through a client nobody here wrote, and what that client writes must read back through
our adapter. Faults injected through the shared control verbs behave alike over every protocol.
"""

from __future__ import annotations

import socket

import pytest

from orchestrl.fabric.ocs.devices import open_adapter
from orchestrl.fabric.ocs.emulator_control import start_emulator_process, stop_emulator_process
from orchestrl.fabric.ocs.errors import OcsAuthError, OcsConnectionError, OcsPortFailed, OcsPortInUse, OcsTimeout
from orchestrl.fabric.ocs.model import PortState
from orchestrl.fabric.ocs.tl1 import Acknowledgement, Response, Tl1Splitter, parse_response

N = 8
NS = "http://www.polatis.com/yang/optical-switch"


@pytest.fixture(scope="module", params=["tl1", "netconf", "gnmi"])
def switch(request):
    emu = start_emulator_process(N, "rotor", protocol=request.param, extra_args=["--sid", "Polatis OXC"])
    try:
        yield emu
    finally:
        stop_emulator_process(emu.process)


@pytest.fixture
def adapter(switch):
    switch.control().clear("ALL")
    drv = open_adapter(switch.protocol, switch.host, switch.port, name="sw", user="admin", password="admin",
                       timeout_s=10)
    yield drv
    drv.close()


def test_the_adapter_contract_holds_over_every_protocol(switch, adapter):
    assert adapter.open().ports == N  # the size is read from the switch (PARAMETER=SIZE, port-config, OCS_PORT)
    assert adapter.connect([(1, 9), (2, 10)]).ok
    assert adapter.cross_connects() == {1: 9, 2: 10}
    with pytest.raises(OcsPortInUse):
        adapter.connect([(3, 10)])  # egress 10 is taken: refused whole, nothing applied
    assert adapter.cross_connects() == {1: 9, 2: 10}
    assert adapter.disconnect([10]).applied == [(2, 10)]  # by either side
    switch.control().fail_ports([4], alarm="LOS")
    switch.control().block_ports([5])
    status = adapter.port_status([4, 5, 6])
    assert [status[p].state for p in (4, 5, 6)] == [PortState.FAILED, PortState.FORCE_BLOCKED, PortState.NORMAL]
    with pytest.raises(OcsPortFailed):
        adapter.connect([(4, 12)])
    assert adapter.identity() == "serial POLATISOXC"  # the same switch answers the same under any address
    caps = adapter.capabilities
    assert caps.protocol == switch.protocol and caps.atomic


def test_a_lost_reply_times_out_and_the_change_reads_back(switch, adapter):
    adapter.open()
    switch.control().drop_replies(next_n=1)
    adapter.timeout_s = 0.5
    with pytest.raises((OcsTimeout, OcsConnectionError)):
        adapter.connect([(6, 14)])
    adapter.timeout_s = 10
    # TL1 and gNMI applied it and only the reply was lost; over NETCONF the lost reply is the candidate edit's,
    # so nothing was committed, and the candidate it left is discarded by the next session: either way the
    # read-back says what holds, and nothing half-done surfaces later
    held = adapter.cross_connects()
    assert held == ({} if switch.protocol == "netconf" else {6: 14})
    assert adapter.connect([(7, 15)]).ok and adapter.cross_connects() == {**held, 7: 15}


def test_a_partial_bulk_is_reported_with_what_was_applied(switch, adapter):
    switch.control().partial_bulk(1)
    with pytest.raises(Exception) as info:
        adapter.connect([(1, 9), (2, 10)])
    assert getattr(info.value, "code", "") == "SABT"
    switch.control().partial_bulk(None)
    assert adapter.cross_connects() == {1: 9}


def test_wrong_credentials_are_refused_by_name(switch):
    drv = open_adapter(switch.protocol, switch.host, switch.port, name="sw", user="admin", password="nope",
                       timeout_s=5, connect_attempts=1)
    with pytest.raises((OcsAuthError, OcsConnectionError), match="PIUI|refused|password"):
        drv.cross_connects()


def test_ncclient_used_directly_reads_and_changes_the_netconf_switch():
    from ncclient import manager

    emu = start_emulator_process(N, "test", protocol="netconf")
    ours = open_adapter("netconf", emu.host, emu.port, name="sw", password="admin", timeout_s=10)
    try:
        assert ours.connect([(1, 9), (3, 12)]).ok
        with manager.connect(host=emu.host, port=emu.port, username="admin", password="admin", hostkey_verify=False,
                             look_for_keys=False, allow_agent=False, timeout=10) as m:
            assert any(c.startswith(NS) for c in m.server_capabilities)
            assert ":candidate" in m.server_capabilities and ":confirmed-commit:1.1" in m.server_capabilities
            reply = m.get_config(source="running", filter=("subtree", f"<cross-connects xmlns='{NS}'/>"))
            pairs = {(int(p.findtext(f"{{{NS}}}ingress")), int(p.findtext(f"{{{NS}}}egress")))
                     for p in reply.data_ele.iter(f"{{{NS}}}pair")}
            assert pairs == {(1, 9), (3, 12)}  # what our adapter wrote reads back identically through ncclient
            m.edit_config(target="candidate", config=f"<config xmlns='urn:ietf:params:xml:ns:netconf:base:1.0'>"
                          f"<cross-connects xmlns='{NS}'><pair><ingress>2</ingress><egress>10</egress></pair>"
                          f"<pair xmlns:nc='urn:ietf:params:xml:ns:netconf:base:1.0' nc:operation='delete'>"
                          f"<ingress>1</ingress></pair></cross-connects></config>")
            assert ours.cross_connects() == {1: 9, 3: 12}  # a candidate edit changes nothing until committed
            m.commit(confirmed=True, timeout="60")
            m.commit()
        assert ours.cross_connects() == {2: 10, 3: 12}
    finally:
        ours.close()
        stop_emulator_process(emu.process)


def test_a_plain_gnmi_client_reads_and_changes_the_sonic_switch():
    from pygnmi.client import gNMIclient

    emu = start_emulator_process(N, "test", protocol="gnmi")
    ours = open_adapter("gnmi", emu.host, emu.port, name="sw", password="admin", timeout_s=10)
    try:
        assert ours.connect([(1, 9), (3, 12)]).ok
        with gNMIclient(target=(emu.host, emu.port), username="admin", password="admin", insecure=True) as gc:
            got = gc.get(path=["OCS_CROSS_CONNECT"], target="STATE_DB", encoding="json_ietf")
            rows = got["notification"][0]["update"][0]["val"]
            assert {(r["a_side"], r["b_side"]) for r in rows.values()} == {("1A", "1B"), ("3A", "4B")}
            assert {r["a_side_status"] for r in rows.values()} == {"tuned"}
            gc.set(delete=["OCS_CROSS_CONNECT/1A-1B"], update=[("OCS_CROSS_CONNECT/2A-2B", {"a_side": "2A",
                                                                                          "b_side": "2B"})],
                   target="CONFIG_DB", encoding="json_ietf")
        assert ours.cross_connects() == {2: 10, 3: 12}
    finally:
        ours.close()
        stop_emulator_process(emu.process)


def _raw(port: int, text: str, wanted: int) -> list:
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(text.encode())
        splitter = Tl1Splitter()
        while len([m for m in out if isinstance(m, Response)]) < wanted:
            out += [parse_response(b) for b in splitter.feed(sock.recv(65536)) if b.strip(" \r\n")]
    return out


def test_the_tl1_emulator_sends_the_polatis_reply_forms():
    emu = start_emulator_process(N, "mems-3d", protocol="tl1", extra_args=["--sid", "Polatis OXC",
                                                                          "--switch-delay-ms", "400"])
    try:
        msgs = _raw(emu.port, "ACT-USER::admin:1::admin;RTRV-EQPT::SYSTEM:2:::PARAMETER=SIZE;ENT-PATCH::1,9:3:;"
                              "ENT-PATCH::1,10:4:;RTRV-PORT-STATUS:::5:;RTRV-PORT-SHUTTER::1&&2:6:;", 6)
        resp = {m.ctag: m for m in msgs if isinstance(m, Response)}
        assert resp["1"].sid == "Polatis OXC"  # a SID with a space
        assert resp["2"].data == ("SYSTEM:SIZE=8x8",)
        assert any(isinstance(m, Acknowledgement) and m.ctag == "3" for m in msgs)  # IP 3 while the mirror moves
        assert (resp["4"].status, resp["4"].code, resp["4"].data) == ("DENY", "SNVS", ("1",))  # "1:ERRCDE=SNVS": moving
        assert (resp["5"].status, resp["5"].code) == ("DENY", "ICNV")  # no Polatis switch answers RTRV-PORT-STATUS
        assert resp["6"].data == ("1:OPEN", "2:OPEN")
    finally:
        stop_emulator_process(emu.process)


def test_tl1_over_ssh_drives_the_switch_with_the_same_driver():
    emu = start_emulator_process(N, "test", protocol="tl1", extra_args=["--ssh"])
    try:
        with open_adapter("tl1", emu.host, emu.port, name="sw", password="admin", timeout_s=10, transport="ssh") as drv:
            assert drv.connect([(1, 9)]).ok and drv.cross_connects() == {1: 9}
            assert drv.capabilities.transport == "ssh"
    finally:
        stop_emulator_process(emu.process)
