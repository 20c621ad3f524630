"""Run one piece of work per OCS device, all devices at once.

Design note
-----------
Devices are independent: a bulk command to one never waits for another, and each TL1 session
serialises its own commands (:class:`fabric.ocs.driver.Tl1Driver` holds a lock). So the commands
of one commit step go out to every device together and the step takes as long as its slowest
device, not the sum of all of them. A TL1 round trip spends its time waiting on a socket, which
releases the GIL, so threads suffice. One shared pool serves every caller, and the first device's
job runs in the caller's own thread (a single job needs no thread at all): handing a job to a
pool thread and waking the caller again costs about as much as a TL1 round trip on a busy host.
The work never nests, so the pool cannot deadlock on itself.

Exceptions: the work is expected to turn device errors into results; anything else it raises
(a programming error, or a simulated crash in tests) is re-raised here after every job has
finished, the first in device order, so no device is left with a command still running.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping, TypeVar

__all__ = ["MAX_PARALLEL_DEVICES", "each_device"]

MAX_PARALLEL_DEVICES = 64  # threads of the shared pool: more devices than this queue up
T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL_DEVICES, thread_name_prefix="ocs-device")
        return _pool


def each_device(jobs: Mapping[str, Callable[[], T]]) -> dict[str, T]:
    """Run ``jobs`` (device name -> work) concurrently; return each job's result by device name.

    Raises
    ------
    BaseException
        The first exception (in sorted device order) that a job raised, after all jobs ended.

    Notes
    -----
    Wall time is that of the slowest job plus a thread hand-off per job after the first.

    Examples
    --------
    >>> each_device({"core0": lambda: 1, "pod0/agg0": lambda: 2})
    {'core0': 1, 'pod0/agg0': 2}
    """
    names = sorted(jobs)
    if len(names) <= 1:
        return {name: jobs[name]() for name in names}
    pool = _shared_pool()
    futures: dict[str, Future] = {name: pool.submit(jobs[name]) for name in names[1:]}
    out: dict[str, T] = {}
    first: BaseException | None = None
    for name in names:
        try:  # the first device's job runs here, in the caller's thread, while the pool runs the others
            out[name] = futures[name].result() if name in futures else jobs[name]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every device is done
            first = first or exc
    if first is not None:
        raise first
    return out
