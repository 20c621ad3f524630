"""Vendor-neutral OCS device model: ports by side, cross-connects, bulk results, port states.

The vocabulary follows the SAI / SONiC OCS model. A switch has ``N`` ports per side: the ingress
(A) side holds ports ``1..N`` and the egress (B) side ports ``N+1..2N``. A *cross-connect* steers
the light of one ingress port to one egress port, and every port is in at most one cross-connect.
Bulk operations return one status per cross-connect, in one of two modes: ``"stop"`` (SAI's
stop-on-error: the first failure ends the bulk and the rest are ``not-executed``) or
``"continue"`` (every item is tried). A port is ``normal``, ``tuning`` (its mirror is moving),
``failed`` (hardware) or ``force-blocked`` (an operator closed its shutter).

:class:`SwitchState` is that model as a pure, in-memory object (the emulator's state);
:class:`OcsDeviceClient` is the protocol every device driver implements.

Full-duplex mapping
-------------------
The planner (:mod:`fabric.plan`) thinks in *duplex* ports ``1..N``: a transceiver has one
ingress fibre and one egress fibre, so duplex port ``i`` is ingress port ``i`` plus egress port
``N+i``. A full-duplex circuit between duplex ports ``a`` and ``b`` is therefore two
cross-connects, one per direction::

    a -> b :  ingress a  ->  egress N+b
    b -> a :  ingress b  ->  egress N+a

:func:`duplex_to_cross_connects` gives the pair; :func:`cross_connects_to_duplex` reads a device's
table back into circuits, and reports a direction whose reverse is missing as a *half circuit*
(a fault or an interrupted reconfiguration: light flows one way only). A loopback ``a == b`` is one
cross-connect ``(a, N+a)``.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterable, Protocol, runtime_checkable

from orchestrl.fabric.ocs.errors import OcsRequestError

__all__ = [
    "PortState", "PortStatus", "XcStatus", "applied_status", "BulkResult", "BULK_MODES", "OK", "NOT_EXECUTED",
    "SwitchState", "OcsDeviceClient", "DuplexTable", "duplex_to_cross_connects", "cross_connects_to_duplex",
    "normalize_mode",
]

OK = "ok"  # status of a cross-connect that was applied
NOT_EXECUTED = "not-executed"  # a "stop" bulk ended before reaching this item (SAI_STATUS_NOT_EXECUTED)
BULK_MODES = ("stop", "continue")


class PortState(str, enum.Enum):
    """Operational state of one port (one fibre) of the switch."""

    NORMAL = "normal"
    TUNING = "tuning"  # the mirror is moving; the port refuses commands until it settles
    FAILED = "failed"  # hardware fault; connect is refused until repaired
    FORCE_BLOCKED = "force-blocked"  # shutter closed by an operator; connect is refused


@dataclass(frozen=True)
class PortStatus:
    """State of one port and the alarm text the device raised for it (empty when none)."""

    port: int
    state: PortState
    alarm: str = ""


@dataclass(frozen=True)
class XcStatus:
    """Outcome of one item of a bulk operation on cross-connect ``ingress -> egress``.

    ``status`` is :data:`OK`, :data:`NOT_EXECUTED` or the four-letter TL1 code of the refusal
    (``SAAL``, ``SNVS``, ... see :mod:`fabric.ocs.errors`). ``egress`` is 0 when a disconnect was
    refused for a port that carries no cross-connect (it then names the port as ``ingress``).
    """

    ingress: int
    egress: int
    status: str = OK
    message: str = ""  # why, in words, when status is not OK
    port: int = 0  # the port a refusal is about (0 when applied or not executed)

    @property
    def ok(self) -> bool:
        return self.status == OK


@functools.lru_cache(maxsize=1 << 16)
def applied_status(ingress: int, egress: int) -> XcStatus:
    """Return the status of an applied cross-connect ``ingress -> egress``.

    Statuses are immutable, so one object per pair serves every bulk result that applied it: a bulk
    of k pairs costs k dictionary look-ups instead of k dataclass constructions (~0.6 us each).
    """
    return XcStatus(ingress, egress)


_STATUS = attrgetter("status")


@dataclass
class BulkResult:
    """Per-item statuses of one bulk create or remove, in request order."""

    statuses: list[XcStatus] = field(default_factory=list)
    mode: str = "stop"

    @property
    def ok(self) -> bool:
        """True when every item was applied."""
        return set(map(_STATUS, self.statuses)) <= {OK}  # a loop in C: every commit step asks, for 100+ items

    @property
    def applied(self) -> list[tuple[int, int]]:
        """The ``(ingress, egress)`` pairs that were applied."""
        return [(s.ingress, s.egress) for s in self.statuses if s.ok]

    @property
    def failed(self) -> list[XcStatus]:
        """Items the device refused (not counting ``not-executed`` ones)."""
        return [s for s in self.statuses if s.status not in (OK, NOT_EXECUTED)]


def normalize_mode(mode: str, device: str = "", command: str = "") -> str:
    """Return ``"stop"`` or ``"continue"`` for a bulk mode (``"stop-on-error"`` is ``"stop"``)."""
    mode = "stop" if mode == "stop-on-error" else mode
    if mode not in BULK_MODES:
        raise OcsRequestError(device, command, f"unknown bulk mode {mode!r}; use 'stop' (stop-on-error) or 'continue'")
    return mode


class SwitchState:
    """In-memory cross-connect table and port states of one ``N x N`` switch (pure, no I/O).

    Parameters
    ----------
    ports_per_side : int
        ``N``: ingress ports are ``1..N``, egress ports ``N+1..2N``.
    name : str, optional
        Device name, used in error messages.

    Notes
    -----
    Invariant: every port is in at most one cross-connect, and every cross-connect joins an
    ingress port to an egress port. Operations cost O(1) per item.

    Examples
    --------
    >>> s = SwitchState(4)
    >>> s.connect([(1, 5)]).ok
    True
    >>> s.connect([(2, 5), (3, 6)], mode="continue").statuses[0].status
    'SAAL'
    >>> s.cross_connects()
    {1: 5, 3: 6}
    >>> [x.status for x in s.disconnect([5, 1]).statuses], s.cross_connects()
    (['ok'], {3: 6})
    """

    def __init__(self, ports_per_side: int, name: str = "") -> None:
        if isinstance(ports_per_side, bool) or not isinstance(ports_per_side, int) or ports_per_side < 1:
            raise OcsRequestError(name, "", f"ports_per_side={ports_per_side!r} is not a positive integer; "
                                            "give the number of ports on each side (N)")
        self.n = ports_per_side
        self.name = name
        self._out: dict[int, int] = {}  # ingress -> egress
        self._in: dict[int, int] = {}  # egress -> ingress
        self._state: dict[int, PortState] = {}  # only ports that are not NORMAL
        self._alarm: dict[int, str] = {}

    # -- lookups ----------------------------------------------------------------------------
    def side(self, port: int) -> str | None:
        """Return ``"ingress"``, ``"egress"`` or None when ``port`` is outside ``1..2N``."""
        if isinstance(port, bool) or not isinstance(port, int):
            return None
        if 1 <= port <= self.n:
            return "ingress"
        if self.n < port <= 2 * self.n:
            return "egress"
        return None

    def cross_connects(self) -> dict[int, int]:
        """Return the table as ``{ingress: egress}``, sorted by ingress port."""
        return dict(sorted(self._out.items()))

    def peer(self, port: int) -> int | None:
        """Return the port cross-connected to ``port``, or None."""
        return self._out.get(port, self._in.get(port))

    def state(self, port: int) -> PortState:
        return self._state.get(port, PortState.NORMAL)

    def ports_in_state(self, ports: Iterable[int], state: PortState) -> list[int]:
        """Return those of ``ports`` that are in ``state``, in order (one call for a whole bulk)."""
        if state is PortState.NORMAL:
            return [p for p in ports if p not in self._state]
        flagged = self._state
        return [p for p in ports if flagged.get(p) is state]

    def port_status(self, ports: Iterable[int] | None = None) -> dict[int, PortStatus]:
        """Return the status of ``ports`` (all ``2N`` ports when None)."""
        wanted = range(1, 2 * self.n + 1) if ports is None else ports
        return {p: PortStatus(p, self.state(p), self._alarm.get(p, "")) for p in wanted}

    def copy(self) -> "SwitchState":
        other = SwitchState(self.n, self.name)
        other._out, other._in = dict(self._out), dict(self._in)
        other._state, other._alarm = dict(self._state), dict(self._alarm)
        return other

    # -- port states ------------------------------------------------------------------------
    def set_port_state(self, ports: Iterable[int], state: PortState | str, alarm: str = "") -> None:
        """Put ``ports`` into ``state`` with ``alarm`` text (NORMAL clears the alarm)."""
        state = PortState(state)
        top, ports = 2 * self.n, list(ports)
        for p in ports:  # all checked before any changes
            if (type(p) is not int or not 1 <= p <= top) and self.side(p) is None:
                raise OcsRequestError(self.name, "set_port_state", f"port {p} is outside 1..{top}", [p])
        if state is PortState.NORMAL:
            for p in ports:
                self._state.pop(p, None)
                self._alarm.pop(p, None)
        else:
            self._state.update(dict.fromkeys(ports, state))
            self._alarm.update(dict.fromkeys(ports, alarm))

    def clear(self, keep_port_states: bool = True) -> None:
        """Remove every cross-connect (a cold restart); ``tuning`` ports settle to normal."""
        self._out.clear()
        self._in.clear()
        tuning = [p for p, s in self._state.items() if s is PortState.TUNING]
        self.set_port_state(tuning, PortState.NORMAL)
        if not keep_port_states:
            self._state.clear()
            self._alarm.clear()

    # -- bulk operations --------------------------------------------------------------------
    def _refusal(self, port: int, want_side: str) -> tuple[str, str, int] | None:
        side = self.side(port)
        if side is None:
            return "IIAC", f"port {port} is outside 1..{2 * self.n}", port
        if side != want_side:
            return "IIAC", f"port {port} is an {side} port, expected an {want_side} port", port
        state = self.state(port)
        if state is PortState.TUNING:
            return "SNVS", f"port {port} is tuning (mirror moving)", port
        if state is PortState.FAILED:
            alarm = f" ({self._alarm[port]})" if self._alarm.get(port) else ""
            return "SWFA", f"port {port} has failed{alarm}", port
        if state is PortState.FORCE_BLOCKED:
            return "SROF", f"port {port} is force-blocked", port
        return None

    def connect(self, pairs: Iterable[tuple[int, int]], mode: str = "stop") -> BulkResult:
        """Create cross-connects ``(ingress, egress)`` in order; return one status per pair.

        A pair is refused with ``IIAC`` (port outside the switch or on the wrong side), ``IDNV``
        (a port named twice in this request), ``SNVS``/``SWFA``/``SROF`` (port tuning, failed,
        force-blocked) or ``SAAL`` (port already in a cross-connect). In ``"stop"`` mode the
        pairs after the first refusal are ``not-executed``; pairs before it stay applied.
        """
        mode = normalize_mode(mode, self.name, "connect")
        return BulkResult(self._connect(pairs, mode, apply=True), mode)

    def check_connect(self, pairs: Iterable[tuple[int, int]]) -> list[XcStatus]:
        """Return the statuses :meth:`connect` would give in ``"continue"`` mode, changing nothing.

        O(k) for k pairs, whatever the size of the table: nothing is copied.
        """
        return self._connect(pairs, "continue", apply=False)

    def connect_refusal(self, pairs: Iterable[tuple[int, int]]) -> XcStatus | None:
        """Return the first refusal :meth:`connect` would give (None: it would apply every pair), changing nothing.

        What an atomic bulk command needs before it applies anything; O(k), no status per pair.
        """
        pairs = list(pairs)
        if pairs and self._plainly_free(pairs):
            return None
        return next(iter(self._connect(pairs, "stop", apply=False, refusals_only=True)), None)

    def _plainly_free(self, pairs: list[tuple[int, int]]) -> bool:
        """True when no pair can be refused: int ports on their sides, none named twice, flagged or in use.

        The same answer as the pass of :meth:`_connect` gives when it finds nothing, decided with
        set operations instead of a step per pair (False: let that pass find the first refusal).
        """
        if set(map(len, pairs)) != {2}:
            return False
        ins, outs = zip(*pairs)
        if set(map(type, ins)) != {int} or set(map(type, outs)) != {int}:
            return False
        n, free_in, free_out = self.n, set(ins), set(outs)
        return (len(free_in) == len(ins) and len(free_out) == len(outs) and 1 <= min(ins) and max(ins) <= n
                and n < min(outs) and max(outs) <= 2 * n and free_in.isdisjoint(self._out)
                and free_out.isdisjoint(self._in) and free_in.isdisjoint(self._state)
                and free_out.isdisjoint(self._state))

    def connect_atomic(self, pairs: list[tuple[int, int]], limit: int | None = None) -> XcStatus | None:
        """Create every pair, or none if any would be refused; return that first refusal (None: applied).

        What an atomic bulk command does, in one pass of checks (O(k), nothing copied) and one
        update of the table. ``limit`` applies only the first ``limit`` pairs once all have passed
        (a device that aborts a bulk part way).
        """
        refusal = self.connect_refusal(pairs)
        if refusal is None:
            done = pairs if limit is None else pairs[:limit]
            self._out.update(done)
            self._in.update({e: i for i, e in done})
        return refusal

    def _connect(self, pairs: Iterable[tuple[int, int]], mode: str, apply: bool,
                 refusals_only: bool = False) -> list[XcStatus]:
        # Within one request a port named again is refused as IDNV before the table is consulted,
        # so a pair applied earlier in the request never changes a later pair's status: the
        # checks against the table give the same answers whether or not earlier pairs were applied.
        n, top, flagged = self.n, 2 * self.n, self._state  # flagged: ports that are not NORMAL
        seen: set[int] = set()
        out: list[XcStatus] = []
        stopped = False
        for ingress, egress in pairs:
            if stopped:
                out.append(XcStatus(ingress, egress, NOT_EXECUTED))
                continue
            if (type(ingress) is int and type(egress) is int and 1 <= ingress <= n and n < egress <= top
                    and ingress not in flagged and egress not in flagged):
                refusal = None  # the common case, decided without a call
            else:
                refusal = self._refusal(ingress, "ingress") or self._refusal(egress, "egress")
            if refusal is None and (ingress in seen or egress in seen):
                twice = ingress if ingress in seen else egress
                refusal = ("IDNV", f"port {twice} is named twice in one request", twice)
            if refusal is None:
                busy = ingress if ingress in self._out else egress if egress in self._in else None
                if busy is not None:
                    refusal = ("SAAL", f"port {busy} is already cross-connected to port {self.peer(busy)}", busy)
            seen.add(ingress)
            seen.add(egress)
            if refusal is not None:
                out.append(XcStatus(ingress, egress, *refusal))
                if refusals_only:
                    break
                stopped = mode == "stop"
                continue
            if apply:
                self._out[ingress] = egress
                self._in[egress] = ingress
            if not refusals_only:
                out.append(XcStatus(ingress, egress))
        return out

    def disconnect(self, ports: Iterable[int], mode: str = "stop") -> BulkResult:
        """Remove the cross-connect on each of ``ports`` (either side); one status per removal.

        Naming both ends of one cross-connect removes it once. A port without a cross-connect is
        a no-op (removal is idempotent). Refusals: ``IIAC`` (port outside the switch), ``SNVS``
        (the cross-connect is still tuning). Failed and force-blocked ports may be disconnected:
        clearing a circuit never needs the mirror to find a target.
        """
        mode = normalize_mode(mode, self.name, "disconnect")
        return BulkResult(self._disconnect(ports, mode, apply=True), mode)

    def check_disconnect(self, ports: Iterable[int]) -> list[XcStatus]:
        """Return the statuses :meth:`disconnect` would give in ``"continue"`` mode, changing nothing.

        O(k) for k ports, whatever the size of the table: nothing is copied.
        """
        return self._disconnect(ports, "continue", apply=False)

    def disconnect_refusal(self, ports: Iterable[int]) -> XcStatus | None:
        """Return the first refusal :meth:`disconnect` would give (None: it would remove them all), changing nothing."""
        return next(iter(self._disconnect(ports, "stop", apply=False, refusals_only=True)), None)

    def disconnect_atomic(self, ports: Iterable[int]) -> tuple[XcStatus | None, list[tuple[int, int]]]:
        """Remove the cross-connects on ``ports``, or none if any removal would be refused.

        Returns the first refusal (as :meth:`disconnect_refusal`) and the ``(ingress, egress)``
        pairs removed, in request order: one pass of checks and one of deletions, O(k).
        """
        removed: dict[int, int] = {}  # ingress -> egress of the cross-connects this request removes
        flagged, table_out, table_in, top = self._state, self._out, self._in, 2 * self.n
        for port in ports:
            if port in table_out:
                ingress, egress = port, table_out[port]
            elif port in table_in:
                ingress, egress = table_in[port], port
            elif not (type(port) is int and 1 <= port <= top) and self.side(port) is None:
                return XcStatus(port, 0, "IIAC", f"port {port} is outside 1..{2 * self.n}", port), []
            else:
                continue  # no cross-connect on this port: a no-op
            if ingress in removed:
                continue  # the other end was named earlier in this request
            if (ingress in flagged or egress in flagged) and PortState.TUNING in (self.state(ingress),
                                                                                 self.state(egress)):
                return XcStatus(ingress, egress, "SNVS", f"cross-connect {ingress}->{egress} is tuning", port), []
            removed[ingress] = egress
        for ingress, egress in removed.items():
            del table_out[ingress], table_in[egress]
        return None, list(removed.items())

    def _disconnect(self, ports: Iterable[int], mode: str, apply: bool,
                    refusals_only: bool = False) -> list[XcStatus]:
        gone: set[int] = set()  # ingress ports of cross-connects this request removed (or would remove)
        out: list[XcStatus] = []
        stopped = False
        flagged, table_out, table_in, top = self._state, self._out, self._in, 2 * self.n
        for port in ports:
            if port in table_out:
                ingress, egress = port, table_out[port]
                peer: int | None = egress
            elif port in table_in:
                ingress, egress = table_in[port], port
                peer = ingress
            else:
                ingress, egress, peer = port, 0, None
            if peer is not None and ingress in gone:
                peer = None  # the other end was named earlier in this request: already removed
            if stopped:
                out.append(XcStatus(ingress, egress, NOT_EXECUTED))
                continue
            if not (type(port) is int and 1 <= port <= top) and self.side(port) is None:
                out.append(XcStatus(port, 0, "IIAC", f"port {port} is outside 1..{2 * self.n}", port))
                stopped = mode == "stop"
            elif peer is None:
                continue
            elif (ingress in flagged or egress in flagged) and PortState.TUNING in (self.state(ingress),
                                                                                   self.state(egress)):
                out.append(XcStatus(ingress, egress, "SNVS", f"cross-connect {ingress}->{egress} is tuning", port))
                stopped = mode == "stop"
            else:
                gone.add(ingress)
                if apply:
                    del table_out[ingress], table_in[egress]
                if not refusals_only:
                    out.append(XcStatus(ingress, egress))
                continue
            if refusals_only:
                break
        return out


@runtime_checkable
class OcsDeviceClient(Protocol):
    """What the control plane needs from one optical circuit switch (TL1 driver, emulator, ...).

    Port numbers are device ports: ingress ``1..ports``, egress ``ports+1..2*ports``. A client may
    also offer ``disconnect_then_connect(ports, pairs) -> (BulkResult, BulkResult)``, both bulks in
    one round trip (:meth:`fabric.ocs.driver.Tl1Driver.disconnect_then_connect`); a commit uses it
    where present.
    """

    name: str  # topology device name ("core0", "pod0/agg0")
    ports: int  # N, ports per side

    def cross_connects(self) -> dict[int, int]:
        """Return the device's table as ``{ingress: egress}``."""
        ...

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        """Create the ``(ingress, egress)`` cross-connects in one bulk operation."""
        ...

    def disconnect(self, ports: list[int]) -> BulkResult:
        """Remove the cross-connects on ``ports``; statuses name the removed cross-connects."""
        ...

    def port_status(self) -> dict[int, PortStatus]:
        """Return the state and alarm text of every port."""
        ...

    def close(self) -> None:
        """Release the session; the device keeps its cross-connects."""
        ...


