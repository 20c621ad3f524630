"""The control service core (no HTTP): jobs announce intents, the fabric follows in safe windows.

Design note
-----------
One :class:`ControlService` owns the fabric: the planning core (:class:`FabricController` for the
topology, masks and template cache), one TL1 driver per OCS device, the durable journal
(:class:`FabricStore`) and, per job, safe-window gates (:class:`SafeWindowGate`). Each job's
circuits are journalled under their own scope (``job/<id>``), so a job's plan is replaced as a
whole every period while other tenants' circuits stay untouched.

An announced intent runs Algorithm 2 under the job's view of the fabric (ports other jobs'
circuits hold in its reach are reserved); parsing, planning and ordering are remembered across
iterations (:class:`agents.service.planner.JobPlanner`). An accepted plan is offered to the gate of its
stage family (train and train-dp share one; gen and weight sync have their own, §5.2) with the
time the devices will switch: the devices of one step switch together, so that is, per add step of
the non-blocking order, the slowest device of the step. It is committed at once, or kept pending
and retried when later boundary events open a window. A commit re-checks the plan against the
fabric as it is *now* (§5.3), refuses any circuit outside the job's placement, and applies the
change in the non-blocking order of §5.4 as a chain of journalled commits
(:mod:`agents.service.ordered_commit`, :mod:`fabric.runtime.commit`). A device refusal rolls the step back to
every job's last committed circuits (a job's rollback never touches another job's), masks a
failed port and re-plans once under the remaining port budget (§5.4). Every outcome becomes a
:class:`PeriodDecision`, journalled in the store's decision log and counted in the metrics.

All state changes take one lock, so decisions and device commands are totally ordered; the HTTP
layer only translates.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from agents.service.jobs import JobConflict, JobRegistry
from agents.service.decisions import GATE_FAMILY, PeriodDecision, scope_of
from agents.service.planner import JobPlanner
from agents.service.metrics import MetricsRegistry, declare_service_metrics
from agents.service.ordered_commit import OrderedCommit, PlannedChange, apply_in_order
from agents.service.checks import (Conflict, NotFound, integral, ServiceError, Unprocessable, parse_events,
                                   parse_mask_ports)
from fabric.controller import FabricController, MaterializeResult
from fabric.errors import ConfigError
from fabric.intent import Intent, parse_gpu_set
from fabric.plan import CircuitPlan, plan_to_json, same_cross_connects, validate_plan
from fabric.runtime.commit import CommitError, CommitInFlightError
from fabric.runtime.reconcile import reconcile
from fabric.safe_window import CommitDecision, EventOrderError, GateConfig, SafeWindowGate
from fabric.runtime.store import FabricStore
from fabric.templates.cache import TemplateCache
from fabric.templates.stages import TEMPLATES
from fabric.topology import Topology

__all__ = ["ControlService", "PeriodDecision", "ServiceError", "GATE_FAMILY", "scope_of"]

@dataclass
class _Pending:
    result: MaterializeResult
    intent: Intent
    plan_id: str
    family: str
    change: PlannedChange | None = None  # non-blocking order from the active plan and its steps (§5.4)
    epoch: int = 0  # fabric changes seen when planned; a later commit re-checks the plan


def _base(job: str, plan_id: str, intent: Intent, result: MaterializeResult, t_s: float) -> dict[str, Any]:
    """The fields of a plan's decisions that are known once it is materialised."""
    return dict(plan_id=plan_id, job=job, stage=intent.stage, period=intent.period, template=result.template,
                cache_hit=result.cache_hit, plan_s=result.solve_s, t_s=t_s, switch_delay_s=0.0, device_s=0.0,
                window_s=None, circuits=len(result.candidate.circuits) if result.candidate else 0)


@dataclass
class _Tenant:
    job: str
    gates: dict[str, SafeWindowGate]
    active: CircuitPlan | None = None
    pending: _Pending | None = None
    plans: int = 0
    last_t_s: float = float("-inf")


