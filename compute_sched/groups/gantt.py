"""Text Gantt charts of a group's schedule, one row per rollout node plus the training pool (RollMux Fig. 10)."""

from __future__ import annotations

import string
from typing import Sequence

from orchestrl.compute_sched.groups.intra import Segment

__all__ = ["render_gantt"]


def render_gantt(segments: Sequence[Segment], width: int = 96, title: str = "") -> str:
    """Return an ASCII chart of ``segments``; each job gets a letter, its consolidated tail a lower-case one.

    Examples
    --------
    >>> segs = [Segment("a", "rollout", (0,), 0, 0.0, 10.0), Segment("a", "train", (), 0, 10.0, 20.0),
    ...         Segment("b", "rollout", (0,), 0, 10.0, 20.0)]
    >>> print(render_gantt(segs, width=20))
    rollout 0 |AAAAAAAAAABBBBBBBBBB|
    train     |..........AAAAAAAAAA|
              0 s                  20 s
    legend: A=a B=b (lower case: consolidated tail)
    """
    if not segments:
        return "(no phases)"
    end = max(s.end_s for s in segments)
    scale = width / end if end > 0 else 1.0
    jobs = list(dict.fromkeys(s.job_id for s in segments))
    letters = {j: (string.ascii_uppercase + string.digits)[i % 36] for i, j in enumerate(jobs)}
    nodes = sorted({n for s in segments for n in s.nodes})
    rows = {f"rollout {n}": ["."] * width for n in nodes}
    rows["train"] = ["."] * width

    def paint(row: list[str], a: float, b: float, ch: str) -> None:
        for x in range(int(a * scale + 0.5), min(width, int(b * scale + 0.5))):
            row[x] = ch

    for s in segments:
        ch = letters[s.job_id]
        if s.pool == "train":
            paint(rows["train"], s.start_s, s.end_s, ch)
            continue
        for n in s.nodes:
            row = rows[f"rollout {n}"]
            if s.tail_from_s is not None:
                paint(row, s.start_s, s.tail_from_s, ch)
                paint(row, s.tail_from_s, s.end_s, ch.lower())
            else:
                paint(row, s.start_s, s.end_s, ch)
    label = max(len(k) for k in rows)
    lines = [title] if title else []
    lines += [f"{k:<{label}} |{''.join(v)}|" for k, v in rows.items()]
    axis_end = f"{end:.0f} s"
    lines.append(" " * (label + 1) + "0 s" + " " * max(1, width - 3 - len(axis_end) + 2) + axis_end)
    lines.append("legend: " + " ".join(f"{letters[j]}={j}" for j in jobs) + " (lower case: consolidated tail)")
    return "\n".join(lines)
