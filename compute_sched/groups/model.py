"""Co-execution groups (RollMux §4.1): jobs, the nodes of a group's two pools, and where each job is pinned.

Design note
-----------
A group ``G = (J_G, R_G, T_G, Phi_G)`` owns rollout nodes ``R_G`` and training nodes ``T_G``. Every
job trains on *all* of ``T_G`` (RollMux footnote 2: the training pool is never rescaled, the job's
data-parallel degree follows it), while its rollout is pinned to a subset of ``R_G``; the pinning is
where its state stays resident in host DRAM, so the residency constraint is checked per node.
A job states its conservative phase times for the node counts it asks for; inside a group they are
rescaled to the nodes it actually got (rollout by node speed, training by data-parallel width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from orchestrl.compute_sched.groups.config import ROLLOUT_KINDS, GroupConfig
from orchestrl.fabric.errors import ConfigError

__all__ = ["JobSpec", "Node", "Group", "GroupSummary", "conservative_phase_times"]


@dataclass(frozen=True)
class JobSpec:
    """One RL job as the scheduler sees it: worst-case phase times, node demands, resident state, SLO."""

    job_id: str
    t_roll_s: float  # rollout on `roll_nodes` reference nodes with every response at the maximum length
    t_train_s: float  # training + weight sync on `train_nodes` nodes, for that worst-case batch
    roll_nodes: int = 1  # reference (H20) rollout nodes the job asks for
    train_nodes: int = 1  # training nodes it asks for when placed alone
    roll_mem_gb: float = 275.7  # host DRAM per rollout node to keep its rollout actor resident (Table 2)
    train_mem_gb: float = 240.0  # host DRAM per training node for its training actor (Table 2)
    slo: float = 2.0  # tolerated co-execution slowdown against solo execution (§4.2)
    rollout_kind: str = "decode"  # RollArt §3.1: "decode"-heavy or "prefill"-heavy generation
    model_params: float = 7e9  # parameters; sizes the weight-sync bytes for cross-PoD traffic
    arrival_s: float = 0.0
    duration_s: float = 3600.0  # runtime the job would take alone (the trace's duration)
    profile: str = ""  # workload label, e.g. "RH-L"

    def __post_init__(self) -> None:
        src = f"job {self.job_id!r}"
        for name in ("t_roll_s", "t_train_s", "duration_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(src, name, f"{getattr(self, name)} is not positive", "seconds > 0")
        for name in ("roll_nodes", "train_nodes"):
            if getattr(self, name) < 1:
                raise ConfigError(src, name, f"{getattr(self, name)} is below 1", ">= 1 node")
        if self.slo < 1.0:
            raise ConfigError(src, "slo", f"{self.slo} is below 1", "a slowdown tolerance >= 1, e.g. 1.5")
        if self.rollout_kind not in ROLLOUT_KINDS:
            raise ConfigError(src, "rollout_kind", f"unknown kind {self.rollout_kind!r}", ", ".join(ROLLOUT_KINDS))
        if self.roll_mem_gb < 0 or self.train_mem_gb < 0:
            raise ConfigError(src, "roll_mem_gb", "resident sizes must not be negative", ">= 0 GB")

    @property
    def t_solo_s(self) -> float:
        """Worst-case solo iteration time: rollout then training (Figure 1-top)."""
        return self.t_roll_s + self.t_train_s

    @property
    def slo_budget_s(self) -> float:
        """The longest co-execution iteration this job accepts."""
        return self.slo * self.t_solo_s

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.model_params  # bf16


def conservative_phase_times(observed_roll_s: float, observed_train_s: float, longest_response_tokens: float,
                             mean_response_tokens: float, max_response_tokens: float,
                             train_fixed_fraction: float = 0.3) -> tuple[float, float]:
    """Return worst-case ``(t_roll_s, t_train_s)`` from one profiled iteration (§4.2, "conservative planning").

    Decoding runs until the longest response ends, so rollout time scales with the longest response;
    training scales with the token count except for a fixed part (optimizer step, weight sync). The
    worst case has every response at ``max_response_tokens``.

    Examples
    --------
    >>> conservative_phase_times(60.0, 50.0, 4096, 2048, 8192)
    (120.0, 155.0)
    """
    if min(longest_response_tokens, mean_response_tokens) <= 0 or max_response_tokens < longest_response_tokens:
        raise ConfigError("profile", "max_response_tokens",
                          f"{max_response_tokens} with longest {longest_response_tokens}, mean {mean_response_tokens}",
                          "0 < mean, longest <= max_response_tokens")
    t_roll = observed_roll_s * max_response_tokens / longest_response_tokens
    fixed = train_fixed_fraction * observed_train_s
    t_train = fixed + (observed_train_s - fixed) * max_response_tokens / mean_response_tokens
    return t_roll, t_train


@dataclass(frozen=True)
class Node:
    """One 8-GPU server in a pool; ``pod``/``server`` are set when a fabric topology backs the pool."""

    node_id: int
    pool: str  # "rollout" | "train"
    gpu_type: str
    pod: int | None = None
    server: int | None = None


@dataclass(frozen=True)
class GroupSummary:
    """Aggregates of a group that Algorithm 1 reads for every arriving job."""

    t_cycle_s: float  # longest member's solo iteration time
    train_load_s: float  # sum of members' training times on the pool
    node_load_s: dict[int, float]  # rollout node -> sum of rollout times pinned to it
    node_mem_gb: dict[int, float]  # rollout node -> resident GB
    train_mem_gb: float  # resident GB on each training node
    min_slo_budget_s: float  # tightest member budget SLO_k * T_k^solo
    max_inner_solo_s: float  # longest member rollout+training time in this group's placement

    @property
    def t_load_s(self) -> float:
        return max(self.train_load_s, max(self.node_load_s.values(), default=0.0))

    @property
    def saturated(self) -> bool:
        return self.t_cycle_s > 0 and self.t_load_s >= self.t_cycle_s


@dataclass
class Group:
    """A co-execution group; members are kept in admission order, which is their round-robin order.

    ``mode`` says how members share the pools: ``"rollmux"`` (phase round-robin, §4.3), ``"gavel"``
    (whole-job time slices, the Gavel+ baseline) or ``"colocated"`` (every phase on the training nodes).
    """

    gid: int
    config: GroupConfig
    mode: str = "rollmux"
    order: list[str] = field(default_factory=list)
    jobs: dict[str, JobSpec] = field(default_factory=dict)
    placements: dict[str, tuple[int, ...]] = field(default_factory=dict)  # job -> its rollout node ids
    # job -> training node ids it is pinned to. Only the Random/Greedy baselines pin (§7.5: "placed on
    # random rollout and train nodes"); an unpinned job trains on the whole pool (footnote 2).
    train_placements: dict[str, tuple[int, ...]] = field(default_factory=dict)
    rollout_nodes: dict[int, Node] = field(default_factory=dict)
    train_nodes: dict[int, Node] = field(default_factory=dict)
    _summary: "GroupSummary | None" = field(default=None, repr=False, compare=False)

    # -- phase times inside this group ------------------------------------------------------------
    def roll_time(self, job: JobSpec, node_ids: Iterable[int], extra: Sequence[Node] = ()) -> float:
        """Worst-case rollout time of ``job`` on these nodes (reference time scaled by total node speed)."""
        nodes = [self.rollout_nodes[n] for n in node_ids] + list(extra)
        if not nodes and self.mode == "colocated":  # veRL: the rollout runs on the job's training nodes
            nodes = list(self.train_nodes.values())
        if not nodes:
            raise ConfigError(f"group {self.gid}", "placement", f"job {job.job_id!r} has no rollout node",
                              ">= 1 rollout node (or a 'colocated' group)")
        speed = sum(self.config.rollout_speed(n.gpu_type, job.rollout_kind) for n in nodes)
        return job.t_roll_s * job.roll_nodes / speed

    def train_time(self, job: JobSpec, train_count: int | None = None) -> float:
        """Worst-case training time with the data-parallel degree matched to the group's training pool."""
        count = train_count if train_count is not None else len(self.train_nodes)
        return job.t_train_s * job.train_nodes / count

    def member_train_time(self, job_id: str) -> float:
        """Worst-case training time of a member where it trains (its pinned nodes, else the whole pool)."""
        pins = self.train_placements.get(job_id)
        return self.train_time(self.jobs[job_id], len(pins) if pins else None)

    def train_node_mem_gb(self, node_id: int) -> float:
        """Host DRAM resident on one training node: pinned members on it plus every unpinned member."""
        out = 0.0
        for j in self.order:
            pins = self.train_placements.get(j)
            if pins is None:
                out += self.train_mem_per_node(self.jobs[j])
            elif node_id in pins:
                out += self.train_mem_per_node(self.jobs[j], len(pins))
        return out

    def train_mem_per_node(self, job: JobSpec, train_count: int | None = None) -> float:
        """Host DRAM ``job`` needs on each training node (its state spread over the pool, never below Table 2)."""
        count = train_count if train_count is not None else len(self.train_nodes)
        return job.train_mem_gb * max(1.0, job.train_nodes / count)

    # -- aggregate state ----------------------------------------------------------------------------
    def summary(self) -> "GroupSummary":
        """Return the aggregate state Algorithm 1 filters on, cached until membership or nodes change."""
        if self._summary is None:
            loads = {n: self.node_load_s(n) for n in self.rollout_nodes}
            self._summary = GroupSummary(
                t_cycle_s=self.t_cycle_s(), train_load_s=self.train_load_s(), node_load_s=loads,
                node_mem_gb={n: self.node_mem_used_gb(n) for n in self.rollout_nodes},
                train_mem_gb=self.train_mem_used_gb(), min_slo_budget_s=self.min_slo_budget_s(),
                max_inner_solo_s=max((self.roll_time(self.jobs[j], self.placements[j]) + self.member_train_time(j)
                                      for j in self.order), default=0.0))
        return self._summary

    def node_load_s(self, node_id: int) -> float:
        """Total worst-case rollout time of the jobs pinned to a rollout node."""
        return sum(self.roll_time(self.jobs[j], self.placements[j]) for j in self.jobs_on(node_id))

    def jobs_on(self, node_id: int) -> list[str]:
        return [j for j in self.order if node_id in self.placements[j]]

    def node_mem_used_gb(self, node_id: int) -> float:
        return sum(self.jobs[j].roll_mem_gb for j in self.jobs_on(node_id))

    def train_mem_used_gb(self) -> float:
        """Resident GB on the fullest training node."""
        return max((self.train_node_mem_gb(n) for n in self.train_nodes), default=0.0)

    def train_load_s(self) -> float:
        """Worst-case training work on the busiest training node (the whole pool when nobody is pinned)."""
        if not self.train_placements:
            return sum(self.train_time(self.jobs[j]) for j in self.order)
        return max((sum(self.member_train_time(j) for j in self.order
                        if n in self.train_placements.get(j, self.train_nodes)) for n in self.train_nodes), default=0.0)

    def t_cycle_s(self) -> float:
        """``T_G^cycle``: the longest member's solo iteration time."""
        return max((self.jobs[j].t_solo_s for j in self.order), default=0.0)

    def t_load_s(self) -> float:
        """``T_G^load``: work on the bottleneck resource (the training pool or the busiest rollout node)."""
        roll = max((self.node_load_s(n) for n in self.rollout_nodes), default=0.0)
        return max(self.train_load_s(), roll)

    def saturated(self) -> bool:
        """Whether Algorithm 1 line 4 prunes this group (``T_load >= T_cycle``)."""
        return bool(self.order) and self.t_load_s() >= self.t_cycle_s()

    def min_slo_budget_s(self) -> float:
        return min((self.jobs[j].slo_budget_s for j in self.order), default=math.inf)

    def cost_usd_per_h(self) -> float:
        """Hourly price of every node the group holds (``Cost(G)``)."""
        nodes = list(self.rollout_nodes.values()) + list(self.train_nodes.values())
        return sum(self.config.node_price_usd_per_h(n.gpu_type) for n in nodes)

    def gpus(self, pool: str) -> int:
        nodes = self.rollout_nodes if pool == "rollout" else self.train_nodes
        return len(nodes) * self.config.gpus_per_node

    def pods_of(self, node_ids: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted({self.rollout_nodes[n].pod for n in node_ids if self.rollout_nodes[n].pod is not None}))

    # -- membership -----------------------------------------------------------------------------------
    def add(self, job: JobSpec, node_ids: Sequence[int], train_ids: Sequence[int] | None = None) -> None:
        """Admit ``job`` pinned to existing rollout nodes ``node_ids`` (and, if given, training nodes
        ``train_ids``; else it trains on the whole pool); refuses a residency violation."""
        if job.job_id in self.jobs:
            raise ConfigError(f"group {self.gid}", "jobs", f"job {job.job_id!r} is already a member", "a new job id")
        missing = [n for n in node_ids if n not in self.rollout_nodes]
        if missing:
            raise ConfigError(f"group {self.gid}", "placement", f"nodes {missing} are not rollout nodes of the group",
                              f"{sorted(self.rollout_nodes)}")
        if train_ids is not None and (not train_ids or any(n not in self.train_nodes for n in train_ids)):
            raise ConfigError(f"group {self.gid}", "train placement", f"{list(train_ids)} are not training nodes "
                              f"of the group", f"a non-empty subset of {sorted(self.train_nodes)}")
        self._summary = None
        self.order.append(job.job_id)
        self.jobs[job.job_id] = job
        self.placements[job.job_id] = tuple(node_ids)
        if train_ids is not None:
            self.train_placements[job.job_id] = tuple(train_ids)
        over = self.residency_violations()
        if over:
            self.remove(job.job_id)
            raise ConfigError(f"group {self.gid}", "placement", "; ".join(over),
                              f"at most {self.config.host_mem_gb} GB resident per node")

    def remove(self, job_id: str) -> list[int]:
        """Remove a member; return the node ids no member uses any more (a node is paid while any job on it runs)."""
        self._summary = None
        self.order.remove(job_id)
        del self.jobs[job_id]
        del self.placements[job_id]
        self.train_placements.pop(job_id, None)
        used = {n for nodes in self.placements.values() for n in nodes}
        unused = [n for n in self.rollout_nodes if n not in used]
        if self.order and all(j in self.train_placements for j in self.order):  # all pinned: free idle ones
            used_t = {n for nodes in self.train_placements.values() for n in nodes}
            unused += [n for n in self.train_nodes if n not in used_t]
        return unused

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        """Provision nodes into the group's pools (rollout scaling, or a new group's pools)."""
        self._summary = None
        for node in nodes:
            (self.rollout_nodes if node.pool == "rollout" else self.train_nodes)[node.node_id] = node

    def drop_nodes(self, node_ids: Iterable[int]) -> list[Node]:
        """Take nodes out of the group and return them (to be released to the allocator)."""
        self._summary = None
        out = []
        for n in list(node_ids):
            out.append(self.rollout_nodes.pop(n) if n in self.rollout_nodes else self.train_nodes.pop(n))
        return out

    def residency_violations(self) -> list[str]:
        """Describe every node whose resident states exceed its host memory (empty when the constraint holds)."""
        cap = self.config.host_mem_gb + 1e-9
        out = [f"rollout node {n} holds {self.node_mem_used_gb(n):.1f} GB" for n in self.rollout_nodes
               if self.node_mem_used_gb(n) > cap]
        out += [f"training node {n} holds {self.train_node_mem_gb(n):.1f} GB" for n in self.train_nodes
                if self.train_node_mem_gb(n) > cap]
        return out
