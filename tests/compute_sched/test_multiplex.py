"""JigsawRL policy core: grids and their provenance, the fitted model, the tracker, merging, the scheduler."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest

from orchestrl.compute_sched.hardware import load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.multiplex.catalog import grid_for, model_for
from orchestrl.compute_sched.multiplex.compare import compare, summary
from orchestrl.compute_sched.multiplex.grid import DATA_DIR, KINDS, SlowdownModel, load_grid
from orchestrl.compute_sched.multiplex.interference import PAPER_TARGETS, held_out, modelled_grid
from orchestrl.compute_sched.multiplex.lookahead import MEMORY_BUDGET_PCT, Action, Scheduler, Task, WorkerState
from orchestrl.compute_sched.multiplex.hooks import kv_pool_args, training_microbatch
from orchestrl.compute_sched.multiplex.ops import (Tail, balanced_shares, corun, merge_gain, migration_cost_s,
                                                 overlap_balanced_shares, co_runner_overlap)
from orchestrl.compute_sched.multiplex.substage import StepRecord, SubStageTracker
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.hardware import load_gpu
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.fabric.errors import ConfigError

MEASURED = DATA_DIR / "h100-green-context-2026-11-27.json"


def test_measured_grid_loads_and_every_point_keeps_its_source_and_value():
    g = load_grid(MEASURED)
    m = SlowdownModel(g)
    assert all("measured" in p.source for p in g.points)
    for p in g.points:  # interpolation passes through every measured point
        assert m.s(p.a, p.b, p.sm_a_frac, p.mem_a_pct) == pytest.approx(p.slowdown, rel=1e-4)
    assert m.s("reference", "train", 0.5) == m.s("prefill", "train", 0.5)  # the documented alias


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(format="v0"), "format"),
    (lambda d: d.update(points=[]), "points"),
    (lambda d: d.update(points=[{"a": "train", "sm_a_pct": 50, "slowdown": -1}]), "slowdown"),
    (lambda d: d.update(sm_count="abc"), "sm_count"),
    (lambda d: d.update(sm_count=[1]), "sm_count"),
    (lambda d: d.update(sm_count=-5), "sm_count"),
    (lambda d: d.pop("sm_count"), "sm_count"),  # its points give sm_a (SMs)
    (lambda d: d["points"][3].update(a="trian"), "points[3].a"),
    (lambda d: d["points"][3].update(b="decode-small"), "points[3].b"),
    (lambda d: d["points"][3].pop("source"), "points[3].source"),
])
def test_a_bad_grid_file_is_refused_naming_the_field(tmp_path, edit, field):
    doc = json.loads(MEASURED.read_text())
    edit(doc)
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        load_grid(f)
    assert str(f) in str(e.value) and field in str(e.value)


def test_a_grid_missing_a_kind_is_refused_when_loaded(tmp_path):
    doc = json.loads(MEASURED.read_text())
    doc["points"] = [p for p in doc["points"] if "decode_small" not in (p["a"], p["b"])]
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="decode_small"):
        load_grid(f)


def test_modelled_grid_fits_fig7_and_reports_the_held_out_numbers():
    got = held_out()
    for key, (paper, kind, _) in PAPER_TARGETS.items():
        if kind == "fit":
            assert got[key][1] == pytest.approx(paper, rel=0.02)
    # held out: reported, and within a factor of the paper's value (not fitted, so not exact)
    assert 0.6 < got["fig8_compute_pair_even_split"][1] / 2.19 < 1.2
    assert 0.8 < got["sec42_32b_rollout_mem_40_vs_80"][1] / 1.43 < 1.2
    g = modelled_grid()
    assert all(p.source.startswith("modelled") for p in g.points)
    m = SlowdownModel(g)
    # compute-bound work slows with fewer SMs, small-batch decode barely (Fig. 7)
    assert m.alone("train", 0.25) > 2.5 and m.alone("decode_small", 0.25) < 1.1


def test_comparison_reports_per_kind_errors_and_the_default_is_the_measurement_where_one_exists():
    errs = compare(model_for("H100", "Llama-3.1-8B", "modelled"), grid_for("H100"))
    s = summary(errs)
    assert set(KINDS) - {"reference"} <= set(s) and s["all"]["n"] == 60
    assert grid_for("H100").name.startswith("h100-green-context")
    assert grid_for("A100").name.startswith("modelled")
    with pytest.raises(ConfigError):
        grid_for("A100", choice="measured")


def test_tracker_changes_sub_stage_only_after_L_steps_and_marks_tool_gaps_idle():
    t = SubStageTracker(hysteresis=10, idle_gap_s=0.5)
    clock = 0.0
    for tokens, n in ((300, 20), (2000, 9), (300, 5), (40, 10)):
        t.observe(StepRecord(0, clock, 0.01 * n, tokens, n))
        clock += 0.01 * n
    t.observe(StepRecord(0, clock + 2.0, 0.01, 40))  # a 2 s gap: a tool call
    kinds = [s.kind for s in t.close()]
    assert kinds == ["decode_large", "decode_small", "idle", "decode_small"]


def test_simulated_engine_records_its_forward_steps():
    perf = PerfModel(load_model("Qwen3-4B"), load_gpu("H100"))
    eng = SimEngine(perf, homogeneous(InstanceConfig("tp", tp=1), 1), {f"r{i}": 50 + i for i in range(4)})
    eng.step_log = []
    eng.add_requests([GenerationRequest(f"r{i}", 100, 200) for i in range(4)])
    eng.advance(10.0)
    log = eng.step_log
    assert log[0].tokens == 400  # the batched prefill
    assert sum(r.steps for r in log[1:] if r.tokens == 4) == 50  # four sequences decode 50 steps together
    assert sum(r.tokens * r.steps for r in log[1:]) == sum(50 + i for i in range(4))


def test_merge_gain_follows_section_4_3_and_balancing_equalises_finish_times():
    ts = [Tail(0, 10.0, 4000, 2, "train", 10.0, 1.1, 1.3), Tail(1, 9.0, 4000, 2, "train", 10.0, 1.1, 1.3)]
    good = merge_gain(ts, 0, 10.5, lambda t: 0.2, lambda k, x: 1.3)
    bad = merge_gain(ts, 0, 25.0, lambda t: 0.2, lambda k, x: 1.3)
    assert good.delta_s > 0 > bad.delta_s
    shares = balanced_shares(4, 2, 1.6)
    assert sum(shares) == pytest.approx(1.0)
    assert shares[2] * 1.6 == pytest.approx(shares[0])


def _random_instance(rng: random.Random, n: tuple[int, int]) -> WorkerState:
    chains = []
    for c, k in enumerate(n):
        chains.append([Task(rng.choice(("prefill", "decode_large", "decode_small", "idle", "train", "reference")),
                            rng.uniform(0.5, 5.0), rng.choice((20, 40, 60, 80)),
                            f"{c}:r" if i < k - 1 else None) for i in range(k)])
    return WorkerState.start(chains)


def test_schedule_is_never_worse_than_greedy_and_never_over_commits_memory():
    sch = Scheduler(model_for("H100"))
    rng = random.Random(3)
    for _ in range(25):
        st = _random_instance(rng, (rng.randint(2, 5), rng.randint(2, 5)))
        plan = sch.schedule(st)
        assert plan.makespan_s <= sch.plan(st, "greedy").makespan_s + 1e-9
        for step in plan.steps:
            assert sum(step.action.mem) <= MEMORY_BUDGET_PCT + 1e-9
        # every task ran: the chains' work is all accounted for
        assert all(f < float("inf") for f in plan.finish_s)


def test_two_memory_hungry_sub_stages_are_never_placed_together():
    sch = Scheduler(model_for("H100"))
    a = [Task("decode_small", 3.0, 60, "A:r"), Task("decode_small", 3.0, 60, "A:r")]
    b = [Task("train", 4.0, 60)]
    plan = sch.schedule(WorkerState.start([a, b]))
    assert not any(all(s.action.run) for s in plan.steps)  # 60% + 60% never share the GPU
    assert plan.makespan_s == pytest.approx(10.0)  # so they run one after the other


def test_lookahead_is_close_to_the_exhaustive_optimum_on_small_instances():
    sch, exh = Scheduler(model_for("H100")), Scheduler(model_for("H100"), beam=None)
    rng = random.Random(5)
    for _ in range(5):
        st = _random_instance(rng, (3, 2))
        assert exh.optimum(st) / sch.schedule(st).makespan_s >= 0.9


def test_engine_hooks_turn_a_decision_into_engine_arguments(monkeypatch):
    from orchestrl.compute_sched.multiplex.hooks import budgeted_factory, green_context_stream, training_microbatch
    seen = {}

    def factory(config, gpu_ids, **kw):
        import os
        seen.update(kw, mps=os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
        return "engine"
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    assert budgeted_factory(factory, 0.25, 40)("cfg", (0,)) == "engine"
    assert seen == {"gpu_memory_utilization": 0.36, "mps": "25"}
    import os
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ  # restored after the build
    with pytest.raises(ConfigError, match="mem_pct"):
        training_microbatch(load_model("Qwen3-32B"), load_gpu("H100"), 20, 2)
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="green context"):
            green_context_stream(32)


def test_per_step_sm_budget_graphs_refuse_cleanly_without_a_gpu_and_pick_the_budget_a_decision_allows():
    """The engine hook for a per-step SM budget (graphs captured per green context): on a machine without
    CUDA it names what is missing instead of failing later; the budget chosen never exceeds the decision."""
    from orchestrl.compute_sched.multiplex.graph_groups import SmBudgetGraphs
    from orchestrl.fabric.errors import ConfigError
    with pytest.raises(ConfigError, match="budgets_pct"):
        SmBudgetGraphs(lambda: None, (0, 50))
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("covered on a GPU by bench/gpu_graph_groups.py")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        SmBudgetGraphs(lambda: None, (25, 100))
    g = SmBudgetGraphs.__new__(SmBudgetGraphs)
    g._graphs = {25.0: None, 50.0: None, 100.0: None}
    assert (g.budget_for(60), g.budget_for(100), g.budget_for(10)) == (50.0, 100.0, 25.0)


@pytest.mark.parametrize("window", [1, 3])
def test_nothing_runs_before_its_ready_time_whatever_the_window(window):
    """A barrier: both heads become ready later. The decision now is to wait (None), not what is best then;
    a plan through such waits starts every task at or after its ready time."""
    sch = Scheduler(model_for("H100"), window=window)
    chains = [(Task("reference", 2.0, 20.0, None, 5.0), Task("train", 4.0, 40.0)),
              (Task("decode_large", 3.0, 30.0, "r", 7.0), Task("decode_small", 1.0, 30.0, "r"))]
    st = WorkerState.start(chains)
    assert sch.decide(st) is None
    plan = sch.plan(st)
    firsts = {}
    for step in plan.steps:
        for c, kind in enumerate(step.kinds):
            if kind is not None:
                firsts.setdefault((c, kind), step.start_s)
    assert firsts[(0, "reference")] >= 5.0 - 1e-9 and firsts[(1, "decode_large")] >= 7.0 - 1e-9


@pytest.mark.parametrize("window", [1, 3])
def test_a_worker_behind_a_barrier_still_runs_both_rollouts_at_once(window):
    """Not the slowest replica: every action ends behind the same predicted barrier (the critical path
    ties), and the worker used to run one rollout alone while the other waited. Two small-batch decodes
    share a GPU at little cost, so both are done well before running them one after the other would be."""
    sch = Scheduler(model_for("H100"), window=window)
    gate = 50.0
    chains = [(Task("decode_small", 4.0, 30.0, "A:r"), Task("reference", 2.0, 20.0, None, gate)),
              (Task("decode_small", 4.0, 30.0, "B:r"), Task("reference", 2.0, 20.0, None, gate))]
    st = WorkerState.start(chains)
    first = sch.decide(st)
    assert first is not None and all(first.run)
    plan = sch.plan(st)
    done = max(s.end_s for s in plan.steps if "decode_small" in s.kinds)
    assert done < 0.8 * 8.0
    assert max(plan.finish_s) == pytest.approx(gate + 4.0, abs=0.5)  # the barrier still decides the step


@pytest.mark.parametrize("window", [1, 3])
def test_a_chain_that_finishes_first_does_not_win_the_tie_by_counting_as_zero(window):
    """Asymmetric: B's short decode then a far barrier. Running A alone first (B's chain counted as
    finished = 0) was preferred over running both; both decodes must be done before serial would end."""
    sch = Scheduler(model_for("H100"), window=window)
    chains = [(Task("decode_small", 4.0, 30.0, "A:r"),),
              (Task("decode_small", 2.0, 30.0, "B:r"), Task("reference", 2.0, 20.0, None, 50.0))]
    st = WorkerState.start(chains)
    first = sch.decide(st)
    assert first is not None and all(first.run)
    plan = sch.plan(st)
    assert max(s.end_s for s in plan.steps if "decode_small" in s.kinds) < 0.9 * 6.0


def test_the_critical_path_cache_never_answers_for_a_chain_it_no_longer_holds():
    """The runner hands the scheduler fresh chain tuples at every decision; a new chain may get the id of
    a freed one. Same head and remaining work, different tasks behind it: the bound must be the new one's."""
    sch = Scheduler(model_for("H100"))
    for i in range(60):
        chain = (Task("train", 1.0, 20.0), Task("train", float(i + 1), 20.0))  # a new object each time
        assert sch.bound(WorkerState.start([chain])) == pytest.approx(1.0 + (i + 1))


