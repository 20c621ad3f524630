"""Trace-driven replay: jobs arrive, a policy places them, groups run, jobs finish (RollMux §7.4-§7.5).

Design note
-----------
Event-driven over arrivals and departures. Between two events every group's membership is fixed,
so its realised performance (:mod:`compute_sched.groups.perf`) gives each member a steady
iteration rate; a job owns a fixed amount of work (its trace duration divided by its realised solo
iteration time), so a slowed-down job lives longer and keeps paying for its nodes. Provisioning
cost, GPU counts, busy node-time and cross-PoD bytes are integrated over time.

A job meets its SLO when its realised slowdown, its mean iteration time over its whole life divided
by its mean realised iteration time alone on the nodes it asked for (the same phase draws), is
within its SLO: ``slo_attainment``. ``slo_attainment_planned`` is §4.2's worst-case check instead
(in every group configuration it lived through, the worst-case co-execution iteration stayed
within ``SLO x T_solo``); RollMux's admission enforces exactly that check, so for RollMux it is 1.0
by construction and is no evidence. Every realised miss is named in ``slo_misses`` with its cause.
"""

from __future__ import annotations

import heapq
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

from orchestrl.compute_sched.groups.cluster import Cluster
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, group_jobs
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.compute_sched.groups.nodes import CapacityError, NodeAllocator
from orchestrl.compute_sched.groups.perf import GroupPerf, planned_iteration_s, realised_performance, solo_realised_iteration_s
from orchestrl.compute_sched.groups.workload import ResponseModel

__all__ = ["JobOutcome", "SloMiss", "GanttSnapshot", "ReplayResult", "replay", "MISS_OVER_PLAN", "MISS_UNEVEN"]

_EPS = 1e-9
_TOL = 1e-6  # relative tolerance of SLO comparisons (float noise of the event arithmetic)
MISS_OVER_PLAN = "worst case over SLO"  # the placement broke the SLO even on paper (no or a different check)
MISS_UNEVEN = "uneven shrink"  # the worst case met the SLO; realised solo shrank more than co-execution


@dataclass(frozen=True)
class JobOutcome:
    """How one job fared."""

    job_id: str
    profile: str
    slo: float
    arrival_s: float
    finish_s: float
    iterations: float
    mean_iteration_s: float  # realised, under co-execution
    solo_estimate_s: float  # worst-case profile T_solo
    solo_realised_s: float  # realised alone on its own nodes
    worst_planned_s: float  # longest worst-case co-execution iteration time over its lifetime
    met_slo_planned: bool  # worst_planned_s <= slo * solo_estimate_s (§4.2's check, what admission enforces)
    slowdown: float  # mean_iteration_s / solo_realised_s
    rollout_pods: int  # PoDs its rollout nodes spanned at admission (0 without a topology)
    cross_pod_bytes_per_iteration: float  # PoD-boundary bytes its placement implies per iteration

    @property
    def met_slo(self) -> bool:
        """Whether the realised slowdown stayed within the SLO (the headline)."""
        return self.slowdown <= self.slo * (1 + _TOL)

    @property
    def planned_slowdown(self) -> float:
        """Worst-case co-execution over worst-case solo iteration time (what §4.2 checks)."""
        return self.worst_planned_s / self.solo_estimate_s


@dataclass(frozen=True)
class SloMiss:
    """A job whose realised slowdown exceeded its SLO, and why.

    ``realised slowdown = planned_slowdown * co_shrink / solo_shrink``: when the worst case met the
    SLO, a miss means the job's solo iteration shrank below its worst case more than its
    co-execution iteration did (rollouts end with their longest response, training follows the mean).
    """

    job_id: str
    profile: str
    slo: float
    slowdown: float  # realised
    planned_slowdown: float  # worst case
    solo_shrink: float  # realised solo iteration / worst-case solo iteration
    co_shrink: float  # realised mean co-execution iteration / longest worst-case co-execution iteration
    cause: str  # MISS_OVER_PLAN or MISS_UNEVEN

    @classmethod
    def of(cls, o: JobOutcome) -> "SloMiss":
        cause = MISS_UNEVEN if o.met_slo_planned else MISS_OVER_PLAN
        return cls(o.job_id, o.profile, o.slo, o.slowdown, o.planned_slowdown, o.solo_realised_s / o.solo_estimate_s,
                   o.mean_iteration_s / o.worst_planned_s if o.worst_planned_s > 0 else 1.0, cause)

    def describe(self) -> str:
        """Return one line naming the job, its slowdown against its SLO, and the cause."""
        head = f"{self.job_id} ({self.profile or '-'}) {self.slowdown:.2f}x > SLO {self.slo:.2f}x: "
        if self.cause == MISS_OVER_PLAN:
            return head + f"worst case {self.planned_slowdown:.2f}x already over it"
        return head + (f"worst case {self.planned_slowdown:.2f}x met it, but its solo run realised "
                       f"{self.solo_shrink:.0%} of its worst case and its co-execution {self.co_shrink:.0%}")


