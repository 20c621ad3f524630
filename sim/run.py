"""One RLSim run from a :class:`~sim.config.RunConfig`: fabric, controller, stages, loop and cost.

Design note
-----------
This module only assembles: the fabric is :func:`sim.network.build_fabric`'s, RFabric's control loop
is :class:`sim.network.RFabricDriver` (the real controller and safe-window gates, switching at the
run's OCS technology), the stages are the training, generation and weight-sync stage models, the
schedule is :func:`sim.loop.run_iterations` and the price is :func:`sim.pricing.cluster_cost`.
GPUs ``0 .. train_gpus-1`` train and the rest generate, so on RFabric each cluster has its own PoDs
when the split falls on a PoD boundary.

The stages are built by a factory (``stages_factory``, default :func:`default_stages`), so a sweep
or a test can swap one stage model for another without touching the loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.compute_sched.traces import Trace
from orchestrl.fabric.errors import ConfigError, OrchestrlError
from orchestrl.fabric.fabric_spec import OCS_TECHNOLOGIES
from orchestrl.fabric.topology import Topology
from orchestrl.sim.config import RunConfig, no_split_error, validate
from orchestrl.sim.loop import Iteration, LoopResult, Stages, run_iterations, throughput
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.pricing import ClusterCost, cluster_cost
from orchestrl.sim.stages.base import StageResult
from orchestrl.sim.stages.weight_sync import WeightSyncStage
from orchestrl.sim.workload import load_source_trace, split_candidates, step_size, step_trace

__all__ = ["StageModelMissing", "Simulation", "StageFactory", "default_stages", "build", "simulate",
           "balanced_split"]


class StageModelMissing(OrchestrlError):
    """A stage model this checkout does not have (e.g. a branch not merged yet)."""


StageFactory = Callable[["Simulation"], Stages]


@dataclass
class Simulation:
    """Everything one run needs, built but not yet run."""

    config: RunConfig
    model: ModelSpec
    gpu: GpuSpec
    net: NetworkSim
    driver: RFabricDriver | None
    topology: Topology | None
    train_gpus: tuple[int, ...]
    gen_gpus: tuple[int, ...]
    cost: ClusterCost
    source_trace: Trace | None = None
    stages: Stages | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def prompts_per_step(self) -> int:
        w = self.config.workload
        return step_size(w.responses_per_prompt, w.responses_per_gen_gpu, len(self.gen_gpus), w.prompts_per_step)

    def trace(self, step: int) -> Trace:
        """Return the length trace of RL step ``step`` (the same in every process for a seed)."""
        w = self.config.workload
        return step_trace(step, self.prompts_per_step, w.responses_per_prompt, w.max_tokens,
                          seed=self.config.loop.seed, length_scale=w.length_scale,
                          drift_per_step=w.drift_per_step, source=self.source_trace)

    def run(self, on_iteration: Callable[[Iteration], None] | None = None,
            on_stage: Callable[[int, str], None] | None = None) -> LoopResult:
        """Run the configured iterations and return throughput and throughput per dollar.

        ``on_iteration`` and ``on_stage`` report progress (:func:`sim.loop.run_iterations`).
        """
        started = time.perf_counter()
        its = run_iterations(self.stages, self.trace, self.config.loop.iterations, self.config.loop.mode,
                             on_iteration=on_iteration, on_stage=on_stage)
        head, whole = throughput(its)
        detail = dict(self.detail, wall_s=time.perf_counter() - started, train_gpus=len(self.train_gpus),
                      gen_gpus=len(self.gen_gpus), prompts_per_step=self.prompts_per_step)
        return LoopResult(self.config.loop.mode, tuple(its), head, whole, self.cost, detail)


def default_stages(sim: Simulation) -> Stages:
    """Return the project's stage models for a simulation (training, generation, weight sync).

    Raises
    ------
    StageModelMissing
        If this checkout lacks the training or generation stage model.
    """
    try:
        from orchestrl.sim.stages.generation import GenerationStage
        from orchestrl.sim.stages.training import TrainBatch, TrainingStage
    except ImportError as exc:
        raise StageModelMissing(f"the {exc.name or 'stage'} model is not in this checkout; `orchestrl sim run` "
                                "needs sim/stages/training.py and sim/stages/generation.py") from None
    cfg = sim.config
    job = cfg.loop.job
    train = TrainingStage(sim.model, cfg.train_layout(len(sim.train_gpus)), sim.train_gpus, sim.gpu, sim.net,
                          sim.driver, job=job)
    gen = GenerationStage(sim.model, sim.gen_gpus, sim.gpu, sim.net, sim.driver, policy=cfg.generation.policy,
                          instance=cfg.generation.instance, switch_to=cfg.generation.switch_to,
                          switch_at=cfg.generation.switch_at, job=job, step_model=cfg.generation.step_model)
    sync = weight_sync_stage(sim)

    def batch_of(trace: Trace, _: StageResult) -> Any:
        return TrainBatch(tuple(q.prompt_tokens + q.output_tokens for q in trace.requests))

    return Stages(gen, train, sync, batch_of)


def weight_sync_stage(sim: Simulation) -> WeightSyncStage:
    """Return the run's weight-sync stage (planner or flat baseline, through the controller on RFabric)."""
    cfg = sim.config
    return WeightSyncStage(sim.model, cfg.train_layout(len(sim.train_gpus)), sim.train_gpus,
                           cfg.generation.weight_sync_tp, sim.gen_gpus, sim.net, sim.driver,
                           method=cfg.loop.weight_sync, job=cfg.loop.job)


