"""The event loop: arrivals, ends, dependencies, state changes, flows that cannot move."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.events import FlowSet, simulate
from orchestrl.sim.network.netsim import NetworkSim

B = 200e9
LAT = 2 * SimConfig().hop_latency_s() + SimConfig().switch_latency_s  # two GPUs under one leaf


@pytest.fixture(scope="module")
def ft16():
    return build_fabric("ft", 16).state()


def test_a_late_arrival_halves_the_rate_of_the_flow_it_joins(ft16):
    s = 25e6  # 1 ms alone at 200 Gb/s
    res = simulate(FlowSet([0, 1], [8, 8], [s, s], [0.0, 0.5e-3]), ft16)
    # flow 0 sends half alone, then both share NIC 8's downlink: 0.5 ms + 1 ms for the other half
    assert res.finish_s[0] == pytest.approx(1.5e-3 + LAT, rel=1e-9)
    assert res.finish_s[1] == pytest.approx(2.0e-3 + LAT, rel=1e-9)
    assert res.events == 3  # start, arrival, first end


def test_equal_flows_end_in_one_event(ft16):
    res = simulate(FlowSet(np.arange(8), np.arange(8) + 8, 1e6, 0.0), ft16)
    assert res.events == 1 and np.ptp(res.finish_s) == 0


def test_dependencies_wait_for_finish_or_start_plus_delay(ft16):
    s = 25e6
    deps = ([0, 0], [1, 2], [False, True], [0.0, 0.2e-3])
    res = simulate(FlowSet([0, 1, 2], [8, 9, 10], [s, s, s], [0.0, 0.0, 0.0], deps=deps), ft16)
    assert res.finish_s[1] == pytest.approx(res.finish_s[0] + 1e-3 + LAT, rel=1e-9)  # after flow 0 landed
    assert res.finish_s[2] == pytest.approx(0.2e-3 + 1e-3 + LAT, rel=1e-9)  # 0.2 ms after flow 0 started


def test_an_empty_flow_pays_only_the_path_latency(ft16):
    res = simulate(FlowSet([0], [8], [0], [1e-3]), ft16)
    assert res.finish_s[0] == pytest.approx(1e-3 + LAT)


def test_a_capacity_change_mid_flow_slows_the_rest_of_it():
    sim = NetworkSim("rfabric", gpus=128)
    src = np.arange(16) * 8
    dst = (np.arange(16) * 8 + 8) % 128 + 1
    flows = FlowSet(src, dst, 25e6, 0.0)  # 16 x 25 MB from ToR 0 to ToR 1
    pair = [c for c in sim.plan_for(flows).circuits if {c.a, c.b} == {"pod0/tor0", "pod0/tor1"}]
    two, one = sim.fabric.with_circuits(pair[:2]), sim.fabric.with_circuits(pair[:1])
    t_change = 2e-3
    res = simulate(flows, [(0.0, two), (t_change, one)])
    sent = 2 * B * t_change  # bits through two circuits before the change
    total = 16 * 25e6 * 8
    expect = t_change + (total - sent) / B
    assert res.makespan_s == pytest.approx(expect, rel=1e-6, abs=2e-5)
    assert res.events >= 2


def test_a_flow_without_a_path_waits_for_a_state_that_has_one():
    fab = build_fabric("rfabric", 512)  # two PoDs; with no circuit nothing crosses the boundary
    flows = FlowSet([0], [300], [25e6], [0.0])
    none = fab.with_circuits(())
    stuck = simulate(flows, none)
    assert not np.isfinite(stuck.finish_s[0]) and stuck.makespan_s == np.inf
    sim = NetworkSim(fab)
    later = simulate(flows, [(0.0, none), (5e-3, fab.with_circuits(sim.plan_for(flows)))])
    assert 6e-3 < later.finish_s[0] < 6.1e-3  # 5 ms waiting, then 1 ms at line rate


def test_bad_flow_sets_are_refused():
    with pytest.raises(ConfigError, match="dst"):
        FlowSet([1], [1], [5], [0.0])
    with pytest.raises(ConfigError, match="bytes"):
        FlowSet([1], [2], [-5], [0.0])
    with pytest.raises(ConfigError, match="deps"):
        FlowSet([1], [2], [5], [0.0], deps=([0], [3], [False], [0.0]))


def test_independent_groups_give_the_same_completions_as_one_loop_over_every_flow(monkeypatch):
    """Speed (issue 31): flows sharing no bundle run as separate loops, copies of a group once; same answers."""
    import orchestrl.sim.network.events as ev

    fab = build_fabric("rfabric", 512)
    none = fab.with_circuits(())
    cross = FlowSet([0], [300], [25e6], [0.0])
    timeline = [(0.0, none), (1e-3, fab.with_circuits(NetworkSim(fab).plan_for(cross)))]
    rng = np.random.default_rng(5)
    src, dst, size, start = [0], [300], [25e6], [0.0]  # one flow waits for the circuits of the second state
    pre, dep = [], []
    for server in range(64):
        base = server * 8
        sizes = [4e6, 9e6, 2e6, 7e6] if server < 32 else rng.uniform(1e6, 1e7, 4).tolist()  # 32 copies, 32 others
        for k, (a, b) in enumerate([(0, 1), (2, 1), (3, 5), (6, 7)]):
            src.append(base + a), dst.append(base + b), size.append(sizes[k]), start.append(0.0)
        pre.append(len(src) - 1), dep.append(len(src) - 4)  # the last flow's end releases a second wave
        src.append(base + 4), dst.append(base + 1), size.append(3e6), start.append(0.0)
        dep[-1] = len(src) - 1
    flows = FlowSet(src, dst, size, start, deps=(pre, dep, [False] * len(pre), [1e-4] * len(pre)))
    monkeypatch.setattr(ev, "_SPLIT_MIN_FLOWS", 10**9)
    whole = simulate(flows, timeline)
    monkeypatch.setattr(ev, "_SPLIT_MIN_FLOWS", 16)
    monkeypatch.setattr(ev, "_GROUP_FLOWS", 1)
    loops = []
    real_run = ev._run
    monkeypatch.setattr(ev, "_run", lambda f, *a: loops.append(len(f)) or real_run(f, *a))
    split = simulate(flows, timeline)
    assert np.isfinite(whole.finish_s).all() and whole.finish_s[0] > 1e-3  # the cross flow waited for circuits
    np.testing.assert_allclose(split.finish_s, whole.finish_s, rtol=1e-12, atol=0.0)
    assert split.makespan_s == pytest.approx(whole.makespan_s, rel=1e-12)
    # per server two groups (GPU 1's in-flows and their wave, GPU 3 -> 5): the cross flow, one loop for each
    # group of the 32 copies, two for each other server
    assert len(loops) == 1 + 2 + 2 * 32
