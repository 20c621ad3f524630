"""The control service's start-up: check or adopt what the switches hold, and refuse one switch under two names.

These methods belong to :class:`agents.service.core.ControlService` through
:class:`~orchestrl.agents.service.operator.OperatorMixin` (split off so each module has one job).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from orchestrl.agents.service.audit import DeviceAuditor, DeviceState
from orchestrl.agents.service.decisions import scope_of
from orchestrl.agents.service.startup import (
    ADOPTED_SCOPE,
    STARTUP_MODES,
    StartupRefused,
    adopted_plan,
    attribute_circuits,
    startup_diff,
)
from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.ocs.errors import OcsError
from orchestrl.fabric.ocs.fanout import each_device
from orchestrl.fabric.plan import CrossConnect
from orchestrl.fabric.runtime.reconcile import (
    DeviceReconcile,
    ReconcileReport,
    device_changes,
    reconcile_store,
    unusable_ports,
)
from orchestrl.fabric.runtime.store import StoreWriteError
from orchestrl.fabric.templates.cache import TemplateCache

__all__ = ["StartupMixin", "DuplicateDevice"]


class DuplicateDevice(OrchestrlError):
    """Two entries of the devices file reach one switch."""


class StartupMixin:
    """Start-up modes (check, adopt, reset), releasing adopted circuits, and device identities."""

    def start(self, mode: str = "check") -> dict[str, Any]:
        """Compare devices with the journal; refuse (``check``), ``adopt`` or ``reset``; then reconcile and audit."""
        if mode not in STARTUP_MODES:
            raise ValueError(f"start-up mode {mode!r} is unknown (allowed: {', '.join(STARTUP_MODES)})")
        with self._lock:
            masked = [(m.device, m.port, m.reason) for m in self.store.masked_ports()
                      if m.device in self.controller.topology.devices]
            if masked:
                self.controller.mask_ports(masked)
            self.controller.cache = TemplateCache(self.store.load_template_cache().entries())
            self._check_identities()
            diff = startup_diff(self.store, self.devices, {d: self.masked_on(d) for d in self.devices})
            self.startup = {"mode": mode, "unexplained": sum(map(len, diff.unexplained.values())),
                            "unreachable": dict(diff.unreachable)}
            if mode == "check" and diff.refuses:
                raise StartupRefused(self.store.path, diff)
            adopted = self._adopt(diff.tables) if mode == "adopt" else None
            reachable = {d: c for d, c in self.devices.items() if d not in diff.unreachable}
            started = time.perf_counter()
            # --adopt changes nothing on a device: the journal now follows them, and what still differs (half
            # circuits) is the audit's to report; any other mode brings the devices to the journal
            report = self._adopted_report(reachable, diff.tables) if mode == "adopt" else \
                reconcile_store(self.store, reachable, None)
            took = time.perf_counter() - started
            self.metrics.inc("orchestrl_reconciliations_total", outcome="ok" if report.ok else "incomplete")
            self.metrics.inc("orchestrl_reconcile_changes_total", report.changes)
            self.metrics.observe("orchestrl_reconcile_seconds", took)
            self._epoch += 1
            if report.failed_ports:
                self.controller.mask_ports(report.failed_ports)
                self.metrics.inc("orchestrl_device_faults_total", len(report.failed_ports), kind="failed-port")
            for scope in [ADOPTED_SCOPE] + [j.id for j in self.registry.jobs()]:
                plan = self.store.last_committed_plan(scope if scope == ADOPTED_SCOPE else scope_of(scope))
                if plan is not None or scope != ADOPTED_SCOPE:
                    self._tenant(scope).active = plan
            hit, replanned = set(report.unserved), []
            with self._top_level():
                for job in self.registry.jobs():  # jobs that lost circuits to failed ports: re-plan (§5.4)
                    lost = any(c.xc in hit for rec in self.store.history(scope_of(job.id), limit=2)
                               for c in rec.plan.circuits)
                    if lost and job.intent_doc is not None:
                        replanned.append(self.announce_intent(job.id, job.intent_doc).to_json())
            self.metrics.set("orchestrl_jobs", len(self.registry.jobs()))
            self._set_gauges()
            ok = report.ok and not diff.unreachable
            self.last_reconcile = {"ok": ok, "changes": report.changes, "seconds": took, "mode": mode,
                                   "failed_ports": [list(p) for p in report.failed_ports],
                                   "resolved_commits": list(report.resolved_commits),
                                   "missing_devices": list(report.missing_devices), "replanned": replanned,
                                   "unreachable": dict(diff.unreachable), "adopted": adopted,
                                   "explained_removals": sum(map(len, diff.explained_removals.values())),
                                   "restored": sum(map(len, diff.additions.values()))}
            clients = (self.audit_setup or {}).get("clients")
            self.auditor = DeviceAuditor(self, clients or self.devices,
                                         period_s=(self.audit_setup or {}).get("period_s", 1.0),
                                         policy=(self.audit_setup or {}).get("policy", "repair"))
            now = time.time()
            for d in self.devices:
                if d in diff.unreachable:
                    self.auditor.states[d] = DeviceState(d, "unreachable", diff.unreachable[d], since=now)
                else:
                    res = next((r for r in report.devices if r.device == d), None)
                    self.auditor.states[d] = DeviceState(d, "ok" if res is None or res.ok else "drift",
                                                         "" if res is None or res.ok else "not reconciled at start-up",
                                                         audited_at=now, verified=True)
            if clients is not None:
                self.auditor.start()
            return self.last_reconcile

    def _adopt(self, tables: dict[str, dict[int, int]]) -> dict[str, Any]:
        """Take the devices' circuits into the journal as they are; nothing on a device changes.

        A job's journalled circuits the devices still hold stay the job's; circuits the devices hold
        beyond that are given back to the job they belong to (:func:`agents.service.startup.attribute_circuits`:
        its journalled plans, else the ToRs and PoDs their ports serve), so after a restored backup the
        jobs keep what they made since; the rest are reserved under ``fabric/adopted`` until an operator
        releases them (:meth:`release_adopted`).
        """
        from orchestrl.fabric.ocs.model import duplex_to_cross_connects

        on_device = {d: set(t.items()) for d, t in tables.items()}
        plans = self.committed_plans()
        kept: dict[str, set[CrossConnect]] = {}
        keep_by_scope: dict[str, list] = {}
        dropped = 0
        for scope, plan in plans.items():
            keep = [c for c in plan.circuits if c.xc.device not in tables or all(
                p in on_device[c.xc.device] for p in duplex_to_cross_connects(
                    c.xc.a_port, c.xc.b_port, self.devices[c.xc.device].ports))]
            if scope == ADOPTED_SCOPE:
                continue  # adopted circuits are attributed again below, like any found on the devices
            for c in keep:
                kept.setdefault(c.xc.device, set()).add(c.xc)
            keep_by_scope[scope] = keep
            dropped += len(plan.circuits) - len(keep)
        found, halves = adopted_plan(self.controller.topology, tables, {d: set(x) for d, x in kept.items()},
                                     {d: c.ports for d, c in self.devices.items()})
        jobs = {j.id: j for j in self.registry.jobs()}
        known = {j: {c.xc for rec in self.store.history(scope_of(j), limit=50) for c in rec.plan.circuits}
                 for j in jobs}
        by_job = attribute_circuits(self.controller.topology, list(found.circuits),
                                    {j: job.placement for j, job in jobs.items()}, known)
        given_back = 0
        for scope, plan in plans.items():
            if scope == ADOPTED_SCOPE:
                continue
            job = scope[len("job/"):] if scope.startswith("job/") else None
            extra = by_job.pop(job, []) if job is not None else []
            keep = keep_by_scope[scope]
            if len(keep) == len(plan.circuits) and not extra:
                continue
            given_back += len(extra)
            circuits = tuple(sorted({*keep, *extra}, key=lambda c: (c.xc.device, c.xc.a_port, c.xc.b_port)))
            notes = plan.notes + ((f"{len(plan.circuits) - len(keep)} circuits missing on the devices dropped at "
                                   "--adopt",) if len(keep) != len(plan.circuits) else ()) + (
                (f"{len(extra)} circuits found on the devices given back at --adopt",) if extra else ())
            self._journal(scope, dataclasses.replace(plan, circuits=circuits, notes=notes),
                          "adopt: the job's circuits as the devices hold them")
        for job, extra in list(by_job.items()):  # a registered job with no journalled plan yet
            if job is None or job not in jobs:
                continue
            first = dataclasses.replace(found, template="adopted", signature="adopted", circuits=tuple(extra),
                                        notes=("circuits found on the devices given back to the job at --adopt",))
            self._journal(scope_of(job), first, "adopt: the job's circuits as the devices hold them")
            given_back += len(extra)
            del by_job[job]
        rest = tuple(by_job.get(None, ()))
        merged = dataclasses.replace(found, circuits=rest)
        if rest or self.store.last_committed(ADOPTED_SCOPE) is not None:
            self._journal(ADOPTED_SCOPE, merged, "adopted from the devices at start-up (no job explains them)")
        return {"circuits": len(found.circuits), "given_back_to_jobs": given_back, "reserved": len(rest),
                "dropped_from_jobs": dropped, "half_circuits": halves}

    def release_adopted(self, dry_run: bool = True) -> dict[str, Any]:
        """``POST /v1/adopted/release``: remove the adopted circuits no job explains (a dry run by default).

        They belong to no job, so no safe window is waited for; jobs kept short by them are re-planned.
        """
        with self._lock, self._top_level():
            plan = self.store.last_committed_plan(ADOPTED_SCOPE)
            circuits = [{"device": c.xc.device, "a_port": c.xc.a_port, "b_port": c.xc.b_port, "a": c.a, "b": c.b}
                        for c in (plan.circuits if plan else ())]
            if dry_run or not circuits:
                return {"dry_run": dry_run, "released": 0 if dry_run else 0, "circuits": circuits}
            tenant = self._tenant(ADOPTED_SCOPE)
            tenant.active = plan
            empty = dataclasses.replace(plan, circuits=(), notes=("released by an operator",))
            try:
                self._apply(tenant, empty)
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            tenant.active = self.store.last_committed_plan(ADOPTED_SCOPE)
            self._epoch += 1
            self.log_device_event("all", "released", f"operator released {len(circuits)} adopted circuits",
                                  released=len(circuits))
            self._replan_later.update(j.id for j in self.registry.jobs() if j.intent_doc is not None)
            self._set_gauges()
            return {"dry_run": False, "released": len(circuits), "circuits": circuits}

    def _check_identities(self) -> None:
        """Refuse to start when two device entries reach one switch (they would undo each other's circuits).

        Each switch is asked who it is (its adapter's ``identity()``: a TL1 SID, a NETCONF or gNMI serial);
        a switch that does not answer is checked when it does, by the audit's read-back (drift).
        """
        def ask(client: Any) -> str | None:
            try:
                return client.identity() if hasattr(client, "identity") else None
            except (OcsError, OSError):
                return None
        seen: dict[str, str] = {}
        for d, ident in sorted(each_device({d: (lambda c=c: ask(c)) for d, c in self.devices.items()}).items()):
            if ident is None:
                continue
            if ident in seen:
                raise DuplicateDevice(f"devices {seen[ident]!r} and {d!r} are one switch ({ident}): each would undo "
                                      "the other's circuits; give each switch one entry in the devices file (if they "
                                      "are two switches, give each its own identity, e.g. TL1 SET-SID)")
            seen[ident] = d

    def _adopted_report(self, devices: dict[str, Any], tables: dict[str, dict[int, int]]) -> ReconcileReport:
        """What start-up with ``--adopt`` found, as a reconcile report, without changing a device.

        Commits the journal shows in flight are closed (the devices were taken as they are), failed ports
        are read and masked, and what still differs from the journal (half circuits) is the residual.
        """
        for rec in self.store.in_flight():
            self.store.finish_commit(rec.id, "aborted", "interrupted; --adopt took the devices as they are")
        self._wanted = None  # the journal changed without a commit: read it afresh
        wanted = self.wanted_by_device()
        results = []
        for d, client in sorted(devices.items()):
            try:
                unusable = unusable_ports(client)
            except OcsError as exc:
                results.append(DeviceReconcile(d, (), (), {}, (), (), (str(exc),), reachable=False))
                continue
            ch = device_changes(wanted.get(d, []), tables.get(d, {}), client.ports, frozenset(unusable))
            results.append(DeviceReconcile(d, (), (), unusable, (), ch.remove + ch.add))
        report = ReconcileReport(tuple(results))
        if report.failed_ports:
            self.store.mask_ports(report.failed_ports)
        return report
