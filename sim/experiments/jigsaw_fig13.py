"""JigsawRL §5.2, Figure 13: scaling from 8 to 64 A100s with 14B and 32B models.

Paper: up to 1.75x, mean 1.47x over veRL and 1.31x over RollMux. Ours: DeepSeek-R1-Distill-14B (the
Qwen2.5-14B architecture, TP 2) and Qwen3-32B (TP 4) on MATH, on the modelled A100 grid.

Run ``python -m orchestrl.sim.experiments.jigsaw_fig13 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from statistics import fmean

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import Case, figure, grid_rows, mean_row, quick, ratio, tp_search

PAPER = {"mean/verl": 1.47, "max/verl": 1.75, "mean/rollmux": 1.31}
MODELS = (("Qwen2.5-14B", 2), ("Qwen3-32B", 4))


def cases(is_quick: bool = False) -> list[Case]:
    out = [Case("fig13", f"{m}/{g}gpu", "A100", g, ((m, "math", tp, 1.0), (m, "math", tp, 1.0)), 2,
                ("verl", "rollmux", "jigsaw"), longrun=True, tps=tp_search(tp, g), sensitivity=True, rule="longrun")
           for m, tp in MODELS for g in (8, 16, 32, 64)]
    return quick([out[0], out[4]], 2) if is_quick else out


def rows_of(results: list[dict]) -> list[Row]:
    rows = [Row(f"{r['label']}/verl", None, ratio(r, "jigsaw", "verl")) for r in results]
    rows += [Row(f"{r['label']}/rollmux", None, ratio(r, "jigsaw", "rollmux")) for r in results]
    rows.append(mean_row("mean/verl", PAPER["mean/verl"], [ratio(r, "jigsaw", "verl") for r in results]))
    rows.append(Row("max/verl", PAPER["max/verl"], max(ratio(r, "jigsaw", "verl") for r in results)))
    rows.append(mean_row("mean/verl-serial", PAPER["mean/verl"], [ratio(r, "jigsaw", "verl_serial") for r in results]))
    rows.append(mean_row("mean/rollmux", PAPER["mean/rollmux"], [ratio(r, "jigsaw", "rollmux") for r in results]))
    if all("jigsaw_makespan_tps" in r for r in results):  # JigsawRL by the figures' earlier measure, ramp included
        rows.append(mean_row("mean/verl makespan per pass", None, [ratio(r, "jigsaw_makespan", "verl") for r in results]))
        rows.append(mean_row("mean/rollmux makespan per pass", None,
                             [ratio(r, "jigsaw_makespan", "rollmux") for r in results]))
    for base in ("verl", "rollmux"):
        # the grid rows are timed as the headline is (the long-run rule's measure, in the headline's layout)
        rows += grid_rows(results, f"mean/{base}", lambda rs, t, b=base: fmean(ratio(r, f"jigsaw_{t}", b) for r in rs))
    rows.append(Row("memory_violations", 0.0, float(sum(r["memory_violations"] for r in results))))
    return rows


NOTES = ("every system at its own rollout TP degree, searched (tp, 2 tp, 4 tp within a node): each baseline at whichever ran fastest, JigsawRL at the degree and layout its profile picks",
         "A100 has no measured grid: the modelled grid of its roofline (fitted to the paper's H100 numbers)",
         "RollMux at its best configuration (pool size, tail threshold, kept replicas, or each job in a group of its "
         "own); over the long run: JigsawRL by the time a pass adds, (makespan of the steps four times over - "
         "makespan of one pass) / 3, RollMux by its time per pass after the first; 'makespan per pass' rows: JigsawRL "
         "by its makespan over the four passes, per pass (its ramp charged)",
         "layout: the long-run rule chooses uniform, halves, split (= veRL split) or a pool (both rollouts on k "
         "workers, both trainings on the rest) and the TP degree, on the profile draws' marginal pass",
         "grid rows: JigsawRL timed as the headline, in the headline's layout with every slowdown's excess x0.75 / "
         "x1.25 and on the other grid (here the same modelled one), and with sharing free (x0), its layout re-decided")
FIGURE = figure("jigsaw-fig13", "JigsawRL Figure 13: scaling on 8-64 A100s, 14B and 32B", "JigsawRL / baseline",
                NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
