"""Files behind a paper-comparison figure: a CSV of every row, and a PNG of paper vs ours when matplotlib is there.

Used by fig17, fig18 and fig22 (the plotting helper of the other figures, ``sim/plot.py``, is written
on another branch; the main developer unifies them). matplotlib is optional: without it the CSV is
still written and the returned note says why the PNG is missing.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

from sim.experiments.common import Row
from sim.plot import _pyplot, matplotlib_available, write_csv

__all__ = ["row_dicts", "write_rows"]


def row_dicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Return one flat dict per row: label, paper, ours, ratio, then every scalar detail."""
    out = []
    for r in rows:
        d = {"label": r.label, "paper": r.paper, "ours": r.ours, "ratio": r.ratio}
        d.update({k: v for k, v in r.detail.items() if isinstance(v, (int, float, str)) or v is None})
        out.append(d)
    return out


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return "" if v is None else v


def write_rows(name: str, rows: Sequence[Row], out_dir: str | os.PathLike[str], *, title: str, ylabel: str,
               log_y: bool = False) -> tuple[str, str | None, str | None]:
    """Write ``NAME.csv`` (every row) and ``NAME.png`` (ours beside the paper's value) into ``out_dir``.

    Returns
    -------
    (csv_path, png_path or None, note or None)
        ``note`` says why there is no PNG.
    """
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(os.path.join(out_dir, f"{name}.csv"),
                         [{k: _cell(v) for k, v in d.items()} for d in row_dicts(rows)])
    if not matplotlib_available():
        return csv_path, None, "matplotlib is not installed (pip install 'orchestrl[sim]'); wrote the CSV only"
    plt = _pyplot()

    labels = [r.label for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.0))
    ax.bar([i - 0.2 for i in x], [r.ours for r in rows], width=0.4, label="ours")
    ax.bar([i + 0.2 for i in x], [r.paper if r.paper is not None else 0.0 for r in rows], width=0.4,
           label="paper (0 = no number)", alpha=0.6)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log_y:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    png_path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return csv_path, png_path, None
