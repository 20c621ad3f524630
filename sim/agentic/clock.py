"""A virtual clock for asyncio: the agentic runtime's own code, run in simulated seconds.

Design note
-----------
The runtime waits only through the event loop (``asyncio.sleep``, ``wait_for`` timeouts, futures),
so replacing the loop's notion of time is enough to simulate it: :class:`VirtualClockLoop` reports
a virtual ``time()`` and its selector, instead of blocking for the next timer, advances that clock to
it (after polling real file descriptors without waiting, so sockets still work). Nothing else
changes: the proxy, workers, managers, buffer and bound are the objects the real runtime uses. A
loop with nothing scheduled and nothing to wait for is a deadlock in a simulation; it is reported
instead of spinning. (The technique of aiotools' ``VirtualClock`` and asynctest's ``ClockedTestCase``.)
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, TypeVar

__all__ = ["VirtualClockLoop", "run_virtual"]

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: "VirtualClockLoop") -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events:
            return events
        if timeout is None:
            if self._loop._idle_ok:
                return events
            raise RuntimeError("simulation deadlock: nothing is scheduled and nothing can wake the loop")
        if timeout > 0:
            self._loop._now += timeout
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer instead of waiting for it."""

    def __init__(self) -> None:
        self._now = 0.0
        self._idle_ok = False
        super().__init__(selector=_Selector(self))

    def time(self) -> float:
        return self._now


def run_virtual(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion on a fresh :class:`VirtualClockLoop`; return its result."""
    loop = VirtualClockLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
