"""The training job as RFabric's controller sees it: intents per period, and collective boundaries in time.

Design note
-----------
A training step has two communication periods (OrchestrRL §5.2, Figure 8(a-b)): *fwd-bwd*, whose
inter-server traffic is the per-layer EP all-to-all, the CP ring and the PP transfers (stage
``train``), and *grad-sync*, the DP reduce-scatter and all-gather (stage ``train-dp``). Each
period is announced as an :class:`fabric.intent.Intent` whose collectives carry the period's total
bytes per rank, so Algorithm 2 splits ports by the period's real demand.

Entering a period (:func:`enter_period`) goes through :class:`sim.network.RFabricDriver`: the real
controller materialises the plan and the job's :class:`fabric.safe_window.SafeWindowGate` decides.

* The gate commits: the period's traffic waits for the circuits (the change's ``end_s``).
* The gate defers (the predicted slack is shorter than the switching): the runtime either keeps
  the plan in force for this period (§5.3, "retains the current plan") or holds the period's
  traffic while the devices switch, whichever finishes the period first (the circuits in force may
  not carry it at all: another stage's plan, or a template without the needed PoD pairs).
* With ``per_period`` (Appendix I's sensitivity study: "fine-grained reconfiguration in each
  stage") the runtime always switches at the boundary.

A held period starts when the devices are done: that wait is reconfiguration on the critical path.

The gate learns slack from boundaries: :func:`busy_intervals` turns a 1F1B timeline into the
intervals in which any inter-server collective of the job is in flight (the union over stages and
communicators), and :func:`feed_events` reports their starts and ends in time order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from orchestrl.fabric.intent import Intent
from orchestrl.fabric.reconfig_order import order_plan_change
from orchestrl.fabric.safe_window import CollectiveEvent
from orchestrl.sim.network.reconfig import GATE_FAMILY, DriverDecision, RFabricDriver
from orchestrl.sim.network.state import NetState
from orchestrl.sim.train.schedule import PipelineRun

__all__ = ["PeriodEntry", "enter_period", "busy_intervals", "feed_events", "merge_intervals"]


@dataclass(frozen=True)
class PeriodEntry:
    """How a period began: when its traffic may start, and what the fabric did at the boundary."""

    ready_s: float  # when the period's traffic may start
    action: str  # "commit" | "kept" | "forced" | "unchanged" | "installed" | "refused"
    reason: str
    switching_s: float  # device time of the change (0 when none)
    reconfigured: bool


def enter_period(driver: RFabricDriver, intent: Intent, t_s: float, *, per_period: bool,
                 cost: Callable[[NetState | None], float]) -> PeriodEntry:
    """Announce ``intent`` at ``t_s`` and return when the period may start (see the module note).

    Parameters
    ----------
    per_period : bool
        Reconfigure at this boundary even when the gate defers (Appendix I's fine-grained
        assumption); the switching then lands on the critical path.
    cost : callable
        The period's duration on the circuits in force (``cost(None)``) or on a given fabric state;
        when the gate defers, the runtime holds the traffic and switches only if switching plus the
        period on the new circuits is shorter than the period on the old ones.

    Notes
    -----
    One materialisation (cached template, then allocation and placement), one gate decision and
    at most two cost evaluations.
    """
    job, stage = intent.job, intent.stage
    pods = driver.pods_of(intent)
    if driver.in_force(pods) is None:  # the job is being placed: nothing runs yet, so the plan goes in at once
        result = driver.materialize(intent)
        if not result.accepted:
            return PeriodEntry(t_s, "refused", "; ".join(result.violations[:2]), 0.0, False)
        driver.install(result, at_s=t_s, pods=pods)
        return PeriodEntry(t_s, "installed", "first plan of the job, installed before any traffic", 0.0, True)
    try:
        d: DriverDecision = driver.announce(intent, now_s=t_s)
    except ValueError as exc:  # fabric.reconfig_order found no make-before-break order between the plans
        result = driver.materialize(intent)
        delay = _teardown_delay_s(driver)
        driver.install(result, at_s=t_s + delay, pods=pods)
        return PeriodEntry(t_s + delay, "forced", f"no non-blocking order ({str(exc)[:160]}); switched by tearing "
                           "down and re-adding in one step", delay, True)
    if d.action == "commit":
        return PeriodEntry(max(t_s, d.change.end_s), "commit", d.reason, d.change.switching_s, True)
    if d.action in ("unchanged", "refused"):
        return PeriodEntry(t_s, d.action, d.reason, 0.0, False)
    # the gate deferred (or gave up): the runtime keeps the current plan for this period, or holds
    # the traffic and switches now; either way the gate's pending copy must not commit later
    driver.gate(job, stage).withdraw(job)
    result = d.result
    try:
        delay = driver.switching_time_s(order_plan_change(driver.in_force(pods), result.plan))
    except ValueError:
        delay = _teardown_delay_s(driver)
    if not per_period:
        keep = cost(None)
        switch = delay + cost(driver.fabric.with_circuits(result.plan.circuits, driver.failures))
        if keep <= switch:
            return PeriodEntry(t_s, "kept", f"{d.reason}; current circuits: {keep:.4g} s <= switch + new: "
                               f"{switch:.4g} s", 0.0, False)
    driver.install(result, at_s=t_s + delay, pods=pods)
    why = "reconfigured every period (Appendix I)" if per_period else "switching beats the circuits in force"
    return PeriodEntry(t_s + delay, "forced", f"{why}; gate said: {d.reason}", delay, True)


def _teardown_delay_s(driver: RFabricDriver) -> float:
    """One switching of the slowest OCS device: what a change costs when it is applied all at once."""
    if driver.switch_delay_s is not None:
        return driver.switch_delay_s
    return max(dev.technology.switch_delay_s for dev in driver.fabric.topology.devices.values())


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the union of intervals ``[starts[i], ends[i]]`` as sorted disjoint intervals.

    Notes
    -----
    O(n log n) (one sort).

    Examples
    --------
    >>> merge_intervals(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    (array([0., 5.]), array([3., 6.]))
    """
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    out_e = np.zeros(group[-1] + 1)
    np.maximum.at(out_e, group, e)
    return s[new], out_e


