"""JigsawRL §5.3, Figure 15: asynchronous RL, JigsawRL vs StreamRL (one-step off-policy) and AReaL.

Paper: 1.25x over StreamRL (up to 1.54x), 1.21x over AReaL (up to 1.41x). Ours: each half of the 8
H100s hosts one pipeline's rollout and the other's training, multiplexed (look-ahead plan); StreamRL
and AReaL give each pipeline a quarter for rollout and a quarter for training. Every system at its best rollout
TP (StreamRL and AReaL at the fastest, in hindsight; JigsawRL-async as its profile predicts).

Run ``python -m orchestrl.sim.experiments.jigsaw_fig15 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from statistics import fmean as mean

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import FIG12, Case, figure, grid_rows, mean_row, quick, ratio, tp_search

PAPER = {"mean/streamrl": 1.25, "max/streamrl": 1.54, "mean/areal": 1.21, "max/areal": 1.41}


def cases(is_quick: bool = False) -> list[Case]:
    # every system at its best rollout TP: StreamRL and AReaL at the degree where each ran fastest (hindsight; a quarter
    # of 8 GPUs holds TP 1 or 2 only), JigsawRL-async (on halves: 1, 2 or 4) at the one its plan on profiling steps prefers
    full = [Case("fig15", f"{m}/{t}", "H100", 8, ((m, t, tp, sc), (m, t, tp, sc)), 2, ("streamrl",),
                 tps=tp_search(tp, 8), sensitivity=True) for m, t, tp, sc in FIG12]
    return quick([full[2], full[3]], 2) if is_quick else full


def rows_of(results: list[dict]) -> list[Row]:
    rows = []
    for r in results:
        tp = r.get("tp", {})
        for b in ("streamrl", "areal"):
            rows.append(Row(f"{r['label']}/{b}", None, ratio(r, "jigsaw_async", b),
                            {"tp": tp.get("jigsaw_async"), f"{b}_tp": tp.get(b)}))
    for b in ("streamrl", "areal"):
        vals = [ratio(r, "jigsaw_async", b) for r in results]
        rows.append(mean_row(f"mean/{b}", PAPER[f"mean/{b}"], vals))
        rows.append(Row(f"max/{b}", PAPER[f"max/{b}"], max(vals)))
        rows += grid_rows(results, f"mean/{b}", lambda rs, t, b=b: mean(ratio(r, f"jigsaw_async_{t}", b) for r in rs),
                          PAPER[f"mean/{b}"])
    return rows


NOTES = ("JigsawRL-async plans the critical replica of each half with the fortified look-ahead (no merging)",
         "rollout TP searched: StreamRL and AReaL at their fastest of 1 and 2 (a quarter of 8 GPUs holds no TP-4 "
         "replica), JigsawRL-async at its profile's pick of 1, 2 and 4",
         "grid rows: JigsawRL-async with every slowdown's excess x0.75 / x1.25, on the modelled grid and with sharing "
         "free (x0); StreamRL and AReaL share no GPU, so the grid does not move them")
FIGURE = figure("jigsaw-fig15", "JigsawRL Figure 15: asynchronous RL", "JigsawRL / baseline", NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
