"""Chunk encoding: pack a block's pieces from local tensors, verify and unpack them on arrival.

A chunk travels as two transfers under one tag: a 64-byte header (schedule digest, round, block,
chunk, payload length, checksum, checksum algorithm) and the payload, a byte range of the block's
pieces laid end to end (each piece in row-major order of its own shape, in the engine's dtype).

Design note: bytes are touched as few times as the layout allows, because on a fast network the
per-byte work of the hosts is what a sync costs (on loopback it is all of it).

* Sending: a chunk that lies in one piece that is contiguous in the local tensor (rows of the first
  non-unit dimension, in the engine's dtype) is sent from the tensor itself; anything else -- a
  column range, a chunk spanning pieces, fp32 master weights cast to bf16 -- is packed once into a
  pooled buffer. The checksum is computed once per chunk and its header reused for every peer the
  rank sends that chunk to.
* Receiving: a chunk that lands in one contiguous place is received straight into it; any other
  into a pooled buffer, then written to where its rows really are (a column range by up to three
  strided copies, no piece-sized staging). Forwarding sends the received bytes on as they are.
* Buffers come from a pool and go back to it when every transfer that uses them is done, so a
  rank's extra memory is the chunks it has in flight, not the model.

Where a piece sits in a local tensor comes from the rank's runs (:mod:`collectives.sharding`), so
fused, interleaved and padded layouts are read and written row by row where they really are.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from math import prod

import torch

from orchestrl.collectives.checksum import ALGORITHMS, checksum
from orchestrl.collectives.errors import IntegrityError
from orchestrl.collectives.layout import ParamSpec
from orchestrl.collectives.schedule import Schedule
from orchestrl.collectives.sharding import Runs

__all__ = ["HEADER_BYTES", "TORCH_DTYPES", "ParamBuffer", "ChunkCodec", "Chunk", "BufferPool"]

HEADER_BYTES = 64

#: ParamSpec dtype name -> torch dtype.
TORCH_DTYPES = {name: getattr(torch, name) for name in
                ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                 "int8", "uint8")}


@dataclass
class ParamBuffer:
    """A rank's local tensor of one parameter, where each canonical row sits in it, what is missing."""

    spec: ParamSpec
    runs: Runs
    tensor: torch.Tensor
    missing_bytes: int = 0
    staging: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)  # piece start -> (buf, filled)
    _index: list[tuple[int, int, int]] = field(default_factory=list, repr=False)  # (lo, hi, local row), by lo

    def __post_init__(self) -> None:
        row = 0
        for lo, hi in self.runs[0]:
            self._index.append((lo, hi, row))
            row += hi - lo
        self._index.sort()

    def local_row(self, start: int, stop: int) -> int:
        """Local row of canonical row ``start``; ``[start, stop)`` must lie inside one run."""
        k = bisect.bisect_right(self._index, (start, float("inf"), 0)) - 1
        lo, hi, row = self._index[k]
        if not lo <= start < stop <= hi:
            raise ValueError(f"{self.spec.name}: rows [{start}, {stop}) are not inside one local run {self.runs}")
        return row + start - lo

    def piece_view(self, start: int, stop: int) -> torch.Tensor | None:
        """Bytes of canonical rows ``[start, stop)`` as a flat uint8 view, or None if not contiguous."""
        if self.tensor.dtype != TORCH_DTYPES[self.spec.dtype]:
            return None  # held in another dtype: cast through staging
        flat = self.tensor.reshape(-1).view(torch.uint8)
        runs, pad = self.runs
        if pad == 0 and len(runs) == 1 and runs[0] == (start, stop):
            return flat
        d = self.spec.split_dim
        if (prod(self.spec.shape[:d]) if self.spec.shape else 1) != 1:
            return None
        rb = self.spec.row_bytes
        row = self.local_row(start, stop)
        return flat[row * rb:(row + stop - start) * rb]

    def narrow(self, start: int, stop: int) -> torch.Tensor:
        """The local tensor's rows holding canonical rows ``[start, stop)``."""
        return self.tensor.narrow(self.spec.split_dim, self.local_row(start, stop), stop - start)


