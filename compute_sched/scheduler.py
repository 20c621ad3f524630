"""Algorithm 1 of OrchestrRL: proactive planning and reactive balancing around any :class:`Engine`.

Every ``plan_interval_s`` the scheduler snapshots the cluster, solves Eq. 1 (planner) and, when
the gain beats cost plus margin, redeploys and announces the new generation intent; on every
``tick_s`` in between it runs the Eq. 5 balancer. Finished requests empty the step's histogram.
The loop only uses the engine protocol, so the same object drives the simulator and vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from orchestrl.compute_sched.balancer import BalancerConfig, plan_migrations, would_migrate
from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import Engine, FinishedRequest, Migration
from orchestrl.compute_sched.intents import IntentSink, generation_intent
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.planner import PlannerConfig, plan_layout
from orchestrl.compute_sched.workload import LengthHistogram, StepWorkload
from orchestrl.fabric.errors import ConfigError

__all__ = ["SchedulerConfig", "ReconfigEvent", "StepReport", "GenerationScheduler"]


@dataclass(frozen=True)
class SchedulerConfig:
    """Which parts of Algorithm 1 run, and how often."""

    proactive: bool = True  # event 1: planner
    reactive: bool = True  # event 2: balancer
    plan_interval_s: float = 30.0
    tick_s: float = 2.0
    reconfig_cooldown_s: float = 60.0  # no new layout this soon after the last one (against flip-flopping
    # on estimate noise: each change pays C^sw + C^mig for real)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    stop_after_finished: int | None = None  # partial rollout: end the step once this many finished
    max_step_s: float = 36_000.0  # safety bound on one step


@dataclass(frozen=True)
class ReconfigEvent:
    time_s: float
    from_layout: str
    to_layout: str
    predicted_gain_s: float  # Obj_cur - Obj_new
    switch_s: float
    migration_s: float
    migrated: int
    methods: Mapping[str, int]
    solve_s: float


@dataclass(frozen=True)
class StepReport:
    """What one generation step did."""

    makespan_s: float
    finished: tuple[FinishedRequest, ...]
    unfinished: tuple[str, ...]  # truncated (partial rollout) or left when the safety bound hit
    reconfigurations: tuple[ReconfigEvent, ...]
    balancer_migrations: int
    remaining_curve: tuple[tuple[float, int], ...]  # (time, pending requests), Figure 11
    plan_solve_s: tuple[float, ...]
    intents: int


class GenerationScheduler:
    """Drive one generation step on ``engine`` under Algorithm 1.

    Parameters
    ----------
    costs : CostModel
        Build it with :meth:`CostModel.for_engine`; one that prices KV transfer the engine cannot do
        is refused (:class:`~fabric.errors.ConfigError`).
    forecast : LengthHistogram or None
        The step's forecast remaining-workload histogram (None: requests may run to the cap).
    exact_lengths : mapping, optional
        True output lengths (the clairvoyant planner-exact run): the planner then sees exact remaining lengths.
    sink : IntentSink, optional
        Receives a generation intent after every layout change.
    """

    def __init__(self, engine: Engine, perf: PerfModel, costs: CostModel, forecast: LengthHistogram | None,
                 config: SchedulerConfig | None = None, *, exact_lengths: Mapping[str, int] | None = None,
                 sink: IntentSink | None = None, job: str = "gen", global_gpus: Sequence[int] | None = None) -> None:
        if costs.capabilities.kv_transfer and not engine.capabilities.kv_transfer:
            raise ConfigError("GenerationScheduler", "costs.capabilities",
                              f"the cost model prices KV transfer ({costs.capabilities.label}) but the engine can "
                              f"only recompute ({engine.capabilities.label})", "CostModel.for_engine(perf, engine)")
        self.engine, self.perf, self.costs = engine, perf, costs
        self.cfg = config or SchedulerConfig()
        self.workload = StepWorkload(forecast) if forecast is not None else None
        self.exact = dict(exact_lengths) if exact_lengths is not None else None
        self.sink, self.job = sink, job
        self.global_gpus = global_gpus
        self._placed_at: dict[str, float] = {}  # request -> when it was last placed (the balancer's hysteresis)

    def _announce(self, layout, pending: int, context: float) -> None:
        if self.sink is None:
            return
        per = max(1.0, pending / max(1, len(layout.instances)))
        gpus = self.global_gpus if self.global_gpus is not None else range(layout.total_gpus)
        doc = generation_intent(layout, self.perf, job=self.job, global_gpus=gpus, batch_per_instance=per,
                                context_tokens=per * max(1.0, context), period_s=self.cfg.plan_interval_s)
        self.sink.announce(doc, self.engine.now_s())

    def _plan(self, events: list[ReconfigEvent], solves: list[float]) -> None:
        snap = self.engine.snapshot()
        exact = None
        if self.exact is not None:
            exact = {r.request_id: max(1, self.exact[r.request_id] - r.generated_tokens) for r in snap.pending}
        first = not any(e.from_layout != e.to_layout for e in events)
        plan = plan_layout(snap, self.perf, self.costs, self.workload, self.cfg.planner, exact_remaining=exact,
                           first_change=first)
        solves.append(plan.solve_s)
        if not plan.reconfigure:
            return
        if plan.layout == snap.layout:  # same instances, requests re-homed: migrations, no switch
            where = snap.instance_of()
            moves = [Migration(r, where[r], k) for r, k in plan.placement.items() if where.get(r, k) != k]
            mig = self.engine.migrate(moves)
            self._placed_at.update((r, snap.time_s) for r in mig.moved)
            events.append(ReconfigEvent(snap.time_s, snap.layout.describe(), plan.layout.describe(),
                                        plan.current_s - plan.predicted_s, 0.0, mig.seconds, len(mig.moved),
                                        dict(mig.methods), plan.solve_s))
            return
        rep = self.engine.change_layout(plan.layout, plan.placement)
        # the planner just placed every pending request: the balancer leaves the running ones there for a while
        self._placed_at.update((r.request_id, snap.time_s) for r in snap.pending)
        events.append(ReconfigEvent(snap.time_s, snap.layout.describe(), plan.layout.describe(),
                                    plan.current_s - plan.predicted_s, rep.switch_s, rep.migration.seconds,
                                    len(rep.migration.moved), dict(rep.migration.methods), plan.solve_s))
        pending = snap.pending
        mean_ctx = sum(r.context_tokens for r in pending) / max(1, len(pending))
        self._announce(plan.layout, len(pending), mean_ctx)

    def run_step(self) -> StepReport:
        """Run until every request finished (or the partial-rollout quota is met); return the report."""
        cfg, eng = self.cfg, self.engine
        events: list[ReconfigEvent] = []
        solves: list[float] = []
        finished: list[FinishedRequest] = []
        curve = [(eng.now_s(), _pending(eng))]
        moves = 0
        last_moved = self._placed_at = {}  # request -> when the balancer or the planner last placed it
        next_plan = eng.now_s()
        while not eng.idle() and eng.now_s() < cfg.max_step_s:
            if cfg.stop_after_finished is not None and len(finished) >= cfg.stop_after_finished:
                break
            switches = [e for e in events if e.from_layout != e.to_layout or e.switch_s > 0]
            cooling = bool(switches) and eng.now_s() < switches[-1].time_s + cfg.reconfig_cooldown_s
            if cfg.proactive and eng.now_s() >= next_plan - 1e-9 and not cooling:
                self._plan(events, solves)
                next_plan = eng.now_s() + cfg.plan_interval_s
            loads = getattr(eng, "worker_loads", None)  # an engine that reports counts spares idle ticks' snapshots
            if cfg.reactive and (loads is None or would_migrate(loads(), cfg.balancer)):
                mv = plan_migrations(eng.snapshot(), cfg.balancer, last_moved)
                if mv:
                    done_moves = eng.migrate(mv).moved
                    moves += len(done_moves)
                    last_moved.update((r, eng.now_s()) for r in done_moves)
            done = eng.advance(cfg.tick_s)
            for f in done:
                if self.workload is not None:
                    self.workload.observe_finished(f.output_tokens)
            finished += done
            curve.append((eng.now_s(), _pending(eng)))
        quota = cfg.stop_after_finished
        carried: list[str] = []
        if quota is not None and len(finished) >= quota:  # the step ends at the quota-th finish
            carried = [f.request_id for f in finished[quota:]]
            finished = finished[:quota]
            end = finished[-1].finish_time_s
        elif eng.idle() and finished:
            end = finished[-1].finish_time_s
        else:
            end = eng.now_s()
        unfinished = tuple(r.request_id for r in eng.snapshot().pending) + tuple(carried)
        curve = [(t, n) for t, n in curve if t <= end + cfg.tick_s]
        return StepReport(end, tuple(finished), unfinished, tuple(events), moves, tuple(curve), tuple(solves),
                          len(events) if self.sink is not None else 0)


def _pending(engine: Engine) -> int:
    """Pending requests: the engine's own count where it keeps one (a snapshot copies every request)."""
    count = getattr(engine, "pending_count", None)
    return count() if count is not None else len(engine.snapshot().pending)
