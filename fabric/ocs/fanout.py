"""Run one piece of work per OCS device, all devices at once.

Design note
-----------
Devices are independent: a bulk command to one never waits for another, and each TL1 session
serialises its own commands (:class:`fabric.ocs.session.Tl1Session` holds a lock). So the commands
of one commit step go out to every device together and the step takes as long as its slowest
device, not the sum of all of them.

Without threads where the work allows it: a job given as :class:`SendCollect` writes its commands
(``send``, which returns at once) and reads the replies later (``collect``). The caller's thread
sends every such job's commands first and then collects each reply in turn, so the devices work
at the same time while one thread waits; a thread hand-off per device (handing a job to a pool
thread and waking the caller again costs about as much as a TL1 round trip on a busy host) is
saved. A job given as a plain callable (a client without the split API, e.g. a test fake) runs
on a shared thread pool, since a TL1 round trip spends its time waiting on a socket, which
releases the GIL; when every job is such a callable, the first one runs in the caller's own
thread (a single job needs no thread at all). The work never nests, so the pool cannot deadlock
on itself.

Exceptions: the work is expected to turn device errors into results; anything else it raises
(a programming error, or a simulated crash in tests) is re-raised here after every job has
finished, the first in device order, so no device is left with a command running or a reply
unread: a failed ``send`` skips only its own ``collect``, and every other device is still
collected.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, TypeVar, Union

__all__ = ["MAX_PARALLEL_DEVICES", "SendCollect", "each_device"]

MAX_PARALLEL_DEVICES = 64  # threads of the shared pool: more devices than this queue up
T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class SendCollect(Generic[P, T]):
    """One device's work in two halves, so that one thread can drive many devices at once."""

    send: Callable[[], P]  # writes the device's commands and returns without waiting for a reply
    collect: Callable[[P], T]  # given what ``send`` returned, waits for the replies; the job's result


Job = Union[Callable[[], T], SendCollect[Any, T]]
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL_DEVICES, thread_name_prefix="ocs-device")
        return _pool


def each_device(jobs: Mapping[str, Job[T]]) -> dict[str, T]:
    """Run ``jobs`` (device name -> work) concurrently; return each job's result by device name.

    A :class:`SendCollect` job is sent with the others before any is collected, all in the
    caller's thread; a callable job runs on a pool thread (see the module's design note).

    Raises
    ------
    BaseException
        The first exception (in sorted device order) that a job raised, after all jobs ended.

    Notes
    -----
    Wall time is that of the slowest job plus, per callable job after the first, a thread
    hand-off; :class:`SendCollect` jobs add only their own ``send`` and ``collect`` work.

    Examples
    --------
    >>> each_device({"core0": lambda: 1, "pod0/agg0": lambda: 2})
    {'core0': 1, 'pod0/agg0': 2}
    >>> each_device({"core0": SendCollect(lambda: 20, lambda sent: sent + 1), "pod0/agg0": lambda: 2})
    {'core0': 21, 'pod0/agg0': 2}
    """
    names = sorted(jobs)
    split = [name for name in names if isinstance(jobs[name], SendCollect)]
    if not split:
        return _threaded(names, jobs)
    called = [name for name in names if name not in split]
    futures: dict[str, Future] = {name: _shared_pool().submit(jobs[name]) for name in called}  # type: ignore[arg-type]
    errors: dict[str, BaseException] = {}
    sent: dict[str, Any] = {}
    for name in split:  # every device's commands go out before any reply is awaited
        try:
            sent[name] = jobs[name].send()  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every device is done
            errors[name] = exc
    out: dict[str, T] = {}
    for name in split:
        if name in sent:
            try:
                out[name] = jobs[name].collect(sent[name])  # type: ignore[union-attr]
            except BaseException as exc:  # noqa: BLE001 - as above
                errors[name] = exc
    for name, future in futures.items():
        try:
            out[name] = future.result()
        except BaseException as exc:  # noqa: BLE001 - as above
            errors[name] = exc
    if errors:
        raise errors[min(errors)]
    return {name: out[name] for name in names}


def _threaded(names: list[str], jobs: Mapping[str, Job[T]]) -> dict[str, T]:
    """Run callable ``jobs`` on the shared pool, the first in the caller's thread."""
    if len(names) <= 1:
        return {name: jobs[name]() for name in names}  # type: ignore[operator]
    pool = _shared_pool()
    futures: dict[str, Future] = {name: pool.submit(jobs[name]) for name in names[1:]}  # type: ignore[arg-type]
    out: dict[str, T] = {}
    first: BaseException | None = None
    for name in names:
        try:  # the first device's job runs here, in the caller's thread, while the pool runs the others
            out[name] = futures[name].result() if name in futures else jobs[name]()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every device is done
            first = first or exc
    if first is not None:
        raise first
    return out
