"""Sweeps: independent simulation cases on a local process pool (default) or a Ray cluster, same results.

Design note
-----------
A sweep is a list of cases and one top-level function that turns a case into a result; both must
pickle. Cases share nothing, so they run anywhere: in this process (``serial``, for debugging),
on a local process pool (``pool``, the default), or as Ray tasks (``ray``, the optional
``orchestrl[ray]`` extra) on a cluster given by its address, or on a local Ray instance. Results come
back in case order whatever finished first, and every case function here is deterministic, so the
three backends give identical results (the tests check this).

:class:`NetCase` and :func:`run_net_case` are the network cases the benchmarks and the RL-iteration
experiments sweep over: a fabric, a scale, a link speed and one collective.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import urllib.parse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence, TypeVar

from orchestrl.fabric.errors import ConfigError

__all__ = ["BACKENDS", "run_sweep", "NetCase", "run_net_case", "ray_available", "check_ray_address"]

BACKENDS = ("serial", "pool", "ray")
RAY_PROBE_TIMEOUT_S = 5.0  # a Ray head answers a TCP connect in milliseconds; ray.init itself waits forever
C = TypeVar("C")
R = TypeVar("R")


def ray_available() -> bool:
    """Return whether the optional Ray backend can be imported (``pip install orchestrl[ray]``)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def check_ray_address(address: str | None, *, timeout_s: float = RAY_PROBE_TIMEOUT_S,
                      source: str = "command line", option: str = "--ray") -> None:
    """Refuse a Ray address where nothing listens, before ``ray.init`` (which would wait for it forever).

    ``None``, ``"local"`` (start Ray here) and ``"auto"`` (Ray finds its own cluster) are left to Ray;
    ``HOST:PORT`` and ``ray://HOST:PORT`` get one TCP connection attempt of at most ``timeout_s``.

    Raises
    ------
    ConfigError
        From ``source``, naming ``option``, the address and the fix, if the address is not ``HOST:PORT`` or the
        connection is refused or times out.

    Examples
    --------
    >>> check_ray_address("local")
    >>> check_ray_address("head-node")
    Traceback (most recent call last):
    ...
    orchestrl.fabric.errors.ConfigError: command line: field '--ray': 'head-node' is not HOST:PORT (allowed: ...)
    """
    if address is None or address in ("local", "auto"):
        return
    fix = ("HOST:PORT of a running Ray head (`ray start --head` prints it), ray://HOST:10001 for Ray Client, "
           "'auto', or 'local' to start Ray on this machine")
    rest = address.split("://", 1)[1] if "://" in address else address
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise ConfigError(source, option, f"{address!r} is not HOST:PORT", fix)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()  # something accepts there: Ray's turn
    except OSError as exc:
        why = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(source, option, f"no Ray cluster answers at {address} ({why})",
                          f"start one there with `ray start --head --port={port}`, or use {option} local to run "
                          "the cases on a Ray instance started on this machine") from None


def run_sweep(fn: Callable[[C], R], cases: Sequence[C], *, backend: str = "pool", workers: int | None = None,
              ray_address: str | None = None, progress: Callable[[int, int], None] | None = None) -> list[R]:
    """Return ``[fn(case) for case in cases]``, computed on the chosen backend, in case order.

    Parameters
    ----------
    fn : callable
        A module-level function (it is pickled to the workers).
    cases : sequence
        Picklable case descriptions.
    backend : {"serial", "pool", "ray"}
    workers : int, optional
        Pool size (default: CPU count); Ray uses what the cluster offers.
    ray_address : str, optional
        Address of a running Ray cluster (``ray://host:10001`` or ``host:6379``); default: start a
        local Ray instance for the sweep.
    progress : callable, optional
        Called as ``progress(done, total)`` whenever a case finishes.

    Raises
    ------
    ConfigError
        For an unknown backend, ``ray`` when Ray is not installed, or a ``ray_address`` where nothing
        answers (:func:`check_ray_address`).

    Notes
    -----
    Wall time is the slowest worker's share of the cases; results keep case order.

    Examples
    --------
    >>> run_sweep(abs, [-1, 2, -3], backend="serial")
    [1, 2, 3]
    """
    if backend not in BACKENDS:
        raise ConfigError("sweep", "backend", f"unknown backend {backend!r}", ", ".join(BACKENDS))
    total = len(cases)
    if backend == "serial" or total == 0:
        out = []
        for i, c in enumerate(cases):
            out.append(fn(c))
            if progress:
                progress(i + 1, total)
        return out
    if backend == "pool":
        n = max(1, min(workers or os.cpu_count() or 1, total))
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
            futures = [pool.submit(fn, c) for c in cases]
            for done, fut in enumerate(futures, 1):
                fut.result()
                if progress:
                    progress(done, total)
            return [f.result() for f in futures]
    if not ray_available():
        raise ConfigError("sweep", "backend", "ray is not installed", "pip install 'orchestrl[ray]', or backend pool")
    import ray

    check_ray_address(ray_address, source="sweep", option="ray_address")
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=ray_address, num_cpus=None if ray_address else (workers or os.cpu_count()),
                 include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        task = ray.remote(fn)
        refs = [task.remote(c) for c in cases]
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            done += len(ready)
            if progress:
                progress(done, total)
        return ray.get(refs)
    finally:
        if started_here and ray_address is None:
            ray.shutdown()


@dataclass(frozen=True)
class NetCase:
    """One network case: a collective over groups of GPUs on one fabric at one scale and link speed."""

    fabric: str
    gpus: int
    link_gbps: float = 200.0
    primitive: str = "all-to-all"
    group_size: int = 64
    bytes_per_rank: float = 1e9
    stride: int = 1
    algorithm: str = "ring"


def run_net_case(case: NetCase) -> dict[str, Any]:
    """Return the timing of a :class:`NetCase` as a JSON-ready dict (the case's fields included)."""
    from orchestrl.fabric.intent import Collective
    from orchestrl.sim.network.collectives import groups_of
    from orchestrl.sim.network.config import SimConfig
    from orchestrl.sim.network.netsim import NetworkSim

    sim = NetworkSim(case.fabric, case.gpus, SimConfig(link_bps=case.link_gbps * 1e9))
    groups = groups_of(case.gpus, min(case.group_size, case.gpus), case.stride)
    timing = sim.time_collective(Collective(case.primitive, groups=groups, bytes_per_rank=case.bytes_per_rank),
                                 case.algorithm)
    return {**asdict(case), **timing.to_json()}
