"""Inter-group scheduler: RollMux Algorithm 1 with its three placement strategies.

Design note
-----------
For an arriving job the scheduler wants the placement of least marginal cost ``Delta`` whose
members all keep ``T^co <= SLO * T^solo`` under worst-case phase times, with every node's resident
states inside its host memory. Saturated groups (``T_load >= T_cycle``) are skipped (line 4).
Every other group offers *direct packing* (``Delta = 0``) and *rollout scaling* (``Delta`` = the
price of the new rollout nodes); a new *isolated* group is the fallback (lines 15-17).

The result is the same as evaluating every placement, but faster: candidates are first screened
with cheap lower bounds on the co-execution iteration time (it can be no shorter than the training
pool's total work, the busiest rollout node's work, or any member's own rollout + training), then
sorted by ``Delta`` and simulated (:func:`compute_sched.groups.intra.round_robin`) in that order,
stopping at the first one that passes. Ties in ``Delta`` prefer fewer PoDs (fabric awareness) and
then the tightest fit, which leaves roomier groups for later arrivals.

The worst-case check bounds each member's absolute iteration time, but an SLO is a slowdown
ratio and realised phases do not shrink evenly (rollouts end with their longest response,
training follows the mean). So a candidate that passes it must also pass
:class:`~compute_sched.groups.slo.RealisedSloCheck`: each member's slowdown predicted from phases
sampled from its response-length model stays within its SLO. ``realised=None`` drops that check and
is Algorithm 1 as published (policy ``rollmux-paper``).

Hardware affinity (RollArt §4.1): each rollout GPU type in ``config.rollout_gpu_types`` is a
candidate; on a type ``s`` times faster for the job's kind (prefill- or decode-heavy) the job needs
``ceil(roll_nodes / s)`` nodes, and the type is chosen only where that lowers ``Delta``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from orchestrl.compute_sched.groups.cluster import Cluster, Decision
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, group_jobs, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import Group, JobSpec
from orchestrl.compute_sched.groups.nodes import CapacityError
from orchestrl.compute_sched.groups.slo import RealisedSloCheck
from orchestrl.fabric.errors import ConfigError

__all__ = ["RollMuxScheduler", "nodes_needed", "isolated_decision", "check_job_fits_a_node"]

_EPS = 1e-9


def nodes_needed(job: JobSpec, gpu_type: str, config: GroupConfig) -> int:
    """Return how many ``gpu_type`` rollout nodes give ``job`` at least its reference rollout speed."""
    return max(1, math.ceil(job.roll_nodes / config.rollout_speed(gpu_type, job.rollout_kind) - _EPS))


def check_job_fits_a_node(job: JobSpec, config: GroupConfig) -> None:
    """Refuse a job whose resident state alone exceeds a node's host memory (it could never be placed)."""
    for name in ("roll_mem_gb", "train_mem_gb"):
        if getattr(job, name) > config.host_mem_gb:
            raise ConfigError(f"job {job.job_id!r}", name, f"{getattr(job, name)} GB exceeds a node's host memory "
                                                           f"({config.host_mem_gb} GB)", "a smaller resident state")


def isolated_decision(job: JobSpec, cluster: Cluster, types: Sequence[str] | None = None,
                      mode: str = "rollmux") -> Decision:
    """Return the cheapest new-group placement of ``job`` over rollout GPU ``types`` (Alg. 1 line 15)."""
    cfg = cluster.config
    check_job_fits_a_node(job, cfg)
    best: Decision | None = None
    for t in types or cfg.rollout_gpu_types:
        k = nodes_needed(job, t, cfg)
        if cluster.allocator.bounded("rollout", t) and cluster.allocator.free_servers("rollout") < k:
            continue
        cost = k * cfg.node_price_usd_per_h(t) + job.train_nodes * cfg.node_price_usd_per_h(cfg.train_gpu_type)
        if best is None or cost < best.delta_usd_per_h - _EPS:
            pods = tuple(sorted({p for p in cluster.allocator.preview("rollout", t, k) if p is not None}))
            best = Decision(job.job_id, "isolated", None, (), t, k, job.train_nodes, cost,
                            {job.job_id: job.t_solo_s}, pods, mode)
    if best is None:
        free = cluster.allocator.free_servers("rollout")
        raise CapacityError(f"job {job.job_id!r}: a new group needs {job.roll_nodes} rollout node(s) but the rollout "
                            f"fabric has {free} free servers; use a larger rollout topology or fewer jobs")
    return best


