"""Progress reporting for long commands: one line per step on stderr, so stdout stays parseable."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Counts steps of a long job and reports each with its elapsed time.

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> p = Progress(2, "planning", stream=out)
    >>> with p.step("train"):
    ...     pass
    >>> out.getvalue().startswith("[1/2] planning: train")
    True
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.done = 0

    def step(self, what: str) -> "_Step":
        return _Step(self, what)


class _Step:
    def __init__(self, progress: Progress, what: str) -> None:
        self.progress = progress
        self.what = what

    def __enter__(self) -> "_Step":
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        p = self.progress
        p.done += 1
        if p.quiet:
            return
        took = time.perf_counter() - self.started
        status = "failed" if exc_type else "done"
        p.stream.write(f"[{p.done}/{p.total}] {p.label}: {self.what} {status} in {took * 1e3:.1f} ms\n")
        p.stream.flush()
