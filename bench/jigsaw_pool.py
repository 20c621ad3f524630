"""JigsawRL on RollMux's pools, where the rollout is over 60% of the step: does it pass RollMux? (Issue 33's target
"above RollMux on every setting where rollout is more than 60% of the step", on Fig. 13's 64-GPU settings.)

The two-step rule's JigsawRL (the long-run figures' until 2026-11-29; the two-step figures' still) chooses among
``uniform``, ``halves`` and ``split`` on a two-step profile and was timed by its makespan per pass; on Fig. 13's 64-A100 settings it runs ``split`` (veRL split) and stays below RollMux
(docs/jigsaw.md). This benchmark adds the ``pool`` layout (:mod:`sim.multiplex.pool_layout`: both pipelines'
rollouts on a pool of ``k`` workers under JigsawRL's policy, both trainings on the rest) and decides layout, pool
size and rollout TP degree with the long-run rule (:func:`~sim.multiplex.pool_layout.decide` on two profiling
draws, other batches of the same workloads). Every system is timed by the same long-run measure: JigsawRL by
:func:`~sim.multiplex.pool_layout.marginal_pass_s` (``P`` = :data:`~sim.multiplex.baselines.PASSES` passes
against one), RollMux by its baseline's (the first pass's end inside the run; generous: the next job's rollout is
charged nothing for the replicas a consolidated tail holds), veRL by its steps (no ramp). Each baseline at its best
configuration and degree, known after the run.

Printed per setting and seed: each system's tokens/s, JigsawRL (the rule) / RollMux and / veRL, what the rule
picked, the best layout in hindsight, and the two-step rule's JigsawRL (over the three layouts, by its
makespan-per-pass measure and by this one) for reference; then the per-setting seed means (the target) and the rollout's share of
veRL's step at veRL's best degree.

Run from the repository root::

    python bench/jigsaw_pool.py                    # both 64-GPU settings, seeds 0-2 (~8 min on 2 cores)
    python bench/jigsaw_pool.py --seeds 3 4 5      # held-out trace seeds
    python bench/jigsaw_pool.py --figure 12        # Fig. 12's seven settings (H100), seeds 0-2 (~10 min)
    python bench/jigsaw_pool.py --figure heldout --seeds 9 10 11   # pairs of different workloads (H100)
    python bench/jigsaw_pool.py --quick --json     # Qwen3-32B on 64 A100s at TP 8, seed 0 (~20 s)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrl.sim.experiments import jigsaw_fig12, jigsaw_fig13  # noqa: E402
from orchestrl.sim.experiments.jigsaw_common import Case, _specs, tp_candidates, tp_search  # noqa: E402
from orchestrl.sim.multiplex.baselines import PASSES, rollmux, verl  # noqa: E402
from orchestrl.sim.multiplex.layouts import ROUTINGS, choose, margin_adjusted, profile_costs, profile_steps  # noqa: E402
from orchestrl.sim.multiplex.pool_layout import (decide, layouts_for, marginal_pass_s, needed_replicas,  # noqa: E402
                                                 pool_sizes, profile_marginal, run_layout)
from orchestrl.sim.multiplex.runner import simulate_steps  # noqa: E402
from orchestrl.sim.sweep import run_sweep  # noqa: E402

SETTINGS = ("Qwen2.5-14B/64gpu", "Qwen3-32B/64gpu")  # Fig. 13's settings whose rollout is over 60% of veRL's step


def known_cases(figure: str) -> dict:
    """The settings of ``--figure`` by label (Fig. 12: H100, 8 GPUs; Fig. 13: A100, 8-64 GPUs; ``heldout``: the
    pairs of different workloads ``bench/jigsaw_layouts.py`` checks the two-step rule on, H100, 8 GPUs)."""
    if figure == "heldout":
        from bench.jigsaw_layouts import HELDOUT_PAIRS, _label
        return {_label(p): Case("heldout", _label(p), "H100", 8, p, 2, tps=tp_search(1, 8)) for p in HELDOUT_PAIRS}
    return {c.label: c for c in (jigsaw_fig12 if figure == "12" else jigsaw_fig13).cases()}


def run_one(job: tuple[str, str, int, int]) -> dict:
    """One setting, trace seed and rollout TP degree: every system and layout, the profiles of both rules."""
    figure, label, seed, tp = job
    case = known_cases(figure)[label]
    case = dataclasses.replace(case, seed=seed, tps=(), pipelines=tuple((m, k, tp, sc) for m, k, _, sc in case.pipelines))
    specs = _specs(case)
    d = case.gpus // tp
    names = layouts_for(d)
    on = {n: [simulate_steps(s, case.gpu, n, case.steps) for s in specs] for n in needed_replicas(names, d)}
    full = on[d]
    tokens = sum(sum(r.tokens) for r in full)
    v = verl(full, on[d // 2])
    rm = rollmux([on[k] for k in pool_sizes(d)], d)
    marginal, makespan = {}, {}
    for x in names:
        one, many = run_layout(x, on, d, 1), run_layout(x, on, d, PASSES)
        marginal[x] = tokens / marginal_pass_s(one.makespan_s, many.makespan_s, PASSES)
        makespan[x] = tokens * PASSES / many.makespan_s
        if one.memory_violations or many.memory_violations:
            raise RuntimeError(f"{label} seed {seed} TP {tp} {x}: memory over-committed")  # a bug, never an input
    # the two-step rule: two-step makespans over the three layouts (layouts.profile_costs, as jigsaw_common._run_at)
    two = profile_costs(profile_steps(full), choices=ROUTINGS)
    share = statistics.fmean(max(t.end_s for t in r.traces[0]) / r.step_alone_s(0) for r in full)
    return {"label": label, "seed": seed, "tp": tp, "tokens": tokens, "verl_tps": v.throughput_tps,
            "verl_config": v.detail["config"], "rollmux_tps": rm.throughput_tps, "rollmux_config": rm.detail["config"],
            "marginal_tps": marginal, "makespan_tps": makespan, "rollout_share": share,
            "profile_marginal": profile_marginal(full, names),
            "profile_twostep": {x: sum(c[x] for c in two) for x in ROUTINGS}}


def combine(runs: list[dict]) -> dict:
    """One setting and seed from its runs at every degree: each system at its best, the two rules' choices."""
    by = {r["tp"]: r for r in runs}
    tv = max(by, key=lambda t: (by[t]["verl_tps"], -t))
    tr = max(by, key=lambda t: (by[t]["rollmux_tps"], -t))
    t, x = decide({t: r["profile_marginal"] for t, r in by.items()})
    # the two-step rule's JigsawRL: each degree's layout by the two-step rule, the degree by its margin-adjusted cost per
    # token (every degree runs the same samples: seconds), timed by its makespan per pass (jigsaw_common._best_tp)
    adj = {t2: min(margin_adjusted(r["profile_twostep"]).values()) for t2, r in by.items()}
    tf = min(adj, key=lambda t2: (adj[t2], t2))
    xf = choose(by[tf]["profile_twostep"])
    hind = max(((t2, y) for t2, r in by.items() for y in r["marginal_tps"]), key=lambda k: by[k[0]]["marginal_tps"][k[1]])
    first = runs[0]
    out = {"label": first["label"], "seed": first["seed"], "rollout_share_verl": by[tv]["rollout_share"],
           "verl_tps": by[tv]["verl_tps"], "verl": f"{by[tv]['verl_config']}@TP{tv}",
           "rollmux_tps": by[tr]["rollmux_tps"], "rollmux": f"{by[tr]['rollmux_config']}@TP{tr}",
           "jigsaw_tps": by[t]["marginal_tps"][x], "jigsaw": f"{x}@TP{t}",
           "best_tps": by[hind[0]]["marginal_tps"][hind[1]], "best": f"{hind[1]}@TP{hind[0]}",
           "twostep_rule_tps": by[tf]["makespan_tps"][xf], "twostep_rule": f"{xf}@TP{tf}",
           "twostep_rule_marginal_tps": by[tf]["marginal_tps"][xf]}
    for k in ("jigsaw", "best", "twostep_rule", "twostep_rule_marginal"):
        out[f"{k}_vs_rollmux"] = out[f"{k}_tps"] / out["rollmux_tps"]
        out[f"{k}_vs_verl"] = out[f"{k}_tps"] / out["verl_tps"]
    out["rollmux_vs_verl"] = out["rollmux_tps"] / out["verl_tps"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--figure", choices=("12", "13", "heldout"), default="13",
                    help="whose settings: Fig. 13 (A100, default), Fig. 12 (H100, measured grid) or the held-out pairs "
                         "of bench/jigsaw_layouts.py (H100)")
    ap.add_argument("--settings", nargs="+", default=None, metavar="LABEL",
                    help=f"settings of the figure (default: Fig. 13's {' '.join(SETTINGS)}; Fig. 12's seven)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="trace seeds (default: 0 1 2, the figure's)")
    ap.add_argument("--quick", action="store_true", help="Qwen3-32B/64gpu at TP 8 only, the first seed")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: CPU count)")
    ap.add_argument("--json", action="store_true", help="also print one JSON document at the end")
    args = ap.parse_args(argv)
    known = known_cases(args.figure)
    if args.settings is None:
        args.settings = list(SETTINGS) if args.figure == "13" else list(known)
    bad = [s for s in args.settings if s not in known]
    if bad:
        ap.error(f"--settings: {bad} are not {args.figure} settings ({', '.join(known)})")
    if any(s < 0 for s in args.seeds):
        ap.error("--seeds: trace seeds are integers >= 0")
    if args.quick:
        jobs = [("13", "Qwen3-32B/64gpu", args.seeds[0], 8)]
    else:
        jobs = [(args.figure, s, seed, t) for s in args.settings for seed in args.seeds for t in tp_candidates(known[s])
                if known[s].gpus // t >= 2]
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        print(f"  {done}/{total} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    flat = run_sweep(run_one, jobs, workers=args.workers, progress=progress)
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in flat:
        groups.setdefault((r["label"], r["seed"]), []).append(r)
    results = [combine(g) for g in groups.values()]
    print(f"JigsawRL with the pool layout and the long-run rule vs RollMux and veRL at their best (tokens/s; long-run "
          f"measure, {PASSES} passes; " + ("H100, measured grid)" if args.figure != "13" and not args.quick
                                             else "A100, modelled grid)"))
    print(f"{'setting':22s} {'seed':>4} {'roll%':>5} {'veRL':>7} {'RollMux':>7} {'Jigsaw':>7} {'/RM':>6} {'/veRL':>6}"
          f"  {'picked':14s} {'best (hindsight)':18s} {'two-step rule /RM':>17}")
    for r in results:
        print(f"{r['label']:22s} {r['seed']:>4} {100 * r['rollout_share_verl']:5.1f} {r['verl_tps']:7.0f} "
              f"{r['rollmux_tps']:7.0f} {r['jigsaw_tps']:7.0f} {r['jigsaw_vs_rollmux']:6.3f} {r['jigsaw_vs_verl']:6.3f}"
              f"  {r['jigsaw']:14s} {r['best'] + ' ' + format(r['best_vs_rollmux'], '.3f'):18s} "
              f"{r['twostep_rule_vs_rollmux']:7.3f} ({r['twostep_rule']})")
    per = {}
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        per[label] = {k: statistics.fmean(r[k] for r in rs) for k in
                      ("rollout_share_verl", "jigsaw_vs_rollmux", "jigsaw_vs_verl", "best_vs_rollmux",
                       "twostep_rule_vs_rollmux", "twostep_rule_marginal_vs_rollmux", "rollmux_vs_verl")}
        per[label]["seeds"] = len(rs)
        per[label]["seeds_above_rollmux"] = sum(r["jigsaw_vs_rollmux"] > 1.0 for r in rs)
        per[label]["jigsaw_vs_rollmux_range"] = [min(r["jigsaw_vs_rollmux"] for r in rs),
                                                 max(r["jigsaw_vs_rollmux"] for r in rs)]
    print("\nper setting, mean over seeds:")
    for label, p in per.items():
        print(f"  {label:18s} rollout {100 * p['rollout_share_verl']:.1f}% of veRL's step; JigsawRL (pool, long-run "
              f"rule) / RollMux {p['jigsaw_vs_rollmux']:.3f} (seeds {p['jigsaw_vs_rollmux_range'][0]:.3f}-"
              f"{p['jigsaw_vs_rollmux_range'][1]:.3f}, above on {p['seeds_above_rollmux']} of {p['seeds']}), / veRL {p['jigsaw_vs_verl']:.3f}; best layout in hindsight / RollMux {p['best_vs_rollmux']:.3f};"
              f" the two-step rule's JigsawRL / RollMux {p['twostep_rule_vs_rollmux']:.3f} (its measure), "
              f"{p['twostep_rule_marginal_vs_rollmux']:.3f} (this measure); RollMux / veRL {p['rollmux_vs_verl']:.3f}")
    summary = {"settings_above_rollmux": sum(p["jigsaw_vs_rollmux"] > 1.0 for p in per.values()),
               "settings": len(per), "jigsaw_vs_rollmux_min": min(p["jigsaw_vs_rollmux"] for p in per.values()),
               "wall_s": time.perf_counter() - t0}
    print(f"\nJigsawRL above RollMux on {summary['settings_above_rollmux']} of {summary['settings']} setting(s) "
          f"(seed means; lowest {summary['jigsaw_vs_rollmux_min']:.3f}x); {summary['wall_s']:.0f} s")
    if args.json:
        print(json.dumps({**summary, "per_setting": per, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
