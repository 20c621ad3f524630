"""Hold an emulated port in the ``tuning`` state while a test sends commands that touch it."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.emulator_control import EmulatorControl
from orchestrl.fabric.ocs.model import BulkResult


@contextmanager
def port_tuning(control: EmulatorControl, mover: Tl1Driver, watcher: Tl1Driver, pair: tuple[int, int],
                switch_ms: float = 1500) -> Iterator[list[BulkResult]]:
    """Have ``mover`` connect ``pair`` with mirrors that take ``switch_ms``, in a thread.

    Yields once ``watcher`` sees the pair's ingress port tuning (with switching set fast again, so what
    the test sends meanwhile is not slowed); the list it yields holds the mover's result after the
    block, which waits for the mover to finish.
    """
    done: list[BulkResult] = []
    control.switch_delay(switch_ms)
    worker = threading.Thread(target=lambda: done.append(mover.connect([pair])))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        # no TL1 read shows a mirror in motion (docs/ocs.md): the emulator's own counters do
        while str(pair[0]) not in control.settings()["TUNING"].split("&"):
            assert time.monotonic() < deadline, f"port {pair[0]} never went tuning"
            time.sleep(0.01)
        control.switch_delay(0)
        yield done
    finally:
        worker.join(20)
