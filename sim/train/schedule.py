"""The 1F1B pipeline schedule (PipeDream-flush, as Megatron-LM runs it), event by event.

Design note
-----------
Stage ``s`` of ``S`` runs ``min(S - s - 1, M)`` warm-up forwards, then alternates one forward with
one backward until its ``M`` forwards are issued, then drains the remaining backwards. A forward
of micro-batch ``i`` on stage ``s`` needs the activation of stage ``s - 1`` (its forward's end plus
one transfer); a backward needs the gradient of stage ``s + 1`` (the last stage: its own forward).
Every stage runs its operations in that fixed order, each as soon as the stage is free and its
input has arrived. With equal forward time ``f``, backward time ``b`` and free transfers, the
makespan is ``(M + S - 1)(f + b)``: the bubble is ``(S - 1) / (M + S - 1)`` of it.

The result keeps every operation's start and end, so the training stage can place the per-layer
collectives of each operation in time (what the safe-window gate observes) and start each stage's
gradient synchronisation when that stage is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PipelineRun", "one_f_one_b", "stage_order"]


@dataclass(frozen=True)
class PipelineRun:
    """Start and end (s) of every forward and backward, indexed ``[stage, micro-batch]``."""

    fwd_start: np.ndarray
    fwd_end: np.ndarray
    bwd_start: np.ndarray
    bwd_end: np.ndarray

    @property
    def makespan_s(self) -> float:
        return float(self.bwd_end.max()) if self.bwd_end.size else 0.0

    @property
    def stage_done_s(self) -> np.ndarray:
        """When each stage finished its last backward."""
        return self.bwd_end.max(axis=1)

    def busy_s(self) -> float:
        """Time one stage spends computing (forwards plus backwards, averaged over stages)."""
        return float(((self.fwd_end - self.fwd_start) + (self.bwd_end - self.bwd_start)).sum(axis=1).mean())


def stage_order(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Return the operations stage ``stage`` runs, in order: ``("F", i)`` and ``("B", i)``.

    Examples
    --------
    >>> stage_order(3, 4, 0)
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    >>> stage_order(3, 4, 2)
    [('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2), ('F', 3), ('B', 3)]
    """
    warm = min(stages - stage - 1, microbatches)
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < microbatches:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops += [("B", i) for i in range(b, microbatches)]
    return ops


def one_f_one_b(stages: int, microbatches: int, fwd_s: float | np.ndarray, bwd_s: float | np.ndarray,
                p2p_s: float = 0.0) -> PipelineRun:
    """Return the timeline of a 1F1B pipeline.

    Parameters
    ----------
    stages, microbatches : int
    fwd_s, bwd_s : float or array of shape (stages,)
        Time of one forward / backward of one micro-batch on each stage.
    p2p_s : float
        Time of one activation (or gradient) transfer between adjacent stages.

    Raises
    ------
    ValueError
        If a time is NaN or negative. ``inf`` is accepted (an operation that never finishes, e.g. its
        collective has no path): the makespan is then ``inf``, which is what a caller comparing
        fabric states needs.

    Notes
    -----
    O(S M) operations; each is placed once, in an order that respects both the stages' fixed
    orders and the cross-stage dependencies (a sweep over stages repeats until every stage is
    done; a stage advances as far as its inputs allow, so there are at most O(S + M) sweeps).

    Examples
    --------
    >>> run = one_f_one_b(4, 8, 1.0, 2.0)
    >>> run.makespan_s, (8 + 4 - 1) * 3.0
    (33.0, 33.0)
    """
    S, M = int(stages), int(microbatches)
    f = np.broadcast_to(np.asarray(fwd_s, dtype=np.float64), (S,))
    b = np.broadcast_to(np.asarray(bwd_s, dtype=np.float64), (S,))
    # NaN marks "not computed yet" below, so a NaN input would stall the sweep forever
    for name, v in (("fwd_s", f), ("bwd_s", b), ("p2p_s", np.asarray(p2p_s, dtype=np.float64))):
        if np.isnan(v).any() or (v < 0).any():
            raise ValueError(f"one_f_one_b: {name} must be >= 0 seconds (inf for an operation that never "
                             f"finishes), got {v.tolist()!r}")
    fs, fe, bs, be = (np.full((S, M), np.nan) for _ in range(4))
    orders = [stage_order(S, M, s) for s in range(S)]
    pos = [0] * S
    free = [0.0] * S
    left = S * 2 * M
    while left:
        progressed = False
        for s in range(S):
            ops = orders[s]
            while pos[s] < len(ops):
                kind, i = ops[pos[s]]
                if kind == "F":
                    ready = 0.0 if s == 0 else fe[s - 1, i] + p2p_s
                else:
                    ready = fe[s, i] if s == S - 1 else be[s + 1, i] + p2p_s
                if np.isnan(ready):  # the input is not computed yet
                    break
                start = max(free[s], ready)
                if kind == "F":
                    fs[s, i], fe[s, i] = start, start + f[s]
                else:
                    bs[s, i], be[s, i] = start, start + b[s]
                free[s] = (fe if kind == "F" else be)[s, i]
                pos[s] += 1
                left -= 1
                progressed = True
        if not progressed:  # cannot happen for a valid 1F1B order; guard against an infinite loop
            raise RuntimeError("1F1B schedule deadlocked")
    return PipelineRun(fs, fe, bs, be)
