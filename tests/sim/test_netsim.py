"""NetworkSim: collectives in NCCL-tests terms, the timing cache, the rate seam, per-pattern circuits."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.fabric.intent import Collective
from orchestrl.sim.network.collectives import bus_factor, collective_steps, groups_of
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.events import FlowSet
from orchestrl.sim.network.fabrics import Failures
from orchestrl.sim.network.netsim import NetworkSim

B = 200e9


def test_ring_all_reduce_bus_bandwidth_is_the_nic_rate_and_the_latency_term_is_the_ring_steps():
    sim = NetworkSim("ft", gpus=64)
    c = Collective("all-reduce", groups=groups_of(64, 8, stride=8), bytes_per_rank=4e9)  # one GPU per server
    t = sim.time_collective(c)
    assert t.busbw_bytes_per_s == pytest.approx(B / 8, rel=1e-3)
    assert t.latency_term_s == pytest.approx((collective_steps("all-reduce", 8) - 1) * (t.transfer_s - 2 * 4e9 * 7 / 8
                                                                                         * 8 / B), rel=1e-6)
    tree = sim.time_collective(c, "tree")
    assert tree.latency_term_s < t.latency_term_s  # 2 log2 n steps instead of 2 (n - 1)


def test_the_cache_answers_a_repeated_pattern_without_solving():
    sim = NetworkSim("ft-os", gpus=384)
    c = Collective("all-to-all", groups=groups_of(384, 64), bytes_per_rank=1e8)
    first = sim.time_collective(c)
    misses = sim.stats.misses
    again = sim.time_collective(Collective("all-to-all", groups=groups_of(384, 64), bytes_per_rank=1e8))
    assert again is first and sim.stats.misses == misses and sim.stats.hits >= 1
    sim.set_failures(Failures(nics=frozenset({0})))  # a new fabric state is a new key
    assert sim.time_collective(c) is not first


def test_rates_seam_gives_max_min_rates_of_concurrent_transfers():
    sim = NetworkSim("ft", gpus=64)
    r = sim.rates([0, 1, 2], [8, 8, 9])  # two transfers into NIC 8, one into NIC 9
    assert r == pytest.approx([B / 2, B / 2, B])
    assert sim.transfer_time_s([0, 1], [8, 8], 25e6) == pytest.approx(2e-3, rel=1e-2)


def test_rfabric_per_pattern_plans_come_from_the_controller_and_match_fat_tree_on_a_permutation():
    rf = NetworkSim("rfabric", gpus=512)  # two PoDs
    ft = NetworkSim("ft", gpus=512)
    flows = FlowSet(np.arange(256), np.arange(256) + 256, 25e6, 0.0)  # every GPU of PoD 0 to PoD 1
    plan = rf.plan_for(flows)
    assert plan is not None and any(c.tier == "core" for c in plan.circuits)
    r_rf, r_ft = rf.time_flows(flows), ft.time_flows(flows)
    # 256 boundary fibres per PoD vs 256 NICs: the boundary is half the NICs, as default_rfabric_spec says
    assert r_ft.makespan_s == pytest.approx(1e-3, rel=0.01)
    assert r_rf.makespan_s == pytest.approx(2e-3, rel=0.02)


def test_mixnet_allocates_circuits_per_pattern():
    sim = NetworkSim("mixnet", gpus=128)
    c = Collective("all-to-all", groups=groups_of(128, 16), bytes_per_rank=1e9)  # pairs of servers
    t = sim.time_collective(c)
    fixed = NetworkSim("mixnet", gpus=128, circuits="fixed")  # no circuits set: fat-tree NICs only
    assert t.time_s < fixed.time_collective(c).time_s / 2


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all-reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all-gather", 8) == bus_factor("all-to-all", 8) == pytest.approx(0.875)
    assert bus_factor("p2p", 2) == 1.0


def test_link_speed_scales_the_time():
    c = Collective("all-reduce", groups=groups_of(64, 8, stride=8), bytes_per_rank=4e9)
    slow = NetworkSim("ft", gpus=64, config=SimConfig(link_bps=100e9)).time_collective(c)
    fast = NetworkSim("ft", gpus=64, config=SimConfig(link_bps=400e9)).time_collective(c)
    assert slow.transfer_s / fast.transfer_s == pytest.approx(4.0, rel=1e-3)


def test_a_weight_sync_schedule_replays_as_dependent_flows_and_agrees_with_its_planner():
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.sim.network.collectives import schedule_completion_s, schedule_flows

    params = synthetic_model(2_000_000_000, hidden=1024)
    trainer = TrainerLayout(tp=8, dp=2, pods=(0,) * 16)
    gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=16, tp=8)
    s = plan_weight_sync(params, trainer, gen, FabricLinks(nic_bps=B, default_budget=8))
    flows, feeder = schedule_flows(s, list(range(16)) + list(range(256, 272)), B)
    assert len(flows) == len(s.edges) and (feeder >= 0).any() and len(s.waves) > 1
    res = NetworkSim("rfabric", gpus=512).time_flows(flows)
    chunk_s = s.chunk_bytes * 8 / B
    assert np.all(np.isfinite(res.finish_s))
    done = schedule_completion_s(res.finish_s, feeder, chunk_s)
    assert done == pytest.approx(s.predicted_s, rel=0.15)  # the planner's closed form and the flow replay agree
