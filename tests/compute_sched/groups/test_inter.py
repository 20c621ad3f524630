"""Algorithm 1: the three placement strategies, pruning, SLO and memory checks, affinity, fabric awareness."""

import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.compute_sched.groups.cluster import Cluster
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.inter import RollMuxScheduler
from orchestrl.compute_sched.groups.intra import group_jobs, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.compute_sched.groups.nodes import NodeAllocator
from orchestrl.compute_sched.groups.slo import RealisedSloCheck
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import FabricSpec, Topology

CFG = GroupConfig()


def _place_all(jobs, cfg=CFG, cluster=None):
    cluster = cluster or Cluster(cfg)
    sched = RollMuxScheduler(cfg)
    decisions = []
    for job in jobs:
        d = sched.place(job, cluster)
        cluster.apply(job, d)
        decisions.append(d)
    return cluster, decisions


def test_complementary_jobs_pack_directly_at_zero_marginal_cost():
    cluster, ds = _place_all([JobSpec("a", 100, 100, slo=1.5), JobSpec("b", 100, 100, slo=1.5)])
    assert [d.strategy for d in ds] == ["isolated", "direct"]
    assert ds[1].delta_usd_per_h == 0 and len(cluster.groups) == 1
    assert cluster.cost_usd_per_h() == pytest.approx(8 * 1.85 + 8 * 5.28)


def test_rollout_heavy_jobs_scale_the_rollout_pool_instead_of_a_new_group():
    jobs = [JobSpec(f"r{i}", 300, 75, slo=1.3) for i in range(3)]
    cluster, ds = _place_all(jobs)
    assert [d.strategy for d in ds] == ["isolated", "scale", "scale"]
    assert ds[1].delta_usd_per_h == pytest.approx(8 * 1.85)  # one H20 node, not a whole new group
    (group,) = cluster.groups.values()
    assert len(group.rollout_nodes) == 3 and len(group.train_nodes) == 1


def test_an_slo_that_co_execution_would_break_forces_isolated_provisioning():
    cluster, ds = _place_all([JobSpec("long", 300, 300, slo=1.5), JobSpec("short", 50, 50, slo=1.5)])
    assert ds[1].strategy == "isolated" and len(cluster.groups) == 2  # sharing would make "short" 6x slower


def test_saturated_groups_are_skipped():
    cluster, ds = _place_all([JobSpec("a", 100, 100, slo=2.0), JobSpec("b", 100, 100, slo=2.0)])
    assert cluster.groups[0].summary().saturated
    d = RollMuxScheduler(CFG).place(JobSpec("c", 50, 50, slo=2.0), cluster)
    assert d.strategy == "isolated" and d.evaluated == 0


def test_the_memory_residency_constraint_rules_out_a_full_node():
    cfg = GroupConfig(host_mem_gb=1000.0)
    jobs = [JobSpec("a", 100, 100, roll_mem_gb=600, train_mem_gb=100, slo=1.5),
            JobSpec("b", 100, 100, roll_mem_gb=600, train_mem_gb=100, slo=1.5)]
    cluster, ds = _place_all(jobs, cfg)
    assert ds[1].strategy == "scale"  # the training node has room; the rollout node does not
    assert not any(g.residency_violations() for g in cluster.groups.values())


def test_a_job_larger_than_any_node_is_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="roll_mem_gb"):
        RollMuxScheduler(CFG).place(JobSpec("x", 10, 10, roll_mem_gb=4096), Cluster(CFG))


