"""Realised performance of a group under stochastic phase times, for the replay simulator.

Planning uses worst-case phase times; what a group actually achieves depends on the drawn response
lengths. This module runs the group's execution model with drawn phases (long-tail migration on)
and reports each member's mean iteration time and how busy the group's nodes are.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, group_jobs, round_robin, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import Group, JobSpec
from orchestrl.compute_sched.groups.workload import ResponseModel

__all__ = ["GroupPerf", "realised_performance", "planned_iteration_s", "solo_realised_iteration_s", "draws_for"]


@dataclass(frozen=True)
class GroupPerf:
    """Steady-state behaviour of a group while its membership stays the same."""

    iteration_s: Mapping[str, float]  # realised mean iteration time of each member
    rollout_busy_nodes: float  # rollout nodes doing useful work, time-averaged
    train_busy_nodes: float  # training nodes doing useful work, time-averaged


@lru_cache(maxsize=65536)
def _job_draws(job_id: str, seed: int, iterations: int, responses: ResponseModel, threshold: float) -> np.ndarray:
    # Keyed by job, not by group: a job's luck is the same wherever it runs, so placements differ
    # only by how they schedule it, and a one-job group reproduces the job's solo run exactly.
    rng = np.random.default_rng([seed, zlib.crc32(job_id.encode())])
    return responses.draw(rng, iterations, 1, threshold)[:, 0, :]


def draws_for(config: GroupConfig, responses: ResponseModel, job_ids: list[str], seed: int,
              iterations: int) -> np.ndarray:
    """Return realised phase fractions, shape (iterations, jobs, 3), the same for a job wherever it runs."""
    return np.stack([_job_draws(j, seed, iterations, responses, config.tail_threshold) for j in job_ids], axis=1)


def realised_performance(group: Group, config: GroupConfig, responses: ResponseModel, seed: int = 0,
                         iterations: int = 16) -> GroupPerf:
    """Return the realised performance of ``group`` in its sharing mode (deterministic for a seed)."""
    draws = draws_for(config, responses, list(group.order), seed, iterations)
    if group.mode == "rollmux":
        sched = round_robin(group_jobs(group), len(group.rollout_nodes), config, draws=draws,
                            n_train_nodes=len(group.train_nodes))
        return GroupPerf(dict(sched.iteration_s), sched.rollout_util * len(group.rollout_nodes),
                         sched.train_util * len(group.train_nodes))
    # the window round_robin measures on (the second half), so a job's solo and shared runs see the same luck
    mean = draws[iterations - max(1, iterations // 2):].mean(axis=0)  # (jobs, 3)
    f = config.tail_capacity_fraction
    members = group_jobs(group)
    inner = {}
    roll_busy = {}
    for k, m in enumerate(members):
        roll_real = m.roll_s * mean[k, 0]
        useful = m.roll_s * (mean[k, 1] + f * (mean[k, 0] - mean[k, 1]))
        train_real = m.train_s * mean[k, 2]
        inner[m.job_id] = (roll_real, useful, train_real)
        roll_busy[m.job_id] = len(m.roll_nodes)
    if group.mode == "colocated":  # one job; its rollout and training alternate on the same nodes
        (job_id, (roll_real, useful, train_real)), = inner.items()
        it = roll_real + train_real + 2 * config.warm_start_s  # offload/reload between the two engines
        return GroupPerf({job_id: it}, 0.0, len(group.train_nodes) * (useful + train_real) / it)
    # gavel: whole jobs take turns; shares scaled up from the SLO minimum to fill the time
    need = {j: (r + t) / group.jobs[j].slo_budget_s for j, (r, _, t) in inner.items()}
    total = sum(need.values())
    share = {j: need[j] / total for j in need}
    iteration = {j: (inner[j][0] + inner[j][2]) / share[j] for j in inner}
    r_busy = sum(share[j] * roll_busy[j] * inner[j][1] / (inner[j][0] + inner[j][2]) for j in inner)
    t_busy = sum(share[j] * len(group.train_nodes) * inner[j][2] / (inner[j][0] + inner[j][2]) for j in inner)
    return GroupPerf(iteration, r_busy, t_busy)


def planned_iteration_s(group: Group, config: GroupConfig) -> dict[str, float]:
    """Return each member's worst-case iteration time in ``group`` as it stands (what SLOs are judged on).

    Round-robin groups use the worst-case schedule; Gavel+ members get their SLO-minimum share scaled
    to fill the time; a co-located job runs its two phases back to back on its training nodes (its own
    phase switches are part of its solo execution and are not counted against it).
    """
    members = group_jobs(group)
    if group.mode == "rollmux":
        return worst_case_iteration_s(members, config)
    if group.mode == "colocated":
        return {m.job_id: m.roll_s + m.train_s for m in members}
    need = {m.job_id: (m.roll_s + m.train_s) / group.jobs[m.job_id].slo_budget_s for m in members}
    total = sum(need.values())
    return {m.job_id: (m.roll_s + m.train_s) * total / need[m.job_id] for m in members}


def solo_realised_iteration_s(job: JobSpec, config: GroupConfig, responses: ResponseModel, seed: int = 0,
                              iterations: int = 16) -> float:
    """Return ``job``'s realised mean iteration time alone on the nodes it asked for (Solo-D)."""
    draws = draws_for(config, responses, [job.job_id], seed, iterations)
    sched = round_robin([GroupJob(job.job_id, tuple(range(job.roll_nodes)), job.t_roll_s, job.t_train_s)],
                        job.roll_nodes, config, draws=draws)
    return sched.iteration_s[job.job_id]
