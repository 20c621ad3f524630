"""JigsawRL §5.2, Figure 14: each pipeline's step latency under JigsawRL over veRL alone on 8 H100s.

Paper: 1.48x on average, as low as 1.14x (two pipelines in series would be 2x).

Run ``python -m orchestrl.sim.experiments.jigsaw_fig14 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import statistics
import sys

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import FIG12, Case, figure, grid_rows, quick, tp_search

PAPER = {"mean": 1.48, "min": 1.14}


def cases(is_quick: bool = False) -> list[Case]:
    # JigsawRL at the rollout TP and layout its profile picks; each pipeline alone at its fastest degree
    full = [Case("fig14", f"{m}/{t}", "H100", 8, ((m, t, tp, sc), (m, t, tp, sc)), 2, ("jigsaw",),
                 tps=tp_search(tp, 8), sensitivity=True) for m, t, tp, sc in FIG12]
    return quick([full[2], full[3]], 2) if is_quick else full


def rows_of(results: list[dict]) -> list[Row]:
    rows, incs = [], []
    for r in results:
        for name, lat in r["jigsaw_latency_s"].items():
            inc = lat / r["exclusive_step_s"][name]
            incs.append(inc)
            rows.append(Row(f"{r['label']}/{name[0]}", None, inc, {"latency_s": lat, "routing": r.get("routing"),
                                                                   "tp": r.get("tp", {}).get("jigsaw"),
                                                                   "exclusive_s": r["exclusive_step_s"][name]}))
    rows.append(Row("mean", PAPER["mean"], statistics.fmean(incs)))
    rows.append(Row("min", PAPER["min"], min(incs)))
    rows += grid_rows(results, "mean", lambda rs, t: statistics.fmean(
        lat / r["exclusive_step_s"][n] for r in rs for n, lat in r[f"jigsaw_{t}_latency_s"].items()), PAPER["mean"])
    return rows


NOTES = ("ours: mean step time of each pipeline under JigsawRL over its step alone on the 8 GPUs (veRL) at its "
         "fastest rollout TP (1, 2, 4 searched); JigsawRL at the degree and layout its profile picks",
         "grid rows: the mean with every slowdown's excess x0.75 / x1.25, on the modelled grid and with sharing free (x0)")
FIGURE = figure("jigsaw-fig14", "JigsawRL Figure 14: per-pipeline latency increase", "latency / exclusive", NOTES,
                cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
