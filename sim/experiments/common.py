"""Rows of a paper experiment and how they are printed (``{"figure", "rows": [{label, paper, ours, ratio}]}``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Row", "figure_document", "format_rows"]


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


def figure_document(figure: str, rows: Sequence[Row], notes: Sequence[str] = ()) -> dict:
    """Return the JSON document of an experiment (the contract ``orchestrl sim figure --json`` prints)."""
    def num(x):
        return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
    return {"figure": figure, "rows": [{"label": r.label, "paper": num(r.paper), "ours": num(r.ours),
                                        "ratio": num(r.ratio), **r.detail} for r in rows], "notes": list(notes)}


def format_rows(title: str, rows: Sequence[Row], unit: str, notes: Sequence[str] = ()) -> str:
    """Return a readable table of rows: label, paper, ours, ours / paper."""
    width = max([len(r.label) for r in rows] + [5])
    out = [title, f"{'label':<{width}}  {'paper':>9}  {'ours':>9}  {'ours/paper':>10}   ({unit})"]
    for r in rows:
        paper = "-" if r.paper is None else f"{r.paper:9.3f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:10.2f}"
        out.append(f"{r.label:<{width}}  {paper:>9}  {r.ours:9.3f}  {ratio:>10}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)
