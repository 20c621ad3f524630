"""Chunk encoding: pack a block's pieces from local tensors, verify and unpack them on arrival.

A chunk message is a ``uint8`` tensor: a 64-byte header (schedule digest, round, block, chunk,
payload length, checksum, checksum algorithm) followed by the payload, a byte range of the block's
pieces laid end to end (each piece in row-major order of its own shape). A piece that is
contiguous in the local tensor (a slice along the first non-unit dimension, or the whole tensor) is
read or written in place; any other piece goes through one piece-sized staging tensor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from math import prod

import torch

from collectives.checksum import ALGORITHMS, checksum
from collectives.errors import IntegrityError
from collectives.layout import ParamSpec
from collectives.schedule import Schedule

__all__ = ["HEADER_BYTES", "TORCH_DTYPES", "ParamBuffer", "ChunkCodec"]

HEADER_BYTES = 64

#: ParamSpec dtype name -> torch dtype.
TORCH_DTYPES = {name: getattr(torch, name) for name in
                ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                 "int8", "uint8")}


@dataclass
class ParamBuffer:
    """A rank's tensor for the ``[lo, hi)`` region of one parameter, and how much is still missing."""

    spec: ParamSpec
    lo: int
    hi: int
    tensor: torch.Tensor
    missing_bytes: int = 0
    staging: dict[int, tuple[torch.Tensor, int]] = field(default_factory=dict)  # piece start -> (buf, filled)

    def piece_view(self, start: int, stop: int) -> torch.Tensor | None:
        """Bytes of ``[start, stop)`` as a flat uint8 view of the tensor, or None if not contiguous."""
        d = self.spec.split_dim
        outer = prod(self.spec.shape[:d]) if self.spec.shape else 1
        flat = self.tensor.reshape(-1).view(torch.uint8)
        if (start, stop) == (self.lo, self.hi):
            return flat
        if outer != 1:
            return None
        inner = flat.numel() // (self.hi - self.lo)
        return flat[(start - self.lo) * inner:(stop - self.lo) * inner]

    def narrow(self, start: int, stop: int) -> torch.Tensor:
        return self.tensor.narrow(self.spec.split_dim, start - self.lo, stop - start)


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

    def pack(self, block: int, chunk: int, buffers: dict[int, ParamBuffer]) -> torch.Tensor:
        """Return the chunk message for ``block``/``chunk`` read from this rank's buffers."""
        msg = self.new_buffer(block, chunk)
        payload = msg[HEADER_BYTES:]
        for i, pc, off, n, at in self._segments(block, chunk):
            buf = buffers[pc.param]
            src = buf.piece_view(pc.start, pc.stop)
            if src is None:
                cached = self._packed.get(block)
                if cached is None or cached[0] != i:
                    cached = (i, buf.narrow(pc.start, pc.stop).contiguous().reshape(-1).view(torch.uint8))
                    self._packed[block] = cached
                src = cached[1]
            payload[at:at + n].copy_(src[off:off + n])
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
