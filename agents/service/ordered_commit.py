"""Commit a plan change in the non-blocking order of §5.4, each step a journalled commit.

Design note
-----------
:func:`fabric.reconfig_order.order_plan_change` splits a change into alternating bulk *add* and
*remove* steps such that a switch pair both plans connect keeps a circuit throughout
(make-before-break). Each step's outcome is itself a valid circuit set, so the steps are applied
as a chain of journalled commits to intermediate plans (:func:`fabric.runtime.commit.apply_plan_steps`):
the journal holds the desired state before each step and what the devices confirmed after it
(closing one step and opening the next is one journal write), a crash between steps leaves the
devices at a journalled state that still connects every protected pair, and reconciliation after
a restart restores exactly that state. A device refusal rolls back only the step it happened in
(:class:`fabric.runtime.commit.CommitError`), leaving the previous step committed.

A *remove* step followed by an *add* step is one commit, not two. A commit already drives each
device with its bulk removal before its bulk addition, and ports belong to one device, so every add
still finds its ports freed; and every state the devices pass through on the way holds the circuits
of the state after the remove step (made only larger by some adds), which the order has already
checked to keep every protected pair up. An *add* followed by a *remove* is never merged: that
removal is only safe once the add is confirmed (make-before-break). So a change of S order steps
costs at most S commits, and e.g. ``remove, add`` one.

Within a step every device moves at once (:mod:`fabric.ocs.fanout`), so the devices switch for
the sum over add steps of the slowest device of that step (:func:`switching_time_s`); that is the
time a safe window must cover.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from orchestrl.fabric.runtime.commit import apply_plan_steps
from orchestrl.fabric.plan import CircuitPlan, circuits_from, diff_plans
from orchestrl.fabric.reconfig_order import ReconfigOrder, order_plan_change
from orchestrl.fabric.runtime.store import FabricStore

__all__ = ["OrderedCommit", "PlannedChange", "plan_order", "plan_change", "switching_time_s", "apply_in_order"]


@dataclass(frozen=True)
class OrderedCommit:
    """What an ordered change did."""

    commit_ids: tuple[int, ...]  # one journal record per step
    removed: int  # full-duplex circuits torn down
    added: int  # full-duplex circuits made
    devices: tuple[str, ...]  # devices touched
    steps: int  # journalled commits the change took (a remove step and the add step after it share one)
    outages: tuple[str, ...]  # pairs that had to go dark briefly, in words (empty: none)

    @property
    def commit_id(self) -> int | None:
        """The record of the last step (the target plan)."""
        return self.commit_ids[-1] if self.commit_ids else None


@dataclass(frozen=True)
class PlannedChange:
    """How ``old -> new`` will be applied: its non-blocking order and the plan held after each commit.

    Pure in the two plans, so a service that sees the same pair of plans every RL iteration
    computes it once (:class:`agents.service.memo.OrderMemo`).
    """

    old: CircuitPlan | None  # what the devices hold before (None: nothing)
    new: CircuitPlan
    order: ReconfigOrder | None  # None: one remove-then-add step (nothing to protect, or see plan_order)
    targets: tuple[CircuitPlan, ...]  # the journalled state after each commit; the last one is ``new``
    # switching time per delay table (its sorted items), asked again every time the change recurs; not an
    # argument, so replace() starts a changed copy with an empty one
    _switching: dict[tuple[tuple[str, float], ...], float] = field(default_factory=dict, init=False, compare=False,
                                                                   repr=False)

    @property
    def steps(self) -> int:
        """Commits the change takes: the order's steps, a remove step and the add step after it counted once."""
        return len(self.targets)

    def switching_time_s(self, delay_s: Mapping[str, float]) -> float:
        """Return how long the devices switch during the change (see :func:`switching_time_s`)."""
        key = tuple(sorted(delay_s.items()))
        got = self._switching.get(key)
        if got is None:
            got = self._switching[key] = switching_time_s(self.order, self.new, self.old, delay_s)
        return got


def plan_order(old: CircuitPlan | None, new: CircuitPlan) -> ReconfigOrder | None:
    """Return the non-blocking order of ``old -> new``, or None to apply it as one step.

    None when a cross-connect kept by the diff serves other endpoints in the two plans (the
    order cannot protect pairs it cannot name); the change is then one remove-then-add step.
    """
    try:
        return order_plan_change(old, new)
    except ValueError:
        return None