def test_a_reused_scheduler_decides_a_second_instance_as_a_fresh_one_would():
    """The look-ahead's memo is keyed on time, head indices and remaining work, not on the tasks: two
    instances whose heads have the same work collide. A reused scheduler answered the second from the
    first's entry (here: chain 0 at 25% of the SMs, right for the first instance's training, so the second's
    prefill got 25% where a fresh scheduler gives it 75% beside a small decode)."""
    model = model_for("H100", choice="modelled")
    first = WorkerState.start([[Task("train", 2.0, 20)], [Task("prefill", 2.0, 20), Task("prefill", 6.0, 20)]])
    second = WorkerState.start([[Task("prefill", 2.0, 20)],
                                [Task("decode_small", 2.0, 20), Task("decode_small", 3.0, 20)]])
    fresh = Scheduler(model).decide(second)
    reused = Scheduler(model)
    reused.decide(first)
    assert reused.decide(second) == fresh
    assert fresh != Scheduler(model).decide(first)  # the two instances do want different first actions


def test_a_fixed_part_every_worker_pays_is_not_divided_and_shifts_the_shares():
    # two workers, one slowed 2x by a co-runner throughout; each first pays 1 s whatever its share
    plain = overlap_balanced_shares(4.0, [2.0, 1.0], [100.0, 0.0])
    fixed = overlap_balanced_shares(4.0, [2.0, 1.0], [100.0, 0.0], [1.0, 1.0])
    assert plain == pytest.approx([1 / 3, 2 / 3]) and fixed == pytest.approx([0.25, 0.75])
    # both finish together: 2 * (1 + 4 * 0.25) == 1 + 4 * 0.75
    assert 2.0 * (1.0 + 4.0 * fixed[0]) == pytest.approx(1.0 + 4.0 * fixed[1])
    # a fixed part longer than the common finish time leaves that worker no share at all
    assert overlap_balanced_shares(1.0, [1.0, 1.0], [0.0, 0.0], [5.0, 0.0]) == pytest.approx([0.0, 1.0])
    with pytest.raises(ConfigError, match="fixed"):
        overlap_balanced_shares(1.0, [1.0, 1.0], [0.0, 0.0], [-1.0, 0.0])