@dataclass(frozen=True)
class GanttSnapshot:
    """The largest group seen, kept to draw its schedule (RollMux Figure 10)."""

    members: tuple[GroupJob, ...]
    rollout_nodes: int
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class ReplayResult:
    """Totals of one replay; ``to_json`` is the CLI's and the benchmark's document."""

    policy: str
    jobs: int
    rejected: int
    horizon_h: float
    cost_usd_total: float
    cost_usd_per_h: float  # time-averaged provisioning cost
    peak_cost_usd_per_h: float
    peak_gpus_rollout: int
    peak_gpus_train: int
    slo_attainment: float  # realised: share of jobs whose realised slowdown stayed within their SLO
    slo_attainment_planned: float  # §4.2's worst-case check (what RollMux's admission enforces)
    mean_slowdown: float
    rollout_bubble: float | None  # idle share of provisioned rollout node-time (None: no rollout pool)
    train_bubble: float | None
    decision_ms_p50: float
    decision_ms_max: float
    cross_pod_tb: float  # bytes over PoD boundaries implied by the placements, whole replay
    mean_rollout_pods: float  # over jobs whose rollout nodes lie on a fabric topology
    strategies: dict[str, int] = field(default_factory=dict)
    slo_misses: tuple[SloMiss, ...] = ()  # every job whose realised slowdown exceeded its SLO
    outcomes: tuple[JobOutcome, ...] = ()
    gantt: GanttSnapshot | None = None

    def to_json(self, with_jobs: bool = False) -> dict:
        """Return the totals as a JSON-ready dict (``with_jobs``: every job's outcome too)."""
        doc = {k: v for k, v in asdict(self).items() if k not in ("outcomes", "gantt")}
        if with_jobs:
            doc["outcomes"] = [{**asdict(o), "met_slo": o.met_slo, "planned_slowdown": o.planned_slowdown}
                               for o in self.outcomes]
        return doc


@dataclass
class _Run:
    job: JobSpec
    iterations: float
    solo_real_s: float
    left: float
    iter_s: float = 0.0
    since: float = 0.0
    version: int = 0
    pods: int = 0
    cross_bytes: float = 0.0
    worst_planned_s: float = 0.0


