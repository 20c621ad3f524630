"""EstMakespan of Algorithm 1: the expected remaining time of an instance from histogram bins.

Design note
-----------
Pending requests are grouped into *classes* by progress (256-token bins of tokens generated so
far, §4.1). A request of class ``j`` ends in one of the histogram bins above its progress, so the
probability it is still decoding ``t`` tokens from now is a survival function ``S_j(t)``. An
instance holding ``x_j`` requests of each class then decodes, ``t`` tokens from now, an expected
batch ``B(t) = sum_j x_j S_j(t)`` whose context is ``C(t) = sum_j x_j S_j(t) (c_j + t)``; its
remaining time is the sum over a token grid of ``step(B, C)`` for as long as at least
``tail_mass`` requests are expected to remain (the last request decides the makespan). When the
context exceeds the KV capacity, or the batch the engine's ``max_num_seqs``, the requests queue,
which stretches time by ``C / capacity`` or ``B / max_num_seqs``, whichever is larger.
Everything is linear in ``x`` except the tail cut-off and the step time, which the planner
linearises (:mod:`compute_sched.planner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from orchestrl.compute_sched.engine import memo_map
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.workload import BIN_TOKENS, RequestState, StepWorkload

_KNOT_TOKENS = 256.0  # spacing of the cached batch-1 step-time curve

__all__ = ["RequestClass", "ClassTable", "build_classes", "instance_time_s", "instance_times_s", "step_profile_s",
           "lone_profile_s", "lone_times_s"]


@dataclass(frozen=True)
class RequestClass:
    """Pending requests with progress in one 256-token bin."""

    progress_bin: int
    request_ids: tuple[str, ...]
    mean_context_tokens: float
    mean_progress_tokens: float


@dataclass(frozen=True)
class ClassTable:
    """Classes with their survival curves on a shared token grid (``survival[j, t]``)."""

    classes: tuple[RequestClass, ...]
    grid_tokens: np.ndarray  # token offsets t of the grid points
    step_tokens: int  # tokens between grid points
    survival: np.ndarray  # classes x grid

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(c.request_ids) for c in self.classes], dtype=float)

    @property
    def contexts(self) -> np.ndarray:
        return np.array([c.mean_context_tokens for c in self.classes])

    def class_of(self) -> Mapping[str, int]:
        """Map each request id to its class (read-only; built once per table, which the planner asks ~50x)."""
        return memo_map(self, "_class_of", lambda: {rid: j for j, c in enumerate(self.classes) for rid in c.request_ids})


def build_classes(pending: Sequence[RequestState], workload: StepWorkload | None, *, bin_tokens: int = BIN_TOKENS,
                  exact_remaining: dict[str, int] | None = None) -> ClassTable:
    """Group ``pending`` by progress bin and compute each class's survival on a token grid.

    ``exact_remaining`` (a clairvoyant schedule) replaces the histogram by every request's true
    remaining length; classes then group by remaining-length bin instead of progress.

    Notes
    -----
    O(R + J * (H + T)) for R requests, J classes, H histogram bins and T grid points.
    """
    groups: dict[int, list[RequestState]] = {}
    for r in pending:
        key = (exact_remaining[r.request_id] if exact_remaining is not None else r.generated_tokens) // bin_tokens
        groups.setdefault(int(key), []).append(r)
    keys = sorted(groups)
    classes = tuple(RequestClass(k, tuple(r.request_id for r in groups[k]),
                                 float(np.mean([r.context_tokens for r in groups[k]])),
                                 float(np.mean([r.generated_tokens for r in groups[k]]))) for k in keys)
    max_rem = 1
    dists = []
    for j, c in enumerate(classes):
        if exact_remaining is not None:
            rem = np.array([max(1, exact_remaining[rid]) for rid in c.request_ids], dtype=float)
            probs = np.full(len(rem), 1.0 / len(rem))
        elif workload is not None:
            probs, rem = workload.conditional(int(c.mean_progress_tokens))
        else:
            cap = max(r.max_tokens for r in groups[keys[j]])
            probs, rem = np.array([1.0]), np.array([max(1, cap - int(c.mean_progress_tokens))])
        dists.append((probs, rem.astype(float)))
        max_rem = max(max_rem, int(rem.max()))
    grid = np.arange(0, max_rem + bin_tokens, bin_tokens, dtype=float)
    surv = np.zeros((len(classes), len(grid)))
    for j, (probs, rem) in enumerate(dists):
        surv[j] = (probs[None, :] * (rem[None, :] > grid[:, None])).sum(axis=1)
    return ClassTable(classes, grid, bin_tokens, surv)


def instance_time_s(perf: PerfModel, cfg: InstanceConfig, table: ClassTable, counts: np.ndarray, *,
                    tail_mass: float = 0.25) -> float:
    """Expected seconds for one instance of ``cfg`` to finish ``counts[j]`` requests of each class.

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.workload import LengthHistogram
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> reqs = [RequestState(f"r{i}", 300, 0, 4096) for i in range(64)]
    >>> w = StepWorkload(LengthHistogram.from_lengths([1000] * 32 + [4000] * 32, 4096))
    >>> t = build_classes(reqs, w)
    >>> tp2 = InstanceConfig("tp", tp=2)
    >>> 0 < instance_time_s(perf=pm, cfg=tp2, table=t, counts=t.counts / 2) < instance_time_s(pm, tp2, t, t.counts)
    True
    """
    return float(step_profile_s(perf, cfg, table, counts, tail_mass=tail_mass).sum())


def step_profile_s(perf: PerfModel, cfg: InstanceConfig, table: ClassTable, counts: np.ndarray, *,
                   tail_mass: float = 0.25) -> np.ndarray:
    """Expected seconds one instance of ``cfg`` spends in each grid interval of ``table``.

    Entry ``t`` is the time to decode the ``step_tokens`` tokens after grid point ``t`` with the
    expected batch and context there (0 once fewer than ``tail_mass`` requests remain), so the
    sum is :func:`instance_time_s` and a prefix sum is the time to reach a later point of the step.

    Notes
    -----
    O(J T) for J classes and T grid points.
    """
    counts = np.asarray(counts, dtype=float)
    out = np.zeros(len(table.grid_tokens))
    if counts.sum() <= 0:
        return out
    batch = counts @ table.survival
    ctx = counts @ (table.survival * (table.contexts[:, None] + table.grid_tokens[None, :]))
    active = batch >= min(tail_mass, counts.sum())
    cap = max(1.0, float(perf.kv_capacity_tokens(cfg)))
    seqs = float(perf.cal.max_num_seqs)
    idx = np.flatnonzero(active)
    b, c = batch[idx], ctx[idx]
    queue = np.maximum(np.maximum(1.0, c / cap), b / seqs)  # KV or batch slots full: the rest wait their turn
    out[idx] = table.step_tokens * perf.decode_steps_s(cfg, b / queue, c / queue) * queue  # one vectorised call
    return out


def instance_times_s(perf: PerfModel, cfg: InstanceConfig, table: ClassTable, counts: np.ndarray, *,
                     tail_mass: float = 0.25) -> np.ndarray:
    """:func:`instance_time_s` of many instances of ``cfg`` at once: ``counts`` is (instances, classes).

    Equal, instance for instance, to calling :func:`instance_time_s` on each row (the step model is
    evaluated elementwise, and each row is summed alone), with one step-model call for all of them:
    evaluating a layout of 1,024 instances made 1,024 calls per plan.

    Notes
    -----
    O(K J T) for K instances, J classes and T grid points.
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    k_n = len(counts)
    totals = np.array([row.sum() for row in counts])
    weighted = table.survival * (table.contexts[:, None] + table.grid_tokens[None, :])
    # row by row, as step_profile_s does: a matrix product may round differently in the last bit
    batch = np.array([row @ table.survival for row in counts]).reshape(k_n, -1)
    ctx = np.array([row @ weighted for row in counts]).reshape(k_n, -1)
    active = (batch >= np.minimum(tail_mass, totals)[:, None]) & (totals[:, None] > 0)
    out = np.zeros((k_n, len(table.grid_tokens)))
    if active.any():
        cap = max(1.0, float(perf.kv_capacity_tokens(cfg)))
        seqs = float(perf.cal.max_num_seqs)
        b, c = batch[active], ctx[active]
        queue = np.maximum(np.maximum(1.0, c / cap), b / seqs)
        out[active] = table.step_tokens * perf.decode_steps_s(cfg, b / queue, c / queue) * queue
    return np.array([float(row.sum()) for row in out])


