"""Commit a plan change in the non-blocking order of §5.4, each step a journalled commit.

Design note
-----------
:func:`fabric.reconfig_order.order_plan_change` splits a change into alternating bulk *add* and
*remove* steps such that a switch pair both plans connect keeps a circuit throughout
(make-before-break). Each step's outcome is itself a valid circuit set, so every step is applied
as one :func:`fabric.reconcile.apply_plan_diff` to an intermediate plan: the journal holds the
desired state before each step and what the devices confirmed after it, a crash between steps
leaves the devices at a journalled state that still connects every protected pair, and
reconciliation after a restart restores exactly that state. A device refusal rolls back only the
step it happened in (:class:`fabric.reconcile.CommitError`), leaving the previous step committed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from fabric.plan import CircuitPlan, circuits_from, diff_plans
from fabric.reconcile import apply_plan_diff
from fabric.reconfig_order import ReconfigOrder, ReconfigStep, order_plan_change
from fabric.store import FabricStore

__all__ = ["OrderedCommit", "plan_order", "switching_time_s", "apply_in_order"]


@dataclass(frozen=True)
class OrderedCommit:
    """What an ordered change did."""

    commit_ids: tuple[int, ...]  # one journal record per step
    removed: int  # full-duplex circuits torn down
    added: int  # full-duplex circuits made
    devices: tuple[str, ...]  # devices touched
    steps: int  # bulk steps (add or remove) the change took
    outages: tuple[str, ...]  # pairs that had to go dark briefly, in words (empty: none)

    @property
    def commit_id(self) -> int | None:
        """The record of the last step (the target plan)."""
        return self.commit_ids[-1] if self.commit_ids else None


def plan_order(old: CircuitPlan | None, new: CircuitPlan) -> ReconfigOrder | None:
    """Return the non-blocking order of ``old -> new``, or None to apply it as one step.

    None when a cross-connect kept by the diff serves other endpoints in the two plans (the
    order cannot protect pairs it cannot name); the change is then one remove-then-add step.
    """
    try:
        return order_plan_change(old, new)
    except ValueError:
        return None


def switching_time_s(order: ReconfigOrder | None, new: CircuitPlan, old: CircuitPlan | None,
                     delay_s: Mapping[str, float]) -> float:
    """Return how long the devices switch during the change: each add step waits for each device it
    touches, one device after another (removals free ports without moving a mirror to a target)."""
    if order is None:
        return sum(delay_s.get(d, 0.0) for d in {x.device for x in diff_plans(old, new).add})
    return sum(delay_s.get(d, 0.0) for s in order.steps if s.action == "add" for d in s.by_device())


def _intermediate(step_no: int, steps: int, new: CircuitPlan, circuits: list) -> CircuitPlan:
    return replace(new, circuits=circuits_from(circuits),
                   notes=new.notes + (f"intermediate state after step {step_no} of {steps} (non-blocking order)",))


def apply_in_order(store: FabricStore, old: CircuitPlan | None, new: CircuitPlan, devices: Mapping[str, object], *,
                   scope: str, order: ReconfigOrder | None = None) -> OrderedCommit:
    """Apply ``old -> new`` step by step, each step one journalled commit; return what changed.

    Parameters
    ----------
    store : FabricStore
        The journal; its last committed plan of ``scope`` must be ``old``.
    old, new : CircuitPlan
        The plan the devices hold (None: nothing) and the one to reach.
    devices : mapping of str to OcsDeviceClient
        A client per device the change touches.
    scope : str
        Journal scope of the plans.
    order : ReconfigOrder, optional
        A precomputed :func:`plan_order` (computed when omitted).

    Raises
    ------
    fabric.reconcile.CommitError, fabric.reconcile.CommitInFlightError
        As :func:`~fabric.reconcile.apply_plan_diff`, for the step that failed; earlier steps stay
        committed (the journal's last committed plan says which).

    Notes
    -----
    S steps cost S journalled commits and S bulk commands per device they touch; the order itself
    is O((R + A)^2) worst case for R removed and A added circuits, typically two or three rounds.
    """
    order = plan_order(old, new) if order is None else order
    steps: tuple[ReconfigStep, ...] = order.steps if order is not None else ()
    by_xc = {c.xc: c for c in (old.circuits if old else ())}
    by_xc.update((c.xc, c) for c in new.circuits)
    current = set(old.cross_connects()) if old else set()
    ids: list[int] = []
    if len(steps) <= 1:  # nothing to protect: one commit does it (also a change of metadata only)
        reports = [apply_plan_diff(store, new, devices, scope=scope)]
    else:
        reports = []
        for i, step in enumerate(steps, 1):
            xcs = {c.xc for c in step.circuits}
            current = current | xcs if step.action == "add" else current - xcs
            target = new if i == len(steps) else _intermediate(i, len(steps), new, [by_xc[x] for x in current])
            reports.append(apply_plan_diff(store, target, devices, scope=scope))
    ids = [r.commit_id for r in reports]
    touched = sorted({d for r in reports for d in r.devices})
    outages = tuple(o.reason for o in order.outages) if order is not None else ()
    return OrderedCommit(tuple(ids), sum(r.removed for r in reports), sum(r.added for r in reports), tuple(touched),
                         max(len(steps), 1), outages)
