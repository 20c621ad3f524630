"""Liveness for one sync round: join checks, background heartbeats, failure agreement, barriers.

Design note
-----------
A transport wait cannot be interrupted, so a rank cannot learn from its own sockets that some
*other* rank died. Every rank therefore publishes one small key in the shared store,
``"<beat>|<state>|<digest>|<world>|<generation>|<phase>"``, from a *background thread* every
``poll_s``, and reads its peers' keys in one ``multi_get``. Heartbeats do not depend on the calling
thread, so a rank whose engine spends a long time in ``load_weights`` is not mistaken for a dead one;
the callback has its own limit (``load_timeout_s``). A peer whose beat has not moved for
``timeout_s`` -- measured on the reader's own monotonic clock, so no clock sync is needed -- is
dead or stalled, and is named with the phase it last published. The first rank to see a failure
writes it under ``"abort"`` with ``compare_set`` (first writer wins) and wakes every waiter; every
other rank adopts that record, so all survivors report the same root cause.

Joining and finishing are event driven: each rank counts itself in with ``add`` and the last one
sets a release key that everyone else is blocked on (``Store.wait``), so a barrier costs a few
store round trips, not a polling interval. A failure sets the same key to ``"abort"``, so no rank
waits out a timeout once the cause is known. Before anything connects, joining compares every
rank's schedule digest and world size and names the rank(s) that disagree with the majority.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable

from orchestrl.collectives.errors import IntegrityError, WeightSyncError

__all__ = ["Liveness", "StoreClients"]

_NO_ABORT = "-"


#: Longest a failure record may wait for the store (seconds); below the liveness timeout when that is short.
FAIL_RECORD_S = 5.0


def _bounded(store, timeout_s: float):
    """A client of ``store`` of its own whose calls give up after ``timeout_s`` (the store itself if it has no clone)."""
    if not hasattr(store, "clone"):
        return store
    out = store.clone()
    out.set_timeout(timedelta(seconds=timeout_s))
    return out


@dataclass(frozen=True)
class StoreClients:
    """The three store clients a rank's liveness uses, each its own connection with its own bound.

    One for the calling thread (joins, barriers), one for the heartbeat thread and one for failure
    records (bounded by ``min(timeout_s, FAIL_RECORD_S)``). A :class:`~orchestrl.collectives.WeightSync`
    opens one set and keeps it across successful rounds, dropping it after a failed one (a client whose
    call timed out may still receive that call's late answer, so it is not reused): each new connection
    costs torch's store server a reverse DNS lookup of the client (see ``collectives/store.py``).
    """

    main: Any
    heartbeat: Any
    failure: Any

    @classmethod
    def open(cls, store, timeout_s: float) -> "StoreClients":
        return cls(_bounded(store, timeout_s), _bounded(store, timeout_s), _bounded(store, min(timeout_s, FAIL_RECORD_S)))

    def prefixed(self, prefix: str) -> "StoreClients":
        """The same connections, with every key under ``prefix`` (one round's keys)."""
        import torch.distributed as dist

        return StoreClients(*(dist.PrefixStore(prefix, c) for c in (self.main, self.heartbeat, self.failure)))


def _quietly(fn: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # the caller reads what fn stored; a failure means "no answer"
        fn()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _ranks_text(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    return ", ".join(map(str, rs[:8])) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")


class Liveness:
    """Heartbeats, join checks and failure agreement among ``world_size`` ranks through a torch ``Store``.

    Parameters
    ----------
    clients : StoreClients
        This rank's bounded clients of the store all ranks share (``StoreClients.open``), with one round's
        key prefix (``.prefixed``); the calling thread, the heartbeat thread and failure records each use
        their own.
    rank, world_size : int
        This rank and the number of ranks in its schedule.
    digest : str
        Schedule digest; ranks with different digests (or world sizes) refuse to start.
    timeout_s : float
        How long a peer may stay silent before it is declared dead or stalled.
    join_timeout_s : float
        How long joining may take before the ranks still missing are named.
    load_timeout_s : float
        How long one ``load_weights`` callback may run before the round fails naming it.
    rank_name : callable
        Rank -> human name for messages.
    peers : iterable of int
        Ranks whose heartbeats this rank watches once the round runs (its schedule neighbours);
        everyone is watched while joining.
    generation : int
        This rank's transport generation, published for its peers (see ``TorchTransport``).
    """

    def __init__(self, clients: StoreClients, rank: int, world_size: int, digest: str, *, timeout_s: float,
                 join_timeout_s: float, load_timeout_s: float, rank_name: Callable[[int], str] = lambda r: f"rank {r}",
                 peers: Iterable[int] = (), generation: int = 0, poll_s: float | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.digest = digest
        self.timeout_s = float(timeout_s)
        self.join_timeout_s = float(join_timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.rank_name = rank_name
        self.peers = sorted(set(peers) - {rank})
        self.generation = generation
        self.poll_s = poll_s if poll_s is not None else min(0.25, self.timeout_s / 8)
        self.phase = "joining"
        self.generations: dict[int, int] = {}
        # Every store call is bounded: a rank cut off from the store (a partition, or the death of the rank
        # that hosts it) must not block in a call for the store's own, long, connect timeout. Each thread
        # has its own client; the failure record has one of its own with a shorter bound.
        self.fail_s = min(self.timeout_s, FAIL_RECORD_S)
        self._store, self._bg_store, self._fail_store = clients.main, clients.heartbeat, clients.failure
        self._state = "joining"
        self._beat = 0
        self._watch_all = True
        self._seen: dict[int, tuple[str, float]] = {}
        self._error: WeightSyncError | None = None
        self._callback: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._fail_lock = threading.Lock()
        self._started = time.monotonic()
        self._answered = self._started  # last time the store answered a heartbeat
        self._lost = False  # the store stopped answering
        self._thread = threading.Thread(target=self._heartbeat, name=f"weight-sync-beat-{rank}", daemon=True)

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

    def _value(self, state: str) -> str:
        self._beat += 1
        return f"{self._beat}|{state}|{self.digest}|{self.world_size}|{self.generation}|{self.phase}"

    @staticmethod
    def _parse(raw: bytes) -> tuple[str, str, str, int, int, str]:
        beat, state, digest, world, gen, phase = raw.decode().split("|", 5)
        return beat, state, digest, int(world), int(gen), phase

    # -- protocol ---------------------------------------------------------------------------------
    def join(self) -> None:
        """Announce this rank and return once every rank has joined with the same schedule.

        Raises :class:`WeightSyncError` naming the rank(s) with another schedule or world size, a
        rank joined twice, or the ranks still missing after ``join_timeout_s``.
        """
        self._io(lambda: self._store.set(f"r{self.rank}", self._value("joining")))
        self._io(lambda: self._store.compare_set("abort", "", _NO_ABORT))
        hello = f"{self.rank}|{self.digest}|{self.world_size}|{self.generation};"
        self._io(lambda: self._store.append("hellos", hello))
        self._thread.start()
        count = int(self._io(lambda: self._store.add("joined", 1)))  # type: ignore[arg-type]
        if count > self.world_size:
            raise self.fail(self.rank, f"{count} ranks joined a round of a {self.world_size}-rank schedule: a rank "
                                       "was started twice or with a schedule for another world size", kind="mismatch")
        if count == self.world_size:
            self._check_agreement(self._hellos(self._store))
            self._release("go", "ok")
        self._await("go", self.join_timeout_s + 2 * self.timeout_s)
        hellos = self._hellos(self._store)
        self.generations = {q: hellos[q][2] for q in self.peers if q in hellos}
        self._watch_all = False
        self._state = "running"

    def poll(self, phase: str) -> None:
        """Record what this rank is doing; raise if any rank failed (cheap: no store traffic).

        Also raises when the store has not answered the heartbeat for ``timeout_s``: a store client's
        own timeout is not a wall-clock bound (a call to an unreachable host retries), so the clock
        that decides is this one.
        """
        self.phase = phase
        if self._error is None and self._thread.is_alive() and time.monotonic() - self._answered > self.timeout_s:
            self._store_lost("no answer to the heartbeat for "
                             f"{time.monotonic() - self._answered:.1f} s")
        if self._error is not None:
            raise self._error

    def callback_started(self, what: str) -> None:
        """Start the ``load_timeout_s`` clock for one user callback (``what`` names it)."""
        self._callback = (what, time.monotonic())

    def callback_done(self) -> None:
        self._callback = None

    def finish(self, phase: str = "waiting for the other ranks to finish") -> None:
        """Barrier: return once every rank has finished its data; fail on a dead peer or an abort."""
        self.phase = phase
        self._state = "done"
        self._io(lambda: self._store.set(f"r{self.rank}", self._value("done")))
        if int(self._io(lambda: self._store.add("done", 1))) == self.world_size:  # type: ignore[arg-type]
            self._release("release", "ok")
        self._await("release", 4 * self.timeout_s + self.load_timeout_s)
        # Schedule rank 0 hosts the store: it leaves only after every rank has passed the barrier.
        if int(self._io(lambda: self._store.add("left", 1))) == self.world_size:  # type: ignore[arg-type]
            self._io(lambda: self._store.set("all-left", "1"))
        if self.rank == 0:
            # a rank died right after the barrier: nothing of this round depends on it
            with contextlib.suppress(Exception):
                self._store.wait(["all-left"], timedelta(seconds=self.timeout_s))

    def close(self) -> None:
        """Stop the heartbeat thread (idempotent); call when the round is over, however it ended."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            # a heartbeat stuck in a call to a store that stopped answering ends when that call gives up; it
            # is a daemon thread that touches nothing of the round, so the caller does not wait for it
            self._thread.join(timeout=0.5 if self._lost else 10 * self.poll_s + 5)

    def fail(self, peer: int, reason: str, kind: str = "failure") -> WeightSyncError:
        """Record a failure (unless another rank already did) and return the error to raise.

        The returned error carries the *first* recorded failure, so every rank names the same peer;
        ``kind="integrity"`` makes it an :class:`IntegrityError` on every rank.
        """
        record = json.dumps({"reporter": self.rank, "peer": peer, "phase": self.phase, "reason": reason, "kind": kind})
        if self._error is not None:  # already failed (e.g. the heartbeat found the store gone): one cause
            return self._error
        box: dict[str, str] = {}
        value = self._value("failed")

        def write() -> None:  # on a thread of its own, so a store that does not answer costs fail_s, no more
            with self._fail_lock:
                store = self._fail_store
                store.compare_set("abort", "", _NO_ABORT)  # a rank may fail before it joined
                current = store.compare_set("abort", _NO_ABORT, record).decode()
                box["current"] = record if current in ("", _NO_ABORT) else current  # keys never set up: ours
                store.set(f"r{self.rank}", value)
                for key in ("go", "release"):
                    store.compare_set(key, "", "abort")

        writer = threading.Thread(target=_quietly, args=(write,), name=f"weight-sync-fail-{self.rank}", daemon=True)
        writer.start()
        writer.join(self.fail_s + 0.5)
        current = box.get("current")
        if current is None:  # the store did not answer: report what this rank saw, and that
            current = json.dumps({"reporter": self.rank, "peer": 0 if peer in (-1, self.rank) else peer,
                                  "phase": self.phase, "kind": kind,
                                  "reason": f"{reason}; and the coordination store (hosted by {self.rank_name(0)}) did "
                                            f"not answer within {self.fail_s:.0f} s: {self.rank_name(0)} has died, or "
                                            "this rank is cut off from the network"})
        self._state = "failed"
        self._error = self._error_from(current)
        return self._error

    # -- internals ---------------------------------------------------------------------------------
    def _release(self, key: str, value: str) -> None:
        self._io(lambda: self._store.compare_set(key, "", value))

    def _await(self, key: str, limit_s: float) -> None:
        """Block until ``key`` is set (by the last rank, or by a failure); raise on a failure."""
        try:
            self._store.wait([key], timedelta(seconds=limit_s))
        except Exception as exc:
            if self._error is not None:
                raise self._error from None
            raise self.fail(-1, f"no rank released {key!r} within {limit_s:.0f} s ({exc})") from exc
        if self._io(lambda: self._store.get(key)).decode() != "ok":  # type: ignore[union-attr]
            abort = self._io(lambda: self._store.get("abort")).decode()  # type: ignore[union-attr]
            raise self._error or self._error_from(abort)

    def _hellos(self, store) -> dict[int, tuple[str, int, int]]:
        """Rank -> (digest, world size, generation) of every rank that joined this round so far."""
        if store is self._bg_store:  # the heartbeat never blocks on a key: before anyone joined there are none
            raw = store.get("hellos").decode() if store.check(["hellos"]) else ""
        else:
            raw = self._io(lambda: store.get("hellos")).decode()  # type: ignore[union-attr]
        out: dict[int, tuple[str, int, int]] = {}
        for item in filter(None, raw.split(";")):
            q, digest, world, gen = item.split("|")
            if int(q) in out:
                raise self.fail(int(q), f"{self.rank_name(int(q))} joined the round twice: two processes were "
                                        "started with the same rank", kind="mismatch")
            out[int(q)] = (digest, int(world), int(gen))
        return out

    def _check_agreement(self, hellos: dict[int, tuple[str, int, int]]) -> None:
        present = {q: (v[0], v[1]) for q, v in hellos.items()}
        stray = sorted(q for q in present if q >= self.world_size)
        if len(set(present.values())) <= 1 and not stray:
            return
        common, _ = Counter(present.values()).most_common(1)[0]
        odd = sorted(q for q, key in present.items() if key != common) or stray
        odd_key = present[odd[0]]
        raise self.fail(odd[0], f"rank(s) {_ranks_text(odd)} joined with schedule {odd_key[0]} for {odd_key[1]} ranks "
                                f"but rank(s) {_ranks_text(q for q in present if q not in odd)} with schedule "
                                f"{common[0]} for {common[1]} ranks; every rank must run the same schedule "
                                "(plan once on rank 0 and let WeightSync.connect distribute it)", kind="mismatch")

    def _heartbeat(self) -> None:
        store = self._bg_store
        while not self._stop.wait(self.poll_s):
            try:
                store.set(f"r{self.rank}", self._value(self._state))
                hellos = self._hellos(store) if self._watch_all else None
                watch = [q for q in self.peers if hellos is None or q in hellos]
                values = dict(zip(watch, map(self._parse, store.multi_get([f"r{q}" for q in watch])))) if watch else {}
                abort = store.get("abort").decode()
            except WeightSyncError:
                continue  # recorded by fail(); the calling thread raises it at its next poll or wait
            except Exception as exc:  # the store's host died or this rank is cut off
                if not self._stop.is_set():
                    self._store_lost(_first_line(exc))
                return
            self._answered = time.monotonic()
            if self._error is not None:
                continue
            if abort not in ("", _NO_ABORT):
                self._error = self._error_from(abort)
                continue
            try:
                self._check(values, hellos)
            except WeightSyncError:
                continue

    def _check(self, values: dict[int, tuple[str, str, str, int, int, str]],
               hellos: dict[int, tuple[str, int, int]] | None) -> None:
        now = time.monotonic()
        if hellos is not None:
            self._check_agreement(hellos)
            absent = [q for q in range(self.world_size) if q not in hellos]
            if absent and now - self._started > self.join_timeout_s:
                raise self.fail(absent[0], f"{self.rank_name(absent[0])} never joined the sync within "
                                           f"{self.join_timeout_s:.0f} s ({len(absent)} rank(s) missing: "
                                           f"{_ranks_text(absent)})")
        if self._callback is not None and now - self._callback[1] > self.load_timeout_s:
            what, since = self._callback
            raise self.fail(self.rank, f"{self.rank_name(self.rank)}'s {what} has not returned after "
                                       f"{now - since:.1f} s (load_timeout_s={self.load_timeout_s:.0f})")
        for q, (beat, state, _, _, _, phase) in values.items():
            if q == self.rank or state in ("absent", "done", "failed"):
                continue
            last = self._seen.get(q)
            if last is None or last[0] != beat:
                self._seen[q] = (beat, now)
                continue
            if now - last[1] > self.timeout_s:
                raise self.fail(q, f"{self.rank_name(q)} stopped responding (no heartbeat for {now - last[1]:.1f} s) "
                                   f"while {phase or 'joining'}")

    def _store_lost(self, why: str) -> None:
        self._lost = True
        if self._error is None:
            self._state = "failed"
            self._error = WeightSyncError(
                f"weight sync failed: the coordination store (hosted by {self.rank_name(0)}) stopped answering while "
                f"{self.phase} ({why}): {self.rank_name(0)} has died, or this rank is cut off from the network "
                f"(detected by {self.rank_name(self.rank)})", peer=0, phase=self.phase, reporter=self.rank)

    def _error_from(self, record: str) -> WeightSyncError:
        doc = json.loads(record)
        mine = " (detected here)" if doc["reporter"] == self.rank else f" (detected by {self.rank_name(doc['reporter'])})"
        cls = IntegrityError if doc.get("kind") == "integrity" else WeightSyncError
        return cls(f"weight sync failed: {doc['reason']}{mine}; this rank was {self.phase}",
                   peer=int(doc["peer"]), phase=str(doc["phase"]), reporter=int(doc["reporter"]))
