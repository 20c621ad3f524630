"""Transport for colocated ranks: memory handles through the store instead of bytes through sockets.

Design note
-----------
In the colocated deployment of verl and NeMo-RL the trainer and the inference engine are separate
processes on the *same* GPUs. NCCL refuses two ranks on one GPU, and gloo would copy every byte
through host memory and TCP. CUDA IPC lets the receiving process map the sender's device buffer
and copy from it directly, so a chunk costs one device-to-device copy and two small store messages.

Each ``isend`` publishes a *handle* to its buffer under a key of the job's store and its ``wait()``
returns when the receiver acknowledges (only then may the sender reuse the buffer, which is what the
executor's double-buffering already assumes of every transport). Each ``irecv``'s ``wait()`` takes
the handle, copies the bytes into its own buffer and acknowledges. Messages pair up by
``(sender, receiver, tag, n)``, n counting the sends of that tag on each side, and keys carry both
ranks' generations, so after :meth:`reset` nothing of a failed round can be matched with the next.

Two kinds of handle, chosen by the buffer's device:

* CUDA tensors: ``torch.multiprocessing.reductions.reduce_tensor`` (cudaIpcGetMemHandle plus an
  offset, and PyTorch's reference counting keeps the block alive), as verl's colocated weight sync
  does. The sender synchronises its stream before publishing; the receiver synchronises after its
  copy, before acknowledging. GPU only; tested when a GPU is present.
* CPU tensors: POSIX shared-memory segments, pooled per peer, written by the sender and read
  by the receiver (two host copies, no sockets). This lets colocated CPU processes skip TCP, and
  lets the tests here run the same protocol with real processes.

Every wait is bounded by ``timeout_s`` and ends at once when the transport is reset or closed.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from datetime import timedelta
from multiprocessing import shared_memory

import torch
import torch.distributed as dist

from orchestrl.collectives.checksum import cpu_algorithm

__all__ = ["ColocatedTransport"]

_POLL_S = 0.05  # a blocked wait re-checks for reset this often; keys wake it at once


class TransportClosed(ConnectionError):
    """The transport was reset or closed while a transfer waited."""


class _Pending:
    def __init__(self, fn) -> None:
        self._fn = fn
        self._done = False

    def wait(self) -> None:
        if not self._done:
            self._fn()
            self._done = True


class ColocatedTransport:
    """Point-to-point transfers between processes on one host (CUDA IPC, or shared memory on CPU).

    Parameters
    ----------
    store : torch.distributed.Store
        Shared by all ranks (e.g. the job's ``TCPStore``).
    rank, world_size : int
        Schedule rank of this process and number of schedule ranks.
    device : torch.device or str
        ``cuda`` (or ``cuda:N``) for CUDA IPC, ``cpu`` for shared memory.
    timeout_s : float
        Longest wait of one transfer; a peer that neither sends nor acknowledges in that time fails it.
    group_name : str
        Keeps this transport's keys apart from other users of the store.

    Examples
    --------
    >>> import torch.distributed as dist
    >>> store = dist.HashStore()
    >>> t = ColocatedTransport(store, 0, 1, device="cpu")
    >>> t.device, t.checksum
    (device(type='cpu'), 'crc32c')
    >>> t.close()
    """

    def __init__(self, store, rank: int, world_size: int, *, device="cpu", timeout_s: float = 60.0,
                 group_name: str = "orchestrl-weight-sync") -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the schedule's {world_size} ranks")
        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("device 'cuda' needs CUDA, which is not available here; use device='cpu'")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.type != "cpu":
            raise ValueError(f"unknown device {device!r} (allowed: cpu, cuda, cuda:N)")
        self.rank = rank
        self.world_size = world_size
        self.device = dev
        self.checksum = cpu_algorithm() if dev.type == "cpu" else "fletcher64"
        self.timeout_s = float(timeout_s)
        self.group_name = group_name
        self.store = dist.PrefixStore(f"{group_name}/ctl/", store)
        self._msg_store = dist.PrefixStore(f"{group_name}/ipc/", store)
        self._local = threading.local()  # one store client per thread: a blocking wait must not hold others
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._generations: dict[int, int] = {}
        self._seq: dict[tuple[str, int, int], int] = {}
        self._segments: dict[str, shared_memory.SharedMemory] = {}  # ours (send pool) and peers' (attached)
        self._free: dict[tuple[int, int], list[shared_memory.SharedMemory]] = {}
        self._generation: int | None = None
        self.generation  # noqa: B018 -- drawn now, so a bad store fails the constructor

    @property
    def generation(self) -> int:
        """This process's generation, drawn from the store when first needed after a reset."""
        if self._generation is None:
            self._generation = int(self.store.add(f"generation/{self.rank}", 1))
        return self._generation

    # -- connections -------------------------------------------------------------------------------
    def prepare(self, generations: dict[int, int]) -> None:
        """Remember each peer's generation (no connection is needed: every message goes through the store)."""
        self._closed.clear()
        self._generations = dict(generations)

    def _client(self):
        c = getattr(self._local, "store", None)
        if c is None:
            c = self._msg_store.clone() if hasattr(self._msg_store, "clone") else self._msg_store
            self._local.store = c
        return c

    def _key(self, src: int, dst: int, tag: int, direction: str) -> str:
        peer = dst if src == self.rank else src
        if peer not in self._generations:
            raise RuntimeError(f"rank {self.rank} has no connection to rank {peer}; prepare() was not called for it "
                               "(the schedule does not connect them)")
        g_src = self.generation if src == self.rank else self._generations[src]
        g_dst = self.generation if dst == self.rank else self._generations[dst]
        with self._lock:
            n = self._seq.get((direction, peer, tag), 0)
            self._seq[(direction, peer, tag)] = n + 1
        return f"{src}.{g_src}>{dst}.{g_dst}/{tag}/{n}"

    def _wait_key(self, store, key: str, what: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._closed.is_set():
                raise TransportClosed(f"rank {self.rank}: transport reset while {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank {self.rank}: no answer within {self.timeout_s:g} s while {what}")
            try:
                store.wait([key], timedelta(seconds=min(_POLL_S, left)))
            except (RuntimeError, dist.DistStoreError) as exc:  # a slice of the wait ran out, or the store failed
                if "imeout" in str(exc) or "Wait timeout" in str(exc):
                    continue
                raise ConnectionError(f"rank {self.rank}: store failed while {what}: {exc}") from exc
            value = store.get(key)
            store.delete_key(key)
            return value

    # -- transfers ---------------------------------------------------------------------------------
    def isend(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        key = self._key(self.rank, peer, tag, "send")
        store = self._client()
        blob, seg = self._export(buf, peer)
        store.set(key, blob)

        def finish() -> None:
            self._wait_key(self._client(), key + "/ack", f"sending tag {tag} to rank {peer}")
            if seg is not None:  # the receiver has copied it out: the segment may carry the next message
                with self._lock:
                    self._free.setdefault((peer, buf.nbytes), []).append(seg)
        return _Pending(finish)

    def irecv(self, buf: torch.Tensor, peer: int, tag: int) -> _Pending:
        key = self._key(peer, self.rank, tag, "recv")

        def finish() -> None:
            store = self._client()
            blob = self._wait_key(store, key, f"receiving tag {tag} from rank {peer}")
            self._import_into(buf, blob)
            store.set(key + "/ack", b"1")
        return _Pending(finish)

    def _export(self, buf: torch.Tensor, peer: int) -> tuple[bytes, shared_memory.SharedMemory | None]:
        if buf.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor
            torch.cuda.current_stream(buf.device).synchronize()  # the bytes are final before the peer reads
            return pickle.dumps(("cuda", reduce_tensor(buf))), None
        # a pool of segments per (peer, size): one returns to the pool when its message is acknowledged, so
        # there are as many as the executor keeps sends in flight to that peer, not one per chunk
        with self._lock:
            free = self._free.get((peer, buf.nbytes))
            seg = free.pop() if free else None
        if seg is None:
            seg = shared_memory.SharedMemory(name=_unique(f"orl{self.generation}_{self.rank}_{peer}"), create=True,
                                             size=max(1, buf.nbytes))
            self._segments[seg.name] = seg
        if buf.nbytes:
            torch.frombuffer(seg.buf, dtype=torch.uint8, count=buf.nbytes).copy_(buf.reshape(-1).view(torch.uint8))
        return pickle.dumps(("shm", seg.name, buf.nbytes)), seg

    def _import_into(self, buf: torch.Tensor, blob: bytes) -> None:
        kind, *rest = pickle.loads(blob)
        dst = buf.reshape(-1).view(torch.uint8)
        if kind == "cuda":
            fn, args = rest[0]
            src = fn(*args)
            dst.copy_(src.reshape(-1).view(torch.uint8))
            torch.cuda.current_stream(buf.device).synchronize()  # copied before the sender may reuse its buffer
            del src
            return
        name, nbytes = rest
        if nbytes != dst.numel():
            raise ValueError(f"rank {self.rank}: message of {nbytes} bytes for a buffer of {dst.numel()}")
        if nbytes == 0:
            return
        seg = self._segments.get(name)
        if seg is None:
            seg = shared_memory.SharedMemory(name=name, create=False)
            _untrack(seg)
            self._segments[name] = seg
        dst.copy_(torch.frombuffer(seg.buf, dtype=torch.uint8, count=nbytes))

    # -- failure -----------------------------------------------------------------------------------
    def reset(self) -> None:
        """End every pending wait at once and draw a new generation (nothing of this round matches the next)."""
        self.close()
        with self._lock:
            self._seq.clear()
        self._generation = None  # drawn at the next round: a reset never waits on the store

    def close(self) -> None:
        """End every pending wait and release the shared-memory segments; prepare() reopens."""
        self._closed.set()
        mine = f"orl{self.generation}_{self.rank}_"
        with self._lock:
            self._free.clear()
            segments, self._segments = self._segments, {}
        for name, seg in segments.items():
            try:
                seg.close()
                if name.lstrip("/").startswith(mine):  # ours: remove; a peer's is the peer's to remove
                    seg.unlink()
            except (FileNotFoundError, BufferError):  # already gone, or a view still alive: freed at exit
                continue


_created = 0


def _unique(prefix: str) -> str:
    """A segment name unique to this process (a restarted rank must not collide with a stale segment)."""
    global _created
    _created += 1
    return f"{prefix}_{os.getpid()}_{_created}"


def _untrack(seg: shared_memory.SharedMemory) -> None:
    """Stop Python's resource tracker from unlinking a peer's segment when this process exits."""
    try:
        from multiprocessing import resource_tracker
        resource_tracker.unregister(seg._name, "shared_memory")
    except Exception:  # the tracker's private API moved; at worst the peer's segment is removed at our exit
        return