@dataclass(frozen=True)
class DuplexTable:
    """A cross-connect table read as full-duplex circuits (see the module docstring)."""

    circuits: tuple[tuple[int, int], ...]  # duplex port pairs (a, b), a <= b, both directions present
    half_circuits: tuple[tuple[int, int], ...]  # (ingress, egress) whose reverse direction is missing


def _check_duplex(port: int, n: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= n:
        raise OcsRequestError("", "duplex_to_cross_connects", f"duplex port {port!r} is outside 1..{n}; "
                                                              f"duplex ports of an {n}x{n} switch are 1..{n}")


def duplex_to_cross_connects(a: int, b: int, n: int) -> list[tuple[int, int]]:
    """Return the ``(ingress, egress)`` cross-connects of a full-duplex circuit between duplex ports.

    Examples
    --------
    >>> duplex_to_cross_connects(1, 2, 16)
    [(1, 18), (2, 17)]
    >>> duplex_to_cross_connects(3, 3, 16)
    [(3, 19)]
    """
    _check_duplex(a, n)
    _check_duplex(b, n)
    if a == b:
        return [(a, n + a)]
    return [(a, n + b), (b, n + a)]


def cross_connects_to_duplex(table: dict[int, int], n: int) -> DuplexTable:
    """Return the full-duplex circuits and half circuits in a ``{ingress: egress}`` table.

    Notes
    -----
    O(len(table)). Cross-connects that do not join an ingress to an egress port of an ``n x n``
    switch are refused, since no circuit can be read from them.

    Examples
    --------
    >>> cross_connects_to_duplex({1: 18, 2: 17, 5: 20}, 16)
    DuplexTable(circuits=((1, 2),), half_circuits=((5, 20),))
    """
    circuits: list[tuple[int, int]] = []
    half: list[tuple[int, int]] = []
    for ingress, egress in sorted(table.items()):
        if not (1 <= ingress <= n and n < egress <= 2 * n):
            raise OcsRequestError("", "cross_connects_to_duplex", f"cross-connect {ingress}->{egress} does not join "
                                  f"an ingress port 1..{n} to an egress port {n + 1}..{2 * n}; check n")
        a, b = ingress, egress - n
        if a == b:
            circuits.append((a, a))
        elif table.get(b) == n + a:
            if a < b:
                circuits.append((a, b))
        else:
            half.append((ingress, egress))
    return DuplexTable(tuple(circuits), tuple(half))
