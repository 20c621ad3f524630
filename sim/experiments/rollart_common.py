"""RollArt's figures in RLSim (§3.1, §7.2-§7.4): cases, one case's run, the rows each figure prints.

Every case runs the agentic runtime's own objects on RLSim's virtual clock (:mod:`sim.agentic.cluster`).
Scale: the paper's 128-GPU runs with batches of 512 trajectories are simulated at a quarter of the
GPUs and of the batch (``--quick``: an eighth), which keeps trajectories per GPU; docs/agentic.md
gives the numbers at each scale it was run. Paper values are printed beside ours, never divided into
a pass mark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrl.sim.agentic.cluster import Cluster, Pool, run_system
from orchestrl.sim.experiments.rowsplot import FigureCli, SweepFigure

__all__ = ["Case", "run_case", "figure", "TABLE3_TCP_S", "scaled"]

#: RollArt Table 3: measured cross-cluster weight transfer over TCP (200 Gbps Ethernet), GB and seconds.
TABLE3_TCP_S = {"Qwen3-8B": (15.26, 6.911), "Qwen3-14B": (27.51, 14.437), "Qwen3-32B": (61.02, 29.649)}


def scaled(gpus: int, quick: bool) -> int:
    return max(1, gpus // (8 if quick else 4))


@dataclass(frozen=True)
class Case:
    figure: str
    label: str
    cluster: Cluster
    system: str
    iterations: int = 4
    bound: int = 1
    redundancy: float = 0.0
    async_weights: bool = True
    batched: bool = False
    extra: dict = field(default_factory=dict)
    seed: int = 0  # the runtime's seed (environments, policy stand-in, failures): `sim figure --seeds N` varies it


def cluster(model: str, pools: tuple[Pool, ...], quick: bool, **kw: Any) -> Cluster:
    gb, tcp_s = TABLE3_TCP_S.get(model, (16.0, 7.0))
    return Cluster(model=model, pools=pools, batch_groups=8 if quick else 16, train_gpus=scaled(32, quick),
                   cross_cluster_gbps=8 * gb / tcp_s, **kw)


def run_case(case: Case) -> dict:
    """Run one system on one cluster; return its step time, throughput and the case's labels."""
    t0 = time.perf_counter()
    if case.batched:
        from orchestrl.sim.agentic.batched import run_batched
        out = run_batched(case.cluster, case.iterations)
    else:
        out = run_system(case.cluster, case.system, case.iterations, case.bound, case.redundancy, case.async_weights,
                         seed=case.seed)
    out.update({"figure": case.figure, "label": case.label, "model": case.cluster.model, **case.extra,
                "wall_s": time.perf_counter() - t0})
    return out


def figure(name: str, heading: str, ylabel: str, notes, cases, rows_of) -> SweepFigure:
    cli = FigureCli(name, heading, "an eighth of the paper's GPUs and batch, three iterations", heading, ylabel,
                    heading, "ratio", notes, "cases")
    return SweepFigure(cli, run_case, cases, rows_of)


def by(results: list[dict], **match: Any) -> dict:
    for r in results:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise KeyError(match)