def build(cfg: RunConfig, *, train_gpus: int | None = None, stages_factory: StageFactory | None = None
          ) -> Simulation:
    """Return the simulation of ``cfg`` with ``train_gpus`` training GPUs (default: the config's).

    Raises
    ------
    ConfigError
        If the split is missing (use :func:`simulate` for a balanced one) or a part refuses the setup.
    """
    n_train = train_gpus if train_gpus is not None else cfg.cluster.train_gpus
    if n_train is None:
        raise ConfigError(cfg.source, "cluster.train_gpus", "is needed to build one split",
                          "a number of GPUs, or run simulate() for the balanced split")
    if n_train != cfg.cluster.train_gpus:
        cfg = validate(replace(cfg, cluster=replace(cfg.cluster, train_gpus=n_train)))
    f, c = cfg.fabric, cfg.cluster
    topo = Topology(cfg.rfabric_spec()) if f.kind == "rfabric" else None  # its file's, or the run's default
    config = SimConfig(link_bps=f.link_gbps * 1e9, ecmp=f.ecmp, switch_radix=f.switch_radix, mtu_bytes=f.mtu_bytes,
                       intra_server=f.same_server, oversubscription=f.oversubscription)
    fabric = build_fabric(f.kind, c.gpus, config, topology=topo)
    driver = None
    if f.kind == "rfabric":
        topo = fabric.topology
        delay = f.ocs_delay_s if f.ocs_delay_s is not None else (OCS_TECHNOLOGIES[f.ocs].switch_delay_s if f.ocs
                                                                   else None)
        driver = RFabricDriver(fabric, method=f.allocation, switch_delay_s=delay)
    net = NetworkSim(fabric, circuits="fixed" if driver else "per-pattern", method=f.allocation)
    gpu = cfg.gpu_spec()
    cost = cluster_cost(f.kind, c.gpus, f.link_gbps, gpu.name, gpu_usd_per_hour=cfg.cost.gpu_usd_per_hour,
                        amortization_years=cfg.cost.network_amortization_years,
                        topology=topo, min_clos_tiers=cfg.cost.min_clos_tiers, switch_radix=f.switch_radix)
    source = load_source_trace(cfg.resolve(cfg.workload.trace)) if cfg.workload.trace else None
    sim = Simulation(cfg, cfg.model_spec(), gpu, net, driver, topo, tuple(range(n_train)),
                     tuple(range(n_train, c.gpus)), cost, source)
    sim.stages = (stages_factory or default_stages)(sim)
    return sim


