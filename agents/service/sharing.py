"""How tenants see the fabric when they plan: other jobs' circuits reserved, OCS-Core capped at a fair share.

These methods belong to :class:`agents.service.core.ControlService`; the policy itself (max-min
fair shares of each PoD's boundary fibres over the tenants' asks) is the pure
:mod:`agents.service.fairness`. A job that gets less than its share is marked starved, and the jobs
holding more than theirs are queued for a re-plan that runs once the current service call is done.
"""

from __future__ import annotations

from typing import Any

from orchestrl.agents.service.decisions import GATE_FAMILY
from orchestrl.agents.service.fairness import cap_ports, core_fibres_by_pod, fair_shares
from orchestrl.agents.service.startup import ADOPTED_SCOPE
from orchestrl.fabric.controller import MaterializeResult
from orchestrl.fabric.intent import Intent
from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.topology import Topology

__all__ = ["SharingMixin"]


class SharingMixin:
    """Views, fair shares and starvation (see :class:`agents.service.core.ControlService`)."""

    def _others(self, job_id: str) -> dict[str, CircuitPlan]:
        """Plans of the other tenants (and adopted circuits) that hold ports this job could reach."""
        pods = self._job(job_id).placement.pods
        out = {j: t.active for j, t in self._tenants.items() if j != job_id and t.active is not None
               and not t.job.startswith("fabric/") and self._job(j).placement.pods & pods}
        adopted = self._tenants.get(ADOPTED_SCOPE)
        if adopted is not None and adopted.active is not None:
            out[ADOPTED_SCOPE] = adopted.active
        return out

    def _view(self, job_id: str, shares: dict[int, int] | None = None) -> Topology:
        """The topology as ``job_id`` may use it: other jobs' circuits reserved, OCS-Core capped at its fair share."""
        pods = self._job(job_id).placement.pods
        others = self._others(job_id)
        adopted = others.get(ADOPTED_SCOPE)
        everywhere = frozenset(r for c in adopted.circuits for r in c.xc.ports()) if adopted else frozenset()
        if shares:
            mine = self._tenants[job_id].active
            keep = {r for c in mine.circuits for r in c.xc.ports()} if mine else set()
            taken = {r for j, p in others.items() for c in p.circuits for r in c.xc.ports()}
            everywhere |= frozenset(cap_ports(self.controller.topology, shares, keep, taken))
        return self.planner.view(pods, others, everywhere)

    def _shares(self, tenant: Any, intent: Intent) -> dict[int, int] | None:
        """The job's fair share of each PoD's boundary fibres, when another job shares one of its PoDs (else None)."""
        pods = self._job(tenant.job).placement.pods
        rivals = [j for j in self._tenants if j != tenant.job and not j.startswith("fabric/")
                  and self.registry.get(j) is not None and self._job(j).placement.pods & pods]
        if not rivals:
            tenant.core_asked = None
            return None
        alone = self.planner.materialize(intent, self.planner.view(pods, {}), tenant.active)
        tenant.core_asked = core_fibres_by_pod(alone.candidate, self.controller.topology) if alone.candidate else {}
        tenant.core_asked_circuits = sum(1 for c in alone.candidate.circuits if c.tier == "core") \
            if alone.candidate else 0
        tenant.core_asks[GATE_FAMILY.get(intent.stage, intent.stage)] = dict(tenant.core_asked)
        asks = {j: self._standing_demand(j) for j in [tenant.job, *rivals]}
        pods_of = {j: self._job(j).placement.pods for j in asks}
        return fair_shares(self.controller.topology, asks, pods_of)[tenant.job]

    def _standing_demand(self, job: str) -> dict[int, int]:
        """A job's claim on each PoD's boundary fibres: its largest ask over its latest intent of each stage family.

        Shares are computed over these claims, not over what each job asks this very period, so a job's
        weight-sync claim holds while it trains: two jobs that both need the whole core get half each in
        every one of their periods, whether or not their periods overlap (docs/operations.md, Tenants). A job
        that never announced an intent claims what it holds.
        """
        t = self._tenants[job]
        if not t.core_asks:
            return core_fibres_by_pod(t.active, self.controller.topology)
        out: dict[int, int] = {}
        for ask in t.core_asks.values():
            for pod, n in ask.items():
                out[pod] = max(out.get(pod, 0), n)
        return out

    def _materialize(self, tenant: Any, intent: Intent) -> MaterializeResult:
        shares = self._shares(tenant, intent)
        result = self.planner.materialize(intent, self._view(tenant.job, shares), tenant.active)
        self._fairness_note(tenant, result, shares)
        return result

    def _fairness_note(self, tenant: Any, result: MaterializeResult, shares: dict[int, int] | None) -> None:
        """Record what the plan got of OCS-Core; a job short of its fair share is starved, and over-share rivals shrink."""
        topo = self.controller.topology
        got_by_pod = core_fibres_by_pod(result.candidate, topo) if result.candidate else {}
        tenant.starved = False
        self.metrics.set("orchestrl_core_circuits_asked", tenant.core_asked_circuits, job=tenant.job)
        self.metrics.set("orchestrl_core_circuits_granted", sum(1 for c in result.candidate.circuits if c.tier == "core")
                         if result.candidate else 0, job=tenant.job)
        if not shares or tenant.core_asked is None:
            return
        short = {p: min(tenant.core_asked.get(p, 0), s) - got_by_pod.get(p, 0) for p, s in shares.items()}
        if any(v > 0 for v in short.values()):
            tenant.starved = True
            self._shrink_over_share(tenant.job, {p for p, v in short.items() if v > 0})

    def _shrink_over_share(self, starved_job: str, pods: set[int]) -> None:
        """Re-plan the jobs that hold more than their fair share of boundary fibres in ``pods``."""
        for j, t in list(self._tenants.items()):
            if j == starved_job or j.startswith("fabric/") or t.active is None or t.removing:
                continue
            job = self.registry.get(j)
            if job is None or job.intent_doc is None or not (job.placement.pods & pods):
                continue
            held = core_fibres_by_pod(t.active, self.controller.topology)
            intent = self.planner.parse(job.intent_doc)
            shares = self._shares(t, intent) or {}
            if any(held.get(p, 0) > shares.get(p, held.get(p, 0)) for p in pods):
                self._replan_later.add(j)