def replay(jobs: Sequence[JobSpec], policy, config: GroupConfig, *, responses: ResponseModel = ResponseModel(),
           seed: int = 0, allocator: NodeAllocator | None = None) -> ReplayResult:
    """Replay ``jobs`` under ``policy`` and return the totals.

    Parameters
    ----------
    jobs : sequence of JobSpec
        With arrival times and solo durations (e.g. from :func:`~compute_sched.groups.workload.synthesize_jobs`).
    policy
        An object with ``name`` and ``place(job, cluster) -> Decision``, or with ``repartitions = True``
        and ``repartition(active_jobs, cluster)`` (the offline optimum).
    allocator : NodeAllocator, optional
        Pools, possibly backed by fabric topologies; unbounded pools by default.

    Examples
    --------
    >>> from orchestrl.compute_sched.groups.inter import RollMuxScheduler
    >>> from orchestrl.compute_sched.groups.workload import synthesize_jobs
    >>> cfg = GroupConfig()
    >>> r = replay(synthesize_jobs("mixed", 12, seed=3), RollMuxScheduler(cfg), cfg)
    >>> r.jobs, r.slo_attainment, r.slo_attainment_planned, r.slo_misses
    (12, 1.0, 1.0, ())
    """
    cluster = Cluster(config, allocator)
    pending = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
    runs: dict[str, _Run] = {}
    perf: dict[int, GroupPerf] = {}
    heap: list[tuple[float, int, str]] = []
    outcomes: list[JobOutcome] = []
    latencies: list[float] = []
    strategies: dict[str, int] = {}
    acc = dict(cost=0.0, roll_prov=0.0, roll_busy=0.0, train_prov=0.0, train_busy=0.0, cross=0.0)
    peaks = dict(cost=0.0, roll=0, train=0)
    rates = dict(cost=0.0, roll_prov=0.0, roll_busy=0.0, train_prov=0.0, train_busy=0.0, cross=0.0)
    gantt: GanttSnapshot | None = None
    rejected = 0
    now = pending[0].arrival_s if pending else 0.0
    start = now

    def refresh(gids: set[int]) -> None:
        nonlocal gantt
        for gid in gids:
            perf.pop(gid, None)
            group = cluster.groups.get(gid)
            if group is None:
                continue
            p = perf[gid] = realised_performance(group, config, responses, seed)
            planned = planned_iteration_s(group, config)
            for j in group.order:
                run = runs[j]
                run.worst_planned_s = max(run.worst_planned_s, planned[j])
                if run.iter_s > 0:
                    run.left -= (now - run.since) / run.iter_s
                run.left = max(run.left, 0.0)
                run.iter_s, run.since, run.version = p.iteration_s[j], now, run.version + 1
                heapq.heappush(heap, (now + run.left * run.iter_s, run.version, j))
            if group.mode == "rollmux" and (gantt is None or len(group.order) > len(gantt.job_ids)):
                gantt = GanttSnapshot(tuple(group_jobs(group)), len(group.rollout_nodes), tuple(group.order))
        rates["cost"] = cluster.cost_usd_per_h()
        rates["roll_prov"] = sum(len(g.rollout_nodes) for g in cluster.groups.values())
        rates["train_prov"] = sum(len(g.train_nodes) for g in cluster.groups.values())
        rates["roll_busy"] = sum(p.rollout_busy_nodes for p in perf.values())
        rates["train_busy"] = sum(p.train_busy_nodes for p in perf.values())
        rates["cross"] = sum(cluster.traffic(j).total_bytes / runs[j].iter_s for j in cluster.job_group)
        peaks["cost"] = max(peaks["cost"], rates["cost"])
        peaks["roll"] = max(peaks["roll"], cluster.gpus("rollout"))
        peaks["train"] = max(peaks["train"], cluster.gpus("train"))

    def advance(t: float) -> None:
        nonlocal now
        dt = t - now
        acc["cost"] += rates["cost"] * dt / 3600.0
        for k in ("roll_prov", "roll_busy", "train_prov", "train_busy", "cross"):
            acc[k] += rates[k] * dt
        now = t

    def changed_all() -> set[int]:
        return set(cluster.groups) | set(perf)

    i = 0
    while i < len(pending) or heap:
        next_dep = heap[0][0] if heap else float("inf")
        if i < len(pending) and pending[i].arrival_s <= next_dep:
            job = pending[i]
            i += 1
            advance(job.arrival_s)
            solo = solo_realised_iteration_s(job, config, responses, seed)
            runs[job.job_id] = _Run(job, job.duration_s / solo, solo, job.duration_s / solo)
            t0 = time.perf_counter()
            try:
                if getattr(policy, "repartitions", False):
                    policy.repartition([r.job for r in runs.values()], cluster)
                    gids = changed_all()
                    strategies["regroup"] = strategies.get("regroup", 0) + 1
                else:
                    decision = policy.place(job, cluster)
                    group = cluster.apply(job, decision)
                    gids = {group.gid}
                    strategies[decision.strategy] = strategies.get(decision.strategy, 0) + 1
            except CapacityError:
                del runs[job.job_id]
                rejected += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)
            traffic = cluster.traffic(job.job_id)
            runs[job.job_id].pods, runs[job.job_id].cross_bytes = traffic.rollout_pods, traffic.total_bytes
            refresh(gids)
            continue
        t, version, job_id = heapq.heappop(heap)
        run = runs.get(job_id)
        if run is None or run.version != version:
            continue
        advance(t)
        mean_it = (now - run.job.arrival_s) / run.iterations
        outcomes.append(JobOutcome(job_id, run.job.profile, run.job.slo, run.job.arrival_s, now, run.iterations,
                                   mean_it, run.job.t_solo_s, run.solo_real_s, run.worst_planned_s,
                                   run.worst_planned_s <= run.job.slo_budget_s * (1 + _TOL),
                                   mean_it / run.solo_real_s, run.pods, run.cross_bytes))
        del runs[job_id]
        gid = cluster.job_group[job_id]
        if getattr(policy, "repartitions", False):
            cluster.remove(job_id)
            before = changed_all()
            if runs:
                policy.repartition([r.job for r in runs.values()], cluster)
            refresh(before | changed_all())
        else:
            cluster.remove(job_id)
            refresh({gid})
    return _result(policy.name, outcomes, rejected, now - start, acc, peaks, latencies, strategies, gantt)


def _result(name, outcomes, rejected, horizon_s, acc, peaks, latencies, strategies, gantt) -> ReplayResult:
    n = len(outcomes)
    lat = sorted(latencies) or [0.0]
    horizon_h = horizon_s / 3600.0
    return ReplayResult(
        policy=name, jobs=n, rejected=rejected, horizon_h=horizon_h, cost_usd_total=acc["cost"],
        cost_usd_per_h=acc["cost"] / horizon_h if horizon_h > 0 else 0.0, peak_cost_usd_per_h=peaks["cost"],
        peak_gpus_rollout=peaks["roll"], peak_gpus_train=peaks["train"],
        slo_attainment=sum(o.met_slo for o in outcomes) / n if n else 1.0,
        slo_attainment_planned=sum(o.met_slo_planned for o in outcomes) / n if n else 1.0,
        mean_slowdown=sum(o.slowdown for o in outcomes) / n if n else 1.0,
        rollout_bubble=1.0 - acc["roll_busy"] / acc["roll_prov"] if acc["roll_prov"] > 0 else None,
        train_bubble=1.0 - acc["train_busy"] / acc["train_prov"] if acc["train_prov"] > 0 else None,
        decision_ms_p50=lat[len(lat) // 2], decision_ms_max=lat[-1], cross_pod_tb=acc["cross"] / 1e12,
        mean_rollout_pods=statistics.mean(pods) if (pods := [o.rollout_pods for o in outcomes if o.rollout_pods])
        else 0.0,
        strategies=dict(sorted(strategies.items())), slo_misses=tuple(SloMiss.of(o) for o in outcomes if not o.met_slo),
        outcomes=tuple(outcomes), gantt=gantt)
