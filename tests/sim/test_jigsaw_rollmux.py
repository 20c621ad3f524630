"""JigsawRL's RollMux baseline in RLSim: long-run timing, its best configuration, its slowed estimates, the steady
measure's meta-iterations and consolidated tails."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex import runner
from orchestrl.sim.multiplex.baselines import rollmux
from orchestrl.sim.multiplex.workload import PipelineSpec


def test_rollmux_is_timed_over_the_long_run_so_the_order_of_the_steps_does_not_change_it(two_steps):
    # The round robin staggers the two jobs, so a run's first pass is a ramp; the baseline is the time a
    # long run spends per pass. Timing it by one step's increment (doubled) gave 29.6 s or 42.8 s for the
    # same two steps depending on which came first.
    from orchestrl.sim.multiplex.rollout import post_times
    _, half = two_steps
    rev = [runner.PipelineSteps(r.spec, r.gpu, r.replicas, r.traces[::-1], r.post[::-1], r.tokens[::-1]) for r in half]
    a, b = rollmux(half), rollmux(rev)
    assert a.total_s == pytest.approx(b.total_s, rel=2e-3)
    # the training pool (2 of the 4 GPUs) runs one job at a time: a pass holds every step's training of both
    train = sum(sum(post_times(r.spec, r.tokens[k], r.gpu, 2)) for r in half for k in range(2))
    assert a.total_s >= train - 1e-9
    assert a.detail["first_pass_s"] >= a.total_s - 1e-9


@pytest.fixture(scope="module")
def math_pools():
    """Two small Qwen3-0.6B MATH pipelines, two steps, with rollout pools of 2, 1 and 3 of 4 replicas."""
    specs = [PipelineSpec(n, "Qwen3-0.6B", "math", tp=1, prompts=16, seed=i + 1) for i, n in enumerate("AB")]
    return [[runner.simulate_steps(s, "H100", r, 2) for s in specs] for r in (2, 1, 3)]


def test_rollmux_reports_its_best_configuration(math_pools, two_steps):
    from orchestrl.compute_sched.groups.config import GroupConfig
    from orchestrl.sim.multiplex.rollout import post_times
    from orchestrl.sim.multiplex import baselines as bl
    best = rollmux(math_pools, 4, isolated=False)  # the co-execution group's search (isolated groups: below)
    free = GroupConfig(tail_capacity_fraction=1e-9)  # the next rollout is charged nothing for the tail's replicas
    tried, harsh = {}, {}
    for pool in math_pools:
        d = pool[0].replicas
        tried[(d, None, None)] = harsh[(d, None, None)] = bl._rollmux_pass(
            *bl._rollmux_draws(pool, 4 - d, None, 1.0), GroupConfig(long_tail_migration=False))[0]
        for thr in bl.TAIL_THRESHOLDS:
            for keep in range(1, d):
                jobs, draws = bl._rollmux_draws(pool, 4 - d, keep, thr)
                tried[(d, keep, thr)] = bl._rollmux_pass(jobs, draws, free)[0]
                harsh[(d, keep, thr)] = bl._rollmux_pass(jobs, draws, GroupConfig(tail_capacity_fraction=keep / d))[0]
    assert best.total_s == pytest.approx(min(tried.values()))  # the fastest of every setting searched
    # here the best is not the default (half the replicas, tail at 80%): the pool and the threshold are searched
    assert best.detail["rollout_replicas"] == 3 and best.detail["tail_threshold"] != 0.8
    assert best.total_s < tried[(2, 1, 0.8)] - 0.1
    # the bracket: slowing the next rollout by the replicas a tail holds makes RollMux slower where a tail holds any
    assert harsh[(3, 2, 0.9)] > tried[(3, 2, 0.9)] + 0.1
    assert best.detail["proportional_s"] == pytest.approx(min(harsh.values()))
    assert best.detail["proportional_s"] > best.total_s
    with pytest.raises(ConfigError, match="pools"):  # a rollout pool with nothing left to train on
        rollmux([two_steps[0]], 4)
    # RollMux may also run each job in a group of its own (its inter-group scheduler's alternative): on its half of
    # the GPUs a rollout pool and a training pool, no migration. Alone, a job's iteration is its rollout on the pool
    # then its reference and training on the rest, nothing shared, so a pass takes the sum of its steps' two phases
    # on the pool size that serves it best; on 6 replicas (3 a half) that is 1 or 2 rollout replicas per job
    def alone_pass_s(j: int, k: int) -> float:
        run = {p[0].replicas: p for p in math_pools}[k][j]
        return sum(max(t.end_s for t in run.traces[s]) + sum(post_times(run.spec, run.tokens[s], run.gpu, 3 - k))
                   for s in range(2))

    iso = rollmux(math_pools, 6)
    sizes = [min((1, 2), key=lambda k: alone_pass_s(j, k)) for j in range(2)]
    assert iso.detail["config"].startswith("isolated groups") and iso.detail["rollout_replicas"] == tuple(sizes)
    assert iso.total_s == pytest.approx(max(alone_pass_s(j, k) for j, k in enumerate(sizes)), rel=1e-9)
    assert iso.total_s < rollmux(math_pools, 6, isolated=False).total_s  # here faster than one group
    assert rollmux(math_pools, 4).total_s < best.total_s  # on 4 replicas too (1 + 1 per job)


def test_rollmux_with_the_next_rollout_at_the_engines_speed_is_reported_inside_the_bracket(math_pools):
    from orchestrl.sim.multiplex import baselines as bl
    half, one, three = math_pools
    fewer = {1: one, 2: half}
    # a long-tailed step on fewer replicas loses less than their share: faster than in proportion, never faster
    # than on all of them
    rates = bl._tail_rates(three, one)
    assert rates.shape == (2, 2) and np.all(rates <= 1.0) and np.all(rates > 1 / 3)
    r = rollmux(math_pools, 4, fewer=fewer, isolated=False)  # the co-execution group (isolated groups have no tail)
    # between the generous default and the proportional slowdown: a slower tail never reports RollMux faster
    assert r.total_s <= r.detail["engine_s"] <= r.detail["proportional_s"]
    assert r.detail["engine_config"].startswith("rollout on ")
    assert "engine_s" not in rollmux(math_pools, 4).detail  # only when the smaller pools' steps are given
    with pytest.raises(ConfigError, match="fewer"):  # the 2-replica pool's tail on 1 frees 1: its steps are needed
        rollmux([half, three], 4, fewer={})
    with pytest.raises(ConfigError, match="in that order"):  # the pipelines swapped: each would get the other's rates
        rollmux(math_pools, 4, fewer={1: one[::-1]})
    short = [runner.simulate_steps(p.spec, "H100", 1, 1) for p in one]
    with pytest.raises(ConfigError, match="at least 2 steps"):  # fewer steps than the pools: refused, no IndexError
        rollmux(math_pools, 4, fewer={1: short})


def test_rollmux_under_the_steady_measure_runs_each_job_once_per_meta_iteration(math_pools):
    # RollMux's round robin runs every job of a group once per meta-iteration (its §4.3), so under the steady measure
    # the job given more steps (the shorter one) runs at the other's cadence: the steps beyond the other's count are
    # never reached, and the rate is steady_rates on the round robin's own step ends, best over the same search
    from orchestrl.compute_sched.groups.config import GroupConfig
    from orchestrl.sim.multiplex import baselines as bl
    more = [bl.repeat_each(p, (2, 5)) for p in math_pools]  # A 4 steps, B 10
    same = [bl.repeat_each(p, (2, 2)) for p in math_pools]
    r = rollmux(more, 4, steady=True, isolated=False)
    assert r.throughput_tps == pytest.approx(rollmux(same, 4, steady=True, isolated=False).throughput_tps, rel=1e-12)
    assert r.throughput_tps == pytest.approx(sum(r.detail["steady_rates"]), rel=1e-12)
    assert "longrun_pass_s" not in r.detail and r.detail["makespan_s"] > 0
    free = GroupConfig(tail_capacity_fraction=1e-9)
    rates = []
    for pool in more:
        d = pool[0].replicas
        toks = [p.tokens[:4] for p in pool]
        for keep, thr in [(None, 1.0)] + [(k, t) for t in bl.TAIL_THRESHOLDS for k in range(1, d)]:
            jobs, draws = bl._rollmux_draws(pool, 4 - d, keep, thr)
            ends = bl._rollmux_ends(jobs, draws, GroupConfig(long_tail_migration=False) if keep is None else free)
            assert [len(e) for e in ends] == [4, 4]  # one step of each job per meta-iteration
            rates.append(bl.steady_tps(ends, toks))
    assert r.throughput_tps == pytest.approx(max(rates), rel=1e-12)  # its best configuration under this measure
    # in groups of their own the jobs are not in step: each runs all its steps at its own pace, one after another on
    # its half (2 replicas: rollout on 1, reference and training on the other), and RollMux at its best
    # configuration is the faster of the two arrangements
    from orchestrl.sim.multiplex.rollout import post_times
    one = {p[0].replicas: p for p in more}[1]
    ends = [list(itertools.accumulate(max(t.end_s for t in run.traces[s]) + sum(post_times(run.spec, run.tokens[s],
                                                                                       run.gpu, 1))
                                      for s in range(run.steps))) for run in one]
    alone = sum(bl.steady_rates(ends, [run.tokens for run in one]))
    best = rollmux(more, 4, steady=True)
    assert best.throughput_tps == pytest.approx(max(alone, r.throughput_tps), rel=1e-9)
    assert r.detail["steps_run"] == [4, 4] and best.detail["steps_run"] == [4, 10]  # here alone is faster
    assert rollmux(same, 4, steady=True).throughput_tps != pytest.approx(best.throughput_tps, rel=1e-6)
    with pytest.raises(ConfigError, match="pools"):  # pools repeated differently would be scored on other steps
        rollmux([more[0], same[1]], 4, steady=True)
    with pytest.raises(ConfigError, match="fewer"):
        rollmux(more[:1], 4, fewer={1: same[1]}, steady=True)


def test_long_run_timing_does_not_depend_on_how_many_passes_it_takes(math_pools, monkeypatch):
    from orchestrl.sim.multiplex import baselines as bl
    times = []
    for passes in (4, 8, 16):  # the ramp is not charged: within 1% (the round robin still drifts by 0.4%)
        monkeypatch.setattr(bl, "PASSES", passes)
        times.append(rollmux(math_pools, 4).total_s)
    assert times[0] == pytest.approx(times[1], rel=1e-2) and times[1] == pytest.approx(times[2], rel=1e-2)
    assert bl.longrun_pass_s(10.0, 40.0, 4) == pytest.approx(10.0)
    with pytest.raises(ConfigError, match="passes"):
        bl.longrun_pass_s(10.0, 40.0, 1)
    r = bl.repeat_steps(math_pools[0][0], 3)
    assert r.steps == 6 and r.post[2:4] == r.post[:2] and r.tokens[4:] == r.tokens[:2] and r.traces[2] is r.traces[0]


def test_a_consolidated_tail_decodes_at_the_merged_batch_on_whole_replicas():
    from orchestrl.sim.multiplex.baselines import consolidated_tail_end, tail_point
    r = runner.simulate_steps(PipelineSpec("A", "Qwen3-0.6B", "math", tp=1, prompts=32, seed=1), "H100", 4, 1)
    end = max(t.end_s for t in r.traces[0])
    ends = [consolidated_tail_end(r, 0, keep)[1] for keep in range(1, 5)]
    assert all(e >= end - 1e-9 for e in ends)  # a moved response never ends before it would have where it was
    assert ends[0] > end + 0.5  # 20% of 128 responses onto one replica of four: a larger batch, contexts rebuilt
    assert ends[0] >= ends[1] >= ends[3]  # more replicas kept, a smaller batch each
    assert tail_point(r, 0, 0.5) < tail_point(r, 0, 0.8) < end
    for keep in (0, 5):
        with pytest.raises(ConfigError, match="keep"):
            consolidated_tail_end(r, 0, keep)
    with pytest.raises(ConfigError, match="tail_threshold"):
        tail_point(r, 0, 0.0)
