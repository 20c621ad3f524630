"""Baseline placement policies RollMux is compared against (§7.1, §7.5).

* RollMux as published (``rollmux-paper``): Algorithm 1 with §4.2's worst-case SLO check alone.
* Solo-D: every job on its own dedicated rollout and training nodes (standard disaggregation).
* Co-located (veRL): every phase of a job on its training (H800) nodes; no rollout pool.
* Gavel+: heterogeneity-aware job-level sharing; jobs of a group take turns as whole jobs, each
  with a time fraction just large enough for its SLO; phases of different jobs never interleave.
* Random: a random group that can accommodate the job (or a new one), random nodes in it.
* Greedy (Most-Idle): the group with the highest idle-time share, its most idle nodes.

Random and Greedy check only residency (memory, group size, enough nodes), not SLOs, as in §7.5.
Following §7.5's wording ("placed on random rollout and train nodes within this group") they pin a
job to as many rollout *and training* nodes of the group as it asks for, and never provision nodes
into an existing group; each pinned node runs its jobs in round-robin order like a rollout node.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

from orchestrl.compute_sched.groups.cluster import Cluster, Decision
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.inter import RollMuxScheduler, isolated_decision
from orchestrl.compute_sched.groups.intra import group_jobs, round_robin
from orchestrl.compute_sched.groups.model import Group, JobSpec
from orchestrl.compute_sched.groups.slo import RealisedSloCheck
from orchestrl.compute_sched.groups.workload import ResponseModel
from orchestrl.fabric.errors import ConfigError

__all__ = ["SoloPolicy", "ColocatedPolicy", "GavelPolicy", "RandomPolicy", "GreedyPolicy", "make_policy",
           "POLICIES", "gavel_min_shares", "idle_share"]

_EPS = 1e-9


class SoloPolicy:
    """Solo disaggregation: a new group per job, never shared."""

    name = "solo"

    def __init__(self, config: GroupConfig) -> None:
        self.config = config

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        return isolated_decision(job, cluster, (self.config.reference_rollout_gpu,))


class ColocatedPolicy:
    """veRL-style co-location: rollout and training time-share the job's own training nodes."""

    name = "colocated"

    def __init__(self, config: GroupConfig) -> None:
        self.config = config

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        cost = job.train_nodes * self.config.node_price_usd_per_h(self.config.train_gpu_type)
        return Decision(job.job_id, "isolated", None, (), None, 0, job.train_nodes, cost, {}, (), "colocated")


def _eligible(job: JobSpec, group: Group, config: GroupConfig) -> list[int]:
    """Reference-type rollout nodes of ``group`` that can also hold ``job``'s rollout state, least loaded first."""
    s = group.summary()
    return sorted((n for n, node in group.rollout_nodes.items() if node.gpu_type == config.reference_rollout_gpu
                   and s.node_mem_gb[n] + job.roll_mem_gb <= config.host_mem_gb + _EPS),
                  key=lambda n: (s.node_load_s[n], n))


def _accommodates(job: JobSpec, group: Group, config: GroupConfig, mode: str) -> list[int] | None:
    """Eligible nodes if ``group`` can hold ``job`` under the residency constraint, else None."""
    if group.mode != mode or len(group.order) >= config.max_group_size:
        return None
    if group.summary().train_mem_gb + group.train_mem_per_node(job) > config.host_mem_gb + _EPS:
        return None
    eligible = _eligible(job, group, config)
    return eligible if len(eligible) >= job.roll_nodes else None


def gavel_min_shares(group: Group) -> dict[str, float]:
    """Return the time fraction each member needs for its SLO when members take turns as whole jobs."""
    return {j: (group.roll_time(group.jobs[j], group.placements[j]) + group.train_time(group.jobs[j]))
            / group.jobs[j].slo_budget_s for j in group.order}


class GavelPolicy:
    """Gavel+: job-level time fractions on a shared pool pair; admits while the minimum shares sum to <= 1."""

    name = "gavel"

    def __init__(self, config: GroupConfig) -> None:
        self.config = config

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        best: tuple[float, Group, tuple[int, ...]] | None = None
        for group in cluster.groups.values():
            eligible = _accommodates(job, group, self.config, "gavel")
            if eligible is None:
                continue
            chosen = tuple(eligible[: job.roll_nodes])
            own = (group.roll_time(job, chosen) + group.train_time(job)) / job.slo_budget_s
            total = sum(gavel_min_shares(group).values()) + own
            if total <= 1.0 + _EPS and (best is None or total > best[0]):
                best = (total, group, chosen)
        if best is None:
            return isolated_decision(job, cluster, (self.config.reference_rollout_gpu,), mode="gavel")
        return Decision(job.job_id, "direct", best[1].gid, best[2], mode="gavel")


