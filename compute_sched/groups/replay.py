"""Trace-driven replay: jobs arrive, a policy places them, groups run, jobs finish (RollMux §7.4-§7.5).

Design note
-----------
Event-driven over arrivals and departures. Between two events every group's membership is fixed,
so its realised performance (:mod:`compute_sched.groups.perf`) gives each member a steady
iteration rate; a job owns a fixed amount of work (its trace duration divided by its realised solo
iteration time), so a slowed-down job lives longer and keeps paying for its nodes. Provisioning
cost, GPU counts, busy node-time and cross-PoD bytes are integrated over time.

A job meets its SLO when, in every group configuration it lived through, its worst-case
co-execution iteration time stayed within ``SLO x T_solo`` (§4.2: the guarantee must hold "even
under maximum load"); RollMux's admission check makes this hold by construction, the baselines'
placements are judged by the same schedule simulation. How realised iterations compare with the
job's realised solo iterations is reported as ``slo_attainment_realised`` and ``mean_slowdown``.
"""

from __future__ import annotations

import heapq
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

from compute_sched.groups.cluster import Cluster
from compute_sched.groups.config import GroupConfig
from compute_sched.groups.intra import GroupJob, group_jobs
from compute_sched.groups.model import JobSpec
from compute_sched.groups.nodes import CapacityError, NodeAllocator
from compute_sched.groups.perf import GroupPerf, planned_iteration_s, realised_performance, solo_realised_iteration_s
from compute_sched.groups.workload import ResponseModel

__all__ = ["JobOutcome", "GanttSnapshot", "ReplayResult", "replay"]

_EPS = 1e-9


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
    met_slo: bool  # worst_planned_s <= slo * solo_estimate_s
    slowdown: float  # mean_iteration_s / solo_realised_s
    rollout_pods: int  # PoDs its rollout nodes spanned at admission (0 without a topology)
    cross_pod_bytes_per_iteration: float  # PoD-boundary bytes its placement implies per iteration


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
    slo_attainment: float
    slo_attainment_realised: float
    mean_slowdown: float
    rollout_bubble: float | None  # idle share of provisioned rollout node-time (None: no rollout pool)
    train_bubble: float | None
    decision_ms_p50: float
    decision_ms_max: float
    cross_pod_tb: float  # bytes over PoD boundaries implied by the placements, whole replay
    mean_rollout_pods: float  # over jobs whose rollout nodes lie on a fabric topology
    strategies: dict[str, int] = field(default_factory=dict)
    outcomes: tuple[JobOutcome, ...] = ()
    gantt: GanttSnapshot | None = None

    def to_json(self, with_jobs: bool = False) -> dict:
        doc = {k: v for k, v in asdict(self).items() if k not in ("outcomes", "gantt")}
        if with_jobs:
            doc["outcomes"] = [asdict(o) for o in self.outcomes]
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
    >>> from compute_sched.groups.inter import RollMuxScheduler
    >>> from compute_sched.groups.workload import synthesize_jobs
    >>> cfg = GroupConfig()
    >>> r = replay(synthesize_jobs("mixed", 12, seed=3), RollMuxScheduler(cfg), cfg)
    >>> r.jobs, r.slo_attainment
    (12, 1.0)
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
                                   run.worst_planned_s <= run.job.slo_budget_s * (1 + 1e-6),
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
        slo_attainment_realised=sum(o.slowdown <= o.slo * (1 + 1e-6) for o in outcomes) / n if n else 1.0,
        mean_slowdown=sum(o.slowdown for o in outcomes) / n if n else 1.0,
        rollout_bubble=1.0 - acc["roll_busy"] / acc["roll_prov"] if acc["roll_prov"] > 0 else None,
        train_bubble=1.0 - acc["train_busy"] / acc["train_prov"] if acc["train_prov"] > 0 else None,
        decision_ms_p50=lat[len(lat) // 2], decision_ms_max=lat[-1], cross_pod_tb=acc["cross"] / 1e12,
        mean_rollout_pods=statistics.mean(pods) if (pods := [o.rollout_pods for o in outcomes if o.rollout_pods])
        else 0.0,
        strategies=dict(sorted(strategies.items())), outcomes=tuple(outcomes), gantt=gantt)
