"""OrchestrRL §7.2.4, Figure 16: performance against network cost at 100/200/400/800 Gb/s, and the Pareto frontier.

Every (fabric, link speed) point is one RL run of Figure 13's kind (:func:`sim.experiments.fig13.run_case`,
Qwen2-57B-A14B with AFD generation, on the Train/Gen split FT picks at that speed) and its
network's purchase price from :func:`fabric.cost.network_cost` (Table 4 components for the fabric as
built at that speed; NICs included). Performance is steady-state samples/s.

**Cost-efficiency** is throughput per network dollar, ``samples/s / network USD``. The paper does
not define it, but its numbers only fit a network-only denominator: RFabric at ~FT throughput and
0.51-0.52x of FT's network cost (§7.2.3) gives ~1.9-2x, its 1.53-2.06x; with GPUs in the cost, no
fabric at FT's throughput could gain more than the network's share of the cluster price (under 1.2x).
The per-dollar rate with GPUs included (:mod:`sim.pricing`, ``tpd`` in the JSON detail) is reported
too.

Paper (§7.2.4): RFabric "improves cost-efficiency by 1.53x-2.06x over FT and by 1.61x-2.08x over RO,
and by ~1.13x over MixNet"; RFabric stays on or near the frontier, TopoOpt and FT-OS well below it.
We compare the paper's ranges with our minimum and maximum over the four speeds.

Run ``python -m orchestrl.sim.experiments.fig16 [--quick] [--json] [--workers N] [--ray ADDRESS] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.fig13 import RLCase, figure_main, mean_over_seeds, seed_rows, seeded, sweep
from orchestrl.sim.network.config import FABRICS
from orchestrl.sim.plot import PlotFiles, pareto_frontier, scatter_frontier

__all__ = ["SPEEDS_GBPS", "PAPER_RANGES", "cases", "rows_of", "frontier", "run", "plot", "main"]

SPEEDS_GBPS = (100, 200, 400, 800)
#: RFabric's cost-efficiency over a fabric: the paper's (min, max) over link speeds.
PAPER_RANGES = {"ft": (1.53, 2.06), "ro": (1.61, 2.08)}
PAPER_OVER_MIXNET = 1.13


def cases(quick: bool = False) -> list[RLCase]:
    """Return the sweep: 57B MoE on 1,024 GPUs x fabrics x speeds (quick: 512 GPUs, short steps, 100 and 400 Gb/s).

    1,024 rather than Figure 13's 2,048 GPUs: 24 RL runs at 2,048 take hours on a 2-core machine (TopoOpt's
    alone minutes each); ``RLCase("57b-moe", 2048, fabric, gbps)`` runs any point at full scale.
    """
    if quick:
        return [RLCase("57b-moe", 512, f, g, quick=True) for g in (100, 400) for f in FABRICS]
    return [RLCase("57b-moe", 1024, f, g) for g in SPEEDS_GBPS for f in FABRICS]


def frontier(results: Sequence[dict[str, Any]]) -> list[int]:
    """Return the indices of the (network cost, throughput) points on the Pareto frontier."""
    ok = [i for i, r in enumerate(results) if not r.get("error")]  # a failed point is on no frontier
    return [ok[i] for i in pareto_frontier([(results[i]["network_usd"], results[i]["samples_per_s"]) for i in ok])]


def rows_of(results: Sequence[dict[str, Any]]) -> list[Row]:
    """Return RFabric's cost-efficiency over FT, RO and MixNet per speed, the paper's ranges, and the frontier."""
    ce = {(r["fabric"], r["link_gbps"]): r["samples_per_s"] / r["network_usd"] for r in results}
    tpd = {(r["fabric"], r["link_gbps"]): r["samples_per_usd"] for r in results}
    on = set(frontier(results))
    for i, r in enumerate(results):
        r["cost_efficiency"] = ce[(r["fabric"], r["link_gbps"])]
        r["on_frontier"] = i in on
    speeds = sorted({r["link_gbps"] for r in results})
    rows: list[Row] = []
    over: dict[str, list[float]] = {"ft": [], "ro": [], "mixnet": []}
    for g in speeds:
        for other in over:
            if ("rfabric", g) not in ce or (other, g) not in ce:
                continue
            ratio = ce[("rfabric", g)] / ce[(other, g)]
            over[other].append(ratio)
            rows.append(Row(f"ce/rfabric/{other}@{g}", PAPER_OVER_MIXNET if other == "mixnet" else None, ratio,
                            {"tpd_ratio": tpd[("rfabric", g)] / tpd[(other, g)]}))
    for other, (lo, hi) in PAPER_RANGES.items():
        if over[other]:
            rows.append(Row(f"ce/rfabric/{other} min", lo, min(over[other])))
            rows.append(Row(f"ce/rfabric/{other} max", hi, max(over[other])))
    for fabric in FABRICS:
        pts = [i for i, r in enumerate(results) if r["fabric"] == fabric]
        if pts:
            rows.append(Row(f"frontier/{fabric}", None, float(sum(i in on for i in pts)),
                            {"of": len(pts)}))
    return rows


NOTES = ("ce = steady-state samples/s per network USD (Table 4 components incl. NICs); ratios of RFabric's ce "
         "to another fabric's at the same link speed; 'tpd_ratio' in --json counts GPUs too",
         "frontier/<fabric>: how many of the fabric's points lie on the Pareto frontier of (network cost, "
         "throughput); paper: RFabric on or near it, FT-OS and TopoOpt well below (no numbers)")


def run(quick: bool = False, workers: int | None = None, ray_address: str | None = None, seeds: int = 1
        ) -> tuple[list[Row], list[dict[str, Any]]]:
    """Return the figure's rows and the per-point results behind them."""
    results = sweep(seeded(cases(quick), seeds), workers=workers, ray_address=ray_address, label="fig16")
    return seed_rows(rows_of, results), results


def plot(results: Sequence[dict[str, Any]], out_dir: str) -> PlotFiles:
    """Write fig16.png (throughput vs network cost, one line per fabric, the frontier) and fig16.csv."""
    results = mean_over_seeds(results, ("model", "gpus", "fabric", "link_gbps"))
    # the paper's axis is relative to FT at 200 Gb/s; a sweep without 200 Gb/s (--quick) uses its slowest FT
    ft = {r["link_gbps"]: r["samples_per_s"] for r in results if r["fabric"] == "ft" and not r.get("error")}
    ref = 200 if 200 in ft else (min(ft) if ft else None)
    if ref is None or not ft[ref] > 0:
        raise OSError("fig16: no FT result to normalise by (every FT case failed); the CSV and PNG are not written")
    rows = [{k: v for k, v in r.items() if k != "split_profile"} |
            {"network_musd": r["network_usd"] / 1e6, "perf_vs_ft": r["samples_per_s"] / ft[ref],
             "speed": f"{r['link_gbps']}G"} for r in results]
    speeds = sorted({r["link_gbps"] for r in results})
    return scatter_frontier(Path(out_dir) / "fig16.png", rows, x="network_musd", y="perf_vs_ft", series="fabric",
                            label="speed", title=f"Figure 16: performance vs network cost "
                            f"({', '.join(f'{g}' for g in speeds)} Gb/s)",
                            xlabel="network cost (M USD)", ylabel=f"samples/s relative to FT at {ref} Gb/s",
                            frontier=frontier(results))


def main(argv=None) -> int:
    return figure_main("fig16", "Figure 16: RFabric's cost-efficiency (throughput per network USD)", "x", NOTES,
                       run, plot, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
