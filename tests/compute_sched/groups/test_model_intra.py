"""Groups, the residency constraint and the round-robin meta-iteration (RollMux §4.1, §4.3)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import Group, JobSpec, Node
from orchestrl.fabric.errors import ConfigError

NO_WARM = GroupConfig(warm_start_s=0.0)


def _group(cfg=NO_WARM, rollout=1, train=1):
    g = Group(0, cfg)
    g.add_nodes([Node(i, "rollout", "H20") for i in range(rollout)])
    g.add_nodes([Node(100 + i, "train", "H800") for i in range(train)])
    return g


def test_job_spec_refuses_bad_fields_by_name():
    with pytest.raises(ConfigError, match="slo"):
        JobSpec("a", 10, 10, slo=0.5)
    with pytest.raises(ConfigError, match="rollout_kind"):
        JobSpec("a", 10, 10, rollout_kind="both")
    with pytest.raises(ConfigError, match="t_roll_s"):
        JobSpec("a", 0, 10)


def test_residency_constraint_refuses_a_job_that_overflows_a_node_and_leaves_the_group_unchanged():
    g = _group(GroupConfig(host_mem_gb=1000.0))
    g.add(JobSpec("a", 100, 100, roll_mem_gb=490.3, train_mem_gb=100), (0,))
    g.add(JobSpec("b", 100, 100, roll_mem_gb=490.3, train_mem_gb=100), (0,))
    with pytest.raises(ConfigError, match="rollout node 0 holds"):
        g.add(JobSpec("c", 100, 100, roll_mem_gb=113.4, train_mem_gb=100), (0,))
    assert g.order == ["a", "b"] and g.residency_violations() == []


def test_training_time_and_memory_follow_the_group_pool():
    g = _group(train=2)
    big = JobSpec("big", 100, 300, train_nodes=4, train_mem_gb=500)
    assert g.train_time(big) == pytest.approx(600)  # data parallelism shrinks from 4 nodes to 2
    assert g.train_mem_per_node(big) == pytest.approx(1000)  # its state spreads over fewer nodes
    small = JobSpec("s", 100, 300, train_nodes=1)
    assert g.train_time(small) == pytest.approx(150)


def test_saturation_is_t_load_against_t_cycle():
    g = _group()
    g.add(JobSpec("a", 100, 100), (0,))
    assert not g.saturated()  # T_load 100 < T_cycle 200
    g.add(JobSpec("b", 100, 100), (0,))
    assert g.saturated() and g.summary().saturated  # 200 >= 200: no slack left


def test_unsaturated_group_cycles_at_the_longest_solo_time_theorem_1():
    jobs = [GroupJob("long", (0,), 150.0, 150.0), GroupJob("s1", (0,), 50.0, 40.0), GroupJob("s2", (0,), 60.0, 50.0)]
    sched = round_robin(jobs, 1, NO_WARM)
    assert sched.iteration_s == pytest.approx({"long": 300.0, "s1": 300.0, "s2": 300.0})


def test_round_robin_executes_each_job_once_per_meta_iteration_in_admission_order():
    jobs = [GroupJob(j, (0,), 30.0 + 10 * i, 20.0) for i, j in enumerate("abc")]
    sched = round_robin(jobs, 1, GroupConfig(), iterations=4, record=True)
    for pool in ("rollout", "train"):
        seq = [s.job_id for s in sorted(sched.segments, key=lambda s: s.start_s) if s.pool == pool]
        assert seq == list("abc") * 4
    by_start = sorted(sched.segments, key=lambda s: s.start_s)
    for a, b in zip(by_start, by_start[1:]):  # no two phases overlap on the same resource
        if a.pool == b.pool == "train" or (a.pool == b.pool == "rollout" and set(a.nodes) & set(b.nodes)):
            assert b.start_s >= a.end_s - 1e-9


def test_warm_start_is_paid_on_every_switch_between_jobs():
    a, b = GroupJob("a", (0,), 100.0, 100.0), GroupJob("b", (0,), 100.0, 100.0)
    cfg = GroupConfig(warm_start_s=2.0)
    assert worst_case_iteration_s([a], cfg)["a"] == pytest.approx(200.0)  # a job alone never switches
    assert worst_case_iteration_s([a, b], cfg)["a"] == pytest.approx(204.0)


def test_long_tail_migration_lets_the_next_rollout_start_early():
    jobs = [GroupJob("a", (0,), 100.0, 20.0), GroupJob("b", (0,), 100.0, 20.0)]
    draws = np.ones((12, 2, 3))
    draws[..., 1] = 0.4  # 80% of responses done at 40% of the rollout; one straggler runs to the limit
    on = round_robin(jobs, 1, GroupConfig(), draws=draws, record=True)
    off = round_robin(jobs, 1, GroupConfig(long_tail_migration=False), draws=draws)
    assert on.iteration_s["a"] < 0.8 * off.iteration_s["a"]
    tails = [s for s in on.segments if s.pool == "rollout" and s.tail_from_s is not None]
    assert tails and all(s.start_s < s.tail_from_s < s.end_s for s in tails)


def test_the_next_rollout_runs_at_the_given_speed_while_a_tail_holds_its_nodes():
    jobs = [GroupJob("a", (0,), 100.0, 20.0), GroupJob("b", (0,), 100.0, 20.0)]
    draws = np.ones((12, 2, 3))
    draws[..., 1] = 0.4
    cfg = GroupConfig()  # the tail keeps 1/8 of the nodes; by default the next rollout runs at 7/8 meanwhile
    default = round_robin(jobs, 1, cfg, draws=draws)
    same = round_robin(jobs, 1, cfg, draws=draws, tail_rate=np.full((12, 2), 1 - cfg.tail_capacity_fraction))
    assert same.iteration_s == pytest.approx(default.iteration_s)
    fast = round_robin(jobs, 1, cfg, draws=draws, tail_rate=np.ones((12, 2)))  # loses nothing to the tail
    slow = round_robin(jobs, 1, cfg, draws=draws, tail_rate=np.full((12, 2), 0.25))
    assert fast.iteration_s["a"] < default.iteration_s["a"] < slow.iteration_s["a"]
    for bad in (np.ones((3, 2)), np.zeros((12, 2)), np.full((12, 2), 1.5)):
        with pytest.raises(ConfigError, match="tail_rate"):
            round_robin(jobs, 1, cfg, draws=draws, tail_rate=bad)
    with pytest.raises(ConfigError, match="tail_rate"):  # a speed per iteration needs the iterations' draws
        round_robin(jobs, 1, cfg, tail_rate=np.ones((12, 2)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 300), st.floats(10, 300), st.integers(0, 2)), min_size=1, max_size=5),
       st.integers(0, 10_000))
def test_realised_schedules_never_exceed_the_worst_case_plan(spec, seed):
    jobs = [GroupJob(f"j{i}", (node,), r, t) for i, (r, t, node) in enumerate(spec)]
    plan = worst_case_iteration_s(jobs, GroupConfig())
    rng = np.random.default_rng(seed)
    draws = rng.uniform(0.05, 1.0, size=(2 * len(jobs) + 6, len(jobs), 3))
    draws[..., 1] = np.minimum(draws[..., 1], draws[..., 0])
    real = round_robin(jobs, 3, GroupConfig(), draws=draws)
    for j in plan:
        assert real.iteration_s[j] <= plan[j] + 1e-6
    assert 0.0 <= real.rollout_util <= 1.0 and 0.0 <= real.train_util <= 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(10, 600), st.floats(10, 600), st.sets(st.integers(0, 3), min_size=1, max_size=2)),
                min_size=1, max_size=5))
def test_the_planned_period_never_underestimates_the_long_run_period(spec):
    jobs = [GroupJob(f"j{i}", tuple(sorted(nodes)), r, t) for i, (r, t, nodes) in enumerate(spec)]
    short = worst_case_iteration_s(jobs, GroupConfig())
    long = round_robin(jobs, 4, GroupConfig(), iterations=400).iteration_s
    for j in short:
        assert long[j] - 1e-6 <= short[j] <= long[j] * 1.02