def test_hardware_affinity_puts_prefill_heavy_rollouts_on_h800_only_when_cheaper():
    cfg = CFG.with_affinity()
    big_prefill = JobSpec("p", 400, 100, roll_nodes=4, train_nodes=1, rollout_kind="prefill")
    d = RollMuxScheduler(cfg).place(big_prefill, Cluster(cfg))
    assert (d.new_roll_type, d.new_roll_count) == ("H800", 1)  # 1 H800 node (5.66x) beats 4 H20 nodes
    small_prefill = JobSpec("q", 400, 100, roll_nodes=1, rollout_kind="prefill")
    assert RollMuxScheduler(cfg).place(small_prefill, Cluster(cfg)).new_roll_type == "H20"
    decode = JobSpec("d", 400, 100, roll_nodes=4, rollout_kind="decode")
    assert RollMuxScheduler(cfg).place(decode, Cluster(cfg)).new_roll_type == "H20"


def _two_pod_allocator(cfg, aware=True, servers=4):
    topo = Topology(FabricSpec(name="r", link_bps=200e9, pods=2, servers_per_pod=servers, gpu_type="H20",
                               boundary_ports_per_pod=4, core_devices=1))
    return NodeAllocator(cfg, {"rollout": topo}, fabric_aware=aware)


def test_fabric_awareness_keeps_a_jobs_rollout_nodes_in_one_pod_and_reports_traffic():
    cfg = CFG
    jobs = [JobSpec("a", 100, 50, roll_nodes=3, slo=1.2), JobSpec("b", 100, 50, roll_nodes=2, slo=1.2)]
    aware, _ = _place_all(jobs, cfg, Cluster(cfg, _two_pod_allocator(cfg, True)))
    blind, _ = _place_all(jobs, cfg, Cluster(cfg, _two_pod_allocator(cfg, False)))
    assert aware.traffic("b").rollout_pods == 1 and aware.traffic("b").weight_sync_bytes == 0
    assert blind.traffic("b").rollout_pods == 2  # first-fit takes server 3 (PoD 0) and server 4 (PoD 1)
    assert blind.traffic("b").weight_sync_bytes == pytest.approx(2 * 7e9)


def test_a_bounded_rollout_cluster_refuses_what_it_cannot_hold():
    from orchestrl.compute_sched.groups.nodes import CapacityError

    cfg = CFG
    cluster = Cluster(cfg, _two_pod_allocator(cfg, servers=1))
    _place_all([JobSpec("a", 100, 50, roll_nodes=2, slo=1.0)], cfg, cluster)
    with pytest.raises(CapacityError, match="free servers"):
        RollMuxScheduler(cfg).place(JobSpec("b", 100, 50, roll_nodes=1, slo=1.0), cluster)


jobs_strategy = st.lists(st.tuples(st.floats(25, 600), st.floats(25, 600), st.sampled_from([1, 2]),
                                   st.floats(1.0, 2.0), st.sampled_from([113.4, 445.4, 490.3])),
                         min_size=1, max_size=14)


@settings(max_examples=30, deadline=None)
@given(jobs_strategy, st.integers(2, 5))
def test_every_admitted_group_meets_residency_and_every_worst_case_slo(spec, max_size):
    cfg = GroupConfig(max_group_size=max_size)
    jobs = [JobSpec(f"j{i}", r, t, roll_nodes=n, train_nodes=n, slo=slo, roll_mem_gb=mem, train_mem_gb=mem)
            for i, (r, t, n, slo, mem) in enumerate(spec)]
    cluster, ds = _place_all(jobs, cfg)
    for group in cluster.groups.values():
        assert len(group.order) <= max_size and not group.residency_violations()
        planned = worst_case_iteration_s(group_jobs(group), cfg)
        for j in group.order:
            assert planned[j] <= group.jobs[j].slo_budget_s + 1e-6
        if len(group.order) > 1:  # and the slowdown predicted from sampled phases, with its margin
            check = RealisedSloCheck()
            predicted = check.slowdowns(group_jobs(group), group.jobs, cfg)
            assert all(predicted[j] <= group.jobs[j].slo * (1 - check.margin) + 1e-6 for j in group.order)
    solo_cost = sum(8 * (1.85 * j.roll_nodes + 5.28 * j.train_nodes) for j in jobs)
    assert cluster.cost_usd_per_h() <= solo_cost + 1e-6
