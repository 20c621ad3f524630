"""JigsawRL's pool layout (sim/multiplex/pool_layout.py): rollouts on a shared pool, training on the rest, the
long-run measure and the rule that picks it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex import layouts, pool_layout, runner
from orchestrl.sim.multiplex.rollout import post_times
from orchestrl.sim.multiplex.workload import PipelineSpec


@pytest.fixture(scope="module")
def on():
    """Two Qwen3-4B/MATH pipelines on 4 H100 workers, their same two steps on 1, 2 and 4 replicas."""
    specs = [PipelineSpec(n, "Qwen3-4B", "math", tp=1, prompts=8, seed=i + 1) for i, n in enumerate("AB")]
    return {n: [runner.simulate_steps(s, "H100", n, 2) for s in specs] for n in (1, 2, 3, 4)}


def test_the_pool_layout_rolls_out_on_the_pool_and_trains_on_the_rest(on):
    full, pool = on[4], on[1]
    g = runner._Group(full, "jigsaw", "default", 1.0, 3, pool=pool)
    for p, r in enumerate(full):
        for k in range(2):
            for w in range(4):
                start, post_i, end = g.bounds[(p, k, w)]
                roll = [t.kind for t in g.chains[w][p][start:post_i]]
                post = g.chains[w][p][post_i:end]
                if w == 0:  # the pool: this pipeline's whole step's samples, no training state
                    assert "idle" not in roll and {t.kind for t in post} == {"idle"}
                    assert sum(t.work_s for t in g.chains[w][p][start:post_i]) == pytest.approx(
                        sum(s.work_s for s in runner.rollout_chain(r.spec.name, 0, pool[p].traces[k][0].segments,
                                                                   0.0, min_s=0.05)), rel=1e-9)
                else:  # the training pool: no samples; the step's tokens spread over its three workers
                    assert roll == ["idle"]
                    assert [t.kind for t in post] == ["reference", "train"]
                    assert (post[0].work_s, post[1].work_s) == pytest.approx(post_times(r.spec, r.tokens[k] / 3, "H100"))
    res = g.run()
    assert res.memory_violations == 0 and all(len(v) == 2 for v in res.step_end_s.values())
    # no pipeline runs faster than alone on its pools (co-location only slows a sub-stage), and the two overlap:
    # one's rollout runs while the other trains, so the group ends well before the steps run one after another
    alone = [sum(max(t.end_s for t in pool[p].traces[k]) + sum(post_times(r.spec, r.tokens[k] / 3, "H100"))
                 for k in range(2)) for p, r in enumerate(full)]
    assert res.makespan_s >= max(alone) - 1e-6
    assert res.makespan_s < 0.9 * sum(alone)


def test_a_bad_pool_is_refused_with_what_to_give(on):
    full = on[4]
    for bad in (on[4], on[2][:1], [on[2][1], on[2][0]]):  # the whole group, one pipeline short, swapped
        with pytest.raises(ConfigError, match="pool"):
            runner.run_group(full, "jigsaw", pool=bad)
    other = [runner.simulate_steps(replace(r.spec, seed=r.spec.seed + 5), "H100", 2, 2) for r in full]
    with pytest.raises(ConfigError, match="same steps"):  # other samples: not this group's steps
        runner.run_group(full, "jigsaw", pool=other)
    with pytest.raises(ConfigError, match="one layout"):
        runner.run_group(full, "jigsaw", pool=on[2], partition=on[2])
    for name in ("pool:0", "pool:x", "pools:3", "quarters"):
        with pytest.raises(ConfigError, match="pool:3"):
            pool_layout.pool_size(name)
    with pytest.raises(ConfigError, match=r"no steps on \[3\]"):
        pool_layout.run_layout("pool:3", {4: on[4], 2: on[2]}, 4)


def test_layout_names_and_pool_sizes_follow_rollmuxs_search():
    assert pool_layout.layouts_for(8) == ("uniform", "halves", "split", "pool:3", "pool:4", "pool:5")
    assert pool_layout.layouts_for(3) == ("uniform", "pool:1", "pool:2")  # odd: no halves
    assert pool_layout.layouts_for(8, pools=False) == layouts.ROUTINGS
    assert pool_layout.needed_replicas(pool_layout.layouts_for(8), 8) == {3, 4, 5, 8}
    assert pool_layout.pool_size("pool:12") == 12 and pool_layout.pool_size("split") is None


def test_run_layout_is_run_group_in_that_layout_over_repeated_passes(on):
    from orchestrl.sim.multiplex.baselines import repeat_steps
    rep = lambda xs: [repeat_steps(x, 2) for x in xs]  # noqa: E731
    got = pool_layout.run_layout("pool:2", on, 4, passes=2)
    assert got.makespan_s == pytest.approx(runner.run_group(rep(on[4]), "jigsaw", pool=rep(on[2])).makespan_s)
    assert all(len(v) == 4 for v in got.step_end_s.values())
    split = pool_layout.run_layout("split", on, 4)
    assert split.makespan_s == pytest.approx(
        runner.run_group(on[4], "jigsaw", **layouts.routing_args("split", on[2], 2)).makespan_s)


def test_the_marginal_pass_excludes_the_ramp_and_refuses_what_is_not_two_runs_of_one_layout():
    assert pool_layout.marginal_pass_s(100.0, 340.0, 4) == pytest.approx(80.0)
    for args in ((100.0, 340.0, 1), (100.0, 340.0, True), (100.0, 90.0, 4), (0.0, 10.0, 2)):
        with pytest.raises(ConfigError, match="long-run timing"):
            pool_layout.marginal_pass_s(*args)


def test_the_long_run_rule_takes_the_shortest_marginal_pass_with_the_splits_margin():
    costs = {4: [{"split": 100.0, "pool:2": 99.0}, {"split": 100.0, "pool:2": 99.0}],
             2: [{"split": 120.0, "pool:2": 130.0}] * 2}
    assert pool_layout.decide(costs) == (4, "split")  # 198 against split's 200 x (1 - 0.015) = 197
    assert pool_layout.decide(costs, margin=0.0) == (4, "pool:2")
    assert pool_layout.decide({1: [{"uniform": 5.0}], 2: [{"uniform": 5.0}]}) == (1, "uniform")  # tie: smaller degree
    with pytest.raises(ConfigError, match="profile costs"):
        pool_layout.decide({})
    with pytest.raises(ConfigError, match="same profiling draws"):
        pool_layout.decide({4: costs[4], 2: costs[2][:1]})


def test_the_profile_runs_other_draws_than_the_measured_steps_the_same_draws_as_the_two_step_rule(on):
    full = on[4]
    costs = pool_layout.profile_marginal(full, ("split", "pool:1"), draws=1)
    assert len(costs) == 1 and set(costs[0]) == {"split", "pool:1"}
    two = layouts.profile_steps(full, draws=1)[0][0]  # the two-step rule's first draw
    specs = [replace(r.spec, seed=r.spec.seed + layouts.PROFILE_SEED) for r in full]
    assert [t.tokens for t in two[0].traces[0]] != [t.tokens for t in full[0].traces[0]]  # not a measured step
    mine = {n: [runner.simulate_steps(s, "H100", n, layouts.PROFILE_STEPS) for s in specs] for n in (1, 2, 4)}
    for x in ("split", "pool:1"):
        one = pool_layout.run_layout(x, mine, 4, 1).makespan_s
        many = pool_layout.run_layout(x, mine, 4, pool_layout.PROFILE_PASSES).makespan_s
        assert costs[0][x] == pytest.approx(pool_layout.marginal_pass_s(one, many, pool_layout.PROFILE_PASSES))
    assert mine[4][0].traces[0][0].tokens == two[0].traces[0][0].tokens


@pytest.fixture(scope="module")
def pool_case():
    """Two Qwen3-32B/MATH pipelines (responses x0.5) on 32 A100s at TP 8 (four workers), seed 0: the long-run rule
    picks `pool:1` (profiled marginal pass 335 s against `split`'s 363 s, 357.6 s after the margin), and with
    sharing free `uniform`. (Fig. 12's Llama-3.1-8B pair at TP 4, the case until the profile covered the run's four
    passes, now picks `split` there: 180.4 x 0.985 = 177.7 s against `pool:1`'s 177.7 s.)"""
    from orchestrl.sim.experiments.jigsaw_common import Case
    pair = (("Qwen3-32B", "math", 8, 0.5),) * 2
    return Case("t", "pool", "A100", 32, pair, 2, ("verl", "rollmux", "jigsaw"), longrun=True, rule="longrun")


@pytest.fixture(scope="module")
def pool_result(pool_case):
    """``run_case`` on :func:`pool_case` with the grid rows (what two tests read; one run of the dearest case)."""
    from orchestrl.sim.experiments.jigsaw_common import run_case
    return run_case(replace(pool_case, sensitivity=True))


def _steps(case):
    """The case's two measured steps on every replica count its layouts need (four workers)."""
    from orchestrl.sim.experiments.jigsaw_common import _specs
    names = pool_layout.layouts_for(4)
    return {n: [runner.simulate_steps(s, "A100", n, 2) for s in _specs(case)]
            for n in pool_layout.needed_replicas(names, 4)}, names


def test_run_case_under_the_long_run_rule_runs_the_pool_it_picks_and_times_it_as_rollmux_is(pool_case, pool_result):
    from orchestrl.sim.experiments.jigsaw_common import run_case
    from orchestrl.sim.multiplex.baselines import PASSES
    res = pool_result
    on, names = _steps(pool_case)
    assert set(res["routing_costs"]) == set(names)
    assert res["routing"] == pool_layout.decide({8: pool_layout.profile_marginal(on[4], names)})[1] == "pool:1"
    one, many = pool_layout.run_layout("pool:1", on, 4), pool_layout.run_layout("pool:1", on, 4, PASSES)
    tokens = sum(sum(r.tokens) for r in on[4])
    assert res["jigsaw_tps"] == pytest.approx(tokens / pool_layout.marginal_pass_s(one.makespan_s, many.makespan_s, PASSES))
    assert res["jigsaw_makespan_tps"] == pytest.approx(tokens * PASSES / many.makespan_s)
    assert res["memory_violations"] == 0
    # the baselines do not depend on JigsawRL's rule
    two = run_case(replace(pool_case, rule="twostep"))
    assert (two["verl_tps"], two["rollmux_tps"]) == (res["verl_tps"], res["rollmux_tps"])
    assert two["routing"] in layouts.ROUTINGS


def test_the_long_run_rule_is_refused_without_the_long_run_and_names_the_fix(pool_case, capsys):
    from orchestrl.agents.cli import main
    from orchestrl.sim.experiments.jigsaw_common import run_case
    with pytest.raises(ConfigError, match="longrun=True"):
        run_case(replace(pool_case, longrun=False))
    with pytest.raises(ConfigError, match="twostep, longrun"):
        run_case(replace(pool_case, rule="best"))
    assert main(["sim", "jigsaw", "Qwen3-4B/math", "Qwen3-4B/math", "--rule", "longrun"]) == 2
    assert "add --long-run" in capsys.readouterr().err
    assert main(["sim", "jigsaw", "Qwen3-32B/math,tp=8,scale=0.5", "Qwen3-32B/math,tp=8,scale=0.5", "--gpu", "A100",
                 "--gpus", "32", "--long-run", "--rule", "longrun", "--systems", "verl,jigsaw"]) == 0
    out = capsys.readouterr().out
    assert "JigsawRL layout: pool:1 (both pipelines' rollouts on a pool of 1 worker(s), both trainings on the other 3)" in out
    assert "upper bound for any schedule's makespan per pass" in out


def test_under_the_long_run_rule_the_grid_rows_keep_the_layout_and_the_free_what_if_re_decides(pool_case, pool_result):
    from orchestrl.sim.multiplex.baselines import PASSES
    res = pool_result
    on, names = _steps(pool_case)
    tokens = sum(sum(r.tokens) for r in on[4])

    def marginal(layout, scale, grid="default"):
        one = pool_layout.run_layout(layout, on, 4, 1, grid=grid, scale=scale).makespan_s
        return tokens / pool_layout.marginal_pass_s(one, pool_layout.run_layout(layout, on, 4, PASSES, grid=grid,
                                                                                 scale=scale).makespan_s, PASSES)
    assert res["routing"] == "pool:1"
    assert res["jigsaw_x1.25_tps"] == pytest.approx(marginal("pool:1", 1.25))  # the headline's layout, its measure
    assert res["jigsaw_modelled_tps"] == pytest.approx(marginal("pool:1", 1.0, "modelled"))
    free = pool_layout.decide({8: pool_layout.profile_marginal(on[4], names, scale=0.0)})[1]
    assert free != "pool:1"  # with sharing free another layout wins: the what-if re-decides, so this tells them apart
    assert res["jigsaw_x0_tps"] == pytest.approx(marginal(free, 0.0))
