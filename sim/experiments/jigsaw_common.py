"""JigsawRL's figures in RLSim (§5): settings, one case's run, and the rows each figure prints.

Every case simulates the pipelines' steps once on the engine model (:mod:`sim.multiplex`) and runs
every system on those same steps: veRL (its better configuration), RollMux, JigsawRL-MuxServe,
JigsawRL (look-ahead, merging, balancing, its layout decided per case), and the ablations. The
paper's numbers are printed beside ours (:class:`~sim.experiments.common.Row`), never divided into a
pass mark; docs/jigsaw.md says where and why they differ. Grid: the default slowdown grid of the GPU
(measured on H100/H800, modelled elsewhere), and, for the sensitivity rows, every slowdown's excess
scaled by 0.75 and 1.25, and by 0 (a what-if in which neither sharing a GPU nor running on part of
its SMs costs anything: what this scheduler reaches when only the steps' own shapes limit it).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rowsplot import FigureCli, SweepFigure
from orchestrl.sim.multiplex.baselines import (PASSES, POOL_OFFSETS, areal, jigsaw_async, repeat_steps, rollmux,
                                               repeat_each, steady_passes, steady_rates, verl_steady, vs_split,
                                               streamrl, verl)
from orchestrl.sim.multiplex.bounds import pipeline_chain_s
from orchestrl.sim.multiplex.layouts import (ROUTINGS, choose, margin_adjusted, predict_routing, profile_costs,
                                             profile_draws, profile_steps, routing_args)
from orchestrl.sim.multiplex.pool_layout import (decide, layouts_for, marginal_pass_s, needed_replicas, pool_size,
                                                 profile_marginal)
from orchestrl.sim.multiplex.runner import run_group, simulate_steps
from orchestrl.sim.multiplex.workload import PipelineSpec

RULES = ("twostep", "longrun")

__all__ = ["Case", "FIG12", "tp_search", "run_case", "tp_candidates", "figure"]


@dataclass(frozen=True)
class Case:
    """One setting: two pipelines (model, task, TP) on ``gpus`` GPUs of ``gpu`` for ``steps`` steps."""

    figure: str
    label: str
    gpu: str
    gpus: int
    pipelines: tuple[tuple[str, str, int, float], ...]  # (model, task, tp, length scale)
    steps: int = 2
    systems: tuple[str, ...] = ("verl", "rollmux", "muxserve", "jigsaw")
    #: also run JigsawRL (its no-merge ablation, JigsawRL-async) on every SENSITIVITY grid: the excess x0.75 / x1.25,
    #: the modelled grid and sharing free (x0), over two steps from a cold start, the layout re-decided on that grid's
    #: profile (under ``rule="longrun"``: by the long-run rule's measure, in the layout the default grid's profile
    #: picked, but for the what-if with sharing free, re-decided on its own long-run profile)
    sensitivity: bool = False
    seed: int = 0  # trace seed: `sim figure --seeds N` draws other samples (seed 0 keeps the documented runs)
    longrun: bool = False  # time JigsawRL and MuxServe over baselines.PASSES passes of the steps (RollMux always is); else two steps
    layouts: tuple[str, ...] = ROUTINGS  # the layouts JigsawRL's profile chooses among (layouts.ROUTINGS)
    #: the steady-state measure: each pipeline runs as many passes over its steps as fit while the longest runs
    #: baselines.PASSES (baselines.steady_passes), for every system (RollMux: the better of one group, whose round
    #: robin runs one step of each job per meta-iteration, and each job alone on its half: baselines.rollmux);
    #: StreamRL and AReaL are left out
    steady: bool = False
    #: rollout TP degrees (GPUs per DP worker, the same for both pipelines) every system is also run at, each system
    #: then reported at its best: veRL, RollMux, MuxServe, StreamRL and AReaL at whichever ran fastest (known only
    #: after the run: generous to them), JigsawRL at the degree and layout its profile picks (decided before the run,
    #: :func:`run_case`). ``()``: the pipelines' own TP only. A degree must leave each pipeline an even share of
    #: whole workers (``gpus`` a multiple of twice it); larger degrees shorten a long tail's decode (its weights are
    #: read from more GPUs' HBM at once), which veRL's rollout TP setting already buys a user
    tps: tuple[int, ...] = ()
    #: how JigsawRL's layout is decided and timed: ``"twostep"`` (the default; the two-step figures'): ``layouts`` on
    #: the two-step profile, timed by the makespan per pass over the long run; ``"longrun"`` (the long-run figures';
    #: needs ``longrun``, not ``steady``): every
    #: layout of :func:`~sim.multiplex.pool_layout.layouts_for` (``layouts`` plus the ``pool:k`` layouts) on the
    #: profile draws' marginal pass (:func:`~sim.multiplex.pool_layout.profile_marginal`), JigsawRL and MuxServe timed
    #: by the marginal pass too, ``(M(PASSES) - M(1)) / (PASSES - 1)``, the long-run measure RollMux's baseline has
    #: (docs/jigsaw.md, "A pool layout")
    rule: str = "twostep"


def tp_search(tp: int, gpus: int) -> tuple[int, ...]:
    """The rollout TP degrees the figures and ``orchestrl sim jigsaw`` search by default for pipelines of TP ``tp``
    on ``gpus`` GPUs: ``tp``, ``2 tp`` and ``4 tp``, within one 8-GPU node, where each pipeline keeps an even
    share of whole workers (Fig. 12's: 1, 2, 4); ``()`` where none does (then :func:`run_case` runs the pipelines'
    own degree only).

    >>> tp_search(1, 8), tp_search(4, 8), tp_search(1, 4), tp_search(8, 8)
    ((1, 2, 4), (4,), (1, 2), ())
    """
    return tuple(t for t in (tp, 2 * tp, 4 * tp) if t <= 8 and gpus % (2 * t) == 0)


#: Fig. 12's settings (8 H100, two pipelines of one model and task, different weights).
FIG12 = (("Qwen3-0.6B", "gsm8k", 1, 1.0), ("Qwen3-0.6B", "math", 1, 1.0), ("Qwen3-4B", "gsm8k", 1, 1.0),
         ("Qwen3-4B", "math", 1, 1.0), ("Qwen3-4B", "aime", 1, 1.0), ("Llama-3.1-8B", "gsm8k-mt", 1, 0.7),
         ("Qwen3-4B", "search-r1", 1, 1.0))


def _specs(case: Case) -> list[PipelineSpec]:
    out = []
    for i, (model, task, tp, scale) in enumerate(case.pipelines):
        out.append(PipelineSpec(f"{'AB'[i]}:{model}/{task}", model, task, tp=tp, seed=i + 1 + 100 * case.seed,
                                length_scale=scale))
    return out


def tp_candidates(case: Case) -> tuple[int, ...]:
    """The rollout TP degrees :func:`run_case` runs ``case`` at: ``case.tps`` (sorted, without repeats), or the
    pipelines' own TP when it is empty. A ConfigError names a degree that is not an integer >= 1 or that does not
    give each pipeline an even number of whole workers."""
    own = case.pipelines[0][2] if case.pipelines else 1
    if not case.tps:
        return (own,)
    bad = [t for t in case.tps if isinstance(t, bool) or not isinstance(t, int) or t < 1]
    if bad:
        raise ConfigError(f"jigsaw case {case.label!r}", "tps", f"{bad!r} in {list(case.tps)!r}", "integers >= 1, e.g. 1, 2, 4")
    uneven = [t for t in case.tps if case.gpus % (2 * t)]
    if uneven:
        raise ConfigError(f"jigsaw case {case.label!r}", "tps", f"{uneven} on {case.gpus} GPUs",
                          f"degrees t with {case.gpus} a multiple of 2t (each pipeline then has half the workers "
                          "for veRL split), here " + ", ".join(str(t) for t in (1, 2, 4, 8) if not case.gpus % (2 * t)))
    return tuple(sorted(set(case.tps)))


def run_case(case: Case) -> dict[str, Any]:
    """Run every system of ``case`` on the same simulated steps; return throughputs, latencies and audits.

    With more than one rollout TP degree (``case.tps``) the case runs at each (the same samples every time) and
    every system is reported at its best degree (:func:`_best_tp`): ``out["tp"]`` says which, and
    ``out["tp_runs"]`` keeps each degree's headline throughputs."""
    cands = tp_candidates(case)
    at = {t: _run_at(replace(case, pipelines=tuple((m, k, t, sc) for m, k, _, sc in case.pipelines), tps=()))
          for t in cands}
    if len(cands) == 1:
        out = at[cands[0]]
        out["tp"] = {"candidates": list(cands)}
        return out
    return _best_tp(case, at)


