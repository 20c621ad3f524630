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

from contextlib import suppress
from functools import partial
from itertools import repeat
from typing import Any, Iterable

from orchestrl.fabric.ocs.errors import (OcsAborted, OcsAuthError, OcsCommandError, OcsProtocolError, OcsRequestError,
                              denied_from_code)
from orchestrl.fabric.ocs.model import BulkResult, PortState, PortStatus, XcStatus, applied_status, normalize_mode
from orchestrl.fabric.ocs.session import PendingReply, Tl1Session, _Spec
from orchestrl.fabric.ocs.tl1 import Response, format_pair_lists, format_ports, parse_patch_line

__all__ = ["PendingReply", "Tl1Driver"]

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
        """Return who this switch says it is: its TL1 source identifier (SID), read at login.

        TL1 addresses a network element by its TID/SID, which is unique among the switches one
        controller drives; two addresses answering with one SID are one switch.
        """
        self.open()
        return f"TL1 SID {self.sid}"

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
            specs += [("ENT-PATCH", format_pair_lists(checked_pairs), ())] if checked_pairs else []
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
        ent = replies[-1] if pairs else None
        if dlt is not None and not dlt.ok:
            raise self._denied("DLT-PATCH", dlt, ports)
        if ent is not None and not ent.ok:
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
        """Return the state and alarm text of ``ports`` (every port when None)."""
        aid = "ALL" if ports is None else format_ports(ports)
        resp = self._checked("RTRV-PORT-STATUS", aid, read=True)
        out: dict[int, PortStatus] = {}
        for line in resp.data:
            port, _, rest = line.partition(":")
            state, _, alarm = rest.partition(",")
            try:
                out[int(port)] = PortStatus(int(port), PortState(state.strip()), alarm)
            except ValueError:
                raise OcsProtocolError(self.name, "RTRV-PORT-STATUS", f"data line {line!r} is not "
                                                                      "'<port>:<state>[,<alarm>]'") from None
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
        ports, n = list(map(int, ports)), self._size()
        if ports and (min(ports) < 1 or max(ports) > 2 * n):
            p = next(p for p in ports if not 1 <= p <= 2 * n)
            raise OcsRequestError(self.name, "DLT-PATCH", f"port {p} is outside 1..{2 * n}; "
                                                          f"use device ports of this {n}x{n} switch", [p])
        return ports

    def _checked_pairs(self, pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """``pairs`` as int pairs, checked as :meth:`_check_pairs` does, with set operations when all is well."""
        pairs = list(pairs)
        ins, outs = zip(*pairs) if pairs else ((), ())
        ins, outs = tuple(map(int, ins)), tuple(map(int, outs))
        pairs, n = list(zip(ins, outs)), self._size()
        if pairs and not (1 <= min(ins) and max(ins) <= n and n < min(outs) and max(outs) <= 2 * n
                          and len(set(ins)) == len(ins) and len(set(outs)) == len(outs)):
            self._check_pairs(pairs)  # something is wrong: find the first bad port, in request order
        return pairs

    def _check_pairs(self, pairs: list[tuple[int, int]]) -> None:
        n, seen = self._size(), set()
        for ingress, egress in pairs:
            if not 1 <= ingress <= n:
                raise OcsRequestError(self.name, "ENT-PATCH", f"port {ingress} is not an ingress port (1..{n}); "
                                                              "give pairs as (ingress, egress)", [ingress])
            if not n < egress <= 2 * n:
                raise OcsRequestError(self.name, "ENT-PATCH", f"port {egress} is not an egress port "
                                                              f"({n + 1}..{2 * n}); give pairs as (ingress, egress)",
                                      [egress])
            for p in (ingress, egress):
                if p in seen:
                    raise OcsRequestError(self.name, "ENT-PATCH", f"port {p} is named twice in one bulk; "
                                                                  "each port joins at most one cross-connect", [p])
                seen.add(p)

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
