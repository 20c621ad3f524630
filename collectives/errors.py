"""Errors the collectives raise at run time; planning errors reuse :mod:`fabric.errors`."""

from __future__ import annotations

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["WeightSyncError", "IntegrityError"]


class WeightSyncError(OrchestrlError):
    """A weight sync failed on this rank; names the peer to blame and the phase it was in.

    Parameters
    ----------
    message : str
        The whole explanation, already naming the peer and phase.
    peer : int
        Schedule rank of the peer held responsible (-1 if none could be named).
    phase : str
        What was going on when it failed (``"phase B: receiving block 3 chunk 5/16 from ..."``).
    reporter : int
        The rank that first detected the failure (may be another rank than this one).
    """

    def __init__(self, message: str, *, peer: int = -1, phase: str = "", reporter: int = -1) -> None:
        super().__init__(message)
        self.peer = peer
        self.phase = phase
        self.reporter = reporter


class IntegrityError(WeightSyncError):
    """A chunk arrived with a checksum, block or chunk number that does not match what was sent."""