#: the grids every JigsawRL headline is also run on with ``Case.sensitivity`` (tag, grid, scale of each slowdown's
#: excess): the default grid's excess off by -25% and +25%, the other grid (modelled where the default is measured;
#: on GPUs without a measured grid the two coincide) and the what-if in which sharing a GPU costs nothing
SENSITIVITY = (("x0.75", "default", 0.75), ("x1.25", "default", 1.25), ("modelled", "modelled", 1.0),
               ("x0", "default", 0.0))


def grid_rows(results: Sequence[dict], label: str, headline, paper: float | None = None) -> list[Row]:
    """How one headline moves with the slowdown grid: one row per :data:`SENSITIVITY` tag, ``headline(results, tag)``
    (which reads the keys ``run_case`` writes under that tag, e.g. ``jigsaw_x0.75_tps``); a tag whose keys are missing
    (a case run without ``sensitivity``) gives no row. The headline on the default grid is the figure's own row."""
    rows = []
    for tag, _, _ in SENSITIVITY:
        if not all(f"jigsaw_{tag}_tps" in r or f"jigsaw_async_{tag}_tps" in r for r in results):
            continue  # run without sensitivity: no row (a key the headline misses otherwise is a bug, and raises)
        rows.append(Row(f"{label} grid {tag}", paper, headline(results, tag)))
    return rows


