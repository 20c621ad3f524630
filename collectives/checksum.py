"""Chunk checksums that both ends compute the same way on CPU and GPU.

``crc32c`` (Castagnoli, the CRC with a CPU instruction: about 10 GB/s on one core of this
project's 2-core host through the ``crc32c`` package, against 2 GB/s for zlib's ``crc32``) is used
for CPU buffers where that package is installed (the ``comms`` extra), ``crc32`` where it is not;
``fletcher64`` is a position-weighted sum of 32-bit words computed with torch integer ops, so it
runs on the device a buffer lives on. Integer sums wrap modulo 2**64 whatever order a reduction uses, so both are
bit-exact across devices and thread counts.
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["ALGORITHMS", "checksum", "cpu_algorithm"]

#: Name -> numeric id carried in every chunk header.
ALGORITHMS = {"crc32": 1, "fletcher64": 2, "crc32c": 3}

try:  # ICRAR's crc32c: hardware CRC32C (SSE 4.2 / ARMv8), software fallback inside the package
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - the comms extra installs it
    _crc32c = None


def cpu_algorithm() -> str:
    """The fastest algorithm available for CPU buffers here (both ends of a sync must agree: the header says it)."""
    return "crc32c" if _crc32c is not None else "crc32"

_MASK63 = (1 << 63) - 1


def checksum(payload: torch.Tensor, algorithm: str) -> int:
    """Return a non-negative 63-bit checksum of a 1-D ``uint8`` tensor.

    Examples
    --------
    >>> t = torch.arange(10, dtype=torch.uint8)
    >>> checksum(t, "crc32") == checksum(t.clone(), "crc32")
    True
    >>> checksum(t, "fletcher64") != checksum(t.flip(0), "fletcher64")
    True
    >>> checksum(t, cpu_algorithm()) == checksum(t.clone(), cpu_algorithm())
    True
    """
    if algorithm in ("crc32", "crc32c"):
        host = payload if payload.device.type == "cpu" else payload.cpu()
        data = memoryview(host.numpy()) if host.numel() else b""
        if algorithm == "crc32":
            return zlib.crc32(data) & _MASK63
        if _crc32c is None:
            raise ValueError("checksum 'crc32c' needs the crc32c package (pip install crc32c; it is in the comms extra)")
        return _crc32c(data) & _MASK63
    if algorithm == "fletcher64":
        n = payload.numel()
        if n % 4:
            payload = torch.cat([payload, payload.new_zeros(4 - n % 4)])
        words = payload.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        pos = torch.arange(1, words.numel() + 1, dtype=torch.int64, device=words.device)
        s1 = int(words.sum())
        s2 = int((words * pos).sum())
        return (s1 ^ (s2 * 0x9E3779B97F4A7C15) ^ n) & _MASK63
    raise ValueError(f"unknown checksum algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