def lone_profile_s(perf: PerfModel, cfg: InstanceConfig, table: ClassTable, *, tail_mass: float = 0.25) -> np.ndarray:
    """Seconds one request of each class spends in each grid interval were it alone on a ``cfg`` instance.

    Row ``j`` is 0 once the class's survival drops below ``tail_mass`` (the cut-off
    :func:`step_profile_s` uses for an instance holding one such request); its sum is
    :func:`lone_times_s`, and a suffix sum the time from a later grid point on.

    Notes
    -----
    O(J T) step-time evaluations for J classes and T grid points.
    """
    ctx = table.contexts[:, None] + table.grid_tokens[None, :]
    step = np.interp(ctx, *_solo_step_curve(perf, cfg, int(ctx.max()) if ctx.size else 0))
    return np.where(table.survival >= tail_mass, table.step_tokens * step, 0.0)


@lru_cache(maxsize=256)
def _solo_curve(perf: PerfModel, cfg: InstanceConfig, knots: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(knots + 1, dtype=float) * _KNOT_TOKENS
    return x, np.array([perf.decode_step_s(cfg, 1.0, c) for c in x])


def _solo_step_curve(perf: PerfModel, cfg: InstanceConfig, max_context: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch-1 step time at every 256th context token up to ``max_context`` (cached per model and configuration).

    The step time is piecewise linear in the context for a fixed batch, with a kink only where
    the attention turns compute-bound or the GPU side passes the host side, so linear interpolation
    between knots is exact away from a kink and off by well under a percent next to one; it
    replaces one model evaluation per class and grid point by one per knot.
    """
    knots = 1 << max(4, int(max_context // _KNOT_TOKENS + 1).bit_length())  # powers of two: few cache entries
    return _solo_curve(perf, cfg, knots)


def lone_times_s(perf: PerfModel, cfg: InstanceConfig, table: ClassTable, *, tail_mass: float = 0.25) -> np.ndarray:
    """Expected seconds one request of each class needs on a ``cfg`` instance, were it alone there.

    A request is indivisible: a layout that spreads a class of one request evenly over ``n``
    instances gives each ``1/n`` of it, which drops below ``tail_mass`` and vanishes from the
    even-share estimate, although some instance must run it to its end. An instance holding a
    request of class ``j`` runs at least this long, whatever else it holds (the step time grows
    with the batch), so a layout's estimate is at least the largest of these over the classes it
    holds.

    Notes
    -----
    O(J T) for J classes and T grid points.

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.workload import LengthHistogram
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> reqs = [RequestState("short", 300, 0, 8192), RequestState("long", 300, 6000, 8192)]
    >>> t = build_classes(reqs, StepWorkload(LengthHistogram.from_lengths([1000] * 40 + [8000] * 4, 8192)))
    >>> lone = lone_times_s(pm, InstanceConfig("tp", tp=2), t)
    >>> bool(lone[t.class_of()["long"]] > 0), bool(lone[t.class_of()["short"]] > 0)
    (True, True)
    """
    return lone_profile_s(perf, cfg, table, tail_mass=tail_mass).sum(axis=1)
