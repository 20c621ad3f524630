"""Start one real OS process per rank (optionally inside a network namespace) and collect results.

Processes come from a ``forkserver`` that has imported torch once, so starting a rank takes
milliseconds and no rank inherits the parent's threads. A rank enters its namespace with
``setns(2)`` before doing anything else, so every socket it (and gloo) opens lives there.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from typing import Any, Callable, Sequence

__all__ = ["RankResult", "RankGroup", "enter_netns"]

_CLONE_NEWNET = 0x40000000
_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        # Read by the forkserver's torch at import; c10d otherwise warns on every connection in a
        # namespace that cannot resolve its own hostname.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "orchestrl.collectives.weight_sync"])
    return _CTX


def enter_netns(name: str) -> None:
    """Move the calling (single-threaded) process into network namespace ``name``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RankResult:
    """What a rank process returned, or how it failed."""

    rank: int
    ok: bool
    value: Any = None  # the target's return value when ok
    error: str = ""  # "ExcType: message" when not ok
    error_type: str = ""
    traceback: str = ""
    exitcode: int | None = None
    finished_at: float = 0.0  # wall clock when the rank returned or raised


def _child(conn, rank: int, netns: str | None, env: dict[str, str], target: Callable, args: tuple) -> None:
    try:
        if netns:
            enter_netns(netns)
        os.environ.update(env)
        value = target(*args)
        conn.send(RankResult(rank, True, value, finished_at=time.time()))
    except BaseException as exc:  # reported to the parent, which decides what it means
        conn.send(RankResult(rank, False, None, f"{type(exc).__name__}: {exc}", type(exc).__name__,
                             traceback.format_exc(), finished_at=time.time()))
    finally:
        conn.close()
    # Stay up until the parent kills us: the store and sockets this rank hosts must outlive the
    # peers' last reads (as in a real job, whose processes outlive one failed sync).
    while True:
        time.sleep(3600)


class RankGroup:
    """A set of rank processes running ``target(*args[i])``; use as a context manager.

    Leaving the context kills every process still alive, whatever happened.
    """

    def __init__(self, target: Callable, args: Sequence[tuple], *, netns: Sequence[str | None] | None = None,
                 env: Sequence[dict[str, str]] | None = None) -> None:
        self.target = target
        self.args = list(args)
        self.netns = list(netns) if netns is not None else [None] * len(self.args)
        self.env = list(env) if env is not None else [{} for _ in self.args]
        self.procs: list = []
        self._conns: list = []

    def __enter__(self) -> "RankGroup":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()

    def start(self) -> None:
        ctx = _context()
        for rank, a in enumerate(self.args):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(child, rank, self.netns[rank], self.env[rank], self.target, a),
                            daemon=True, name=f"rank-{rank}")
            p.start()
            child.close()
            self.procs.append(p)
            self._conns.append(parent)

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one rank's process (SIGKILL: it dies without a word)."""
        os.kill(self.procs[rank].pid, sig)

    def kill_all(self) -> None:
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.join(timeout=5)

    def join(self, timeout_s: float, ignore: Sequence[int] = ()) -> list[RankResult]:
        """Wait for every rank (at most ``timeout_s``) and return their results in rank order.

        Ranks in ``ignore`` (ones a test stops on purpose) are not waited for. A rank that died
        without reporting gets ``ok=False`` with its exit code; ranks still running at the deadline
        are reported as timed out. Every process is killed before this returns: ranks stay alive
        after reporting so that the store and sockets they host outlive their peers' last reads.
        """
        deadline = time.monotonic() + timeout_s
        results: dict[int, RankResult] = {}
        waiting = {conn: rank for rank, conn in enumerate(self._conns) if rank not in set(ignore)}
        while waiting and time.monotonic() < deadline:
            for conn in mp_connection.wait(list(waiting), timeout=max(0.0, deadline - time.monotonic())):
                rank = waiting.pop(conn)
                try:
                    results[rank] = conn.recv()
                except EOFError:
                    self.procs[rank].join(timeout=2)
                    results[rank] = RankResult(rank, False, error="died without reporting", error_type="Died",
                                               exitcode=self.procs[rank].exitcode, finished_at=time.time())
        for rank, p in enumerate(self.procs):
            if rank not in results:
                results[rank] = RankResult(rank, False, error="timed out" if p.is_alive() else "died without reporting",
                                           error_type="Timeout" if p.is_alive() else "Died", exitcode=p.exitcode)
        self.kill_all()
        return [results[r] for r in range(len(self.procs))]
