"""The control service's device-commit path: apply a job's change under a deadline, and answer device faults.

These methods belong to :class:`agents.service.core.ControlService` (split off so each module has one job):
applying a plan as journalled commits in the non-blocking order (§5.4), the deadline every device wait of
a commit runs under, reconciling the devices back to the journal after a failed or half-applied commit,
and turning a device fault or an in-doubt commit into the 503 that says what the devices hold now.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

from orchestrl.agents.service.checks import DeviceUnavailable
from orchestrl.agents.service.decisions import PeriodDecision, scope_of
from orchestrl.agents.service.ordered_commit import (
    OrderedCommit,
    PlannedChange,
    apply_in_order,
)
from orchestrl.fabric.ocs.errors import OcsError
from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.runtime.commit import (
    CommitError,
    CommitInDoubt,
    CommitInFlightError,
)
from orchestrl.fabric.runtime.reconcile import reconcile, reconcile_devices_to
from orchestrl.fabric.runtime.store import StoreWriteError

__all__ = ["DeviceCommitMixin"]


class DeviceCommitMixin:
    """Device commits and device faults of :class:`~orchestrl.agents.service.core.ControlService`."""

    def _apply(self, tenant: Any, plan: CircuitPlan, change: PlannedChange | None = None) -> OrderedCommit:
        """Apply the job's change as journalled commits; a refused journal write undoes what the devices were told."""
        scope = tenant.job if tenant.job.startswith("fabric/") else scope_of(tenant.job)  # fabric/adopted is no job
        steps = change.steps if change is not None else 2
        with self._deadline((steps + 1) * self.round_trip_s):
            return self._apply_bounded(tenant, plan, change, scope)

    @contextmanager
    def _deadline(self, seconds: float):  # noqa: ANN202 - a context manager
        """Cap every device wait of the commit clients at ``seconds`` from now (an outer deadline stays)."""
        deadline = time.monotonic() + seconds
        set_here = [c for c in self.devices.values() if hasattr(c, "deadline") and c.deadline is None]
        for c in set_here:
            c.deadline = deadline
        try:
            yield
        finally:
            for c in set_here:
                c.deadline = None

    def commit_bound_s(self, steps: int = 2) -> float:
        """The longest a commit of ``steps`` steps waits on the devices: (steps + 1) device round trips."""
        return (steps + 1) * self.round_trip_s

    def _apply_bounded(self, tenant: Any, plan: CircuitPlan, change: PlannedChange | None,
                       scope: str) -> OrderedCommit:
        try:
            try:
                return apply_in_order(self.store, tenant.active, plan, self.devices, scope=scope, change=change)
            except CommitInFlightError:  # an earlier commit was cut short: restore the devices first
                self._self_reconcile("before-commit")
                tenant.active = self.store.last_committed_plan(scope)
                try:
                    return apply_in_order(self.store, tenant.active, plan, self.devices, scope=scope)
                except CommitInFlightError:
                    raise DeviceUnavailable(self._unreconciled("an interrupted commit could not be closed")) from None
        except StoreWriteError as exc:
            # The journal refused a record: undo on the devices whatever it does not hold, so that the devices
            # never disagree with it, then answer 507. A commit whose intent was not written touched nothing.
            restored = reconcile_devices_to(self.committed_plans().values(), self.devices)
            self._epoch += 1
            tenant.active = self.store.last_committed_plan(scope)
            if not restored.ok:
                self._after_device_error(None)
            raise self._storage_failed(exc, "the change was not made; the devices hold the last committed plans"
                                       + ("" if restored.ok else " except on devices that did not answer")) from None
        except OcsError as exc:  # a device error outside a step (e.g. reading back after a refusal)
            self._after_device_error(exc)
            self._self_reconcile("after-device-error")
            tenant.active = self.store.last_committed_plan(scope)
            raise DeviceUnavailable(f"device {exc.device}: {exc}; " + self._agreement()) from None

    def _self_reconcile(self, outcome: str) -> Any:
        """Bring every device back to the journal (after a failed or half-applied commit); the service stays usable."""
        self.metrics.inc("orchestrl_reconciliations_total", outcome=outcome)
        try:
            report = reconcile(self.store, self.devices)
        except StoreWriteError as exc:
            raise self._storage_failed(exc) from None
        self._epoch += 1
        self.last_reconcile_report = report
        for j, t in self._tenants.items():
            t.active = self.store.last_committed_plan(scope_of(j))
        if report.failed_ports:
            self.controller.mask_ports(report.failed_ports)
        if self.auditor is not None:
            self.auditor.poke()
        return report

    def _unreconciled(self, what: str) -> str:
        report = getattr(self, "last_reconcile_report", None)
        bad = [f"{d.device} ({'; '.join(d.errors[-1:]) or f'{len(d.residual)} cross-connects differ'})"
               for d in (report.devices if report else ()) if not d.ok]
        return f"{what}: devices {', '.join(bad) or 'unknown'} do not match the journal; the audit keeps repairing"

    def _after_device_error(self, exc: BaseException | None) -> None:
        """A device erred: audit now, and reconcile at once if the rollback did not bring the devices back."""
        if isinstance(exc, CommitError) and not exc.rolled_back:
            self._self_reconcile("after-failed-commit")
        elif self.auditor is not None:
            self.auditor.poke()

    def _device_failed(self, tenant: Any, base: dict, reason: str, started: float, *,
                       in_doubt: bool = False) -> DeviceUnavailable:
        """Journal the decision as failed and return the 503 that reports it, saying what the devices hold now."""
        if not in_doubt:
            reason += "; " + self._agreement()
        self._failed(tenant, base, reason, started)
        return DeviceUnavailable(reason)

    def _agreement(self) -> str:
        """What is true of the devices after a failed commit and its rollback, in words (issue 28.7)."""
        report = getattr(self, "last_reconcile_report", None)
        bad = [d for d in (report.devices if report is not None else ()) if not d.ok]
        if not bad:
            return "the devices were restored: the job keeps its last committed circuits and the journal and the devices agree"
        period = self.auditor.period_s if self.auditor is not None else 1.0
        for d in bad:
            if self.auditor is not None:
                self.auditor.mark(d.device, "drift" if d.reachable else "unreachable",
                                  "a failed commit could not be rolled back" + (f": {d.errors[-1]}" if d.errors else ""))
        return (f"devices {', '.join(d.device for d in bad)} may be half-changed ("
                + "; ".join(f"{d.device}: {len(d.residual)} cross-connects differ from the journal" if d.reachable
                            else f"{d.device}: did not answer" for d in bad)
                + f"); the audit reads them every {period:g} s and repairs them in the job's next safe window once "
                  "they answer and the fault is gone")

    def _in_doubt(self, tenant: Any, base: dict, exc: CommitInDoubt, started: float) -> DeviceUnavailable:
        """Record a commit whose outcome is unknown: health says so at once, the next read-back settles it."""
        self.in_doubt[exc.scope] = {"commit": exc.commit_id, "devices": exc.devices, "since": time.time(),
                                    "reason": exc.problem}
        self.metrics.inc("orchestrl_device_faults_total", kind="in-doubt")
        tenant.active = self.store.last_committed_plan(exc.scope)
        self._epoch += 1
        if self.auditor is not None:
            self.auditor.poke()
        period = self.auditor.period_s if self.auditor is not None else 1.0
        return self._device_failed(tenant, base, (
            f"commit {exc.commit_id} is in doubt: {exc.problem}; the devices {', '.join(exc.devices)} may hold the new "
            f"plan or the last committed one; health says so, and the next read-back of the audit (every {period:g} s) "
            "settles it: committed if the devices hold it, else restored to the last committed plan"), started,
            in_doubt=True)

    def _failed(self, tenant: Any, base: dict, reason: str, started: float) -> PeriodDecision:
        took = time.perf_counter() - started
        return self._record(PeriodDecision(**{**base, "decision": "failed", "reason": reason, "device_s": took}))
