"""Switching rounds of a non-blocking order: every add step costs the devices one switching delay."""

from hypothesis import given, settings

from orchestrl.fabric.reconfig_check import check_connectivity_preserved
from orchestrl.fabric.reconfig_order import LinkCircuit as L, order_reconfiguration
from tests.fabric.test_safe_window import plan_pairs


def test_circuits_that_protect_nothing_wait_for_the_add_step_that_is_needed_anyway():
    old = [L("d", 1, 2, "a", "b")]  # a-b is dropped; its port 1 goes to e-f
    new = [L("d", 3, 4, "c", "d"), L("d", 1, 5, "e", "f")]  # c-d's ports are free from the start
    order = order_reconfiguration(old, new)
    # adding c-d first would cost a switching round of its own: remove, then one add step for both
    assert [s.action for s in order.steps] == ["remove", "add"]
    assert check_connectivity_preserved(old, new, order.steps) == []


def test_a_protected_pair_is_still_made_before_it_is_broken():
    old = [L("d", 1, 2, "a", "b"), L("d", 5, 6, "x", "y")]
    new = [L("d", 1, 3, "a", "b"), L("d", 7, 8, "c", "d"), L("d", 5, 9, "e", "f")]
    order = order_reconfiguration(old, new)  # a-b moves off port 2 onto port 3: it can only go via an outage
    assert check_connectivity_preserved(old, new, order.steps, order.outage_pairs) == []
    assert sum(s.action == "add" for s in order.steps) == 1


@settings(max_examples=300, deadline=None)
@given(plan_pairs())
def test_every_add_step_but_the_last_makes_a_circuit_of_a_protected_pair(case):
    old, new = case
    order = order_reconfiguration(old, new)
    adds = [s for s in order.steps if s.action == "add"]
    protected = set(order.protected)
    assert all(any(c.pair in protected for c in s.circuits) for s in adds[:-1])


def test_a_kept_cross_connect_relabelled_to_another_far_pod_is_not_torn_down():
    """An Agg lift/drop circuit's label names the PoD its Core circuit reaches: when only that changes, the
    physical cross-connect stays up (it used to raise ValueError and crash a 2,048-GPU plan change)."""
    from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect
    from orchestrl.fabric.reconfig_order import order_plan_change

    xc = CrossConnect("agg-pod0", 3, 40)
    keep = Circuit("agg", 0, "pod0/tor1", "pod0/up:pod1", xc)
    moved = Circuit("agg", 0, "pod0/tor1", "pod0/up:pod2", xc)  # same ports, far PoD re-pointed by the Core plan
    other_old = Circuit("agg", 0, "pod0/tor2", "pod0/tor3", CrossConnect("agg-pod0", 5, 6))
    other_new = Circuit("agg", 0, "pod0/tor2", "pod0/tor3", CrossConnect("agg-pod0", 5, 7))
    old = CircuitPlan("f", "train", "s", 1e9, (keep, other_old))
    new = CircuitPlan("f", "train-dp", "s", 1e9, (moved, other_new))
    order = order_plan_change(old, new)
    touched = {c.xc for step in order.steps for c in step.circuits}
    assert xc not in touched
    assert touched == {CrossConnect("agg-pod0", 5, 6), CrossConnect("agg-pod0", 5, 7)}
