"""Rows of a paper experiment and how they are printed (``{"figure", "rows": [{label, paper, ours, ratio}]}``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Row", "figure_document", "format_rows", "mean_ci", "aggregate_rows", "separated", "ordering_note",
           "DEFAULT_SEEDS", "QUICK_SEEDS"]

#: Trace seeds a figure runs by default (``--seeds``), full and ``--quick``: the fixed-scheduler runs of
#: Figure 17 vary by about 6% between seeds, enough to flip an ordering a single seed would report.
DEFAULT_SEEDS = 3
QUICK_SEEDS = 1  # --quick is a smoke run: one seed; intervals need --seeds N


@dataclass(frozen=True)
class Row:
    """One compared number: the paper's (None where it gives none), ours, and notes on how ours was made."""

    label: str
    paper: float | None
    ours: float
    detail: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.paper is None or self.paper == 0 or not math.isfinite(self.ours):
            return None
        return self.ours / self.paper


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Return the mean of ``values`` and its ``level`` confidence interval (Student's t; one value: no width).

    >>> m, lo, hi = mean_ci([1.0, 1.2, 1.1])
    >>> round(m, 3), round(lo, 3), round(hi, 3)
    (1.1, 0.852, 1.348)
    """
    from scipy import stats

    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return float("nan"), float("nan"), float("nan")
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, m, m
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, len(v) - 1)) * sd / math.sqrt(len(v))
    return m, m - half, m + half


def aggregate_rows(per_seed: Sequence[Sequence[Row]], seeds: Sequence[int]) -> list[Row]:
    """Return one row per label: the mean over seeds as ``ours``, with ``ci_low``/``ci_high`` (95%), the seed count
    and the per-seed values in its detail (the first seed's other details kept)."""
    if len(per_seed) == 1:
        return [Row(r.label, r.paper, r.ours, {**r.detail, "ci_low": r.ours, "ci_high": r.ours, "seeds": 1,
                                               "per_seed": [r.ours]}) for r in per_seed[0]]
    by_label: dict[str, list[float]] = {}
    for rows in per_seed:
        for r in rows:
            by_label.setdefault(r.label, []).append(r.ours)
    out = []
    for r in per_seed[0]:
        vals = by_label[r.label]
        m, lo, hi = mean_ci(vals)
        out.append(Row(r.label, r.paper, m, {**r.detail, "ci_low": lo, "ci_high": hi, "seeds": len(vals),
                                             "seed_list": list(seeds), "per_seed": vals}))
    return out


def separated(a: Row, b: Row) -> bool:
    """Whether two rows' 95% intervals do not overlap (an ordering between them may then be claimed)."""
    alo, ahi = a.detail.get("ci_low", a.ours), a.detail.get("ci_high", a.ours)
    blo, bhi = b.detail.get("ci_low", b.ours), b.detail.get("ci_high", b.ours)
    return ahi < blo or bhi < alo


def ordering_note(a: Row, b: Row) -> str:
    """A sentence stating the order of two rows only where their intervals separate."""
    hi, lo = (a, b) if a.ours >= b.ours else (b, a)
    if separated(a, b):
        return f"{hi.label} > {lo.label} ({hi.ours:.3f} vs {lo.ours:.3f}; 95% intervals separate)"
    return (f"{hi.label} vs {lo.label}: {hi.ours:.3f} vs {lo.ours:.3f}, 95% intervals overlap -- no ordering "
            "claimed")


def figure_document(figure: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> dict:
    """Return the JSON document of an experiment (the contract ``orchestrl sim figure --json`` prints)."""
    def num(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
    return {"figure": figure, "rows": [{"label": r.label, "paper": num(r.paper), "ours": num(r.ours),
                                        "ratio": num(r.ratio), **r.detail} for r in rows], "notes": list(notes)}


def format_rows(title: str, rows: Sequence[Row], unit: str, notes: Sequence[str] = ()) -> str:
    """Return a readable table of rows: label, paper, ours, ours / paper."""
    width = max([len(r.label) for r in rows] + [5])
    ci = any("ci_low" in r.detail for r in rows)
    seeds = max((int(r.detail.get("seeds", 1)) for r in rows), default=1)
    head = f"{'label':<{width}}  {'paper':>9}  {'ours':>9}  " + (f"{'95% interval':>17}  " if ci else "")
    out = [title, head + f"{'ours/paper':>10}   ({unit}" + (f"; mean of {seeds} seeds)" if ci else ")")]
    for r in rows:
        paper = "-" if r.paper is None else f"{r.paper:9.3f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:10.2f}"
        band = f"[{r.detail['ci_low']:7.3f}, {r.detail['ci_high']:7.3f}]  " if ci and "ci_low" in r.detail else (
            f"{'':>17}  " if ci else "")
        out.append(f"{r.label:<{width}}  {paper:>9}  {r.ours:9.3f}  {band}{ratio:>10}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)
