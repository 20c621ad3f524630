"""Ordered commits: the journalled states of a change, and what the devices pass through between them."""

from collections import Counter

from hypothesis import given, settings

from orchestrl.agents.service.ordered_commit import plan_change
from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect, diff_plans
from tests.fabric.test_safe_window import plan_pairs


def _plan(circuits) -> CircuitPlan:
    return CircuitPlan("f", "train", "s", 1e9, tuple(
        Circuit("agg", 0, *sorted((c.a_endpoint, c.b_endpoint)), CrossConnect(c.device, c.a_port, c.b_port))
        for c in circuits))


def _pairs(xcs, ends) -> set[tuple[str, str]]:
    return {ends[x] for x in xcs}


@settings(max_examples=300, deadline=None)
@given(plan_pairs())
def test_every_state_inside_a_commit_keeps_the_pairs_the_order_keeps(case):
    old, new = _plan(case[0]), _plan(case[1])
    change = plan_change(old, new)
    assert change.targets[-1] is new
    order_steps = len(change.order.steps) if change.order is not None else 1
    assert change.steps <= max(order_steps, 1)
    ends = {c.xc: (c.a, c.b) for plan in (old, new) for c in plan.circuits}
    protected = _pairs(old.cross_connects(), ends) & _pairs(new.cross_connects(), ends)
    allowed = {o.pair for o in change.order.outages} if change.order is not None else protected
    before = old
    for target in change.targets:
        diff = diff_plans(before, target)
        # Each device removes, then adds; devices go at any pace. Every state in between holds at
        # least what is left once every removal is done, so that state must keep the pairs up.
        low = before.cross_connects() - set(diff.remove)
        assert protected - _pairs(low, ends) <= allowed
        # and on every device the adds only need ports that device's removals freed
        used = Counter((x.device, p) for x in target.cross_connects() for p in (x.a_port, x.b_port))
        assert max(used.values(), default=1) == 1
        before = target


def test_a_remove_step_and_the_add_step_after_it_are_one_commit():
    from orchestrl.fabric.reconfig_order import LinkCircuit as L
    old = [L("d", 1, 2, "t1", "t2"), L("d", 5, 6, "t1", "t3")]
    new = [L("d", 1, 3, "t1", "t2"), L("d", 5, 7, "t1", "t3"), L("d", 8, 9, "t1", "t2")]
    change = plan_change(_plan(old), _plan(new))
    # add 8-9 | remove 1-2 + add 1-3 | remove 5-6 + add 5-7: five order steps, three commits
    assert [s.action for s in change.order.steps] == ["add", "remove", "add", "remove", "add"]
    assert change.steps == 3
