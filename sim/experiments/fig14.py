"""OrchestrRL §7.2.2, Figure 14: per-stage time of Qwen2-57B-A14B on the six fabrics, normalised to FT.

The stages are those of the RL runs of Figure 13 (:func:`sim.experiments.fig13.run_case`): Train
(TP4 EP16, its EP all-to-all and DP gradient sync on the fabric), Gen in AFD mode (static instances
of 3x8 attention and 2x8 FFN GPUs, M2N traffic on the fabric) and Weight Sync (the collectives
planner's schedule replayed as flows; through the controller on RFabric). The split is Figure 13's:
FT picks its throughput-best split and every fabric runs on it, so the stage times compare the
same work on the same GPUs; these are the very runs of Figure 13's 57B MoE column at that scale.
Each stage's time is its mean over the run's iterations.

Paper (text of §7.2.2; the bars are not given as numbers): "RFabric stays close to FT across all
stages, matching RO and yielding a small improvement in Weight Sync by leveraging optical circuits
for bulk transfers. In contrast, FT-OS, TopoOpt, and MixNet are consistently slower to varying
degrees." We read "close to FT" as 1.0 for RFabric's and RO's Train and Gen; every other cell has no
number.

Run ``python -m orchestrl.sim.experiments.fig14 [--quick] [--json] [--workers N] [--ray ADDRESS] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.fig13 import RLCase, figure_main, mean_over_seeds, seed_rows, seeded, sweep
from orchestrl.sim.network.config import FABRICS
from orchestrl.sim.plot import PlotFiles, grouped_bars

__all__ = ["STAGES", "PAPER", "cases", "rows_of", "run", "plot", "main"]

STAGES = (("train", "train_s"), ("gen", "gen_s"), ("weight-sync", "sync_s"))
#: (stage, fabric) -> the paper's time over FT where the text gives one ("close to FT" as 1.0).
PAPER = {(s, f): 1.0 for s in ("train", "gen") for f in ("rfabric", "ro")}


def cases(quick: bool = False) -> list[RLCase]:
    """Return the six fabrics' runs of 57B MoE on 2,048 GPUs (quick: 512, short steps), on FT's split."""
    return [RLCase("57b-moe", 512 if quick else 2048, f, quick=quick) for f in FABRICS]


def rows_of(results: Sequence[dict[str, Any]]) -> list[Row]:
    """Return one row per (stage, fabric other than FT): the stage's time over FT's."""
    ft = next(r for r in results if r["fabric"] == "ft")
    rows = []
    for r in mean_over_seeds(results, ("model", "gpus", "fabric", "link_gbps")):
        for stage, key in STAGES:
            ratio = r[key] / ft[key] if ft[key] > 0 else float("nan")
            r[f"{stage}_vs_ft"] = ratio
            if r["fabric"] != "ft":
                rows.append(Row(f"{stage}/{r['fabric']}/ft", PAPER.get((stage, r["fabric"])), ratio,
                                {"time_s": r[key], "ft_s": ft[key]}))
    return rows


NOTES = ("ours: mean stage time over the run's iterations divided by FT's, every fabric on FT's split; Gen in AFD "
         "mode (afd24:16-tp8)",
         "paper: §7.2.2 text; 'close to FT' read as 1.0 for RFabric and RO Train and Gen, no numbers otherwise")


def run(quick: bool = False, workers: int | None = None, ray_address: str | None = None, seeds: int = 1
        ) -> tuple[list[Row], list[dict[str, Any]]]:
    """Return the figure's rows and the per-fabric results behind them."""
    results = sweep(seeded(cases(quick), seeds), workers=workers, ray_address=ray_address, label="fig14")
    return seed_rows(rows_of, results), results


def plot(results: Sequence[dict[str, Any]], out_dir: str) -> PlotFiles:
    """Write fig14.png (stage time over FT per stage and fabric) and fig14.csv (one row per stage and fabric)."""
    rows = []
    means = mean_over_seeds(results, ("model", "gpus", "fabric", "link_gbps"))
    ft = next(r for r in means if r["fabric"] == "ft")  # ratios from the same means the bars show
    for r in means:
        for stage, key in STAGES:
            vs_ft = r[key] / ft[key] if ft[key] > 0 else float("nan")
            rows.append({"panel": f"Qwen2-57B-A14B, {r['gpus']} GPUs", "stage": stage, "fabric": r["fabric"],
                         "time_s": r[key], "vs_ft": vs_ft, "train_gpus": r["train_gpus"],
                         "gen_layout": r["gen_layout"], "link_gbps": r["link_gbps"]})
    return grouped_bars(Path(out_dir) / "fig14.png", rows, panel="panel", group="stage", series="fabric",
                        value="vs_ft", title="Figure 14: per-stage time normalised to FT", ylabel="time / FT",
                        reference=1.0)


def main(argv=None) -> int:
    return figure_main("fig14", "Figure 14: per-stage time of 57B MoE relative to FT", "x FT", NOTES, run, plot,
                       argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
