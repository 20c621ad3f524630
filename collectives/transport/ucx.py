"""UCX transport through ``ucxx``, for cross-cluster transfers where UCX finds RDMA (or TCP).

Each rank starts a ``ucxx`` listener, publishes ``ip:port`` in the shared store, and connects to
every lower rank (sending its own rank as the first message so the listener side knows who
called); every pair then shares one endpoint, and chunks are tagged messages on it. ``ucxx`` is
asyncio-based, so the transport runs its own event loop on a helper thread and hands out
``concurrent.futures`` handles that block with the transport's timeout.

``ucxx`` ships as ``ucxx-cu12`` / ``ucxx-cu13`` wheels (the ``ucx`` extra); where it does not
import, :func:`ucx_unavailable` returns the reason and the tests skip with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future

import numpy as np
import torch
import torch.distributed as dist

from orchestrl.collectives.checksum import cpu_algorithm

__all__ = ["UcxTransport", "ucx_unavailable"]


def ucx_unavailable() -> str | None:
    """Return why ``ucxx`` cannot be used here, or None if it imports."""
    try:
        import ucxx  # noqa: F401
    except Exception as exc:  # ImportError, or a missing libucx / CUDA runtime underneath
        return f"ucxx is not importable ({type(exc).__name__}: {exc}); install the 'ucx' extra on a machine with UCX"
    return None


class _Pending:
    def __init__(self, future: Future, timeout_s: float, what: str) -> None:
        self._future = future
        self._timeout_s = timeout_s
        self._what = what

    def wait(self) -> None:
        try:
            self._future.result(timeout=self._timeout_s)
        except TimeoutError as exc:
            self._future.cancel()
            raise TimeoutError(f"{self._what} did not complete within {self._timeout_s:.0f} s") from exc


class UcxTransport:
    """Tagged point-to-point messages over UCX endpoints, one per pair of ranks.

    Parameters
    ----------
    store : torch.distributed.Store
        Shared by all ranks; used to exchange listener addresses and for coordination.
    rank, world_size : int
        Schedule rank and number of ranks.
    host_ip : str
        Address peers reach this rank's listener at (e.g. ``ucxx.get_address(ifname="eth0")``).
    timeout_s : float
        Connection and per-message timeout.
    device : str
        ``"cpu"`` or a CUDA device; buffers handed to ``isend``/``irecv`` must live there.
    """

    def __init__(self, store, rank: int, world_size: int, *, host_ip: str, timeout_s: float = 60.0,
                 group_name: str = "orchestrl-weight-sync", device: str = "cpu") -> None:
        reason = ucx_unavailable()
        if reason:
            raise RuntimeError(reason)
        import ucxx

        self._ucxx = ucxx
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.device = torch.device(device)
        self.checksum = cpu_algorithm() if self.device.type == "cpu" else "fletcher64"
        self.store = dist.PrefixStore(f"{group_name}/ctl/", store)
        self._addr = dist.PrefixStore(f"{group_name}/ucx/", store)
        self._eps: dict[int, object] = {}
        self._joined = {p: threading.Event() for p in range(world_size) if p != rank}
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name=f"ucx-loop-{rank}", daemon=True).start()
        self._listener = self._call(self._listen())
        self._addr.set(str(rank), f"{host_ip}:{self._listener.port}")
        for peer in range(rank):
            self._addr.wait([str(peer)])
            ip, port = self._addr.get(str(peer)).decode().rsplit(":", 1)
            self._call(self._connect(peer, ip, int(port)))
        for peer, ev in self._joined.items():
            if not ev.wait(self.timeout_s):
                raise TimeoutError(f"rank {peer} did not connect to rank {rank} within {self.timeout_s:.0f} s")

    # -- connection set-up (runs on the loop thread) -------------------------------------------------
    async def _listen(self):
        return self._ucxx.create_listener(self._accept, port=0)

    async def _accept(self, ep) -> None:
        who = np.empty(1, dtype=np.int64)
        await ep.recv(who)
        peer = int(who[0])
        self._eps[peer] = ep
        self._joined[peer].set()

    async def _connect(self, peer: int, ip: str, port: int) -> None:
        ep = await self._ucxx.create_endpoint(ip, port)
        await ep.send(np.array([self.rank], dtype=np.int64))
        self._eps[peer] = ep
        self._joined[peer].set()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=self.timeout_s)

    # -- rounds -----------------------------------------------------------------------------------------
    generation = 0  # endpoints are built once, at construction

    def prepare(self, generations: dict[int, int]) -> None:
        """Nothing to do: every pair of ranks shares one endpoint from construction on."""

    def reset(self) -> None:
        """Close every endpoint: after a failed round a UCX transport is discarded and rebuilt on all ranks."""
        self.close()

    # -- transport protocol --------------------------------------------------------------------------
    def _buffer(self, buf: torch.Tensor):
        if buf.device != self.device:
            raise ValueError(f"buffer on {buf.device}, transport on {self.device}")
        return buf.numpy() if buf.device.type == "cpu" else buf  # CUDA tensors expose __cuda_array_interface__

    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        fut = asyncio.run_coroutine_threadsafe(self._eps[peer].send(self._buffer(buf), tag=tag), self._loop)
        return _Pending(fut, self.timeout_s, f"UCX send of {buf.numel()} bytes to rank {peer}")

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        fut = asyncio.run_coroutine_threadsafe(self._eps[peer].recv(self._buffer(buf), tag=tag), self._loop)
        return _Pending(fut, self.timeout_s, f"UCX receive of {buf.numel()} bytes from rank {peer}")

    def close(self) -> None:
        """Close endpoints and the listener, then stop the loop thread."""
        async def shutdown() -> None:
            for ep in self._eps.values():
                with contextlib.suppress(Exception):  # a peer that already went away: nothing left to flush
                    await ep.close()
            self._listener.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=self.timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
