"""What the control service does for operators and on its own: start-up, health, audit repairs, reconcile, removals.

These methods belong to :class:`agents.service.core.ControlService` (a mixin keeps that module to
the job-facing path). Every one takes the service's lock for its changes; :meth:`health` takes
none, so a probe never waits behind a commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Iterable

from orchestrl.agents.service.audit import DeviceState, drift_of
from orchestrl.agents.service.checks import (
    Conflict,
    DeviceUnavailable,
    NotFound,
    StorageUnavailable,
    Unprocessable,
    parse_mask_ports,
)
from orchestrl.agents.service.decisions import GATE_FAMILY, scope_of
from orchestrl.agents.service.fairness import POLICY
from orchestrl.agents.service.startup import (
    startup_diff,
)
from orchestrl.agents.service.startup_mixin import DuplicateDevice, StartupMixin
from orchestrl.fabric.ocs.errors import OcsError
from orchestrl.fabric.plan import CircuitPlan, CrossConnect, plan_to_json
from orchestrl.fabric.runtime.reconcile import (
    reconcile_store,
    unusable_ports,
    wanted_by_device,
)
from orchestrl.fabric.runtime.store import StoreWriteError
from orchestrl.fabric.topology import Topology

__all__ = ["OperatorMixin", "DuplicateDevice"]


class OperatorMixin(StartupMixin):
    """Start-up, health, the device audit's repairs, operator routes (see :class:`agents.service.core.ControlService`)."""

    # ------------------------------------------------------------------ journal views
    def committed_plans(self) -> dict[str, CircuitPlan]:
        """Every scope's last committed plan (jobs, adopted circuits)."""
        return {s: r.plan for s in self.store.scopes() if (r := self.store.last_committed(s)) is not None}

    def wanted_by_device(self) -> dict[str, list[CrossConnect]]:
        """The circuits the journal says each device holds (cached until the next commit or mask)."""
        if self._wanted is None or self._wanted[0] != self._epoch:
            self._wanted = (self._epoch, wanted_by_device(self.committed_plans().values()))
        return self._wanted[1]

    def masked_on(self, device: str) -> frozenset[int]:
        """Duplex ports of ``device`` kept out of planning (a circuit there is not expected)."""
        return frozenset(r.port for r in self.controller.topology.masked if r.device == device)

    # ------------------------------------------------------------------ start-up
    def _journal(self, scope: str, plan: CircuitPlan, note: str) -> None:
        base = self.store.last_committed(scope)
        cid = self.store.begin_commit(scope, plan, kind="reconcile", base_id=base.id if base else None)
        self.store.finish_commit(cid, "committed", note)

    # ------------------------------------------------------------------ health
    def health(self) -> dict[str, Any]:
        """Return the proxy's health without touching a device or the lock (cheap enough for every probe).

        ``ok`` needs: start-up reconciled, every device audited as matching the journal, and the
        state file taking writes. Otherwise ``degraded``, with one line per problem in ``reasons``.
        """
        reasons: list[str] = []
        states = dict(self.auditor.states) if self.auditor is not None else {}
        devices = []
        for d in sorted(self.devices):
            st = states.get(d) or DeviceState(d, "unknown", "not audited yet")
            devices.append(st.to_json())
            if st.state != "ok":
                reasons.append(f"device {d}: {st.state}" + (f" ({st.reason})" if st.reason else ""))
        for scope, doubt in sorted(dict(self.in_doubt).items()):
            reasons.append(f"commit {doubt['commit']} of {scope} is in doubt since {time.strftime('%H:%M:%S', time.gmtime(doubt['since']))} "
                           f"UTC ({doubt['reason']}); the next read-back of {', '.join(doubt['devices'])} settles it")
        if self.storage["state"] != "ok":
            reasons.append(f"storage: {self.storage['reason']}")
        if self.last_reconcile is None:
            reasons.append("start-up reconciliation has not run")
        pending = [t.job for t in self._tenants.values() if t.removing]
        if pending:
            reasons.append(f"jobs {', '.join(sorted(pending))} wait for a safe window to free their circuits")
        status = "ok" if not [r for r in reasons if not r.startswith("jobs ")] else "degraded"
        self.metrics.set("orchestrl_healthy", 1 if status == "ok" else 0)
        return {"status": status, "reasons": reasons, "fabric": self.controller.topology.name,
                "devices": len(self.devices), "device_health": devices,
                "storage": dict(self.storage), "jobs": len(self.registry.jobs()),
                "uptime_s": time.time() - self.started_at, "reconciled": self.last_reconcile is not None,
                "audit_period_s": self.auditor.period_s if self.auditor else 0.0,
                "drift_policy": self.auditor.policy if self.auditor else "repair"}

    # ------------------------------------------------------------------ storage
    def _storage_failed(self, exc: StoreWriteError, what: str = "nothing was changed") -> StorageUnavailable:
        """Record a refused write (health degrades) and return the 507 that reports it."""
        if self.storage["state"] == "ok":
            self.storage = {**self.storage, "state": "failed", "since": time.time()}
        self.storage = {**self.storage, "reason": f"{exc.problem}; {exc.fix}", "kind": exc.kind}
        self.metrics.inc("orchestrl_storage_errors_total", kind=exc.kind)
        return StorageUnavailable(f"the state file {self.store.path} refused a write ({exc.problem}); {what}; "
                                  f"fix: {exc.fix}")

    def _storage_ok(self) -> None:
        if self.storage["state"] != "ok":
            self.storage = {"state": "ok", "reason": "", "since": None, "path": self.store.path}

    def storage_probe(self) -> None:
        """While the state file refuses writes, try one (a decision-log row) per audit; ok again once it takes it."""
        if self.storage["state"] == "ok":
            return
        try:
            with self._lock:
                self.store.log_decision("fabric/storage", "recovered", {"kind": "storage", "decision": "recovered",
                                                                        "reason": "the state file takes writes again",
                                                                        "at": time.time()})
            self._storage_ok()
        except StoreWriteError as exc:
            self.storage = {**self.storage, "reason": f"{exc.problem}; {exc.fix}"}

    def log_device_event(self, device: str, outcome: str, reason: str, **counts: int) -> None:
        """Journal a device's change of state (drift, unreachable, recovered, repaired) in the decision log."""
        doc = {"kind": "audit", "device": device, "decision": outcome, "reason": reason, "at": time.time(), **counts}
        try:
            self.store.log_decision(f"device/{device}", outcome, doc)
        except StoreWriteError as exc:
            self._storage_failed(exc)

    # ------------------------------------------------------------------ commits in doubt (called by the auditor)
    def settle_in_doubt(self, tables: dict[str, Any]) -> list[str]:
        """Settle commits in doubt from a read-back: committed when the devices hold them, else rolled back.

        Called with the service's lock held and ``tables`` read since the doubt arose; a device that did
        not answer keeps its commit in doubt. Returns the scopes settled.
        """
        done = []
        for scope, doubt in sorted(self.in_doubt.items()):
            if any(isinstance(tables.get(d), BaseException) or d not in tables for d in doubt["devices"]):
                continue
            rec = next((r for r in self.store.in_flight(scope) if r.id == doubt["commit"]), None)
            job = scope[len("job/"):] if scope.startswith("job/") else scope
            tenant = self._tenants.get(job)
            if rec is None:  # closed meanwhile (a reconcile): nothing left to settle
                del self.in_doubt[scope]
                continue
            others = [p for s, p in self.committed_plans().items() if s != scope]
            wanted = wanted_by_device([*others, rec.plan])
            held = all(not any(drift_of(d, wanted.get(d, []), tables[d], self.devices[d].ports, self.masked_on(d)))
                       for d in doubt["devices"])
            try:
                if held:
                    self.store.finish_commit(rec.id, "committed", "in doubt; settled by read-back: the devices hold it")
                    outcome = "committed: the devices hold it"
                else:
                    report = reconcile_store(self.store, {d: self.devices[d] for d in doubt["devices"]}, scope,
                                             "aborted", "in doubt; read back and restored to the last committed plan",
                                             keep_other_scopes=True)
                    if not report.ok:
                        continue  # the devices did not let themselves be restored: still in doubt, tried again
                    outcome = "rolled back: the devices did not hold it; restored to the last committed plan"
            except StoreWriteError as exc:
                self._storage_failed(exc)
                continue
            del self.in_doubt[scope]
            self._epoch += 1
            if tenant is not None:
                tenant.active = self.store.last_committed_plan(scope)
            self.log_device_event(",".join(doubt["devices"]), "settled", f"commit {rec.id} of {scope} {outcome}")
            done.append(scope)
        if done:
            self._set_gauges()
        return done

    # ------------------------------------------------------------------ drift repair (called by the auditor)
    def _owners(self, device: str, pairs: Iterable[tuple[int, int]]) -> set[str]:
        """Jobs with a committed circuit on ``device`` that touches one of the simplex ``pairs``' ports."""
        n = self.devices[device].ports
        ports = {(p - 1) % n + 1 for pair in pairs for p in pair}
        return {j for j, t in self._tenants.items() if t.active is not None and not j.startswith("fabric/")
                and any(c.xc.device == device and ({c.xc.a_port, c.xc.b_port} & ports) for c in t.active.circuits)}

    def _safe_now(self, job: str, device: str) -> bool:
        """The job's next safe window for switching ``device``: quiet, or its gate predicts the window fits."""
        t = self._tenants[job]
        if all(g.in_flight == 0 for g in t.gates.values()) and \
                time.monotonic() - t.last_event_at >= (self.auditor.period_s if self.auditor else 1.0):
            return True
        stage = t.active.template if t.active is not None else "train"
        family = GATE_FAMILY.get(stage, "train")
        stage = stage if stage in GATE_FAMILY else "train"
        now = t.last_t_s if t.last_t_s > float("-inf") else 0.0
        return t.gates[family].decide(stage, self.switch_delay_s.get(device, 0.0), now).action == "commit"

    def repair_drift(self, states: list[DeviceState]) -> list[str]:
        """Repair each drifted device whose affected jobs are all in a safe window; return the devices repaired."""
        done = []
        for st in states:
            jobs = self._owners(st.device, (*st.missing, *st.unexpected))
            waiting = sorted(j for j in jobs if not self._safe_now(j, st.device))
            if waiting:
                self.auditor.mark(st.device, "repairing", st.reason.split("; repair waits")[0] + "; repair waits for "
                                  f"the next safe window of job(s) {', '.join(waiting)}")
                continue
            try:
                report = reconcile_store(self.store, {st.device: self.devices[st.device]}, None)
            except StoreWriteError as exc:
                self._storage_failed(exc)
                continue
            self._epoch += 1
            for j, t in self._tenants.items():
                scope = j if j.startswith("fabric/") else scope_of(j)
                t.active = self.store.last_committed_plan(scope)
            if report.failed_ports:
                self.controller.mask_ports(report.failed_ports)
            ok = all(d.ok for d in report.devices)
            self.metrics.inc("orchestrl_drift_repairs_total", device=st.device, outcome="ok" if ok else "incomplete")
            self.log_device_event(st.device, "repaired" if ok else "repair-incomplete",
                                  f"{len(st.missing)} missing cross-connects restored and {len(st.unexpected)} "
                                  f"unexpected ones removed" + ("" if ok else "; " + "; ".join(
                                      e for d in report.devices for e in d.errors[-2:])),
                                  missing=len(st.missing), unexpected=len(st.unexpected))
            if ok:
                self.auditor.mark(st.device, "ok")
                done.append(st.device)
        return done

    def _after_events(self, tenant: Any) -> list[dict[str, Any]]:
        """After a job's events: repairs and a removal that were waiting for this job's safe window."""
        out: list[dict[str, Any]] = []
        if self.auditor is not None and self.auditor.policy == "repair":
            waiting = [s for s in self.auditor.pending_repairs() if tenant.job in self._owners(
                s.device, (*s.missing, *s.unexpected))]
            if waiting:
                self.repair_drift(waiting)
        if tenant.removing:
            self._finish_removal(tenant.job)
        return out

    # ------------------------------------------------------------------ operator routes
    def reconcile_now(self, dry_run: bool = False) -> dict[str, Any]:
        """``POST /v1/reconcile``: bring every device to the journal now (or only report the diff)."""
        with self._lock:
            diff = startup_diff(self.store, self.devices, {d: self.masked_on(d) for d in self.devices})
            devices = [{"device": d, "reachable": d not in diff.unreachable,
                        "remove": len(diff.unexplained.get(d, ())) + len(diff.explained_removals.get(d, ())),
                        "add": len(diff.additions.get(d, ())),
                        "error": diff.unreachable.get(d, "")} for d in sorted(self.devices)]
            if dry_run:
                return {"dry_run": True, "ok": not diff.unreachable,
                        "changes": sum(x["remove"] + x["add"] for x in devices), "devices": devices}
            reachable = {d: c for d, c in self.devices.items() if d not in diff.unreachable}
            try:
                report = reconcile_store(self.store, reachable, None)
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            self._epoch += 1
            for j, t in self._tenants.items():
                t.active = self.store.last_committed_plan(j if j.startswith("fabric/") else scope_of(j))
            if report.failed_ports:
                self.controller.mask_ports(report.failed_ports)
            self.metrics.inc("orchestrl_reconciliations_total", outcome="operator")
            for d in report.devices:
                if d.ok and self.auditor is not None:
                    self.auditor.mark(d.device, "ok")
                self.log_device_event(d.device, "reconciled" if d.ok else "reconcile-incomplete",
                                      "operator reconcile (POST /v1/reconcile)",
                                      removed=len(d.removed), added=len(d.added))
            if diff.unreachable and not reachable:
                raise DeviceUnavailable("no device answered: " + "; ".join(f"{d}: {e}" for d, e in diff.unreachable.items()))
            return {"dry_run": False, "ok": report.ok and not diff.unreachable, "changes": report.changes,
                    "devices": [{**x, "removed": len(r.removed), "added": len(r.added), "ok": r.ok}
                                for x in devices for r in report.devices if r.device == x["device"]]
                    + [x for x in devices if not x["reachable"]]}

    def mask_ports(self, ports: Any, replan: bool = True) -> dict[str, Any]:
        """Mask ports (operator); re-plan every job whose circuits use one of them."""
        wanted = parse_mask_ports(ports, self.controller.topology)
        with self._lock, self._top_level():
            try:
                fresh = self.store.mask_ports(wanted)
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            self.controller.mask_ports(wanted)
            self._epoch += 1
            hit = {(d, p) for d, p, _ in wanted}
            replanned = []
            for job in self.registry.jobs():
                t = self._tenant(job.id)
                uses = t.active is not None and any((r.device, r.port) in hit for c in t.active.circuits
                                                    for r in c.xc.ports())
                if replan and uses and job.intent_doc is not None and not t.removing:
                    replanned.append(self.announce_intent(job.id, job.intent_doc).to_json())
            self._set_gauges()
            return {"masked": [{"device": d, "port": p, "reason": r} for d, p, r in wanted],
                    "newly_masked": len(fresh), "replanned": replanned}

    def unmask_ports(self, ports: Any, replan: bool = True) -> dict[str, Any]:
        """Return ports to planning (operator); a port its device still reports failed or blocked stays masked."""
        wanted = [(d, p) for d, p, _ in parse_mask_ports([{**x, "reason": "failed"} if isinstance(x, dict) else x
                                                           for x in (ports if isinstance(ports, list) else [])] or
                                                          ports, self.controller.topology)]
        with self._lock, self._top_level():
            still: dict[tuple[str, int], str] = {}
            for device in sorted({d for d, _ in wanted}):
                try:
                    bad = unusable_ports(self.devices[device])
                except OcsError as exc:
                    raise DeviceUnavailable(f"device {device} did not answer a port-status read ({exc}); "
                                            "nothing was unmasked") from None
                still.update({(device, p): s for p, s in bad.items()})
            masked = {(r.device, r.port) for r in self.controller.topology.masked}
            unmasked, not_masked, refused = [], [], []
            for d, p in wanted:
                if (d, p) in still:
                    refused.append({"device": d, "port": p, "reason": f"the device reports it {still[(d, p)]}"})
                elif (d, p) not in masked:
                    not_masked.append({"device": d, "port": p})
                else:
                    try:
                        self.store.unmask_port(d, p)
                    except StoreWriteError as exc:
                        raise self._storage_failed(exc) from None
                    unmasked.append({"device": d, "port": p})
            if unmasked:
                back = {(x["device"], x["port"]) for x in unmasked}
                spec = self.controller.topology.spec
                self.controller.topology = Topology(dataclasses.replace(spec, masked_ports=tuple(
                    m for m in spec.masked_ports if (m[0], m[1]) not in back)))
                self._epoch += 1
            replanned = []
            if replan and unmasked:
                for job in self.registry.jobs():
                    if job.intent_doc is not None and not self._tenant(job.id).removing:
                        replanned.append(self.announce_intent(job.id, job.intent_doc).to_json())
            self._set_gauges()
            return {"unmasked": unmasked, "not_masked": not_masked, "refused": refused, "replanned": replanned}

    def remove_job(self, job_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{job}``: revoke the job; free its circuits now if its window allows, else when it does."""
        with self._lock, self._top_level():
            if self.registry.get(job_id) is None:
                raise NotFound(f"no job {job_id!r} is registered")
            t = self._tenant(job_id)
            try:
                self.registry.revoke(job_id)  # at once and durably: from now on its token only reports events
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            for gate in t.gates.values():
                gate.withdraw(job_id)
            t.pending = None
            t.removing = True
            return self._finish_removal(job_id)

    def _finish_removal(self, job_id: str) -> dict[str, Any]:
        t = self._tenants[job_id]
        circuits = len(t.active.circuits) if t.active else 0
        devices = sorted({c.xc.device for c in t.active.circuits}) if t.active else []
        waiting = [d for d in devices if not self._safe_now(job_id, d)]
        if waiting:
            return {"job": job_id, "removed": False, "circuits_freed": 0, "pending_removal": True,
                    "reason": f"its {circuits} circuits are freed in its next safe window (devices "
                              f"{', '.join(waiting)} switch while it communicates); its token was revoked except for "
                              "reporting events, which it may do until then"}
        if t.active is not None and t.active.circuits:
            empty = CircuitPlan(t.active.fabric, t.active.template, t.active.signature, t.active.link_bps, ())
            try:
                self._apply(t, empty)
            except StoreWriteError as exc:
                raise self._storage_failed(exc) from None
            except Exception as exc:  # noqa: BLE001 - a device fault: the job stays, marked for removal
                if isinstance(exc, (DeviceUnavailable, StorageUnavailable)):
                    raise
                raise DeviceUnavailable(f"freeing job {job_id!r}'s circuits failed ({exc}); it stays marked for "
                                        "removal and is retried") from None
            self._epoch += 1
        try:
            self.registry.remove(job_id)
        except StoreWriteError as exc:
            raise self._storage_failed(exc) from None
        del self._tenants[job_id]
        for name in ("orchestrl_circuits", "orchestrl_core_circuits_asked", "orchestrl_core_circuits_granted"):
            self.metrics.remove(name, job=job_id)
        self.metrics.set("orchestrl_jobs", len(self.registry.jobs()))
        self._replan_later.update(j for j, o in self._tenants.items() if o.starved)  # fibres freed: re-plan them
        return {"job": job_id, "removed": True, "circuits_freed": circuits, "pending_removal": False,
                "reason": f"job removed; its {circuits} circuits were freed"}

    def retry_removals(self) -> None:
        """Free the circuits of removed jobs whose window came (called by the auditor every period)."""
        with self._top_level():
            for job in [j for j, t in self._tenants.items() if t.removing]:
                with contextlib.suppress(DeviceUnavailable, StorageUnavailable, Conflict, Unprocessable):
                    self._finish_removal(job)

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
        """Return the newest decisions (of one job, or all, device audit records included), newest first."""
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
                "jobs": [self.job_doc(j.id) for j in self.registry.jobs()],
                "core_sharing": POLICY}

    def close(self) -> None:
        if self.auditor is not None:
            self.auditor.stop()
        for client in self.devices.values():
            with contextlib.suppress(Exception):  # closing sessions is best effort at shutdown
                client.close()
        self.registry.close()
        self.store.close()
        if self.state_lock is not None:
            self.state_lock.release()
