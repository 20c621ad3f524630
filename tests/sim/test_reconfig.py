"""RFabric in time: the real controller's plans, gated by SafeWindowGate, applied in non-blocking steps."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.safe_window import CollectiveEvent, GateConfig
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.events import FlowSet, simulate
from orchestrl.fabric.reconfig_order import order_plan_change
from orchestrl.sim.network.reconfig import RFabricDriver

B = 200e9
PIEZO_S = 25e-3  # Table 2; the default RFabric's OCS technology


@pytest.fixture()
def fab():
    return build_fabric("rfabric", 128)  # one PoD, 8 rail ToRs


def _a2a(members, size=1e9, stage="train", period="ep"):
    return Intent(stage, "job", period, (Collective("all-to-all", groups=(tuple(members),), bytes_per_rank=size),))


def _windows(drv, stage, slack_s, n=5, t0=0.0, prim="all-to-all"):
    """n collectives of 1 ms separated by ``slack_s`` of compute; returns the time after the last end."""
    t = last = t0
    for _ in range(n):
        drv.observe("job", CollectiveEvent("start", t, stage, prim, "ep0"))
        last = t + 1e-3
        drv.observe("job", CollectiveEvent("end", last, stage, prim, "ep0"))
        t = last + slack_s
    return last


def test_a_train_plan_commits_only_when_the_predicted_slack_covers_the_switching(fab):
    drv = RFabricDriver(fab)
    end = _windows(drv, "train", slack_s=10e-3, n=6)  # five 10 ms windows < 25 ms + guard
    d = drv.announce(_a2a(range(0, 128, 4)), now_s=end)
    assert d.action == "defer" and "predicted slack" in d.reason
    drv2 = RFabricDriver(fab)
    end = _windows(drv2, "train", slack_s=50e-3, n=6)
    d = drv2.announce(_a2a(range(0, 128, 4)), now_s=end)
    assert d.action == "commit"
    assert d.change.start_s == pytest.approx(end) and d.change.switching_s == pytest.approx(PIEZO_S)


def test_a_gen_plan_waits_for_a_deployment_boundary(fab):
    drv = RFabricDriver(fab, gate_config=GateConfig(min_observations=1))
    gen = _a2a(range(0, 128, 4), stage="gen", period="decode")
    t = _windows(drv, "gen", slack_s=1.0, n=3)
    d = drv.announce(gen, now_s=t)
    assert d.action == "defer" and "deployment boundary" in d.reason
    out = drv.observe("job", CollectiveEvent("deployment-boundary", t + 0.1, window_hint_s=1.0))
    assert [x.action for x in out] == ["commit"]
    assert out[0].change.start_s == pytest.approx(t + 0.1)
    assert drv.active is out[0].result.plan


def test_pairs_both_plans_connect_stay_connected_through_every_step_of_a_change(fab):
    drv = RFabricDriver(fab)
    first = drv.controller.materialize(_a2a(range(0, 64, 4)))
    drv.install(first, at_s=0.0)
    second = drv.controller.materialize(_a2a(range(0, 128, 2)))  # more rails: ToR 0 gives up ports
    order = order_plan_change(first.plan, second.plan)
    change = drv._commit(second, 1.0, None)
    pairs = lambda cs: {tuple(sorted((c.a, c.b))) for c in cs}  # noqa: E731
    protected = pairs(first.plan.circuits) & pairs(second.plan.circuits) - set(order.outage_pairs)
    assert protected and len(change.snapshots) == len(order.steps) >= 2
    for t, circuits in change.snapshots:
        assert protected <= pairs(circuits), f"a protected pair lost its last circuit at t={t}"
    assert {c.xc for c in change.snapshots[-1][1]} == {c.xc for c in second.plan.circuits}
    adds = sum(s.action == "add" for s in order.steps)
    assert change.switching_s == pytest.approx(adds * PIEZO_S)  # each add step waits for the devices
    assert drv.circuits_at(change.end_s - 1e-9) != drv.circuits_at(change.end_s)


def test_flows_run_on_old_circuits_until_the_new_ones_have_switched(fab):
    drv = RFabricDriver(fab, switch_delay_s=5e-3)
    src = np.arange(16) * 8
    dst = (np.arange(16) * 8 + 8) % 128 + 1
    flows = FlowSet(src, dst, 25e6, 0.0)  # ToR 0 -> ToR 1, 400 MB in all
    plan = drv.controller.materialize(_a2a(np.r_[src, dst]))
    pair = [c for c in plan.plan.circuits if {c.a, c.b} == {"pod0/tor0", "pod0/tor1"}]
    one = plan.plan.__class__(**{**plan.plan.__dict__, "circuits": tuple(pair[:1])})
    drv.install(one, at_s=0.0)
    drv._commit(plan, 2e-3, None)  # the full plan commits at 2 ms and is up at 7 ms
    res = simulate(flows, drv.timeline())
    total = 16 * 25e6 * 8
    up_at = 2e-3 + 5e-3
    sent = B * up_at  # one circuit until the change is through
    expect = up_at + (total - sent) / (len(pair) * B)
    assert res.makespan_s == pytest.approx(expect, rel=1e-6, abs=2e-5)


def test_failed_ocs_ports_go_dark_and_the_replan_avoids_them(fab):
    drv = RFabricDriver(fab, gate_config=GateConfig(min_observations=1))
    intent = _a2a(range(0, 128, 4))
    drv.install(drv.controller.materialize(intent), at_s=0.0)
    victim = drv.active.circuits[0]
    ports = set(victim.xc.ports())
    t = _windows(drv, "train", slack_s=1.0, n=2)
    d = drv.fail_ports(ports, now_s=t)
    assert d is not None and d.action == "commit"
    assert not ports & {p for c in drv.active.circuits for p in c.xc.ports()}
    # until the re-plan has switched, the old circuits minus the dark one carry the traffic
    dark = [c for c in drv.circuits_at(0.0) if set(c.xc.ports()) & ports]
    assert dark == [victim]
    degraded = fab.with_circuits(drv.circuits_at(0.0), drv.failures)
    healthy = fab.with_circuits(drv.circuits_at(0.0))
    assert degraded.capacity_bps.sum() == pytest.approx(healthy.capacity_bps.sum() - 2 * B)


def test_train_and_gen_in_their_own_pods_reconfigure_side_by_side_and_a_sync_claims_both():
    """Stages on disjoint PoDs own their circuits: a Gen commit neither drops Train's circuits nor waits
    for Train's switching; a weight-sync plan over both clusters takes both PoDs' circuits over."""
    fab = build_fabric("rfabric", 512)  # two PoDs of 256 GPUs: PoD 0 trains, PoD 1 generates
    drv = RFabricDriver(fab)
    train = _a2a(range(0, 256, 2))
    gen = _a2a(range(256, 512, 2), stage="gen", period="decode")
    drv.install(drv.materialize(train), at_s=0.0, pods=drv.pods_of(train))
    later = drv.materialize(_a2a(range(0, 256, 4)))  # Train's next period: its devices switch from 10 s on
    busy_until = drv._commit(later, 10.0, None, drv.pods_of(train)).end_s
    assert busy_until >= 10.0 + PIEZO_S
    g = drv.materialize(gen)
    assert g.accepted and g.plan.circuits
    change = drv._commit(g, 10.0, None, drv.pods_of(gen))
    assert change.start_s == 10.0 < busy_until  # not after Train's devices are done
    up = set(drv.circuits_at(11.0))
    assert set(later.plan.circuits) <= up and set(g.plan.circuits) <= up  # both clusters' circuits stand
    assert {c.pod for c in later.plan.circuits} == {0} and {c.pod for c in g.plan.circuits} == {1}
    sync = _a2a(range(0, 512, 8))  # a plan over both clusters (as a weight sync's is)
    s = drv.materialize(sync)
    assert s.accepted and any(c.tier == "core" for c in s.plan.circuits)
    drv._commit(s, 20.0, None, drv.pods_of(sync))
    assert set(drv.circuits_at(21.0)) == set(s.plan.circuits)  # the sync holds both PoDs now
    assert set(drv.circuits_at(10.5)) >= set(g.plan.circuits)  # the past is kept
    again = drv.materialize(train)
    drv._commit(again, 30.0, None, drv.pods_of(train))
    now = set(drv.circuits_at(31.0))
    assert set(again.plan.circuits) <= now
    assert {c for c in s.plan.circuits if c.tier == "agg" and c.pod == 1} <= now  # PoD 1 keeps the sync's
    assert not any(c.tier == "core" for c in now - set(again.plan.circuits))  # Core touched PoD 0: released


def test_a_repeated_intent_is_materialised_once_with_the_plan_a_fresh_driver_makes(fab, monkeypatch):
    """Speed (issue 31): the weight sync announces one intent object per iteration; the driver remembers it."""
    import orchestrl.sim.network.reconfig as rc

    intent = _a2a(range(0, 128, 4))
    drv = RFabricDriver(fab)
    first = drv.materialize(intent)
    calls = []
    real = rc.materialize
    monkeypatch.setattr(rc, "materialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = drv.materialize(intent)
    assert not calls and again.accepted and again.cache_hit
    assert same_plan(again.plan, first.plan)
    assert same_plan(again.plan, RFabricDriver(fab).materialize(intent).plan)  # a fresh driver agrees
    calls.clear()
    drv.materialize(_a2a(range(0, 128, 4)))  # an equal intent but another object: planned, not looked up
    assert len(calls) == 1
    drv.controller.mask_ports([])  # a new topology object (ports masked): planned again
    drv.materialize(intent)
    assert len(calls) == 2


def same_plan(a, b):
    return sorted(map(repr, a.circuits)) == sorted(map(repr, b.circuits))
