"""Device audit: read every switch back on a period, compare with the journal, report drift and repair it.

Design note
-----------
A switch can lose its table (a restart), keep half of a bulk command, or be patched by hand; the
journal would never know. :class:`DeviceAuditor` reads every device's cross-connect table every
``period_s`` (default 1 s), and at once after a device error or a reconnect (:meth:`poke`), on
*clients of its own* (a second TL1 session per device), so an audit never waits behind a commit and
a slow or dead device never holds the service's lock. The comparison with the journal then takes
the lock briefly, and only counts if no commit or reconciliation ran while the tables were read
(the service's epoch did not move); otherwise the round is read again.

Drift on a device is the set difference of :func:`fabric.runtime.reconcile.device_changes`:
cross-connects the journal holds and the device lacks (*missing*, including the lost half of a
circuit) and cross-connects on the device the journal does not hold (*unexpected*). It shows in
``/healthz`` (the device, what and why), in ``/metrics`` (``orchestrl_device_drift``,
``orchestrl_device_up``) and in the decision log (one record per change of a device's state).

Policy ``repair`` brings the device back to the journal in the next safe window of every job whose
circuits the repair touches: when that job's gate predicts a window long enough for the device's
switching time, or the job is quiet (no collective in flight and no event for one audit period).
A repair that touches no job's circuit runs at once. Policy ``alert`` only reports. A device that
was unreachable at start-up and comes up holding circuits the journal does not explain is never
cleared on its own: that takes an operator (``POST /v1/reconcile``), as at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from orchestrl.fabric.ocs.errors import OcsError
from orchestrl.fabric.ocs.fanout import each_device
from orchestrl.fabric.runtime.reconcile import SimplexPair, device_changes

__all__ = ["DeviceState", "DeviceAuditor", "DRIFT_POLICIES", "drift_of"]

log = logging.getLogger(__name__)
DRIFT_POLICIES = ("repair", "alert")


@dataclass(frozen=True)
class DeviceState:
    """What the last audit found on one device, as ``/healthz`` reports it."""

    device: str
    state: str  # ok | unreachable | drift | repairing | unknown
    reason: str = ""
    missing: tuple[SimplexPair, ...] = ()  # journal holds, device lacks
    unexpected: tuple[SimplexPair, ...] = ()  # device holds, journal does not
    audited_at: float | None = None  # unix time of the read-back
    since: float | None = None  # unix time the current problem was first seen
    verified: bool = False  # the device has matched the journal (or been reconciled) since start-up

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "state": self.state, "reason": self.reason, "missing": len(self.missing),
                "unexpected": len(self.unexpected), "audited_at": self.audited_at, "since": self.since}


def drift_of(device: str, wanted: list, table: Mapping[int, int], n_ports: int,
             unusable: frozenset[int] = frozenset()) -> tuple[tuple[SimplexPair, ...], tuple[SimplexPair, ...]]:
    """Return ``(missing, unexpected)`` simplex cross-connects of one device against its wanted circuits."""
    ch = device_changes(wanted, table, n_ports, unusable)
    return ch.add, ch.remove


class DeviceAuditor:
    """Audit the devices of a :class:`agents.service.core.ControlService` on a thread of its own.

    Parameters
    ----------
    service : ControlService
        Whose journal, devices, gates and metrics are used.
    clients : mapping of str to OcsDeviceClient
        Clients used only for reading back (a session of their own per device).
    period_s : float
        Seconds between audits.
    policy : str
        ``"repair"`` or ``"alert"``.
    """

    def __init__(self, service: Any, clients: Mapping[str, Any], *, period_s: float = 1.0,
                 policy: str = "repair") -> None:
        if policy not in DRIFT_POLICIES:
            raise ValueError(f"drift policy {policy!r} is unknown (allowed: {', '.join(DRIFT_POLICIES)})")
        if not period_s > 0:
            raise ValueError(f"audit period {period_s!r} must be > 0 seconds")
        self.service, self.clients, self.period_s, self.policy = service, dict(clients), period_s, policy
        self.states: dict[str, DeviceState] = {d: DeviceState(d, "unknown", "not audited yet")
                                               for d in service.devices}
        self.rounds = 0  # completed audits (for tests and the bench)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sessions: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifetime
    def start(self) -> "DeviceAuditor":
        self._thread = threading.Thread(target=self._run, name="orchestrl-audit", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        for c in self.clients.values():
            with contextlib.suppress(Exception):  # closing read sessions is best effort at shutdown
                c.close()

    def poke(self) -> None:
        """Audit now (after a device error or a reconnect), not at the end of the period."""
        self._wake.set()

    def _run(self) -> None:
        # Fixed rate, start to start: a table lost at any moment is read back within one period plus one read.
        due = time.monotonic() + self.period_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            due = max(due + self.period_s, time.monotonic())  # never more than one round behind
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the audit must outlive any one failure; say why
                log.exception("device audit failed; retrying in %.1f s", self.period_s)

    # ------------------------------------------------------------------ one round
    def _read(self) -> dict[str, Any]:
        def read(name: str, client: Any) -> Any:
            try:
                return client.cross_connects()
            except OcsError as exc:
                return exc
            except OSError as exc:  # a socket error the driver did not wrap
                return exc
        return each_device({d: (lambda d=d, c=c: read(d, c)) for d, c in self.clients.items()})

    def run_once(self, *, repair: bool = True) -> dict[str, DeviceState]:
        """Read every device, compare with the journal, record and (policy ``repair``) repair; return the states."""
        svc = self.service
        for _ in range(3):  # a commit during the read makes the round meaningless: read again
            epoch = svc.epoch
            started = time.perf_counter()
            tables = self._read()
            with svc.lock:
                if svc.epoch != epoch:
                    continue
                svc.metrics.observe("orchestrl_audit_seconds", time.perf_counter() - started)
                if svc.in_doubt and svc.settle_in_doubt(tables):  # before drift: a settled commit is no drift
                    epoch = svc.epoch
                self._compare(tables)
                if repair and self.policy == "repair":
                    svc.repair_drift(self.pending_repairs())
                svc.retry_removals()
                self.rounds += 1
                svc.metrics.inc("orchestrl_audits_total", outcome="ok" if all(
                    s.state == "ok" for s in self.states.values()) else "problem")
                break
        svc.storage_probe()
        return dict(self.states)

    def _compare(self, tables: Mapping[str, Any]) -> None:
        svc = self.service
        now = time.time()
        wanted = svc.wanted_by_device()
        for name, table in sorted(tables.items()):
            old = self.states.get(name) or DeviceState(name, "unknown")
            if isinstance(table, BaseException):
                new = DeviceState(name, "unreachable", f"{type(table).__name__}: {table}", old.missing,
                                  old.unexpected, now, old.since if old.state == "unreachable" else now, old.verified)
            else:
                n = svc.devices[name].ports
                missing, unexpected = drift_of(name, wanted.get(name, []), table, n, svc.masked_on(name))
                if not missing and not unexpected:
                    new = DeviceState(name, "ok", "", (), (), now, None, True)
                else:
                    state = "repairing" if old.state == "repairing" else "drift"
                    why = (f"{len(missing)} cross-connects the journal holds are missing and {len(unexpected)} on "
                           f"the device are not in the journal")
                    if not old.verified and unexpected:
                        why += ("; the device was not reachable at start-up and holds circuits the journal does not "
                                "explain: POST /v1/reconcile to remove them")
                    new = DeviceState(name, state, why, missing, unexpected, now,
                                      old.since if old.state in ("drift", "repairing") else now, old.verified)
            self._transition(old, new)
            self.states[name] = new

    def _transition(self, old: DeviceState, new: DeviceState) -> None:
        svc = self.service
        svc.metrics.set("orchestrl_device_up", 0 if new.state == "unreachable" else 1, device=new.device)
        if new.state != "unreachable":
            svc.metrics.set("orchestrl_device_drift", len(new.missing) + len(new.unexpected), device=new.device)
        if old.state == new.state and (new.state != "drift" or (old.missing, old.unexpected) ==
                                       (new.missing, new.unexpected)):
            return
        outcome = {"ok": "recovered" if old.state in ("unreachable", "unknown") else "in-sync",
                   "unreachable": "unreachable", "drift": "drift", "repairing": "drift"}[new.state]
        if old.state == "unknown" and new.state == "ok":
            return  # the first audit agreeing with start-up is no news
        svc.log_device_event(new.device, outcome, new.reason or "matches the journal",
                             missing=len(new.missing), unexpected=len(new.unexpected))

    # ------------------------------------------------------------------ repair
    def pending_repairs(self) -> list[DeviceState]:
        """Devices whose drift policy ``repair`` may fix (drifted, and verified or only missing circuits)."""
        return [s for s in self.states.values() if s.state in ("drift", "repairing")
                and (s.verified or not s.unexpected)]

    def mark(self, device: str, state: str, reason: str = "") -> None:
        """Record a device's state outside an audit (repairing, repaired, reconciled by an operator)."""
        old = self.states.get(device) or DeviceState(device, "unknown")
        if state == "ok":
            self.states[device] = DeviceState(device, "ok", "", (), (), time.time(), None, True)
            self.service.metrics.set("orchestrl_device_drift", 0, device=device)
        else:
            self.states[device] = replace(old, state=state, reason=reason or old.reason)

    def sessions_changed(self) -> bool:
        """Whether a commit client opened a new session (a reconnect) since the last call."""
        now = {d: getattr(c, "sessions", 0) for d, c in self.service.devices.items()}
        changed = bool(self._sessions) and any(now[d] > self._sessions.get(d, 0) for d in now)
        self._sessions = now
        return changed