def test_a_co_runner_that_does_not_fit_beside_the_share_delays_it_by_its_own_time_not_by_the_grids_cap():
    # training cannot share memory with the rollout (the grid's cap, 1000, on both sides): the worker waits the
    # rollout's 10 s and then takes a fair share; read as a speed, the cap left it nothing (the 2026-11-29 collapse)
    s, ov = co_runner_overlap(1000.0, 1000.0, 10.0)
    assert (s, ov) == (math.inf, 10.0)
    shares = overlap_balanced_shares(40.0, [s, 1.0], [ov, 0.0])
    assert shares == pytest.approx([0.375, 0.625])  # both end at 25 s: 10 + 15 == 25
    assert overlap_balanced_shares(40.0, [1000.0, 1.0], [10.0 * 1000.0, 0.0])[0] < 0.001  # the old reading
    # a pair that shares the GPU better than taking turns runs together: the share at its slowdown, the co-runner
    # stretched by its own
    assert co_runner_overlap(1.25, 1.05, 10.0) == (1.25, pytest.approx(10.5))
    # two trainings (about 2.16x each on the H100 grid) are slower together than in turn: wait
    assert co_runner_overlap(2.16, 2.16, 5.0) == (math.inf, 5.0)
    for bad, fld in (((0.5, 1.0, 1.0), "s_self"), ((1.0, math.inf, 1.0), "s_other"), ((1.0, 1.0, -1.0), "left_s")):
        with pytest.raises(ConfigError, match=fld):
            co_runner_overlap(*bad)
    with pytest.raises(ConfigError, match="waiting for ever"):
        overlap_balanced_shares(1.0, [math.inf, math.inf], [math.inf, math.inf])


