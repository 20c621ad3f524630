"""OrchestrRL §7.2.5 / Appendix I, Figure 22: sensitivity of each RL stage to the OCS reconfiguration delay.

Qwen3-235B-A22B, every OCS device switching in ``T_ocs`` (Table 2: RotorNet 0.01 ms, 3D MEMS 10 ms,
piezo 25 ms, liquid crystal 100 ms, robotic patch panel 120 s; plus 1 ms, 1 s and 10 s to fill the
curve), each stage's time normalised to instant switching (``T_ocs = 0``). Appendix I assumes
*fine-grained* reconfiguration in every stage, "including in-execution updates when communication
patterns shift":

* **Train** -- :class:`sim.stages.training.TrainingStage` with ``reconfigure="per-period"``: the
  fwd-bwd and grad-sync plans are switched in at every period boundary through the real controller
  and gate; switching the gate cannot hide in slack lands on the critical path. Steady state: the
  last of 3 optimizer steps (60 s apart). Layout of the bundled Figure 17 run (TP4 EP16 PP2).
* **Gen** -- AFD instances (3x8 attention + 2x8 FFN GPUs) through :class:`sim.stages.generation.
  GenerationStage` on RFabric. Every MoE layer of every decode step shifts the pattern from
  attention to the M2N exchange and back, so fine-grained reconfiguration adds ``2 T_ocs`` per layer
  per step (entered as per-layer overhead of the performance model; AFD's ping-pong keeps the links
  busy, so no slack hides it); the deployment's own plan also switches in ``T_ocs``.
* **Weight Sync** -- :class:`sim.stages.weight_sync.WeightSyncStage` (the planner's schedule): its
  plan is committed at ``weight-sync-begin`` and the broadcast waits for the circuits plus the gate's
  guard.

Paper (Appendix I): Train "remains stable for T_ocs <= 100 ms" and degrades beyond; Gen is "highly
sensitive: even millisecond-scale reconfiguration ... inflating latency by 4-325x"; Weight Sync is
"minimally affected over practical ranges". The only numbers are Gen's range: rows ``gen/min>=1ms``
(the smallest inflation at ``T_ocs >= 1 ms``, paper 4) and ``gen/max`` (the largest, paper 325);
every per-delay row has ``paper`` null.

Run ``python -m orchestrl.sim.experiments.fig22 [--quick] [--json] [--workers N] [--ray ADDRESS] [--out DIR]``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rowsplot import FigureCli, SweepFigure

__all__ = ["DELAYS_S", "QUICK_DELAYS_S", "PAPER", "Case", "cases", "run_case", "rows_of", "sweep", "run", "main"]

#: T_ocs swept (seconds) and the Table 2 technology each stands for (None: fills the curve).
DELAYS_S = {0.0: "instant", 1e-5: "rotor", 1e-3: None, 10e-3: "mems-3d", 25e-3: "piezo", 100e-3: "liquid-crystal",
            1.0: None, 10.0: None, 120.0: "robotic"}
QUICK_DELAYS_S = (0.0, 1e-5, 25e-3, 120.0)
PAPER = {"gen/min>=1ms": 4.0, "gen/max": 325.0}
STAGES = ("train", "gen", "weight-sync")
MODEL = "Qwen3-235B-A22B"


@dataclass(frozen=True)
class Case:
    """One stage at one delay and scale."""

    stage: str
    delay_s: float
    quick: bool = False
    seed: int = 3  # Gen's trace draw (Train and Weight Sync run fixed batches: the same at every seed)


def cases(quick: bool = False) -> list[Case]:
    """Return every (stage, delay) case."""
    delays = QUICK_DELAYS_S if quick else tuple(DELAYS_S)
    return [Case(s, d, quick) for s in STAGES for d in delays]


def _label(delay_s: float) -> str:
    if delay_s == 0:
        return "0"
    if delay_s < 1:
        return f"{delay_s * 1e3:g}ms"
    return f"{delay_s:g}s"


def run_case(case: Case) -> dict[str, Any]:
    """Return the stage's time at the case's delay (JSON-ready)."""
    wall, cpu = time.perf_counter(), time.process_time()
    time_s, detail = {"train": _train, "gen": _gen, "weight-sync": _sync}[case.stage](case)
    return {"stage": case.stage, "delay_s": case.delay_s, "time_s": time_s, **detail,
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def _driver(fabric, delay_s: float):
    from orchestrl.sim.network import RFabricDriver

    return RFabricDriver(fabric, switch_delay_s=delay_s)


def _train(case: Case) -> tuple[float, dict]:
    from orchestrl.compute_sched.hardware import load_gpu, load_model
    from orchestrl.fabric.layout import ParallelLayout
    from orchestrl.sim.network import NetworkSim, build_fabric
    from orchestrl.sim.stages.training import TrainBatch, TrainingOptions, TrainingStage

    # quick: two PoDs of trainers (inside one PoD the fwd-bwd and grad-sync plans are the same circuits)
    fabric_gpus, train_gpus, samples, tokens = (1024, 512, 1024, 4096) if case.quick else (2048, 1024, 2048, 5120)
    fab = build_fabric("rfabric", fabric_gpus)
    stage = TrainingStage(load_model(MODEL), ParallelLayout(tp=4, ep=16, pp=2, dp=train_gpus // 8), range(train_gpus),
                          load_gpu("H800"), NetworkSim(fab, circuits="fixed"), _driver(fab, case.delay_s),
                          options=TrainingOptions(reconfigure="per-period"))
    t, res = 0.0, None
    for _ in range(2 if case.quick else 3):
        res = stage.run(TrainBatch.uniform(samples, tokens), t)
        t += res.time_s + 60.0  # generation and weight sync happen in between
    return res.time_s, {"reconfig_wait_s": res.breakdown_s["reconfig_wait_s"], "gpus": train_gpus}


def _gen(case: Case) -> tuple[float, dict]:
    from orchestrl.compute_sched.hardware import load_gpu, load_model
    from orchestrl.compute_sched.perf import Calibration
    from orchestrl.compute_sched.scheduler import SchedulerConfig
    from orchestrl.compute_sched.traces import heavy_tailed_trace
    from orchestrl.sim.experiments.fig18 import Case as GenCase
    from orchestrl.sim.experiments.fig18 import gen_gpus
    from orchestrl.sim.network import NetworkSim
    from orchestrl.sim.stages.generation import GenerationStage

    g = GenCase("rfabric", instances=6, fabric_gpus=256, responses_per_gpu=4, max_tokens=8192, seed=case.seed) \
        if case.quick else GenCase("rfabric", seed=case.seed)
    gpus = gen_gpus(g)
    model = load_model(MODEL)
    base = Calibration()
    # two pattern shifts per MoE layer (attention -> M2N -> attention), each a reconfiguration
    cal = replace(base, extra_layer_s=2 * case.delay_s / base.scale)
    net = NetworkSim("rfabric", gpus=g.fabric_gpus, circuits="fixed")
    per_step_s = 2 * case.delay_s * model.layers
    stage = GenerationStage(model, gpus, load_gpu("H800"), net, _driver(net.fabric, case.delay_s), policy="static",
                            instance="afd24:16-tp8", calibration=cal, max_num_seqs=1536,
                            scheduler=SchedulerConfig(max_step_s=1e15),
                            static_tick_s=10.0 + 500 * per_step_s)  # ~ the same number of engine ticks at any delay
    trace = heavy_tailed_trace(len(gpus) * g.responses_per_gpu // 8, 8, g.max_tokens, seed=g.seed)
    res = stage.run(trace)
    return res.time_s, {"reconfig_per_decode_step_s": per_step_s, "gpus": len(gpus),
                        "unfinished": res.detail["unfinished"]}


def _sync(case: Case) -> tuple[float, dict]:
    from orchestrl.compute_sched.hardware import load_model
    from orchestrl.fabric.layout import ParallelLayout
    from orchestrl.sim.network import NetworkSim, build_fabric
    from orchestrl.sim.stages.weight_sync import WeightSyncStage

    n = 128 if case.quick else 1024
    fab = build_fabric("rfabric", 2 * n if not case.quick else 512)
    stage = WeightSyncStage(load_model(MODEL), ParallelLayout(tp=4, ep=16, pp=2, dp=n // 8), range(n), 8,
                            range(256, 256 + n) if case.quick else range(n, 2 * n), NetworkSim(fab, circuits="fixed"),
                            _driver(fab, case.delay_s))
    res = stage.run(0.0)
    return res.time_s, {"reconfiguration_s": res.breakdown_s.get("reconfiguration", 0.0), "gpus": 2 * n}


def rows_of(results: list[dict[str, Any]]) -> list[Row]:
    """Return one row per (stage, delay > 0): time over the stage's time at instant switching; then Gen's range."""
    ref = {r["stage"]: r["time_s"] for r in results if r["delay_s"] == 0}
    rows = []
    for r in results:
        if r["delay_s"] == 0:
            continue
        tech = DELAYS_S.get(r["delay_s"])
        rows.append(Row(f"{r['stage']}/{_label(r['delay_s'])}", None, r["time_s"] / ref[r["stage"]],
                        {"delay_s": r["delay_s"], "technology": tech or "", "time_s": r["time_s"],
                         "instant_s": ref[r["stage"]]}))
    gen = [(r.detail["delay_s"], r.ours) for r in rows if r.label.startswith("gen/")]
    ms = [x for d, x in gen if d >= 1e-3]
    if ms:
        rows.append(Row("gen/min>=1ms", PAPER["gen/min>=1ms"], min(ms), {"delay_s": min(d for d, _ in gen if d >= 1e-3)}))
    if gen:
        rows.append(Row("gen/max", PAPER["gen/max"], max(x for _, x in gen), {"delay_s": max(d for d, _ in gen)}))
    return rows


def curves(rows: Sequence[Row]) -> tuple[str, dict[str, list[tuple[float, float]]]]:
    """Each stage's slowdown against T_ocs (the plot; the summary rows of Gen's range are left out)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if "instant_s" in r.detail:
            out.setdefault(r.label.split("/")[0], []).append((r.detail["delay_s"], r.ours))
    return "OCS reconfiguration delay T_ocs (s)", out


NOTES = ("ours: stage time at T_ocs over the stage's time with instant switching; fine-grained reconfiguration "
         "in every stage (Appendix I)",
         "paper gives numbers only for Gen's range (4-325x); Train 'stable for T_ocs <= 100 ms', Weight Sync "
         "'minimally affected over practical ranges'")


FIGURE = SweepFigure(
    FigureCli(name='fig22',
              description=__doc__.splitlines()[0],
              quick_help='4 delays, reduced scale',
              plot_title='Figure 22: stage time vs OCS reconfiguration delay (x instant switching)',
              ylabel='x T_ocs = 0',
              heading='Figure 22: sensitivity to OCS reconfiguration delay, Qwen3-235B-A22B (x instant)',
              unit='x T_ocs = 0',
              notes=NOTES,
              results_key='cases',
              log_y=True,
              curves=curves, band=(PAPER["gen/min>=1ms"], PAPER["gen/max"], "paper: Gen 4-325x at T_ocs >= 1 ms")),
    run_case=run_case, cases=cases, rows_of=rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main  # the entry points bench/, tests and the CLI use


if __name__ == "__main__":
    sys.exit(main())
