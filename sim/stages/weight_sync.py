"""Weight-sync stage: the ``collectives`` planner's schedule replayed as flows on the network simulator.

Design note
-----------
A weight sync moves the new policy from the training GPUs to the generation GPUs. The stage plans
it with the project's own planner -- :func:`collectives.plan.plan_weight_sync` (OrchestrRL App. E:
Phase A cross-PoD seeding in waves under PoD-boundary budgets, Phase B intra-PoD trees) or the
flat veRL-style baseline :func:`collectives.baseline.plan_flat` -- and times the schedule's
transfers on a :class:`sim.network.NetworkSim`. Plans depend only on (model, both layouts,
fabric limits), take seconds at 2,048 GPUs, and are cached per process for every later iteration.

On RFabric the stage is the runtime of §5.3: it announces the schedule's weight-sync intent
(:func:`collectives.fabric_demand.weight_sync_intent`) to the real controller through
:class:`sim.network.RFabricDriver`, then reports ``weight-sync-begin``; the safe-window gate commits
the plan, the devices switch (Table 2 delay of the OCS technology), and the runtime holds the
broadcast until the circuits are up plus the gate's guard (a runtime that started earlier would
teach the gate windows shorter than it needs, and later plans would wait forever). Static fabrics
have no controller; MixNet gets the circuits it would set up for the stage's demand.

Two replays of a planned schedule:

* ``edges`` -- every schedule edge is a flow; Phase A waves wait for the previous wave and every
  tree edge starts one chunk after the edge that feeds it (:func:`sim.network.collectives.schedule_flows`).
  This is the exact fluid replay; its cost grows with edges x events, so it is used up to
  :data:`EDGE_REPLAY_LIMIT` edges (a 14B model on 256 + 256 GPUs already has 32,768 edges and takes
  ~100 s here).
* ``pipeline`` -- each Phase A wave is run as flows on the event loop (waves are small: at most the
  boundary budget of edges per PoD), Phase B is timed by its congestion bound on the actual fabric
  state (the most loaded link or NIC, from the simulator's own routing), and the two are composed
  the way the schedule pipelines them: ``max(sum of waves, Phase B) + pipeline tail`` (the planner's
  ``predicted_s`` formula with simulated terms). The bound is a lower bound on Phase B and exact
  whenever its bottleneck stays busy; ``tests/sim/test_weight_sync_stage.py`` checks the two replays
  agree where both run.

The flat baseline is replayed exactly: trainer 0 gathers the model, then every generator fetches a
full copy from it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestrl.collectives.baseline import plan_flat
from orchestrl.collectives.fabric_demand import links_from_topology, weight_sync_intent
from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout
from orchestrl.collectives.plan import DEFAULT_CHUNK_BYTES, plan_weight_sync
from orchestrl.collectives.schedule import Schedule
from orchestrl.compute_sched.hardware import ModelSpec
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.fabric.safe_window import CollectiveEvent, GateConfig
from orchestrl.sim.model_params import model_params
from orchestrl.sim.network.collectives import schedule_completion_s, schedule_flows
from orchestrl.sim.network.events import FlowSet
from orchestrl.sim.network.fabrics import MixNetFabric, mixnet_circuits
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.network.rfabric import RFabricFabric
from orchestrl.sim.network.state import NetState
from orchestrl.sim.stages.base import StageResult

__all__ = ["WeightSyncStage", "SYNC_METHODS", "REPLAY_MODES", "EDGE_REPLAY_LIMIT", "STATIC_POD_GPUS",
           "plan_schedule", "trainer_layout_for", "generator_layout_for", "fabric_pods", "clear_plan_cache"]

SYNC_METHODS = ("planned", "flat")
REPLAY_MODES = ("auto", "edges", "pipeline")
#: Largest planned schedule replayed edge by edge under ``replay="auto"``.
EDGE_REPLAY_LIMIT = 4096
#: PoD size the planner is given on fabrics without PoDs: 32 servers, as RFabric's and a 3-tier FT's.
STATIC_POD_GPUS = 256
_PLAN_CACHE: OrderedDict[tuple, tuple[Schedule, float]] = OrderedDict()
_PLAN_CACHE_SIZE = 32


def clear_plan_cache() -> None:
    """Forget every cached schedule (the next stage plans again)."""
    _PLAN_CACHE.clear()


def plan_schedule(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout,
                  links: FabricLinks, method: str = "planned", chunk_bytes: int = DEFAULT_CHUNK_BYTES
                  ) -> tuple[Schedule, float, bool]:
    """Return ``(schedule, planning seconds, cache hit)``, planning once per distinct input.

    Raises
    ------
    ConfigError
        For an unknown method (and whatever the planner refuses).
    """
    if method not in SYNC_METHODS:
        raise ConfigError("weight sync", "method", f"unknown method {method!r}", ", ".join(SYNC_METHODS))
    key = (tuple(params), trainer, generator, links, method, chunk_bytes)
    got = _PLAN_CACHE.get(key)
    if got is not None:
        _PLAN_CACHE.move_to_end(key)
        return got[0], got[1], True
    started = time.perf_counter()
    plan = plan_weight_sync if method == "planned" else plan_flat
    schedule = plan(params, trainer, generator, links, chunk_bytes=chunk_bytes)
    took = time.perf_counter() - started
    _PLAN_CACHE[key] = (schedule, took)
    while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
        _PLAN_CACHE.popitem(last=False)
    return schedule, took, False


def fabric_pods(net: NetworkSim) -> tuple[np.ndarray, FabricLinks]:
    """Return each GPU's PoD and the limits the planner schedules against on this fabric.

    RFabric: its topology's PoDs and usable boundary fibres (:func:`links_from_topology`). Other
    fabrics have no boundary budget; the planner gets PoDs of :data:`STATIC_POD_GPUS` GPUs with a
    budget of one concurrent boundary edge per GPU, and the flow replay shows what the wiring allows.
    """
    fab = net.fabric
    if isinstance(fab, RFabricFabric):
        topo = fab.topology
        return np.array([topo.pod_of_gpu(g) for g in range(fab.gpus)]), links_from_topology(topo)
    pod_gpus = min(STATIC_POD_GPUS, fab.gpus)
    return (np.arange(fab.gpus) // pod_gpus, FabricLinks(nic_bps=fab.config.link_bps, default_budget=pod_gpus))


def trainer_layout_for(layout: ParallelLayout | TrainerLayout, gpus: Sequence[int], pods: np.ndarray) -> TrainerLayout:
    """Return the planner's trainer layout: TP and PP as trained, CP and DP replicas alike (same weights)."""
    if isinstance(layout, TrainerLayout):
        return TrainerLayout(tp=layout.tp, pp=layout.pp, dp=layout.dp, pods=tuple(int(pods[g]) for g in gpus),
                             gpus=tuple(int(g) for g in gpus), order=layout.order)
    if layout.world_size != len(gpus):
        raise ConfigError("weight sync", "train_gpus", f"{len(gpus)} GPUs for a layout of {layout.world_size}",
                          "one GPU per trainer rank")
    out = TrainerLayout(tp=layout.tp, pp=layout.pp, dp=layout.dp * layout.cp, pods=tuple(int(pods[g]) for g in gpus),
                        gpus=tuple(int(g) for g in gpus), order=layout.order)
    # CP folds into DP only if no rank changes its TP or PP coordinate by it (true unless cp and dp are
    # split by another dimension in the rank order); check rather than assume.
    groups = parallel_groups(layout, list(range(layout.world_size)))
    tp_rank = {r: i for g in groups["tp"] for i, r in enumerate(g)}
    pp_rank = {r: i for g in groups["pp"] for i, r in enumerate(g)}
    if any(out.tp_rank(r) != tp_rank[r] or out.pp_rank(r) != pp_rank[r] for r in range(layout.world_size)):
        raise ConfigError("weight sync", "train.order", f"order {layout.order!r} separates cp from dp, which the "
                          "weight-sync planner's layout cannot express", "an order with cp next to dp, e.g. tp-cp-ep-dp-pp")
    return out


