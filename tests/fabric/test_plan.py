"""Placement of multiplicities on device ports, plan validation (incl. Core-Agg coupling) and diffs."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.fabric.plan import (Circuit, CircuitPlan, CrossConnect, diff_plans, place_agg, place_core, plan_from_json,
                         plan_to_json, validate_plan)
from orchestrl.fabric.templates import TEMPLATES, pod_endpoint
from orchestrl.fabric.topology import Topology, load_topology, spec_from_mapping, uplink_endpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _topo(**agg):
    doc = {"name": "t", "link_gbps": 100, "pods": {"count": 3, "servers": 2},
           "tor": {"servers_per_tor": 2, "rails_per_tor": 2, "uplinks": 4},
           "ocs_agg": {"devices_per_pod": 2, "boundary_ports": 6, **agg}, "ocs_core": {"devices": 2}}
    return Topology(spec_from_mapping(doc))


def _coupled_plan(topo, core_counts, lift_per_fibre=True):
    """Place core circuits, then one lift/drop per landed fibre from the PoD's first ToR(s)."""
    used = set()
    core, fibres, notes = place_core(topo, core_counts, used)
    assert not notes
    agg = []
    for pod in topo.pods:
        counts = {}
        tors = topo.tors_by_pod[pod]
        for (p, q), fs in fibres.items():
            if p != pod:
                continue
            up = uplink_endpoint(p, q)
            for i in range(len(fs)):
                t = tors[i % len(tors)]
                key = (min(t, up), max(t, up))
                counts[key] = counts.get(key, 0) + 1
        ups = {uplink_endpoint(p, q): fs for (p, q), fs in fibres.items() if p == pod}
        placed, n = place_agg(topo, pod, counts, ups, used)
        assert not n
        agg.extend(placed)
    return CircuitPlan(topo.name, "train-dp", "sig", topo.link_bps, tuple(core + agg))


def test_coupled_plan_is_valid_and_uses_each_port_once():
    topo = _topo()
    plan = _coupled_plan(topo, {("pod0", "pod1"): 3, ("pod1", "pod2"): 2})
    assert validate_plan(plan, topo) == []
    ports = [r for c in plan.circuits for r in c.xc.ports()]
    assert len(ports) == len(set(ports))
    # a core circuit joins ports on one core device
    assert all(c.xc.device.startswith("core") for c in plan.circuits if c.tier == "core")


def test_core_circuit_without_lift_drop_violates_coupling():
    topo = _topo()
    core, _, _ = place_core(topo, {("pod0", "pod1"): 1})
    plan = CircuitPlan(topo.name, "train-dp", "s", topo.link_bps, tuple(core))
    violations = validate_plan(plan, topo)
    assert len(violations) == 2 and all("Core-Agg coupling" in v for v in violations)


def test_lift_drop_to_wrong_peer_is_caught():
    topo = _topo()
    plan = _coupled_plan(topo, {("pod0", "pod1"): 1})
    # relabel pod0's lift/drop as heading to pod2
    bad = tuple(Circuit(c.tier, c.pod, c.a.replace("up:pod1", "up:pod2"), c.b.replace("up:pod1", "up:pod2"), c.xc)
                if c.tier == "agg" and c.pod == 0 else c for c in plan.circuits)
    v = validate_plan(CircuitPlan(topo.name, "t", "s", 1.0, bad), topo)
    assert any("lifts toward pod 2" in x for x in v)


def test_double_used_and_masked_ports_are_violations():
    topo = _topo()
    t0, t1 = topo.tors_by_pod[0][:2]
    p0 = topo.usable_uplinks(t0)[0]
    p1 = next(p for p in topo.usable_uplinks(t1) if p.device == p0.device)
    p2 = next(p for p in topo.usable_uplinks(t1) if p.device == p0.device and p != p1)
    xc1 = CrossConnect(p0.device, *sorted((p0.port, p1.port)))
    xc2 = CrossConnect(p0.device, *sorted((p0.port, p2.port)))
    plan = CircuitPlan("t", "train", "s", 1.0, (Circuit("agg", 0, t0, t1, xc1), Circuit("agg", 0, t0, t1, xc2)))
    assert any("port budget exceeded" in v for v in validate_plan(plan, topo))
    masked = topo.with_masked([(p0.device, p0.port, "failed")])
    plan1 = CircuitPlan("t", "train", "s", 1.0, (Circuit("agg", 0, t0, t1, xc1),))
    assert any("masked port" in v for v in validate_plan(plan1, masked))