def busy_intervals(run: PipelineRun, layers_per_stage: int, slot_offsets: Sequence[tuple[float, float]],
                   p2p_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Return when any inter-server collective of the job is in flight during a 1F1B run.

    Parameters
    ----------
    run : PipelineRun
    layers_per_stage : int
        Layer slots each forward / backward operation is cut into.
    slot_offsets : sequence of (start, length)
        Inter-server collectives of one layer, as fractions of its slot (start) and seconds
        (length); backward slots are mirrored.
    p2p_s : float
        Stage-boundary transfer after each operation (0: none crosses servers).

    Notes
    -----
    O(S M L k log(S M L k)) for S stages, M micro-batches, L layers and k collectives per layer.
    """
    starts, ends = [], []
    for op_start, op_end in ((run.fwd_start, run.fwd_end), (run.bwd_start, run.bwd_end)):
        st, en = op_start.ravel(), op_end.ravel()
        if slot_offsets and layers_per_stage > 0:
            slot = (en - st) / layers_per_stage
            base = st[:, None] + slot[:, None] * np.arange(layers_per_stage)[None, :]
            for frac, length in slot_offsets:
                s0 = (base + frac * slot[:, None]).ravel()
                starts.append(s0)
                ends.append(s0 + length)
        if p2p_s > 0:
            starts.append(en)
            ends.append(en + p2p_s)
    if not starts:
        return np.zeros(0), np.zeros(0)
    # nothing outlives the pipeline flush: the last stage-0 backward sends nothing, and a layer's
    # collectives sit inside its slot
    end = run.makespan_s
    s, e = np.concatenate(starts), np.minimum(np.concatenate(ends), end)
    keep = s < end
    return merge_intervals(s[keep], e[keep])


def feed_events(driver: RFabricDriver, job: str, stage: str, primitive: str, starts: np.ndarray,
                ends: np.ndarray, offset_s: float = 0.0) -> list[DriverDecision]:
    """Report busy intervals to the job's gate as start/end events; return decisions they triggered.

    Notes
    -----
    O(n) gate observations (each O(1) plus retries of a pending plan).
    """
    out: list[DriverDecision] = []
    comm = f"{job}/{GATE_FAMILY[stage]}"
    for s, e in zip((starts + offset_s).tolist(), (ends + offset_s).tolist()):
        out += driver.observe(job, CollectiveEvent("start", s, stage, primitive, comm))
        out += driver.observe(job, CollectiveEvent("end", e, stage, primitive, comm))
    return out