_RUN_KEYS = ("verl_tps", "verl_serial_tps", "rollmux_tps", "rollmux_engine_tps", "rollmux_proportional_tps",
             "muxserve_tps", "jigsaw_tps", "jigsaw_shared_tps", "streamrl_tps", "areal_tps", "jigsaw_async_tps",
             "bound_tps")


def _best_tp(case: Case, at: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One result from the runs at each TP degree (``at``: degree -> :func:`_run_at`'s result), each system at its
    best. JigsawRL: the degree whose profiled layout is shortest (the profile's makespans, the static split's
    shortened by the routing margin, compared across degrees as across layouts), so nothing measured decides it;
    without a profile, the pipelines' own degree. The steady measure's profiles repeat each draw by each degree's
    own pass counts, so degrees are compared by seconds per profiled token (the same rule where the work is equal).
    JigsawRL-async (Fig. 15): the degree whose plan on the profiling steps takes fewest seconds per token.
    The baselines: the degree at which each ran fastest. The bound: each pipeline's chain at its best degree, the
    longest of them (no schedule that runs each pipeline at one of the degrees can beat it; one that changes TP
    mid-step is not covered). Per-pipeline steady ratios are re-taken against veRL split's rates at veRL's degree."""
    cands = sorted(at)
    own = case.pipelines[0][2]
    # seconds per profiled token: within a degree the layouts run the same profile (so this is the makespan rule),
    # across degrees the steady measure repeats each profile draw by that degree's own pass counts
    adjusted = {t: min(margin_adjusted(at[t]["routing_costs"]).values()) / at[t].get("routing_tokens", 1)
                for t in cands if at[t].get("routing_costs")}
    tj = min(adjusted, key=lambda t: (adjusted[t], t)) if len(adjusted) == len(cands) else (own if own in at else cands[0])
    out = dict(at[tj])

    def best(key: str) -> int | None:
        have = [t for t in cands if at[t].get(key) is not None]
        return max(have, key=lambda t: (at[t][key], -t)) if have else None

    chosen = {"candidates": cands, "jigsaw": tj}
    tv = best("verl_tps")
    if tv is not None:
        for k in ("verl_tps", "verl_config", "verl_split_rates_tps", "verl_mfu", "rollout_share_verl"):
            if k in at[tv]:
                out[k] = at[tv][k]
        chosen["verl"] = tv
        ts = best("verl_serial_tps")
        if ts is not None:
            out["verl_serial_tps"], out["verl_serial_mfu"] = at[ts]["verl_serial_tps"], at[ts].get("verl_serial_mfu")
            chosen["verl_serial"] = ts
        out["verl_own_tp_tps"] = at[own]["verl_tps"] if own in at else None  # veRL at the pipelines' own degree
    # each pipeline alone on all the GPUs at its fastest degree (what a latency increase is against)
    out["exclusive_step_s"] = {n: min(at[t]["exclusive_step_s"][n] for t in cands) for n in out["exclusive_step_s"]}
    if all(at[t].get("chain_s") for t in cands):
        # each pipeline's chain at its own best degree, the longest of them: a schedule may run the two at different
        # degrees (each on its own workers), so the max over pipelines of the min over degrees, not the reverse
        names = list(at[cands[0]]["chain_s"])
        out["bound_tps"] = out["tokens"] / max(min(at[t]["chain_s"][n] for t in cands) for n in names)
    for sysname, keys in (("rollmux", ("rollmux_tps", "rollmux_config", "rollmux_steps_run", "rollmux_per_pipeline_vs_split")),
                          ("rollmux_engine", ("rollmux_engine_tps", "rollmux_engine_config")),
                          ("rollmux_proportional", ("rollmux_proportional_tps",)),
                          ("muxserve", ("muxserve_tps", "muxserve_twostep_tps", "muxserve_latency_s", "muxserve_mfu",
                                        "muxserve_merges", "muxserve_per_pipeline_vs_split")),
                          ("streamrl", ("streamrl_tps",)), ("areal", ("areal_tps",))):
        t = best(f"{sysname}_tps")
        if t is None:
            continue
        chosen[sysname] = t
        for k in keys:
            if k in at[t]:
                out[k] = at[t][k]
            else:
                out.pop(k, None)
    # JigsawRL-async (Fig. 15): the degree whose plan on the profiling steps takes fewest seconds per token
    prof = {t: at[t]["jigsaw_async_profile_s_per_token"] for t in cands if "jigsaw_async_profile_s_per_token" in at[t]}
    if prof:
        t = min(prof, key=lambda t: (prof[t], t))
        for k in [k for k in at[t] if k.startswith("jigsaw_async_")]:
            out[k] = at[t][k]  # its headline, profile and sensitivity runs, at the degree chosen
        chosen["jigsaw_async"] = t
    # JigsawRL confined to the layouts sharing workers: the degree whose profiled sharing layout is shortest
    shared = {t: min(v for r, v in at[t]["routing_costs"].items() if r != "split") / at[t].get("routing_tokens", 1)
              for t in cands if any(r != "split" for r in at[t].get("routing_costs", {}))}
    if shared and "jigsaw_tps" in out:
        t = min(shared, key=lambda t: (shared[t], t))
        r = at[t]
        out["jigsaw_shared_tps"] = r["jigsaw_shared_tps"] if r.get("routing") == "split" else r["jigsaw_tps"]
        out["shared_routing"] = r.get("shared_routing") if r.get("routing") == "split" else r.get("routing")
        chosen["jigsaw_shared"] = t
    if out.get("verl_split_rates_tps"):  # steady: every per-pipeline ratio against veRL split at veRL's degree
        base = out["verl_split_rates_tps"]
        for key in [k for k in out if k.endswith("_per_pipeline_vs_split")]:
            t = chosen.get(key[: -len("_per_pipeline_vs_split")], tj)
            split_t = at[t].get("verl_split_rates_tps") or base  # what the ratio at degree t was against
            out[key] = [x * o / b for x, o, b in zip(out[key], split_t, base, strict=True)]
    out["tp"] = chosen
    out["tp_runs"] = {t: {k: at[t][k] for k in _RUN_KEYS + ("routing",) if at[t].get(k) is not None} for t in cands}
    out["memory_violations"] = sum(at[t]["memory_violations"] for t in cands)
    out["wall_s"] = sum(at[t]["wall_s"] for t in cands)
    return out


def _run_at(case: Case) -> dict[str, Any]:
    """:func:`run_case` at the pipelines' own TP degree."""
    wall = time.perf_counter()
    if case.steady and case.longrun:
        raise ConfigError("jigsaw case", "steady", "with longrun", "one of the two (steady already runs many passes)")
    if case.rule not in RULES:
        raise ConfigError(f"jigsaw case {case.label!r}", "rule", f"{case.rule!r}", ", ".join(RULES))
    if case.rule == "longrun" and not case.longrun:
        raise ConfigError(f"jigsaw case {case.label!r}", "rule", "'longrun' without the long run",
                          "longrun=True (the rule and its measure compare runs of one and of several passes; "
                          "`orchestrl sim jigsaw --long-run`), or rule 'twostep'")
    specs = _specs(case)
    d = case.gpus // specs[0].tp
    full = [simulate_steps(s, case.gpu, d, case.steps) for s in specs]
    out: dict[str, Any] = {"figure": case.figure, "label": case.label, "gpu": case.gpu, "gpus": case.gpus,
                           "steps": case.steps, "tokens": sum(sum(r.tokens) for r in full)}
    roll = [max(t.end_s for t in r.traces[0]) / r.step_alone_s(0) for r in full]
    out["rollout_share_verl"] = statistics.fmean(roll)
    out["exclusive_step_s"] = {r.spec.name: statistics.fmean(r.step_alone_s(k) for k in range(r.steps)) for r in full}
    half = quarter = None
    if d >= 2:
        half = [simulate_steps(s, case.gpu, d // 2, case.steps) for s in specs]
    if d >= 4:
        quarter = [simulate_steps(s, case.gpu, d // 4, case.steps) for s in specs]
    nsteps, longrun = case.steps, case.longrun
    if case.steady:
        if half is None or len(full) != 2:
            raise ConfigError("jigsaw case", "steady", f"{len(full)} pipeline(s) on {d} worker(s)",
                              "two pipelines on at least two workers (the measure balances veRL split's halves)")
        passes = steady_passes(half)
        full, half = repeat_each(full, passes), repeat_each(half, passes)
        nsteps, longrun = max(r.steps for r in full), False  # already many passes: timed as they run
        out["steady_passes"], out["tokens"] = list(passes), sum(sum(r.tokens) for r in full)
        out["left_out"] = [x for x in ("streamrl",) if x in case.systems]  # equal step counts only

    split_rates: list[float] = []

    def tps(res: Any, key: str | None = None) -> float:  # a group run's throughput under the case's measure
        if not case.steady:
            return res.throughput_tps
        rates = steady_rates([res.step_end_s[x.spec.name] for x in full], [x.tokens for x in full])
        if key and split_rates:  # what each job gets against its own rate on its half (the sum can hide a loser)
            out[f"{key}_per_pipeline_vs_split"] = vs_split(rates, split_rates)
        return sum(rates)

    if "verl" in case.systems:
        b = verl(full, half or full)
        out["verl_tps"], out["verl_config"] = b.throughput_tps, b.detail["config"]
        out["verl_serial_tps"] = b.tokens / b.detail["serial_s"]
        if case.steady:  # split measured while both halves run (they end within half a pass of each other)
            out["verl_tps"], out["verl_config"], split_rates = verl_steady(full, half)
            out["verl_split_rates_tps"] = split_rates
        else:
            # what no schedule of these steps can beat (sim/multiplex/bounds.py): the target's reachability. Not for
            # the steady measure (a pipeline's own chain bounds its rate, not the window's aggregate)
            out["chain_s"] = {r.spec.name: pipeline_chain_s(r) for r in full}
            out["bound_tps"] = b.tokens / max(out["chain_s"].values())
    if "rollmux" in case.systems and half:
        # RollMux's pools: half the replicas, and one more or one fewer (its best configuration is searched); under
        # the steady measure each pipeline's steps repeated as for the others (in one group RollMux then runs both jobs
        # as many iterations as the one with fewest, one each per meta-iteration; alone, each its own: baselines.rollmux)
        def on(n: int) -> list:
            steps = [simulate_steps(s, case.gpu, n, case.steps) for s in specs]
            return repeat_each(steps, out["steady_passes"]) if case.steady else steps

        pools = [half]
        for off in POOL_OFFSETS:
            if off and 1 <= d // 2 + off < d:
                pools.append(on(d // 2 + off))
        # the steps on every smaller replica count: how fast the next rollout runs on the replicas a tail frees
        have = {p[0].replicas for p in pools}
        fewer = {n: on(n) for n in range(1, max(have)) if n not in have}
        rm = rollmux(pools, d, fewer=fewer, steady=case.steady)
        out["rollmux_tps"], out["rollmux_config"] = rm.throughput_tps, rm.detail["config"]
        if case.steady:
            out["rollmux_steps_run"] = rm.detail["steps_run"]  # in step in one group, or each at its pace alone
            if split_rates:
                out["rollmux_per_pipeline_vs_split"] = vs_split(rm.detail["steady_rates"], split_rates)
        # the same search with the next rollout slowed in proportion to a tail's replicas (harsh on RollMux):
        # with the default (charged nothing, generous) it brackets RollMux; between them, the next rollout at the
        # engine model's speed on the freed replicas
        out["rollmux_proportional_tps"] = rm.tokens / rm.detail["proportional_s"]
        out["rollmux_engine_tps"] = rm.tokens / rm.detail["engine_s"]
        out["rollmux_engine_config"] = rm.detail["engine_config"]
    if "streamrl" in case.systems and quarter and not case.steady:  # a quarter of the GPUs per pipeline and stage
        out["streamrl_tps"] = streamrl(quarter).throughput_tps
        out["areal_tps"] = areal(quarter).throughput_tps
    profile = None  # the profiling draws (layouts.profile_steps), simulated once per case for every decision below
    if "streamrl" in case.systems and half and len(half) == 2 and not case.steady:  # JigsawRL-async needs halves only
        out["jigsaw_async_tps"] = jigsaw_async(half).throughput_tps
        # what JigsawRL-async's rollout TP is chosen on (_best_tp): its plan's seconds per token on profiling steps
        # (other draws of the same workloads), as JigsawRL's layout and degree are
        profile = profile_steps(full)
        runs = [jigsaw_async(h) for _, h in profile]
        out["jigsaw_async_profile_s_per_token"] = sum(b.total_s for b in runs) / sum(b.tokens for b in runs)
    violations = 0
    # the layout (layouts.ROUTINGS): decided once per case on profiling steps (layouts.predict_routing, other draws
    # of the same workloads; their runs are not counted in any makespan): every pipeline on every worker, each
    # pipeline's samples on its own half, or each pipeline wholly on its half; the same choice for JigsawRL and its
    # ablations, so they differ only in what they ablate. MuxServe routes uniformly (it multiplexes rollouts on the
    # same workers by design).
    route: dict[str, Any] = {}
    longrule = case.rule == "longrun" and half is not None and len(full) == 2 and d % 2 == 0 and \
        any(p.startswith("jigsaw") for p in case.systems)
    on: dict[int, list] = {d: full, d // 2: half} if half else {d: full}

    def layout_route(name: str, passes: int = 1) -> dict[str, Any]:
        """run_group's arguments for layout ``name`` over the case's steps ``passes`` times (1: as measured)."""
        k = pool_size(name)
        if k is None:
            h = half if passes == 1 else [repeat_steps(x, passes) for x in half]
            return routing_args(name, h, nsteps * passes)
        if k not in on:
            on[k] = [simulate_steps(s, case.gpu, k, case.steps) for s in specs]
        return {"pool": on[k] if passes == 1 else [repeat_steps(x, passes) for x in on[k]]}

    if longrule:
        # the long-run rule (pool_layout): every layout and pool size on the profile draws' marginal pass; every
        # degree profiles the same samples, so the sums compare across degrees as they are (routing_tokens 1)
        names = tuple(x for x in layouts_for(d) if x in case.layouts or pool_size(x) is not None)
        draws = profile_draws(full, sorted(needed_replicas(names, d)))  # simulated once, for every grid's decision
        costs = profile_marginal(full, names, steps=draws)
        out["routing_costs"] = {x: sum(c[x] for c in costs) for x in names}
        out["routing_tokens"] = 1
        out["routing"] = decide({case.gpus // d: costs})[1]
        route = layout_route(out["routing"])
    elif half and len(full) == 2 and d % 2 == 0 and any(p.startswith("jigsaw") for p in case.systems):
        # simulated once (other draws of the workloads, balanced by their own halves when steady); every grid below
        # decides on the same profile
        profile = profile if profile is not None else profile_steps(full, steady=case.steady)
        # predict_routing's rule on the profile's summed makespans, kept so that the TP degrees can be compared too
        costs = profile_costs(profile, choices=case.layouts)
        out["routing_costs"] = {r: sum(c[r] for c in costs) for r in case.layouts}
        out["routing_tokens"] = sum(sum(r.tokens) for prof, _ in profile for r in prof)
        out["routing"] = choose(out["routing_costs"])
        route = routing_args(out["routing"], half, nsteps)
    for pol in ("muxserve", "jigsaw", "jigsaw-greedy", "jigsaw-nomerge"):
        if pol not in case.systems:
            continue
        r = run_group(full, pol, **({} if pol == "muxserve" else route))
        key = pol.replace("-", "_")
        out[f"{key}_tps"] = tps(r, key)
        if longrun and pol in ("jigsaw", "muxserve") and longrule:
            # the long-run rule's measure: the marginal pass, M(PASSES) against this one-pass run (pool_layout)
            out[f"{key}_twostep_tps"] = r.throughput_tps
            again = run_group([repeat_steps(x) for x in full], pol,
                              **({} if pol == "muxserve" else layout_route(out["routing"], PASSES)))
            violations += again.memory_violations
            out[f"{key}_makespan_tps"] = out["tokens"] * PASSES / again.makespan_s
            out[f"{key}_tps"] = out["tokens"] / marginal_pass_s(r.makespan_s, again.makespan_s, PASSES)
        elif longrun and pol in ("jigsaw", "muxserve"):
            # the same steps PASSES times over: the makespan per pass, the first pass's ramp included. Not the slope
            # after the first pass that RollMux gets (generous to it): a policy that lets one pipeline run ahead
            # ends its "first pass" late and its slope is then too short (MuxServe on Search-R1: 0.77x of JigsawRL's
            # time per pass by the slope, while its makespan per pass grows from 159 to 185 s over 1 to 8 passes)
            out[f"{key}_twostep_tps"] = r.throughput_tps
            rep = {} if pol == "muxserve" or not route else \
                routing_args(out["routing"], [repeat_steps(h) for h in half], case.steps * PASSES)
            again = run_group([repeat_steps(x) for x in full], pol, **rep)
            violations += again.memory_violations
            out[f"{key}_tps"] = out["tokens"] * PASSES / again.makespan_s
        _record_group(out, key, r, case)
        out[f"{key}_merges"] = r.merges
        violations += r.memory_violations
        if pol == "jigsaw" and out.get("routing") == "split":
            # JigsawRL fell back to the static split here (equal to veRL split): what the layout sharing workers its
            # profile picks (uniform or halves; not always the better of the two on the run) would have given,
            # decided the same way, timed the same way (so the fallback's part shows)
            sharing = {r: v for r, v in out["routing_costs"].items() if r != "split"}
            if longrule:  # the sharing layout or pool the long-run profile ranks first, timed by its measure
                shared = min(sharing, key=lambda x: (sharing[x], list(sharing).index(x)))
                one = run_group(full, "jigsaw", **layout_route(shared))
                again = run_group([repeat_steps(x) for x in full], "jigsaw", **layout_route(shared, PASSES))
                violations += one.memory_violations + again.memory_violations
                out["jigsaw_shared_tps"] = out["tokens"] / marginal_pass_s(one.makespan_s, again.makespan_s, PASSES)
            else:
                shared = choose(sharing) if sharing else predict_routing(full, profile=profile,
                                                                         choices=("uniform", "halves"))
                steps, h = (nsteps * PASSES, [repeat_steps(x) for x in half]) if longrun else (nsteps, half)
                again = run_group([repeat_steps(x) for x in full] if longrun else full, "jigsaw",
                                  **routing_args(shared, h, steps))
                violations += again.memory_violations
                out["jigsaw_shared_tps"] = out["tokens"] * PASSES / again.makespan_s if longrun else tps(again)
            out["shared_routing"] = shared
        if pol == "jigsaw":
            out["decide_ms_mean"] = 1e3 * r.decide_s / max(1, r.decisions)
    if "verl" in case.systems:
        # MFU at veRL's better configuration (the baseline every ratio here is against) and with the pipelines in turn
        # (the paper's veRL): the same useful FLOPs over each configuration's time for the case's tokens
        flops = sum(r.useful_flops(k) for r in full for k in range(r.steps))
        for key, rate in (("verl_mfu", out["verl_tps"]), ("verl_serial_mfu", out["verl_serial_tps"])):
            out[key] = flops / (out["tokens"] / rate * case.gpus * _peak(case.gpu))
    if case.sensitivity:
        # every JigsawRL headline of the case again on each grid: the grid's excess off by -25% / +25%, the other grid,
        # and the what-if in which sharing costs nothing; at the same rollout TP degree, over the case's steps from a
        # cold start (two steps), the layout re-decided on that grid's profile
        for tag, grid, scale in SENSITIVITY:
            if longrule:
                # timed by the long-run measure; the x0.75 / x1.25 / other-grid rows keep the headline's layout
                # (re-deciding on each grid's long-run profile would cost three more profiles per degree, each layout
                # and pool size for one and two passes); the what-if with sharing free re-decides on its own profile,
                # since it asks how far the design goes when co-location costs nothing
                picked = out["routing"] if scale != 0.0 else \
                    decide({case.gpus // d: profile_marginal(full, names, grid=grid, scale=scale, steps=draws)})[1]
                route = layout_route(picked)
            elif profile is not None:
                route = routing_args(predict_routing(full, grid=grid, scale=scale, profile=profile, choices=case.layouts),
                                     half, nsteps)
            for pol in ("jigsaw", "jigsaw-nomerge"):
                if pol not in case.systems:
                    continue
                r = run_group(full, pol, grid=grid, scale=scale, **route)
                key = f"{pol.replace('-', '_')}_{tag}"
                out[f"{key}_tps"] = tps(r)
                if longrule:
                    again = run_group([repeat_steps(x) for x in full], pol, grid=grid, scale=scale,
                                      **layout_route(picked, PASSES))
                    violations += again.memory_violations
                    out[f"{key}_tps"] = out["tokens"] / marginal_pass_s(r.makespan_s, again.makespan_s, PASSES)
                _record_group(out, key, r, case)
                violations += r.memory_violations
            if "jigsaw_async_tps" in out:
                out[f"jigsaw_async_{tag}_tps"] = jigsaw_async(half, grid=grid, scale=scale).throughput_tps
    out["memory_violations"] = violations
    out["wall_s"] = time.perf_counter() - wall
    return out


def _record_group(out: dict[str, Any], key: str, r: Any, case: Case) -> None:
    """A group run's per-pipeline step latencies and its MFU under ``key`` (e.g. ``jigsaw``, ``jigsaw_x0.75``)."""
    out[f"{key}_latency_s"] = {n: r.latency_s(n) for n in r.step_end_s}
    out[f"{key}_mfu"] = r.flops / (r.makespan_s * case.gpus * _peak(case.gpu)) if r.makespan_s else 0.0


def _peak(gpu: str) -> float:
    from orchestrl.compute_sched.hardware import load_gpu
    return load_gpu(gpu).bf16_flops


def ratio(res: dict, a: str, b: str) -> float:
    return res[f"{a}_tps"] / res[f"{b}_tps"] if res.get(f"{b}_tps") else float("nan")


def mean_row(label: str, paper: float | None, values: Sequence[float], **detail: Any) -> Row:
    vals = [v for v in values if v == v]
    return Row(label, paper, statistics.fmean(vals) if vals else float("nan"),
               {"n": len(vals), "max": max(vals, default=float("nan")), **detail})


def figure(name: str, heading: str, ylabel: str, notes: Sequence[str], cases, rows_of) -> SweepFigure:
    """Bind a JigsawRL figure's command line (``--quick --json --workers --ray --out``) to its cases."""
    cli = FigureCli(name, heading, "fewer settings and one step each (about a minute)", heading, ylabel, heading,
                    "ratio", notes, "cases")
    return SweepFigure(cli, run_case, cases, rows_of)


def quick(cases: Sequence[Case], keep: int) -> list[Case]:
    """The first ``keep`` cases with one step each, for ``--quick``."""
    return [replace(c, steps=1) for c in cases[:keep]]
