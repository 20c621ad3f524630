"""A TL1 driver for Polatis-style optical circuit switches over TCP (implements :class:`OcsDeviceClient`).

Design note
-----------
A driver is one TL1 session (:class:`fabric.ocs.session.Tl1Session`: login, ctags, reconnects,
what is retried) plus the device model's commands on it. Each call sends its command (or, for
:meth:`Tl1Driver.disconnect_then_connect`, its two commands back to back: one round trip) and reads
until every reply it awaits has come. A caller driving several devices at once splits such a call
in two instead of using a thread per device: :meth:`Tl1Driver.send_disconnect_then_connect` writes
the commands and returns a :class:`~fabric.ocs.session.PendingReply`, and :meth:`Tl1Driver.collect`
later returns (or raises) exactly what the one-call method would.

A ``DENY`` becomes the specific :class:`OcsDenied` subclass of its code (:mod:`.errors`); a bulk
aborted part way (``SABT``) is read back and raised as :class:`OcsAborted` with the pairs that
were and were not applied. Requests are checked before anything is sent (:class:`OcsRequestError`).

A bulk connect of k pairs is ONE ``ENT-PATCH`` (one switching delay on the device). Its timeout is
``timeout_s + switch_delay_s``, so slow technologies (robotic: 120 s) need their delay configured.
"""

from __future__ import annotations

import re
from contextlib import suppress
from functools import partial
from itertools import repeat
from typing import Any, Iterable



from orchestrl.fabric.ocs.adapter import Capabilities, check_pairs, check_ports, chunked
from orchestrl.fabric.ocs.errors import OcsAborted, OcsAuthError, OcsCommandError, OcsProtocolError, denied_from_code
from orchestrl.fabric.ocs.model import BulkResult, PortState, PortStatus, XcStatus, applied_status, normalize_mode
from orchestrl.fabric.ocs.session import PendingReply, Tl1Session, _Spec
from orchestrl.fabric.ocs.tl1 import Response, format_pair_lists, format_ports, parse_patch_line

__all__ = ["PendingReply", "Tl1Driver"]

_SERIAL = re.compile(r"\bSN=([A-Za-z0-9_.-]+)")  # RTRV-INV's serial number, as Polatis clients read it

# a step's checked ports and pairs, its commands (verb, aid, params) and its addition's statuses once applied
_StepRequest = tuple[list[int], list[tuple[int, int]], list[_Spec], list[XcStatus]]


