"""Generation stage of RLSim: the project's generation engine and scheduler, timed on the fabric.

Design note
-----------
The stage does not model generation itself: it runs :class:`compute_sched.sim_engine.SimEngine`
(continuous batching with KV limits, preemption, migration) under
:class:`compute_sched.scheduler.GenerationScheduler` (Algorithm 1: planner and balancer), exactly
as ``orchestrl sched replay`` does, with one difference -- the performance model carries a
network seam (:class:`sim.stages.gen_network.FabricSeam`), so EP all-to-all and AFD M2N run at the
rates the fabric gives each instance at its placement, the planner's switching and migration
estimates use the fabric's rates, weight reloads from peers and KV migrations are flows on the
fabric, and on RFabric every deployment goes through the real controller and the Gen gate.

Policies (``policy``):

=================  ==============================================================================
``orchestrl``      Algorithm 1, planner + balancer, starting from ``instance`` (or veRL-TO's TP)
``orchestrl-pp``   planner only; ``orchestrl-rb``: balancer only
``verl-to``        the best static TP of a sweep (the sweep runs as a what-if, off the driver)
``static``         ``instance`` on every GPU, never changed (e.g. ``ep16-tp1``, ``afd24:16-tp8``)
``two-phase``      ``instance`` until ``switch_at`` of the requests finished, then ``switch_to`` on
                   every GPU, each request re-homed onto a new instance on its old instance's GPUs
                   (the controlled transition of §7.3.2 / Figure 18: AFD -> TP8)
=================  ==============================================================================

Static policies have no monitoring, so the engine advances in ``static_tick_s`` steps (the
remaining-requests curve is sampled that coarsely; the step itself does not depend on it).

``slice_gpus`` trades fidelity for speed at scale: the engine and scheduler run on the first
``slice_gpus`` generation GPUs with every ``c``-th GRPO group of the trace (``c`` = GPUs / slice),
and the rest of the cluster is taken to run ``c - 1`` identical copies. The fabric still carries
all ``c`` copies' traffic (:class:`~sim.stages.gen_network.FabricSeam` ``copies``), so contention,
circuits and intents are those of the whole cluster; what is lost is the straggler statistics of
``c`` times more instances and any balancing across copies. Samples and tokens are scaled back up.

KV migration may transfer (``kv_transfer=True``, default): the engine OrchestrRL describes picks
transfer or recomputation, whichever is cheaper (§4.1, Appendix A). That is a labelled capability
of the simulated engine, not of the vLLM adapter (:mod:`compute_sched.engine`). The scheduler plans
with a forecast histogram: the caller's, else the lengths the stage saw in its previous run, else
(first run) an independent draw of the Figure 3 shape -- never the trace's own lengths.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Sequence

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import ClusterSnapshot, EngineCapabilities
from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.compute_sched.layout import InstanceConfig, Layout, aligned, homogeneous, parse_config
from orchestrl.compute_sched.calibration import DEFAULT_STEP_MODEL, step_model_class
from orchestrl.compute_sched.perf import Calibration
from orchestrl.compute_sched.planner import PlannerConfig
from orchestrl.compute_sched.replay import launch_contiguous, trace_requests
from orchestrl.compute_sched.scheduler import GenerationScheduler, ReconfigEvent, SchedulerConfig, StepReport
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import Trace, heavy_tailed_trace
from orchestrl.compute_sched.workload import LengthHistogram
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.stages.base import StageResult
from orchestrl.sim.stages.gen_network import FabricSeam

__all__ = ["POLICIES", "PLACEMENTS", "KV_TRANSFER", "SIM_SCHEDULER", "GenerationStage", "phase_breakdown",
           "local_placement", "slice_trace"]

PLACEMENTS = ("auto", "aligned", "packed")
POLICIES = ("orchestrl", "orchestrl-pp", "orchestrl-rb", "verl-to", "static", "two-phase")
KV_TRANSFER = EngineCapabilities(kv_transfer=True, label="RLSim: OrchestrRL's engine transfers KV or recomputes, "
                                                          "whichever is cheaper (§4.1, Appendix A)")
_FLAGS = {"orchestrl": (True, True), "orchestrl-pp": (True, False), "orchestrl-rb": (False, True),
          "verl-to": (False, False), "static": (False, False), "two-phase": (False, False)}
_PRIOR_SEED = 7919  # the first run's forecast is an independent draw, never the trace itself
#: Online, the planner's MIP stops after 250 ms of wall clock. The simulator does not charge solve time
#: to the step, and under host load that limit cut solves short (40 ms each when idle, over 250 ms at a
#: load of 8 on 2 cores), so plans -- and results -- depended on the machine's load. A limit that an
#: idle-machine solve never reaches keeps a run reproducible.
SIM_SCHEDULER = SchedulerConfig(planner=PlannerConfig(mip_time_limit_s=30.0, mip_grid_points=16))
# 16 of the MIP's 40 token-grid points: on the 235B bench (256 GPUs, step 0) the plans and every stage time came
# out identical (Gen 370.33 s at 8, 16 and 40 points) at 0.6x the CPU time; the MIP was half of RLSim's time.


class GenerationStage:
    """One generation step per :meth:`run`, on ``gpus`` of the fabric ``net``.

    Parameters
    ----------
    model, gpu : ModelSpec, GpuSpec
    gpus : sequence of int
        Fabric GPUs of the generation cluster, in the order the scheduler numbers them (whole
        servers); list a PoD's GPUs consecutively (see ``placement``).
    net : NetworkSim
    driver : RFabricDriver, optional
        RFabric only: deployments are announced to it and flows run on its circuit timeline.
    policy : str
        One of :data:`POLICIES`.
    instance : str, optional
        Instance configuration (``tp8``, ``ep16-tp1``, ``afd24:16-tp8``, ...): the static layout, or
        where the ``orchestrl`` policies start (default: veRL-TO's best TP).
    calibration : Calibration, optional
        Step-model constants (default: :class:`~compute_sched.perf.Calibration` defaults).
    kv_transfer : bool
        Whether the engine may move KV by transfer (else recompute only).
    scheduler : SchedulerConfig, optional
        Algorithm 1's periods and knobs (the policy sets ``proactive``/``reactive``); default
        :data:`SIM_SCHEDULER` (the online defaults with a MIP time limit the host's load cannot reach).
    forecast : LengthHistogram, optional
        Forecast of the next run's lengths (default: the previous run's, see the module note).
    switch_to, switch_at : str, float
        ``two-phase`` only: the configuration taken over once ``switch_at`` of the requests finished.
    static_tick_s : float
        Engine advance of the static policies (no monitoring to run in between).
    slice_gpus : int, optional
        Simulate this many GPUs (a divisor of ``len(gpus)``, whole servers) as one of identical copies.
    placement : str
        Fabrics with PoDs (RFabric) only. ``"aligned"`` keeps every instance inside one PoD
        (:func:`compute_sched.layout.aligned`: an instance that would cross a PoD boundary starts at
        the next PoD, leaving the GPUs before it idle), so attention-FFN and EP traffic never waits
        for OCS-Core circuits; ``"packed"`` puts instances end to end as on every other fabric;
        ``"auto"`` (default) takes ``aligned`` when it loses no instance, and otherwise runs both on
        the stage's first trace as what-ifs off the driver (as veRL-TO's sweep does) and keeps the
        faster, per configuration. Aligned pays idle GPUs, packed pays straddling instances' waits
        for Core circuits; which costs more depends on the scale and link speed.
    step_model : str
        ``"measured"`` (default: sums of measured operator times, :mod:`compute_sched.step_measured`)
        or ``"analytical"`` (the roofline of :mod:`compute_sched.perf`).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.traces import heavy_tailed_trace
    >>> stage = GenerationStage(load_model("Qwen2-57B-A14B"), range(32), load_gpu("H800"),
    ...                         NetworkSim("ft-os", gpus=32), policy="static", instance="ep16-tp1")
    >>> res = stage.run(heavy_tailed_trace(16, 8, 2048, seed=1))
    >>> res.stage, res.samples, res.time_s > 0
    ('gen', 128, True)
    """

    def __init__(self, model: ModelSpec, gpus: Sequence[int], gpu: GpuSpec, net: NetworkSim,
                 driver: RFabricDriver | None = None, *, policy: str = "orchestrl", instance: str | None = None,
                 calibration: Calibration | None = None, job: str = "gen", kv_transfer: bool = True,
                 scheduler: SchedulerConfig | None = None, sweep_tps: tuple[int, ...] = (1, 2, 4, 8),
                 max_num_seqs: int | None = None, forecast: LengthHistogram | None = None,
                 switch_to: str | None = None, switch_at: float = 0.5, static_tick_s: float = 10.0,
                 slice_gpus: int | None = None, placement: str = "auto", step_model: str = DEFAULT_STEP_MODEL) -> None:
        src = "GenerationStage"
        if policy not in POLICIES:
            raise ConfigError(src, "policy", f"unknown policy {policy!r}", ", ".join(POLICIES))
        self.gpus = _check_gpus(gpus, gpu, net)
        self.n = slice_gpus or len(self.gpus)  # GPUs the engine simulates
        if self.n % gpu.gpus_per_node or len(self.gpus) % self.n or self.n < gpu.gpus_per_node:
            raise ConfigError(src, "slice_gpus", f"{slice_gpus} of {len(self.gpus)} generation GPUs",
                              f"whole servers dividing {len(self.gpus)}, or None for the whole cluster")
        self.copies = len(self.gpus) // self.n
        self.perf0 = step_model_class(step_model)(model, gpu, calibration)  # measured operator sums by default
        self.instance: InstanceConfig | None = None
        if instance is not None:
            self.instance = parse_config(instance)
            if self.instance.gpus > self.n or not self.perf0.fits(self.instance):
                raise ConfigError(src, "instance", f"{model.name} does not fit {self.instance.name} on "
                                  f"{len(self.gpus)} {gpu.name} GPUs", "a configuration that holds the weights "
                                  "and fits the generation GPUs")
        elif policy in ("static", "two-phase"):
            raise ConfigError(src, "instance", f"policy {policy!r} needs an instance configuration",
                              "e.g. instance='tp8' or 'afd24:16-tp8'")
        if placement not in PLACEMENTS:
            raise ConfigError(src, "placement", f"unknown placement {placement!r}", ", ".join(PLACEMENTS))
        self.placement = placement
        self._placed: dict[str, str] = {}  # configuration -> "aligned" / "packed" (auto's choices)
        self._placement_probe: dict[str, dict[str, float]] = {}  # configuration -> each what-if's seconds
        self.switch_to: InstanceConfig | None = None
        if policy == "two-phase":
            if switch_to is None or not 0.0 <= switch_at <= 1.0:
                raise ConfigError(src, "switch_to", f"two-phase needs switch_to and 0 <= switch_at <= 1, got "
                                  f"{switch_to!r} at {switch_at!r}", "e.g. switch_to='tp8', switch_at=0.5")
            self.switch_to = parse_config(switch_to)
            if not self.perf0.fits(self.switch_to) or self.switch_to.gpus > self.n:
                raise ConfigError(src, "switch_to", f"{model.name} does not fit {self.switch_to.name}",
                                  "a configuration that holds the weights")
        self.switch_at, self.static_tick_s = switch_at, static_tick_s
        self.policy, self.job, self.driver, self.net = policy, job, driver, net
        self.capabilities = KV_TRANSFER if kv_transfer else EngineCapabilities()
        self.scheduler = scheduler or SIM_SCHEDULER
        self.sweep_tps, self.max_num_seqs = tuple(sweep_tps), max_num_seqs
        fixed_s = CostModel(self.perf0).switch_fixed_s
        self.seam = FabricSeam(net, self.gpus, self.perf0, driver, job=job,
                               nominal_batch=max_num_seqs or self.perf0.cal.max_num_seqs, boundary_pause_s=fixed_s,
                               copies=self.copies)
        self.perf = self.perf0.with_network(self.seam)
        self.forecast = forecast
        topo = getattr(net.fabric, "topology", None)  # RFabric: instances stay inside PoDs (module note)
        self._domains = [topo.pod_of_gpu(g) for g in self.gpus[:self.n]] if topo is not None else None
        self._history: list[int] = []  # output lengths of the previous run: the next run's forecast
        self._clock_s = 0.0  # when the previous run ended (stage clock)

    # ------------------------------------------------------------------ run
    def run(self, trace: Trace, now_s: float = 0.0) -> StageResult:
        """Generate ``trace`` starting at ``now_s`` (stage clock); return the stage's result.

        Raises
        ------
        ConfigError
            If no configuration of the policy fits, or an instance has no path on the fabric.
        """
        if self.driver is not None and now_s < self._clock_s:
            raise ConfigError("GenerationStage.run", "now_s", f"{now_s} is before the previous run ended "
                              f"({self._clock_s}); the RFabric driver's timeline only moves forward",
                              "the stage clock of this run (non-decreasing)")
        wall = time.perf_counter()
        n, full = self.n, trace
        trace = slice_trace(trace, self.copies)
        if not trace.requests:
            raise ConfigError("GenerationStage", "slice_gpus", f"a 1/{self.copies} slice of {len(full.requests)} "
                              "requests is empty", "a larger slice, or a trace with more GRPO groups")
        self.seam.start(now_s)
        forecast, label = self._forecast(trace)
        sweep: dict[int, float] = {}
        if self.instance is not None and self.policy != "verl-to":
            start = self.instance
        else:
            tp, sweep = self._verl_to(trace)
            start = InstanceConfig("tp", tp=tp)
        self.seam.start(now_s)
        pp, rb = _FLAGS[self.policy]
        for config in (start, self.switch_to) if self.policy == "two-phase" else (start,):
            self._place(trace, config)
        first = self._layout(start)
        if self.policy == "two-phase":
            report, engine = self._two_phase(trace, first, self._layout(self.switch_to))
        else:
            report, engine = self._step(trace, first, pp, rb, forecast if pp or rb else None)
        self._history = [f.output_tokens for f in report.finished]
        self._clock_s = now_s + report.makespan_s
        result = self._result(report, engine, first, label, sweep, time.perf_counter() - wall)
        if self.copies == 1:
            return result
        scale = len(full.requests) / len(trace.requests)
        detail = {**result.detail, "slice": {"gpus": n, "copies": self.copies, "requests": len(trace.requests),
                                             "samples": result.samples, "tokens": result.tokens}}
        return replace(result, samples=round(result.samples * scale), tokens=result.tokens * scale, detail=detail)

    def _layout(self, config: InstanceConfig) -> Layout:
        """As many ``config`` instances as fit the engine's GPUs, placed as ``placement`` says."""
        if self._domains is None:
            return homogeneous(config, self.n)
        how = self._placed.get(config.name, "aligned" if self.placement == "auto" else self.placement)
        return aligned(config, self._domains) if how == "aligned" else homogeneous(config, self.n)

    def _place(self, trace: Trace, config: InstanceConfig) -> None:
        """``auto``: pick aligned or packed for ``config`` once, by a what-if static run of each."""
        if self._domains is None or self.placement != "auto" or config.name in self._placed:
            return
        both = {"aligned": aligned(config, self._domains), "packed": homogeneous(config, self.n)}
        if len(both["aligned"].instances) >= len(both["packed"].instances):
            self._placed[config.name] = "aligned"  # nothing idle: staying inside PoDs costs nothing
            return
        with self.seam.probing():
            probe = {how: self._step(trace, layout, False, False, None)[0].makespan_s for how, layout in both.items()}
        self._placed[config.name] = min(probe, key=probe.__getitem__)
        self._placement_probe[config.name] = probe

    def _engine(self, trace: Trace, layout: Layout) -> SimEngine:
        lengths = {q.request_id: q.output_tokens for q in trace.requests}
        engine = SimEngine(self.perf, layout, lengths, max_num_seqs=self.max_num_seqs, capabilities=self.capabilities)
        launch_contiguous(engine, trace_requests(trace))
        return engine

    def _step(self, trace: Trace, layout: Layout, pp: bool, rb: bool, forecast: LengthHistogram | None
              ) -> tuple[StepReport, SimEngine]:
        engine = self._engine(trace, layout)
        cfg = replace(self.scheduler, proactive=pp, reactive=rb)
        if not (pp or rb):
            cfg = replace(cfg, tick_s=max(cfg.tick_s, self.static_tick_s))
        sched = GenerationScheduler(engine, self.perf, CostModel.for_engine(self.perf, engine), forecast, cfg,
                                    job=self.job)
        return sched.run_step(), engine

    def _two_phase(self, trace: Trace, start: Layout, end: Layout) -> tuple[StepReport, SimEngine]:
        """Run ``start`` until ``switch_at`` of the requests finished, then ``end`` to the last request."""
        engine = self._engine(trace, start)
        tick, total = self.scheduler.tick_s, len(trace.requests)
        finished: list = []
        events: list[ReconfigEvent] = []
        curve = [(0.0, total)]
        while not engine.idle() and engine.now_s() < self.scheduler.max_step_s:
            if not events and len(finished) >= self.switch_at * total:
                snap = engine.snapshot()
                rep = engine.change_layout(end, local_placement(snap, end))
                events.append(ReconfigEvent(snap.time_s, start.describe(), end.describe(), 0.0, rep.switch_s,
                                            rep.migration.seconds, len(rep.migration.moved),
                                            dict(rep.migration.methods), 0.0))
            finished += engine.advance(tick)
            curve.append((engine.now_s(), total - len(finished)))
        makespan = finished[-1].finish_time_s if finished and engine.idle() else engine.now_s()
        unfinished = tuple(r.request_id for r in engine.snapshot().pending)
        return StepReport(makespan, tuple(finished), unfinished, tuple(events), 0, tuple(curve), (), 0), engine

    def _verl_to(self, trace: Trace) -> tuple[int, dict[int, float]]:
        """veRL-TO's TP: the best static TP of the sweep, each run as a what-if off the driver."""
        n = self.n
        fits = [t for t in self.sweep_tps if t <= n and n % t == 0 and self.perf0.fits(InstanceConfig("tp", tp=t))]
        if not fits:
            raise ConfigError("GenerationStage", "sweep_tps", f"no TP degree of {self.sweep_tps} fits "
                              f"{self.perf0.model.name} on {n} {self.perf0.gpu.name} GPUs", "more GPUs, or larger TP")
        if len(fits) == 1:
            return fits[0], {}
        with self.seam.probing():
            sweep = {t: self._step(trace, self._layout(InstanceConfig("tp", tp=t)), False, False, None)[0].makespan_s
                     for t in fits}
        return min(sweep, key=sweep.__getitem__), sweep

    def _forecast(self, trace: Trace) -> tuple[LengthHistogram, str]:
        if self.forecast is not None:
            return self.forecast, "given histogram"
        if self._history:
            return LengthHistogram.from_lengths(self._history, trace.max_tokens), "the previous run's lengths"
        draw = heavy_tailed_trace(max(1, len(trace.requests) // 8), 8, trace.max_tokens, seed=_PRIOR_SEED)
        return (LengthHistogram.from_lengths([q.output_tokens for q in draw.requests], trace.max_tokens),
                "prior: an independent draw of the Figure 3 shape")

    # ------------------------------------------------------------------ result
    def _result(self, report: StepReport, engine: SimEngine, start: Layout, forecast: str, sweep: dict[int, float],
                wall_s: float) -> StageResult:
        breakdown = phase_breakdown(report, start.describe(), CostModel(self.perf0).switch_fixed_s)
        deps, batches = self.seam.deployments, self.seam.batches
        breakdown["fabric_wait_s"] = sum(max(0.0, d.ready_s - d.t_s) for d in deps)
        breakdown["ocs_switching_s"] = sum(d.switching_s for d in deps)
        breakdown["kv_network_s"] = sum(b.makespan_s for b in batches if b.kind == "kv")
        committed = sum(d.action == "commit" for d in deps)
        announced = sum(d.action != "static" for d in deps)
        detail: dict[str, Any] = {
            "policy": self.policy, "gpus": len(self.gpus), "initial_layout": start.describe(),
            "final_layout": engine.layout.describe(), "forecast": forecast, "capabilities": self.capabilities.label,
            "unfinished": len(report.unfinished), "balancer_migrations": report.balancer_migrations,
            "preemptions": engine.preemptions,
            "reconfigurations": [{"t_s": e.time_s, "from": e.from_layout, "to": e.to_layout, "switch_s": e.switch_s,
                                  "migration_s": e.migration_s, "migrated": e.migrated, "methods": dict(e.methods)}
                                 for e in report.reconfigurations],
            "switches": [dict(x) for x in engine.switch_log],
            "deployments": [d.__dict__ for d in deps],
            "transfer_batches": [b.__dict__ for b in batches],
            "planner_solve_s": sum(report.plan_solve_s), "wall_s": wall_s,
        }
        if sweep:
            detail["verl_to_sweep_s"] = sweep
        if self._domains is not None:
            detail["placement"] = {"mode": self.placement, "chosen": dict(self._placed),
                                   "probe_s": {k: dict(v) for k, v in self._placement_probe.items()}}
        return StageResult("gen", report.makespan_s, breakdown, tokens=float(sum(f.output_tokens for f in report.finished)),
                           samples=len(report.finished), intents=announced, reconfigurations=committed, detail=detail)


def phase_breakdown(report: StepReport, initial: str, switch_fixed_s: float) -> dict[str, float]:
    """Return where a step's time went: decoding per layout, switching, reload, KV migration.

    A layout change at ``t`` stops the old instances; the new ones decode after their switch
    (``C^sw``: fixed switch-over plus the weight reload) and the KV migration that follows it, so
    ``decode/<layout>`` phases, ``switch_s`` and ``kv_migration_s`` add up to the step. Migrations
    that re-home requests within a layout (balancer, planner) overlap decoding:
    ``rebalance_migration_s``.

    >>> from orchestrl.compute_sched.scheduler import ReconfigEvent
    >>> ev = ReconfigEvent(100.0, "35x afd24:16-tp8", "175x tp8", 5.0, 2.0, 1.0, 10, {"transfer": 10}, 0.1)
    >>> rep = StepReport(150.0, (), (), (ev,), 0, (), (0.1,), 1)
    >>> b = phase_breakdown(rep, "35x afd24:16-tp8", 1.5)
    >>> b["decode/35x afd24:16-tp8"], b["switch_s"], b["reload_s"], b["kv_migration_s"], b["decode/175x tp8"]
    (100.0, 2.0, 0.5, 1.0, 47.0)
    """
    out: dict[str, float] = {"switch_s": 0.0, "reload_s": 0.0, "kv_migration_s": 0.0, "rebalance_migration_s": 0.0}
    t, cur = 0.0, initial
    for e in report.reconfigurations:
        if e.from_layout == e.to_layout and e.switch_s <= 0:
            out["rebalance_migration_s"] += e.migration_s
            continue
        key = f"decode/{cur}"
        out[key] = out.get(key, 0.0) + max(0.0, min(e.time_s, report.makespan_s) - t)
        out["switch_s"] += e.switch_s
        out["reload_s"] += max(0.0, e.switch_s - switch_fixed_s)
        out["kv_migration_s"] += e.migration_s
        t, cur = e.time_s + e.switch_s + e.migration_s, e.to_layout
    key = f"decode/{cur}"
    out[key] = out.get(key, 0.0) + max(0.0, report.makespan_s - t)
    return out


def slice_trace(trace: Trace, copies: int) -> Trace:
    """Return every ``copies``-th GRPO group of ``trace`` (groups in order of appearance; a request
    without a group is its own), the share one of ``copies`` identical slices of the cluster generates.

    >>> t = heavy_tailed_trace(8, 4, 2048, seed=0)
    >>> len(slice_trace(t, 4).requests), slice_trace(t, 1) is t
    (8, True)
    """
    if copies == 1:
        return trace
    order: dict[str, int] = {}
    for q in trace.requests:
        order.setdefault(q.group_id or q.request_id, len(order))
    kept = tuple(q for q in trace.requests if order[q.group_id or q.request_id] % copies == 0)
    return Trace(f"{trace.name} (1/{copies})", trace.max_tokens, kept)


def local_placement(snap: ClusterSnapshot, layout: Layout) -> dict[str, int]:
    """Re-home every pending request onto a new instance sharing GPUs with its old one, balancing KV.

    Requests go longest context first to the least-loaded (context tokens) of the new instances
    that overlap their old instance's GPUs (any instance if none does), so KV moves between nearby
    servers, as an AFD instance hands its requests to the TP instances on its own GPUs.

    Notes
    -----
    O(R log R + R T) for R requests and T new instances overlapping an old one.
    """
    owner = {g: k for k, inst in enumerate(layout.instances) for g in inst.gpu_ids}
    load = [0.0] * len(layout.instances)
    everyone = list(range(len(layout.instances)))
    out: dict[str, int] = {}
    for w in snap.workers:
        gpus = snap.layout.instances[w.instance].gpu_ids
        targets = sorted({owner[g] for g in gpus if g in owner}) or everyone
        for r in sorted((*w.running, *w.waiting), key=lambda r: (-r.context_tokens, r.request_id)):
            k = min(targets, key=load.__getitem__)
            out[r.request_id] = k
            load[k] += r.context_tokens
    return out


def _check_gpus(gpus: Sequence[int], gpu: GpuSpec, net: NetworkSim) -> tuple[int, ...]:
    got = tuple(int(g) for g in gpus)
    per = gpu.gpus_per_node
    if not got or len(got) % per:
        raise ConfigError("GenerationStage", "gpus", f"{len(got)} GPUs", f"a positive multiple of {per} (whole servers)")
    if len(set(got)) != len(got) or min(got) < 0 or max(got) >= net.fabric.gpus:
        raise ConfigError("GenerationStage", "gpus", "repeats a GPU or names one outside the fabric",
                          f"distinct GPUs in 0..{net.fabric.gpus - 1}")
    return got
