"""Reconciliation of OCS devices to the journal: after a restart, and as the rollback of a failed commit.

Design note
-----------
Devices are the truth about what is connected; the journal (:mod:`fabric.runtime.store`) about what
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
Journalled commits themselves live in :mod:`fabric.runtime.commit` (also importable from here, as before).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Collection, Iterable, Mapping

from orchestrl.fabric.ocs.errors import OcsDenied, OcsError, OcsPortBlocked, OcsPortFailed, denied_from_code
from orchestrl.fabric.ocs.fanout import each_device
from orchestrl.fabric.ocs.model import BulkResult, OcsDeviceClient, duplex_to_cross_connects
from orchestrl.fabric.plan import CircuitPlan, CrossConnect, diff_plans
from orchestrl.fabric.runtime.store import CommitRecord, DeviceStep, FabricStore

if TYPE_CHECKING:  # the controller imports nothing of the device layer; keep it that way
    from orchestrl.fabric.controller import FabricController, MaterializeResult
    from orchestrl.fabric.intent import Intent

# Journalled commits (CommitReport, JournaledCommitter, apply_plan_diff, ...) are in fabric.runtime.commit, which
# imports this module; nothing here imports it back.
__all__ = ["UNUSABLE_PORT_STATES", "DeviceChanges", "DeviceReconcile", "ReconcileReport", "device_changes", "reconcile",
           "reconcile_devices_to", "wanted_by_device",
           "reconcile_store", "replan_after_failures", "restore_controller", "bulk_errors", "unusable_ports"]


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


def bulk_errors(result: BulkResult, device: str, command: str) -> list[OcsError]:
    """The refused items of a bulk result as exceptions (empty: every item was applied)."""
    if result.ok:
        return []
    errors: list[OcsError] = [denied_from_code(device, command, s.status, s.message,
                                               [s.port] if s.port else [p for p in (s.ingress, s.egress) if p])
                              for s in result.failed]
    return errors or [OcsError(device, command, "the bulk command stopped before applying every item")]


def unusable_ports(client: OcsDeviceClient, errors: Iterable[BaseException] = ()) -> dict[int, str]:
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
        unusable = unusable_ports(client)
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
                    raised.extend(bulk_errors(res, name, action))
                except OcsDenied as e:  # refused; the table read below says what, if anything, applied
                    raised.append(e)
            after = client.cross_connects()  # the device's own word on what happened
            removed += [p for p in ch.remove if after.get(p[0]) != p[1]]
            added += [p for p in ch.add if after.get(p[0]) == p[1]]
            errors += [str(e) for e in raised]
            if raised:
                unusable = unusable_ports(client, raised)
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
    O(W + T) work for W wanted and T present cross-connects. Devices are reconciled all at once.
    """
    if not isinstance(source, FabricStore):
        wanted = _wanted_by_device([source] if source is not None else [])
        results = _reconcile_devices(devices, wanted)
        return ReconcileReport(results, missing_devices=tuple(sorted(set(wanted) - set(devices))))
    return reconcile_store(source, devices, scope)


def wanted_by_device(plans: Iterable[CircuitPlan]) -> dict[str, list[CrossConnect]]:
    """Return each device's circuits over ``plans`` (the union of every scope's plan on that device)."""
    return _wanted_by_device(plans)


def reconcile_devices_to(plans: Iterable[CircuitPlan], devices: Mapping[str, OcsDeviceClient]) -> ReconcileReport:
    """Bring ``devices`` to the union of ``plans`` without writing any journal (e.g. when the journal cannot be written).

    Used to undo what devices were told when the journal refused to record it: the devices then
    hold exactly what the journal says, whatever the disk does. Per device as :func:`reconcile`.
    """
    wanted = _wanted_by_device(plans)
    results = _reconcile_devices(devices, wanted)
    return ReconcileReport(results, missing_devices=tuple(sorted(set(wanted) - set(devices))))


def _reconcile_devices(devices: Mapping[str, OcsDeviceClient],
                       wanted: Mapping[str, list[CrossConnect]]) -> tuple[DeviceReconcile, ...]:
    """Reconcile every device at once (they are independent); results in device order."""
    done = each_device({d: partial(_reconcile_device, d, c, wanted.get(d, [])) for d, c in devices.items()})
    return tuple(done[d] for d in sorted(done))


def _own_pairs_changed(plan: CircuitPlan, result: DeviceReconcile, n_ports: int) -> bool:
    """Whether reconciling ``result.device`` removed or added a cross-connect of ``plan``."""
    mine = {p for xc in plan.by_device().get(result.device, ())
            for p in duplex_to_cross_connects(xc.a_port, xc.b_port, n_ports)}
    return any(p in mine for p in result.removed + result.added)


def reconcile_store(store: FabricStore, devices: Mapping[str, OcsDeviceClient], scope: str | None,
                    close_state: str = "aborted", close_note: str = "", *,
                    keep_other_scopes: bool = False) -> ReconcileReport:
    """Reconcile ``devices`` to the journal; journal the outcome and close interrupted commits.

    Parameters
    ----------
    store, devices
        The journal and the devices to bring in line with it.
    scope : str or None
        Reconcile to this scope's last committed plan (None: every scope's, merged), and close
        its interrupted commits as ``close_state`` with ``close_note``.
    keep_other_scopes : bool
        Also hold every *other* scope's last committed circuits on these devices (a rollback of
        ``scope`` on devices it shares). Such a scope gets a reconcile record only when one of
        its own cross-connects had to be restored or a port it uses failed.

    Notes
    -----
    Devices are reconciled all at once; per device as :func:`reconcile`. Each journalled scope
    costs two journal writes (the reconciled plan, then the confirmations with the outcome).
    """
    pending = store.in_flight(scope)
    own = {scope} if scope is not None else set(store.scopes()) | {r.scope for r in pending}
    bystanders = set(store.scopes()) - own if keep_other_scopes and scope is not None else set()
    targets: dict[str, CommitRecord | None] = {s: store.last_committed(s) for s in sorted(own | bystanders)}
    plans = {s: r.plan for s, r in targets.items() if r is not None}
    wanted = _wanted_by_device(plans.values())
    results = _reconcile_devices(devices, wanted)
    report = ReconcileReport(results, {s: r.id if r else None for s, r in targets.items() if s in own},
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
        if s in bystanders:
            changed = any(_own_pairs_changed(rec.plan, d, devices[d.device].ports) for d in touched)
        else:
            changed = any(d.removed or d.added for d in touched)
        if effective is rec.plan and not changed:
            continue
        cid = store.begin_commit(s, effective, kind="reconcile", base_id=rec.id)
        steps = [DeviceStep(d.device, action, pairs, pairs, "ok") for d in touched
                 for action, pairs in (("remove", d.removed), ("add", d.added)) if pairs]
        all_ok = all(d.ok for d in touched)
        store.finish_commit(cid, "committed" if all_ok else "failed", "" if all_ok else "; ".join(
            f"{d.device}: {'; '.join(d.errors) or 'residual ' + str(d.residual)}" for d in touched if not d.ok),
            steps=steps)
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