def test_template_eligibility_is_enforced():
    topo = _topo()
    plan = _coupled_plan(topo, {("pod1", "pod2"): 1})
    scope = TEMPLATES["weight-sync"].instantiate({"weight-sync": {(0, 1), (0, 2)}}, {0, 1, 2})
    assert any("not eligible" in v for v in validate_plan(plan, topo, scope))
    ok = _coupled_plan(topo, {("pod0", "pod2"): 1})
    assert validate_plan(ok, topo, scope) == []


def test_gen_template_reserves_a_small_core_slice():
    scope = TEMPLATES["gen"].instantiate({"response-stream": {(1, 0), (2, 0)}}, {1, 2})
    assert scope.core_port_cap == {1: 2, 2: 2}
    assert scope.core_eligible(pod_endpoint(1), pod_endpoint(0))
    assert not scope.core_eligible(pod_endpoint(1), pod_endpoint(2))  # Gen PoDs stay isolated


def test_placement_never_uses_masked_ports():
    topo = _topo()
    masks = [(p.device, p.port, "failed") for p in topo.tors["pod0/tor0"].uplinks[:2]]
    masks += [(f.core.device, f.core.port, "failed") for f in topo.boundary[1][:3]]
    masked = topo.with_masked(masks)
    plan = _coupled_plan(masked, {("pod0", "pod1"): 3})
    assert validate_plan(plan, masked) == []
    used = {r for c in plan.circuits for r in c.xc.ports()}
    assert not used & set(masked.masked)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from([("pod0", "pod1"), ("pod0", "pod2"), ("pod1", "pod2")]),
                       st.integers(0, 6), max_size=3),
       st.lists(st.integers(1, 12), max_size=6))
def test_placement_respects_budgets_and_masks(counts, masked_fibres):
    topo = _topo()
    masks = [(topo.boundary[i % 3][i % 6].core.device, topo.boundary[i % 3][i % 6].core.port, "failed")
             for i in masked_fibres]
    topo = topo.with_masked(masks)
    used = set()
    core, fibres, notes = place_core(topo, counts, used)
    for pod in topo.pods:
        assert sum(len(fs) for (p, _), fs in fibres.items() if p == pod) <= len(topo.usable_boundary(pod))
    placed = len(core) + len(notes)
    assert placed == sum(counts.values())  # every requested circuit is placed or reported
    plan = CircuitPlan("t", "x", "s", 1.0, tuple(core))
    v = validate_plan(plan, topo)
    assert all("coupling" in x for x in v)  # only the (expected) missing lift/drop, never budgets/masks


def test_diff_and_json_round_trip():
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    a = _coupled_plan(topo, {("pod0", "pod1"): 4})
    b = _coupled_plan(topo, {("pod0", "pod1"): 2})
    d = diff_plans(a, b)
    assert set(d.remove) == a.cross_connects() - b.cross_connects()
    assert not d.add and len(d.keep) == len(b.circuits)
    assert diff_plans(None, a).add == tuple(sorted(a.cross_connects()))
    again = plan_from_json(plan_to_json(a))
    assert again.cross_connects() == a.cross_connects() and again.circuits == a.circuits


def test_pair_times_follow_eq7():
    topo = _topo()
    core, fibres, _ = place_core(topo, {("pod0", "pod1"): 2})
    plan = CircuitPlan("t", "x", "s", 100e9, tuple(core), core_demand={("pod0", "pod1"): 50e9, ("pod1", "pod0"): 10e9,
                                                                     ("pod0", "pod2"): 1e9})
    rows = {(r["a"], r["b"]): r for r in plan.pair_times()}
    assert rows[("pod0", "pod1")]["time_s"] == pytest.approx(8 * 50e9 / (2 * 100e9))
    assert rows[("pod0", "pod2")]["time_s"] == float("inf")
    assert plan.unserved() == [("core", None, "pod0", "pod2")]
    assert plan.max_pair_time_s() == pytest.approx(2.0)  # 400 Gbit over 2 x 100 Gbps
