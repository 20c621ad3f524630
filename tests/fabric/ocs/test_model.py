"""The device model: SwitchState invariants and the full-duplex mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.errors import OcsRequestError
from orchestrl.fabric.ocs.model import (
    NOT_EXECUTED, OcsDeviceClient, PortState, SwitchState, cross_connects_to_duplex, duplex_to_cross_connects,
)

N = 8
port = st.integers(min_value=-1, max_value=2 * N + 2)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("connect"), st.lists(st.tuples(port, port), max_size=6), st.sampled_from(["stop", "continue"])),
        st.tuples(st.just("disconnect"), st.lists(port, max_size=6), st.sampled_from(["stop", "continue"])),
        st.tuples(st.just("state"), st.lists(st.integers(1, 2 * N), max_size=3), st.sampled_from(list(PortState))),
    ),
    max_size=25,
)


def _assert_invariants(s: SwitchState) -> None:
    table = s.cross_connects()
    egresses = list(table.values())
    assert len(set(egresses)) == len(egresses), "an egress port is in two cross-connects"
    for ingress, egress in table.items():
        assert s.side(ingress) == "ingress" and s.side(egress) == "egress"
        assert s.peer(ingress) == egress and s.peer(egress) == ingress


@settings(max_examples=200, deadline=None)
@given(ops)
def test_every_port_is_in_at_most_one_cross_connect(sequence):
    s = SwitchState(N)
    for op, arg, extra in sequence:
        before = s.cross_connects()
        if op == "connect":
            result = s.connect(arg, mode=extra)
            assert len(result.statuses) == len(arg)
            for st_ in result.statuses:  # what the result calls applied is in the table
                if st_.ok:
                    assert s.cross_connects()[st_.ingress] == st_.egress
            if extra == "stop":
                first_bad = next((i for i, x in enumerate(result.statuses) if not x.ok), None)
                if first_bad is not None:
                    assert all(x.status == NOT_EXECUTED for x in result.statuses[first_bad + 1:])
            else:
                assert not any(x.status == NOT_EXECUTED for x in result.statuses)
        elif op == "disconnect":
            result = s.disconnect(arg, mode=extra)
            for st_ in result.statuses:
                if st_.ok:
                    assert before[st_.ingress] == st_.egress and st_.ingress not in s.cross_connects()
        else:
            s.set_port_state(arg, extra)
        _assert_invariants(s)


def _bulk_ops(s: SwitchState, sequence):
    """The connect and disconnect operations of ``sequence``; its port-state changes are applied to ``s`` on the way."""
    for op, arg, extra in sequence:
        if op == "state":
            s.set_port_state(arg, extra)
        else:
            yield op, arg, extra


@settings(max_examples=200, deadline=None)
@given(ops)
def test_dry_run_checks_answer_what_the_bulk_would_do_and_change_nothing(sequence):
    s = SwitchState(N)
    for op, arg, extra in _bulk_ops(s, sequence):
        before, states = s.cross_connects(), s.port_status()
        check, refusal = ((s.check_connect(arg), s.connect_refusal(arg)) if op == "connect" else
                          (s.check_disconnect(arg), s.disconnect_refusal(arg)))
        assert s.cross_connects() == before and s.port_status() == states  # nothing changed
        applied = getattr(s.copy(), op)(arg, mode="continue").statuses
        assert check == applied
        assert refusal == next((x for x in applied if not x.ok), None)
        getattr(s, op)(arg, mode=extra)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_an_atomic_bulk_applies_all_or_nothing_and_refuses_as_the_dry_run_says(sequence):
    s = SwitchState(N)
    for op, arg, extra in _bulk_ops(s, sequence):
        before = s.cross_connects()
        if op == "connect":
            refusal, expected = s.connect_refusal(arg), s.copy()
            assert s.connect_atomic(list(arg)) == refusal
            if refusal is None:
                expected.connect(arg)
        else:
            refusal, expected = s.disconnect_refusal(arg), s.copy()
            got, removed = s.disconnect_atomic(arg)
            assert got == refusal
            if refusal is None:
                assert removed == [(x.ingress, x.egress) for x in expected.disconnect(arg).statuses]
        assert s.cross_connects() == (before if refusal is not None else expected.cross_connects())
        _assert_invariants(s)


def test_refusals_name_the_port_and_the_tl1_code():
    s = SwitchState(6)  # ingress 1..6, egress 7..12
    s.set_port_state([1], "failed", "LOS")
    s.set_port_state([2], PortState.FORCE_BLOCKED)
    s.set_port_state([3], PortState.TUNING)
    s.connect([(4, 12)])
    statuses = s.check_connect([(1, 7), (2, 8), (3, 9), (4, 10), (5, 11), (7, 8), (0, 13), (6, 6), (6, 11)])
    assert [x.status for x in statuses] == ["SWFA", "SROF", "SNVS", "SAAL", "ok", "IIAC", "IIAC", "IIAC", "IDNV"]
    assert statuses[0].port == 1 and "LOS" in statuses[0].message
    assert statuses[3].port == 4 and "port 12" in statuses[3].message
    assert statuses[8].port == 6 and "twice" in statuses[8].message  # 6 was named by (6, 6) already
    assert s.cross_connects() == {4: 12}, "check_connect must not change the table"


def test_stop_mode_keeps_earlier_pairs_and_skips_later_ones():
    s = SwitchState(4)
    result = s.connect([(1, 5), (1, 6), (2, 7)], mode="stop")
    assert [x.status for x in result.statuses] == ["ok", "IDNV", NOT_EXECUTED]
    assert result.applied == [(1, 5)] and [x.status for x in result.failed] == ["IDNV"]
    assert s.cross_connects() == {1: 5}


def test_disconnect_is_idempotent_allowed_on_failed_ports_and_refused_while_tuning():
    s = SwitchState(4)
    s.connect([(1, 5), (2, 6)])
    s.set_port_state([1], "failed")
    assert s.disconnect([5, 1, 3]).applied == [(1, 5)]  # both ends named: removed once; port 3 had none
    s.set_port_state([2], "tuning")
    assert [x.status for x in s.disconnect([6]).statuses] == ["SNVS"]
    assert s.cross_connects() == {2: 6}


def test_clear_loses_the_table_but_keeps_failed_ports():
    s = SwitchState(4)
    s.connect([(1, 5)])
    s.set_port_state([2], "failed", "LOS")
    s.set_port_state([1], "tuning")
    s.clear()
    assert s.cross_connects() == {}
    assert s.state(2) is PortState.FAILED and s.state(1) is PortState.NORMAL


def test_bad_mode_and_size_are_refused_with_the_fix():
    with pytest.raises(OcsRequestError, match="stop-on-error"):
        SwitchState(4).connect([], mode="fast")
    with pytest.raises(OcsRequestError, match="ports_per_side"):
        SwitchState(0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(1, n + 1)))),
       st.data())
def test_duplex_circuits_round_trip_through_cross_connects(n_perm, data):
    n, perm = n_perm
    k = data.draw(st.integers(0, n // 2))
    circuits = {tuple(sorted((perm[2 * i], perm[2 * i + 1]))) for i in range(k)}
    table = {}
    for a, b in circuits:
        for ingress, egress in duplex_to_cross_connects(a, b, n):
            assert 1 <= ingress <= n < egress <= 2 * n
            table[ingress] = egress
    view = cross_connects_to_duplex(table, n)
    assert set(view.circuits) == circuits and view.half_circuits == ()


def test_one_direction_only_is_a_half_circuit_and_a_loop_is_a_circuit():
    view = cross_connects_to_duplex({1: 18, 2: 17, 3: 20, 5: 21}, 16)
    assert view.circuits == ((1, 2), (5, 5))
    assert view.half_circuits == ((3, 20),)


def test_duplex_ports_outside_the_switch_are_refused():
    with pytest.raises(OcsRequestError, match=r"duplex port 17 is outside 1\.\.16"):
        duplex_to_cross_connects(1, 17, 16)
    with pytest.raises(OcsRequestError, match="check n"):
        cross_connects_to_duplex({1: 2}, 16)


def test_the_tl1_driver_is_an_ocs_device_client():
    assert isinstance(Tl1Driver("127.0.0.1", 1, ports=4), OcsDeviceClient)
