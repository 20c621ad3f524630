"""In-memory OCS devices for tests, and crash injection for journalled commits.

:class:`FakeOcsDevice` implements :class:`fabric.ocs.model.OcsDeviceClient` over the model's own
:class:`~fabric.ocs.model.SwitchState`, so it keeps exactly the port rules of the emulator (each
port in at most one cross-connect, failed and force-blocked ports refuse ``connect``, removal is
idempotent). :class:`Crasher` numbers every point at which a controller process could die
(before and after each journal write and device command, and half-way through a bulk command)
and raises :class:`SimulatedCrash` at the chosen one.
"""

from __future__ import annotations

import threading
from typing import Any

from orchestrl.fabric.ocs.errors import OcsConnectionError
from orchestrl.fabric.ocs.model import (NOT_EXECUTED, BulkResult, PortState, PortStatus, SwitchState, XcStatus,
                              duplex_to_cross_connects)
from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.runtime.store import FabricStore


class SimulatedCrash(BaseException):
    """The controller process died here (a BaseException, so no ``except Exception`` handles it)."""


class Crasher:
    """Count crash points; raise :class:`SimulatedCrash` at point number ``at`` (None: never)."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.count = 0
        self.labels: list[str] = []
        self.crashed_at: str | None = None
        self._lock = threading.Lock()

    def point(self, label: str) -> None:
        with self._lock:  # devices of one step are driven from several threads at once
            self.labels.append(label)
            hit = self.at is not None and self.count == self.at
            self.count += 1
        if hit:
            self.crashed_at = label
            raise SimulatedCrash(label)


class FakeOcsDevice:
    """A faithful in-memory N x N switch speaking the device-client protocol."""

    def __init__(self, name: str, ports: int, crasher: Crasher | None = None) -> None:
        self.name = name
        self.ports = ports
        self.state = SwitchState(ports, name)
        self.crasher = crasher
        self.calls: list[tuple[str, Any]] = []  # mutating commands, in order
        self.closed = False
        self.down_after: int | None = None  # answer this many more calls, then act unreachable

    def _answer(self, method: str) -> None:
        if self.down_after is not None:
            if self.down_after <= 0:
                raise OcsConnectionError(self.name, method, "connection refused (injected by test)")
            self.down_after -= 1

    def _point(self, label: str) -> None:
        if self.crasher is not None:
            self.crasher.point(f"{self.name} {label}")

    # -- protocol ------------------------------------------------------------------------------
    def cross_connects(self) -> dict[int, int]:
        self._answer("cross_connects")
        return self.state.cross_connects()

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        pairs = list(pairs)
        self._answer("connect")
        self.calls.append(("connect", pairs))
        self._point("connect: before")
        if self.crasher is None:
            return self.state.connect(pairs, mode=mode)
        half = len(pairs) // 2
        first = self.state.connect(pairs[:half], mode=mode)
        if half:
            self._point("connect: half applied")  # the device applied part, the controller died
        if mode == "stop" and not first.ok:
            rest = BulkResult([XcStatus(i, e, NOT_EXECUTED) for i, e in pairs[half:]], mode)
        else:
            rest = self.state.connect(pairs[half:], mode=mode)
        self._point("connect: after")
        return BulkResult(first.statuses + rest.statuses, mode)

    def disconnect(self, ports: list[int]) -> BulkResult:
        ports = list(ports)
        self._answer("disconnect")
        self.calls.append(("disconnect", ports))
        self._point("disconnect: before")
        result = self.state.disconnect(ports)
        self._point("disconnect: after")
        return result

    def port_status(self) -> dict[int, PortStatus]:
        self._answer("port_status")
        return self.state.port_status()

    def close(self) -> None:
        self.closed = True

    # -- test helpers --------------------------------------------------------------------------
    def fail_port(self, port: int, state: PortState = PortState.FAILED) -> None:
        """Put one device port (ingress 1..N or egress N+1..2N) into ``state``."""
        self.state.set_port_state([port], state, alarm="injected by test")


class SplitFakeOcsDevice(FakeOcsDevice):
    """A fake with the TL1 driver's split API (:meth:`fabric.ocs.driver.Tl1Driver.send_disconnect_then_connect`).

    Like a real switch, it applies both commands when they arrive, i.e. on ``send``, removal
    first; ``collect`` hands over the replies. So a commit drives it without a thread, and a crash
    can fall between one device's commands and another's, or before any reply is read.
    """

    def send_disconnect_then_connect(self, ports: list[int], pairs: list[tuple[int, int]]) -> Any:
        removed = self.disconnect(ports) if ports else BulkResult()
        added = self.connect(pairs) if pairs else BulkResult()
        return removed, added

    def collect(self, pending: Any) -> Any:
        self._point("collect: before")
        return pending


class CrashingStore(FabricStore):
    """A :class:`FabricStore` whose journal writes are crash points of ``crasher``."""

    def __init__(self, path: Any, crasher: Crasher, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.crasher = crasher

    def begin_commit(self, *args: Any, **kwargs: Any) -> int:
        self.crasher.point("store begin_commit: before")
        cid = super().begin_commit(*args, **kwargs)
        self.crasher.point("store begin_commit: after")
        return cid

    def record_step(self, *args: Any, **kwargs: Any) -> None:
        self.crasher.point("store record_step: before")
        super().record_step(*args, **kwargs)
        self.crasher.point("store record_step: after")

    def record_steps(self, *args: Any, **kwargs: Any) -> None:
        self.crasher.point("store record_steps: before")
        super().record_steps(*args, **kwargs)
        self.crasher.point("store record_steps: after")

    def finish_commit(self, *args: Any, **kwargs: Any) -> None:
        self.crasher.point("store finish_commit: before")
        super().finish_commit(*args, **kwargs)
        self.crasher.point("store finish_commit: after")

    def advance_commit(self, *args: Any, **kwargs: Any) -> int:
        self.crasher.point("store advance_commit: before")
        cid = super().advance_commit(*args, **kwargs)
        self.crasher.point("store advance_commit: after")
        return cid


def expected_tables(plan: CircuitPlan | None, devices: dict[str, FakeOcsDevice]) -> dict[str, dict[int, int]]:
    """Return the ingress -> egress table each device must hold for ``plan`` (None: empty)."""
    out: dict[str, dict[int, int]] = {name: {} for name in devices}
    for c in plan.circuits if plan is not None else ():
        out[c.xc.device].update(duplex_to_cross_connects(c.xc.a_port, c.xc.b_port, devices[c.xc.device].ports))
    return {name: dict(sorted(t.items())) for name, t in out.items()}


def tables(devices: dict[str, FakeOcsDevice]) -> dict[str, dict[int, int]]:
    return {name: dev.cross_connects() for name, dev in devices.items()}