# --- bad input: an error naming the field and the fix, never a traceback or a silently wrong number -------------

@pytest.mark.parametrize("call,field", [
    (lambda m: m.s("train", "decode_small", 25, 80), "sm_a_frac"),  # a percentage where a share is meant
    (lambda m: m.s("train", None, float("nan")), "sm_a_frac"),
    (lambda m: m.s("train", None, 1.5), "sm_a_frac"),
    (lambda m: m.s("train", None, 0.5, 500), "mem_a_pct"),
    (lambda m: m.s("train", None, 0.5, -10), "mem_a_pct"),
    (lambda m: m.s("trian", None, 0.5), "'a'"),
    (lambda m: m.s("train", "foo", 0.5), "'b'"),
])
def test_the_slowdown_model_refuses_out_of_range_shares_levels_and_kinds(call, field):
    m = model_for("H100")
    with pytest.raises(ConfigError, match=field):
        call(m)
    assert m.s("train", "decode_small", 0.25, 80) > 1.0  # a refused call leaves the model answering


def test_a_gpu_name_in_any_case_gets_that_gpus_grid():
    assert grid_for("h100") is grid_for("H100")
    assert grid_for("h100").name == "h100-green-context-2026-11-27"


def test_a_saved_grid_reloads_to_the_same_numbers(tmp_path):
    g = grid_for("H100")
    g.save(tmp_path / "g.json")
    again = load_grid(tmp_path / "g.json")
    a, b = SlowdownModel(g), SlowdownModel(again)
    for p in g.points:
        assert b.s(p.a, p.b, p.sm_a_frac, p.mem_a_pct) == pytest.approx(a.s(p.a, p.b, p.sm_a_frac, p.mem_a_pct),
                                                                         rel=1e-12)
    assert b.s("train", "decode_small", 0.25) == pytest.approx(a.s("train", "decode_small", 0.25), rel=1e-12)


