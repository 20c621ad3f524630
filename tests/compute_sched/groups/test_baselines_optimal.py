"""Baselines of §7.1/§7.5 and the exhaustive offline optimum."""

import itertools

import pytest

from orchestrl.compute_sched.groups.baselines import (GavelPolicy, GreedyPolicy, RandomPolicy, gavel_min_shares, idle_share,
                                          make_policy)
from orchestrl.compute_sched.groups.cluster import Cluster
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.inter import RollMuxScheduler
from orchestrl.compute_sched.groups.intra import GroupJob, group_jobs, round_robin, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.compute_sched.groups.optimal import MAX_OPTIMAL_JOBS, optimal_groups
from orchestrl.compute_sched.groups.workload import synthesize_jobs
from orchestrl.fabric.errors import ConfigError

CFG = GroupConfig()


def _run(policy, jobs):
    cluster = Cluster(CFG)
    for job in jobs:
        cluster.apply(job, policy.place(job, cluster))
    return cluster


def test_solo_and_colocated_never_share_and_price_as_the_paper_says():
    jobs = [JobSpec("a", 100, 100, slo=2.0), JobSpec("b", 100, 100, slo=2.0, roll_nodes=2, train_nodes=2)]
    solo = _run(make_policy("solo", CFG), jobs)
    assert len(solo.groups) == 2 and solo.cost_usd_per_h() == pytest.approx(3 * 8 * (1.85 + 5.28))
    coloc = _run(make_policy("colocated", CFG), jobs)
    assert coloc.gpus("rollout") == 0 and coloc.cost_usd_per_h() == pytest.approx(3 * 8 * 5.28)
    assert coloc.groups[0].roll_time(jobs[0], ()) == pytest.approx(100)  # decode-heavy: H800 ~ H20 speed


def test_random_and_greedy_respect_residency_but_not_slos():
    jobs = [JobSpec(f"j{i}", 200, 200, slo=1.05, roll_mem_gb=500, train_mem_gb=500) for i in range(9)]
    for policy in (RandomPolicy(CFG, seed=3), GreedyPolicy(CFG)):
        cluster = _run(policy, jobs)
        assert all(not g.residency_violations() and len(g.order) <= 4 for g in cluster.groups.values())
    greedy = _run(GreedyPolicy(CFG), jobs)
    planned = worst_case_iteration_s(group_jobs(greedy.groups[0]), CFG)
    assert max(planned.values()) > 1.05 * 400  # it packed jobs whose SLOs cannot hold


def test_greedy_picks_the_most_idle_group():
    jobs = [JobSpec("a", 100, 100, slo=1.5), JobSpec("b", 100, 100, slo=1.5), JobSpec("c", 100, 100, slo=1.0)]
    cluster = _run(RollMuxScheduler(CFG), jobs)  # {a, b} interleave (no idle time); c is alone (half idle)
    d = GreedyPolicy(CFG).place(JobSpec("new", 50, 50), cluster)
    assert cluster.groups[d.group_id].order == ["c"]


def test_gavel_admits_while_slo_shares_fit_in_the_time():
    jobs = [JobSpec("a", 100, 100, slo=2.0), JobSpec("b", 100, 100, slo=2.0), JobSpec("c", 100, 100, slo=2.0)]
    cluster = _run(GavelPolicy(CFG), jobs)
    assert sorted(len(g.order) for g in cluster.groups.values()) == [1, 2]
    for g in cluster.groups.values():
        assert sum(gavel_min_shares(g).values()) <= 1.0 + 1e-9


def _brute_force_cost(jobs, cfg):
    """Cheapest partition where every group uses one rollout node per job-node and any order (tiny cases)."""
    best = float("inf")
    n = len(jobs)
    for labels in itertools.product(range(n), repeat=n):
        if list(dict.fromkeys(labels)) != sorted(set(labels)):
            continue  # canonical labelling only
        cost = 0.0
        for g in set(labels):
            members = [j for j, lab in zip(jobs, labels) if lab == g]
            group_best = float("inf")
            for m in range(1, len(members) + 1):
                for assign in itertools.product(range(m), repeat=len(members)):
                    if len(set(assign)) != m:
                        continue
                    for order in itertools.permutations(range(len(members))):
                        gj = [GroupJob(members[i].job_id, (assign[i],), members[i].t_roll_s, members[i].t_train_s)
                              for i in order]
                        plan = worst_case_iteration_s(gj, cfg)
                        if all(plan[j.job_id] <= j.slo_budget_s + 1e-9 for j in members):
                            group_best = min(group_best, m * 14.8 + 42.24)
            cost += group_best
        best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_optimum_matches_brute_force_on_tiny_instances(seed):
    jobs = [JobSpec(j.job_id, j.t_roll_s, j.t_train_s, slo=j.slo) for j in synthesize_jobs("mixed", 4, seed)]
    plans = optimal_groups(jobs, CFG)
    assert sum(p.cost_usd_per_h for p in plans) == pytest.approx(_brute_force_cost(jobs, CFG))
    assert sorted(j for p in plans for j in p.order) == sorted(j.job_id for j in jobs)


