"""Ports for test and benchmark processes that bind them later (no torch needed)."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A port that is free now and that the kernel will not hand out to an outgoing connection meanwhile.

    The port is bound later, by another process (rank 0's store). A port the kernel picked (bind to 0)
    lies in the ephemeral range, where any outgoing connection (a store client, a gloo pair) may take it
    first; this one is drawn below that range, so only another caller of free_port could, at random.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: fall back on the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where /proc does not say)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