class ControlService:
    """Serve jobs' intents on one fabric: plan, gate, journal, drive the devices.

    Parameters
    ----------
    topology : Topology
        The fabric.
    devices : mapping of str to OcsDeviceClient
        One client per topology device (TL1 drivers in production, emulated switches in tests).
    store : FabricStore
        Journal, masks, template cache and decision log.
    registry : JobRegistry
        Tenants and tokens.
    switch_delay_s : mapping of str to float, optional
        Switching time per device (default: the topology's technology of each device).
    gate_config : GateConfig, optional
        Safe-window settings of every gate.
    """

    def __init__(self, topology: Topology, devices: Mapping[str, Any], store: FabricStore, registry: JobRegistry,
                 *, switch_delay_s: Mapping[str, float] | None = None, gate_config: GateConfig | None = None) -> None:
        self.controller = FabricController(topology)
        self.devices = dict(devices)
        self.store = store
        self.registry = registry
        self.switch_delay_s = {d: (switch_delay_s or {}).get(d, dev.technology.switch_delay_s)
                               for d, dev in topology.devices.items()}
        self.gate_config = gate_config or GateConfig()
        self.metrics = declare_service_metrics(MetricsRegistry())
        self.started_at = time.time()
        self.last_reconcile: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._tenants: dict[str, _Tenant] = {}
        self._epoch = 0  # bumped by every commit and mask: plans made before need the final check
        self.planner = JobPlanner(self.controller, store, self.metrics)  # remembers what recurs every iteration

    # ------------------------------------------------------------------ start-up
    def recover(self) -> dict[str, Any]:
        """Reconcile every device to the journal, mask failed ports and re-plan the jobs hit (§5.4)."""
        with self._lock:
            masked = [(m.device, m.port, m.reason) for m in self.store.masked_ports()
                      if m.device in self.controller.topology.devices]
            if masked:
                self.controller.mask_ports(masked)
            self.controller.cache = TemplateCache(self.store.load_template_cache().entries())
            started = time.perf_counter()
            report = reconcile(self.store, self.devices)
            took = time.perf_counter() - started
            self.metrics.inc("orchestrl_reconciliations_total", outcome="ok" if report.ok else "incomplete")
            self.metrics.inc("orchestrl_reconcile_changes_total", report.changes)
            self.metrics.observe("orchestrl_reconcile_seconds", took)
            self._epoch += 1
            if report.failed_ports:
                self.controller.mask_ports(report.failed_ports)
                self.metrics.inc("orchestrl_device_faults_total", len(report.failed_ports), kind="failed-port")
            for job in self.registry.jobs():
                self._tenant(job.id).active = self.store.last_committed_plan(scope_of(job.id))
            hit, replanned = set(report.unserved), []
            for job in self.registry.jobs():  # jobs that lost circuits to failed ports: re-plan (§5.4)
                lost = any(c.xc in hit for rec in self.store.history(scope_of(job.id), limit=2) for c in rec.plan.circuits)
                if lost and job.intent_doc is not None:
                    replanned.append(self.announce_intent(job.id, job.intent_doc).to_json())
            self.metrics.set("orchestrl_jobs", len(self.registry.jobs()))
            self._set_gauges()
            self.last_reconcile = {"ok": report.ok, "changes": report.changes, "seconds": took,
                                   "failed_ports": [list(p) for p in report.failed_ports],
                                   "resolved_commits": list(report.resolved_commits),
                                   "missing_devices": list(report.missing_devices), "replanned": replanned}
            return self.last_reconcile

    # ------------------------------------------------------------------ jobs
    def register_job(self, job_id: Any, gpus: Any) -> tuple[dict[str, Any], str]:
        """Register a job on ``gpus`` (indices or ``"0-31,64"``); return its description and new token.

        Raises
        ------
        Unprocessable, Conflict
            A malformed job id or GPU set; a placement clashing with another job's ToRs.
        """
        gpus = [integral(g) for g in gpus] if isinstance(gpus, list) else integral(gpus)
        try:
            gpu_set = parse_gpu_set(gpus, "request body", "gpus", self.controller.topology)
        except ConfigError as exc:
            raise Unprocessable(exc.field, str(exc)) from None
        with self._lock:
            try:
                job, token = self.registry.register(job_id, gpu_set)
            except ConfigError as exc:
                raise Unprocessable(exc.field, str(exc)) from None
            except JobConflict as exc:
                raise Conflict(str(exc), "gpus") from None
            self._tenant(job.id)
            self.metrics.set("orchestrl_jobs", len(self.registry.jobs()))
            return self.job_doc(job.id), token

    def job_doc(self, job_id: str) -> dict[str, Any]:
        """Return a job's placement as the API shows it (GPU count, ToRs, PoDs)."""
        job = self._job(job_id)
        p = job.placement
        return {"job": job.id, "gpus": len(p.gpus), "tors": sorted(p.tors), "pods": sorted(p.pods),
                "registered_at": job.registered_at}

    def _job(self, job_id: str):
        job = self.registry.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r} is registered; the operator registers jobs with POST /v1/jobs")
        return job

    def _tenant(self, job_id: str) -> _Tenant:
        if job_id not in self._tenants:
            self._tenants[job_id] = _Tenant(job_id, {f: SafeWindowGate(self.gate_config) for f in set(GATE_FAMILY.values())})
        return self._tenants[job_id]

    # ------------------------------------------------------------------ intents
    def announce_intent(self, job_id: str, doc: Mapping[str, Any]) -> "PeriodDecision":
        """Materialise the intent ``doc`` of ``job_id`` and commit it now or in a later safe window.

        Raises
        ------
        NotFound, Forbidden, Unprocessable
            Unknown job; GPUs outside the job's placement (naming the foreign ToRs and PoDs); a
            malformed intent (naming the field).
        """
        with self._lock:
            job = self._job(job_id)
            doc = dict(doc)
            t_s = doc.pop("t_s", None)
            if t_s is not None and (isinstance(t_s, bool) or not isinstance(t_s, (int, float)) or t_s != t_s
                                    or abs(t_s) == float("inf")):
                raise Unprocessable("t_s", f"expected a finite number (job clock, seconds), got {t_s!r}")
            if doc.setdefault("job", job_id) != job_id:
                raise Unprocessable("job", f"is {doc['job']!r} but the intent is posted for job {job_id!r}; "
                                           "omit it or use the job of the path")
            if doc.get("template") is not None and (not isinstance(doc["template"], str) or doc["template"] not in TEMPLATES):
                raise Unprocessable("template", f"unknown template {doc['template']!r} "
                                                f"(allowed: {', '.join(TEMPLATES)})")
            try:
                intent = self.planner.parse(doc)
            except ConfigError as exc:
                raise Unprocessable(exc.field, str(exc)) from None
            self.planner.check_inside(intent, job, self.registry)
            self.registry.remember_intent(job_id, doc)
            tenant = self._tenant(job_id)
            family = GATE_FAMILY[intent.stage]
            now = max(float(t_s) if t_s is not None else tenant.last_t_s, tenant.last_t_s)
            tenant.last_t_s = now if now > float("-inf") else 0.0
            return self._offer(tenant, intent, family, tenant.last_t_s)

    def clear_memos(self) -> None:
        """Forget remembered parses, plans and orders (as after a restart; e.g. to time a first iteration)."""
        with self._lock:
            self.planner.clear()

    def _view(self, job_id: str) -> Topology:
        """The topology as ``job_id`` may use it: other jobs' circuits in its reach are reserved."""
        pods = self._job(job_id).placement.pods
        return self.planner.view(pods, {j: t.active for j, t in self._tenants.items() if j != job_id and
                                        t.active is not None and self._job(j).placement.pods & pods})

    def _materialize(self, tenant: _Tenant, intent: Intent) -> MaterializeResult:
        return self.planner.materialize(intent, self._view(tenant.job), tenant.active)

    def _offer(self, tenant: _Tenant, intent: Intent, family: str, now_s: float) -> PeriodDecision:
        result = self._materialize(tenant, intent)
        tenant.plans += 1
        plan_id = f"{tenant.job}#{tenant.plans}"
        base = _base(tenant.job, plan_id, intent, result, now_s)
        if not result.accepted:
            return self._record(PeriodDecision(decision="refused", reason="; ".join(result.violations[:5]), **base))
        for gate in tenant.gates.values():
            gate.withdraw(tenant.job)  # a newer plan of the job supersedes any pending one
        tenant.pending = None
        if same_cross_connects(tenant.active, result.plan):
            return self._commit(tenant, _Pending(result, intent, plan_id, family, None, self._epoch), base,
                                "no device change needed")
        change = self.planner.change(tenant.active, result.plan)
        pending = _Pending(result, intent, plan_id, family, change, self._epoch)
        base["switch_delay_s"] = change.switching_time_s(self.switch_delay_s)  # devices of a step switch together
        d = tenant.gates[family].submit(tenant.job, intent.stage, base["switch_delay_s"], now_s, plan_id)
        return self._settle(tenant, pending, d, base)

    def _settle(self, tenant: _Tenant, pending: _Pending, d: CommitDecision, base: dict) -> PeriodDecision:
        base = {**base, "window_s": d.window_s, "attempt": d.attempt, "t_s": d.at_s}
        if d.action == "commit":
            return self._commit(tenant, pending, base, d.reason)
        tenant.pending = pending if d.action == "defer" else None
        if d.action == "defer":
            self.metrics.inc("orchestrl_deferrals_total", job=tenant.job)
        return self._record(PeriodDecision(decision=d.action, reason=d.reason, **base))

    # ------------------------------------------------------------------ commits
    def _commit(self, tenant: _Tenant, pending: _Pending, base: dict, why: str) -> PeriodDecision:
        tenant.pending = None
        plan, change = pending.result.plan, pending.change
        # §5.3's final check, needed only when the fabric changed (a commit or a mask) since planning
        if pending.epoch != self._epoch and validate_plan(plan, self._view(tenant.job)):
            pending = replace(pending, result=self._materialize(tenant, pending.intent))
            if not pending.result.accepted:
                return self._record(PeriodDecision(**{**base, "decision": "refused", "reason": "fabric changed "
                                    "since planning and the re-plan is invalid: " + "; ".join(pending.result.violations[:3])}))
            plan, change = pending.result.plan, None
        outside = self.planner.outside(plan, self._job(tenant.job))
        if outside:
            return self._record(PeriodDecision(**{**base, "decision": "refused", "reason": "; ".join(outside[:3])}))
        started = time.perf_counter()
        try:
            report = self._apply(tenant, plan, change)
        except CommitError as exc:  # its rollback kept every job's circuits; earlier steps stay committed
            self.metrics.inc("orchestrl_device_faults_total", kind="commit-error")
            tenant.active = self.store.last_committed_plan(scope_of(tenant.job))
            if not exc.failed_ports:
                return self._failed(tenant, base, str(exc), started)
            self.controller.mask_ports(exc.failed_ports)  # §5.4: mask, re-plan under the remaining budget
            self._epoch += 1
            self.metrics.inc("orchestrl_device_faults_total", len(exc.failed_ports), kind="failed-port")
            retry = self._materialize(tenant, pending.intent)
            if not retry.accepted:
                return self._failed(tenant, base, f"{exc}; re-plan refused: {'; '.join(retry.violations[:3])}", started)
            plan = retry.plan
            try:
                report = self._apply(tenant, plan)
            except CommitError as again:
                return self._failed(tenant, base, str(again), started)
            why = f"{why}; ports {', '.join(f'{d}:{p}' for d, p, _ in exc.failed_ports)} failed, masked and re-planned"
        took = time.perf_counter() - started
        tenant.active = plan
        self._epoch += 1
        self.metrics.observe("orchestrl_commit_latency_seconds", took)
        self.metrics.inc("orchestrl_circuits_changed_total", report.added, action="add")
        self.metrics.inc("orchestrl_circuits_changed_total", report.removed, action="remove")
        self._set_gauges()
        return self._record(PeriodDecision(**{
            **base, "decision": "commit" if report.devices else "unchanged", "device_s": took,
            "reason": why + (f"; outage: {'; '.join(report.outages)}" if report.outages else ""),
            "circuits": len(plan.circuits), "removed": report.removed, "added": report.added,
            "devices": report.devices, "commit_id": report.commit_id, "steps": report.steps}))

    def _apply(self, tenant: _Tenant, plan: CircuitPlan, change: PlannedChange | None = None) -> OrderedCommit:
        scope = scope_of(tenant.job)
        try:
            return apply_in_order(self.store, tenant.active, plan, self.devices, scope=scope, change=change)
        except CommitInFlightError:  # an earlier commit was cut short: restore the devices first
            self.metrics.inc("orchestrl_reconciliations_total", outcome="before-commit")
            reconcile(self.store, self.devices)
            tenant.active = self.store.last_committed_plan(scope)
            return apply_in_order(self.store, tenant.active, plan, self.devices, scope=scope)

    def _failed(self, tenant: _Tenant, base: dict, reason: str, started: float) -> PeriodDecision:
        took = time.perf_counter() - started
        return self._record(PeriodDecision(**{**base, "decision": "failed", "reason": reason, "device_s": took}))

    def _record(self, d: PeriodDecision) -> PeriodDecision:
        self.metrics.inc("orchestrl_decisions_total", decision=d.decision)
        self.store.log_decision(scope_of(d.job), d.decision, d.to_json())
        return d

    def _set_gauges(self) -> None:
        for job, t in self._tenants.items():
            self.metrics.set("orchestrl_circuits", len(t.active.circuits) if t.active else 0, job=job)
        self.metrics.set("orchestrl_masked_ports", len(self.controller.topology.masked))

    # ------------------------------------------------------------------ events
    def report_events(self, job_id: str, events: Any) -> dict[str, Any]:
        """Feed a batch of boundary events to the job's gates; commit plans whose window opened.

        The batch is validated whole first (a malformed event refuses the batch, naming
        ``events[i].<field>``); events out of time order are listed in ``rejected`` and skipped.
        """
        parsed = parse_events(events)
        with self._lock:
            self._job(job_id)
            tenant = self._tenant(job_id)
            rejected, decisions = [], []
            for i, ev in sorted(enumerate(parsed), key=lambda x: x[1].t_s):
                try:
                    out = tenant.gates[GATE_FAMILY[ev.stage]].observe(ev)
                except EventOrderError as exc:
                    rejected.append({"index": i, "reason": str(exc)})
                    continue
                tenant.last_t_s = max(tenant.last_t_s, ev.t_s)
                for d in out:
                    p = tenant.pending
                    if p is None or d.plan_id != p.plan_id:
                        continue
                    base = {**_base(job_id, p.plan_id, p.intent, p.result, d.at_s), "switch_delay_s": d.switch_delay_s}
                    decisions.append(self._settle(tenant, p, d, base).to_json())
            self.metrics.inc("orchestrl_events_total", len(parsed) - len(rejected), result="accepted")
            self.metrics.inc("orchestrl_events_total", len(rejected), result="rejected")
            return {"accepted": len(parsed) - len(rejected), "rejected": rejected, "decisions": decisions}

    # ------------------------------------------------------------------ operator
    def mask_ports(self, ports: Any, replan: bool = True) -> dict[str, Any]:
        """Mask ports (operator); re-plan every job whose circuits use one of them."""
        wanted = parse_mask_ports(ports, self.controller.topology)
        with self._lock:
            fresh = self.store.mask_ports(wanted)
            self.controller.mask_ports(wanted)
            self._epoch += 1
            hit = {(d, p) for d, p, _ in wanted}
            replanned = []
            for job in self.registry.jobs():
                t = self._tenant(job.id)
                uses = t.active is not None and any((r.device, r.port) in hit for c in t.active.circuits
                                                    for r in c.xc.ports())
                if replan and uses and job.intent_doc is not None:
                    replanned.append(self.announce_intent(job.id, job.intent_doc).to_json())
            self._set_gauges()
            return {"masked": [{"device": d, "port": p, "reason": r} for d, p, r in wanted],
                    "newly_masked": len(fresh), "replanned": replanned}

    # ------------------------------------------------------------------ reads
    def plan_doc(self, job_id: str | None = None) -> dict[str, Any]:
        """Return the active plan and pending plan id of one job, or of every job."""
        with self._lock:
            ids = [job_id] if job_id is not None else [j.id for j in self.registry.jobs()]
            out = {}
            for j in ids:
                self._job(j)
                t = self._tenant(j)
                out[j] = {"circuits": len(t.active.circuits) if t.active else 0,
                          "pending": t.pending.plan_id if t.pending else None,
                          "plan": plan_to_json(t.active) if t.active else None}
            return {"fabric": self.controller.topology.name, "jobs": out}

    def decisions(self, job_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Return the newest decisions (of one job, or all), newest first."""
        if job_id is not None:
            self._job(job_id)
        rows = self.store.decisions(scope_of(job_id) if job_id is not None else None, limit)
        return [dict(r.detail) for r in rows]

    def topology_doc(self) -> dict[str, Any]:
        """Return the fabric summary, devices, masked ports and job placements (operator view)."""
        topo = self.controller.topology
        return {"summary": topo.summary(),
                "devices": [{"id": d.id, "tier": d.tier, "pod": d.pod, "technology": d.technology.name,
                             "radix_ports": d.radix_ports, "switch_delay_s": self.switch_delay_s[d.id]}
                            for d in topo.devices.values()],
                "masked_ports": [{"device": r.device, "port": r.port, "reason": why}
                                 for r, why in sorted(topo.masked.items())],
                "jobs": [self.job_doc(j.id) for j in self.registry.jobs()]}

    def health(self) -> dict[str, Any]:
        """Return liveness without touching a device or the lock (cheap enough for every probe)."""
        ok = self.last_reconcile is not None and self.last_reconcile["ok"]
        return {"status": "ok" if ok else "degraded", "fabric": self.controller.topology.name,
                "devices": len(self.devices), "jobs": len(self.registry.jobs()),
                "uptime_s": time.time() - self.started_at, "reconciled": self.last_reconcile is not None}

    def close(self) -> None:
        for client in self.devices.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing sessions is best effort at shutdown
                pass
        self.registry.close()
        self.store.close()
