"""torch.distributed point-to-point transport: gloo on CPU, NCCL on GPU, one small group per peer.

Design note
-----------
A weight-sync rank talks to a handful of peers (its seeds, its tree parents and children), never
to all ranks, so instead of one process group over the whole schedule the transport builds one
two-rank group per peer it exchanges chunks with (as vLLM's stateless groups are, directly on a
store, so neither the trainer's nor the engine's default process group is needed or touched).
That keeps connection count at the number of peers rather than ``world_size**2`` and, above all,
lets a replaced rank *rejoin*: a group is named after both ranks' *generations*, numbers each
process draws from the store when it connects and again whenever it resets after a failure. When a
peer's generation changes, the pair's group is rebuilt at the next round; groups between ranks that
did not change are kept. Groups are (re)built in one global order of pairs, so two ranks never wait
for each other in opposite orders. Nothing connects before :meth:`TorchTransport.prepare`, which
the executor calls only after every rank has joined the round with the same schedule, so a rank
with the wrong world size or schedule is refused by name instead of hanging in a connect.

After a failed round, :meth:`TorchTransport.reset` must end every pending transfer at once: a
thread left blocked in a wait makes the process abort at exit, and a peer left blocked keeps its
error waiting for a timeout. NCCL's ``abort`` does that; gloo's does not touch pending transfers,
so for gloo the transport shuts down the TCP connection of each peer group (identified when the
group is built: the new socket whose local port is this rank's gloo listener, or whose remote port
is the peer's, both published in the store). Both ends' pending transfers then fail immediately.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from orchestrl.collectives.checksum import cpu_algorithm

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
    """Point-to-point sends and receives on per-peer gloo or NCCL groups.

    Parameters
    ----------
    store : torch.distributed.Store
        Shared by all ranks (e.g. a ``TCPStore``; see :meth:`connect`).
    rank, world_size : int
        Schedule rank of this process and number of schedule ranks.
    backend : {"gloo", "nccl"}
        gloo moves CPU tensors over TCP; NCCL moves CUDA tensors.
    timeout_s : float
        Per-operation timeout of the groups (a stalled transfer fails after this).
    group_name : str
        Keeps this transport's keys apart from other users of the store.

    Notes
    -----
    gloo picks its network interface from ``GLOO_SOCKET_IFNAME`` when set (the emulated cluster sets
    it to each namespace's NIC).
    """

    def __init__(self, store, rank: int, world_size: int, *, backend: str = "gloo", timeout_s: float = 60.0,
                 group_name: str = "orchestrl-weight-sync") -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown backend {backend!r} (allowed: gloo, nccl)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs CUDA, which is not available here; use 'gloo'")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the schedule's {world_size} ranks")
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.group_name = group_name
        self.root_store = store
        self.store = dist.PrefixStore(f"{group_name}/ctl/", store)
        self._pairs_store = dist.PrefixStore(f"{group_name}/pair/", store)
        self.device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
        self.checksum = cpu_algorithm() if backend == "gloo" else "fletcher64"
        self._wait_timeout = None if backend == "gloo" else timedelta(seconds=timeout_s)
        self._gloo_device = None
        self._gloo_port = 0
        self._groups: dict[int, tuple[tuple[int, int], object]] = {}  # peer -> ((gen lo, gen hi), group)
        # peer -> (file descriptor, socket inode) of each socket of its gloo connection: the number alone may be
        # reused by another socket once gloo closes it
        self._sockets: dict[int, list[tuple[int, int]]] = {}
        self._generation: int | None = None
        self._prepare_lock = threading.Lock()
        self.generation  # noqa: B018 -- drawn now, so a bad store fails the constructor, not the first round

    @classmethod
    def connect(cls, host: str, port: int, rank: int, world_size: int, *, backend: str = "gloo",
                timeout_s: float = 60.0, group_name: str = "orchestrl-weight-sync") -> "TorchTransport":
        """Create the transport with a ``TCPStore`` at ``host:port`` hosted by schedule rank 0."""
        from orchestrl.collectives.store import tcp_store

        store = tcp_store(host, port, is_master=rank == 0, timeout_s=timeout_s, world_size=world_size)
        return cls(store, rank, world_size, backend=backend, timeout_s=timeout_s, group_name=group_name)

    @property
    def generation(self) -> int:
        """This process's connection generation, drawn from the store when first needed after a reset."""
        if self._generation is None:
            self._generation = int(self.store.add(f"generation/{self.rank}", 1))
            if self._gloo_device is not None:
                self._publish_port()
        return self._generation

    # -- groups ----------------------------------------------------------------------------------
    def prepare(self, generations: dict[int, int]) -> None:
        """Make sure a group exists for every peer in ``generations`` (peer -> its generation).

        Groups whose pair of generations changed are rebuilt, in increasing order of the pair, so
        that every rank builds shared groups in the same order. Blocks until each peer does its part.
        One prepare at a time: one left behind by a failed round ends at its own timeout first.
        """
        with self._prepare_lock:
            self._prepare(generations)

    def _prepare(self, generations: dict[int, int]) -> None:
        for peer in sorted(generations, key=lambda p: (min(p, self.rank), max(p, self.rank))):
            lo, hi = sorted((self.rank, peer))
            gens = (self.generation, generations[peer]) if self.rank == lo else (generations[peer], self.generation)
            current = self._groups.get(peer)
            if current is not None and current[0] == gens:
                continue
            if current is not None:
                self._abort(peer)
            prefix = dist.PrefixStore(f"{lo}-{hi}/{gens[0]}-{gens[1]}/", self._pairs_store)
            before = _sockets() if self.backend == "gloo" else {}
            self._groups[peer] = (gens, self._make_group(prefix, 0 if self.rank == lo else 1))
            if self.backend == "gloo":
                self._sockets[peer] = self._pair_sockets(_new_sockets(before), peer, generations[peer])

    def _make_group(self, store, index: int):
        timeout = timedelta(seconds=self.timeout_s)
        if self.backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._threads = 1  # point-to-point needs no collective worker threads
            if self._gloo_device is None:
                self._gloo_device = self._make_device()
            opts._devices = [self._gloo_device]  # one socket event loop for every peer group
            return dist.ProcessGroupGloo(store, index, 2, opts)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, index, 2, opts)

    def _make_device(self):
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]  # as torch's own groups do
        before = _sockets()
        device = (dist.ProcessGroupGloo.create_device(interface=ifname) if ifname
                  else dist.ProcessGroupGloo.create_default_device())
        for fd in _new_sockets(before):
            addr = _addresses(fd)
            if addr is not None and addr[1] is None:  # the listener: bound, not connected
                self._gloo_port = addr[0]
        self._publish_port()
        return device

    def _publish_port(self) -> None:
        self.store.set(f"gloo-port/{self.rank}/{self.generation}", str(self._gloo_port))

    def _pair_sockets(self, new: dict[int, int], peer: int, peer_generation: int) -> list[tuple[int, int]]:
        """The new sockets that connect this rank's gloo device with ``peer``'s."""
        key = f"gloo-port/{peer}/{peer_generation}"
        self.store.wait([key], timedelta(seconds=self.timeout_s))
        peer_port = int(self.store.get(key))
        out = []
        for fd in new:
            addr = _addresses(fd)
            if addr is not None and addr[1] is not None and (addr[0] == self._gloo_port or addr[1] == peer_port):
                out.append((fd, new[fd]))
        return out

    def _group(self, peer: int):
        entry = self._groups.get(peer)
        if entry is None:
            raise RuntimeError(f"rank {self.rank} has no connection to rank {peer}; prepare() was not called "
                               "for it (the schedule does not connect them)")
        return entry[1]

    # -- transfers ---------------------------------------------------------------------------------
    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        return _Pending(self._group(peer).send([buf], 1 if self.rank < peer else 0, tag), self._wait_timeout)

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        return _Pending(self._group(peer).recv([buf], 1 if self.rank < peer else 0, tag), self._wait_timeout)

    # -- failure ------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Abort every group (pending transfers fail at once) and draw a new generation.

        Called after a failed round: the next round rebuilds the connections with every peer, so no
        transfer of the failed round can be matched with one of the next. Touches no store, so it is
        as quick on a rank cut off from the network as on any other.
        """
        self.close()
        self._generation = None  # drawn at the next round: a reset never waits on the store (it may be gone)

    def close(self) -> None:
        """Abort every group and end its pending transfers; a closed transport is reopened by prepare()."""
        for peer in list(self._groups):
            self._abort(peer)

    def _abort(self, peer: int) -> None:
        _, group = self._groups.pop(peer)
        for fd, inode in self._sockets.pop(peer, []):
            # Only the socket recorded: gloo closes a pair's descriptor when the pair fails, and the number is then
            # reused by the next socket this process opens (a store client, say), which a shutdown by number would
            # cut off. Checked on a duplicate (the number cannot change hands between the check and the shutdown),
            # so the descriptor stays gloo's to close; OSError: already closed.
            with contextlib.suppress(OSError):
                with socket.socket(fileno=os.dup(fd)) as sock:
                    if os.fstat(sock.fileno()).st_ino == inode:
                        sock.shutdown(socket.SHUT_RDWR)
        # already aborted, or the backend has nothing to abort: nothing left to stop
        with contextlib.suppress(Exception):
            group.abort()  # type: ignore[attr-defined]

    @staticmethod
    def interface_hint() -> str:
        """The interface gloo will use (``GLOO_SOCKET_IFNAME``), for error messages."""
        return os.environ.get("GLOO_SOCKET_IFNAME", "<hostname's interface>")


def _sockets() -> dict[int, int]:
    """This process's sockets: file descriptor -> socket inode."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:["):
                out[int(name)] = int(link[len("socket:["):-1])
    return out


def _new_sockets(before: dict[int, int]) -> dict[int, int]:
    """The sockets opened since ``before`` (:func:`_sockets`), a reused descriptor number included."""
    return {fd: inode for fd, inode in _sockets().items() if before.get(fd) != inode}


def _addresses(fd: int) -> tuple[int, int | None] | None:
    """(local port, remote port or None) of a TCP socket, or None for any other descriptor."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            local = sock.getsockname()[1]
            try:
                remote = sock.getpeername()[1]
            except OSError:
                remote = None
            return local, remote
    except OSError:
        return None
