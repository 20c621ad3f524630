"""Journalled plan changes on OCS devices: journal the intent, drive every device at once, journal the outcome.

Design note
-----------
A commit moves the devices of a scope from the store's last committed plan to a new one. Its
intent (the new plan) is journalled before any device is touched. Then every device the diff
touches gets one bulk removal followed by one bulk addition (ports are freed before reuse), all
devices at once, since they are independent (:func:`fabric.ocs.fanout.each_device`). Then what
each device confirmed and the outcome are journalled in one transaction, the commit's only fsync'd
one: the intent is in the WAL (the OS page cache) before the first command, which survives a crash
of the process; a power cut may lose it, and then restart reconciliation, which reads every
device, restores the last committed plan all the same (:mod:`fabric.runtime.store` gives the argument).

A change made of several ordered steps (§5.4, :mod:`agents.service.ordered_commit`) is a chain of such
commits in which closing one step and journalling the next step's intent is a single transaction
(:meth:`fabric.runtime.store.FabricStore.advance_commit`): S steps cost S + 1 journal writes, one fsync
(the last), and S device round trips, each as long as the slowest device of its step. After a
crash of the process anywhere in the chain the journal names the step in flight and its committed
predecessor, which reconciliation restores; after a power cut, the chain's last durable commit.

A device that supports it (:meth:`fabric.ocs.driver.Tl1Driver.disconnect_then_connect`) gets a
step's removal and addition in one round trip: the addition is sent before the removal's reply is
read, and the device works through them in order. So a refused removal no longer holds the
addition back, which the device may then apply anyway; the device's table is read back after any
error and each action is journalled with what the device really holds (never as confirmed when it
was not), and the step fails like any other refusal. A TL1 driver's commands go out without a
thread per device (:class:`fabric.ocs.fanout.SendCollect`): the commit's thread writes every
device's commands of the step, then reads each device's replies in turn; a device whose write or
reply failed is read back after its own reply, and every other device's reply is still read, so
no reply is left on a session and each device's confirmations are its own.

If a device refuses, the step's devices are reconciled back to what the journal says they hold:
the union of *every* scope's last committed plan, so the rollback of one scope never removes the
circuits another scope holds on a shared device. Earlier steps of a chain stay committed.
"""

from __future__ import annotations

from contextlib import suppress
import threading
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping, Sequence

from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.ocs.errors import OcsConnectionError, OcsError, OcsTimeout
from orchestrl.fabric.ocs.fanout import SendCollect, each_device
from orchestrl.fabric.ocs.model import BulkResult, OcsDeviceClient, duplex_to_cross_connects
from orchestrl.fabric.plan import CircuitPlan, PlanDiff, diff_plans
from orchestrl.fabric.runtime.reconcile import ReconcileReport, SimplexPair, bulk_errors, reconcile, reconcile_store, unusable_ports
from orchestrl.fabric.runtime.store import DeviceStep, FabricStore

__all__ = ["CommitReport", "CommitError", "CommitInDoubt", "CommitInFlightError", "outcome_unknown", "apply_plan_diff", "apply_plan_steps",
           "JournaledCommitter"]


@dataclass(frozen=True)
class CommitReport:
    """Outcome of one successful journalled commit (one step of a chain)."""

    commit_id: int
    base_id: int | None  # committed record the change started from
    removed: int  # full-duplex circuits removed
    added: int  # full-duplex circuits added
    devices: tuple[str, ...]  # devices touched


class CommitError(OrchestrlError):
    """A plan could not be applied; devices were restored to the previous plan if ``rolled_back``."""

    def __init__(self, commit_id: int, problem: str, failed_ports: list[tuple[str, int, str]],
                 rollback: ReconcileReport | None) -> None:
        self.commit_id = commit_id
        self.failed_ports = failed_ports
        self.rollback = rollback
        self.problem = problem
        self.rolled_back = rollback is not None and all(d.ok for d in rollback.devices)  # the touched ones
        fix = ("devices were restored to the last committed plan" if self.rolled_back else
               "devices may be half-changed: run reconcile() with every device before the next commit")
        if failed_ports:
            fix += f"; re-plan without the failed ports {', '.join(f'{d}:{p}' for d, p, _ in failed_ports)}"
        super().__init__(f"commit {commit_id}: {problem}; {fix}")


