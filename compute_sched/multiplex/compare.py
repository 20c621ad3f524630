"""Two slowdown grids side by side: the modelled one at every point the measured one has.

Used by docs/jigsaw.md and ``bench/jigsaw.py``: per point, per sub-stage kind and per situation
(alone on fewer SMs, at a memory level, next to a co-runner), the model's value, the measurement and
the relative error ``model / measured - 1``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from orchestrl.compute_sched.multiplex.grid import SlowdownGrid, SlowdownModel

__all__ = ["PointError", "compare", "summary"]


@dataclass(frozen=True)
class PointError:
    a: str
    b: str | None
    sm_a_frac: float
    mem_a_pct: float
    measured: float
    model: float

    @property
    def situation(self) -> str:
        if self.b is not None:
            return "pair"
        return "alone-sm" if self.sm_a_frac < 0.999 else ("alone-mem" if self.mem_a_pct < 79.9 else "reference")

    @property
    def error(self) -> float:
        return self.model / self.measured - 1.0


def compare(model: SlowdownModel, measured: SlowdownGrid) -> list[PointError]:
    """Return the model's value at every point of ``measured`` (the whole-GPU reference points included)."""
    return [PointError(p.a, p.b, p.sm_a_frac, p.mem_a_pct, p.slowdown, model.s(p.a, p.b, p.sm_a_frac, p.mem_a_pct))
            for p in measured.points]


def summary(errors: Sequence[PointError], by: str = "kind", memory: bool = False) -> dict[str, dict[str, float]]:
    """Return ``{group: {n, median_abs, worst_abs, mean_signed}}`` grouped by ``kind`` or ``situation``.

    The whole-GPU reference points (1.0 by definition in both) are left out, and so are the memory
    points unless ``memory=True``: the profiler scales a two-layer model's batch linearly with the
    level, the model sizes it from a whole model's KV pool or optimizer state, so they answer
    different questions (docs/jigsaw.md).
    """
    groups: dict[str, list[float]] = {}
    for e in errors:
        if e.situation == "reference" or (e.situation == "alone-mem" and not memory):
            continue
        key = e.a if by == "kind" else e.situation
        groups.setdefault(key, []).append(e.error)
        groups.setdefault("all", []).append(e.error)
    return {k: {"n": len(v), "median_abs": statistics.median(abs(x) for x in v),
                "worst_abs": max(abs(x) for x in v), "mean_signed": statistics.fmean(v)}
            for k, v in sorted(groups.items())}
