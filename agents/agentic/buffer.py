"""Trajectories, their ledger, and the sample buffer with RollArt's per-trajectory asynchronous bound.

Every trajectory the runtime starts ends in exactly one place, and :class:`Ledger` counts them:
``buffered`` (trained on, or waiting to be), ``aborted`` with a reason (``redundant``,
``env_failure``, ``generation_failed``, ``reward_failed``, ``stale``: the bound aborted it in flight),
or ``discarded`` (it finished but was already older than the bound). :meth:`Ledger.check` fails if
one is missing or counted twice. :class:`SampleBuffer` admits a finished trajectory only if the
policy has not advanced more than ``bound`` versions since it started (§5.3), and
:meth:`SampleBuffer.get_batch` (the trainer's blocking ``get_batch``) re-checks every trajectory it
hands out against the current version, so nothing older than the bound is ever trained on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["Trajectory", "Ledger", "SampleBuffer", "LedgerMismatch"]


class LedgerMismatch(OrchestrlError):
    """Trajectories went missing or were counted twice: a bug the ledger exists to catch."""


@dataclass
class Trajectory:
    """One episode: who ran it, which policy versions it saw, its turns and where it ended."""

    trajectory_id: str
    group_id: str
    tag: str
    version_started: int
    started_s: float
    turns: list[tuple[int, int]] = field(default_factory=list)  # (prompt tokens, output tokens) per turn
    env_reward: float = 0.0
    reward: float | None = None
    status: str = "running"  # running, buffered, aborted, discarded, trained
    reason: str = ""
    versions: set = field(default_factory=set)
    finished_s: float = 0.0
    reward_latency_s: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(p + o for p, o in self.turns[-1:]) if self.turns else 0


class Ledger:
    """Counts where every started trajectory ended (see the module note)."""

    def __init__(self) -> None:
        self.started: dict[str, Trajectory] = {}
        self.ended: Counter = Counter()
        self.reasons: Counter = Counter()

    def start(self, t: Trajectory) -> None:
        if t.trajectory_id in self.started:
            raise LedgerMismatch(f"trajectory {t.trajectory_id} started twice")
        self.started[t.trajectory_id] = t

    def end(self, t: Trajectory, status: str, reason: str = "") -> None:
        if t.status not in ("running", "finished"):
            raise LedgerMismatch(f"trajectory {t.trajectory_id} ended twice ({t.status}, then {status})")
        t.status, t.reason = status, reason
        self.ended[status] += 1
        if reason:
            self.reasons[reason] += 1

    def open(self) -> list[Trajectory]:
        return [t for t in self.started.values() if t.status in ("running", "finished")]

    def check(self) -> dict:
        """Return the counts; raise :class:`LedgerMismatch` unless every started trajectory ended once."""
        counts = Counter(t.status for t in self.started.values())
        if counts.get("running") or counts.get("finished"):
            raise LedgerMismatch(f"{counts.get('running', 0) + counts.get('finished', 0)} trajectories never ended: "
                                 f"{[t.trajectory_id for t in self.open()][:5]}")
        total = sum(self.ended.values())
        if total != len(self.started):
            raise LedgerMismatch(f"{len(self.started)} started, {total} ended")
        return {"started": len(self.started), **{k: v for k, v in sorted(self.ended.items())},
                "reasons": dict(self.reasons)}


class SampleBuffer:
    """Finished, rewarded trajectories waiting for the trainer, under the asynchronous bound."""

    def __init__(self, bound: int, ledger: Ledger) -> None:
        if bound < 0:
            raise OrchestrlError(f"asynchronous bound {bound} is negative")
        self.bound, self.ledger = bound, ledger
        self.version = 0
        self._items: list[Trajectory] = []
        self._changed = asyncio.Event()
        self.trained: list[Trajectory] = []

    def fresh(self, t: Trajectory) -> bool:
        return self.version - t.version_started <= self.bound

    def put(self, t: Trajectory) -> bool:
        """Admit ``t`` if it is within the bound (else it is discarded and counted); return whether it was."""
        if not self.fresh(t):
            self.ledger.end(t, "discarded", "stale_at_finish")
            return False
        self.ledger.end(t, "buffered")
        self._items.append(t)
        self._changed.set()
        return True

    def __len__(self) -> int:
        return len(self._items)

    def set_version(self, version: int) -> int:
        """The policy advanced: discard buffered trajectories now beyond the bound; return how many."""
        self.version = version
        keep, gone = [], 0
        for t in self._items:
            if self.fresh(t):
                keep.append(t)
            else:
                t.status, t.reason = "discarded", "stale_in_buffer"
                self.ledger.ended["buffered"] -= 1
                self.ledger.ended["discarded"] += 1
                self.ledger.reasons["stale_in_buffer"] += 1
                gone += 1
        self._items = keep
        return gone

    async def get_batch(self, n: int) -> list[Trajectory]:
        """Block until ``n`` trajectories within the bound are here; hand out the oldest ``n``."""
        while True:
            self._items = [t for t in self._items if self.fresh(t) or self._drop(t)]
            if len(self._items) >= n:
                batch, self._items = self._items[:n], self._items[n:]
                for t in batch:
                    if not self.fresh(t):  # re-checked: nothing older than the bound is trained on
                        raise LedgerMismatch(f"trajectory {t.trajectory_id} is beyond the bound")
                    t.status = "trained"
                    self.trained.append(t)
                return batch
            self._changed.clear()
            await self._changed.wait()

    def _drop(self, t: Trajectory) -> bool:
        t.status, t.reason = "discarded", "stale_in_buffer"
        self.ledger.ended["buffered"] -= 1
        self.ledger.ended["discarded"] += 1
        self.ledger.reasons["stale_in_buffer"] += 1
        return False