class CommitInDoubt(OrchestrlError):
    """A device did not answer a command of the step in time: whether it applied it is unknown.

    The commit stays *in flight* in the journal (nothing is rolled back on a device that may be busy
    applying it); the next read-back of ``devices`` settles it: committed when they hold the step's
    plan, else restored to the last committed one. Start-up after a crash does the same.
    """

    def __init__(self, commit_id: int, scope: str, devices: Sequence[str], problem: str) -> None:
        self.commit_id, self.scope, self.devices, self.problem = commit_id, scope, tuple(devices), problem
        super().__init__(f"commit {commit_id} of {scope} is in doubt: {problem}; devices {', '.join(self.devices)} may "
                         "hold it or not; the next read-back settles it")


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a device error leaves unknown what the device did: its reply is missing, though the command was sent.

    A connection that could not be opened, a refused login or a deadline passed before sending sent nothing.
    """
    return isinstance(exc, (OcsTimeout, OcsConnectionError)) and exc.command not in ("connect", "ACT-USER")


class CommitInFlightError(OrchestrlError):
    """An earlier commit of the scope never finished; devices must be reconciled first."""


_Outcome = tuple[DeviceStep, list[BaseException]]  # what a device confirmed, and its errors (empty: all done)
_Pairs = tuple[SimplexPair, ...]
# diff -> each device's simplex pairs, by the diff's identity (see _step_pairs)
_PAIRS: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[PlanDiff, dict[str, tuple[_Pairs, _Pairs]]]] = {}
_PAIRS_LOCK = threading.Lock()


def _bulk_step(name: str, client: OcsDeviceClient, action: str, pairs: Sequence[SimplexPair]) -> _Outcome:
    """Run one bulk command (``pairs`` not empty); return what the device confirmed (read back on error), its errors."""
    errors: dict[str, list[BaseException]] = {"remove": [], "add": []}
    try:
        res = client.disconnect([i for i, _ in pairs]) if action == "remove" else client.connect(pairs, mode="stop")
        errors[action] += bulk_errors(res, name, action)
    except OcsError as e:
        errors[action].append(e)
    removals, additions = (pairs, ()) if action == "remove" else ((), pairs)
    return _outcomes(name, client, removals, additions, errors)[0]


def _outcomes(name: str, client: OcsDeviceClient, removals: Sequence[SimplexPair], additions: Sequence[SimplexPair],
              errors: dict[str, list[BaseException]]) -> list[_Outcome]:
    """What a device confirmed of its removal and addition (each when not empty); on any error, as read back."""
    actions = [(action, pairs) for action, pairs in (("remove", removals), ("add", additions)) if pairs]
    if not errors["remove"] and not errors["add"]:
        return [(DeviceStep(name, action, tuple(pairs), tuple(pairs), "ok"), []) for action, pairs in actions]
    try:  # either command may have applied, whatever the other did: the device's table says what holds
        table: dict[int, int] | None = client.cross_connects()
    except OcsError as e:
        if any(map(outcome_unknown, errors["remove"] + errors["add"])) and isinstance(e, (OcsTimeout,
                                                                                            OcsConnectionError)):
            # no reply to the commands, and none to the read-back (within the caller's deadline, if it set one):
            # what the device did is unknown, and the commit is in doubt (see CommitInDoubt)
            first = errors["remove"][0] if errors["remove"] else errors["add"][0]
            return [(DeviceStep(name, action, tuple(pairs), (), "unknown", "; ".join(map(str, errors[action] or [first]))
                                + f"; read-back: {e}"), errors[action] or [first]) for action, pairs in actions]
        errors["remove" if errors["remove"] else "add"].append(e)
        table = None
    out: list[_Outcome] = []
    for action, pairs in actions:
        done = [] if table is None else [p for p in pairs if (table.get(p[0]) == p[1]) == (action == "add")]
        errs = errors[action]
        status = "ok" if len(done) == len(pairs) and not errs else "partial" if done else "failed"
        detail = "; ".join(map(str, errs)) or ("" if status == "ok" else "the other command of its round trip "
                                                f"failed; read back: {len(done)} of {len(pairs)} applied")
        out.append((DeviceStep(name, action, tuple(pairs), tuple(done), status, detail), errs))
    return out


def _pipelined_step(name: str, client: OcsDeviceClient, removals: Sequence[SimplexPair],
                    additions: Sequence[SimplexPair],
                    run: Callable[[], tuple[BulkResult, BulkResult]]) -> list[_Outcome]:
    """A device's removal and addition in one round trip (``run``); on any error both are read back from the device."""
    errors: dict[str, list[BaseException]] = {"remove": [], "add": []}
    try:
        removed, added = run()
        errors["remove"] += bulk_errors(removed, name, "remove")
        errors["add"] += bulk_errors(added, name, "add")
    except OcsError as e:  # charged to the command it names, or else to the removal (the addition if none)
        adding = e.command in ("ENT-PATCH", "edit-config", "Set")  # a step of one command is charged to its addition
        errors["add" if (adding and additions) or not removals else "remove"].append(e)
    return _outcomes(name, client, removals, additions, errors)


