"""Phase-aware planning horizon: run a layout through the early phase, then hand the tail to another.

Design note
-----------
Eq. 1 scores a layout by the expected time to finish *every* remaining request on it. Algorithm 1
re-plans every interval, though, so a throughput layout (many small-TP instances) only has to carry
the early, high-concurrency phase: once the batch has shrunk, a later plan moves the long tail to
large TP (OrchestrRL §2.1, Figure 11). Scoring a candidate over the whole horizon charges it for a
tail it will never run, and makes the planner commit to the tail layout at t = 0.

This module prices the best continuation of a homogeneous layout ``Y`` (``m`` instances): for
every tail configuration ``Y'`` (``m'`` instances) and switch point ``g`` on the token grid,

    T(Y, Y', g) = sum_{t < g} step_Y(t) + C^sw(Y -> Y') + C^mig_Y'(g) + sum_{t >= g} step_Y'(t)

where ``step_Y(t)`` is the expected per-interval time of one instance holding ``1/m`` of every
class (:func:`compute_sched.estimate.step_profile_s`) and ``C^mig_Y'(g)`` moves the requests still
expected at ``g`` (every request moves, since the instances change). Two rules keep the forecast
honest. The hand-over comes no sooner than ``min_head_s`` (the scheduler cannot re-plan sooner; a
"switch now" is a different candidate, scored on its own). And it only goes to configurations with
more GPUs per instance: within a step the batch only shrinks, so the phases run from throughput
modes to latency modes (§4.1), never back. Never switching is always an option, so the
continuation is never worse than the one-phase estimate. The switch point is a forecast, not a
commitment: the scheduler re-plans from the real state later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.estimate import ClassTable, lone_profile_s, step_profile_s
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import PerfModel

__all__ = ["Continuation", "best_continuation"]


@dataclass(frozen=True)
class Continuation:
    """The best forecast of running ``head`` now and ``tail`` after ``switch_tokens`` more tokens."""

    head: InstanceConfig
    tail: InstanceConfig  # equals ``head`` when staying is best
    switch_tokens: float  # tokens from now at which the tail layout takes over (inf: never)
    one_phase_s: float  # expected time with ``head`` to the end (Eq. 1 as scored before)
    expected_s: float  # expected time of the continuation, switching and migration included

    @property
    def credit_s(self) -> float:
        """Seconds the later re-plan is expected to save over finishing on ``head``."""
        return self.one_phase_s - self.expected_s


def _instances(total_gpus: int, cfg: InstanceConfig) -> int:
    return total_gpus // cfg.gpus


def best_continuation(perf: PerfModel, costs: CostModel, table: ClassTable, head: InstanceConfig,
                      tails: Sequence[InstanceConfig], total_gpus: int, *, tail_mass: float = 0.25,
                      min_head_s: float = 0.0) -> Continuation:
    """Return the best ``head``-then-``tail`` forecast over ``tails`` and every switch point.

    Parameters
    ----------
    head : InstanceConfig
        Configuration of the homogeneous layout that runs now (``total_gpus // head.gpus`` instances).
    tails : sequence of InstanceConfig
        Configurations the tail may move to (homogeneous over the same GPUs); those with no more
        GPUs per instance than ``head`` are skipped.
    min_head_s : float
        Earliest hand-over, in expected seconds of running ``head`` from now.

    Notes
    -----
    O(|tails| * T * (J + B)) for T grid points, J classes and B requests per tail instance (the
    migration price of each switch point).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.estimate import build_classes
    >>> from orchestrl.compute_sched.workload import LengthHistogram, RequestState, StepWorkload
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> lengths = [2000] * 480 + [12000] * 32
    >>> w = StepWorkload(LengthHistogram.from_lengths(lengths, 15360))
    >>> t = build_classes([RequestState(f"r{i}", 400, 0, 15360) for i in range(512)], w)
    >>> tp2, tp8 = InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8)
    >>> c = best_continuation(pm, CostModel(pm), t, tp2, [tp2, tp8], 8)
    >>> c.tail.name, 0 < c.switch_tokens < 12000, c.expected_s < c.one_phase_s
    ('tp8', True, True)
    """
    m = _instances(total_gpus, head)
    head_prof = step_profile_s(perf, head, table, table.counts / m, tail_mass=tail_mass)
    # the even share spreads a lone straggler thin; whichever instance holds it runs at least its lone time
    lone_head = lone_profile_s(perf, head, table, tail_mass=tail_mass)
    lone_prefix = np.concatenate((np.zeros((len(lone_head), 1)), np.cumsum(lone_head, axis=1)), axis=1)
    one_phase = max(float(head_prof.sum()), float(lone_prefix[:, -1].max()))
    best = Continuation(head, head, float("inf"), one_phase, one_phase)
    prefix = np.concatenate(([0.0], np.cumsum(head_prof)))  # prefix[g]: time to reach grid point g
    ctx_at = table.survival * (table.contexts[:, None] + table.grid_tokens[None, :])
    for tail in tails:
        n = _instances(total_gpus, tail)
        if tail.gpus <= head.gpus or n < 1:
            continue
        per_inst = table.counts / n
        tail_prof = step_profile_s(perf, tail, table, per_inst, tail_mass=tail_mass)
        suffix = np.concatenate((np.cumsum(tail_prof[::-1])[::-1], [0.0]))  # suffix[g]: time from g on
        lone = lone_profile_s(perf, tail, table, tail_mass=tail_mass)
        lone_suffix = np.concatenate((np.cumsum(lone[:, ::-1], axis=1)[:, ::-1], np.zeros((len(lone), 1))), axis=1)
        # a straggler alone: its head part up to g, then its tail part from g (the slowest such request)
        straggler = (lone_prefix + lone_suffix).max(axis=0)
        switch_s = costs.switch(head, tail).seconds
        batch = per_inst @ table.survival
        ctx = per_inst @ ctx_at
        first = int(np.searchsorted(prefix, min_head_s))  # first grid point at least min_head_s away
        for g in range(first, len(table.grid_tokens)):
            if batch[g] < min(tail_mass, per_inst.sum()):
                break  # nothing left to hand over
            lower = max(prefix[g] + suffix[g], straggler[g]) + switch_s
            if lower >= best.expected_s:
                continue
            movers = max(1, int(round(batch[g])))
            mig_s = costs.migration(tail, [int(ctx[g] / batch[g])] * movers).seconds
            total = lower + mig_s
            if total < best.expected_s:
                best = Continuation(head, tail, float(table.grid_tokens[g]), one_phase, float(total))
    return best
