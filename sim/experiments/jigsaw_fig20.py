"""JigsawRL §5.4, Figure 20: the migration ablation -- step time of both pipelines with and without merging.

Paper: migrating pipeline A's long tail onto one DP worker shortens the steps of both A and B (the
figure gives no number). Ours: JigsawRL with and without sub-stage merging on the same steps.

Run ``python -m orchestrl.sim.experiments.jigsaw_fig20 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from statistics import fmean

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import FIG12, Case, figure, grid_rows, quick


def cases(is_quick: bool = False) -> list[Case]:
    # merging is ablated where workers are shared: in the split layout (each pipeline on its own half) a merged tail
    # frees GPUs nothing else can use, so the layout is chosen among those that share (uniform, halves)
    full = [Case("fig20", f"{m}/{t}", "H100", 8, ((m, t, tp, sc), (m, t, tp, sc)), 2, ("jigsaw", "jigsaw-nomerge"),
                 layouts=("uniform", "halves"), sensitivity=True) for m, t, tp, sc in FIG12[:5]]
    return quick([full[2], full[3]], 2) if is_quick else full


def rows_of(results: list[dict]) -> list[Row]:
    rows = []
    for r in results:
        for name, lat in r["jigsaw_latency_s"].items():
            without = r["jigsaw_nomerge_latency_s"][name]
            rows.append(Row(f"{r['label']}/{name[0]} with/without", None, lat / without,
                            {"with_s": lat, "without_s": without, "merges": r["jigsaw_merges"]}))
    rows.append(Row("mean with/without", None, fmean(r.ours for r in rows)))
    rows += grid_rows(results, "mean with/without", lambda rs, t: fmean(
        lat / r[f"jigsaw_nomerge_{t}_latency_s"][n] for r in rs for n, lat in r[f"jigsaw_{t}_latency_s"].items()))
    return rows


NOTES = ("below 1: merging shortened the pipeline's steps",
         "layout chosen among those that share workers (uniform, halves): in the split one merging frees GPUs nothing uses",
         "grid rows: the mean of with / without, both run with every slowdown's excess x0.75 / x1.25, on the modelled "
         "grid and with sharing free (x0)")
FIGURE = figure("jigsaw-fig20", "JigsawRL Figure 20: migration ablation", "step time with / without merging", NOTES,
                cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
