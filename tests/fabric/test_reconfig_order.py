"""Switching rounds of a non-blocking order: every add step costs the devices one switching delay."""

from hypothesis import given, settings

from fabric.reconfig_check import check_connectivity_preserved
from fabric.reconfig_order import LinkCircuit as L, order_reconfiguration
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
