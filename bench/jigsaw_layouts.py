"""Check JigsawRL's layout decision (sim/multiplex/layouts.py) against the best layout in hindsight, per case.

JigsawRL decides once per run, on simulated profiling steps, whether two pipelines share every worker
(``uniform``), keep their rollouts on their own halves (``halves``) or run wholly on their own halves
(``split``, = veRL split); see docs/jigsaw.md ("Layout"). This benchmark runs every case in all three layouts
over the long run (the two measured steps :data:`~sim.multiplex.baselines.PASSES` times over, as
``jigsaw-fig12`` times JigsawRL; with ``--steady`` each pipeline as many passes as fit while the longest runs
its four on its half, tokens/s counted while both still run, ~17 min on 2 cores), asks the rule which one to
run, and prints, against veRL at its better configuration on the same steps:

* ``picked_vs_verl_mean``: the rule's layout; ``best_vs_verl_mean``: the best of the three on each case (known
  only after the run, the reference); ``split_vs_verl_mean``: always ``split``;
* ``worse_choices`` / ``worst_pick_vs_best``: cases where the rule's layout was slower than the best, and by
  how much at worst;
* the same for other draw counts and margins, recomputed from the same profiles (no new simulation), so the
  constants' neighbourhood shows;
* with ``--steady``, each pipeline's tokens/s against its own on veRL split's half (a sum of two pipelines'
  rates can hide one paying for the other's gain): per case for the rule's layout, and each layout's worse
  job, mean over cases (``worse_job_vs_split_mean``).

Case sets (``--set``): ``heldout`` (default): pairs the rule's constants were not set on: Fig. 16's other two
heterogeneous pairs and four pairs of different Fig. 12 workloads, trace seeds 0-2; ``calibration``: what
``PROFILE_DRAWS`` and ``ROUTING_MARGIN`` were set on (Fig. 12's seven settings and Fig. 16's
Qwen3-0.6B + Llama-3.1-8B pair, seeds 3-5); ``check``: the same settings on seeds 0-2, the figures' seeds.

Run from the repository root::

    python bench/jigsaw_layouts.py                 # held-out pairs, seeds 0-2 (18 cases, ~3 min on 2 cores)
    python bench/jigsaw_layouts.py --set calibration --workers 2
    python bench/jigsaw_layouts.py --quick --json  # one case
    python bench/jigsaw_layouts.py --steady        # steady state: the shorter pipeline runs more steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrl.sim.experiments.jigsaw_common import FIG12, Case, _best_tp, _specs  # noqa: E402
from orchestrl.sim.multiplex.baselines import (PASSES, repeat_each, steady_passes, steady_rates,  # noqa: E402
                                               verl, verl_steady, vs_split)
from orchestrl.sim.multiplex.layouts import (PROFILE_DRAWS, ROUTING_MARGIN, ROUTINGS, choose, predict_routing,  # noqa: E402
                                             profile_costs, profile_steps, routing_args)
from orchestrl.sim.multiplex.runner import run_group, simulate_steps  # noqa: E402
from orchestrl.sim.sweep import run_sweep  # noqa: E402

FIG16_PAIR = (("Qwen3-0.6B", "gsm8k", 1, 1.0), ("Llama-3.1-8B", "gsm8k", 1, 1.0))
#: pairs the layout rule was not calibrated on: Fig. 16's other two pairs, then different Fig. 12 workloads side by side
HELDOUT_PAIRS = ((("Qwen3-0.6B", "gsm8k", 1, 1.0), ("Qwen3-4B", "gsm8k", 1, 1.0)),
                 (("Qwen3-4B", "gsm8k", 1, 1.0), ("Llama-3.1-8B", "gsm8k", 1, 1.0)),
                 (("Qwen3-0.6B", "math", 1, 1.0), ("Qwen3-4B", "search-r1", 1, 1.0)),
                 (("Qwen3-4B", "aime", 1, 1.0), ("Qwen3-0.6B", "gsm8k", 1, 1.0)),
                 (("Llama-3.1-8B", "gsm8k-mt", 1, 0.7), ("Qwen3-4B", "math", 1, 1.0)),
                 (("Qwen3-4B", "gsm8k", 1, 1.0), ("Qwen3-4B", "aime", 1, 1.0)))
DRAWS = (1, 2, 3)  # a third draw is simulated so the sweep can show whether more would help
MARGINS = (0.0, 0.01, 0.015, 0.02, 0.03, 0.04)


def case_list(which: str, seeds: list[int] | None, steady: bool = False) -> list[tuple[str, tuple, int, bool]]:
    if which == "heldout":
        pairs, default = list(HELDOUT_PAIRS), [0, 1, 2]
    else:
        pairs, default = [(pl, pl) for pl in FIG12] + [FIG16_PAIR], ([3, 4, 5] if which == "calibration" else [0, 1, 2])
    return [(_label(p), p, s, steady) for s in (seeds if seeds is not None else default) for p in pairs]


def _label(pair: tuple) -> str:
    return " + ".join(f"{m}/{t}" for m, t, _, _ in pair) if pair[0] != pair[1] else f"{pair[0][0]}/{pair[0][1]} x2"


def run_one(case: tuple) -> dict:
    """Every layout over the long run, veRL on the same steps, and each layout's makespan on every profile draw
    (``case``: label, pair, seed, steady, and optionally a rollout TP degree that replaces the pair's)."""
    label, pair, seed, steady = case[:4]
    tp = case[4] if len(case) > 4 else None
    if tp is not None:
        pair = tuple((m, t, tp, sc) for m, t, _, sc in pair)
    specs = _specs(Case("layouts", label, "H100", 8, pair, 2, seed=seed))
    d = 8 // specs[0].tp
    full = [simulate_steps(s, "H100", d, 2) for s in specs]
    half = [simulate_steps(s, "H100", d // 2, 2) for s in specs]
    # the long run: every pipeline's steps PASSES times over, or (steady) each as many passes as fit while the
    # longest runs PASSES on its half (baselines.steady_passes); the profile draws are balanced the same way
    passes = steady_passes(half) if steady else (PASSES, PASSES)
    rep_full, rep_half = repeat_each(full, passes), repeat_each(half, passes)
    steps = max(x.steps for x in rep_full)
    runs = {r: run_group(rep_full, "jigsaw", **routing_args(r, rep_half, steps)) for r in ROUTINGS}
    per: dict[str, list[float]] = {}
    if steady:  # tokens/s while both pipelines still run, veRL at its better configuration by the same measure
        base, cfg, split_rates = verl_steady(rep_full, rep_half)
        tok = [x.tokens for x in rep_full]
        rates = {r: steady_rates([g.step_end_s[x.spec.name] for x in rep_full], tok) for r, g in runs.items()}
        vs_verl = {r: sum(x) / base for r, x in rates.items()}
        # each pipeline against its own rate on veRL split's half: the sum can hide one job paying for the other
        per = {r: vs_split(x, split_rates) for r, x in rates.items()}
    else:
        v = verl(rep_full, rep_half)
        vs_verl, cfg = {r: v.total_s / g.makespan_s for r, g in runs.items()}, v.detail["config"]
        per = {"verl_s": v.total_s, "makespan_s": {r: g.makespan_s for r, g in runs.items()}}  # for --tps
    profile = profile_steps(full, max(DRAWS), steady=steady)
    draws = profile_costs(profile)  # what the rule compares (makespans, for steady draws too)
    picked = predict_routing(full, profile=profile[:PROFILE_DRAWS])
    return {"label": label, "pair": pair, "seed": seed, "tp": specs[0].tp, "verl_config": cfg, "vs_verl": vs_verl, "draws": draws,
            "picked": picked, "passes": list(passes), "per_pipeline_vs_split": per}


def across_degrees(by_tp: dict[int, dict]) -> dict:
    """One case's runs at several rollout TP degrees as one record whose layouts are ``layout@degree``: each against
    veRL at its best degree, and the profile draws' costs side by side (the fixed-steps measure: every degree runs
    the same samples, so makespans compare across degrees as across layouts, as ``jigsaw_common._best_tp`` does)."""
    first = by_tp[min(by_tp)]
    verl_s = min(r["per_pipeline_vs_split"]["verl_s"] for r in by_tp.values())
    vs = {f"{x}@{t}": verl_s / m for t, r in by_tp.items() for x, m in r["per_pipeline_vs_split"]["makespan_s"].items()}
    draws = [{f"{x}@{t}": by_tp[t]["draws"][i][x] for t in by_tp for x in ROUTINGS} for i in range(len(first["draws"]))]
    tv = min(by_tp, key=lambda t: by_tp[t]["per_pipeline_vs_split"]["verl_s"])
    # what run_case would run: each degree's layout by predict_routing's rule, then the degree by _best_tp (main()
    # checks this file's rule against it)
    at = {}
    for t, r in by_tp.items():
        costs = {x: sum(d[x] for d in r["draws"][:PROFILE_DRAWS]) for x in ROUTINGS}
        at[t] = {"routing_costs": costs, "routing": choose(costs), "exclusive_step_s": {}, "memory_violations": 0,
                 "wall_s": 0.0}
    tj = _best_tp(Case("layouts", first["label"], "H100", 8, tuple(first["pair"]), tps=tuple(by_tp)), at)["tp"]["jigsaw"]
    return {"label": first["label"], "seed": first["seed"], "verl_config": f"{by_tp[tv]['verl_config']}@{tv}",
            "vs_verl": vs, "draws": draws, "picked": f"{at[tj]['routing']}@{tj}",
            "passes": first["passes"], "per_pipeline_vs_split": {}}


def rule(draws: list[dict], n: int, margin: float) -> str:
    """predict_routing's choice (layouts.choose) from precomputed costs (layouts.profile_costs) summed over ``n``
    draws; with ``layout@degree`` keys (``--tps``), the same rule over every layout at every degree (``split``'s
    cost shortened by the margin; ties to the smaller degree, then the earlier layout)."""
    if all(k in ROUTINGS for k in draws[0]):
        return choose({r: sum(d[r] for d in draws[:n]) for r in ROUTINGS}, margin)
    cost = {k: sum(d[k] for d in draws[:n]) * (1.0 - margin if k.startswith("split@") else 1.0) for k in draws[0]}
    return min(cost, key=lambda k: (cost[k], int(k.split("@")[1]), ROUTINGS.index(k.split("@")[0])))


def summary(results: list[dict], n: int, margin: float) -> dict:
    got = [r["vs_verl"][rule(r["draws"], n, margin)] for r in results]
    best = [max(r["vs_verl"].values()) for r in results]
    return {"draws": n, "margin": margin, "picked_vs_verl_mean": statistics.fmean(got),
            "best_vs_verl_mean": statistics.fmean(best),
            "worse_choices": sum(g < b - 1e-9 for g, b in zip(got, best)),
            "worst_pick_vs_best": min(g / b for g, b in zip(got, best)), "cases": len(results)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("heldout", "calibration", "check"), default="heldout", dest="which")
    ap.add_argument("--seeds", type=int, nargs="+", help="trace seeds (default: the set's)")
    ap.add_argument("--quick", action="store_true",
                    help="one case: the held-out Qwen3-4B + Llama-3.1-8B pair on the first seed, or the set's first")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: CPU count)")
    ap.add_argument("--steady", action="store_true",
                    help="steady state: each pipeline runs as many passes as fit while the longest runs its steps "
                         f"{PASSES} times on its half (veRL split's halves finish together); slower")
    ap.add_argument("--tps", type=int, nargs="+", default=None, metavar="T",
                    help="rollout TP degrees (e.g. 1 2 4): every layout at every degree, the rule choosing among all "
                         "of them and veRL at its best degree, as run_case does (not with --steady)")
    ap.add_argument("--json", action="store_true", help="also print one JSON document at the end")
    args = ap.parse_args(argv)
    if args.tps and (args.steady or any(t < 1 or 8 % (2 * t) for t in args.tps)):
        ap.error("--tps takes degrees t with 8 a multiple of 2t (1, 2, 4), and not --steady")
    cases = case_list(args.which, args.seeds, args.steady)
    if args.quick:  # the held-out set's Qwen3-4B + Llama-3.1-8B pair on its first seed, or any set's first case
        cases = [c for c in cases if c[1] == HELDOUT_PAIRS[1] and c[2] == cases[0][2]][:1] or cases[:1]
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        print(f"  {done}/{total} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    if args.tps:
        tps = sorted(set(args.tps))
        flat = run_sweep(run_one, [c + (t,) for c in cases for t in tps], workers=args.workers, progress=progress)
        results = [across_degrees({r["tp"]: r for r in flat[i * len(tps):(i + 1) * len(tps)]}) for i in range(len(cases))]
    else:
        results = run_sweep(run_one, cases, workers=args.workers, progress=progress)
    mismatch = [r for r in results if r["picked"] != rule(r["draws"], PROFILE_DRAWS, ROUTING_MARGIN)]
    if mismatch:  # this file's re-implementation of the rule must agree with the library's
        print(f"rule here disagrees with predict_routing (and, with --tps, run_case's choice of degree) on "
              f"{len(mismatch)} case(s)", file=sys.stderr)
        return 1
    print(f"layout decision vs the best layout in hindsight, set {args.which}, {len(results)} case(s), "
          "JigsawRL over veRL's better configuration, " + ("steady state (each pipeline's passes over its two steps "
          "after the case)" if args.steady else f"long run ({PASSES} passes)"))
    keys = list(results[0]["vs_verl"])
    print(f"{'seed':>4} {'case':58s} {'veRL':9s} " + " ".join(f"{r:>9s}" for r in keys) + "  picked")
    for r in results:
        best = max(r["vs_verl"], key=r["vs_verl"].get)
        flag = "" if r["vs_verl"][r["picked"]] >= r["vs_verl"][best] - 1e-9 else f"  (best {best})"
        print(f"{r['seed']:>4} {r['label']:58s} {r['verl_config']:9s} "
              + " ".join(f"{r['vs_verl'][x]:9.3f}" for x in keys) + f"  {r['picked']}{flag}"
              + (f"  passes {r['passes'][0]}/{r['passes'][1]}; picked per job vs split "
                 + "/".join(f"{x:.3f}" for x in r["per_pipeline_vs_split"][r["picked"]]) if args.steady else ""))
    rows = [summary(results, n, m) for n in DRAWS for m in MARGINS]
    print(f"\n{'draws':>5} {'margin':>6} {'picked':>7} {'best':>7} {'worse':>6} {'worst pick/best':>16}")
    for s in rows:
        mark = "  <- the rule (layouts.PROFILE_DRAWS, ROUTING_MARGIN)" \
            if (s["draws"], s["margin"]) == (PROFILE_DRAWS, ROUTING_MARGIN) else ""
        print(f"{s['draws']:>5} {s['margin']:6.3f} {s['picked_vs_verl_mean']:7.4f} {s['best_vs_verl_mean']:7.4f} "
              f"{s['worse_choices']:>3}/{s['cases']:<2} {s['worst_pick_vs_best']:16.4f}{mark}")
    ours = summary(results, PROFILE_DRAWS, ROUTING_MARGIN)
    ours["split_vs_verl_mean"] = statistics.fmean(max(v for k, v in r["vs_verl"].items() if k.split("@")[0] == "split")
                                                  for r in results)  # split at its best degree: veRL split
    print(f"\nthe rule: {ours['picked_vs_verl_mean']:.4f}x veRL mean against {ours['best_vs_verl_mean']:.4f}x for the "
          f"best layout every time and {ours['split_vs_verl_mean']:.4f}x for split every time; "
          f"{ours['worse_choices']} worse choice(s) of {ours['cases']}, worst {ours['worst_pick_vs_best']:.3f}x of the "
          f"best; {time.perf_counter() - t0:.0f} s")
    if args.steady:  # the sum can hide a loser: each layout's worse job against its own split rate, mean over cases
        worst = {x: statistics.fmean(min(r["per_pipeline_vs_split"][x]) for r in results) for x in ROUTINGS}
        worst["picked"] = statistics.fmean(min(r["per_pipeline_vs_split"][r["picked"]]) for r in results)
        ours["worse_job_vs_split_mean"] = worst
        print("each case's worse job against its own tokens/s on veRL split's half, mean over cases: "
              + ", ".join(f"{x} {v:.3f}" for x, v in worst.items()))
    if args.json:
        print(json.dumps({"set": args.which, **ours, "sweep": rows, "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
