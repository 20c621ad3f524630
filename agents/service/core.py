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

Faults outside the service's control are answered as such: a device that does not answer, or
refuses in a way no re-plan avoids, is a :class:`~agents.service.checks.DeviceUnavailable` (503)
naming it, after the devices were reconciled back to the journal (a failed or half-applied commit
leaves the service usable); a journal write the disk refuses is a
:class:`~agents.service.checks.StorageUnavailable` (507), after whatever the devices were told
beyond the journal was undone, so the journal never disagrees with the devices. OCS-Core is shared
max-min fair between tenants (:mod:`agents.service.sharing`); start-up, health, the device audit's
repairs and the operator's routes are in :mod:`agents.service.operator`; device commits and device
faults in :mod:`agents.service.device_commit`.

All state changes take one lock, so decisions and device commands are totally ordered; the HTTP
layer only translates.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from orchestrl.agents.service.checks import (
    Conflict,
    NotFound,
    ServiceError,
    Unprocessable,
    integral,
    parse_events,
)
from orchestrl.agents.service.decisions import GATE_FAMILY, CommitTimes, PeriodDecision, scope_of
from orchestrl.agents.service.device_commit import DeviceCommitMixin
from orchestrl.agents.service.jobs import JobConflict, JobRegistry
from orchestrl.agents.service.metrics import MetricsRegistry, declare_service_metrics
from orchestrl.agents.service.operator import OperatorMixin
from orchestrl.agents.service.ordered_commit import PlannedChange
from orchestrl.agents.service.planner import JobPlanner
from orchestrl.agents.service.sharing import SharingMixin
from orchestrl.fabric.controller import FabricController, MaterializeResult
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Intent, parse_gpu_set
from orchestrl.fabric.plan import CircuitPlan, same_cross_connects, validate_plan
from orchestrl.fabric.runtime.commit import CommitError, CommitInDoubt
from orchestrl.fabric.runtime.store import FabricStore, StoreWriteError
from orchestrl.fabric.safe_window import (
    CommitDecision,
    EventOrderError,
    GateConfig,
    SafeWindowGate,
)
from orchestrl.fabric.templates.stages import TEMPLATES
from orchestrl.fabric.topology import Topology

__all__ = ["ControlService", "PeriodDecision", "ServiceError", "GATE_FAMILY", "scope_of"]

_CLOCK_STEP_MARGIN_S = 1e-6  # a stepped-back clock resumes this far after the last event of its sender

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
    last_event_at: float = 0.0  # monotonic time of the job's last event batch (quiet jobs are safe to repair)
    core_asked: dict[int, int] | None = None  # boundary fibres per PoD its last intent wanted (fabric to itself)
    core_asked_circuits: int = 0  # OCS-Core circuits of that plan
    core_asks: dict[str, dict[int, int]] = field(default_factory=dict)  # gate family -> its latest ask per PoD
    starved: bool = False  # its last plan got less OCS-Core than its fair share
    removing: bool = False  # DELETE /v1/jobs/{job} is waiting for a safe window to free its circuits
    clock: dict[str, tuple[int, float]] | None = None  # sender -> (last seq, offset added to its t_s)


