"""The cluster as a set of disjoint co-execution groups, and the placement decisions that change it.

Policies (:mod:`compute_sched.groups.inter`, :mod:`compute_sched.groups.baselines`) are pure: they
read a :class:`Cluster` and return a :class:`Decision`. Only :meth:`Cluster.apply` and
:meth:`Cluster.remove` change state, taking nodes from and returning them to the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.model import Group, JobSpec
from orchestrl.compute_sched.groups.nodes import NodeAllocator, cross_pod_traffic, CrossPodTraffic
from orchestrl.fabric.errors import ConfigError

__all__ = ["Decision", "Cluster", "STRATEGIES"]

STRATEGIES = ("direct", "scale", "isolated")


@dataclass(frozen=True)
class Decision:
    """Where one arriving job goes (Algorithm 1's ``G*`` and ``P*_j``)."""

    job_id: str
    strategy: str  # "direct" packing, rollout "scale", or "isolated" provisioning (§4.2)
    group_id: int | None  # None: a new group
    roll_nodes: tuple[int, ...] = ()  # existing rollout nodes of the group the job is pinned to
    new_roll_type: str | None = None  # GPU type of newly provisioned rollout nodes
    new_roll_count: int = 0
    new_train_count: int = 0  # training nodes of a new group
    delta_usd_per_h: float = 0.0  # marginal provisioning cost Cost(G') - Cost(G)
    iteration_s: Mapping[str, float] = field(default_factory=dict)  # planned T^co of every member, if checked
    rollout_pods: tuple[int, ...] = ()  # PoDs the job's rollout nodes will span (fabric topology only)
    mode: str = "rollmux"  # sharing mode of a new group
    evaluated: int = 0  # placements whose SLO check ran a schedule simulation
    # Random/Greedy pin a job to training nodes (§7.5); RollMux never does (footnote 2: the job's
    # data-parallel degree follows the whole pool). Pinned: ``train_nodes`` plus any new ones.
    pin_train: bool = False
    train_nodes: tuple[int, ...] = ()  # existing training nodes of the group the job is pinned to


class Cluster:
    """Groups, the allocator behind them, and which group each job is in."""

    def __init__(self, config: GroupConfig, allocator: NodeAllocator | None = None) -> None:
        self.config = config
        self.allocator = allocator or NodeAllocator(config)
        self.groups: dict[int, Group] = {}
        self.job_group: dict[str, int] = {}
        self._next_gid = 0

    def group_of(self, job_id: str) -> Group:
        try:
            return self.groups[self.job_group[job_id]]
        except KeyError:
            raise ConfigError("cluster", "job_id", f"job {job_id!r} is not placed", "an active job id") from None

    def apply(self, job: JobSpec, decision: Decision) -> Group:
        """Carry out ``decision`` for ``job``: provision nodes, then pin the job. Returns its group."""
        if decision.job_id != job.job_id:
            raise ConfigError("decision", "job_id", f"{decision.job_id!r} does not match job {job.job_id!r}",
                              job.job_id)
        if job.job_id in self.job_group:
            raise ConfigError("cluster", "job_id", f"job {job.job_id!r} is already placed", "a new job id")
        if decision.group_id is None:
            group = Group(self._next_gid, self.config, mode=decision.mode)
            self._next_gid += 1
            new_train = self.allocator.allocate("train", self.config.train_gpu_type, decision.new_train_count)
            group.add_nodes(new_train)
            created = True
        else:
            group = self.groups[decision.group_id]
            new_train = []
            created = False
        new_ids: list[int] = []
        if decision.new_roll_count:
            near = _pods_by_weight(group, decision.roll_nodes)
            try:
                nodes = self.allocator.allocate("rollout", decision.new_roll_type or self.config.reference_rollout_gpu,
                                                decision.new_roll_count, near)
            except Exception:
                if created:
                    self.allocator.release(group.drop_nodes(list(group.train_nodes)))
                raise
            group.add_nodes(nodes)
            new_ids = [n.node_id for n in nodes]
        pins = tuple(decision.train_nodes) + tuple(n.node_id for n in new_train) if decision.pin_train else None
        group.add(job, tuple(decision.roll_nodes) + tuple(new_ids), pins)
        self.groups[group.gid] = group
        self.job_group[job.job_id] = group.gid
        return group

    def create_group(self, members: Sequence[tuple[JobSpec, tuple[int, ...]]], train_count: int, roll_type: str,
                     roll_count: int, mode: str = "rollmux") -> Group:
        """Provision a whole group and pin each member to rollout nodes given as indices ``0..roll_count-1``."""
        group = Group(self._next_gid, self.config, mode=mode)
        self._next_gid += 1
        group.add_nodes(self.allocator.allocate("train", self.config.train_gpu_type, train_count))
        try:
            nodes = self.allocator.allocate("rollout", roll_type, roll_count)
        except Exception:
            self.allocator.release(group.drop_nodes(list(group.train_nodes)))
            raise
        group.add_nodes(nodes)
        for job, idx in members:
            group.add(job, tuple(nodes[i].node_id for i in idx))
            self.job_group[job.job_id] = group.gid
        self.groups[group.gid] = group
        return group

    def remove(self, job_id: str) -> Group | None:
        """Take a finished job out; release nodes nobody uses. Returns its group, or None if it emptied."""
        group = self.group_of(job_id)
        unused = group.remove(job_id)
        del self.job_group[job_id]
        if not group.order:
            self.allocator.release(group.drop_nodes(list(group.rollout_nodes) + list(group.train_nodes)))
            del self.groups[group.gid]
            return None
        self.allocator.release(group.drop_nodes(unused))
        return group

    def clear(self) -> None:
        """Release every group (an offline optimum regroups from scratch)."""
        for gid in list(self.groups):
            group = self.groups.pop(gid)
            self.allocator.release(group.drop_nodes(list(group.rollout_nodes) + list(group.train_nodes)))
        self.job_group.clear()

    # -- totals -------------------------------------------------------------------------------------
    def cost_usd_per_h(self) -> float:
        return sum(g.cost_usd_per_h() for g in self.groups.values())

    def gpus(self, pool: str) -> int:
        return sum(g.gpus(pool) for g in self.groups.values())

    def traffic(self, job_id: str) -> CrossPodTraffic:
        """Cross-PoD bytes per iteration of a placed job."""
        group = self.group_of(job_id)
        nodes = [group.rollout_nodes[n] for n in group.placements[job_id]]
        return cross_pod_traffic(group.jobs[job_id], nodes, list(group.train_nodes.values()))


def _pods_by_weight(group: Group, chosen: tuple[int, ...]) -> list[int]:
    """PoDs to try first for new nodes: those of the job's chosen nodes, then the group's busiest PoDs."""
    count: dict[int, int] = {}
    for n in group.rollout_nodes.values():
        if n.pod is not None:
            count[n.pod] = count.get(n.pod, 0) + 1
    first = [group.rollout_nodes[n].pod for n in chosen if group.rollout_nodes[n].pod is not None]
    return list(dict.fromkeys(first + sorted(count, key=lambda p: (-count[p], p))))
