"""JigsawRL §5.3, Figure 16: heterogeneous pipelines (different model sizes) on 8 H100s.

Paper: aggregated throughput improves, and each pipeline is slowed at most 1.34x; the gain is larger
when the models differ more (Qwen3-0.6B next to Llama-3.1-8B).

Run ``python -m orchestrl.sim.experiments.jigsaw_fig16 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from statistics import fmean

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import Case, figure, grid_rows, quick, ratio, tp_search

PAIRS = (("Qwen3-0.6B", "Llama-3.1-8B"), ("Qwen3-4B", "Llama-3.1-8B"), ("Qwen3-0.6B", "Qwen3-4B"))


def cases(is_quick: bool = False) -> list[Case]:
    full = [Case("fig16", f"{a}+{b}", "H100", 8, ((a, "gsm8k", 1, 1.0), (b, "gsm8k", 1, 1.0)), 2, ("verl", "jigsaw"),
                 tps=tp_search(1, 8), sensitivity=True) for a, b in PAIRS]
    return quick(full, 1) if is_quick else full


def rows_of(results: list[dict]) -> list[Row]:
    rows, worst = [], 0.0
    for r in results:
        rows.append(Row(f"{r['label']}/verl", None, ratio(r, "jigsaw", "verl")))
        for name, lat in r["jigsaw_latency_s"].items():
            inc = lat / r["exclusive_step_s"][name]
            worst = max(worst, inc)
            rows.append(Row(f"{r['label']}/{name}/slowdown", None, inc))
    rows.append(Row("max per-pipeline slowdown", 1.34, worst))
    rows.append(Row("mean/verl", None, fmean(ratio(r, "jigsaw", "verl") for r in results)))
    rows += grid_rows(results, "mean/verl", lambda rs, t: fmean(ratio(r, f"jigsaw_{t}", "verl") for r in rs))
    rows += grid_rows(results, "max per-pipeline slowdown", lambda rs, t: max(
        lat / r["exclusive_step_s"][n] for r in rs for n, lat in r[f"jigsaw_{t}_latency_s"].items()), 1.34)
    return rows


NOTES = ("every system at its own rollout TP degree, searched (tp, 2 tp, 4 tp within a node): each baseline at whichever ran fastest, JigsawRL at the degree and layout its profile picks",
         "slowdown: a pipeline's mean step time under JigsawRL over its step alone on the 8 GPUs",
         "grid rows: with every slowdown's excess x0.75 / x1.25, on the modelled grid and with sharing free (x0)")
FIGURE = figure("jigsaw-fig16", "JigsawRL Figure 16: heterogeneous models", "ratio", NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
