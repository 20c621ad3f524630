"""RollArt §7.3, Figure 11: hardware affinity (a) and asynchronous cross-cluster weight update (b).

Paper: 64 H800 + 24 H20 with math and game tasks routed to H20 first is 1.30-1.68x faster per step
than 208 H20s and 1.12-1.37x than 72 H800s (training fixed on 32 H800s); the asynchronous
cross-cluster weight update cuts the step 1.10-1.16x against veRL's synchronous path.

Run ``python -m orchestrl.sim.experiments.rollart_fig11 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys

from orchestrl.sim.agentic.cluster import Pool
from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rollart_common import Case, by, cluster, figure, scaled


def cases(quick: bool = False) -> list:
    its = 3 if quick else 4
    out = []
    for model in (("Qwen3-8B",) if quick else ("Qwen3-8B", "Qwen3-14B")):
        s = lambda n: scaled(n, quick)  # noqa: E731
        configs = {
            "affinity": ((Pool("h800", "H800", s(64)), Pool("h20", "H20", s(24))),
                         {"gem-math": ["h20", "h800"], "frozenlake": ["h800", "h20"]}),
            "h800-only": ((Pool("h800", "H800", s(72)),), {}),
            "h20-only": ((Pool("h20", "H20", s(208)),), {}),
        }
        for name, (pools, mapping) in configs.items():
            c = cluster(model, pools, quick, mapping=mapping)
            out.append(Case("fig11", f"{model}/{name}", c, "rollart", its, 1, extra={"config": name}))
        c = cluster(model, configs["affinity"][0], quick, mapping=configs["affinity"][1])
        out.append(Case("fig11", f"{model}/sync-weights", c, "rollart", its, 1, async_weights=False,
                        extra={"config": "sync-weights"}))
    return out


def rows_of(results: list[dict]) -> list[Row]:
    rows = []
    for model in sorted({r["model"] for r in results}):
        aff = by(results, model=model, config="affinity")
        for base, paper in (("h20-only", 1.30), ("h800-only", 1.12)):
            b = by(results, model=model, config=base)
            rows.append(Row(f"{model}: {base} / affinity step", paper, b["step_s"] / aff["step_s"],
                            {"paper_range": "1.30-1.68" if base == "h20-only" else "1.12-1.37"}))
        sync = by(results, model=model, config="sync-weights")
        rows.append(Row(f"{model}: sync / async weights step", 1.10, sync["step_s"] / aff["step_s"],
                        {"paper_range": "1.10-1.16", "weights_waited_s": sum(aff.get("weights_waited_s", []))}))
    return rows


NOTES = ("GPU counts at a quarter of the paper's (an eighth with --quick); cross-cluster copy at RollArt Table 3's "
         "measured TCP rate; H20 derived from its datasheet in the roofline (docs/agentic.md)",)
FIGURE = figure("rollart-fig11", "RollArt Figure 11: hardware affinity and asynchronous weight update", "ratio",
                NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
