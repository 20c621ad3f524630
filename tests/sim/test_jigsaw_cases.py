"""A JigsawRL case in RLSim (run_case): the layout and fallback it reports, and every system at its best rollout TP
degree."""

from __future__ import annotations


import pytest

from orchestrl.fabric.errors import ConfigError


def test_a_case_reports_the_layout_the_fallback_and_rollmuxs_three_estimates():
    # what bench/jigsaw.py and jigsaw-fig12 read from run_case: the layout chosen, JigsawRL without the split
    # fallback where it fell back, and RollMux generous >= engine rate >= proportional (throughputs)
    from orchestrl.sim.experiments.jigsaw_common import Case, run_case
    pair = (("Qwen3-0.6B", "gsm8k", 1, 1.0),) * 2
    out = run_case(Case("fig12", "t", "H100", 4, pair, steps=1, systems=("verl", "rollmux", "jigsaw")))
    assert out["routing"] == "split" and out["verl_config"] == "split"
    assert out["jigsaw_tps"] == pytest.approx(out["verl_tps"], rel=1e-6)  # the fallback is veRL split exactly
    assert out["shared_routing"] in ("uniform", "halves") and out["jigsaw_shared_tps"] < out["jigsaw_tps"]
    assert out["rollmux_tps"] >= out["rollmux_engine_tps"] >= out["rollmux_proportional_tps"] > 0
    assert out["rollmux_engine_config"].startswith("rollout on ") and out["memory_violations"] == 0
    shared = run_case(Case("fig12", "t", "H100", 4, pair, steps=1, systems=("verl", "jigsaw"),
                           layouts=("uniform", "halves")))
    assert shared["routing"] == out["shared_routing"] and "jigsaw_shared_tps" not in shared
    assert shared["jigsaw_tps"] == pytest.approx(out["jigsaw_shared_tps"], rel=1e-6)


