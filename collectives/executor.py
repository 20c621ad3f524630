"""Execute one rank's part of a schedule as one stream per peer (the data path of :mod:`weight_sync`).

Design note
-----------
A schedule orders a rank's chunk transfers by *step* (:meth:`Schedule.program`). Running it step by
step -- post a step's sends and receives, wait for all of them, go on -- idles every link for the
slowest transfer of each step, and the loss adds up where links are evenly loaded (a chain or a
tree at the NIC rate loses ~20% that way). Here each peer instead gets its own *stream*: a thread
that walks the rank's transfers with that peer in program order, keeping ``window`` of them posted
at once, so every link stays busy on its own:

* a receive is posted ahead, verified (header, checksum) on arrival and unpacked into the rank's
  tensors, and the chunk is kept only until every stream that forwards it has sent it on;
* a send of the rank's own data is packed when posted; a forwarded send waits until its chunk
  has arrived.

Both ends of a pair walk the same sequence of transfers (the schedule orders each pair's transfers
identically on both sides), so they always match. A stream never posts a transfer more than
``lookahead`` steps past the oldest unfinished transfer of any stream of its rank: the globally
oldest unfinished transfer then always has its inputs and its partner ready, so the streams cannot
deadlock, and a rank holds at most ``lookahead`` steps of chunks however slow one child is.

Errors in a stream stop every stream of the rank; the calling thread keeps heartbeating
(:class:`collectives.liveness.Liveness`) and turns the first error into the round's failure.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Callable

import torch

from orchestrl.collectives.codec import Chunk, ChunkCodec, ParamBuffer
from orchestrl.collectives.errors import IntegrityError
from orchestrl.collectives.liveness import Liveness
from orchestrl.collectives.schedule import Op, Schedule

__all__ = ["StreamExecutor", "Loader", "LoadWeights"]

#: Receiver callback: gets ``[(name, tensor)]`` for parameters whose slice is complete.
LoadWeights = Callable[[list[tuple[str, torch.Tensor]]], None]

_INF = float("inf")


class _Arrival:
    """A received chunk kept for the streams that forward it."""

    __slots__ = ("msg", "forwards")

    def __init__(self, forwards: int) -> None:
        self.msg: Chunk | None = None
        self.forwards = forwards


class _Both:
    """The header's and the payload's transfers of one chunk, waited for together."""

    __slots__ = ("header", "payload")

    def __init__(self, header, payload) -> None:
        self.header, self.payload = header, payload

    def wait(self) -> None:
        self.header.wait()
        self.payload.wait()


class StreamExecutor:
    """Runs ``rank``'s transfers of ``schedule`` as per-peer streams; see the module note.

    Parameters
    ----------
    schedule, rank
        The schedule and the rank executing it.
    transport
        Point-to-point transport (connections to every peer prepared).
    codec, buffers, snapshots
        Packing and unpacking of chunks, this rank's tensors, and snapshots for asynchronous sends.
    on_complete : callable
        Called with ``(param index, buffer)`` when a parameter's slice is complete (under a lock).
    label : callable
        ``(op, step) -> str`` describing a transfer for messages.
    window : int
        Transfers a stream keeps posted at once.
    lookahead : int
        Steps a stream may run ahead of the rank's oldest unfinished transfer (bounds memory).
    """

    def __init__(self, schedule: Schedule, rank: int, transport, codec: ChunkCodec, buffers: dict[int, ParamBuffer],
                 snapshots: dict | None, on_complete: Callable[[int, ParamBuffer], None],
                 label: Callable[[Op, int], str], *, window: int = 2, lookahead: int = 4, trace: bool = False) -> None:
        self.schedule = schedule
        self.rank = rank
        self.transport = transport
        self.codec = codec
        self.buffers = buffers
        self.snapshots = snapshots
        self.on_complete = on_complete
        self.label = label
        self.window = max(1, window)
        self.lookahead = max(1, lookahead)
        self.trace = trace
        self.sent = self.received = self.verified = 0
        self.step_times: list[tuple[int, float, float]] = []
        self.error: tuple[BaseException, int, str] | None = None  # (exception, peer to blame, label)
        self._streams: dict[int, list[tuple[int, Op]]] = {}
        forwards: dict[tuple[int, int], int] = {}
        for step, ops in schedule.program(rank):
            for op in ops:
                self._streams.setdefault(op.peer, []).append((step, op))
                if op.kind == "send" and op.forward:
                    forwards[(op.block, op.chunk)] = forwards.get((op.block, op.chunk), 0) + 1
        self._arrivals = {key: _Arrival(n) for key, n in forwards.items()}
        # A rank that both receives into its tensors and packs from them (the flat baseline's gathering
        # rank) packs a chunk only once every earlier transfer of its own is done.
        kinds = {(op.kind, op.forward) for ops in self._streams.values() for _, op in ops}
        self._pack_in_order = ("recv", False) in kinds and ("send", False) in kinds
        self._oldest = {peer: ops[0][0] for peer, ops in self._streams.items()}  # oldest unfinished step
        self._current: dict[int, str] = {}  # peer -> what its stream is doing (for liveness messages)
        self._cv = threading.Condition()
        self._unpack = threading.Lock()
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._running = len(self._streams)
        self._all_done = threading.Event()
        if not self._running:
            self._all_done.set()

    @property
    def peers(self) -> list[int]:
        return sorted(self._streams)

    # -- driver (calling thread) -------------------------------------------------------------------
    def run(self, live: Liveness, check: Callable[[], None] | None = None) -> None:
        """Run every stream to completion; raise :class:`WeightSyncError` on the first failure anywhere.

        ``check`` is called between heartbeats (e.g. to raise a failing ``load_weights``).
        """
        self._threads = [threading.Thread(target=self._stream, args=(peer,), name=f"weight-sync-{self.rank}-{peer}",
                                          daemon=True) for peer in self._streams]
        for t in self._threads:
            t.start()
        try:
            while True:
                done = self._all_done.wait(0.05)
                if self.error is not None:
                    exc, peer, label = self.error
                    kind = "integrity" if isinstance(exc, IntegrityError) else "failure"
                    text = str(exc) if isinstance(exc, IntegrityError) else f"{label} failed: {_short(exc)}"
                    raise live.fail(peer, text, kind=kind) from exc
                if check is not None:
                    check()
                if done:
                    return
                live.poll(self.describe())
        except BaseException:
            self.stop()
            raise

    def join(self, timeout_s: float) -> bool:
        """Wait for every stream thread to end (after :meth:`stop` and a transport reset); True if they did."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def idle(self) -> bool:
        """True when no stream thread is running (none is blocked inside the transport)."""
        return not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """Ask every stream to stop at its next transfer (pending waits end when the transport resets)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    def describe(self) -> str:
        """What the slowest stream is doing, for heartbeats and failure messages."""
        with self._cv:
            if not self._oldest:
                return "streaming"
            peer = min(self._oldest, key=lambda p: (self._oldest[p], p))
            busy = sum(1 for s in self._oldest.values() if s < _INF)
            doing = self._current.get(peer, f"waiting on {self.schedule.rank_name(peer)}")
        return doing + (f" and {busy - 1} more stream(s)" if busy > 1 else "")

    # -- streams --------------------------------------------------------------------------------------
    def _horizon(self) -> float:
        return min(self._oldest.values()) + self.lookahead

    def _stream(self, peer: int) -> None:
        ops = self._streams[peer]
        posted: deque = deque()
        i = 0
        label = ""
        try:
            while i < len(ops) or posted:
                while i < len(ops) and len(posted) < self.window:
                    step, op = ops[i]
                    if not self._can_post(step, op, block=not posted):
                        break
                    label = self.label(op, step)
                    self._current[peer] = label
                    msg = self._prepare(op)
                    post = self.transport.irecv if op.kind == "recv" else self.transport.isend
                    # header then payload under one tag: both ends post them in this order, so they match
                    work = _Both(post(msg.header, peer, op.block), post(msg.payload, peer, op.block))
                    posted.append((step, op, work, msg, label, time.time()))
                    i += 1
                if self._stop:
                    return
                if not posted:
                    continue
                step, op, work, msg, label, t_post = posted.popleft()
                self._current[peer] = label
                work.wait()
                if self.trace:
                    self.step_times.append((step, t_post, time.time()))
                self._finish(op, msg, label)
                with self._cv:
                    self._oldest[peer] = posted[0][0] if posted else (ops[i][0] if i < len(ops) else _INF)
                    self._cv.notify_all()
        except BaseException as exc:  # reported by the driver, which names the peer and the transfer
            with self._cv:
                if self.error is None and not self._stop:
                    self.error = (exc, peer, label)
                self._stop = True
                self._cv.notify_all()
        finally:
            with self._cv:
                self._oldest[peer] = _INF
                self._running -= 1
                if self._running == 0:
                    self._all_done.set()
                self._cv.notify_all()

    def _can_post(self, step: int, op: Op, block: bool) -> bool:
        """Whether ``op`` may be posted now; with ``block``, wait until it may (or the streams stop)."""
        with self._cv:
            while True:
                if self._stop:
                    return False
                if op.kind == "recv":
                    ready = step <= self._horizon()
                elif op.forward:
                    ready = step <= self._horizon() and self._arrivals[(op.block, op.chunk)].msg is not None
                else:
                    ready = step <= (min(self._oldest.values()) if self._pack_in_order else self._horizon())
                if ready or not block:
                    return ready
                self._cv.wait(0.1)

    def _prepare(self, op: Op) -> Chunk:
        if op.kind == "recv":
            return self.codec.incoming(op.block, op.chunk, self.buffers)
        if op.forward:
            msg = self._arrivals[(op.block, op.chunk)].msg
            assert msg is not None
            return msg
        return self.codec.outgoing(op.block, op.chunk, self.buffers, self.snapshots)

    def _finish(self, op: Op, msg: Chunk, label: str) -> None:
        key = (op.block, op.chunk)
        if op.kind == "send":
            with self._unpack:
                self.sent += msg.nbytes
            if not op.forward:
                self.codec.sent(op.block, op.chunk)
                return
            with self._cv:
                arrival = self._arrivals[key]
                arrival.forwards -= 1
                if arrival.forwards == 0:
                    arrival.msg = None  # every child has it: the buffer goes back to the pool
                    self.codec.release(msg)
            return
        self.codec.verify(msg, op.block, op.chunk, label)  # raises IntegrityError, blamed on the sender
        self.codec.unpack(msg, op.block, op.chunk, self.buffers)  # copies outside the lock: streams in parallel
        with self._unpack:
            self.received += msg.nbytes
            self.verified += 1
            for p in self.codec.account(op.block, op.chunk, self.buffers):
                self.on_complete(p, self.buffers[p])
        if key in self._arrivals:
            with self._cv:
                self._arrivals[key].msg = msg
                self._cv.notify_all()
        else:
            self.codec.release(msg)


class Loader:
    """Hands completed parameters to ``load_weights`` on its own thread, in completion order."""

    def __init__(self, fn: LoadWeights | None, live: Liveness, schedule: Schedule,
                 targets: dict[int, list[torch.Tensor]], keep: bool) -> None:
        self.fn = fn
        self.live = live
        self.schedule = schedule
        self.targets = targets
        self.keep = keep  # trainers keep their tensors (they are the caller's)
        self.loaded = 0
        self.error: BaseException | None = None
        self._queue: "queue.Queue[tuple[int, ParamBuffer] | None]" = queue.Queue()
        self._thread: threading.Thread | None = None

    def complete(self, p: int, buf: ParamBuffer) -> None:
        for extra in self.targets.get(p, [])[1:]:  # an alias the engine keeps as a separate tensor
            extra.copy_(buf.tensor)
        if self.fn is None:
            self.loaded += 1
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="weight-sync-load", daemon=True)
            self._thread.start()
        self._queue.put((p, buf))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            p, buf = item
            spec = self.schedule.params[p]
            self.live.callback_started(f"load_weights({spec.name!r})")
            try:
                self.fn([(name, buf.tensor) for name in spec.names])  # type: ignore[misc]
                self.loaded += 1
            except BaseException as exc:  # reported by the executing thread
                self.error = exc
                return
            finally:
                self.live.callback_done()
            if p not in self.targets and not self.keep:
                buf.tensor = buf.tensor.new_empty(0)  # release: a rank forwards chunks, not tensors

    def check(self) -> None:
        if self.error is not None:
            raise self.live.fail(self.live.rank, f"{self.schedule.rank_name(self.live.rank)}'s load_weights raised "
                                                 f"{type(self.error).__name__}: {self.error}")

    def drain(self) -> None:
        """Wait (heartbeating) until every queued parameter was loaded."""
        if self._thread is not None:
            self._queue.put(None)
            while self._thread.is_alive():
                self._thread.join(0.05)
                self.live.poll("waiting for load_weights to finish")
        self.check()


def _short(exc: BaseException) -> str:
    """The transport's message without source paths and boilerplate advice."""
    import re

    text = re.sub(r"\[/[^\]]*\] ?", "", str(exc)).split(" This is typically")[0].strip()
    return text or type(exc).__name__
