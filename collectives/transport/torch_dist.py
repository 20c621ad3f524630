"""torch.distributed point-to-point transport: gloo on CPU, NCCL on GPU.

The process group is built directly on a store (as vLLM's stateless process groups are), so it
neither needs nor disturbs the trainer's or the engine's default process group: it spans exactly
the schedule's ranks, trainers first, numbered as :class:`collectives.schedule.Schedule` numbers
them.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["TorchTransport"]


class _Pending:
    def __init__(self, work, timeout: timedelta | None) -> None:
        self._work = work
        self._timeout = timeout

    def wait(self) -> None:
        if self._timeout is None:
            self._work.wait()
        else:  # NCCL: a timeout makes wait() block the CPU thread until the kernel is done
            self._work.wait(self._timeout)


class TorchTransport:
    """Point-to-point sends and receives on a dedicated gloo or NCCL process group.

    Parameters
    ----------
    store : torch.distributed.Store
        Shared by all ranks (e.g. a ``TCPStore``; see :meth:`connect`).
    rank, world_size : int
        Schedule rank of this process and number of schedule ranks.
    backend : {"gloo", "nccl"}
        gloo moves CPU tensors over TCP; NCCL moves CUDA tensors.
    timeout_s : float
        Per-operation timeout of the process group (a stalled transfer fails after this).
    group_name : str
        Keeps this group's keys apart from other users of the store.

    Notes
    -----
    gloo picks its network interface from ``GLOO_SOCKET_IFNAME`` when set (the emulated cluster sets
    it to each namespace's NIC).
    """

    def __init__(self, store, rank: int, world_size: int, *, backend: str = "gloo", timeout_s: float = 60.0,
                 group_name: str = "orchestrl-weight-sync") -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.store = dist.PrefixStore(f"{group_name}/ctl/", store)
        self._keep_store = store
        pg_store = dist.PrefixStore(f"{group_name}/pg/", store)
        timeout = timedelta(seconds=timeout_s)
        if backend == "gloo":
            self._pg = dist.ProcessGroupGloo(pg_store, rank, world_size, timeout)
            self.device = torch.device("cpu")
            self.checksum = "crc32"
            self._wait_timeout = None
        elif backend == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError("backend 'nccl' needs CUDA, which is not available here; use 'gloo'")
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(pg_store, rank, world_size, opts)
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.checksum = "fletcher64"
            self._wait_timeout = timeout
        else:
            raise ValueError(f"unknown backend {backend!r} (allowed: gloo, nccl)")

    @classmethod
    def connect(cls, host: str, port: int, rank: int, world_size: int, *, backend: str = "gloo",
                timeout_s: float = 60.0, group_name: str = "orchestrl-weight-sync") -> "TorchTransport":
        """Create the transport with a ``TCPStore`` at ``host:port`` hosted by schedule rank 0."""
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        return cls(store, rank, world_size, backend=backend, timeout_s=timeout_s, group_name=group_name)

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        return _Pending(self._pg.send([buf], peer, tag), self._wait_timeout)

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        return _Pending(self._pg.recv([buf], peer, tag), self._wait_timeout)

    def close(self) -> None:
        """Drop the process group; pending operations of a failed sync are abandoned."""
        pg, self._pg = self._pg, None
        if pg is not None and self.backend == "nccl" and hasattr(pg, "abort"):
            pg.abort()

    @staticmethod
    def interface_hint() -> str:
        """The interface gloo will use (``GLOO_SOCKET_IFNAME``), for error messages."""
        return os.environ.get("GLOO_SOCKET_IFNAME", "<hostname's interface>")