@dataclass(frozen=True)
class _Candidate:
    delta: float
    pods: int
    slack: float
    group: Group
    strategy: str
    chosen: tuple[int, ...]
    new_type: str
    new_count: int
    roll_s: float
    pod_ids: tuple[int, ...]

    def key(self) -> tuple:
        return (round(self.delta, 6), self.pods, self.slack, self.group.gid, self.new_count, self.chosen)


class RollMuxScheduler:
    """Algorithm 1 over a :class:`Cluster`; ``place`` returns the decision, ``Cluster.apply`` enacts it.

    Examples
    --------
    Two complementary jobs share one group at no extra cost (direct packing, Figure 5-top):

    >>> cfg = GroupConfig()
    >>> cluster, sched = Cluster(cfg), RollMuxScheduler(cfg)
    >>> a = JobSpec("a", 100.0, 100.0, slo=1.5)
    >>> b = JobSpec("b", 100.0, 100.0, slo=1.5)
    >>> cluster.apply(a, sched.place(a, cluster)).gid
    0
    >>> d = sched.place(b, cluster)
    >>> d.strategy, d.group_id, d.delta_usd_per_h
    ('direct', 0, 0.0)
    """

    def __init__(self, config: GroupConfig, realised: RealisedSloCheck | None = RealisedSloCheck(), *,
                 exhaustive: bool = False) -> None:
        self.config = config
        # None: only §4.2's worst-case check (Algorithm 1 as published), which realised phases can break
        self.realised = realised
        # True: simulate every placement that passes residency, no bound screens and no early stop (the
        # literal reading of Algorithm 1, kept as the same-run baseline of the screened search's speed)
        self.exhaustive = exhaustive
        self.name = "rollmux" if realised is not None else "rollmux-paper"

    def place(self, job: JobSpec, cluster: Cluster) -> Decision:
        """Return the least-marginal-cost feasible placement of ``job`` (Algorithm 1).

        Notes
        -----
        O(G * P) bound checks for G groups and P (a handful of) placements per group, plus one
        O(I * n) schedule simulation per candidate tried, in increasing ``Delta``.
        """
        iso = isolated_decision(job, cluster)
        candidates: list[_Candidate] = []
        for group in cluster.groups.values():
            candidates.extend(self._placements(job, group, cluster, iso.delta_usd_per_h))
        candidates.sort(key=_Candidate.key)
        evaluated = 0
        best: tuple[_Candidate, dict[str, float]] | None = None
        for cand in candidates:
            evaluated += 1
            planned = self._slo_check(job, cand)
            if planned is not None and best is None:
                best = (cand, planned)
                if not self.exhaustive:
                    break
        if best is None:
            return dataclasses.replace(iso, evaluated=evaluated)
        cand, planned = best
        return Decision(job.job_id, cand.strategy, cand.group.gid, cand.chosen, cand.new_type if cand.new_count
                        else None, cand.new_count, 0, cand.delta, planned, cand.pod_ids, evaluated=evaluated)

    # -- GENERATEPLACEMENTS and the cheap screens -----------------------------------------------------
    def _placements(self, job: JobSpec, group: Group, cluster: Cluster, iso_delta: float) -> list[_Candidate]:
        cfg = self.config
        if group.mode != "rollmux" or len(group.order) >= cfg.max_group_size:
            return []
        s = group.summary()
        if (s.saturated if self.config.prune_saturated == "paper" else s.train_load_s >= s.t_cycle_s):
            return []  # Algorithm 1, line 4
        budget = min(s.min_slo_budget_s, job.slo_budget_s)
        screen = not self.exhaustive  # the bound screens below only skip placements the simulation would refuse
        t_train = group.train_time(job)
        floor = max(s.max_inner_solo_s, s.train_load_s + t_train)
        if s.train_mem_gb + group.train_mem_per_node(job) > cfg.host_mem_gb + _EPS:
            return []  # Algorithm 1, line 8 (the training pool's residency)
        if screen and floor > budget + _EPS:
            return []
        out = []
        for t in cfg.rollout_gpu_types:
            k = nodes_needed(job, t, cfg)
            roll_s = job.t_roll_s * job.roll_nodes / (k * cfg.rollout_speed(t, job.rollout_kind))
            if screen and max(floor, roll_s + t_train) > budget + _EPS:
                continue
            eligible = sorted((n for n, node in group.rollout_nodes.items() if node.gpu_type == t
                               and s.node_mem_gb[n] + job.roll_mem_gb <= cfg.host_mem_gb + _EPS),
                              key=lambda n: (s.node_load_s[n], n))
            for chosen in _direct_choices(group, eligible, k):
                self._add(out, job, group, cluster, "direct", chosen, t, 0, roll_s, floor, budget, t_train)
            price = cfg.node_price_usd_per_h(t)
            for m in range(1, k + 1):  # rollout scaling: m new nodes, the rest on the least-loaded ones
                if m * price >= iso_delta - _EPS or len(eligible) < k - m:
                    continue
                self._add(out, job, group, cluster, "scale", tuple(eligible[: k - m]), t, m, roll_s, floor, budget,
                          t_train)
        return out

    def _add(self, out: list[_Candidate], job: JobSpec, group: Group, cluster: Cluster, strategy: str,
             chosen: tuple[int, ...], t: str, m: int, roll_s: float, floor: float, budget: float,
             t_train: float) -> None:
        s = group.summary()
        busiest = max((s.node_load_s[n] + roll_s for n in chosen), default=roll_s if m else 0.0)
        bound = max(floor, busiest, roll_s + t_train)
        if bound > budget + _EPS and not self.exhaustive:
            return
        pods = {group.rollout_nodes[n].pod for n in chosen if group.rollout_nodes[n].pod is not None}
        if m:
            near = [group.rollout_nodes[n].pod for n in chosen if group.rollout_nodes[n].pod is not None]
            near += sorted({n.pod for n in group.rollout_nodes.values() if n.pod is not None} - set(near))
            try:
                pods.update(p for p in cluster.allocator.preview("rollout", t, m, near) if p is not None)
            except CapacityError:
                return
        delta = m * self.config.node_price_usd_per_h(t)
        out.append(_Candidate(delta, len(pods), budget - bound, group, strategy, chosen, t, m, roll_s,
                              tuple(sorted(pods))))

    # -- Algorithm 1 lines 8-11: the SLO check against the simulated intra-group schedule --------------
    def _slo_check(self, job: JobSpec, cand: _Candidate) -> dict[str, float] | None:
        """Return the members' worst-case iteration times if every SLO holds (worst case, then realised)."""
        group = cand.group
        new_ids = tuple(-(i + 1) for i in range(cand.new_count))  # placeholders for nodes not yet provisioned
        members = group_jobs(group) + [GroupJob(job.job_id, cand.chosen + new_ids, cand.roll_s,
                                                group.train_time(job))]
        planned = worst_case_iteration_s(members, self.config)
        specs = {**group.jobs, job.job_id: job}
        if any(planned[j] > specs[j].slo_budget_s + _EPS for j in planned):
            return None
        if self.realised is not None and not self.realised.admits(members, specs, self.config):
            return None
        return planned


def _direct_choices(group: Group, eligible: list[int], k: int) -> list[tuple[int, ...]]:
    """Direct-packing node sets: the k least loaded, and the least loaded k inside each single PoD."""
    if len(eligible) < k:
        return []
    out = [tuple(eligible[:k])]
    by_pod: dict[int, list[int]] = {}
    for n in eligible:
        pod = group.rollout_nodes[n].pod
        if pod is not None:
            by_pod.setdefault(pod, []).append(n)
    for nodes in by_pod.values():
        if len(nodes) >= k and tuple(nodes[:k]) not in out:
            out.append(tuple(nodes[:k]))
    return out
