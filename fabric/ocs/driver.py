"""A TL1 driver for Polatis-style optical circuit switches over TCP (implements :class:`OcsDeviceClient`).

Design note
-----------
One driver holds one TCP session; a lock serialises callers, and each call sends its command (or,
for :meth:`Tl1Driver.disconnect_then_connect`, its two commands back to back, one round trip: TL1
allows several outstanding ctags on a session and the device works through commands in the order
it receives them) and then reads until every reply it awaits has come. Every command carries a
fresh ctag and replies are matched by ctag: autonomous messages (alarms) and stale replies are
logged and skipped, so a late answer to an earlier command can never be mistaken for a current
one. Failures are handled by what is safe to repeat:

* the session is opened lazily, with exponential backoff, and logged in (``ACT-USER``) each time;
  a session found dead before sending (device restarted) is reopened transparently;
* a read (``RTRV-*``) whose reply is lost or late is sent once more on a fresh session;
* a write (``ENT-PATCH``, ``DLT-PATCH``) is never repeated behind the caller's back: a timeout
  raises :class:`OcsTimeout`, drops the session (the next command opens a new one) and tells the
  caller to read the table back, since the device may have applied it;
* a ``DENY`` becomes the specific :class:`OcsDenied` subclass of its code (:mod:`.errors`); a
  bulk aborted part way (``SABT``) is read back and raised as :class:`OcsAborted` with the pairs
  that were and were not applied.

A bulk connect of k pairs is ONE ``ENT-PATCH`` (one switching delay on the device). Its timeout is
``timeout_s + switch_delay_s``, so slow technologies (robotic: 120 s) need their delay configured.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque
from itertools import repeat
from typing import Iterable

from fabric.ocs.errors import (
    OcsAborted, OcsAuthError, OcsCommandError, OcsConnectionError, OcsDenied, OcsError, OcsProtocolError,
    OcsRequestError, OcsTimeout, denied_from_code,
)
from fabric.ocs.model import BulkResult, PortState, PortStatus, XcStatus, applied_status, normalize_mode
from fabric.ocs.tl1 import (
    Autonomous, Command, Response, Tl1Splitter, format_command, format_pair_lists, format_ports, parse_keywords,
    parse_patch_line, parse_ports, parse_response, quote,
)

__all__ = ["Tl1Driver"]

log = logging.getLogger(__name__)


class _ConnectionLost(Exception):
    """Internal: the TCP session ended while a reply was awaited (``verb``: the first unanswered command)."""

    def __init__(self, problem: str, verb: str = "") -> None:
        super().__init__(problem)
        self.verb = verb


class Tl1Driver:
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
    fabric.ocs.errors.OcsRequestError: OCS 'core0', command ENT-PATCH, port 40: port 40 is not an egress port ...
    """

    def __init__(self, host: str, port: int, *, name: str = "", user: str = "admin", password: str = "",
                 timeout_s: float = 5.0, ports: int | None = None, switch_delay_s: float = 0.0,
                 connect_attempts: int = 6, backoff_s: float = 0.05, backoff_max_s: float = 2.0) -> None:
        self.host, self.port = host, int(port)
        self.name = name or f"{host}:{port}"
        self.user, self.password = user, password
        self.timeout_s = float(timeout_s)
        self.switch_delay_s = float(switch_delay_s)
        self.connect_attempts = max(1, int(connect_attempts))
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.ports: int | None = ports  # N; read from the device (RTRV-EQPT) when the session opens if None
        self._sock: socket.socket | None = None
        self._splitter = Tl1Splitter()
        self._blocks: deque[str] = deque()
        self._lock = threading.RLock()
        self._ctag = 0
        self.sessions = 0  # successful logins so far: > 1 means the driver reconnected
        self.autonomous: deque[Autonomous] = deque(maxlen=100)  # last alarms the device reported

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "Tl1Driver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Tl1Driver(name={self.name!r}, host={self.host!r}, port={self.port})"

    # -- device model -----------------------------------------------------------------------
    def open(self) -> "Tl1Driver":
        """Connect and log in now (otherwise the first command does it); return self.

        Afterwards :attr:`ports` is known (read from the device when it was not configured).
        """
        with self._lock:
            self._ensure_session()
        return self

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
        Returns what :meth:`disconnect` and :meth:`connect` (``mode="stop"``) return, as a pair.

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
        ports, pairs = self._check_ports(ports), self._checked_pairs(pairs)
        if not ports or not pairs:  # a single command: nothing to overlap
            return self.disconnect(ports), (self.connect(pairs) if pairs else BulkResult())
        dlt, ent = self._pipeline([("DLT-PATCH", format_ports(ports), ()), ("ENT-PATCH", format_pair_lists(pairs), ())],
                                  timeout_s=self.timeout_s + self.switch_delay_s)
        if not dlt.ok:
            raise self._denied("DLT-PATCH", dlt, ports)
        if not ent.ok:
            if ent.code == "SABT":
                raise self._aborted(pairs, ent)
            raise self._denied("ENT-PATCH", ent, [p for pair in pairs for p in pair])
        return self._removed(dlt), BulkResult(list(map(applied_status, *zip(*pairs))), "stop")

    def _removed(self, resp: Response) -> BulkResult:
        """The statuses of a ``DLT-PATCH``'s reply: one data line ``<in>,<out>`` per removed cross-connect."""
        if set(map(str.count, resp.data, repeat(","))) <= {1}:  # "<in>,<out>" lines: all at once, no loop
            try:
                ports = list(map(int, ",".join(resp.data).split(","))) if resp.data else []
                return BulkResult(list(map(applied_status, ports[::2], ports[1::2])))
            except ValueError:
                pass
        # not two numbers a line: parse_patch_line names the line (or takes the first two fields)
        return BulkResult([applied_status(*parse_patch_line(line, self.name)) for line in resp.data])

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

    def close(self) -> None:
        """Log out (best effort) and close the session; the device keeps its cross-connects."""
        with self._lock:
            if self._sock is None:
                return
            try:
                self._exchange(Command("CANC-USER", self.user, self._next_ctag()), min(self.timeout_s, 1.0))
            except (OcsError, _ConnectionLost) as exc:  # logging out of a dying session is not worth failing for
                log.debug("%s: logout failed: %s", self.name, exc)
            finally:
                self._drop()

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

    def _denied(self, verb: str, resp: Response, ports: list[int]) -> OcsDenied:
        named: list[int] = []
        if resp.data:
            try:
                named = parse_ports(resp.data[0], self.name, verb)
            except OcsProtocolError:
                named = []
        return denied_from_code(self.name, verb, resp.code, resp.comment, named or ports)

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

    # -- session and transport --------------------------------------------------------------
    def _next_ctag(self) -> str:
        self._ctag = self._ctag % 999_999 + 1
        return str(self._ctag)

    def _command(self, verb: str, aid: str = "", params: tuple[str, ...] = (), *, read: bool = False,
                 timeout_s: float | None = None) -> Response:
        """Send one command and return its reply; reads are retried once on a fresh session."""
        return self._pipeline([(verb, aid, params)], read=read, timeout_s=timeout_s)[0]

    def _pipeline(self, commands: list[tuple[str, str, tuple[str, ...]]], *, read: bool = False,
                  timeout_s: float | None = None) -> list[Response]:
        """Send ``commands`` (verb, aid, params) back to back and return their replies in the same order.

        One round trip for all of them. Reads are retried once on a fresh session; commands the
        device refused for want of a login (``PLNA``: nothing applied) are sent once more after
        logging in again; writes are never repeated otherwise.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        out: list[Response | None] = [None] * len(commands)
        with self._lock:
            todo = list(range(len(commands)))
            for attempt in range(2):
                self._ensure_session()
                cmds = [Command(verb, aid, self._next_ctag(), params=params)
                        for verb, aid, params in (commands[i] for i in todo)]
                try:
                    replies = self._exchange_all(cmds, timeout_s)
                except _ConnectionLost as exc:
                    self._drop()
                    if read and attempt == 0:
                        continue
                    raise OcsConnectionError(self.name, exc.verb, f"connection lost before the reply ({exc}); "
                                             "the device may have applied the command: read it back") from None
                except OcsTimeout:
                    if read and attempt == 0:
                        continue
                    raise
                for i, resp in zip(todo, replies):
                    out[i] = resp
                todo = [i for i, resp in zip(todo, replies) if resp.status == "DENY" and resp.code == "PLNA"]
                if not todo or attempt == 1:
                    return out  # type: ignore[return-value]  (every slot is filled)
                self._drop()  # the device forgot our login: log in again and resend (nothing was applied)
        raise AssertionError("unreachable")  # pragma: no cover

    def _ensure_session(self) -> None:
        if self._sock is not None and self._alive():
            return
        self._drop()
        last: Exception | None = None
        for attempt in range(self.connect_attempts):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s))
            try:
                self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
                break
            except OSError as exc:
                last = exc
        else:
            raise OcsConnectionError(self.name, "connect", f"cannot reach {self.host}:{self.port} after "
                                                           f"{self.connect_attempts} attempts ({last}); check the "
                                                           "device is up and its host/port in devices.yaml")
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            resp = self._exchange(Command("ACT-USER", self.user, self._next_ctag(), params=("", quote(self.password))),
                                  self.timeout_s)
        except _ConnectionLost as exc:
            self._drop()
            raise OcsConnectionError(self.name, "ACT-USER", f"connection closed during login ({exc})") from None
        if not resp.ok:
            self._drop()
            raise self._denied("ACT-USER", resp, [])
        if self.ports is None:
            self._read_size()
        self.sessions += 1
        if self.sessions > 1:
            log.info("%s: reconnected and logged in again (session %d)", self.name, self.sessions)

    def _read_size(self) -> None:
        try:
            resp = self._exchange(Command("RTRV-EQPT", "SYSTEM", self._next_ctag()), self.timeout_s)
        except _ConnectionLost as exc:
            self._drop()
            raise OcsConnectionError(self.name, "RTRV-EQPT", f"connection closed while reading the size ({exc})") from None
        line = next((d for d in resp.data if "SIZE=" in d), "") if resp.ok else ""
        try:
            self.ports = int(parse_keywords(line.partition(":")[2]).get("SIZE", "").lower().split("x")[0])
        except ValueError:
            self._drop()
            raise OcsProtocolError(self.name, "RTRV-EQPT", f"reply {resp.data or resp.code!r} gives no SIZE=<N>x<N>; "
                                                           "configure the device's ports instead") from None

    def _alive(self) -> bool:
        """Return False when the device closed the session (seen without blocking)."""
        assert self._sock is not None
        try:
            while select.select([self._sock], [], [], 0)[0]:
                data = self._sock.recv(65536)
                if not data:
                    return False
                self._blocks.extend(self._splitter.feed(data))
        except OSError:
            return False
        return True

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass  # already gone
        self._sock = None
        self._splitter = Tl1Splitter()
        self._blocks.clear()

    def _exchange(self, cmd: Command, timeout_s: float) -> Response:
        """Send ``cmd`` and return the reply with its ctag, skipping every other message."""
        return self._exchange_all([cmd], timeout_s)[0]

    def _exchange_all(self, cmds: list[Command], timeout_s: float) -> list[Response]:
        """Send ``cmds`` in one write and return their replies in order, matched by ctag (others skipped).

        The replies may arrive in any order; ``timeout_s`` bounds the wait for all of them.
        """
        assert self._sock is not None
        try:
            self._sock.sendall("".join(map(format_command, cmds)).encode("utf-8"))
        except OSError as exc:
            raise _ConnectionLost(str(exc), cmds[0].verb) from None
        waiting = {cmd.ctag: cmd for cmd in cmds}
        got: dict[str, Response] = {}
        deadline = time.monotonic() + timeout_s
        while waiting:
            while not self._blocks:
                first = next(iter(waiting.values()))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._drop()
                    raise OcsTimeout(self.name, first.verb, f"no reply within {timeout_s:g} s; the device may have "
                                                            "applied the command: read it back (the next command "
                                                            "opens a new session)")
                self._sock.settimeout(remaining)
                try:
                    data = self._sock.recv(65536)
                except socket.timeout:
                    continue
                except OSError as exc:
                    raise _ConnectionLost(str(exc), first.verb) from None
                if not data:
                    raise _ConnectionLost("closed by the device", first.verb)
                self._blocks.extend(self._splitter.feed(data))
            block = self._blocks.popleft()
            if not block.strip(" \r\n\t;<>"):
                continue
            try:
                msg = parse_response(block, self.name)
            except OcsProtocolError:
                self._drop()
                raise
            if isinstance(msg, Autonomous):
                log.info("%s: autonomous %s %s %s", self.name, msg.alarm, msg.verb, "; ".join(msg.data))
                self.autonomous.append(msg)
            elif msg.ctag not in waiting:
                log.info("%s: ignoring reply with ctag %s while waiting for %s (stale)", self.name, msg.ctag,
                         ", ".join(waiting))
            else:
                del waiting[msg.ctag]
                got[msg.ctag] = msg
        return [got[cmd.ctag] for cmd in cmds]
