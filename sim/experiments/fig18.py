"""OrchestrRL §7.3.2, Figure 18: the network's impact on a Gen step that changes its compute layout.

A representative Gen step of Qwen3-235B-A22B starts as 35 AFD instances (each 3x8 attention GPUs and
2x8 FFN/MoE GPUs, ``afd24:16-tp8``: 1,400 GPUs) and, once half its requests have finished, moves to
175 TP=8 instances on the same GPUs: parameters are reloaded and every unfinished request's KV cache
is migrated (transferred or recomputed, whichever the engine finds cheaper) to a TP instance on its
old instance's GPUs. The step runs on RFabric (the real controller and Gen gate; circuits change
only at the deployment boundary) and on the cost-comparable 3:1 oversubscribed Fat-tree (FT-OS), on
a 2,048-GPU fabric whose generation GPUs are 30 of every 32 servers (whole AFD instances per PoD).

Reported per phase, RFabric over FT-OS: the AFD decode phase, the layout switch (fixed switch-over
plus the parameter reload), the KV migration, the TP decode phase and the whole step. Paper: AFD
phase -16.7%, KV migration -58.3%, step -10.7%; "parameter switching and the TP phase remain
essentially unchanged" (no number: ``paper`` is null for those rows).

The engine is :mod:`sim.stages.generation`'s ``two-phase`` policy (``switch_at=0.5``, the paper does
not say when the step switches) with up to 1,536 sequences per instance, so a 40-GPU AFD instance
holds its share of the step at once. ``--quick``: 12 AFD instances on a 512-GPU fabric, 4 responses
per GPU, 8K-token cap.

Run ``python -m orchestrl.sim.experiments.fig18 [--quick] [--json] [--workers N] [--ray ADDRESS] [--out DIR]``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rowsplot import FigureCli, SweepFigure

__all__ = ["PAPER", "Case", "cases", "run_case", "rows_of", "sweep", "run", "main"]

#: §7.3.2: RFabric's phase time over FT-OS's (1 - the reported reduction).
PAPER = {"afd-phase": 1 - 0.167, "switch": None, "kv-migration": 1 - 0.583, "tp-phase": None, "step": 1 - 0.107}
AFD, TP = "afd24:16-tp8", "tp8"
SERVERS_PER_AFD = 5


@dataclass(frozen=True)
class Case:
    """One fabric of the comparison."""

    fabric: str
    instances: int = 35  # AFD instances at the start of the step
    fabric_gpus: int = 2048
    responses_per_gpu: int = 16
    max_tokens: int = 15360
    switch_at: float = 0.5
    seed: int = 3


def cases(quick: bool = False) -> list[Case]:
    """Return the RFabric and FT-OS cases (reduced with ``quick``)."""
    kw = {"instances": 12, "fabric_gpus": 512, "responses_per_gpu": 4, "max_tokens": 8192} if quick else {}
    return [Case("rfabric", **kw), Case("ft-os", **kw)]


def gen_gpus(case: Case) -> list[int]:
    """GPUs of the AFD instances: 6 per 32-server PoD (30 servers), as many PoDs as needed."""
    per_pod = 32 // SERVERS_PER_AFD
    servers = [s for p in range(case.fabric_gpus // 256) for s in range(32 * p, 32 * p + per_pod * SERVERS_PER_AFD)]
    need = case.instances * SERVERS_PER_AFD
    if need > len(servers):
        raise ValueError(f"{case.instances} AFD instances need {need} servers; the fabric has {len(servers)} usable")
    return [s * 8 + r for s in servers[:need] for r in range(8)]


def run_case(case: Case) -> dict[str, Any]:
    """Run the Gen step on one fabric; return its per-phase times (JSON-ready)."""
    from orchestrl.compute_sched.hardware import load_gpu, load_model
    from orchestrl.compute_sched.traces import heavy_tailed_trace
    from orchestrl.sim.network import NetworkSim, RFabricDriver
    from orchestrl.sim.stages.generation import GenerationStage

    gpus = gen_gpus(case)
    net = NetworkSim(case.fabric, gpus=case.fabric_gpus, circuits="fixed" if case.fabric == "rfabric" else "per-pattern")
    driver = RFabricDriver(net.fabric) if case.fabric == "rfabric" else None
    stage = GenerationStage(load_model("Qwen3-235B-A22B"), gpus, load_gpu("H800"), net, driver, policy="two-phase",
                            instance=AFD, switch_to=TP, switch_at=case.switch_at, max_num_seqs=1536)
    trace = heavy_tailed_trace(len(gpus) * case.responses_per_gpu // 8, 8, case.max_tokens, seed=case.seed)
    wall, cpu = time.perf_counter(), time.process_time()
    res = stage.run(trace)
    b = res.breakdown_s
    n_tp = len(gpus) // 8
    return {"fabric": case.fabric, "gpus": len(gpus), "requests": len(trace.requests),
            "afd-phase": b[f"decode/{case.instances}x {AFD}"], "switch": b["switch_s"], "reload": b["reload_s"],
            "kv-migration": b["kv_migration_s"], "tp-phase": b[f"decode/{n_tp}x {TP}"], "step": res.time_s,
            "kv_network_s": b.get("kv_network_s", 0.0), "fabric_wait_s": b.get("fabric_wait_s", 0.0),
            "migration_methods": res.detail["reconfigurations"][0]["methods"] if res.detail["reconfigurations"] else {},
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def rows_of(results: list[dict[str, Any]]) -> list[Row]:
    """Return one row per phase: RFabric's time over FT-OS's."""
    by = {r["fabric"]: r for r in results}
    rf, os3 = by["rfabric"], by["ft-os"]
    rows = []
    for phase in ("afd-phase", "switch", "kv-migration", "tp-phase", "step"):
        ratio = rf[phase] / os3[phase] if os3[phase] > 0 else float("nan")
        rows.append(Row(phase, PAPER[phase], ratio, {"rfabric_s": rf[phase], "ft_os_s": os3[phase]}))
    return rows


NOTES = ("ours and paper: RFabric's phase time / FT-OS's (paper: 1 - the reported reduction)",
         "switch = fixed switch-over + parameter reload; the paper gives no number for switch and tp-phase "
         "('essentially unchanged')")


FIGURE = SweepFigure(
    FigureCli(name='fig18',
              description=__doc__.splitlines()[0],
              quick_help='12 AFD instances on 512 GPUs, 4 responses per GPU',
              plot_title='Figure 18: Gen step AFD -> TP8, RFabric / FT-OS per phase',
              ylabel='RFabric / FT-OS',
              heading='Figure 18: Gen step from 35 AFD to 175 TP8 instances, RFabric / FT-OS per phase',
              unit='RFabric / FT-OS',
              notes=NOTES,
              results_key='fabrics'),
    run_case=run_case, cases=cases, rows_of=rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main  # the entry points bench/, tests and the CLI use


if __name__ == "__main__":
    sys.exit(main())