class ControlService(SharingMixin, OperatorMixin, DeviceCommitMixin):
    """Serve jobs' intents on one fabric: plan, gate, journal, drive the devices, audit them.

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
        self.planner = JobPlanner(self.controller, store, self.metrics, on_store_error=self._storage_failed)
        self.auditor: Any = None  # agents.service.audit.DeviceAuditor, once started
        self.storage: dict[str, Any] = {"state": "ok", "reason": "", "since": None, "path": store.path}
        self.startup: dict[str, Any] = {"mode": None, "refused": None}
        self._wanted: tuple[int, dict] | None = None  # (epoch, wanted circuits by device)
        self.state_lock: Any = None  # startup.StateLock, when opened from files
        self.audit_setup: dict[str, Any] | None = None
        self._depth = 0  # nesting of service calls (see _top_level)
        self._replan_later: set[str] = set()  # jobs to re-plan once the outermost call is done (fair shares)
        self.in_doubt: dict[str, dict[str, Any]] = {}  # scope -> a commit whose outcome a read-back must settle
        self.commit_times = CommitTimes()  # recent commits' durations: a window must hold a commit, not only switching
        # One device round trip at most: its reply timeout plus its switching time (the slowest device's).
        self.round_trip_s = max([getattr(c, "timeout_s", 5.0) + self.switch_delay_s.get(d, 0.0)
                                 for d, c in self.devices.items()] or [5.0])

    @property
    def lock(self) -> threading.RLock:
        """The lock every state change takes (the audit takes it to compare)."""
        return self._lock

    @property
    def epoch(self) -> int:
        """Bumped by every commit, reconciliation and mask: a read of the devices before it is stale."""
        return self._epoch

    # ------------------------------------------------------------------ start-up
    def recover(self, mode: str = "check") -> dict[str, Any]:
        """Start up against the devices (see :mod:`agents.service.startup`): check, adopt or reset; then reconcile.

        Raises
        ------
        StartupRefused
            In mode ``check``, when a device holds circuits the journal does not explain.
        """
        return self.start(mode)

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
            tenant = self._tenants.get(job_id) if isinstance(job_id, str) else None
            if tenant is not None and tenant.removing:
                raise Conflict(f"job {job_id!r} is being removed (its circuits are freed in its next safe window); "
                               "register it again once GET /v1/jobs no longer lists it", "job")
            try:
                job, token = self.registry.register(job_id, gpu_set)
            except ConfigError as exc:
                raise Unprocessable(exc.field, str(exc)) from None
            except JobConflict as exc:
                raise Conflict(str(exc), "gpus") from None
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
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
            # a removal the operator asked for before a restart goes on after it (the journal keeps it)
            self._tenants[job_id].removing = self.registry.is_removing(job_id)
        return self._tenants[job_id]

    # ------------------------------------------------------------------ intents
    def announce_intent(self, job_id: str, doc: Mapping[str, Any], arrived: float | None = None) -> "PeriodDecision":
        """Materialise the intent ``doc`` of ``job_id`` and commit it now or in a later safe window.

        ``arrived`` is when the request reached the application (``time.monotonic()``; default: now): the time from
        there to the decision is counted as gone from the job's window.

        Raises
        ------
        NotFound, Forbidden, Unprocessable
            Unknown job; GPUs outside the job's placement (naming the foreign ToRs and PoDs); a
            malformed intent (naming the field).
        """
        arrived = time.monotonic() if arrived is None else arrived
        with self._lock, self._top_level():
            # Every intent is decided under one lock, so under load a request waits for the others' commits
            # (32 committing jobs on a loaded 2-core host: p99 0.4-0.8 s, against 50 ms windows). That wait,
            # counted from the request's arrival, is part of the window the job asked in: the gate decides at
            # the job's time plus the wait, so a plan whose window passed while it queued is deferred to the next
            # one. The commit's own time is covered by a percentile (commit_estimate_s), not a bound: a commit
            # slower than recent ones can still finish after the window, which late_s reports.
            queued_s = time.monotonic() - arrived
            job = self._job(job_id)
            if self._tenant(job_id).removing:
                raise Conflict(f"job {job_id!r} is being removed; it may report events until its circuits are freed, "
                               "but announce no intent", "job")
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
            try:
                self.registry.remember_intent(job_id, doc)
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            tenant = self._tenant(job_id)
            family = GATE_FAMILY[intent.stage]
            now = max(float(t_s) if t_s is not None else tenant.last_t_s, tenant.last_t_s)
            tenant.last_t_s = now if now > float("-inf") else 0.0
            return self._offer(tenant, intent, family, tenant.last_t_s, queued_s)

    def clear_memos(self) -> None:
        """Forget remembered parses, plans and orders (as after a restart; e.g. to time a first iteration)."""
        with self._lock:
            self.planner.clear()

    def _offer(self, tenant: _Tenant, intent: Intent, family: str, now_s: float,
               queued_s: float = 0.0) -> PeriodDecision:
        result = self._materialize(tenant, intent)
        tenant.plans += 1
        plan_id = f"{tenant.job}#{tenant.plans}"
        base = _base(tenant.job, plan_id, intent, result, now_s)
        if tenant.core_asked is not None:
            base["core_asked"] = tenant.core_asked_circuits
            base["core_granted"] = sum(1 for c in result.candidate.circuits if c.tier == "core") \
                if result.candidate else 0
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
        base["queued_s"] = queued_s
        base["commit_estimate_s"] = self.commit_times.estimate()  # the window must hold the commit itself too
        d = tenant.gates[family].submit(tenant.job, intent.stage, base["switch_delay_s"] + base["commit_estimate_s"],
                                        now_s + queued_s, plan_id)
        if base["commit_estimate_s"] > 0 and d.window_s is not None:
            d = replace(d, reason=f"{d.reason} (the switch time counted is switching {base['switch_delay_s'] * 1e3:.0f} ms "
                                  f"+ this proxy's recent commits' {base['commit_estimate_s'] * 1e3:.0f} ms)")
        if queued_s > 0.001 and d.action != "commit" and d.window_s is not None:
            d = replace(d, reason=f"{d.reason} (decided {queued_s * 1e3:.0f} ms after the request arrived, behind "
                                  "other jobs' commits)")
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
        scope = scope_of(tenant.job)
        if scope in self.in_doubt:
            raise self._device_failed(tenant, base, f"commit {self.in_doubt[scope]['commit']} of this job is in doubt "
                                      "(a switch did not answer in time); the next read-back settles it, within one "
                                      "audit period of the switch answering: retry then", started, in_doubt=True)
        try:
            report = self._apply(tenant, plan, change)
        except CommitInDoubt as exc:
            raise self._in_doubt(tenant, base, exc, started) from None
        except CommitError as exc:  # its rollback kept every job's circuits; earlier steps stay committed
            self.metrics.inc("orchestrl_device_faults_total", kind="commit-error")
            self.last_reconcile_report = exc.rollback  # what the rollback left (a self-reconcile may replace it)
            self._after_device_error(exc)
            tenant.active = self.store.last_committed_plan(scope_of(tenant.job))
            if not exc.failed_ports:
                raise self._device_failed(tenant, base, f"commit {exc.commit_id}: {exc.problem}", started) from None
            self.controller.mask_ports(exc.failed_ports)  # §5.4: mask, re-plan under the remaining budget
            self._epoch += 1
            self.metrics.inc("orchestrl_device_faults_total", len(exc.failed_ports), kind="failed-port")
            retry = self._materialize(tenant, pending.intent)
            if not retry.accepted:
                return self._failed(tenant, base, f"{exc}; re-plan refused: {'; '.join(retry.violations[:3])}", started)
            plan = retry.plan
            try:
                report = self._apply(tenant, plan)
            except CommitInDoubt as doubt:
                raise self._in_doubt(tenant, base, doubt, started) from None
            except CommitError as again:
                self.last_reconcile_report = again.rollback
                self._after_device_error(again)
                tenant.active = self.store.last_committed_plan(scope_of(tenant.job))
                raise self._device_failed(tenant, base, f"commit {again.commit_id}: {again.problem}", started) from None
            why = f"{why}; ports {', '.join(f'{d}:{p}' for d, p, _ in exc.failed_ports)} failed, masked and re-planned"
        took = time.perf_counter() - started
        tenant.active = plan
        self._epoch += 1
        if report.removed and any(t.starved for j, t in self._tenants.items() if j != tenant.job):
            self._replan_later.update(j for j, t in self._tenants.items() if t.starved and j != tenant.job)
        if self.auditor is not None and self.auditor.sessions_changed():
            self.auditor.poke()  # a driver reconnected during the commit: the device may have restarted
        self.metrics.observe("orchestrl_commit_latency_seconds", took)
        switching = base.get("switch_delay_s") or 0.0
        if report.devices:
            self.commit_times.add(max(took - switching, 0.0))  # the commit's own cost beyond the switches' switching
        # realised, not predicted: did the switches finish inside the window the gate predicted when it decided?
        late_s = max(took - base["window_s"], 0.0) if report.devices and base.get("window_s") is not None else None
        if late_s:
            self.metrics.inc("orchestrl_commits_after_window_total", job=tenant.job)
        self.metrics.inc("orchestrl_circuits_changed_total", report.added, action="add")
        self.metrics.inc("orchestrl_circuits_changed_total", report.removed, action="remove")
        self._set_gauges()
        return self._record(PeriodDecision(**{
            **base, "decision": "commit" if report.devices else "unchanged", "device_s": took, "late_s": late_s,
            "reason": why + (f"; outage: {'; '.join(report.outages)}" if report.outages else ""),
            "circuits": len(plan.circuits), "removed": report.removed, "added": report.added,
            "devices": report.devices, "commit_id": report.commit_id, "steps": report.steps}), tenant)

    def _record(self, d: PeriodDecision, tenant: _Tenant | None = None) -> PeriodDecision:
        if tenant is not None and tenant.starved and d.decision in ("commit", "unchanged"):
            # a plan committed later (a safe window opened) carries no ask of its own: the job's, as numbers
            asked = d.core_asked if d.core_asked is not None else tenant.core_asked_circuits
            granted = d.core_granted if d.core_granted is not None else (
                sum(1 for c in tenant.active.circuits if c.tier == "core") if tenant.active else 0)
            d = replace(d, core_asked=asked, core_granted=granted)
            d = replace(d, decision="starved", reason=(
                f"starved: asked for {d.core_asked} OCS-Core circuits and got {d.core_granted}, less than its fair share "
                f"({self._share_words(tenant)}); jobs holding more than their share are re-planned and this job "
                f"after them; {d.reason}"))
        self.metrics.inc("orchestrl_decisions_total", decision=d.decision)
        try:
            self.store.log_decision(scope_of(d.job), d.decision, d.to_json())
            self._storage_ok()
        except StoreWriteError as exc:  # the decision stands (its commit is journalled); the audit trail lags
            self._storage_failed(exc)
        return d

    def _share_words(self, tenant: _Tenant) -> str:
        return "max-min fair over the tenants' standing OCS-Core demands per PoD"

    def _set_gauges(self) -> None:
        for job, t in self._tenants.items():
            self.metrics.set("orchestrl_circuits", len(t.active.circuits) if t.active else 0, job=job)
        self.metrics.set("orchestrl_masked_ports", len(self.controller.topology.masked))

    @contextmanager
    def _top_level(self):  # noqa: ANN202 - a context manager
        """Run re-plans that fairness asked for once the outermost service call is done (each job once)."""
        self._depth += 1
        if self._depth == 1:
            self._replan_later = set()
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0:
            done: set[str] = set()
            while self._replan_later - done:
                j = sorted(self._replan_later - done)[0]
                done.add(j)
                job = self.registry.get(j)
                if job is not None and job.intent_doc is not None and not self._tenant(j).removing:
                    self._depth += 1
                    try:
                        with suppress(ServiceError):  # its refusal is in the decision log
                            self.announce_intent(j, job.intent_doc)
                    finally:
                        self._depth -= 1

    # ------------------------------------------------------------------ events
    def report_events(self, job_id: str, events: Any, arrived: float | None = None) -> dict[str, Any]:
        """Feed a batch of boundary events to the job's gates; commit plans whose window opened.

        The batch is validated whole first (a malformed event refuses the batch, naming
        ``events[i].<field>``). Events numbered by their sender (``seq``, per ``source``) are taken
        in that order, and a sender whose clock stepped back is shifted to continue after its last
        event (counted in ``clock_steps``); events without a number are taken in time order and
        those older than the last one are listed in ``rejected``. ``arrived`` as for :meth:`announce_intent`.
        """
        arrived = time.monotonic() if arrived is None else arrived
        parsed = parse_events(events)
        numbered = [(ev.get("seq"), str(ev.get("source") or job_id)) if isinstance(ev, dict) else (None, job_id)
                    for ev in events]
        with self._lock, self._top_level():
            queued_s = time.monotonic() - arrived
            self._job(job_id)
            tenant = self._tenant(job_id)
            tenant.last_event_at = time.monotonic()
            rejected, decisions, steps = [], [], 0
            clock = tenant.clock if tenant.clock is not None else {}
            tenant.clock = clock
            order = sorted(range(len(parsed)), key=lambda i: (numbered[i][0] is None, numbered[i][1],
                                                               numbered[i][0] if numbered[i][0] is not None
                                                               else parsed[i].t_s))
            for i in order:
                ev = parsed[i]
                seq, source = numbered[i]
                if seq is not None:
                    last_seq, offset = clock.get(source, (-1, 0.0))
                    if seq <= last_seq:
                        rejected.append({"index": i, "reason": f"seq {seq} of sender {source!r} was seen already "
                                                               f"(last {last_seq}); the event is a duplicate"})
                        continue
                    t = ev.t_s + offset
                    if t < tenant.last_t_s:  # the sender's clock stepped back: its timeline continues from here
                        offset += tenant.last_t_s - t + _CLOCK_STEP_MARGIN_S
                        t = ev.t_s + offset
                        steps += 1
                    clock[source] = (seq, offset)
                    ev = replace(ev, t_s=t)
                try:  # the time this request queued is gone from any window its events open (see announce_intent)
                    out = tenant.gates[GATE_FAMILY[ev.stage]].observe(ev, lag_s=queued_s)
                except EventOrderError as exc:
                    rejected.append({"index": i, "reason": str(exc)})
                    continue
                tenant.last_t_s = max(tenant.last_t_s, ev.t_s)
                for d in out:
                    p = tenant.pending
                    if p is None or d.plan_id != p.plan_id:
                        continue
                    switching = p.change.switching_time_s(self.switch_delay_s) if p.change else d.switch_delay_s
                    base = {**_base(job_id, p.plan_id, p.intent, p.result, d.at_s), "switch_delay_s": switching,
                            "commit_estimate_s": d.switch_delay_s - switching}
                    decisions.append(self._settle(tenant, p, d, base).to_json())
            self.metrics.inc("orchestrl_events_total", len(parsed) - len(rejected), result="accepted")
            self.metrics.inc("orchestrl_events_total", len(rejected), result="rejected")
            decisions += self._after_events(tenant)
            return {"accepted": len(parsed) - len(rejected), "rejected": rejected, "decisions": decisions,
                    "clock_steps": steps}
