"""Intra-group scheduler (RollMux §4.3): the round-robin meta-iteration and long-tail migration.

Design note
-----------
Each rollout node and the training pool keep a FIFO queue whose order is the group's round-robin
order: in every meta-iteration each member runs exactly one rollout and one training phase. A phase
starts when its job's previous phase is done *and* it reaches the head of the queue of every
resource it needs (a rollout needs all its pinned nodes at once). Because every queue follows the
same cyclic order, the start times obey a max-plus recurrence that is evaluated in that order,
so the schedule is computed in one pass with no deadlock.

Long-tail migration: when a rollout becomes tail-bound (``tail_threshold`` of its responses done),
the remaining responses are consolidated onto ``tail_capacity_fraction`` of its GPUs; the next
phase in the node's queue starts on the freed share (after ``migration_s``) and runs at the reduced
rate until the tail drains. Planning never counts on it: the worst case has every response at the
maximum length, so no phase ever becomes tail-bound early.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.model import Group
from orchestrl.fabric.errors import ConfigError

_PLAN_CAP = 400  # worst-case iterations simulated at most while looking for the repeating state

__all__ = ["GroupJob", "Segment", "GroupSchedule", "round_robin", "group_jobs", "worst_case_iteration_s"]


@dataclass(frozen=True)
class GroupJob:
    """What the intra-group scheduler needs of one member, in its group's placement."""

    job_id: str
    roll_nodes: tuple[int, ...]  # rollout node ids it is pinned to
    roll_s: float  # worst-case rollout time on those nodes
    train_s: float  # worst-case training time on the group's training pool (or on its pinned training nodes)
    train_nodes: tuple[int, ...] | None = None  # training node ids it is pinned to; None: the whole pool


@dataclass(frozen=True)
class Segment:
    """One executed phase, for Gantt charts (RollMux Figure 10)."""

    job_id: str
    pool: str  # "rollout" | "train"
    nodes: tuple[int, ...]  # rollout node ids; () for the training pool
    iteration: int
    start_s: float
    end_s: float
    tail_from_s: float | None = None  # when the rollout's tail was consolidated (migration), else None


@dataclass(frozen=True)
class GroupSchedule:
    """Steady-state outcome of a round-robin schedule."""

    iteration_s: Mapping[str, float]  # mean iteration time of each job over the measured window
    meta_iteration_s: float  # mean length of one meta-iteration
    rollout_util: float  # useful rollout node-time / provisioned rollout node-time
    train_util: float  # busy training node-time / provisioned training node-time
    segments: tuple[Segment, ...] = ()


def group_jobs(group: Group) -> list[GroupJob]:
    """Return the members of ``group`` in round-robin order with their worst-case in-group phase times."""
    return [GroupJob(j, group.placements[j], group.roll_time(group.jobs[j], group.placements[j]),
                     group.member_train_time(j), group.train_placements.get(j)) for j in group.order]


