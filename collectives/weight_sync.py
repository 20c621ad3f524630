"""Run a weight-sync schedule on a transport: the API trainers and generation engines call.

Design note
-----------
Each rank walks its own steps of the schedule (:meth:`collectives.schedule.Schedule.program`). In a
step it posts every receive, packs or forwards every send, then waits for all of them; chunks
received in step ``s`` are verified (header and checksum) and written to the rank's tensors, and
forwarded unchanged in step ``s + 1``. So a rank holds at most two steps of chunk buffers
(double buffering) besides its own parameter slices, and a slice streams down a Phase B tree while
it is still arriving.

Transport waits block and cannot be interrupted, so they run on a helper thread while the calling
thread keeps heartbeating through :class:`collectives.liveness.Liveness`; a dead or stalled peer,
a checksum mismatch or a failed transfer anywhere ends the sync on every rank within
``timeout_s`` with a :class:`WeightSyncError` naming the peer and the phase. After such an error
the transport must be discarded (a wait may still be pending on it).

Usage (trainer rank, generator rank)::

    sync = WeightSync(schedule, transport, timeout_s=60)
    sync.send(model.named_parameters())                 # trainer: its own TP/PP shards, by name
    sync.receive(load_weights=engine.load_weights)      # generator: called with [(name, tensor)]
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from collectives.codec import TORCH_DTYPES, ChunkCodec, ParamBuffer
from collectives.errors import WeightSyncError
from collectives.liveness import Liveness
from collectives.schedule import Op, Schedule

__all__ = ["SyncReport", "WeightSync", "LoadWeights"]

#: Receiver callback: gets ``[(name, tensor)]`` for parameters whose slice is complete.
LoadWeights = Callable[[list[tuple[str, torch.Tensor]]], None]


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

    @property
    def elapsed_s(self) -> float:
        return self.finished_at - self.started_at


class WeightSync:
    """Executes a :class:`Schedule` for one rank over a transport.

    Parameters
    ----------
    schedule : Schedule
        The same schedule on every rank (checked by digest when a round starts).
    transport : Transport
        Point-to-point transport for this rank (``transport.rank`` is the schedule rank).
    timeout_s : float
        Liveness timeout: a peer that stops heartbeating (dead, stopped, hung) for this long fails the
        sync on every rank. Give the transport a longer timeout (2x is the convention here): its
        timeout bounds a transfer that makes no progress while every process is alive, and a shorter
        one would blame the live rank waiting behind a dead one instead of the dead one.
    """

    def __init__(self, schedule: Schedule, transport, *, timeout_s: float = 60.0, trace: bool = False) -> None:
        if transport.world_size != schedule.world_size:
            raise ValueError(f"transport has {transport.world_size} ranks but the schedule needs "
                             f"{schedule.world_size} ({schedule.trainer.world_size} trainers + "
                             f"{schedule.generator.world_size} generators)")
        self.schedule = schedule
        self.transport = transport
        self.rank = transport.rank
        self.timeout_s = float(timeout_s)
        self.trace = trace  # record per-step timings in the report
        self._round = 0
        self._program = schedule.program(self.rank)
        self._origin_params = {pc.param for b in schedule.blocks if b.origin == self.rank for pc in b.pieces}
        self._jobs: "queue.Queue[tuple[list, threading.Event, list]]" = queue.Queue()
        threading.Thread(target=self._waiter, name=f"weight-sync-wait-{self.rank}", daemon=True).start()

    # -- public API ----------------------------------------------------------------------------
    def send(self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> SyncReport:
        """Trainer side: send this rank's shards (its TP slice of its PP stage's parameters).

        ``named_params`` is what ``model.named_parameters()`` yields, already in the schedule's naming;
        only parameters this rank holds are looked up, and nothing is copied unless a tensor is not
        contiguous.
        """
        if not self.schedule.is_trainer(self.rank):
            raise ValueError(f"{self.schedule.rank_name(self.rank)} receives; call receive()")
        items = named_params.items() if isinstance(named_params, Mapping) else named_params
        return self._run(dict(items), None, None)

    def receive(self, load_weights: LoadWeights | None = None, *,
                into: Mapping[str, torch.Tensor] | None = None) -> SyncReport:
        """Generator side: receive this rank's slices, forwarding chunks down the schedule's trees.

        Parameters
        ----------
        load_weights : callable, optional
            Called with ``[(name, tensor)]`` as soon as a parameter's slice is complete and verified
            (e.g. a wrapper around the engine's loader); the tensor is released afterwards.
        into : mapping name -> tensor, optional
            Pre-allocated destination tensors (e.g. the engine's own parameters) written in place.
        """
        if self.schedule.is_trainer(self.rank):
            raise ValueError(f"{self.schedule.rank_name(self.rank)} sends; call send()")
        return self._run({}, load_weights, into)

    # -- execution -----------------------------------------------------------------------------
    def _run(self, local: dict[str, torch.Tensor], load_weights: LoadWeights | None,
             into: Mapping[str, torch.Tensor] | None) -> SyncReport:
        sch, rank = self.schedule, self.rank
        self._round += 1
        store = _prefixed(self.transport.store, f"round/{self._round}/")
        live = Liveness(store, rank, sch.world_size, sch.digest, self.timeout_s, sch.rank_name)
        live.join()
        try:
            buffers = self._buffers(local, into)
            stats = _Stats(started=time.time())
            forwarded: dict[tuple[int, int], torch.Tensor] = {}
            codec = ChunkCodec(sch, rank, self.transport.device, self.transport.checksum, self._round)
            for step, ops in self._program:
                forwarded = self._step(step, ops, live, codec, buffers, forwarded, stats, load_weights, into)
            missing = [sch.params[p].name for p, b in buffers.items() if b.missing_bytes]
            if missing:
                raise live.fail(rank, f"{sch.rank_name(rank)} ended without {len(missing)} parameter slice(s) "
                                      f"(first: {missing[0]!r}); the schedule does not cover its layout")
        except WeightSyncError:
            raise
        except Exception as exc:  # a bad argument or a failing load_weights: end the round everywhere
            raise live.fail(rank, f"{sch.rank_name(rank)} raised {type(exc).__name__}: {exc}") from exc
        data_done = time.time()
        live.finish()
        return SyncReport(rank, "trainer" if sch.is_trainer(rank) else "generator", stats.started, data_done,
                          time.time(), stats.sent, stats.received, stats.verified, stats.loaded, True,
                          tuple(stats.trace))

    def _step(self, step: int, ops: list[Op], live: Liveness, codec: ChunkCodec, buffers: dict[int, ParamBuffer],
              forwarded: dict[tuple[int, int], torch.Tensor], stats: "_Stats", load_weights: LoadWeights | None,
              into: Mapping[str, torch.Tensor] | None) -> dict[tuple[int, int], torch.Tensor]:
        """Post every op of one step, wait for all, then verify and store what arrived (returned for forwarding)."""
        arrived: dict[tuple[int, int], torch.Tensor] = {}
        works, labels, outgoing = [], [], []  # outgoing keeps packed messages alive until sent
        for op in ops:
            label = self._label(op, step)
            live.poll(label)
            if op.kind == "recv":
                msg = codec.new_buffer(op.block, op.chunk)
                arrived[(op.block, op.chunk)] = msg
                post = self.transport.irecv
            else:
                msg = forwarded[(op.block, op.chunk)] if op.forward else codec.pack(op.block, op.chunk, buffers)
                outgoing.append(msg)
                stats.sent += msg.numel()
                post = self.transport.isend
            try:
                works.append(post(msg, op.peer, op.block))
            except Exception as exc:
                raise live.fail(op.peer, f"{label} could not start: {_short(exc)}") from exc
            labels.append((op, label))
        posted = time.time()
        self._wait(live, works, labels)
        if self.trace:
            stats.trace.append((step, posted, time.time()))
        for op, label in labels:
            if op.kind != "recv":
                continue
            msg = arrived[(op.block, op.chunk)]
            try:
                codec.verify(msg, op.block, op.chunk, label)
            except WeightSyncError as exc:
                raise live.fail(op.peer, str(exc)) from exc
            stats.received += msg.numel()
            stats.verified += 1
            for p in codec.unpack(msg, op.block, op.chunk, buffers):
                stats.loaded += self._complete(p, buffers, load_weights, into)
        return arrived

    def _buffers(self, local: dict[str, torch.Tensor], into: Mapping[str, torch.Tensor] | None) -> dict[int, ParamBuffer]:
        """This rank's tensor per parameter region it sends from or receives into."""
        sch, rank = self.schedule, self.rank
        out: dict[int, ParamBuffer] = {}
        for i, spec in enumerate(sch.params):
            region = sch.region(rank, i)
            if region is None:
                continue
            lo, hi = region
            shape = spec.region_shape(lo, hi)
            init = sch.initial_region(rank, i)
            tensor = None
            if init is not None:
                given = local.get(spec.name)
                init_shape = spec.region_shape(*init)
                if given is None or tuple(given.shape) != init_shape or str(given.dtype) != f"torch.{spec.dtype}":
                    got = "nothing" if given is None else f"{tuple(given.shape)} {given.dtype}"
                    raise ValueError(f"{sch.rank_name(rank)}: parameter {spec.name!r} must be its local shard of shape "
                                     f"{init_shape} and dtype {spec.dtype}, got {got}")
                given = given.detach()
                if init == region:
                    tensor = given.contiguous()
                else:  # holds more at the end than it brings (flat baseline's gathering rank)
                    tensor = torch.empty(shape, dtype=given.dtype, device=self.transport.device)
                    tensor.narrow(spec.split_dim, init[0] - lo, init[1] - init[0]).copy_(given)
            elif into is not None and spec.name in into:
                tensor = into[spec.name]
                if tuple(tensor.shape) != shape or not tensor.is_contiguous():
                    raise ValueError(f"into[{spec.name!r}] must be a contiguous tensor of shape {shape}, "
                                     f"got {tuple(tensor.shape)}")
            missing = (hi - lo) * spec.row_bytes - ((init[1] - init[0]) * spec.row_bytes if init else 0)
            if tensor is None:
                tensor = torch.empty(shape, dtype=TORCH_DTYPES[spec.dtype], device=self.transport.device)
            out[i] = ParamBuffer(spec, lo, hi, tensor, missing)
        return out

    def _complete(self, p: int, buffers: dict[int, ParamBuffer], load_weights: LoadWeights | None,
                  into: Mapping[str, torch.Tensor] | None) -> int:
        buf = buffers[p]
        if load_weights is not None:
            load_weights([(buf.spec.name, buf.tensor)])
        if into is None and p not in self._origin_params:
            buf.tensor = buf.tensor.new_empty(0)  # release: a rank forwards chunks, not tensors
        return 1

    def _label(self, op: Op, step: int) -> str:
        sch = self.schedule
        verb = "sending" if op.kind == "send" else "receiving"
        prep = "to" if op.kind == "send" else "from"
        return (f"phase {op.phase}: {verb} block {op.block} chunk {op.chunk + 1}/{sch.chunks(op.block)} "
                f"{prep} {sch.rank_name(op.peer)} (step {step})")

    def _wait(self, live: Liveness, works: list, labels: list) -> None:
        done = threading.Event()
        result: list = []
        self._jobs.put((works, done, result))
        summary = (labels[0][1] if labels else "idle") + (f" and {len(labels) - 1} more transfer(s)"
                                                          if len(labels) > 1 else "")
        while not done.wait(0.05):
            live.poll(summary)
        if result:
            idx, exc = result[0]
            op, label = labels[idx]
            raise live.fail(op.peer, f"{label} failed: {_short(exc)}") from exc

    def _waiter(self) -> None:
        while True:
            works, done, result = self._jobs.get()
            for i, w in enumerate(works):
                try:
                    w.wait()
                except Exception as exc:  # reported by the calling thread, which names peer and phase
                    result.append((i, exc))
                    break
            done.set()


@dataclass
class _Stats:
    """Counters of one round on one rank."""

    started: float
    sent: int = 0
    received: int = 0
    verified: int = 0
    loaded: int = 0
    trace: list[tuple[int, float, float]] = field(default_factory=list)


def _short(exc: BaseException) -> str:
    """The transport's message without source paths and boilerplate advice."""
    text = re.sub(r"\[/[^\]]*\] ?", "", str(exc)).split(" This is typically")[0].strip()
    return text or type(exc).__name__


def _prefixed(store, prefix: str):
    from torch.distributed import PrefixStore
    return PrefixStore(prefix, store)