class Tl1Driver(Tl1Session):
    """Drive one optical circuit switch over TL1/TCP.

    Parameters
    ----------
    host, port : str, int
        Address of the device's TL1 listener.
    name : str, optional
        Topology device name used in every error message (default ``host:port``).
    user, password : str
        TL1 credentials (``ACT-USER``).
    timeout_s : float
        Seconds to wait for a reply (plus ``switch_delay_s`` for ``ENT-PATCH``) and for a TCP
        connect.
    ports : int, optional
        ``N`` ports per side; read from the device (``RTRV-EQPT``) when the session opens if None.
    switch_delay_s : float
        The device's switching delay (its technology's, Table 2), added to connect timeouts.
    connect_attempts : int
        TCP connect attempts per (re)connection, ``backoff_s * 2**k`` apart (capped by
        ``backoff_max_s``).

    Examples
    --------
    >>> drv = Tl1Driver("127.0.0.1", 9, name="core0", ports=16)
    >>> drv.connect([(1, 40)])
    Traceback (most recent call last):
    ...
    orchestrl.fabric.ocs.errors.OcsRequestError: OCS 'core0', command ENT-PATCH, port 40: port 40 is not an egress port ...
    """

    def __init__(self, host: str, port: int, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        # (ports, pairs) -> checked ports, checked pairs, command texts: the last few step requests
        self._requests: dict[tuple[tuple[int, ...], tuple[tuple[int, int], ...]], _StepRequest] = {}  # last few
        self._removals: dict[tuple[str, ...], list[XcStatus]] = {}  # DLT-PATCH reply lines -> their statuses

    # -- device model -----------------------------------------------------------------------
    def open(self) -> "Tl1Driver":
        """Connect and log in now (otherwise the first command does it); return self.

        Afterwards :attr:`ports` is known (read from the device when it was not configured).
        """
        with self._lock:
            self._ensure_session()
        return self

    def identity(self) -> str:
        """Return who this switch says it is: its serial number (``RTRV-INV::OCS``), else its TL1 SID.

        A serial number is the switch's own and the same under any address; a switch that does not
        answer ``RTRV-INV`` is named by the source identifier (SID) it answered the login with, which
        TL1 keeps unique among the switches one controller drives (``SET-SID`` sets it).
        """
        self.open()
        resp = self._command("RTRV-INV", "OCS", read=True)
        serial = next((m.group(1) for line in resp.data if (m := _SERIAL.search(line))), None) if resp.ok else None
        return f"serial {serial}" if serial else f"TL1 SID {self.sid}"

    @property
    def capabilities(self) -> Capabilities:
        """TL1: one ``ENT-PATCH`` per bulk (up to ``max_bulk`` pairs), checked whole; pipelined steps."""
        return Capabilities("tl1", self.transport, self.max_bulk or 1 << 20, atomic=True, pipelined=True)

    def _size(self) -> int:
        if self.ports is None:
            self.open()
        assert self.ports is not None
        return self.ports

    def cross_connects(self) -> dict[int, int]:
        """Return the device's cross-connect table as ``{ingress: egress}``."""
        resp = self._checked("RTRV-PATCH", read=True)
        return dict(sorted(parse_patch_line(line, self.name) for line in resp.data))

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        """Create ``(ingress, egress)`` cross-connects with one ``ENT-PATCH``; return per-pair statuses.

        ``mode="stop"``: the device applies all pairs or none; a refusal raises its
        :class:`OcsDenied` subclass. ``mode="continue"``: refused pairs get their TL1 code as
        status and the rest are sent again as one bulk, so a bad pair costs one extra command.

        Raises
        ------
        OcsRequestError
            A port is outside the device, on the wrong side, or named twice (nothing is sent).
        OcsAborted
            The device applied only part of the bulk; ``applied``/``unapplied`` are read back.
        OcsTimeout, OcsConnectionError
            No reply: the device may have applied the bulk; read :meth:`cross_connects` back.
        """
        mode = normalize_mode(mode, self.name, "ENT-PATCH")
        pairs = self._checked_pairs(pairs)
        if self.max_bulk and len(pairs) > self.max_bulk:  # the switch takes at most max_bulk pairs per command
            parts = [self.connect(part, mode=mode) for part in chunked(pairs, self.max_bulk)]
            return BulkResult([st for part in parts for st in part.statuses], mode)
        statuses: dict[tuple[int, int], XcStatus] = {}
        remaining = list(pairs)
        while remaining:
            resp = self._command("ENT-PATCH", format_pair_lists(remaining), timeout_s=self.timeout_s + self.switch_delay_s)
            if resp.ok:
                if not statuses:  # the whole bulk at the first try (the usual case): statuses in request order
                    return BulkResult(list(map(applied_status, *zip(*pairs))), mode)
                statuses.update((p, XcStatus(*p)) for p in remaining)
                break
            if resp.code == "SABT":
                raise self._aborted(remaining, resp)
            error = self._denied("ENT-PATCH", resp, [p for pair in remaining for p in pair])
            named = set(error.ports)
            refused = [p for p in remaining if named & set(p)]
            if mode == "stop" or not refused or isinstance(error, (OcsAuthError, OcsCommandError)):
                raise error
            statuses.update((p, XcStatus(*p, error.code, error.message, (named & set(p)).pop())) for p in refused)
            remaining = [p for p in remaining if p not in refused]
        return BulkResult([statuses[p] for p in pairs], mode)

    def disconnect(self, ports: list[int]) -> BulkResult:
        """Remove the cross-connects on ``ports`` (either side) with one ``DLT-PATCH``.

        Returns one status per removed cross-connect; a port without one is a no-op.
        """
        ports = self._check_ports(ports)
        if not ports:
            return BulkResult([], "stop")
        resp = self._checked("DLT-PATCH", format_ports(ports), ports=ports)
        return self._removed(resp)

    def disconnect_then_connect(self, ports: list[int], pairs: list[tuple[int, int]]) -> tuple[BulkResult, BulkResult]:
        """Remove the cross-connects on ``ports``, then create ``pairs``: both commands in one round trip.

        The ``DLT-PATCH`` and the ``ENT-PATCH`` go out back to back before either reply is read;
        the device works through them in order, so the connect finds the ports the removal freed.
        Returns what :meth:`disconnect` and :meth:`connect` (``mode="stop"``) return, as a pair
        (an empty :class:`BulkResult` for an empty list, whose command is not sent).

        Raises
        ------
        OcsRequestError
            A port is outside the device, on the wrong side, or named twice (nothing is sent).
        OcsDenied
            The ``DLT-PATCH``'s refusal if it was refused, else the ``ENT-PATCH``'s, as the
            :class:`OcsDenied` subclass of its code. A refused removal does not hold back the
            connect sent with it, which the device may have applied: read :meth:`cross_connects`
            back.
        OcsAborted, OcsTimeout, OcsConnectionError
            As :meth:`connect`.
        """
        return self.collect(self.send_disconnect_then_connect(ports, pairs))

    def send_disconnect_then_connect(self, ports: list[int], pairs: list[tuple[int, int]]) -> PendingReply:
        """Write :meth:`disconnect_then_connect`'s commands and return at once, without reading a reply.

        Hand the result to :meth:`collect`, which returns or raises what
        :meth:`disconnect_then_connect` does. Between the two, the caller may write to other
        devices, so that several devices work at once without a thread each.

        Raises
        ------
        OcsRequestError
            As :meth:`disconnect_then_connect` (nothing is sent).
        OcsConnectionError, OcsAuthError
            The session could not be opened or logged in (nothing is sent).
        """
        ports, pairs, specs, added = self._step_request(ports, pairs)
        timeout_s = self.timeout_s + (self.switch_delay_s if pairs else 0.0)
        pending = self._send(specs, read=False, timeout_s=timeout_s)
        pending.finish = partial(self._step_results, ports, pairs, added)
        return pending

    def _step_request(self, ports: Iterable[int], pairs: Iterable[tuple[int, int]]) -> _StepRequest:
        """The checked ports and pairs of a step, its commands' text and the statuses of its addition once applied.

        An RL job's steps recur every iteration, so the last few requests are kept by their content.
        """
        ports, pairs = tuple(ports), tuple(pairs)
        try:
            got = self._requests.get((ports, pairs))
        except TypeError:  # unhashable items (lists as pairs): checked and formatted every time
            got, ports, pairs = None, list(ports), list(pairs)
        if got is None:
            checked_ports, checked_pairs = self._check_ports(ports), self._checked_pairs(pairs)
            specs: list[_Spec] = [("DLT-PATCH", format_ports(checked_ports), ())] if checked_ports else []
            specs += [("ENT-PATCH", format_pair_lists(part), ()) for part in chunked(checked_pairs, self.max_bulk)
                      if part]
            added = list(map(applied_status, *zip(*checked_pairs))) if checked_pairs else []
            got = (checked_ports, checked_pairs, specs, added)
            if isinstance(pairs, tuple):
                while len(self._requests) >= 16:
                    self._requests.pop(next(iter(self._requests)))
                self._requests[(ports, pairs)] = got  # type: ignore[index]
        return got

    def _step_results(self, ports: list[int], pairs: list[tuple[int, int]], added: list[XcStatus],
                      replies: list[Response]) -> tuple[BulkResult, BulkResult]:
        """:meth:`disconnect_then_connect`'s results from its replies (one per non-empty list), or its error."""
        dlt = replies[0] if ports else None
        ents = replies[1 if ports else 0:] if pairs else []  # one ENT-PATCH per max_bulk pairs
        if dlt is not None and not dlt.ok:
            raise self._denied("DLT-PATCH", dlt, ports)
        for ent in ents:
            if not ent.ok:
                if ent.code == "SABT":
                    raise self._aborted(pairs, ent)
                raise self._denied("ENT-PATCH", ent, [p for pair in pairs for p in pair])
        removed = self._removed(dlt) if dlt is not None else BulkResult([], "stop")
        return removed, (BulkResult(list(added), "stop") if pairs else BulkResult())

    def _removed(self, resp: Response) -> BulkResult:
        """The statuses of a ``DLT-PATCH``'s reply: one data line ``<in>,<out>`` per removed cross-connect.

        A recurring step gets the same reply: the last few are kept by their data lines.
        """
        got = self._removals.get(resp.data)
        if got is None:
            got = self._removal_statuses(resp.data)
            while len(self._removals) >= 16:
                self._removals.pop(next(iter(self._removals)))
            self._removals[resp.data] = got
        return BulkResult(list(got))

    def _removal_statuses(self, data: tuple[str, ...]) -> list[XcStatus]:
        if set(map(str.count, data, repeat(","))) <= {1}:  # "<in>,<out>" lines: all at once, no loop
            # not two numbers a line: parse_patch_line below names the line (or takes the first two fields)
            with suppress(ValueError):
                ports = list(map(int, ",".join(data).split(","))) if data else []
                return list(map(applied_status, ports[::2], ports[1::2]))
        return [applied_status(*parse_patch_line(line, self.name)) for line in data]

    def port_status(self, ports: Iterable[int] | None = None) -> dict[int, PortStatus]:
        """Return the state and alarm text of ``ports`` (every port when None), as Polatis clients read them.

        Two reads in one round trip: ``RTRV-PORT-SHUTTER`` (``CLOSED``: force-blocked) and
        ``RTRV-PORT-POWER`` (an ingress port whose light is at or below ``los_dbm`` has lost its
        signal: failed, alarm ``LOS (<dBm> dBm)``). A switch cannot show a mirror in motion through
        either, so no port reads ``tuning``; and an egress port's fault shows in the refusals of the
        commands that use it (``SWFA``), not here, since an unpatched egress port carries no light.
        """
        n = self._size()
        wanted = list(range(1, 2 * n + 1)) if ports is None else self._check_ports(ports)
        aid = f"1&&{2 * n}" if ports is None else format_ports(wanted)
        shutter, power = self._pipeline([("RTRV-PORT-SHUTTER", aid, ()), ("RTRV-PORT-POWER", aid, ())], read=True)
        for verb, resp in (("RTRV-PORT-SHUTTER", shutter), ("RTRV-PORT-POWER", power)):
            if not resp.ok:
                raise self._denied(verb, resp, wanted)
        closed = {p for p, v in self._port_lines("RTRV-PORT-SHUTTER", shutter) if v.upper() == "CLOSED"}
        dark: dict[int, float] = {}
        for p, v in self._port_lines("RTRV-PORT-POWER", power):
            try:
                dbm = float(v)
            except ValueError:
                raise OcsProtocolError(self.name, "RTRV-PORT-POWER", f"port {p} power {v!r} is not a number of "
                                                                     "dBm") from None
            if p <= n and dbm <= self.los_dbm:
                dark[p] = dbm
        out = {}
        for p in wanted:
            if p in dark:
                out[p] = PortStatus(p, PortState.FAILED, f"LOS ({dark[p]:.2f} dBm)")
            elif p in closed:
                out[p] = PortStatus(p, PortState.FORCE_BLOCKED, "shutter closed")
            else:
                out[p] = PortStatus(p, PortState.NORMAL)
        return out

    def _port_lines(self, verb: str, resp: Response) -> list[tuple[int, str]]:
        """The ``"<port>:<value>"`` data lines of a port read."""
        out = []
        for line in resp.data:
            port, sep, value = line.partition(":")
            if not sep or not port.strip().isdigit():
                raise OcsProtocolError(self.name, verb, f"data line {line!r} is not '<port>:<value>'")
            out.append((int(port), value.strip()))
        return out

    def alarms(self) -> dict[int, str]:
        """Return ``{port: "<severity>,<alarm>"}`` for every port with a standing alarm."""
        resp = self._checked("RTRV-ALM-ALL", read=True)
        return {int(line.partition(":")[0]): line.partition(":")[2] for line in resp.data}

    def block(self, ports: list[int]) -> None:
        """Force-block ``ports`` (close their shutters); connects on them are refused (SROF)."""
        self._checked("OPR-PORT-SHUTTER", format_ports(ports), ports=ports)

    def release(self, ports: list[int]) -> None:
        """Release force-blocked ``ports``."""
        self._checked("RLS-PORT-SHUTTER", format_ports(ports), ports=ports)

    # -- checks -----------------------------------------------------------------------------
    def _check_ports(self, ports: Iterable[int]) -> list[int]:
        """``ports`` as ints, each a port of the device (else :class:`OcsRequestError` naming the first bad one)."""
        return check_ports(ports, self._size(), self.name, "DLT-PATCH")

    def _checked_pairs(self, pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """``pairs`` as int pairs of the device, no port twice (else :class:`OcsRequestError` naming the first bad port)."""
        return check_pairs(pairs, self._size(), self.name, "ENT-PATCH")

    def _aborted(self, pairs: list[tuple[int, int]], resp: Response) -> OcsAborted:
        table = self.cross_connects()
        applied = tuple(p for p in pairs if table.get(p[0]) == p[1])
        unapplied = tuple(p for p in pairs if p not in applied)
        read_back = (f"{resp.comment}; read back: {len(applied)} of {len(pairs)} pairs applied"
                     + (f" ({', '.join(f'{i}->{e}' for i, e in applied)})" if applied else ""))
        exc = denied_from_code(self.name, "ENT-PATCH", "SABT", read_back, [p for pair in unapplied for p in pair])
        assert isinstance(exc, OcsAborted)
        exc.applied, exc.unapplied = applied, unapplied
        return exc

    def _checked(self, verb: str, aid: str = "", *, read: bool = False, ports: Iterable[int] = ()) -> Response:
        resp = self._command(verb, aid, read=read)
        if not resp.ok:
            raise self._denied(verb, resp, list(ports))
        return resp