def test_a_file_wide_source_stands_for_points_without_their_own(tmp_path):
    doc = json.loads(MEASURED.read_text())
    for p in doc["points"]:
        p.pop("source")
    doc["source"] = "measured: H100, 2026-11-27 (file-wide)"
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    assert {p.source for p in load_grid(f).points} == {doc["source"]}


@pytest.mark.parametrize("make,field", [
    (lambda: Task("trian", 1.0), "kind"),
    (lambda: Task("train", -5.0), "work_s"),
    (lambda: Task("train", float("nan")), "work_s"),
    (lambda: Task("train", float("inf")), "work_s"),
    (lambda: Task("train", 1.0, 150), "mem_min_pct"),
    (lambda: Scheduler(model_for("H100"), splits=(25, 50, 75)), "splits"),
    (lambda: Scheduler(model_for("H100"), levels=(0.2, 0.4, 0.6, 0.8)), "levels"),
])
def test_the_scheduler_refuses_bad_tasks_and_settings(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


@pytest.mark.parametrize("how", ["plan", "optimum"])
def test_a_task_no_memory_level_fits_is_refused_by_every_search(how):
    sch = Scheduler(model_for("H100"))
    st = WorkerState.start([[Task("train", 1.0, 90, label="big")]])
    with pytest.raises(ConfigError, match="big needs 90%"):
        sch.plan(st) if how == "plan" else sch.optimum(st)


@pytest.mark.parametrize("call,field", [
    (lambda m, g: training_microbatch(m, g, 500, 8), "mem_pct"),
    (lambda m, g: training_microbatch(m, g, float("nan"), 8), "mem_pct"),
    (lambda m, g: training_microbatch(m, g, 80, 0), "shards"),
    (lambda m, g: training_microbatch(m, g, 80, 8, tp=0), "tp"),
    (lambda m, g: training_microbatch(m, g, 80, 8, seq_tokens=0), "seq_tokens"),
    (lambda m, g: kv_pool_args(0.4), "mem_pct"),  # a fraction where a percentage is meant
    (lambda m, g: kv_pool_args(40, budget=2), "budget"),
    (lambda m, g: migration_cost_s(m, 8000, 0, 989e12), "gpus"),
    (lambda m, g: migration_cost_s(m, 8000, 1, 0.0), "peak_flops"),
    (lambda m, g: migration_cost_s(m, -10, 1, 989e12), "context_tokens"),
    (lambda m, g: corun(1.0, 1.0, 0.0, 1.0), "s_a"),
    (lambda m, g: overlap_balanced_shares(float("inf"), [1.0, 1.0], [0.0, 0.0]), "work_s"),
    (lambda m, g: overlap_balanced_shares(1.0, [0.5, 1.0], [0.0, 0.0]), "slowdowns"),
    (lambda m, g: overlap_balanced_shares(1.0, [1.0, 1.0], [0.0]), "overlap_s"),
    (lambda m, g: overlap_balanced_shares(1.0, [1.0, 1.0], [0.0, 0.0], [0.0, float("nan")]), "fixed_s"),
    (lambda m, g: model_for("H100").pair("train", "decode_small", 1.0), r"sm_a_frac.: 1\.0"),
])
def test_hooks_and_ops_refuse_values_that_would_give_nonsense(call, field):
    m, g = load_model("Qwen3-4B"), load_gpu("H100")
    with pytest.raises(ConfigError, match=field):
        call(m, g)


# --- the look-ahead's progress term --------------------------------------------------------------------------------

def test_a_short_chain_beside_a_long_one_runs_early_under_the_default_cost():
    # chain 1's short rollout is off this worker's critical path (chain 0's training is); it must not wait for it.
    # (The cross-worker barrier case the progress term was added for is checked in RLSim runs, docs/jigsaw.md.)
    # (This case holds under the critical path alone too; the next test is the one the progress term decides.)
    st = WorkerState.start([[Task("train", 10.0, 40)], [Task("decode_small", 1.0, 20, "B:rollout")]])
    plan = Scheduler(model_for("H100")).plan(st)
    assert plan.finish_s[1] < 2.0 and plan.finish_s[0] < 11.0


def test_a_replica_the_other_workers_wait_on_is_not_deferred_to_shave_this_workers_critical_path():
    """Pipeline B's 2 s rollout replica is what B's other workers wait on (its barrier); this worker's critical
    path is A's 100 s rollout. On the critical path alone the best window runs B's replica last (done at
    86 s, A 0.6% sooner); with the progress term it runs first (done at 2 s) for A 0.6% later."""
    a = [Task("prefill", 40.0, 60, "A:rollout"), Task("decode_large", 40.0, 20), Task("decode_small", 20.0, 20)]
    st = WorkerState.start([a, [Task("decode_large", 2.0, 20, "B:rollout")]])
    model = model_for("H100")
    plan, alone = Scheduler(model).plan(st), Scheduler(model, progress_weight=0.0).plan(st)
    assert alone.finish_s[1] > 80.0  # the deferral the term is there to stop (on the critical path alone)
    assert plan.finish_s[1] < 5.0 and plan.finish_s[0] < 1.01 * alone.finish_s[0]


@pytest.mark.parametrize("w", [True, "0.5", None, -1.0, float("nan"), float("inf")])
def test_a_bad_progress_weight_is_refused_naming_it(w):
    with pytest.raises(ConfigError, match="progress_weight"):
        Scheduler(model_for("H100"), progress_weight=w)


def test_each_chain_is_priced_by_its_own_pipelines_model():
    # two pipelines of different models (Fig. 16's Qwen3-0.6B beside Llama-3.1-8B) on a GPU with a modelled grid: the
    # 8B's KV pool at a low memory level is smaller than the 0.6B's, so its decode there is slower; one grid for both
    # (the first pipeline's, as before) priced the 8B's rollout as if it were the 0.6B's
    small, big = model_for("A100", "Qwen3-0.6B"), model_for("A100", "Llama-3.1-8B")
    assert big.s("decode_large", None, 1.0, 20) > small.s("decode_large", None, 1.0, 20)
    sch = Scheduler((small, big))
    st = WorkerState.start([[Task("decode_large", 1.0, 10)], [Task("decode_large", 1.0, 10)]])
    a = Action((True, True), 0.5, (20.0, 20.0))
    assert sch.slowdowns(st, a) == (small.s("decode_large", "decode_large", 0.5, 20),
                                    big.s("decode_large", "decode_large", 0.5, 20))
    assert Scheduler(small).slowdowns(st, a)[1] == small.s("decode_large", "decode_large", 0.5, 20)
    with pytest.raises(ConfigError, match="one SlowdownModel per chain"):
        Scheduler((small,)).slowdowns(st, a)
    from orchestrl.sim.multiplex import runner
    from orchestrl.sim.multiplex.workload import PipelineSpec
    runs = [runner.simulate_steps(PipelineSpec(f"{n}:{m}/gsm8k", m, "gsm8k", prompts=4, seed=i), "A100", 2, 1)
            for i, (n, m) in enumerate((("A", "Qwen3-0.6B"), ("B", "Llama-3.1-8B")))]
    group = runner._Group(runs, "jigsaw", "default", 1.0, 3)
    assert [m.grid.meta["model"] for m in group.sch.models] == ["Qwen3-0.6B", "Llama-3.1-8B"]


def test_jigsaw_async_prices_each_half_with_its_rollout_and_post_pipelines_models(monkeypatch):
    # on each half one pipeline's rollout (chain 0) runs beside the other's reference and training (chain 1): the
    # scheduler gets the rollout pipeline's model first, the post pipeline's second
    from orchestrl.sim.multiplex import baselines, runner
    from orchestrl.sim.multiplex.workload import PipelineSpec
    seen = []

    class Spy(Scheduler):
        def __init__(self, model, *a, **kw):
            seen.append(tuple(m.grid.meta["model"] for m in model))
            super().__init__(model, *a, **kw)
    monkeypatch.setattr(baselines, "Scheduler", Spy)
    half = [runner.simulate_steps(PipelineSpec(f"{n}:{m}/gsm8k", m, "gsm8k", prompts=4, seed=i), "A100", 2, 1)
            for i, (n, m) in enumerate((("A", "Qwen3-0.6B"), ("B", "Llama-3.1-8B")))]
    baselines.jigsaw_async(half)
    assert seen == [("Qwen3-0.6B", "Llama-3.1-8B"), ("Llama-3.1-8B", "Qwen3-0.6B")]


def test_the_runners_balancing_and_merging_price_each_pipelines_work_with_its_own_model():
    # Fig. 16's Qwen3-0.6B beside Llama-3.1-8B on 4 A100 workers with merging and balancing on. Every slowdown the
    # runner asks for outside the scheduler (balancing a post stage against the other pipeline's rollout, pricing a
    # merge against the other pipeline's co-located sub-stage) must come from the model of the pipeline whose work is
    # priced (balancing: the training at each split _beside tries, the other's sub-stage on the rest; merging: the tail's pair with the
    # other pipeline's sub-stage, and that sub-stage beside the merged tail). A model swap there is consistent, so no
    # symmetric outcome shows it.
    import sys

    from orchestrl.sim.multiplex import runner
    from orchestrl.sim.multiplex.workload import PipelineSpec
    calls, wrong = Counter(), []

    class Owned:
        def __init__(self, model, owner):
            self.model, self.owner = model, owner

        def __getattr__(self, name):
            return getattr(self.model, name)

        def s(self, ka, kb, sigma, mem):
            caller = sys._getframe(1)
            fn, p = caller.f_code.co_name, caller.f_locals.get("p")
            if fn == "<lambda>":
                calls[fn] += 1
                priced = 1 - p
                if priced != self.owner:
                    wrong.append((fn, ka, kb, sigma, "pipeline", p, "model of", self.owner))
            return self.model.s(ka, kb, sigma, mem)

        def pair(self, a, b, sm_a_frac, mem_a_pct=80.0, other=None):
            # merging prices the tail (a) beside the other pipeline's sub-stage (b): a's model is the tail's pipeline's,
            # b's (other) the other pipeline's
            caller = sys._getframe(1)
            fn, p = caller.f_code.co_name, caller.f_locals.get("p")
            calls[fn] += 1
            # _beside prices p's training (a) beside the other pipeline's sub-stage (b, other) the same way
            if fn in ("_try_merge", "_beside") and (self.owner, getattr(other, "owner", None)) != (p, 1 - p):
                wrong.append((fn, a, b, "pipeline", p, "models of", self.owner, getattr(other, "owner", None)))
            return self.model.pair(a, b, sm_a_frac, mem_a_pct, other=other and other.model)

    runs = [runner.simulate_steps(PipelineSpec(f"{n}:{m}/gsm8k", m, "gsm8k", prompts=16, seed=i), "A100", 4, 2)
            for i, (n, m) in enumerate((("A", "Qwen3-0.6B"), ("B", "Llama-3.1-8B")))]
    group = runner._Group(runs, "jigsaw", "default", 1.0, 3)
    group.models = tuple(Owned(m, i) for i, m in enumerate(group.models))
    result = group.run()
    assert calls["_beside"] and calls["_try_merge"] and calls["<lambda>"] and result.merges, (calls, result.merges)
    assert not wrong, wrong