def generator_layout_for(layout: int | GeneratorLayout, gpus: Sequence[int], pods: np.ndarray) -> GeneratorLayout:
    """Return the planner's generator layout: engines of ``layout`` consecutive GPUs (TP), or as given."""
    if isinstance(layout, GeneratorLayout):
        return layout
    tp = int(layout)
    if tp < 1 or len(gpus) % tp:
        raise ConfigError("weight sync", "gen_tp", f"TP={tp} does not divide {len(gpus)} generation GPUs",
                          f"a divisor of {len(gpus)}")
    return GeneratorLayout(tuple(GeneratorRank(int(pods[g]), tp, i % tp, int(g)) for i, g in enumerate(gpus)))


@dataclass(frozen=True)
class _Timing:
    time_s: float
    breakdown_s: dict[str, float]
    detail: dict[str, object]


class WeightSyncStage:
    """Time one weight sync per call on the network simulator, through the controller on RFabric.

    Parameters
    ----------
    model : ModelSpec
        The policy (Table 3); its parameter list comes from :func:`sim.model_params.model_params`.
    train_layout : ParallelLayout or TrainerLayout
        How the trainer holds the weights (TP, PP; CP and DP ranks are replicas).
    train_gpus, gen_gpus : sequence of int
        Fabric GPUs of trainer ranks (Megatron rank order) and of generator ranks.
    gen_layout : int or GeneratorLayout
        TP degree of the generation engines at the step boundary, or an explicit layout.
    net : NetworkSim
    driver : RFabricDriver, optional
        RFabric's control loop; one is made if the fabric is RFabric and none is given.
    method : {"planned", "flat"}
    job : str
        Job name on the controller and gate.
    replay : {"auto", "edges", "pipeline"}
    hold_s : float
        Pause the runtime announces with ``weight-sync-begin``: how long it will hold the broadcast for
        circuits (default 600 s covers every Table 2 technology, robotic included).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model
    >>> from orchestrl.fabric.layout import ParallelLayout
    >>> net = NetworkSim("ft", gpus=32)
    >>> st = WeightSyncStage(load_model("Qwen2.5-14B"), ParallelLayout(tp=8, dp=2), range(16), 8, range(16, 32), net)
    >>> r = st.run(0.0)
    >>> r.stage, 0.05 < r.time_s < 1.0, r.detail["method"]
    ('weight-sync', True, 'planned')
    """

    def __init__(self, model: ModelSpec, train_layout: ParallelLayout | TrainerLayout, train_gpus: Sequence[int],
                 gen_layout: int | GeneratorLayout, gen_gpus: Sequence[int], net: NetworkSim,
                 driver: RFabricDriver | None = None, *, method: str = "planned", job: str = "rl-job",
                 replay: str = "auto", hold_s: float = 600.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        if method not in SYNC_METHODS:
            raise ConfigError("weight sync", "method", f"unknown method {method!r}", ", ".join(SYNC_METHODS))
        if replay not in REPLAY_MODES:
            raise ConfigError("weight sync", "replay", f"unknown replay {replay!r}", ", ".join(REPLAY_MODES))
        train_gpus, gen_gpus = [int(g) for g in train_gpus], [int(g) for g in gen_gpus]
        if set(train_gpus) & set(gen_gpus):
            raise ConfigError("weight sync", "gen_gpus", "shares GPUs with train_gpus", "disjoint GPU sets")
        self.model, self.net, self.method, self.job = model, net, method, job
        self.replay, self.hold_s = replay, float(hold_s)
        self.rfabric = isinstance(net.fabric, RFabricFabric)
        self.driver = driver if driver is not None or not self.rfabric else RFabricDriver(net.fabric)
        pods, self.links = fabric_pods(net)
        pp = train_layout.pp
        self.params = model_params(model, pp=pp)
        self.trainer = trainer_layout_for(train_layout, train_gpus, pods)
        self.generator = generator_layout_for(gen_layout, gen_gpus, pods)
        self.chunk_bytes = chunk_bytes
        self.gpu_of_rank = train_gpus + [r.gpu for r in self.generator.ranks]
        self._schedule: Schedule | None = None
        self._timings: dict[tuple, _Timing] = {}
        self._edge_arrays: tuple[Schedule, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._mixnet: tuple | None = None
        self._intent: tuple | None = None  # (schedule, its weight-sync intent)

    # ------------------------------------------------------------------ plan
    @property
    def schedule(self) -> Schedule:
        """The schedule (planned on first use, then cached per layout for the whole process)."""
        if self._schedule is None:
            self._schedule, self.plan_s, self.plan_cached = plan_schedule(
                self.params, self.trainer, self.generator, self.links, self.method, self.chunk_bytes)
        return self._schedule

    def replay_mode(self) -> str:
        """The replay a run uses: ``edges`` up to :data:`EDGE_REPLAY_LIMIT` edges under ``auto``."""
        if self.method == "flat":
            return "edges"
        if self.replay != "auto":
            return self.replay
        return "edges" if len(self.schedule.edges) <= EDGE_REPLAY_LIMIT else "pipeline"

    # ------------------------------------------------------------------ run
    def run(self, now_s: float = 0.0) -> StageResult:
        """Return the weight sync that starts at ``now_s`` (weights ready on every trainer)."""
        sched = self.schedule
        plan_s = 0.0 if self.plan_cached else self.plan_s
        self.plan_cached = True  # later runs of this stage reuse the plan
        decision, hold, reconf = None, 0.0, 0
        if self.rfabric:
            decision, hold, timeline = self._through_controller(sched, now_s)
            reconf = int(decision.action == "commit")
        else:
            timeline = [(0.0, self._static_state(sched))]
        # the pipeline replay reads only the state the broadcast starts on (every circuit up): keying it by
        # the states before it too missed the cache whenever the generation stage left other circuits
        kind = self._replay_kind()
        reads = timeline[-1:] if kind == "pipeline" else timeline
        key = (kind, hold, tuple((t, st.signature) for t, st in reads))
        cached = key in self._timings
        if not cached:
            self._timings[key] = self._replay(sched, timeline, hold)
        timing = self._timings[key]
        if self.rfabric:  # the broadcast as the gate sees it: it starts once the circuits are up
            end = now_s + timing.time_s if np.isfinite(timing.time_s) else now_s + hold
            for kind, t in (("start", now_s + hold), ("end", end)):
                self.driver.observe(self.job, CollectiveEvent(kind, t, "weight-sync", "broadcast", "weight-sync"))
        detail = dict(timing.detail, plan_s=plan_s, timing_cached=cached, predicted_s=sched.predicted_s,
                      model_bytes=sched.model_bytes, strategy=sched.strategy, method=self.method)
        if decision is not None:
            detail.update(decision=decision.action, reason=decision.reason)
        return StageResult("weight-sync", float(timing.time_s), dict(timing.breakdown_s),
                           tokens=0.0, samples=0, intents=int(self.rfabric), reconfigurations=reconf, detail=detail)

    def _through_controller(self, sched: Schedule, now_s: float):
        """Announce the intent, mark the broadcast, and return (decision, hold, timeline from now)."""
        drv = self.driver
        if self._intent is None or self._intent[0] is not sched:
            # one intent object per schedule: every iteration announces the same intent, and the driver
            # remembers its materialisation per intent object (building it is ~3 s at 2,048 GPUs)
            t = self.trainer.world_size
            self._intent = (sched, weight_sync_intent(sched, self.job, trainer_gpus=self.gpu_of_rank[:t],
                                                      generator_gpus=self.gpu_of_rank[t:]))
        intent = self._intent[1]
        decision = drv.announce(intent, now_s)
        settled = drv.observe(self.job, CollectiveEvent("weight-sync-begin", now_s, window_hint_s=self.hold_s))
        if settled:
            decision = settled[-1]
        hold = 0.0
        if decision.action == "commit" and decision.change is not None:
            guard = (drv.gate_config or GateConfig()).guard_s(decision.change.switching_s)
            hold = decision.change.end_s - now_s + guard
        timeline = [(ts - now_s, st) for ts, st in drv.timeline(now_s)]
        return decision, hold, timeline

    def _static_state(self, sched: Schedule) -> NetState:
        fab = self.net.fabric
        if isinstance(fab, MixNetFabric):  # MixNet sets up its regional circuits for the stage's demand
            if self._mixnet is None:
                src, dst, size = self._edges(sched)
                pairs: dict[tuple[int, int], float] = {}
                for a, b, v in zip(src.tolist(), dst.tolist(), size.tolist()):
                    pairs[(a, b)] = pairs.get((a, b), 0.0) + v
                self._mixnet = mixnet_circuits(fab, pairs, self.net.failures)
            return fab.with_circuits(self._mixnet, self.net.failures)
        return fab.state(self.net.failures)

    # ------------------------------------------------------------------ replays
    def _edges(self, sched: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source GPU, destination GPU, bytes) of every edge of ``sched``, read-only, built once per schedule."""
        if self._edge_arrays is None or self._edge_arrays[0] is not sched:
            gpu = np.asarray(self.gpu_of_rank, dtype=np.int64)
            nbytes = np.array([b.nbytes for b in sched.blocks], dtype=np.float64)
            e = sched.edges
            arrays = (gpu[[x.src for x in e]], gpu[[x.dst for x in e]], nbytes[[x.block for x in e]])
            for a in arrays:
                a.setflags(write=False)
            self._edge_arrays = (sched, arrays)
        return self._edge_arrays[1]

    def _replay_kind(self) -> str:
        """The replay :meth:`_replay` runs: ``flat`` (the flat method), else the replay mode (edges or pipeline)."""
        return "flat" if self.method == "flat" else self.replay_mode()

    def _replay(self, sched: Schedule, timeline: list[tuple[float, NetState]], hold: float) -> _Timing:
        kind = self._replay_kind()
        started = time.perf_counter()
        replay = {"flat": self._replay_flat, "edges": self._replay_edges}.get(kind, self._replay_pipeline)
        timing = replay(sched, timeline, hold)
        timing.detail.update(replay=self.replay_mode(), edges=len(sched.edges), waves=len(sched.waves),
                             replay_s=time.perf_counter() - started)
        return timing

    def _replay_edges(self, sched: Schedule, timeline, hold: float) -> _Timing:
        link_bps = self.net.fabric.config.link_bps
        flows, feeder = schedule_flows(sched, self.gpu_of_rank, link_bps)
        flows = FlowSet(flows.src, flows.dst, flows.size_bytes, np.full(len(flows), hold), flows.deps)
        res = self.net.time_flows(flows, timeline)
        done = schedule_completion_s(res.finish_s, feeder, sched.chunk_bytes * 8 / link_bps)
        wave = np.array([e.wave for e in sched.edges])
        phase_a = float(res.finish_s[wave >= 0].max() - hold) if (wave >= 0).any() else 0.0
        return _Timing(done, {"reconfiguration": hold, "phase_a": phase_a, "transfer": done - hold},
                       {"events": res.events, "unfinished": int(res.unfinished.sum())})

    def _replay_flat(self, sched: Schedule, timeline, hold: float) -> _Timing:
        src, dst, size = self._edges(sched)
        gather = np.array([e.phase == "gather" for e in sched.edges])
        t, events, parts = hold, 0, {}
        for name, mask in (("gather", gather), ("fetch", ~gather)):
            if mask.any():  # the fetch starts once trainer 0 holds the whole model
                res = self.net.time_flows(FlowSet(src[mask], dst[mask], size[mask], np.full(int(mask.sum()), t)),
                                          timeline)
                end = float(res.finish_s.max())  # absolute: makespan_s counts from the first start
                parts[name] = end - t
                t, events = end, events + res.events
        return _Timing(t, {"reconfiguration": hold, **parts}, {"events": events})

    def _replay_pipeline(self, sched: Schedule, timeline, hold: float) -> _Timing:
        state = timeline[-1][1]  # every circuit of the plan is up by the time the broadcast starts
        src, dst, size = self._edges(sched)
        wave = np.array([e.wave for e in sched.edges])
        waves_s, events = [], 0
        for w in sorted(set(wave[wave >= 0].tolist())):
            m = wave == w
            res = self.net.time_flows(FlowSet(src[m], dst[m], size[m], np.zeros(int(m.sum()))), [(0.0, state)])
            waves_s.append(res.makespan_s)
            events += res.events
        tree = np.array([e.phase == "B" for e in sched.edges])
        phase_b, lat_b = _congestion_s(state, src[tree], dst[tree], size[tree])
        joint, _ = _congestion_s(state, src, dst, size)
        transfer = max(sum(waves_s), phase_b + lat_b, joint) + sched.predicted_tail_s
        return _Timing(hold + transfer, {"reconfiguration": hold, "phase_a": sum(waves_s), "phase_b": phase_b,
                                         "tail": sched.predicted_tail_s, "transfer": transfer},
                       {"events": events, "congestion_bound_s": joint})


def _congestion_s(state: NetState, src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> tuple[float, float]:
    """Return (bytes on the most loaded bundle / its capacity, largest path latency) of concurrent transfers.

    Transfers between the same GPUs are merged first (they share every bundle). No schedule can move
    these bytes faster over the state's routes, so this is a lower bound on their completion.

    Notes
    -----
    O(P + nnz) for P distinct GPU pairs: one incidence build (routes cached per class) and two sparse
    products.
    """
    if len(src) == 0:
        return 0.0, 0.0
    n = state.fabric.gpus
    key = src * n + dst
    uniq, inv = np.unique(key, return_inverse=True)
    vol = np.bincount(inv, weights=size)
    inc = state.incidence(uniq // n, uniq % n)
    if not inc.routable.all():
        return float("inf"), float("inf")
    k = inc.prof.shape[0]
    has = inc.cls >= 0
    per_class = np.bincount(inc.cls[has], weights=vol[has], minlength=k) if k else np.zeros(0)
    load = inc.own.T @ vol + (inc.prof.T @ per_class if k else 0.0)
    load = np.asarray(load, dtype=np.float64).ravel()
    cap = np.asarray(state.capacity_bps, dtype=np.float64)
    used = load > 0
    if (cap[used] <= 0).any():  # a route crosses a dead bundle: nothing gets through
        return float("inf"), float("inf")
    return float((load[used] * 8.0 / cap[used]).max(initial=0.0)), float(inc.latency_s.max())
