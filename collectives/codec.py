"""Chunk encoding: pack a block's pieces from local tensors, verify and unpack them on arrival.

A chunk message is a ``uint8`` tensor: a 64-byte header (schedule digest, round, block, chunk,
payload length, checksum, checksum algorithm) followed by the payload, a byte range of the block's
pieces laid end to end (each piece in row-major order of its own shape, in the engine's dtype). A
piece that is contiguous in the local tensor (rows of the first non-unit dimension, in the engine's
dtype) is read or written in place; any other piece -- a column range, or a trainer tensor held in
another dtype (fp32 master weights) -- goes through one piece-sized staging tensor, cast there.
Where a piece sits in a local tensor comes from the rank's runs (:mod:`collectives.sharding`), so
fused, interleaved and padded layouts are read and written row by row where they really are.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from math import prod

import torch

from orchestrl.collectives.checksum import ALGORITHMS, checksum
from orchestrl.collectives.errors import IntegrityError
from orchestrl.collectives.layout import ParamSpec
from orchestrl.collectives.schedule import Schedule
from orchestrl.collectives.sharding import Runs

__all__ = ["HEADER_BYTES", "TORCH_DTYPES", "ParamBuffer", "ChunkCodec"]

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


class ChunkCodec:
    """Packs, verifies and unpacks the chunks of one schedule for one rank."""

    def __init__(self, schedule: Schedule, rank: int, device: torch.device, algorithm: str, round_id: int) -> None:
        self.schedule = schedule
        self.rank = rank
        self.device = device
        self.algorithm = algorithm
        self.round_id = round_id
        self._digest = int(schedule.digest[:12], 16)
        self._offsets = {b.id: _prefix([p.nbytes for p in b.pieces]) for b in schedule.blocks}
        self._packed: dict[int, tuple[int, torch.Tensor]] = {}  # block -> (piece index, contiguous copy)

    def new_buffer(self, block: int, chunk: int) -> torch.Tensor:
        return torch.empty(HEADER_BYTES + self.schedule.chunk_payload(block, chunk), dtype=torch.uint8,
                           device=self.device)

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
        cached = self._packed.get(block)
        if cached is None or cached[0] != i:
            data = buf.narrow(pc.start, pc.stop).to(TORCH_DTYPES[buf.spec.dtype]).contiguous()
            cached = (i, data.reshape(-1).view(torch.uint8))
            self._packed[block] = cached
        return cached[1]

    def snapshot(self, buffers: dict[int, ParamBuffer]) -> dict[int, torch.Tensor]:
        """Copy every block this rank originates into its own payload buffer (cast to the engine dtype).

        What :meth:`pack` then reads instead of the live tensors, so training may change them while
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

    def pack(self, block: int, chunk: int, buffers: dict[int, ParamBuffer],
             snapshots: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Return the chunk message for ``block``/``chunk`` read from this rank's buffers (or snapshot)."""
        msg = self.new_buffer(block, chunk)
        payload = msg[HEADER_BYTES:]
        if snapshots is not None and block in snapshots:
            lo = chunk * self.schedule.chunk_bytes
            payload.copy_(snapshots[block][lo:lo + payload.numel()])
        else:
            for i, pc, off, n, at in self._segments(block, chunk):
                payload[at:at + n].copy_(self._piece_bytes(block, i, buffers[pc.param])[off:off + n])
        self._write_header(msg, block, chunk, checksum(payload, self.algorithm))
        return msg

    def _write_header(self, msg: torch.Tensor, block: int, chunk: int, value: int) -> None:
        words = [self._digest, self.round_id, block, chunk, msg.numel() - HEADER_BYTES, value,
                 ALGORITHMS[self.algorithm], 0]
        msg[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor(words, dtype=torch.int64))

    def verify(self, msg: torch.Tensor, block: int, chunk: int, where: str) -> None:
        """Raise :class:`IntegrityError` unless ``msg`` is the intact chunk ``block``/``chunk``."""
        digest, round_id, b, k, n, value, algo, _ = msg[:HEADER_BYTES].view(torch.int64).tolist()
        expected = (self._digest, self.round_id, block, chunk, msg.numel() - HEADER_BYTES)
        if (digest, round_id, b, k, n) != expected:
            raise IntegrityError(f"{where}: got header (schedule {digest:x}, round {round_id}, block {b}, chunk {k}, "
                                 f"{n} bytes) but expected {expected}", phase=where)
        got = checksum(msg[HEADER_BYTES:], self.algorithm)
        if algo != ALGORITHMS[self.algorithm] or got != value:
            raise IntegrityError(f"{where}: checksum mismatch on block {block} chunk {chunk}: "
                                 f"sender computed {value:x}, received data gives {got:x}", phase=where)

    def unpack(self, msg: torch.Tensor, block: int, chunk: int, buffers: dict[int, ParamBuffer]) -> list[int]:
        """Write a verified chunk into this rank's buffers; return params that became complete."""
        payload = msg[HEADER_BYTES:]
        done = []
        for _, pc, off, n, at in self._segments(block, chunk):
            buf = buffers[pc.param]
            dst = buf.piece_view(pc.start, pc.stop)
            if dst is not None:
                dst[off:off + n].copy_(payload[at:at + n])
            else:
                stage, filled = buf.staging.get(pc.start) or (
                    torch.empty(pc.nbytes, dtype=torch.uint8, device=self.device), 0)
                stage[off:off + n].copy_(payload[at:at + n])
                filled += n
                if filled == pc.nbytes:
                    shape = buf.spec.region_shape(pc.start, pc.stop)
                    buf.narrow(pc.start, pc.stop).copy_(stage.view(buf.tensor.dtype).view(shape))
                    buf.staging.pop(pc.start, None)
                else:
                    buf.staging[pc.start] = (stage, filled)
            buf.missing_bytes -= n
            if buf.missing_bytes == 0:
                done.append(pc.param)
        return done


def _prefix(sizes: list[int]) -> list[int]:
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out
