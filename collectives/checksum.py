"""Chunk checksums that both ends compute the same way on CPU and GPU.

``crc32`` (zlib, several GB/s on one core) is used for CPU buffers; ``fletcher64`` is a
position-weighted sum of 32-bit words computed with torch integer ops, so it runs on the device a
buffer lives on. Integer sums wrap modulo 2**64 whatever order a reduction uses, so both are
bit-exact across devices and thread counts.
"""

from __future__ import annotations

import zlib

import torch

__all__ = ["ALGORITHMS", "checksum"]

#: Name -> numeric id carried in every chunk header.
ALGORITHMS = {"crc32": 1, "fletcher64": 2}

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
    """
    if algorithm == "crc32":
        host = payload if payload.device.type == "cpu" else payload.cpu()
        return zlib.crc32(memoryview(host.numpy())) & _MASK63
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