def _pinned_choices(job: JobSpec, group: Group, config: GroupConfig) -> tuple[list[int], list[int]] | None:
    """Nodes a Random/Greedy job could be pinned to in ``group``, least loaded first, or None if it does not fit.

    "A group that can accommodate it" (§7.5): room for one more member, and at least as many rollout
    nodes (``job.roll_nodes``) and training nodes (``job.train_nodes``) with host memory left for the
    job's resident state as the job asks for. SLOs are not checked; nothing is provisioned.
    """
    if group.mode != "rollmux" or len(group.order) >= config.max_group_size:
        return None
    roll = _eligible(job, group, config)
    if len(roll) < job.roll_nodes:
        return None
    loads = {n: sum(group.member_train_time(j) for j in group.order
                    if n in group.train_placements.get(j, group.train_nodes)) for n in group.train_nodes}
    train = sorted((n for n in group.train_nodes
                    if group.train_node_mem_gb(n) + job.train_mem_gb <= config.host_mem_gb + _EPS),
                   key=lambda n: (loads[n], n))
    if len(train) < job.train_nodes:
        return None
    return roll, train


def idle_share(group: Group, config: GroupConfig) -> float:
    """Return the share of ``group``'s provisioned node-time (both pools) left idle by its worst-case schedule."""
    if not group.order:
        return 1.0
    sched = round_robin(group_jobs(group), len(group.rollout_nodes), config, n_train_nodes=len(group.train_nodes))
    r, t = len(group.rollout_nodes), len(group.train_nodes)
    return 1.0 - (sched.rollout_util * r + sched.train_util * t) / (r + t)


def _new_pinned_group(job: JobSpec, cluster: Cluster, config: GroupConfig) -> Decision:
    return dataclasses.replace(isolated_decision(job, cluster, (config.reference_rollout_gpu,)), pin_train=True)


class RandomPolicy:
    """Random (§7.5): uniformly among {groups that can accommodate the job} and {a new group}; random nodes.

    With ``k`` groups able to hold the job, a new group is opened with probability ``1 / (k + 1)``.
    Inside an existing group the job is pinned to ``roll_nodes`` random rollout nodes and
    ``train_nodes`` random training nodes among those with host memory to spare.
    """

    name = "random"

    def __init__(self, config: GroupConfig, seed: int = 0) -> None:
        self.config = config
        self.rng = random.Random(seed)

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        options = [(g, c) for g in cluster.groups.values()
                   if (c := _pinned_choices(job, g, self.config)) is not None]
        pick = self.rng.randrange(len(options) + 1)
        if pick == len(options):
            return _new_pinned_group(job, cluster, self.config)
        group, (roll, train) = options[pick]
        return Decision(job.job_id, "direct", group.gid, tuple(sorted(self.rng.sample(roll, job.roll_nodes))),
                        pin_train=True, train_nodes=tuple(sorted(self.rng.sample(train, job.train_nodes))))


class GreedyPolicy:
    """Greedy (Most-Idle, §7.5): the group with the highest idle-time share; its most idle nodes.

    Idle-time share is idle node-time over provisioned node-time of both pools under the group's
    round-robin schedule (:func:`idle_share`). Only groups that can accommodate the job compete (an
    empty new group would always be the most idle); a new group is opened when none can.
    """

    name = "greedy"

    def __init__(self, config: GroupConfig) -> None:
        self.config = config

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        best: tuple[float, int, Group, list[int], list[int]] | None = None
        for group in cluster.groups.values():
            choices = _pinned_choices(job, group, self.config)
            if choices is None:
                continue
            idle = idle_share(group, self.config)
            if best is None or (idle, -group.gid) > (best[0], -best[1]):
                best = (idle, group.gid, group, *choices)
        if best is None:
            return _new_pinned_group(job, cluster, self.config)
        _, _, group, roll, train = best
        return Decision(job.job_id, "direct", group.gid, tuple(roll[: job.roll_nodes]), pin_train=True,
                        train_nodes=tuple(train[: job.train_nodes]))


def _rollmux_paper(config: GroupConfig) -> RollMuxScheduler:
    return RollMuxScheduler(config, realised=None)


POLICIES: dict[str, Callable[..., object]] = {
    "rollmux": RollMuxScheduler, "rollmux-paper": _rollmux_paper, "random": RandomPolicy, "greedy": GreedyPolicy,
    "solo": SoloPolicy, "colocated": ColocatedPolicy, "gavel": GavelPolicy,
}


def make_policy(name: str, config: GroupConfig, seed: int = 0, responses: ResponseModel | None = None):
    """Return a placement policy by name (``optimal`` lives in :mod:`compute_sched.groups.optimal`).

    ``rollmux`` checks realised slowdowns against ``responses`` (the phase model the jobs run with;
    default :class:`~compute_sched.groups.workload.ResponseModel`) with draws from its own stream of
    ``seed``; ``rollmux-paper`` is Algorithm 1 as published, the worst-case check alone.
    """
    if name not in POLICIES:
        raise ConfigError("policy", "--policy", f"unknown policy {name!r}", ", ".join([*POLICIES, "optimal"]))
    cls = POLICIES[name]
    if cls is RandomPolicy:
        return cls(config, seed)
    if cls is RollMuxScheduler:
        return cls(config, RealisedSloCheck(responses or ResponseModel(), seed=seed))
    return cls(config)