@pytest.mark.parametrize("workload", ["mixed", "rollout-heavy"])
def test_rollmux_is_never_cheaper_than_the_optimum_and_the_optimum_is_feasible(workload):
    for seed in range(3):
        jobs = synthesize_jobs(workload, 7, seed)
        plans = optimal_groups(jobs, CFG)
        cluster = Cluster(CFG)
        for p in plans:
            cluster.create_group([(next(j for j in jobs if j.job_id == jid), idx) for jid, idx in
                                  zip(p.order, p.assignment)], p.train_nodes, p.rollout_type, p.rollout_nodes)
        for g in cluster.groups.values():
            assert not g.residency_violations()
            planned = worst_case_iteration_s(group_jobs(g), CFG)
            assert all(planned[j] <= g.jobs[j].slo_budget_s + 1e-6 for j in g.order)
        online = _run(RollMuxScheduler(CFG), jobs)
        assert cluster.cost_usd_per_h() <= online.cost_usd_per_h() + 1e-6


def test_optimum_refuses_instances_too_large_to_search():
    with pytest.raises(ConfigError, match="--jobs"):
        optimal_groups(synthesize_jobs("mixed", MAX_OPTIMAL_JOBS + 1, 0), CFG)


def _three_open_groups():
    """Three one-job groups (1 rollout + 1 training node each) that can each take another small job."""
    cluster = Cluster(CFG)
    for i in range(3):
        job = JobSpec(f"g{i}", 100, 100)
        cluster.apply(job, make_policy("solo", CFG).place(job, cluster))
    return cluster


def test_random_opens_a_new_group_with_probability_one_over_k_plus_one():
    cluster = _three_open_groups()
    counts: dict = {}
    trials = 4000
    for seed in range(trials):
        d = RandomPolicy(CFG, seed=seed).place(JobSpec("new", 50, 50), cluster)
        counts[d.group_id] = counts.get(d.group_id, 0) + 1
    assert set(counts) == {None, 0, 1, 2}  # every group that can accommodate it, and a new one
    for gid, c in counts.items():  # uniform over k + 1 = 4 options (4 sigma ~ 0.027)
        assert abs(c / trials - 0.25) < 0.03, (gid, c)


def test_random_and_greedy_only_consider_groups_with_enough_nodes_and_never_provision_into_them():
    cluster = _three_open_groups()
    big = JobSpec("big", 100, 100, roll_nodes=2, train_nodes=2)  # no one-node group can accommodate it
    for seed in range(50):
        d = RandomPolicy(CFG, seed=seed).place(big, cluster)
        assert d.group_id is None and d.new_roll_count == 2 and d.new_train_count == 2
    d = GreedyPolicy(CFG).place(big, cluster)
    assert d.group_id is None and d.pin_train


def test_random_and_greedy_pin_training_nodes_and_release_them_when_idle():
    cluster = Cluster(CFG)
    big = JobSpec("big", 100, 100, roll_nodes=2, train_nodes=2)
    cluster.apply(big, GreedyPolicy(CFG).place(big, cluster))
    small = JobSpec("small", 100, 100)
    d = GreedyPolicy(CFG).place(small, cluster)
    assert d.group_id == 0 and len(d.roll_nodes) == 1 and len(d.train_nodes) == 1
    group = cluster.apply(small, d)
    assert group.member_train_time("small") == pytest.approx(100)  # on its own node count, no DP rescaling
    cost_before = cluster.cost_usd_per_h()
    cluster.remove("big")  # the small job keeps only the nodes it runs on
    assert len(group.train_nodes) == 1 and len(group.rollout_nodes) == 1
    assert cluster.cost_usd_per_h() == pytest.approx(cost_before - 14.8 - 42.24)


def test_pinned_training_nodes_run_in_parallel():
    cfg = GroupConfig(warm_start_s=0.0)
    a = GroupJob("a", (0,), 100.0, 100.0, train_nodes=(10,))
    b = GroupJob("b", (1,), 100.0, 100.0, train_nodes=(11,))
    s = round_robin([a, b], 2, cfg, n_train_nodes=2)
    assert s.iteration_s["a"] == pytest.approx(200.0) and s.train_util == pytest.approx(0.5)
    shared = round_robin([a, GroupJob("b", (1,), 100.0, 100.0, train_nodes=(10,))], 2, cfg, n_train_nodes=1)
    assert shared.train_util == pytest.approx(1.0)


def test_greedy_idle_share_weights_nodes_of_both_pools():
    cluster = Cluster(CFG)
    job = JobSpec("a", 100, 300, roll_nodes=3)  # 3 rollout nodes busy 1/4, 1 training node busy 3/4
    group = cluster.apply(job, GreedyPolicy(CFG).place(job, cluster))
    sched = round_robin(group_jobs(group), 3, CFG, n_train_nodes=1)
    expected = 1 - (3 * sched.rollout_util + sched.train_util) / 4
    assert idle_share(group, CFG) == pytest.approx(expected)