def _send_step(client: OcsDeviceClient, removals: Sequence[SimplexPair], additions: Sequence[SimplexPair]) -> object:
    """Write a device's removal and addition without waiting (a pending reply), or the error that kept them back."""
    try:
        return client.send_disconnect_then_connect([i for i, _ in removals], additions)  # type: ignore[attr-defined]
    except OcsError as e:  # nothing was sent; the step's collect reports it like any other refusal
        return e


def _collect_step(name: str, client: OcsDeviceClient, removals: Sequence[SimplexPair],
                  additions: Sequence[SimplexPair], sent: object) -> list[_Outcome]:
    """Read the replies of :func:`_send_step`; return what the device confirmed, as :func:`_pipelined_step`."""
    def run() -> tuple[BulkResult, BulkResult]:
        if isinstance(sent, OcsError):
            raise sent
        return client.collect(sent)  # type: ignore[attr-defined]
    return _pipelined_step(name, client, removals, additions, run)


def _step_pairs(diff: PlanDiff, ports: Mapping[str, int]) -> dict[str, tuple[_Pairs, _Pairs]]:
    """Each device's simplex removals and additions of ``diff`` (device -> its ``ports`` per side).

    The same tuples for the same diff object: a job's plans recur every RL iteration and so do
    their diffs (:func:`fabric.plan.diff_plans` keeps the last ones), so a recurring step is
    neither mapped to simplex pairs again nor encoded again for the journal (the store keeps the
    JSON of a tuple of pairs it has seen).
    """
    key = (id(diff), tuple(sorted(ports.items())))
    with _PAIRS_LOCK:
        got = _PAIRS.get(key)
    if got is not None and got[0] is diff:
        return got[1]
    out: dict[str, tuple[list[SimplexPair], list[SimplexPair]]] = {d: ([], []) for d in ports}
    for i, xcs in enumerate((diff.remove, diff.add)):
        for xc in xcs:
            out[xc.device][i].extend(duplex_to_cross_connects(xc.a_port, xc.b_port, ports[xc.device]))
    pairs = {d: (tuple(r), tuple(a)) for d, (r, a) in out.items()}
    with _PAIRS_LOCK:
        while len(_PAIRS) >= 64:
            _PAIRS.pop(next(iter(_PAIRS)))
        _PAIRS[key] = (diff, pairs)  # holding the diff keeps its id from being reused
    return pairs


def _device_job(name: str, client: OcsDeviceClient, removals: _Pairs,
                additions: _Pairs) -> Callable[[], list[_Outcome]] | SendCollect:
    """One device's part of a step (its bulk removal, then its bulk addition), as a fan-out job.

    A client with the split API (:meth:`fabric.ocs.driver.Tl1Driver.send_disconnect_then_connect`)
    gets both commands in one round trip, written before any device of the step is read back; a
    client that only pipelines (or applies a step as one transaction: ``apply_step`` of the NETCONF and
    gNMI adapters) gets them in one round trip on a thread; any other one after the other, stopping at
    the first error.
    """
    if hasattr(client, "send_disconnect_then_connect"):
        return SendCollect(partial(_send_step, client, removals, additions),
                           partial(_collect_step, name, client, removals, additions))
    if (removals or additions) and hasattr(client, "apply_step"):  # NETCONF, gNMI: one edit-config / SetRequest
        return partial(_pipelined_step, name, client, removals, additions,
                       partial(client.apply_step, list(removals), list(additions)))  # type: ignore[attr-defined]
    if removals and additions and hasattr(client, "disconnect_then_connect"):
        pipelined = partial(client.disconnect_then_connect,  # type: ignore[attr-defined]
                            [i for i, _ in removals], additions)
        return partial(_pipelined_step, name, client, removals, additions, pipelined)
    return partial(_one_after_the_other, name, client, removals, additions)


def _one_after_the_other(name: str, client: OcsDeviceClient, removals: Sequence[SimplexPair],
                         additions: Sequence[SimplexPair]) -> list[_Outcome]:
    """A device's removal, then its addition, each its own command; an error stops the step."""
    out: list[_Outcome] = []
    for action, pairs in (("remove", removals), ("add", additions)):
        if pairs:
            out.append(_bulk_step(name, client, action, pairs))
            if out[-1][1]:
                break
    return out