class BufferPool:
    """Reusable ``uint8`` buffers by size, so steady-state chunk traffic allocates nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made (for tests and reports)

    def get(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                return free.pop()
            self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def put(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.setdefault(buf.numel(), []).append(buf)


@dataclass
class Chunk:
    """One chunk in flight: its header and payload tensors, and whether the payload is a pooled buffer."""

    header: torch.Tensor
    payload: torch.Tensor
    pooled: bool  # False: a view of a local tensor or snapshot (never handed back to the pool)

    @property
    def nbytes(self) -> int:
        return self.header.numel() + self.payload.numel()


class ChunkCodec:
    """Packs, verifies and unpacks the chunks of one schedule for one rank (see the module note)."""

    def __init__(self, schedule: Schedule, rank: int, device: torch.device, algorithm: str, round_id: int) -> None:
        self.schedule = schedule
        self.rank = rank
        self.device = device
        self.algorithm = algorithm
        self.round_id = round_id
        self._digest = int(schedule.digest[:12], 16)
        self._offsets = {b.id: _prefix([p.nbytes for p in b.pieces]) for b in schedule.blocks}
        self._packed: dict[int, tuple[int, torch.Tensor]] = {}  # block -> (piece index, contiguous copy)
        self.pool = BufferPool(device)
        self._outgoing: dict[tuple[int, int], list] = {}  # (block, chunk) -> [Chunk, sends left]
        self._lock = threading.Lock()
        self._fanout: dict[tuple[int, int], int] = {}
        for _, ops in schedule.program(rank):
            for op in ops:
                if op.kind == "send" and not op.forward:
                    key = (op.block, op.chunk)
                    self._fanout[key] = self._fanout.get(key, 0) + 1

    def _segments(self, block: int, chunk: int):
        """Yield (piece index, piece, offset in piece, length, offset in payload)."""
        pieces = self.schedule.blocks[block].pieces
        offsets = self._offsets[block]
        lo = chunk * self.schedule.chunk_bytes
        hi = lo + self.schedule.chunk_payload(block, chunk)
        i = bisect.bisect_right(offsets, lo) - 1
        while i < len(pieces) and offsets[i] < hi:
            a = max(lo, offsets[i])
            b = min(hi, offsets[i] + pieces[i].nbytes)
            yield i, pieces[i], a - offsets[i], b - a, a - lo
            i += 1

    def _piece_bytes(self, block: int, i: int, buf: ParamBuffer) -> torch.Tensor:
        """Piece ``i`` of ``block`` as contiguous bytes in the engine's dtype (cached for the next chunk)."""
        pc = self.schedule.blocks[block].pieces[i]
        src = buf.piece_view(pc.start, pc.stop)
        if src is not None:
            return src
        with self._lock:
            cached = self._packed.get(block)
            if cached is None or cached[0] != i:
                data = buf.narrow(pc.start, pc.stop).to(TORCH_DTYPES[buf.spec.dtype]).contiguous()
                cached = (i, data.reshape(-1).view(torch.uint8))
                self._packed[block] = cached
        return cached[1]

    def snapshot(self, buffers: dict[int, ParamBuffer]) -> dict[int, torch.Tensor]:
        """Copy every block this rank originates into its own payload buffer (cast to the engine dtype).

        What :meth:`outgoing` then reads instead of the live tensors, so training may change them while
        the sync runs; memory is the bytes this rank sends, about its shard of the model.
        """
        out: dict[int, torch.Tensor] = {}
        for b in self.schedule.blocks:
            if b.origin != self.rank:
                continue
            payload = torch.empty(b.nbytes, dtype=torch.uint8, device=self.device)
            at = 0
            for i, pc in enumerate(b.pieces):
                payload[at:at + pc.nbytes].copy_(self._piece_bytes(b.id, i, buffers[pc.param]))
                at += pc.nbytes
            self._packed.pop(b.id, None)
            out[b.id] = payload
        return out

    # -- sending ------------------------------------------------------------------------------------
    def outgoing(self, block: int, chunk: int, buffers: dict[int, ParamBuffer],
                 snapshots: dict[int, torch.Tensor] | None = None) -> Chunk:
        """The chunk this rank originates for ``block``/``chunk``: made once, shared by every peer it goes to."""
        key = (block, chunk)
        with self._lock:
            entry = self._outgoing.get(key)
            if entry is not None:
                return entry[0]
        n = self.schedule.chunk_payload(block, chunk)
        lo = chunk * self.schedule.chunk_bytes
        pooled = False
        if snapshots is not None and block in snapshots:
            payload = snapshots[block][lo:lo + n]
        else:
            segs = list(self._segments(block, chunk))
            if len(segs) == 1:  # inside one piece: its contiguous bytes, no copy
                i, pc, off, length, _ = segs[0]
                payload = self._piece_bytes(block, i, buffers[pc.param])[off:off + length]
            else:
                payload, pooled = self.pool.get(n), True
                for i, pc, off, length, at in segs:
                    payload[at:at + length].copy_(self._piece_bytes(block, i, buffers[pc.param])[off:off + length])
        out = Chunk(self._header(block, chunk, n, checksum(payload, self.algorithm)), payload, pooled)
        with self._lock:
            self._outgoing[key] = [out, self._fanout.get(key, 1)]
        return out

    def sent(self, block: int, chunk: int) -> None:
        """One send of this rank's own chunk is done; the last one frees it."""
        with self._lock:
            entry = self._outgoing.get((block, chunk))
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._outgoing[(block, chunk)]
        if entry[0].pooled:
            self.pool.put(entry[0].payload)

    def _header(self, block: int, chunk: int, nbytes: int, value: int) -> torch.Tensor:
        words = [self._digest, self.round_id, block, chunk, nbytes, value, ALGORITHMS[self.algorithm], 0]
        return torch.tensor(words, dtype=torch.int64).view(torch.uint8).to(self.device)

    # -- receiving ----------------------------------------------------------------------------------
    def incoming(self, block: int, chunk: int, buffers: dict[int, ParamBuffer]) -> Chunk:
        """Where chunk ``block``/``chunk`` is received: straight into its one contiguous place, or a pooled buffer."""
        header = torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device)
        segs = list(self._segments(block, chunk))
        if len(segs) == 1:
            _, pc, off, length, _ = segs[0]
            dst = buffers[pc.param].piece_view(pc.start, pc.stop)
            if dst is not None:
                return Chunk(header, dst[off:off + length], False)
        return Chunk(header, self.pool.get(self.schedule.chunk_payload(block, chunk)), True)

    def verify(self, msg: Chunk, block: int, chunk: int, where: str) -> None:
        """Raise :class:`IntegrityError` unless ``msg`` is the intact chunk ``block``/``chunk``."""
        digest, round_id, b, k, n, value, algo, _ = msg.header.view(torch.int64).tolist()
        expected = (self._digest, self.round_id, block, chunk, msg.payload.numel())
        if (digest, round_id, b, k, n) != expected:
            raise IntegrityError(f"{where}: got header (schedule {digest:x}, round {round_id}, block {b}, chunk {k}, "
                                 f"{n} bytes) but expected {expected}", phase=where)
        got = checksum(msg.payload, self.algorithm)
        if algo != ALGORITHMS[self.algorithm] or got != value:
            raise IntegrityError(f"{where}: checksum mismatch on block {block} chunk {chunk}: "
                                 f"sender computed {value:x}, received data gives {got:x}", phase=where)

    def unpack(self, msg: Chunk, block: int, chunk: int, buffers: dict[int, ParamBuffer]) -> None:
        """Write a verified chunk into this rank's buffers (unless it was received there).

        Chunks touch disjoint bytes, so several streams unpack at once; only a piece assembled in
        staging (a region of more than two dimensions) takes the codec's lock.
        """
        if not msg.pooled:
            return
        payload = msg.payload
        for _, pc, off, n, at in self._segments(block, chunk):
            self._write(buffers[pc.param], pc, off, n, payload[at:at + n])

    def account(self, block: int, chunk: int, buffers: dict[int, ParamBuffer]) -> list[int]:
        """Count chunk ``block``/``chunk`` as arrived; return the params it completed (call under one lock)."""
        done = []
        for _, pc, _, n, _ in self._segments(block, chunk):
            buf = buffers[pc.param]
            buf.missing_bytes -= n
            if buf.missing_bytes == 0:
                done.append(pc.param)
        return done

    def release(self, msg: Chunk) -> None:
        """Give a received chunk's buffer back once nothing needs it (unpacked, forwarded to every child)."""
        if msg.pooled:
            self.pool.put(msg.payload)

    def _write(self, buf: ParamBuffer, pc, off: int, n: int, src: torch.Tensor) -> None:
        """Write bytes ``[off, off + n)`` of piece ``pc`` (its row-major bytes) to where they sit in ``buf``."""
        dst = buf.piece_view(pc.start, pc.stop)
        if dst is not None:
            dst[off:off + n].copy_(src)
            return
        region = buf.narrow(pc.start, pc.stop)
        item = region.element_size()
        if region.dim() == 2 and region.stride(1) == 1 and off % item == 0 and n % item == 0 \
                and region.dtype == TORCH_DTYPES[buf.spec.dtype]:
            _write_rows(region, off // item, src.view(region.dtype))
            return
        # anything else (a region of more dimensions): assemble the piece in staging, write it when complete
        with self._lock:
            stage, filled = buf.staging.get(pc.start) or (
                torch.empty(pc.nbytes, dtype=torch.uint8, device=self.device), 0)
            stage[off:off + n].copy_(src)
            filled += n
            if filled == pc.nbytes:
                shape = buf.spec.region_shape(pc.start, pc.stop)
                region.copy_(stage.view(buf.tensor.dtype).view(shape))
                buf.staging.pop(pc.start, None)
            else:
                buf.staging[pc.start] = (stage, filled)


def _write_rows(region: torch.Tensor, first: int, values: torch.Tensor) -> None:
    """Write ``values`` (elements ``first...`` of ``region`` in row-major order) into the 2-D strided ``region``."""
    cols = region.shape[1]
    e, v = first, 0
    total = values.numel()
    if e % cols:  # the rest of a row begun by an earlier chunk
        r, c = divmod(e, cols)
        k = min(cols - c, total)
        region[r, c:c + k].copy_(values[:k])
        e, v = e + k, k
    rows = (total - v) // cols
    if rows:
        r = e // cols
        region[r:r + rows].copy_(values[v:v + rows * cols].view(rows, cols))
        e, v = e + rows * cols, v + rows * cols
    if v < total:  # the start of a row the next chunk finishes
        r = e // cols
        region[r, :total - v].copy_(values[v:])


def _prefix(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out