def round_robin(jobs: Sequence[GroupJob], n_rollout_nodes: int, config: GroupConfig, *,
                draws: np.ndarray | None = None, iterations: int | None = None,
                record: bool = False, n_train_nodes: int = 1, tail_rate: np.ndarray | None = None) -> GroupSchedule:
    """Return the round-robin schedule of ``jobs`` (in their order) on a group's pools.

    Parameters
    ----------
    jobs : sequence of GroupJob
        Members in round-robin order.
    n_rollout_nodes : int
        Rollout nodes the group holds (utilisation denominator; idle nodes count as bubbles).
    config : GroupConfig
        Warm-start time, tail threshold and capacity, migration time.
    draws : ndarray, shape (iterations, len(jobs), 3), optional
        Realised fractions of the worst case per iteration and job: rollout end, tail-bound point
        (<= rollout end), training. ``None`` plans the worst case (all ones, no tail).
    iterations : int, optional
        Meta-iterations to simulate when ``draws`` is None (default ``2 * len(jobs) + 6``).
    record : bool
        Keep every phase as a :class:`Segment`.
    n_train_nodes : int
        Training nodes the group holds (utilisation denominator). A member pinned to training nodes
        queues on each of them like a rollout on its rollout nodes; an unpinned one takes the pool.
    tail_rate : ndarray, shape (iterations, len(jobs)), optional
        The speed of each job's rollout, as a fraction of its speed on all its nodes, while the previous
        job's consolidated tail still holds part of them (with ``draws``; e.g. measured on an engine
        model, where a long-tailed rollout on fewer replicas loses less than their share). ``None``:
        ``1 - tail_capacity_fraction``, the freed share of the nodes.

    Returns
    -------
    GroupSchedule
        The common iteration time of the members (one meta-iteration), averaged over the second
        half of the simulated iterations.

    Notes
    -----
    O(I * sum of pinned nodes) for I iterations. The schedule is monotone: shorter phases never make
    any phase end later, so a worst-case plan bounds every realised schedule.

    Examples
    --------
    Two complementary jobs (RollMux Figure 1-bottom) interleave perfectly; the cycle is one job's
    solo time plus a warm start per phase:

    >>> cfg = GroupConfig(warm_start_s=0.0)
    >>> a, b = GroupJob("a", (0,), 100.0, 100.0), GroupJob("b", (0,), 100.0, 100.0)
    >>> s = round_robin([a, b], 1, cfg)
    >>> s.iteration_s["a"], s.rollout_util, s.train_util
    (200.0, 1.0, 1.0)
    """
    n = len(jobs)
    if n == 0:
        return GroupSchedule({}, 0.0, 0.0, 0.0)
    planned = draws is None
    if planned:  # worst case: run until the schedule repeats itself (exact period), or the cap
        its = iterations or _PLAN_CAP
        fracs = [[(1.0, 1.0, 1.0)] * n] * its
    else:
        its = draws.shape[0]
        fracs = draws.tolist()
    seen: dict[tuple, int] = {}
    cycle: tuple[int, int] | None = None  # (first, last) iteration of one exact repetition
    cap = 1.0 - config.tail_capacity_fraction
    if tail_rate is not None:
        tail_rate = np.asarray(tail_rate, dtype=float)
        if draws is None or tail_rate.shape != (its, n) or not np.all((tail_rate > 0) & (tail_rate <= 1)):
            raise ConfigError("round robin", "tail_rate", f"shape {tail_rate.shape}",
                              f"with draws, one speed in (0, 1] per iteration and job: shape ({its}, {n})")
    migrate = config.long_tail_migration
    warm = config.warm_start_s
    part_free: dict[int, float] = {}  # node -> when the next phase may start on it
    full_free: dict[int, float] = {}  # node -> when the last phase on it has fully drained
    last_on: dict[int, str] = {}
    pool = ("pool",)  # the training resource of an unpinned member: the whole pool at once
    t_free: dict = {}  # training resource -> when it is free
    t_last: dict = {}  # training resource -> last job on it
    ready = [0.0] * n
    ends = [[0.0] * its for _ in range(n)]
    roll_useful = [0.0] * its
    train_busy = [0.0] * its
    segments: list[Segment] = []
    for it in range(its):
        for k, job in enumerate(jobs):
            f_roll, f_tail, f_train = fracs[it][k]
            work = job.roll_s * f_roll
            tail_at = job.roll_s * min(f_tail, f_roll)
            nodes = job.roll_nodes
            start = ready[k]
            full = 0.0
            switch = False
            for node in nodes:
                start = max(start, part_free.get(node, 0.0))
                full = max(full, full_free.get(node, 0.0))
                switch = switch or last_on.get(node, job.job_id) != job.job_id
            if switch:
                start += warm
            if full > start:  # the previous job's consolidated tail still holds part of the nodes
                c = cap if tail_rate is None else float(tail_rate[it][k])
                end = start + work / c if start + work / c <= full else full + work - (full - start) * c
            else:
                end = start + work
            tail_abs = end - (work - tail_at)
            free_at = min(end, tail_abs + config.migration_s) if migrate and tail_at < work else end
            for node in nodes:
                part_free[node] = max(free_at, start)
                full_free[node] = max(end, full_free.get(node, 0.0))
                last_on[node] = job.job_id
            roll_useful[it] += len(nodes) * (tail_at + config.tail_capacity_fraction * (work - tail_at))
            t_res = tuple(("t", x) for x in job.train_nodes) if job.train_nodes else pool
            t_start = max([end] + [t_free.get(r, 0.0) for r in t_res])
            if any(t_last.get(r, job.job_id) != job.job_id for r in t_res):
                t_start += warm
            t_end = t_start + job.train_s * f_train
            for r in t_res:
                t_free[r], t_last[r] = t_end, job.job_id
            if not job.train_nodes:  # the pool: ("pool",) blocks all pinned nodes too (never mixed in practice)
                for r in list(t_free):
                    t_free[r] = max(t_free[r], t_end)
            train_busy[it] += job.train_s * f_train * (len(job.train_nodes) if job.train_nodes else n_train_nodes)
            ready[k] = t_end
            ends[k][it] = t_end
            if record:
                migrated = tail_abs if migrate and tail_at < work else None
                segments.append(Segment(job.job_id, "rollout", nodes, it, start, end, migrated))
                segments.append(Segment(job.job_id, "train", job.train_nodes or (), it, t_start, t_end))
        if planned and iterations is None:
            # The worst case is max-plus linear, so from some iteration on its state, taken relative
            # to the meta-iteration's end, repeats exactly; the period is then exact.
            top = max(ready)
            key = (tuple(round(top - ready[k], 6) for k in range(n)),
                   tuple(sorted((nd, round(top - v, 6)) for nd, v in part_free.items())),
                   tuple(sorted((nd, round(top - v, 6)) for nd, v in full_free.items())),
                   tuple(sorted((str(r), round(top - v, 6)) for r, v in t_free.items())))
            if key in seen:
                cycle = (seen[key], it)
                break
            seen[key] = it
    if cycle is not None:
        j, i = cycle
        done_j, done_i = max(ends[k][j] for k in range(n)), max(ends[k][i] for k in range(n))
        meta = (done_i - done_j) / (i - j)
        per_job = {job.job_id: meta for job in jobs}
        span = done_i - done_j
        r_util = sum(roll_useful[j + 1:i + 1]) / (max(1, n_rollout_nodes) * span) if span > 0 else 0.0
        t_util = sum(train_busy[j + 1:i + 1]) / (max(1, n_train_nodes) * span) if span > 0 else 0.0
        return GroupSchedule(per_job, meta, min(1.0, r_util), min(1.0, t_util), tuple(segments))
    # Every member runs once per meta-iteration, so all share one long-run period. Measure it on the
    # meta-iteration's completion (the training pool is sequential, so the last member ends it): the
    # other members can drift for many iterations before their slack is used up, the last one cannot.
    window = max(1, its // 2)
    first = its - 1 - window
    done = [max(ends[k][i] for k in range(n)) for i in range(its)]
    meta = (done[its - 1] - (done[first] if first >= 0 else 0.0)) / (window if first >= 0 else its)
    per_job = {job.job_id: meta for job in jobs}
    span = meta * window
    r_util = sum(roll_useful[its - window:]) / (max(1, n_rollout_nodes) * span) if span > 0 else 0.0
    t_util = sum(train_busy[its - window:]) / (max(1, n_train_nodes) * span) if span > 0 else 0.0
    return GroupSchedule(per_job, meta, min(1.0, r_util), min(1.0, t_util), tuple(segments))


def worst_case_iteration_s(jobs: Sequence[GroupJob], config: GroupConfig) -> dict[str, float]:
    """Return each member's conservative co-execution iteration time ``T^co`` (§4.2 SLO check)."""
    return dict(round_robin(jobs, 1, config).iteration_s)