def balanced_split(cfg: RunConfig, stages_factory: StageFactory | None = None,
                   candidates: Sequence[int] | None = None) -> tuple[int, list[dict[str, float]]]:
    """Return StreamRL's split: the training GPUs whose Train and Gen step times are most balanced.

    Each candidate (:func:`sim.workload.split_candidates`) is profiled with the run's own stage models
    on step 0 of the workload -- generation of the step's trace, training on its samples -- and the one
    with the most samples per step period wins. The period is ``max(T_train, T_gen)`` for one-step
    asynchronous runs (the stages overlap, so balance them) and ``T_train + T_gen`` for synchronous
    ones; the samples are the step's responses, which grow with the generation GPUs when the step is
    sized per generation GPU (``workload.responses_per_gen_gpu``), so the shortest period is not the
    highest throughput (ties: fewer training GPUs). Returns the winner and one row per candidate.

    Raises
    ------
    ConfigError
        If no candidate split exists for the layout and cluster (naming why), or, when every candidate
        is refused, the first refusal.
    """
    t = cfg.train
    unit = math.lcm(t.tp * t.cp * t.pp, t.tp * t.ep * t.pp)  # dense and expert groups must both tile
    if candidates is None:
        candidates = split_candidates(cfg.cluster.gpus, unit, _pod_gpus(cfg))
    if not candidates:
        raise no_split_error(cfg, unit, _pod_gpus(cfg))
    rows, refused = [], []
    for n in candidates:
        try:
            sim = build(cfg, train_gpus=n, stages_factory=stages_factory)
        except ConfigError as exc:
            refused.append((n, exc))  # a candidate the layout does not tile; others may
            continue
        trace = sim.trace(0)
        g = sim.stages.gen.run(trace, 0.0)
        t = sim.stages.train.run(sim.stages.batch_of(trace, g), g.time_s)
        period = max(g.time_s, t.time_s) if cfg.loop.mode == "async" else g.time_s + t.time_s
        samples = len(trace.requests)
        rows.append({"train_gpus": n, "gen_s": g.time_s, "train_s": t.time_s, "period_s": period,
                     "samples": samples, "samples_per_s": samples / period if period > 0 else 0.0})
    if not rows:
        n, exc = refused[0]
        raise ConfigError(exc.source, exc.field, f"every candidate split ({', '.join(str(k) for k, _ in refused)} "
                          f"training GPUs) is refused; at {n}: {exc.problem}", exc.allowed)
    best = max(rows, key=lambda r: (r["samples_per_s"], -r["train_gpus"]))
    return int(best["train_gpus"]), rows


def _pod_gpus(cfg: RunConfig) -> int:
    """GPUs per PoD on RFabric (Train and Gen get whole PoDs), one server elsewhere."""
    if cfg.fabric.kind != "rfabric":
        return 8
    spec = cfg.rfabric_spec()
    return spec.servers_per_pod * spec.gpus_per_server


def simulate(cfg: RunConfig, *, stages_factory: StageFactory | None = None,
             on_iteration: Callable[[Iteration], None] | None = None,
             on_split: Callable[[list[dict[str, float]]], None] | None = None,
             on_stage: Callable[[int, str], None] | None = None) -> LoopResult:
    """Build and run ``cfg`` (finding the balanced split first when ``cluster.train_gpus`` is omitted).

    ``on_iteration``, ``on_split`` and ``on_stage`` report progress: each finished iteration, the
    profile of the split candidates, and each part of a step as it starts.
    """
    split_rows = None
    if cfg.cluster.train_gpus is None:
        n, split_rows = balanced_split(cfg, stages_factory)
        if on_split is not None:
            on_split(split_rows)
        cfg = replace(cfg, cluster=replace(cfg.cluster, train_gpus=n))
    sim = build(cfg, stages_factory=stages_factory)
    if split_rows is not None:
        sim.detail["split_profile"] = split_rows
    return sim.run(on_iteration, on_stage)