def _apply_diff(store: FabricStore, scope: str, cid: int, diff: PlanDiff,
                devices: Mapping[str, OcsDeviceClient]) -> list[DeviceStep]:
    """Drive every device of ``diff`` at once; return their confirmations, or roll back and raise."""
    touched = diff.devices()
    pairs = _step_pairs(diff, {d: devices[d].ports for d in touched})
    outcomes = each_device({d: _device_job(d, devices[d], *pairs[d]) for d in touched})
    steps = [step for d in touched for step, _ in outcomes[d]]
    failed = [(d, step, errors) for d in touched for step, errors in outcomes[d] if errors]
    if not failed:
        return steps
    unknown = sorted({d for d, step, _ in failed if step.status == "unknown"})
    if unknown:  # journal what is known; leave the commit in flight for the next read-back to settle
        store.record_steps(cid, sorted(steps, key=lambda st: st.status != "ok"))
        d0, _, errs = next(f for f in failed if f[0] == unknown[0])
        raise CommitInDoubt(cid, scope, touched, f"{d0}: {errs[0]}")
    # what the devices did, refusals last, journalled before the rollback changes it again
    store.record_steps(cid, sorted(steps, key=lambda st: st.status != "ok"))
    name, step, errors = failed[0]
    rollback = reconcile_store(store, {d: devices[d] for d in touched}, scope, "failed",
                               f"{name} {step.action}: {errors[0]}", keep_other_scopes=True)
    refused: set[tuple[str, int, str]] = set()
    for d, _, errs in failed:
        with suppress(OcsError):  # the device does not answer: the rollback report already says so
            refused |= {(d, p, s) for p, s in unusable_ports(devices[d], errs).items()}
    failed_ports = sorted(set(rollback.failed_ports) | refused)
    if failed_ports:
        store.mask_ports(failed_ports)
    raise CommitError(cid, f"device {name} refused {step.action}: {errors[0]}", failed_ports, rollback)


def apply_plan_steps(store: FabricStore, plans: Sequence[CircuitPlan], devices: Mapping[str, OcsDeviceClient], *,
                     scope: str | None = None) -> tuple[CommitReport, ...]:
    """Apply ``plans`` one after another, each a journalled commit: S + 1 journal writes, one fsync'd, for S plans.

    Parameters
    ----------
    store : FabricStore
        The journal; each diff is taken against the previous plan, the first against the store's
        last committed plan of ``scope`` (what the devices hold).
    plans : sequence of CircuitPlan
        The states to reach, in order (e.g. the intermediate states of a non-blocking order).
    devices : mapping of str to OcsDeviceClient
        A client per device a diff touches.
    scope : str, optional
        Journal scope (default: the last plan's fabric name).

    Returns
    -------
    tuple of CommitReport
        One per plan, in order.

    Raises
    ------
    CommitInFlightError
        An earlier commit of the scope was interrupted: call :func:`fabric.runtime.reconcile.reconcile` first.
    CommitError
        A device refused: the step's devices were reconciled back to every scope's last committed
        plan (earlier steps stay committed), the step is marked failed, ``failed_ports`` lists ports
        to re-plan around.
    KeyError
        A changed device has no client (nothing was sent or journalled).

    Notes
    -----
    Per step: one bulk command per device and action, all devices at once; O(C) work for C
    cross-connects changed.
    """
    if not plans:
        raise ValueError("apply_plan_steps: plans is empty; give at least the plan to reach")
    scope = plans[-1].fabric if scope is None else scope
    head = store.head(scope)  # one read: what the devices hold, and whether a commit was cut short
    if head.in_flight:
        raise CommitInFlightError(f"scope {scope!r}: commit {head.in_flight[0].id} was interrupted and devices may "
                                  "be half-changed; run reconcile(store, devices) before committing again")
    base = head.committed
    before = [base.plan if base else None, *plans[:-1]]
    diffs = [diff_plans(old, new) for old, new in zip(before, plans)]
    missing = sorted({d for diff in diffs for d in diff.devices() if d not in devices})
    if missing:
        raise KeyError(f"plan for scope {scope!r} changes devices without a client: {', '.join(missing)}; "
                       "add them to the device configuration")
    base_id = base.id if base else None
    cid = store.begin_commit(scope, plans[0], base_id=base_id)
    reports = []
    for i, diff in enumerate(diffs):
        steps = _apply_diff(store, scope, cid, diff, devices)
        reports.append(CommitReport(cid, base_id, len(diff.remove), len(diff.add), tuple(diff.devices())))
        if i + 1 < len(plans):
            base_id, cid = cid, store.advance_commit(cid, steps, plans[i + 1])
        else:
            store.finish_commit(cid, "committed", steps=steps)
    return tuple(reports)


def apply_plan_diff(store: FabricStore, plan: CircuitPlan, devices: Mapping[str, OcsDeviceClient], *,
                    scope: str | None = None) -> CommitReport:
    """Apply ``plan`` to the devices as one journalled commit; return what changed.

    Journal the intent, then on every device the diff touches (all at once) one bulk removal
    followed by one bulk addition, then journal what each device confirmed together with the
    outcome. The diff is taken against the store's last committed plan of ``scope`` (default: the
    plan's fabric name), which is what the devices hold. Raises as :func:`apply_plan_steps`.
    """
    return apply_plan_steps(store, [plan], devices, scope=scope)[0]


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
