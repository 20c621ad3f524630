"""RollArt §7.2, Figure 10: step time and throughput of RollArt (bound 1 and 2) vs veRL+ and StreamRL, and scaling.

Paper: RollArt (bound 1) cuts the step time 2.05x against veRL+ and 1.35x against StreamRL; its
throughput is 2.65-4.58x the synchronous baseline's; StreamRL 1.31-1.47x. Fig. 10c: from 64 to 128
rollout GPUs RollArt keeps gaining 1.33-2.08x where veRL+ and StreamRL flatten.

Run ``python -m orchestrl.sim.experiments.rollart_fig10 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from orchestrl.sim.agentic.cluster import Pool
from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rollart_common import Case, by, cluster, figure, scaled


def cases(quick: bool = False) -> list:
    out = []
    its = 3 if quick else 5
    for gpus in (64, 128):
        c = cluster("Qwen3-8B", (Pool("h800", "H800", scaled(gpus, quick)),), quick)
        for system, bound in (("verl+", 1), ("streamrl", 1), ("rollart", 1), ("rollart", 2)):
            out.append(Case("fig10", f"{system}/b{bound}/{gpus}", c, system, its, bound, extra={"gpus": gpus,
                                                                                              "bound": bound,
                                                                                              "train_share": "as run"}))
    # What-if (docs/agentic.md): a quarter of the training GPUs, so training is ~a quarter of veRL+'s step instead of
    # ~a tenth -- the share the paper's 1.52x veRL+/StreamRL implies. Shows how the step ratios depend on it.
    c = cluster("Qwen3-8B", (Pool("h800", "H800", scaled(64, quick)),), quick)
    c = replace(c, train_gpus=max(1, c.train_gpus // 4))
    for system in ("verl+", "streamrl", "rollart"):
        out.append(Case("fig10", f"{system}/b1/64/train-x4", c, system, its, 1,
                        extra={"gpus": 64, "bound": 1, "train_share": "x4"}))
    return out


def rows_of(results: list[dict]) -> list[Row]:
    def r(system, bound, gpus, train_share="as run"):
        return by(results, system=system, bound=bound, gpus=gpus, train_share=train_share)
    base = r("verl+", 1, 64)
    rows = [Row("step: veRL+ / RollArt b1", 2.05, base["step_s"] / r("rollart", 1, 64)["step_s"]),
            Row("step: StreamRL / RollArt b1", 1.35, r("streamrl", 1, 64)["step_s"] / r("rollart", 1, 64)["step_s"]),
            Row("step: veRL+ / StreamRL", 1.52, base["step_s"] / r("streamrl", 1, 64)["step_s"]),
            Row("throughput: RollArt b1 / veRL+", 2.65, r("rollart", 1, 64)["throughput_tps"] / base["throughput_tps"],
                {"paper_range": "2.65-4.58"}),
            Row("throughput: RollArt b2 / veRL+", None, r("rollart", 2, 64)["throughput_tps"] / base["throughput_tps"]),
            Row("throughput: StreamRL / veRL+", 1.31, r("streamrl", 1, 64)["throughput_tps"] / base["throughput_tps"],
                {"paper_range": "1.31-1.47"})]
    for system, bound in (("verl+", 1), ("streamrl", 1), ("rollart", 1)):
        rows.append(Row(f"10c: {system} at 128 / veRL+ at 64", 1.33 if system == "rollart" else None,
                        r(system, bound, 128)["throughput_tps"] / base["throughput_tps"],
                        {"paper_range": "1.33-2.08" if system == "rollart" else ""}))
    x4 = {system: r(system, 1, 64, "x4")["step_s"] for system in ("verl+", "streamrl", "rollart")}
    rows += [Row("what-if, training x4: veRL+ / RollArt b1 step", 2.05, x4["verl+"] / x4["rollart"]),
             Row("what-if, training x4: StreamRL / RollArt b1 step", 1.35, x4["streamrl"] / x4["rollart"]),
             Row("what-if, training x4: veRL+ / StreamRL step", 1.52, x4["verl+"] / x4["streamrl"])]
    return rows


NOTES = ("Qwen3-8B, FrozenLake8x8 (prefill-heavy) and GEM-math-like (decode-heavy) tasks, training on H800s at 35% "
         "MFU; GPUs and batch at a quarter of the paper's (an eighth with --quick)",
         "what-if rows: a quarter of the training GPUs (training ~26% of veRL+'s step instead of ~11%)")
FIGURE = figure("rollart-fig10", "RollArt Figure 10: step time, throughput and scaling", "ratio", NOTES, cases,
                rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