def plan_change(old: CircuitPlan | None, new: CircuitPlan, order: ReconfigOrder | None = None) -> PlannedChange:
    """Return how ``old -> new`` will be applied: ``order`` (computed when None) and the plan after each commit.

    A remove step and the add step right after it make one commit (see the module's design note),
    so there is no journalled state between them.

    Notes
    -----
    The order is O((R + A)^2) worst case for R removed and A added circuits, typically two or
    three rounds; the intermediate plans are O(S * C) for S steps of C circuits.
    """
    order = plan_order(old, new) if order is None else order
    steps = order.steps if order is not None else ()
    if len(steps) <= 1:  # nothing to protect: one commit does it (also a change of metadata only)
        return PlannedChange(old, new, order, (new,))
    by_xc = {c.xc: c for c in (old.circuits if old else ())}
    by_xc.update((c.xc, c) for c in new.circuits)
    current = set(old.cross_connects()) if old else set()
    targets = []
    for i, step in enumerate(steps, 1):
        xcs = {c.xc for c in step.circuits}
        current = current | xcs if step.action == "add" else current - xcs
        if step.action == "remove" and i < len(steps) and steps[i].action == "add":
            continue  # applied with the next step: each device removes before it adds
        targets.append(new if i == len(steps) else replace(
            new, circuits=circuits_from(by_xc[x] for x in current),
            notes=new.notes + (f"intermediate state after step {i} of {len(steps)} (non-blocking order)",)))
    return PlannedChange(old, new, order, tuple(targets))


def switching_time_s(order: ReconfigOrder | None, new: CircuitPlan, old: CircuitPlan | None,
                     delay_s: Mapping[str, float]) -> float:
    """Return how long the devices switch during the change ``old -> new``.

    The devices of one step switch in parallel, so an add step lasts as long as its slowest
    device; removals free ports without steering a mirror to a target and cost no switching
    delay. The total is the sum over add steps of the largest delay among the step's devices
    (one add phase when ``order`` is None).

    Examples
    --------
    >>> from orchestrl.fabric.plan import Circuit, CrossConnect
    >>> new = CircuitPlan("f", "train", "s", 1e9, (Circuit("agg", 0, "x", "y", CrossConnect("a", 1, 2)),
    ...                                             Circuit("agg", 1, "u", "v", CrossConnect("b", 1, 2))))
    >>> switching_time_s(None, new, None, {"a": 0.010, "b": 0.025})  # a and b switch together
    0.025
    """
    if order is None:
        return max((delay_s.get(d, 0.0) for d in {x.device for x in diff_plans(old, new).add}), default=0.0)
    return sum(max((delay_s.get(d, 0.0) for d in {c.device for c in s.circuits}), default=0.0)
               for s in order.steps if s.action == "add")


def apply_in_order(store: FabricStore, old: CircuitPlan | None, new: CircuitPlan, devices: Mapping[str, object], *,
                   scope: str, order: ReconfigOrder | None = None, change: PlannedChange | None = None
                   ) -> OrderedCommit:
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
    change : PlannedChange, optional
        A precomputed :func:`plan_change` of ``old -> new`` (wins over ``order``).

    Raises
    ------
    fabric.runtime.commit.CommitError, fabric.runtime.commit.CommitInFlightError
        As :func:`~fabric.runtime.commit.apply_plan_steps`, for the step that failed; earlier steps stay
        committed (the journal's last committed plan says which).

    Notes
    -----
    S steps cost S + 1 journal writes (one of them fsync'd, the last) and S device round trips
    (a merged remove-and-add step sends both commands at once), the devices of a step all at once;
    the order itself is O((R + A)^2) worst case for R removed and A added circuits, typically two
    or three rounds.
    """
    if change is None or change.old is not old or change.new is not new:
        change = plan_change(old, new, order)
    reports = apply_plan_steps(store, change.targets, devices, scope=scope)
    touched = sorted({d for r in reports for d in r.devices})
    outages = tuple(o.reason for o in change.order.outages) if change.order is not None else ()
    return OrderedCommit(tuple(r.commit_id for r in reports), sum(r.removed for r in reports),
                         sum(r.added for r in reports), tuple(touched), change.steps, outages)
