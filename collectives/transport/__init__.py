"""Point-to-point transports the weight-sync executor runs on.

A transport gives one rank ``isend``/``irecv`` of a ``uint8`` tensor to a peer under an integer tag,
returning a handle whose ``wait()`` blocks until the transfer completed (or raises, at the latest
after the transport's timeout), plus a torch ``Store`` shared by all ranks for coordination.

* :class:`~collectives.transport.torch_dist.TorchTransport`: torch.distributed point-to-point,
  gloo on CPU, NCCL on GPU, on a process group created for the schedule (not the default group).
* :class:`~collectives.transport.ucx.UcxTransport`: UCX through ``ucxx`` for cross-cluster
  transfers, where ``ucxx`` imports (``ucx_unavailable()`` says why not).
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Pending", "Transport"]


class Pending(Protocol):
    def wait(self) -> None:
        """Block until the transfer is complete; raise if it failed or timed out."""


class Transport(Protocol):
    rank: int
    world_size: int
    device: torch.device
    checksum: str  # algorithm of collectives.checksum suited to `device`
    store: object  # torch.distributed.Store shared by every rank

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> Pending: ...

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> Pending: ...

    def close(self) -> None: ...
