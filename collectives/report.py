"""What a weight-sync round gives its caller: :class:`SyncReport` (what one rank did in one round) and
:class:`SyncHandle` (a round running in the background, :meth:`collectives.weight_sync.WeightSync.send_async`).
Both are re-exported by :mod:`collectives.weight_sync`."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["SyncReport", "SyncHandle"]


@dataclass(frozen=True)
class SyncReport:
    """What one rank did in one sync round."""

    rank: int
    role: str  # "trainer" | "generator"
    started_at: float  # wall clock after every rank joined
    data_done_at: float  # wall clock when this rank's last chunk was sent or verified
    finished_at: float  # wall clock after the done barrier
    bytes_sent: int
    bytes_received: int
    chunks_verified: int
    params_loaded: int
    verified: bool  # every chunk this rank received matched its checksum and every needed slice arrived
    step_times: tuple[tuple[int, float, float], ...] = ()  # (step, posted, done) wall clock; only when tracing
    round: int = 0  # round number (rounds of one job count up from 1)

    @property
    def elapsed_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def barrier_s(self) -> float:
        """Time spent in the end-of-sync barrier after this rank's own data was done."""
        return self.finished_at - self.data_done_at


class SyncHandle:
    """A sync running in the background (:meth:`WeightSync.send_async`)."""

    def __init__(self, thread: threading.Thread, box: dict) -> None:
        self._thread = thread
        self._box = box

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> SyncReport:
        """Block until the round ends; return its report or raise its error."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the weight sync did not finish within {timeout_s} s")
        if "error" in self._box:
            raise self._box["error"]
        return self._box["report"]