def test_every_baseline_is_reported_at_its_fastest_rollout_tp_and_the_bound_covers_every_degree():
    # Qwen3-4B's long GSM8K tail decodes faster at TP 2 (its weights read from two GPUs' HBM): veRL at TP 1 only
    # would be a weaker baseline than a user tuning veRL's rollout TP would run
    from orchestrl.sim.experiments.jigsaw_common import Case, run_case
    pair = (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2
    out = run_case(Case("fig12", "t", "H100", 4, pair, steps=1, systems=("verl", "rollmux", "muxserve", "jigsaw"),
                        tps=(2, 1, 2)))
    runs = out["tp_runs"]
    assert out["tp"]["candidates"] == [1, 2] and set(runs) == {1, 2}
    assert runs[2]["verl_tps"] > 1.05 * runs[1]["verl_tps"]  # the degree matters on this pair
    for sysname in ("verl", "rollmux", "muxserve"):
        assert out[f"{sysname}_tps"] == max(r[f"{sysname}_tps"] for r in runs.values())
        assert out["tp"][sysname] == max(runs, key=lambda t: runs[t][f"{sysname}_tps"])
    assert out["verl_own_tp_tps"] == runs[1]["verl_tps"]
    assert out["jigsaw_tps"] == runs[out["tp"]["jigsaw"]]["jigsaw_tps"]
    # the same case run at TP 2 alone (the single-degree path): veRL there is the veRL reported above
    alone = run_case(Case("fig12", "t", "H100", 4, pair, steps=1, systems=("verl",), tps=(2,)))
    assert alone["tp"] == {"candidates": [2]} and out["verl_tps"] == pytest.approx(alone["verl_tps"], rel=1e-9)
    # no system at any degree beats the bound (each degree's own bound is a bound for schedules at that degree)
    assert all(out["bound_tps"] >= r[k] for r in runs.values() for k in ("verl_tps", "rollmux_tps", "muxserve_tps",
                                                                         "jigsaw_tps"))
    assert out["memory_violations"] == 0


def test_jigsaws_rollout_tp_is_decided_on_its_profile_with_the_split_margin_not_on_the_measured_run():
    from orchestrl.sim.experiments.jigsaw_common import Case, _best_tp
    from orchestrl.sim.multiplex.layouts import ROUTING_MARGIN
    case = Case("fig12", "t", "H100", 8, (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2, tps=(1, 2))

    def run(costs, jig, routing):
        return {"routing_costs": costs, "routing": routing, "jigsaw_tps": jig, "verl_tps": 1.0, "verl_config": "split",
                "exclusive_step_s": {"A": 1.0}, "memory_violations": 0, "wall_s": 0.0}
    # the run at TP 1 measured faster, but the profile predicted TP 2's uniform layout shorter: TP 2 is run
    out = _best_tp(case, {1: run({"split": 100.0, "uniform": 104.0}, 9.0, "split"),
                          2: run({"split": 100.0, "uniform": 97.0}, 5.0, "uniform")})
    assert out["tp"]["jigsaw"] == 2 and out["jigsaw_tps"] == 5.0 and out["routing"] == "uniform"
    # a sharing layout at another degree must beat a split by the routing margin too
    near = 100.0 * (1 - ROUTING_MARGIN) + 0.1
    out = _best_tp(case, {1: run({"split": 100.0}, 9.0, "split"), 2: run({"uniform": near}, 5.0, "uniform")})
    assert out["tp"]["jigsaw"] == 1 and out["routing"] == "split"
    # the steady measure repeats each degree's profile by its own pass counts: degrees compare per profiled token
    a, b = run({"split": 100.0}, 9.0, "split"), run({"split": 150.0}, 5.0, "split")
    a["routing_tokens"], b["routing_tokens"] = 1000, 2000
    assert _best_tp(case, {1: a, 2: b})["tp"]["jigsaw"] == 2
    # no profile (e.g. one pipeline): the pipelines' own degree, not the smallest searched
    two = Case("fig12", "t", "H100", 8, (("Qwen3-4B", "gsm8k", 2, 1.0),) * 2, tps=(1, 2))
    nop = {t: {k: v for k, v in run({}, float(t), "uniform").items() if k != "routing_costs"} for t in (1, 2)}
    assert _best_tp(two, nop)["tp"]["jigsaw"] == 2


def test_fig15_baselines_run_at_their_fastest_tp_and_jigsaw_async_where_its_profile_says():
    # Fig. 15 (asynchronous): StreamRL and AReaL at their fastest degree in hindsight; JigsawRL-async at the degree
    # its plan on profiling steps (other draws) prefers, not the one measured fastest; no veRL in the case, and
    # each pipeline's step alone is still taken at its fastest degree (Fig. 14's denominator)
    from orchestrl.sim.experiments.jigsaw_common import Case, _best_tp, run_case
    case = Case("fig15", "t", "H100", 8, (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2, systems=("streamrl",), tps=(1, 2))

    def run(s, a, j, prof, alone):
        return {"streamrl_tps": s, "areal_tps": a, "jigsaw_async_tps": j, "jigsaw_async_profile_s_per_token": prof,
                "exclusive_step_s": {"A": alone, "B": alone + 1}, "memory_violations": 0, "wall_s": 0.0}
    out = _best_tp(case, {1: run(10.0, 30.0, 11.0, 0.6, 20.0), 2: run(12.0, 25.0, 9.0, 0.5, 15.0)})
    assert (out["streamrl_tps"], out["tp"]["streamrl"]) == (12.0, 2) and (out["areal_tps"], out["tp"]["areal"]) == (30.0, 1)
    assert (out["jigsaw_async_tps"], out["tp"]["jigsaw_async"]) == (9.0, 2)  # its profile preferred TP 2
    assert out["exclusive_step_s"] == {"A": 15.0, "B": 16.0}
    real = run_case(Case("fig15", "t", "H100", 8, (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2, steps=1,
                         systems=("streamrl",), tps=(1, 2, 4)))
    runs = real["tp_runs"]
    assert set(runs[1]) >= {"streamrl_tps", "areal_tps", "jigsaw_async_tps"} and "streamrl_tps" not in runs[4]
    assert "jigsaw_async_tps" in runs[4]  # JigsawRL-async needs only halves: one TP-4 replica per half
    assert real["streamrl_tps"] == max(runs[t]["streamrl_tps"] for t in (1, 2))  # a quarter holds TP 1 or 2 only
    assert real["jigsaw_async_tps"] == runs[real["tp"]["jigsaw_async"]]["jigsaw_async_tps"]


def test_every_figure_headline_is_rerun_on_each_grid_at_the_degree_it_ran_at():
    # the issue asks how each headline moves if the slowdown grid is off by +-25%: run_case reruns JigsawRL (here
    # JigsawRL-async, Fig. 15) on every SENSITIVITY grid at the degree its headline was taken at, and grid_rows turns
    # that into one row per grid; a case run without sensitivity gives no such rows
    from orchestrl.sim.experiments.jigsaw_common import SENSITIVITY, Case, _specs, grid_rows, ratio, run_case
    from orchestrl.sim.multiplex.baselines import jigsaw_async
    from orchestrl.sim.multiplex.runner import simulate_steps
    pair = (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2
    out = run_case(Case("fig15", "t", "H100", 8, pair, steps=1, systems=("streamrl",), tps=(1, 2), sensitivity=True))
    t = out["tp"]["jigsaw_async"]
    half = [simulate_steps(s, "H100", 8 // t // 2, 1) for s in _specs(Case("fig15", "t", "H100", 8,
                                                                            tuple((m, k, t, sc) for m, k, _, sc in pair)))]
    for tag, grid, scale in SENSITIVITY:
        assert out[f"jigsaw_async_{tag}_tps"] == pytest.approx(jigsaw_async(half, grid=grid, scale=scale).throughput_tps)
    assert out["jigsaw_async_x1.25_tps"] != out["jigsaw_async_x0.75_tps"]  # the grid moves this headline
    rows = grid_rows([out], "mean/streamrl", lambda rs, tag: ratio(rs[0], f"jigsaw_async_{tag}", "streamrl"), 1.25)
    assert [r.label for r in rows] == [f"mean/streamrl grid {tag}" for tag, _, _ in SENSITIVITY]
    assert rows[0].ours == pytest.approx(out["jigsaw_async_x0.75_tps"] / out["streamrl_tps"]) and rows[0].paper == 1.25
    plain = run_case(Case("fig15", "t", "H100", 8, pair, steps=1, systems=("streamrl",), tps=(1,)))
    assert grid_rows([plain], "mean/streamrl", lambda rs, tag: ratio(rs[0], f"jigsaw_async_{tag}", "streamrl")) == []


def test_steady_per_pipeline_ratios_are_against_verl_split_at_verls_own_degree():
    from orchestrl.sim.experiments.jigsaw_common import Case, _best_tp
    case = Case("cli", "t", "H100", 8, (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2, tps=(1, 2), steady=True)

    def run(split_rates, jig_ratio, costs):
        return {"routing_costs": costs, "routing": "split", "verl_tps": sum(split_rates), "verl_config": "split",
                "verl_split_rates_tps": split_rates, "jigsaw_tps": 1.0, "jigsaw_per_pipeline_vs_split": jig_ratio,
                "exclusive_step_s": {"A": 1.0, "B": 1.0}, "memory_violations": 0, "wall_s": 0.0}
    # JigsawRL runs at TP 1 (its profile), where it matches TP 1's split; veRL's split is twice as fast at TP 2
    out = _best_tp(case, {1: run([10.0, 30.0], [1.0, 1.0], {"split": 1.0}), 2: run([20.0, 60.0], [1.0, 1.0], {"split": 2.0})})
    assert out["tp"]["jigsaw"] == 1 and out["tp"]["verl"] == 2
    assert out["jigsaw_per_pipeline_vs_split"] == pytest.approx([0.5, 0.5])


def test_bad_tp_degrees_are_refused_naming_the_field():
    from orchestrl.sim.experiments.jigsaw_common import Case, run_case, tp_candidates, tp_search
    pair = (("Qwen3-0.6B", "gsm8k", 1, 1.0),) * 2
    for tps, what in (((0,), "integers >= 1"), ((1.5,), "integers >= 1"), ((3,), "multiple of 2t")):
        with pytest.raises(ConfigError, match=what) as e:
            run_case(Case("fig12", "t", "H100", 8, pair, tps=tps))
        assert e.value.field == "tps"
    assert tp_candidates(Case("fig12", "t", "H100", 8, pair)) == (1,)  # none given: the pipelines' own
    assert tp_search(1, 8) == (1, 2, 4) and tp_search(2, 8) == (2, 4) and tp_search(8, 8) == ()
    eight = (("Qwen3-0.6B", "gsm8k", 8, 1.0),) * 2
    assert tp_candidates(Case("fig12", "t", "H100", 16, eight, tps=tp_search(8, 8))) == (8,)  # none: its own
