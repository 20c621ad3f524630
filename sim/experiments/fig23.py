"""OrchestrRL Appendix I, Figure 23: traffic-aware (Algorithm 3) vs uniform circuit allocation on RFabric.

Each configuration is laid out with Megatron's rank order (:mod:`fabric.layout`) on the first GPUs of
the cluster, its collective is announced as an intent to the real controller once with the greedy
allocator and once with the uniform baseline, and the collective is timed on each resulting plan
with 200 Gb/s links. "Reduction" is ``1 - t_greedy / t_uniform``. The paper reports -19.3%
(EP64_DP2_1GB), -20.0% (TP4_CP8_DP4_1GB), -12.1% (TP4_DP16_25GB) and -8.8% (TP4_DP32_50GB).

Run ``python -m orchestrl.sim.experiments.fig23 [--quick] [--json]``; ``--topology`` picks another RFabric.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.fabric.topology import Topology, load_topology
from orchestrl.sim.experiments.common import Row, figure_document, format_rows
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.collectives import collective_flows
from orchestrl.sim.network.events import simulate
from orchestrl.sim.network.reconfig import RFabricDriver

__all__ = ["CONFIGS", "Config", "run"]

DEFAULT_TOPOLOGY = str(Path(__file__).resolve().parents[2] / "examples" / "topology-2048gpu.yaml")


@dataclass(frozen=True)
class Config:
    label: str
    layout: dict
    over: str  # group kind the collective runs over
    primitive: str
    bytes_per_rank: float
    stage: str
    paper_reduction: float  # Figure 23 text (Appendix I)


CONFIGS = (
    Config("EP64_DP2_1GB", {"ep": 64, "dp": 128}, "ep", "all-to-all", 1e9, "train", 0.193),
    Config("TP4_CP8_DP4_1GB", {"tp": 4, "cp": 8, "dp": 4}, "cp", "all-to-all", 1e9, "train", 0.200),
    Config("TP4_DP16_25GB", {"tp": 4, "dp": 16}, "dp", "all-reduce", 25e9, "train-dp", 0.121),
    Config("TP4_DP32_50GB", {"tp": 4, "dp": 32}, "dp", "all-reduce", 50e9, "train-dp", 0.088),
)


def run(topology: Topology, quick: bool = False, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Return one row per configuration: paper and our reduction of communication time.

    ``progress``, if given, is called with the name of each configuration as it starts.
    """
    fab = build_fabric("rfabric", topology.gpu_count, topology=topology)
    rows = []
    for cfg in CONFIGS[:2] if quick else CONFIGS:
        if progress:
            progress(f"fig23 {cfg.label}")
        layout = ParallelLayout(**cfg.layout)
        groups = parallel_groups(layout, list(range(layout.world_size)))[cfg.over]
        scale = 0.01 if quick else 1.0
        c = Collective(cfg.primitive, groups=tuple(map(tuple, groups)), bytes_per_rank=cfg.bytes_per_rank * scale)
        intent = Intent(cfg.stage, "fig23", cfg.label, (c,))
        times, circuits, worst = {}, {}, {}
        for method in ("greedy", "uniform"):
            plan = RFabricDriver(fab, method=method).controller.materialize(intent).plan
            times[method] = simulate(collective_flows(c), fab.with_circuits(plan)).makespan_s
            circuits[method] = sorted(plan.multiplicities().values())
            worst[method] = plan.max_pair_time_s()
        reduction = 1 - times["greedy"] / times["uniform"]
        rows.append(Row(cfg.label, cfg.paper_reduction, reduction, {
            "greedy_s": times["greedy"], "uniform_s": times["uniform"], "same_plan": circuits["greedy"] ==
            circuits["uniform"], "eq7_greedy_s": worst["greedy"], "eq7_uniform_s": worst["uniform"]}))
    return rows


NOTES = ("reduction = 1 - t(greedy) / t(uniform) of the collective's completion on each plan; the paper's are "
         "reductions of communication time too",
         "where both plans have the same circuit count on every pair ('same_plan'), the two allocators agree: "
         "every ToR's demand is spread evenly over its demanded pairs (docs/sim.md)")


def main(argv=None, progress: Callable[[str], None] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default=DEFAULT_TOPOLOGY, help=f"RFabric topology (default {DEFAULT_TOPOLOGY})")
    ap.add_argument("--quick", action="store_true", help="two configurations, 1%% of the bytes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = run(load_topology(args.topology), args.quick, progress)
    if args.json:
        print(json.dumps(figure_document("fig23", rows, NOTES)))
    else:
        print(format_rows("Figure 23: communication-time reduction of traffic-aware over uniform allocation", rows,
                          "fraction", NOTES))
        for r in rows:
            print(f"  {r.label}: greedy {r.detail['greedy_s'] * 1e3:.1f} ms, uniform {r.detail['uniform_s'] * 1e3:.1f} "
                  f"ms, same circuit counts: {r.detail['same_plan']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
