"""Topology materialisation (OrchestrRL Algorithm 2): intent + demand + fabric state -> circuit plan.

Design note
-----------
``materialize`` is pure: it looks up (or fills, on the first iteration) the cached template for the
intent's signature, aggregates the demand at ToR and PoD scope, allocates OCS-Core circuits and
places them, sizes each PoD's lift/drop endpoints from the Core circuits that actually landed, then
allocates and places OCS-Agg circuits per PoD. Core circuits whose boundary fibre got no lift/drop
access are trimmed (with a note) so the result honours the Core-Agg coupling by construction; a
final independent validation guards the invariants anyway. If validation fails, the previous plan
stays active (Alg. 2 line 7).

Committing to devices is not this module's job: :class:`FabricController` hands an accepted plan
and its diff to a :class:`PlanCommitter` (the seam the OCS layer plugs into) and otherwise only
keeps the active plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol

from orchestrl.fabric.allocator import AllocationProblem, allocate
from orchestrl.fabric.intent import Intent
from orchestrl.fabric.plan import (Circuit, CircuitPlan, PlanDiff, circuits_from, diff_plans, is_uplink_endpoint,
                         place_agg, place_core, validate_plan)
from orchestrl.fabric.templates import TemplateCache, TemplateScope, pod_endpoint, select_template
from orchestrl.fabric.topology import PortRef, Topology, uplink_endpoint
from orchestrl.fabric.traffic import AggregateDemand, aggregate_intent, pod_flows_by_primitive

__all__ = ["FabricState", "MaterializeResult", "PlanCommitter", "FabricController", "materialize", "intent_scope"]


@dataclass(frozen=True)
class FabricState:
    """What Alg. 2 reads of the fabric: its wiring and masks, and the plan in force."""

    topology: Topology
    previous: CircuitPlan | None = None


@dataclass(frozen=True)
class MaterializeResult:
    """Outcome of one materialisation; ``plan`` is what should be active afterwards."""

    plan: CircuitPlan | None  # the new plan if accepted, else the previous one (may be None)
    accepted: bool
    cache_hit: bool
    template: str
    signature: str
    violations: tuple[str, ...] = ()  # why a candidate was refused
    candidate: CircuitPlan | None = None  # the refused candidate, for diagnosis
    solve_s: float = 0.0  # wall time of aggregate + allocate + place + validate
    demand: AggregateDemand | None = None


class PlanCommitter(Protocol):
    """Seam to the device layer: apply ``diff`` so that ``plan`` is what the devices hold."""

    def commit(self, plan: CircuitPlan, diff: PlanDiff) -> None: ...


def intent_scope(intent: Intent, topology: Topology, template_name: str) -> TemplateScope:
    """Return the template instantiated for the PoDs and PoD-level flows of ``intent``."""
    flows = pod_flows_by_primitive(intent, topology)
    pods = {topology.pod_of_gpu(g) for g in intent.members}
    return select_template(template_name).instantiate(flows, pods)


def _core_problem(topology: Topology, scope: TemplateScope, demand: AggregateDemand) -> AllocationProblem:
    core_demand = {(pod_endpoint(p), pod_endpoint(q)): x for (p, q), x in demand.pod_demand.items() if x > 0}
    ports = {}
    for pod in topology.pods:
        usable = len(topology.usable_boundary(pod))
        ports[pod_endpoint(pod)] = min(usable, scope.core_port_cap.get(pod, usable))
    eligible = frozenset(pair for pair in scope.core_pairs
                         if any((a, b) in core_demand for a in pair for b in pair if a != b))
    return AllocationProblem(topology.link_bps, ports, core_demand, eligible, scope.core_bipartite)


def _trim_core_to_bottleneck(problem: AllocationProblem, alloc) -> dict[tuple[str, str], int]:
    """Return the Core circuits with each pair cut to the fewest that keep it within the period's bottleneck.

    Algorithm 3 keeps adding circuits while any demanded pair has a free port at both ends, so
    once the bottleneck pair's PoDs run out of boundary fibres the spare ports go to pairs that
    are already far faster than it. On OCS-Core those circuits are not free: each needs a lift/drop
    circuit in both PoDs (Appendix D's Core-Agg coupling), which the Agg plan serves before any
    ToR-to-ToR pair, so a tiny cross-PoD pipeline transfer beside a large all-to-all took half of
    every ToR's uplinks and halved the all-to-all (2.69 -> 5.37 ms, Qwen3-235B on 2,048 GPUs).
    Cutting a pair to ``ceil(max(D_uv, D_vu) / (T* B))`` circuits, ``T*`` the worst served pair
    time, leaves the period's bottleneck (the Core objective) unchanged and every pair still
    served. O(P) for P pairs.
    """
    if not alloc.circuits or not alloc.max_pair_time_s > 0:
        return dict(alloc.circuits)
    worst = alloc.max_pair_time_s
    out = {}
    for (a, b), n in alloc.circuits.items():
        heavier = max(problem.demand.get((a, b), 0.0), problem.demand.get((b, a), 0.0))
        need = max(1, math.ceil(heavier * 8.0 / (worst * problem.link_bps) - 1e-9))
        out[(a, b)] = min(n, need)
    return out


def _agg_problem(topology: Topology, pod: int, scope: TemplateScope, demand: Mapping[tuple[str, str], float],
                 fibres: Mapping[tuple[int, int], list]) -> AllocationProblem:
    ports = {t: len(topology.usable_uplinks(t)) for t in topology.tors_by_pod[pod]}
    for (p, q), fs in fibres.items():
        if p == pod:
            ports[uplink_endpoint(p, q)] = len(fs)
    eligible = set()
    for (a, b), x in demand.items():
        if x <= 0 or a not in ports or b not in ports:
            continue
        lift = is_uplink_endpoint(a) or is_uplink_endpoint(b)
        if (lift and scope.agg_lift_drop) or (not lift and scope.agg_tor_tor):
            eligible.add(frozenset((a, b)))
    return AllocationProblem(topology.link_bps, ports, dict(demand), frozenset(eligible), False)


def _allocate_agg(problem: AllocationProblem, method: str, *, relay: bool = True) -> dict[tuple[str, str], int]:
    """Allocate one PoD's OCS-Agg circuits: lift/drop access first, ToR-to-ToR on what is left.

    A Core circuit carries nothing unless both PoDs cross-connect its boundary fibre down to a ToR
    (the Core-Agg coupling of Appendix D), and inter-PoD transfers (weight-sync Phase A, gradient
    sync across PoDs, response streaming) are the ones the period waits for. Run jointly, the
    greedy of Algorithm 3 would hand the ToR uplinks to the largest intra-PoD pairs first and strand
    the Core circuits, so the access pairs are served first and the ToR-to-ToR pairs share the
    remaining ToR ports. Both passes are Algorithm 3 unchanged.

    With fewer boundary fibres than ToRs asking for access (a port-starved boundary), the first
    pass lifts only some ToRs and the others' cross-PoD bytes would have no path. With ``relay``
    (the template's ``relay_unlifted``: every template that allows ToR-to-ToR circuits except Gen's
    deliberate Core slice) each such ToR's access demand becomes demand to a lifted ToR, served in
    the second pass: its traffic rides ToR -> lifted ToR -> boundary, one
    extra EPS hop, instead of never arriving.

    Notes
    -----
    Two greedy runs: O((P + K) log P) for P demanded pairs and K circuits.
    """
    def is_access(pair: frozenset[str]) -> bool:
        return any(is_uplink_endpoint(e) for e in pair)

    access = frozenset(p for p in problem.eligible if is_access(p))
    if not access or (access == problem.eligible and not relay):
        return dict(allocate(problem, method).circuits)
    first = allocate(replace(problem, eligible=access), method)
    left = dict(problem.ports)
    for endpoint, n in first.ports_used().items():
        left[endpoint] -= n
    demand, rest = dict(problem.demand), problem.eligible - access
    if relay:
        demand, relayed = _relay_unlifted(problem, first.circuits, left)
        rest |= relayed
    if not rest:
        return dict(first.circuits)
    second = allocate(replace(problem, ports=left, demand=demand, eligible=rest), method)
    counts = dict(first.circuits)
    for pair, n in second.circuits.items():
        counts[pair] = counts.get(pair, 0) + n
    return counts


def _relay_unlifted(problem: AllocationProblem, lifts: Mapping[tuple[str, str], int], left: Mapping[str, int]
                    ) -> tuple[dict[tuple[str, str], float], set[frozenset[str]]]:
    """Move the access demand of ToRs the first pass left unlifted onto ToR pairs with a lifted ToR.

    Each unlifted ToR relays through the lifted ToR with the most free ports (ties: name), its
    bytes to and from the boundary becoming bytes to and from that ToR. Returns the new demand and
    the ToR pairs made eligible.
    """
    demand = dict(problem.demand)
    eligible: set[frozenset[str]] = set()
    lifted = {e for pair, n in lifts.items() if n > 0 for e in pair if not is_uplink_endpoint(e)}
    if not lifted:
        return demand, eligible
    up: dict[str, float] = {}  # unlifted ToR -> bytes toward the boundary
    down: dict[str, float] = {}  # and from it
    for (src, dst), x in problem.demand.items():
        if frozenset((src, dst)) not in problem.eligible:
            continue
        if is_uplink_endpoint(dst) and not is_uplink_endpoint(src) and src not in lifted:
            up[src] = up.get(src, 0.0) + x
        elif is_uplink_endpoint(src) and not is_uplink_endpoint(dst) and dst not in lifted:
            down[dst] = down.get(dst, 0.0) + x
    share = dict.fromkeys(lifted, 0)
    for tor in sorted(set(up) | set(down), key=lambda t: (-up.get(t, 0.0) - down.get(t, 0.0), t)):
        via = max(sorted(lifted), key=lambda t: left.get(t, 0) - share[t])
        share[via] += 1
        demand[(tor, via)] = demand.get((tor, via), 0.0) + up.get(tor, 0.0)
        demand[(via, tor)] = demand.get((via, tor), 0.0) + down.get(tor, 0.0)
        eligible.add(frozenset((tor, via)))
    return demand, eligible


def _trim_uncoupled(core: list[Circuit], agg: list[Circuit], topology: Topology) -> tuple[list[Circuit], list[Circuit], list[str]]:
    """Drop Core circuits lacking lift/drop access at either end, and lift/drop left dangling."""
    fibre_by_agg, fibre_by_core = topology.fibre_by_agg, topology.fibre_by_core
    lifted = {r for c in agg for r in c.xc.ports() if r in fibre_by_agg}
    notes: list[str] = []
    kept_core = []
    for c in core:
        fa, fb = (fibre_by_core[r] for r in c.xc.ports())
        if fa.agg in lifted and fb.agg in lifted:
            kept_core.append(c)
        else:
            notes.append(f"core circuit {c.a}-{c.b} ({c.xc}) trimmed: no lift/drop access in "
                         f"{'both PoDs' if fa.agg not in lifted and fb.agg not in lifted else 'one PoD'}")
    carried = {fibre_by_core[r].agg for c in kept_core for r in c.xc.ports()}
    kept_agg = []
    for c in agg:
        boundary = [r for r in c.xc.ports() if r in fibre_by_agg]
        if boundary and boundary[0] not in carried:
            notes.append(f"lift/drop circuit {c.a}-{c.b} ({c.xc}) trimmed: its core circuit was trimmed")
            continue
        kept_agg.append(c)
    return kept_core, kept_agg, notes


def materialize(intent: Intent, state: FabricState, cache: TemplateCache, *, demand: AggregateDemand | None = None,
                method: str = "greedy") -> MaterializeResult:
    """Return the plan to activate for ``intent``'s next communication period (Algorithm 2).

    Parameters
    ----------
    intent : Intent
        Stage, primitive mix, group membership and volumes of the upcoming period.
    state : FabricState
        Topology (with masked ports) and the plan currently in force.
    cache : TemplateCache
        Filled on the first iteration of a period, reused afterwards (Phase 1 of §5.3).
    demand : AggregateDemand, optional
        Pre-aggregated demand; computed from the intent's collectives when omitted.
    method : {"greedy", "uniform", "optimal"}
        Allocation procedure stored with a new cache entry (an existing entry keeps its own).

    Returns
    -------
    MaterializeResult
        ``accepted`` with the new plan, or not accepted with ``plan`` = the previous plan and the
        violations that caused the refusal.

    Notes
    -----
    Cost is dominated by demand aggregation, O(R) in rank pairs, plus the greedy allocations,
    O((P + K) log P) per tier/PoD for P demanded pairs and K circuits.
    """
    started = time.perf_counter()
    topology = state.topology
    signature = intent.signature()
    entry, hit = cache.get_or_create(signature, intent.stage, intent.period, intent.template, method)
    scope = intent_scope(intent, topology, entry.template)
    if demand is None:
        demand = aggregate_intent(intent, topology)

    used: set[PortRef] = set()
    core_problem = _core_problem(topology, scope, demand)
    core_alloc = allocate(core_problem, entry.method) if core_problem.demand else None
    core_counts = _trim_core_to_bottleneck(core_problem, core_alloc) if core_alloc else {}
    core_circuits, fibres, notes = place_core(topology, core_counts, used)
    agg_circuits: list[Circuit] = []
    agg_demand_out: dict[int, dict[tuple[str, str], float]] = {}
    for pod in topology.pods:
        pod_demand = {k: x for k, x in demand.tor_demand.get(pod, {}).items() if x > 0}
        if not pod_demand:
            continue
        counts = _allocate_agg(_agg_problem(topology, pod, scope, pod_demand, fibres), entry.method,
                               relay=scope.relay_unlifted)
        ups = {uplink_endpoint(p, q): fs for (p, q), fs in fibres.items() if p == pod}
        placed, pod_notes = place_agg(topology, pod, counts, ups, used)
        agg_circuits.extend(placed)
        notes.extend(pod_notes)
        agg_demand_out[pod] = pod_demand
    core_circuits, agg_circuits, trim_notes = _trim_uncoupled(core_circuits, agg_circuits, topology)
    notes.extend(trim_notes)
    core_demand = {(pod_endpoint(p), pod_endpoint(q)): x for (p, q), x in demand.pod_demand.items() if x > 0}
    candidate = CircuitPlan(topology.name, entry.template, signature, topology.link_bps,
                            circuits_from(core_circuits + agg_circuits), core_demand, agg_demand_out,
                            tuple(notes), entry.method)
    violations = validate_plan(candidate, topology, scope)
    solve_s = time.perf_counter() - started
    if violations:
        return MaterializeResult(state.previous, False, hit, entry.template, signature, tuple(violations),
                                 candidate, solve_s, demand)
    return MaterializeResult(candidate, True, hit, entry.template, signature, (), candidate, solve_s, demand)


@dataclass
class FabricController:
    """Stateful shell around :func:`materialize`: keeps the cache and the active plan.

    ``committer`` is called with every accepted plan and its diff against the active plan; when it
    raises, the active plan does not change (the OCS layer journals and reconciles, next issue).
    """

    topology: Topology
    cache: TemplateCache = field(default_factory=TemplateCache)
    method: str = "greedy"
    committer: PlanCommitter | None = None
    active: CircuitPlan | None = None
    history: list[MaterializeResult] = field(default_factory=list)
    last_intent: Intent | None = None  # what the latest plan was made for, to re-plan after a port fails

    def materialize(self, intent: Intent, demand: AggregateDemand | None = None) -> MaterializeResult:
        self.last_intent = intent
        result = materialize(intent, FabricState(self.topology, self.active), self.cache, demand=demand,
                             method=self.method)
        self.history.append(result)
        del self.history[:-256]  # a long-running proxy keeps only recent results
        return result

    def apply(self, result: MaterializeResult) -> PlanDiff | None:
        """Make an accepted result's plan active (through the committer, if any); return its diff."""
        if not result.accepted or result.plan is None:
            return None
        diff = diff_plans(self.active, result.plan)
        if self.committer is not None:
            self.committer.commit(result.plan, diff)
        self.active = result.plan
        return diff

    def mask_ports(self, ports: list[tuple[str, int, str]]) -> None:
        """Mask failed or reserved ports; later plans allocate under the remaining budget (§5.4)."""
        self.topology = self.topology.with_masked(ports)
