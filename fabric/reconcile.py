"""Journalled commits to OCS devices, and reconciliation of devices to the journal after a restart.

Design note
-----------
Devices are the truth about what is connected; the journal (:mod:`fabric.store`) about what
*should* be. A full-duplex circuit ``a<->b`` on an N-port device is two simplex cross-connects,
``a -> N+b`` and ``b -> N+a`` (:func:`fabric.ocs.model.duplex_to_cross_connects`), so the wanted
ingress -> egress table follows from the plan alone and reconciliation is a set difference:
every table entry that is not exactly wanted is removed (stale circuits, ports paired in an
unexpected combination, a surviving half whose other half points elsewhere), then every missing
wanted entry is added (including the missing half of a half circuit). A device's removals go in
one bulk command before its additions, so ports are freed before reuse; the wanted table is
injective, so after the removals every port an addition needs is free. The table read back then
equals the wanted table, hence a second run finds nothing to do.

Ports the device reports failed or force-blocked cannot carry a circuit: circuits touching them
are dropped from the target (and their remaining halves removed), the ports are masked in the
store and listed in the report, and the caller re-plans under the remaining port budget
(:func:`replan_after_failures`, OrchestrRL §5.4).

Only the :class:`fabric.ocs.model.OcsDeviceClient` protocol is used (TL1 driver, emulator, fakes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Collection, Iterable, Mapping

from fabric.errors import OrchestrlError
from fabric.ocs.errors import OcsDenied, OcsError, OcsPortBlocked, OcsPortFailed, denied_from_code
from fabric.ocs.model import BulkResult, OcsDeviceClient, duplex_to_cross_connects
from fabric.plan import CircuitPlan, CrossConnect, diff_plans
from fabric.store import CommitRecord, FabricStore

if TYPE_CHECKING:  # the controller imports nothing of the device layer; keep it that way
    from fabric.controller import FabricController, MaterializeResult
    from fabric.intent import Intent

__all__ = ["UNUSABLE_PORT_STATES", "DeviceChanges", "DeviceReconcile", "ReconcileReport", "CommitReport", "CommitError",
           "CommitInFlightError", "device_changes", "reconcile", "apply_plan_diff", "JournaledCommitter",
           "replan_after_failures", "restore_controller"]

UNUSABLE_PORT_STATES = ("failed", "force-blocked")  # port states no circuit may use
_MAX_ROUNDS = 4  # reconcile passes per device; each pass only grows the set of unusable ports
SimplexPair = tuple[int, int]  # (ingress 1..N, egress N+1..2N)


def _duplex_port(device_port: int, n_ports: int) -> int:  # ingress i and egress N+i are duplex port i
    return (device_port - 1) % n_ports + 1


@dataclass(frozen=True)
class DeviceChanges:
    """What one device must do to hold exactly the wanted circuits."""

    remove: tuple[SimplexPair, ...]  # present but not wanted: removed first, freeing their ports
    add: tuple[SimplexPair, ...]  # wanted but missing: added after the removals
    unserved: tuple[CrossConnect, ...]  # wanted circuits that touch an unusable port: not applied

    @property
    def empty(self) -> bool:
        return not self.remove and not self.add


def device_changes(wanted: Iterable[CrossConnect], table: Mapping[int, int], n_ports: int,
                   unusable: Collection[int] = ()) -> DeviceChanges:
    """Return the removals and additions that turn ``table`` into exactly ``wanted``.

    ``wanted`` are the device's circuits in the target (duplex ports 1..N), ``table`` its
    cross-connects as read back (ingress -> egress), ``unusable`` the duplex ports that cannot
    carry a circuit. Raises ``ValueError`` if ``wanted`` uses a port twice or outside 1..N.
    O(W + T) for W wanted circuits and T table entries.

    Examples
    --------
    >>> ch = device_changes([CrossConnect("d", 1, 2)], {1: 7, 3: 5}, 4)  # 1<->2 wants 1->6, 2->5
    >>> ch.remove, ch.add
    (((1, 7), (3, 5)), ((1, 6), (2, 5)))
    """
    want: dict[int, int] = {}
    owner: dict[int, CrossConnect] = {}
    unserved: list[CrossConnect] = []
    for xc in sorted(set(wanted)):
        pairs = duplex_to_cross_connects(xc.a_port, xc.b_port, n_ports)
        for port in {xc.a_port, xc.b_port}:
            if port in owner:
                raise ValueError(f"circuits {owner[port]} and {xc} both use port {port}; a port carries one circuit")
            owner[port] = xc
        if xc.a_port in unusable or xc.b_port in unusable:
            unserved.append(xc)
            continue
        want.update(pairs)
    remove = tuple(sorted((i, e) for i, e in table.items() if want.get(i) != e))
    add = tuple(sorted((i, e) for i, e in want.items() if table.get(i) != e))
    return DeviceChanges(remove, add, tuple(unserved))


@dataclass(frozen=True)
class DeviceReconcile:
    """Outcome of reconciling one device."""

    device: str
    removed: tuple[SimplexPair, ...]  # simplex cross-connects the device confirmed removed
    added: tuple[SimplexPair, ...]  # simplex cross-connects the device confirmed added
    unusable_ports: Mapping[int, str]  # duplex port -> state (failed, force-blocked)
    unserved: tuple[CrossConnect, ...]  # target circuits left out because a port is unusable
    residual: tuple[SimplexPair, ...] = ()  # differences still left after the last pass
    errors: tuple[str, ...] = ()  # device errors, in words
    reachable: bool = True  # False: the device did not answer (or not sensibly); nothing is known

    @property
    def ok(self) -> bool:  # the device holds exactly the target circuits minus the unserved ones
        return self.reachable and not self.residual


@dataclass(frozen=True)
class ReconcileReport:
    """Outcome of :func:`reconcile`: per device, and what the caller must act on."""

    devices: tuple[DeviceReconcile, ...]
    target_commits: Mapping[str, int | None] = field(default_factory=dict)  # scope -> record reconciled to
    resolved_commits: tuple[int, ...] = ()  # interrupted commits now closed (devices restored)
    missing_devices: tuple[str, ...] = ()  # devices of the target plans without a client
    reconcile_commits: tuple[int, ...] = ()  # journal records of this reconciliation

    @property
    def changes(self) -> int:
        """Simplex cross-connects removed plus added (0 on a fabric already at the target)."""
        return sum(len(d.removed) + len(d.added) for d in self.devices)

    @property
    def failed_ports(self) -> list[tuple[str, int, str]]:
        """``(device, duplex port, state)`` of every unusable port, ready for ``mask_ports``."""
        return [(d.device, p, s) for d in self.devices for p, s in sorted(d.unusable_ports.items())]

    @property
    def unserved(self) -> list[CrossConnect]:
        return [xc for d in self.devices for xc in d.unserved]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.devices) and not self.missing_devices


class CommitError(OrchestrlError):
    """A plan could not be applied; devices were restored to the previous plan if ``rolled_back``."""

    def __init__(self, commit_id: int, problem: str, failed_ports: list[tuple[str, int, str]],
                 rollback: ReconcileReport | None) -> None:
        self.commit_id = commit_id
        self.failed_ports = failed_ports
        self.rollback = rollback
        self.rolled_back = rollback is not None and all(d.ok for d in rollback.devices)  # the touched ones
        fix = ("devices were restored to the last committed plan" if self.rolled_back else
               "devices may be half-changed: run reconcile() with every device before the next commit")
        if failed_ports:
            fix += f"; re-plan without the failed ports {', '.join(f'{d}:{p}' for d, p, _ in failed_ports)}"
        super().__init__(f"commit {commit_id}: {problem}; {fix}")


class CommitInFlightError(OrchestrlError):
    """An earlier commit of the scope never finished; devices must be reconciled first."""


def _bulk_errors(result: BulkResult, device: str, command: str) -> list[OcsError]:
    """The refused items of a bulk result as exceptions (empty: every item was applied)."""
    if result.ok:
        return []
    errors: list[OcsError] = [denied_from_code(device, command, s.status, s.message,
                                               [s.port] if s.port else [p for p in (s.ingress, s.egress) if p])
                              for s in result.failed]
    return errors or [OcsError(device, command, "the bulk command stopped before applying every item")]


def _unusable(client: OcsDeviceClient, errors: Iterable[BaseException] = ()) -> dict[int, str]:
    """Duplex ports that cannot carry a circuit: from the device's port status, and from refusals.

    A refusal for a failed or blocked port names both ports of the cross-connect; it only counts
    when the port status does not already explain it.
    """
    n = client.ports
    out: dict[int, str] = {}
    for port, st in client.port_status().items():
        state = getattr(st, "state", st)  # a PortStatus, or a bare state from a minimal client
        state = str(getattr(state, "value", state))
        if state in UNUSABLE_PORT_STATES:
            out.setdefault(_duplex_port(port, n), state)
    for e in errors:
        if isinstance(e, (OcsPortFailed, OcsPortBlocked)):
            ports = {_duplex_port(p, n) for p in e.ports}
            if not ports & set(out):
                out.update((p, "failed" if isinstance(e, OcsPortFailed) else "force-blocked") for p in ports)
    return dict(sorted(out.items()))


def _reconcile_device(name: str, client: OcsDeviceClient, wanted: list[CrossConnect]) -> DeviceReconcile:
    """Bring one device to ``wanted`` in at most ``_MAX_ROUNDS`` read-diff-apply passes."""
    removed: list[SimplexPair] = []
    added: list[SimplexPair] = []
    errors: list[str] = []
    try:
        n = client.ports
        unusable = _unusable(client)
        table = client.cross_connects()
        for _ in range(_MAX_ROUNDS):
            ch = device_changes(wanted, table, n, unusable)
            if ch.empty:
                break
            raised: list[BaseException] = []
            for action, pairs in (("remove", ch.remove), ("add", ch.add)):
                if not pairs:
                    continue
                try:
                    if action == "remove":
                        res = client.disconnect([i for i, _ in pairs])
                    else:
                        res = client.connect(list(pairs), mode="continue")
                    raised.extend(_bulk_errors(res, name, action))
                except OcsDenied as e:  # refused; the table read below says what, if anything, applied
                    raised.append(e)
            after = client.cross_connects()  # the device's own word on what happened
            removed += [p for p in ch.remove if after.get(p[0]) != p[1]]
            added += [p for p in ch.add if after.get(p[0]) == p[1]]
            errors += [str(e) for e in raised]
            if raised:
                unusable = _unusable(client, raised)
            table = after
        ch = device_changes(wanted, table, n, unusable)
    except OcsError as e:  # unreachable or not answering sensibly: this device is not reconciled
        return DeviceReconcile(name, tuple(removed), tuple(added), {}, (), (), (*errors, str(e)), reachable=False)
    return DeviceReconcile(name, tuple(removed), tuple(added), unusable, ch.unserved,
                           ch.remove + ch.add, tuple(errors))


def _wanted_by_device(plans: Iterable[CircuitPlan]) -> dict[str, list[CrossConnect]]:
    out: dict[str, list[CrossConnect]] = {}
    for xc in (c.xc for plan in plans for c in plan.circuits):
        out.setdefault(xc.device, []).append(xc)
    return out


def _without(plan: CircuitPlan, dropped: set[CrossConnect], why: str) -> CircuitPlan:
    kept = tuple(c for c in plan.circuits if c.xc not in dropped)
    if len(kept) == len(plan.circuits):
        return plan
    notes = tuple(f"circuit {c.xc} ({c.a}-{c.b}) dropped by reconciliation: {why}"
                  for c in plan.circuits if c.xc in dropped)
    return dataclasses.replace(plan, circuits=kept, notes=plan.notes + notes)


def reconcile(source: FabricStore | CircuitPlan | None, devices: Mapping[str, OcsDeviceClient], *,
              scope: str | None = None) -> ReconcileReport:
    """Bring every device in ``devices`` to the last committed plan; return what was done.

    ``source`` is a store: reconcile to the last committed plan of ``scope`` (or of every scope,
    merged), mask unusable ports, journal the outcome and close interrupted commits; or a plan
    (None: an empty fabric) to reconcile to, writing nothing. ``devices`` are every device to
    reconcile, by the names the plans use; a device without circuits in the target is cleared, so
    a store that never committed anything (a new or replaced file) clears every device given.

    The report's ``changes`` is 0 on a second run; ``failed_ports`` lists ports to re-plan around.
    Per device: one port-status read, one table read and at most two bulk commands per pass;
    O(W + T) work for W wanted and T present cross-connects.
    """
    if not isinstance(source, FabricStore):
        wanted = _wanted_by_device([source] if source is not None else [])
        results = tuple(_reconcile_device(d, c, wanted.get(d, [])) for d, c in sorted(devices.items()))
        return ReconcileReport(results, missing_devices=tuple(sorted(set(wanted) - set(devices))))
    return _reconcile_store(source, devices, scope)


def _reconcile_store(store: FabricStore, devices: Mapping[str, OcsDeviceClient], scope: str | None,
                     close_state: str = "aborted", close_note: str = "") -> ReconcileReport:
    pending = store.in_flight(scope)
    scopes = sorted({scope} if scope is not None else set(store.scopes()) | {r.scope for r in pending})
    targets: dict[str, CommitRecord | None] = {s: store.last_committed(s) for s in scopes}
    plans = {s: r.plan for s, r in targets.items() if r is not None}
    wanted = _wanted_by_device(plans.values())
    results = tuple(_reconcile_device(d, c, wanted.get(d, [])) for d, c in sorted(devices.items()))
    report = ReconcileReport(results, {s: r.id if r else None for s, r in targets.items()},
                             missing_devices=tuple(sorted(set(wanted) - set(devices))))
    if report.failed_ports:
        store.mask_ports(report.failed_ports)
    dropped = set(report.unserved)
    by_device = {d.device: d for d in results}
    journal: list[int] = []
    for s, rec in targets.items():
        if rec is None:
            continue
        effective = _without(rec.plan, dropped, "a port is failed or force-blocked")
        touched = [by_device[d] for d in rec.plan.by_device() if d in by_device]
        if effective is rec.plan and not any(d.removed or d.added for d in touched):
            continue
        cid = store.begin_commit(s, effective, kind="reconcile", base_id=rec.id)
        for d in touched:
            if d.removed:
                store.record_step(cid, d.device, "remove", d.removed, d.removed, "ok")
            if d.added:
                store.record_step(cid, d.device, "add", d.added, d.added, "ok")
        all_ok = all(d.ok for d in touched)
        store.finish_commit(cid, "committed" if all_ok else "failed", "" if all_ok else "; ".join(
            f"{d.device}: {'; '.join(d.errors) or 'residual ' + str(d.residual)}" for d in touched if not d.ok))
        journal.append(cid)
    resolved = []
    for rec in pending:
        base = targets.get(rec.scope)
        touched = diff_plans(base.plan if base else None, rec.plan).devices()
        if all(d in by_device and by_device[d].ok for d in touched):
            target = f"commit {base.id}" if base else "an empty fabric"
            store.finish_commit(rec.id, close_state, close_note or f"interrupted; devices reconciled to {target}")
            resolved.append(rec.id)
    return dataclasses.replace(report, resolved_commits=tuple(resolved), reconcile_commits=tuple(journal))


@dataclass(frozen=True)
class CommitReport:
    """Outcome of a successful :func:`apply_plan_diff`."""

    commit_id: int
    base_id: int | None  # committed record the change started from
    removed: int  # full-duplex circuits removed
    added: int  # full-duplex circuits added
    devices: tuple[str, ...]  # devices touched


def _bulk_step(store: FabricStore, cid: int, name: str, client: OcsDeviceClient, action: str,
               pairs: list[SimplexPair]) -> list[BaseException]:
    """Run one bulk command, journal what the device confirmed, return the errors (empty: all done)."""
    errors: list[BaseException] = []
    try:
        res = client.disconnect([i for i, _ in pairs]) if action == "remove" else client.connect(pairs, mode="stop")
        errors.extend(_bulk_errors(res, name, action))
    except OcsError as e:
        errors.append(e)
    done, status = pairs, "ok"
    if errors:
        try:  # the command may have applied in part: read back what the device holds
            table = client.cross_connects()
            done = [p for p in pairs if (table.get(p[0]) == p[1]) == (action == "add")]
        except OcsError as e:
            errors.append(e)
            done = []
        status = "partial" if done else "failed"
    store.record_step(cid, name, action, pairs, done, status, "; ".join(map(str, errors)))
    return errors


def apply_plan_diff(store: FabricStore, plan: CircuitPlan, devices: Mapping[str, OcsDeviceClient], *,
                    scope: str | None = None) -> CommitReport:
    """Apply ``plan`` to the devices as one journalled commit; return what changed.

    Journal the intent, then per device one bulk removal followed by one bulk addition (ports are
    freed before reuse), journalling what each device confirmed, then mark the commit committed.
    The diff is taken against the store's last committed plan of ``scope`` (default: the plan's
    fabric name), which is what the devices hold.

    Raises :class:`CommitInFlightError` if an earlier commit of the scope was interrupted (call
    :func:`reconcile` first); :class:`CommitError` if a device refused: the touched devices are
    reconciled back to the last committed plan, the commit is marked failed and ``failed_ports``
    lists ports to re-plan around; ``KeyError`` if a changed device has no client (nothing sent).
    """
    scope = plan.fabric if scope is None else scope
    pending = store.in_flight(scope)
    if pending:
        raise CommitInFlightError(f"scope {scope!r}: commit {pending[0].id} was interrupted and devices may be "
                                  "half-changed; run reconcile(store, devices) before committing again")
    base = store.last_committed(scope)
    diff = diff_plans(base.plan if base else None, plan)
    missing = [d for d in diff.devices() if d not in devices]
    if missing:
        raise KeyError(f"plan for scope {scope!r} changes devices without a client: {', '.join(missing)}; "
                       "add them to the device configuration")
    cid = store.begin_commit(scope, plan, base_id=base.id if base else None)
    for name in diff.devices():
        client = devices[name]
        n = client.ports
        for action, xcs in (("remove", diff.remove), ("add", diff.add)):
            pairs = [p for xc in xcs if xc.device == name for p in duplex_to_cross_connects(xc.a_port, xc.b_port, n)]
            if not pairs:
                continue
            errors = _bulk_step(store, cid, name, client, action, pairs)
            if errors:
                rollback = _reconcile_store(store, {d: devices[d] for d in diff.devices()}, scope,
                                            "failed", f"{name} {action}: {errors[0]}")
                try:
                    refused = _unusable(client, errors)
                except OcsError:
                    refused = {}
                failed = sorted(set(rollback.failed_ports) | {(name, p, s) for p, s in refused.items()})
                if failed:
                    store.mask_ports(failed)
                raise CommitError(cid, f"device {name} refused {action}: {errors[0]}", failed, rollback)
    store.finish_commit(cid, "committed")
    return CommitReport(cid, base.id if base else None, len(diff.remove), len(diff.add), tuple(diff.devices()))


class JournaledCommitter:
    """:class:`fabric.controller.PlanCommitter` that journals every commit in a store.

    The ``diff`` the controller passes is not trusted: the change is re-derived from the store's
    last committed plan, which is what the devices hold even after a restart.
    """

    def __init__(self, store: FabricStore, devices: Mapping[str, OcsDeviceClient], scope: str | None = None):
        self.store = store
        self.devices = devices
        self.scope = scope
        self.last: CommitReport | None = None

    def commit(self, plan: CircuitPlan, diff: object = None) -> None:
        self.last = apply_plan_diff(self.store, plan, self.devices, scope=self.scope)

    def recover(self) -> ReconcileReport:
        """Reconcile every device to the journal (call once at start-up, and after a CommitError)."""
        return reconcile(self.store, self.devices, scope=self.scope)


def restore_controller(controller: FabricController, store: FabricStore, scope: str | None = None) -> None:
    """Load the journal into a freshly started controller: masked ports, template cache, active plan."""
    masked = [(m.device, m.port, m.reason) for m in store.masked_ports() if m.device in controller.topology.devices]
    if masked:
        controller.mask_ports(masked)
    held = {e.signature for e in controller.cache.entries()}
    for entry in store.load_template_cache().entries():  # entries the controller already holds win
        if entry.signature not in held:
            controller.cache.put(entry)
    controller.active = store.last_committed_plan(controller.topology.name if scope is None else scope)


def replan_after_failures(controller: FabricController, failed_ports: Iterable[tuple[str, int, str]],
                          intent: Intent | None = None, *, store: FabricStore | None = None, apply: bool = True
                          ) -> MaterializeResult:
    """Mask ``failed_ports`` and re-materialize ``intent`` under the remaining port budget (§5.4).

    Masks the ports in the controller's topology (and in ``store``), materializes the intent again
    and, when ``apply``, applies an accepted plan through the controller's committer. If the
    result is not accepted the previous plan stays.
    """
    failed = [(d, int(p), r) for d, p, r in failed_ports]
    if failed:
        controller.mask_ports(failed)
        if store is not None:
            store.mask_ports(failed)
    if intent is None:
        intent = controller.last_intent
    if intent is None:
        raise ValueError("replan_after_failures: the controller has planned nothing yet; pass the intent to re-plan")
    result = controller.materialize(intent)
    if apply and result.accepted:
        controller.apply(result)
    return result
