"""Offline optimum for small instances: exhaustive search over groupings, placements and orders (§7.5 "Opt").

Design note
-----------
The optimum partitions the jobs into groups; a group's cheapest configuration is independent of
the others, so the search is a dynamic programme over subsets (``best(S) = min over groups g in S
holding S's first job of cost(g) + best(S - g)``, O(3^n)). For one group it tries every training
pool size up to the largest member's request, every rollout GPU type (one type per group), and
every rollout node count, cheapest first; a configuration is accepted once some assignment of
members to rollout nodes (enumerated with interchangeable unused nodes identified) and some
round-robin order (rotations identified) meets every member's SLO under worst-case times (and,
given a :class:`~compute_sched.groups.slo.RealisedSloCheck`, under its sampled phases, as RollMux
does) with every node inside its host memory. The first accepted configuration is therefore the group's optimum
within the same execution model RollMux plans with. Cost grows exponentially: keep n <= ~10.

The objective is §4.2's ``Cost(G)`` in $/h over the jobs active at each arrival and departure, as
§7.5 defines "Opt", and it is SLO-constrained (it meets every SLO, Figure 15). In a replay a slowed
job lives longer, so a $/h optimum that uses a job's SLO slack is not the minimum of cost integrated
over time: policies that ignore SLOs can be cheaper, and an SLO-respecting online one can tie it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations, permutations
from typing import Sequence

from orchestrl.compute_sched.groups.cluster import Cluster
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.inter import check_job_fits_a_node, nodes_needed
from orchestrl.compute_sched.groups.intra import GroupJob, worst_case_iteration_s
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.compute_sched.groups.slo import RealisedSloCheck
from orchestrl.fabric.errors import ConfigError

__all__ = ["GroupPlan", "optimal_groups", "OptimalPolicy", "MAX_OPTIMAL_JOBS"]

MAX_OPTIMAL_JOBS = 10
_EPS = 1e-9


@dataclass(frozen=True)
class GroupPlan:
    """One group of the optimum: members in round-robin order and their rollout node indices."""

    order: tuple[str, ...]
    assignment: tuple[tuple[int, ...], ...]  # per member (in order): indices of its rollout nodes
    train_nodes: int
    rollout_type: str
    rollout_nodes: int
    cost_usd_per_h: float


def optimal_groups(jobs: Sequence[JobSpec], config: GroupConfig,
                   realised: RealisedSloCheck | None = None) -> tuple[GroupPlan, ...]:
    """Return a minimum-cost partition of ``jobs`` into feasible co-execution groups.

    A group is feasible when every member meets its SLO under worst-case phases and, if ``realised``
    is given, under that check's sampled phases too (the constraints ``rollmux`` places under).

    Raises
    ------
    ConfigError
        For more than :data:`MAX_OPTIMAL_JOBS` jobs (the search is exponential).

    Notes
    -----
    O(3^n) subset combinations plus, per subset of at most ``max_group_size`` jobs, an exhaustive
    search over configurations, assignments and orders.

    Examples
    --------
    Two complementary jobs share one group; a third that would break an SLO stays alone:

    >>> cfg = GroupConfig()
    >>> jobs = [JobSpec("a", 100, 100, slo=1.5), JobSpec("b", 100, 100, slo=1.5), JobSpec("c", 500, 500, slo=1.0)]
    >>> [p.order for p in optimal_groups(jobs, cfg)]
    [('a', 'b'), ('c',)]
    """
    if len(jobs) > MAX_OPTIMAL_JOBS:
        raise ConfigError("optimal", "--jobs", f"{len(jobs)} concurrent jobs make exhaustive search intractable",
                          f"<= {MAX_OPTIMAL_JOBS} concurrent jobs, or another --policy")
    for job in jobs:
        check_job_fits_a_node(job, config)
    n = len(jobs)
    search = _GroupSearch(tuple(jobs), config, realised)
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for mask in range(1, 1 << n):
        low = mask & -mask
        rest = mask ^ low
        found: tuple[float, tuple[int, ...]] | None = None
        sub = rest
        while True:
            group = sub | low
            if bin(group).count("1") <= config.max_group_size:
                plan = search.best(group)
                if plan is not None:
                    total = plan.cost_usd_per_h + best[mask ^ group][0]
                    if found is None or total < found[0] - _EPS:
                        found = (total, best[mask ^ group][1] + (group,))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        assert found is not None  # singletons are always feasible
        best[mask] = found
    return tuple(search.best(g) for g in sorted(best[(1 << n) - 1][1], key=lambda g: g & -g))


class _GroupSearch:
    def __init__(self, jobs: tuple[JobSpec, ...], config: GroupConfig, realised: RealisedSloCheck | None) -> None:
        self.jobs = jobs
        self.cfg = config
        self.realised = realised if realised is not None and realised.active else None
        self.best = lru_cache(maxsize=None)(self._best)

    def _best(self, mask: int) -> GroupPlan | None:
        members = [j for i, j in enumerate(self.jobs) if mask >> i & 1]
        cfg = self.cfg
        budget = min(j.slo_budget_s for j in members)
        configs = []
        for train in range(1, max(j.train_nodes for j in members) + 1):
            t_train = [j.t_train_s * j.train_nodes / train for j in members]
            if sum(j.train_mem_gb * max(1.0, j.train_nodes / train) for j in members) > cfg.host_mem_gb + _EPS:
                continue
            for t in cfg.rollout_gpu_types:
                k = [nodes_needed(j, t, cfg) for j in members]
                roll = [j.t_roll_s * j.roll_nodes / (kk * cfg.rollout_speed(t, j.rollout_kind))
                        for j, kk in zip(members, k)]
                if max(sum(t_train), max(r + tt for r, tt in zip(roll, t_train))) > budget + _EPS:
                    continue
                for m in range(max(k), sum(k) + 1):
                    if sum(kk * r for kk, r in zip(k, roll)) / m > budget + _EPS:
                        continue
                    if sum(kk * j.roll_mem_gb for kk, j in zip(k, members)) > m * cfg.host_mem_gb + _EPS:
                        continue
                    cost = train * cfg.node_price_usd_per_h(cfg.train_gpu_type) + m * cfg.node_price_usd_per_h(t)
                    configs.append((cost, train, t, m, k, roll, t_train))
        configs.sort(key=lambda c: (c[0], c[1], c[3]))
        for cost, train, t, m, k, roll, t_train in configs:
            found = self._feasible(members, m, k, roll, t_train)
            if found is not None:
                order, assignment = found
                return GroupPlan(tuple(members[i].job_id for i in order), tuple(assignment[i] for i in order),
                                 train, t, m, cost)
        return None

    def _feasible(self, members: list[JobSpec], m: int, k: list[int], roll: list[float],
                  t_train: list[float]) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
        cap = self.cfg.host_mem_gb + _EPS
        n = len(members)
        budgets = [j.slo_budget_s for j in members]
        specs = {j.job_id: j for j in members}
        bound = min(budgets) + _EPS
        loads, mems = [0.0] * m, [0.0] * m
        assign: list[tuple[int, ...]] = [()] * n
        search = sorted(range(n), key=lambda i: (-k[i], -roll[i]))
        need_after = [sum(k[i] for i in search[p + 1:]) for p in range(n)]

        def leaf() -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
            for rest in permutations(range(1, n)):
                order = (0, *rest)
                jobs = [GroupJob(members[i].job_id, assign[i], roll[i], t_train[i]) for i in order]
                planned = worst_case_iteration_s(jobs, self.cfg)
                if any(planned[members[i].job_id] > budgets[i] + _EPS for i in order):
                    continue
                if self.realised is None or self.realised.admits(jobs, specs, self.cfg):
                    return order, list(assign)
            return None

        def dfs(pos: int, opened: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]] | None:
            if pos == n:
                return leaf() if opened == m else None
            i = search[pos]
            for reuse in range(min(k[i], opened), -1, -1):
                fresh = k[i] - reuse
                if opened + fresh > m or opened + fresh + need_after[pos] < m:
                    continue
                for old in combinations(range(opened), reuse):
                    nodes = old + tuple(range(opened, opened + fresh))
                    if any(loads[x] + roll[i] > bound or mems[x] + members[i].roll_mem_gb > cap for x in nodes):
                        continue
                    for x in nodes:
                        loads[x] += roll[i]
                        mems[x] += members[i].roll_mem_gb
                    assign[i] = nodes
                    found = dfs(pos + 1, opened + fresh)
                    for x in nodes:
                        loads[x] -= roll[i]
                        mems[x] -= members[i].roll_mem_gb
                    if found is not None:
                        return found
            return None

        return dfs(0, 0)


class OptimalPolicy:
    """The offline optimum as a replay policy: regroups every active job at every arrival and departure."""

    name = "optimal"
    repartitions = True

    def __init__(self, config: GroupConfig, realised: RealisedSloCheck | None = None) -> None:
        self.config = config
        self.realised = realised

    def repartition(self, active: Sequence[JobSpec], cluster: Cluster) -> None:
        """Replace every group of ``cluster`` by the optimal grouping of ``active`` (free regrouping)."""
        plans = optimal_groups(active, self.config, self.realised)
        by_id = {j.job_id: j for j in active}
        cluster.clear()
        for plan in plans:
            cluster.create_group([(by_id[j], idx) for j, idx in zip(plan.order, plan.assignment)],
                                 plan.train_nodes, plan.rollout_type, plan.rollout_nodes)
