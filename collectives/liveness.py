"""Liveness for one sync round: join, heartbeats, the first failure record, and the done barrier.

Design note
-----------
A transport wait cannot be interrupted (a gloo wait that times out even closes the connection),
so a rank cannot learn from its own sockets that some *other* rank died. Every rank therefore
publishes one small key in the shared store, ``"<beat>|<state>|<digest>|<phase>"``, at every poll,
and reads every peer's key in one ``multi_get``. A peer whose beat has not moved for
``timeout_s`` -- measured on the reader's own monotonic clock, so no clock sync is needed -- is
dead or stalled, and is named with the phase it last published. The first rank to see a failure
writes it under ``"abort"`` with ``compare_set`` (first writer wins); every other rank adopts that
record, so all survivors report the same root cause instead of a chain of follow-on errors.
Joining checks that all ranks run the same schedule digest before any tensor is exchanged (gloo
aborts the process on a size mismatch), and :meth:`Liveness.finish` is a barrier that only
returns once every rank finished its data.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from collectives.errors import WeightSyncError

__all__ = ["Liveness"]

_ABSENT = "0|absent||"
_NO_ABORT = "-"


class Liveness:
    """Heartbeats and failure agreement among ``world_size`` ranks through a torch ``Store``.

    Parameters
    ----------
    store : torch.distributed.Store
        Shared by all ranks; keys are written under it as given (use a ``PrefixStore`` per round).
    rank, world_size : int
        This rank and the number of ranks.
    digest : str
        Schedule digest; ranks with different digests refuse to start.
    timeout_s : float
        How long a peer may stay silent before it is declared dead or stalled.
    rank_name : callable
        Rank -> human name for messages.
    """

    def __init__(self, store, rank: int, world_size: int, digest: str, timeout_s: float,
                 rank_name: Callable[[int], str] = lambda r: f"rank {r}", poll_s: float | None = None) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.digest = digest
        self.timeout_s = float(timeout_s)
        self.rank_name = rank_name
        self.poll_s = poll_s if poll_s is not None else min(0.25, self.timeout_s / 8)
        self._beat = 0
        self._next_poll = 0.0
        self._seen: dict[int, tuple[str, float]] = {}
        self._states: list[tuple[str, str, str]] = []
        self.phase = "joining"

    # -- store helpers --------------------------------------------------------------------------
    def _io(self, what: Callable[[], object]) -> object:
        try:
            return what()
        except WeightSyncError:
            raise
        except Exception as exc:  # the store is gone: its host (schedule rank 0) died or the network did
            raise WeightSyncError(
                f"lost the coordination store while {self.phase}: {exc}; the rank hosting it "
                f"({self.rank_name(0)}) has probably died", peer=0, phase=self.phase, reporter=self.rank) from exc

    def _publish(self, state: str) -> None:
        self._beat += 1
        value = f"{self._beat}|{state}|{self.digest}|{self.phase}"
        self._io(lambda: self.store.set(f"r{self.rank}", value))

    def _read(self) -> str:
        keys = [f"r{q}" for q in range(self.world_size)] + ["abort"]
        values = self._io(lambda: self.store.multi_get(keys))
        now = time.monotonic()
        self._states = []
        for q, raw in enumerate(values[:-1]):  # type: ignore[index]
            beat, state, digest, phase = raw.decode().split("|", 3)
            self._states.append((state, digest, phase))
            if self._seen.get(q, ("", 0.0))[0] != beat:
                self._seen[q] = (beat, now)
        return values[-1].decode()  # type: ignore[index]

    # -- protocol ---------------------------------------------------------------------------------
    def join(self) -> None:
        """Announce this rank and wait until every rank has joined with the same schedule."""
        start = time.monotonic()
        for q in range(self.world_size):
            self._io(lambda q=q: self.store.compare_set(f"r{q}", "", _ABSENT))
        self._io(lambda: self.store.compare_set("abort", "", _NO_ABORT))
        self._seen = {q: ("", start) for q in range(self.world_size)}
        while True:
            self._publish("running")
            self._check_abort(self._read())
            for q, (state, digest, _) in enumerate(self._states):
                if state != "absent" and digest != self.digest:
                    raise self.fail(q, f"{self.rank_name(q)} runs schedule {digest}, this rank runs {self.digest}; "
                                       "every rank must plan from the same inputs")
            absent = [q for q, (state, _, _) in enumerate(self._states) if state == "absent"]
            if not absent:
                return
            if time.monotonic() - start > self.timeout_s:
                raise self.fail(absent[0], f"{self.rank_name(absent[0])} never joined the sync within "
                                           f"{self.timeout_s:.0f} s ({len(absent)} rank(s) missing)")
            time.sleep(min(self.poll_s, 0.01))  # a short poll keeps the ranks' start times close

    def poll(self, phase: str, force: bool = False) -> None:
        """Heartbeat and check peers; raise :class:`WeightSyncError` if one is dead or a rank failed.

        Cheap to call often: store traffic happens at most once per ``poll_s``.
        """
        self.phase = phase
        now = time.monotonic()
        if not force and now < self._next_poll:
            return
        self._next_poll = now + self.poll_s
        self._publish("running")
        self._check_abort(self._read())
        self._check_stale()

    def finish(self, phase: str = "waiting for the other ranks to finish") -> None:
        """Barrier: return once every rank has published "done"; fail on a dead peer or an abort."""
        self.phase = phase
        self._publish("done")
        while True:
            self._check_abort(self._read())
            if all(state == "done" for state, _, _ in self._states):
                self._linger()
                return
            self._check_stale()
            time.sleep(self.poll_s)
            self._publish("done")

    def _linger(self) -> None:
        """Rank 0 hosts the store: it leaves only after every rank has seen the barrier pass."""
        self._io(lambda: self.store.add("left", 1))
        if self.rank != 0:
            return
        deadline = time.monotonic() + self.timeout_s
        while self._io(lambda: self.store.add("left", 0)) < self.world_size and time.monotonic() < deadline:
            time.sleep(self.poll_s / 4)

    def fail(self, peer: int, reason: str) -> WeightSyncError:
        """Record a failure (unless another rank already did) and return the error to raise.

        The returned error carries the *first* recorded failure, so every rank names the same peer.
        """
        record = json.dumps({"reporter": self.rank, "peer": peer, "phase": self.phase, "reason": reason})
        try:
            current = self.store.compare_set("abort", _NO_ABORT, record).decode()
            self._beat += 1
            self.store.set(f"r{self.rank}", f"{self._beat}|failed|{self.digest}|{self.phase}")
        except Exception:  # store gone too: report what this rank saw
            current = record
        return self._error(current if current != _NO_ABORT else record)

    # -- internals -------------------------------------------------------------------------------
    def _check_abort(self, abort: str) -> None:
        if abort not in (_NO_ABORT, ""):
            raise self._error(abort)

    def _check_stale(self) -> None:
        now = time.monotonic()
        for q, (state, _, phase) in enumerate(self._states):
            if q == self.rank or state in ("done", "failed"):
                continue
            silent = now - self._seen[q][1]
            if silent > self.timeout_s:
                where = phase or "before joining"
                raise self.fail(q, f"{self.rank_name(q)} stopped responding (no heartbeat for {silent:.1f} s) "
                                   f"while {where}")

    def _error(self, record: str) -> WeightSyncError:
        doc = json.loads(record)
        mine = " (detected here)" if doc["reporter"] == self.rank else f" (detected by {self.rank_name(doc['reporter'])})"
        return WeightSyncError(f"weight sync failed: {doc['reason']}{mine}; this rank was {self.phase}",
                               peer=int(doc["peer"]), phase=str(doc["phase"]), reporter=int(doc["reporter"]))
