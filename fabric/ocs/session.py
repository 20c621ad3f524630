"""One TL1 session with one optical circuit switch: login, ctags, commands out and their replies back.

Design note
-----------
A session is one TCP connection; a lock serialises its callers. Commands go out with a fresh ctag
each and replies are matched by ctag: autonomous messages (alarms) and stale replies are logged and
skipped, so a late answer to an earlier command can never be mistaken for a current one. Several
commands may be written back to back before any reply is read (TL1 allows several outstanding
ctags, and a device works through commands in the order it receives them), which makes them one
round trip.

Writing and reading are two halves a caller may hold apart: :meth:`Tl1Session._send` writes and
returns a :class:`PendingReply` keyed by the commands' ctags, and :meth:`Tl1Session.collect` reads
the replies later. So one thread can write to every device of a step first and then read each
reply, and the devices work at once without a thread each. A reply that another command's read
meets first is kept for its handle rather than skipped; a handle whose session ended before its
reply came fails as a lost connection. Failures are handled by what is safe to repeat:

* the session is opened lazily, with exponential backoff, and logged in (``ACT-USER``) each time;
  a session found dead before sending (device restarted) is reopened transparently;
* a read (``RTRV-*``) whose reply is lost or late is sent once more on a fresh session;
* commands refused for want of a login (``PLNA``: nothing applied) are sent once more after
  logging in again;
* a write (``ENT-PATCH``, ``DLT-PATCH``) is never repeated otherwise: a timeout raises
  :class:`OcsTimeout` and drops the session (the next command opens a new one), a lost connection
  raises :class:`OcsConnectionError`, and both tell the caller to read the table back, since the
  device may have applied it.
"""

from __future__ import annotations

from contextlib import suppress
import logging
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from orchestrl.fabric.ocs.errors import (OcsConnectionError, OcsDenied, OcsError, OcsProtocolError, OcsRequestError,
                                        OcsTimeout, denied_from_code)
from orchestrl.fabric.ocs.tl1 import (Acknowledgement, Autonomous, Command, Response, Tl1Splitter, format_command, parse_keywords, parse_ports,
                            parse_response, quote)

__all__ = ["PendingReply", "Tl1Session"]

log = logging.getLogger("orchestrl.fabric.ocs.driver")  # one logger for the device layer's session and commands
_S = TypeVar("_S", bound="Tl1Session")


class _ConnectionLost(Exception):
    """Internal: the TCP session ended while a reply was awaited (``verb``: the first unanswered command)."""

    def __init__(self, problem: str, verb: str = "") -> None:
        super().__init__(problem)
        self.verb = verb


_Spec = tuple[str, str, tuple[str, ...]]  # a command to send: verb, aid, params (its ctag is given when sent)


@dataclass(eq=False)
class PendingReply:
    """Commands written to one session whose replies are not read yet (:meth:`Tl1Session.collect`)."""

    commands: tuple[Command, ...]  # as sent, back to back; their replies are matched by ctag
    session: int  # the session they went out on: a reply never comes on another one
    deadline: float  # time.monotonic() by which every reply must have come
    timeout_s: float  # the wait the deadline was set from (a timeout's message names it)
    read: bool  # only a read is sent once more, on a fresh session, when its reply is lost
    attempt: int = 0  # 1 for that one resend, or for commands resent after a forgotten login (PLNA)
    finish: Callable[[list[Any]], Any] | None = None  # replies -> what the one-call method returns or raises
    lost: str = ""  # the write failed (connection lost): :meth:`Tl1Session.collect` raises it
    collected: bool = False

    @property
    def ctags(self) -> tuple[str, ...]:
        """The ctags of the replies awaited, in the order the commands were sent."""
        return tuple(c.ctag for c in self.commands)


class Tl1Session:
    """The TCP session, login and reply matching of :class:`fabric.ocs.driver.Tl1Driver` (its parameters)."""

    def __init__(self, host: str, port: int, *, name: str = "", user: str = "admin", password: str = "",
                 timeout_s: float = 5.0, ports: int | None = None, switch_delay_s: float = 0.0,
                 connect_attempts: int = 6, backoff_s: float = 0.05, backoff_max_s: float = 2.0,
                 transport: str = "tcp", max_bulk: int = 0, los_dbm: float = -40.0,
                 ssh_known_hosts: str | None = None) -> None:
        if transport not in ("tcp", "ssh"):
            raise OcsRequestError(name or f"{host}:{port}", "open", f"TL1 transport {transport!r} is unknown; use tcp "
                                                                    "or ssh")
        self.transport = transport  # tcp: the TL1 port in clear; ssh: TL1 on an SSH session channel
        self.max_bulk = int(max_bulk)  # cross-connects per ENT-PATCH (0: no limit); larger bulks are split
        self.los_dbm = float(los_dbm)  # an ingress port reading this little light or less has lost its signal
        self.ssh_known_hosts = ssh_known_hosts  # OpenSSH known_hosts file that pins the switch's host key
        self._ssh: Any = None  # the paramiko SSHClient under an SSH session
        self.host, self.port = host, int(port)
        self.name = name or f"{host}:{port}"
        self.user, self.password = user, password
        self.timeout_s = float(timeout_s)
        self.switch_delay_s = float(switch_delay_s)
        self.connect_attempts = max(1, int(connect_attempts))
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.ports: int | None = ports  # N; read from the device (RTRV-EQPT) at login if None
        self._sock: socket.socket | None = None
        self._splitter = Tl1Splitter()
        self._blocks: deque[str] = deque()
        self._lock = threading.RLock()
        self._ctag = 0
        self._early: dict[str, Response | None] = {}  # ctag of a PendingReply -> its reply, if another read met it
        self.sid: str | None = None  # the SID the switch answered the last login with
        # A caller's deadline (time.monotonic()) that caps every wait of this session: connects, logins and
        # replies. The control service sets it around a commit, so that a slow switch costs a bounded time and
        # the commit is recorded as in doubt instead of waiting through every retry (docs/operations.md).
        self.deadline: float | None = None
        self.sessions = 0  # successful logins so far: > 1 means the driver reconnected
        self.autonomous: deque[Autonomous] = deque(maxlen=100)  # last alarms the device reported

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, host={self.host!r}, port={self.port})"

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

    def collect(self, pending: PendingReply) -> Any:
        """Wait for the replies of ``pending`` (from a ``send_*`` method); return what its one-call method returns.

        The wait ends at the handle's deadline (the driver's timeout from the moment of sending).
        Raises what the one-call method raises: a ``DENY`` as its :class:`OcsDenied` subclass,
        :class:`OcsTimeout` (the session is dropped; the next command opens a new one) or
        :class:`OcsConnectionError` when the reply is lost, in which case the device may have
        applied the command: read it back.
        """
        if pending.collected:
            raise ValueError(f"{self.name}: the replies of ctags {', '.join(pending.ctags)} were collected already; "
                             "send the commands again for a new handle")
        pending.collected = True
        replies = self._await(pending)
        return pending.finish(replies) if pending.finish is not None else replies

    def _denied(self, verb: str, resp: Response, ports: list[int]) -> OcsDenied:
        named: list[int] = []
        if resp.data:
            try:
                named = parse_ports(resp.data[0], self.name, verb)
            except OcsProtocolError:
                named = []
        return denied_from_code(self.name, verb, resp.code, resp.comment, named or ports)

    def _next_ctag(self) -> str:
        self._ctag = self._ctag % 999_999 + 1
        return str(self._ctag)

    def _command(self, verb: str, aid: str = "", params: tuple[str, ...] = (), *, read: bool = False,
                 timeout_s: float | None = None) -> Response:
        """Send one command and return its reply; reads are retried once on a fresh session."""
        return self._pipeline([(verb, aid, params)], read=read, timeout_s=timeout_s)[0]

    def _pipeline(self, commands: list[_Spec], *, read: bool = False, timeout_s: float | None = None) -> list[Response]:
        """Send ``commands`` (verb, aid, params) back to back and return their replies in the same order.

        One round trip for all of them. Reads are retried once on a fresh session; commands the
        device refused for want of a login (``PLNA``: nothing applied) are sent once more after
        logging in again; writes are never repeated otherwise.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return self._await(self._send(commands, read=read, timeout_s=timeout_s))

    def _send(self, commands: list[_Spec], *, read: bool, timeout_s: float, attempt: int = 0) -> PendingReply:
        """Open the session if needed and write ``commands`` in one write; return the handle of their replies.

        A failed write is not raised here but kept in the handle (:meth:`_await` raises it), since
        part of it may have reached the device.
        """
        with self._lock:
            self._ensure_session()
            cmds = tuple(Command(verb, aid, self._next_ctag(), params=params) for verb, aid, params in commands)
            pending = PendingReply(cmds, self.sessions, self._capped(time.monotonic() + timeout_s), timeout_s, read,
                                   attempt)
            if cmds:
                try:
                    self._write(cmds)
                except _ConnectionLost as exc:
                    self._drop()
                    pending.lost = str(exc)
                else:
                    self._early.update(dict.fromkeys(pending.ctags))
            return pending

    def _await(self, pending: PendingReply) -> list[Response]:
        """Read the replies of ``pending``; resend a lost read, or commands refused for a forgotten login, once."""
        with self._lock:
            try:
                replies = self._replies(pending)
            except (_ConnectionLost, OcsTimeout) as exc:
                if isinstance(exc, _ConnectionLost):
                    self._drop()
                if pending.read and pending.attempt == 0:
                    return self._await(self._send(self._specs(pending.commands), read=True,
                                                  timeout_s=pending.timeout_s, attempt=1))
                if isinstance(exc, OcsTimeout):
                    raise
                raise OcsConnectionError(self.name, exc.verb, f"connection lost before the reply ({exc}); "
                                         "the device may have applied the command: read it back") from None
            finally:
                for ctag in pending.ctags:
                    self._early.pop(ctag, None)
            again = [i for i, resp in enumerate(replies) if resp.status == "DENY" and resp.code == "PLNA"]
            if again and pending.attempt == 0:
                self._drop()  # the device forgot our login: log in again and resend (nothing was applied)
                resent = self._await(self._send(self._specs([pending.commands[i] for i in again]), read=pending.read,
                                                timeout_s=pending.timeout_s, attempt=1))
                for i, resp in zip(again, resent):
                    replies[i] = resp
            return replies

    def _capped(self, deadline: float) -> float:
        """``deadline``, or the caller's :attr:`deadline` when that comes first."""
        return deadline if self.deadline is None else min(deadline, self.deadline)

    def _left_s(self, verb: str) -> float:
        """Seconds a wait may take now: the timeout, capped by the caller's deadline (raises when none is left)."""
        if self.deadline is None:
            return self.timeout_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise OcsTimeout(self.name, verb, "the caller's deadline passed before the command was sent; nothing "
                                              "was sent")
        return min(self.timeout_s, left)

    @staticmethod
    def _specs(cmds: Iterable[Command]) -> list[_Spec]:
        return [(c.verb, c.aid, c.params) for c in cmds]

    def _ensure_session(self) -> None:
        if self._sock is not None and self._alive():
            return
        self._drop()
        last: Exception | None = None
        for attempt in range(self.connect_attempts):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s, self._left_s("connect")))
            try:
                self._sock = self._open_stream(self._left_s("connect"))
                break
            except OSError as exc:
                last = exc
        else:
            raise OcsConnectionError(self.name, "connect", f"cannot reach {self.host}:{self.port} after "
                                                           f"{self.connect_attempts} attempts ({last}); check the "
                                                           "device is up and its host/port in devices.yaml")
        try:
            resp = self._exchange(Command("ACT-USER", self.user, self._next_ctag(), params=("", quote(self.password))),
                                  self._left_s("ACT-USER"))
        except _ConnectionLost as exc:
            self._drop()
            raise OcsConnectionError(self.name, "ACT-USER", f"connection closed during login ({exc})") from None
        if not resp.ok:
            self._drop()
            raise self._denied("ACT-USER", resp, [])
        self.sid = resp.sid  # the switch's TL1 source identifier: who answered (one switch under two addresses)
        if self.ports is None:
            self._read_size()
        self.sessions += 1
        if self.sessions > 1:
            log.info("%s: reconnected and logged in again (session %d)", self.name, self.sessions)

    def _open_stream(self, timeout_s: float) -> Any:
        """A connected stream to the switch's TL1 listener: a TCP socket, or an SSH session channel.

        Both offer what the session uses of a socket (``sendall``, ``recv``, ``settimeout``, ``fileno``
        for ``select``, ``close``). Over SSH the password authenticates the SSH session as well, and the
        TL1 login follows on the channel as over TCP.
        """
        if self.transport == "tcp":
            sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        import paramiko

        client = paramiko.SSHClient()
        if self.ssh_known_hosts:
            client.load_host_keys(self.ssh_known_hosts)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:  # no known_hosts file configured: accept the key it shows (docs/ocs.md says how to pin it)
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(self.host, self.port, username=self.user, password=self.password, timeout=timeout_s,
                           banner_timeout=timeout_s, auth_timeout=timeout_s, look_for_keys=False, allow_agent=False)
            chan = client.get_transport().open_session(timeout=timeout_s)
            chan.invoke_shell()  # no pty: the switch echoes nothing and TL1 flows as on the TCP port
        except paramiko.AuthenticationException as exc:
            client.close()
            raise OcsConnectionError(self.name, "connect", f"SSH login to {self.host}:{self.port} as {self.user!r} "
                                                           f"refused ({exc}); check the credentials in the secrets "
                                                           "file") from None
        except (paramiko.SSHException, EOFError) as exc:
            client.close()
            raise OSError(f"SSH: {exc}") from None
        self._ssh = client
        return chan

    def _read_size(self) -> None:
        try:
            # the size as Polatis clients and test suites ask it: RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE;
            resp = self._exchange(Command("RTRV-EQPT", "SYSTEM", self._next_ctag(), params=("", "", "PARAMETER=SIZE")),
                                  self.timeout_s)
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
            with suppress(OSError):  # already gone
                self._sock.close()
        if self._ssh is not None:
            with suppress(Exception):  # the SSH transport under it, already gone or not
                self._ssh.close()
            self._ssh = None
        self._sock = None
        self._splitter = Tl1Splitter()
        self._blocks.clear()
        self._early = {ctag: resp for ctag, resp in self._early.items() if resp is not None}  # the rest never come

    def _exchange(self, cmd: Command, timeout_s: float) -> Response:
        """Send ``cmd`` and return the reply with its ctag, skipping every other message."""
        return self._exchange_all([cmd], timeout_s)[0]

    def _exchange_all(self, cmds: list[Command], timeout_s: float) -> list[Response]:
        """Send ``cmds`` in one write and return their replies in order (used for login and logout)."""
        self._write(cmds)
        return self._replies(PendingReply(tuple(cmds), self.sessions, self._capped(time.monotonic() + timeout_s),
                                          timeout_s, False))

    def _write(self, cmds: Iterable[Command]) -> None:
        """Write ``cmds`` back to back in one ``sendall``."""
        assert self._sock is not None
        cmds = list(cmds)
        try:
            self._sock.settimeout(self.timeout_s)  # not the last read's remaining wait, which may be 0
            self._sock.sendall("".join(map(format_command, cmds)).encode("utf-8"))
        except OSError as exc:
            raise _ConnectionLost(str(exc), cmds[0].verb) from None

    def _replies(self, pending: PendingReply) -> list[Response]:
        """Return the replies of ``pending`` in order, matched by ctag; others are skipped or kept for their handle.

        The replies may arrive in any order; ``pending.deadline`` bounds the wait for all of them,
        and a reply already received is taken even after it.
        """
        if pending.lost:
            raise _ConnectionLost(pending.lost, pending.commands[0].verb)
        got = {c.ctag: self._early[c.ctag] for c in pending.commands if self._early.get(c.ctag) is not None}
        waiting = {c.ctag: c for c in pending.commands if c.ctag not in got}
        if waiting and (self._sock is None or self.sessions != pending.session):
            raise _ConnectionLost("the session ended before the reply came", next(iter(waiting.values())).verb)
        while waiting:
            while not self._blocks:
                self._receive(pending, next(iter(waiting.values())).verb)
            block = self._blocks.popleft()
            if not block.strip(" \r\n\t;<>"):
                continue
            try:
                msg = parse_response(block, self.name)
            except OcsProtocolError:
                self._drop()
                raise
            if isinstance(msg, Acknowledgement):  # "IP <ctag>": in progress, the response follows (GR-831)
                log.debug("%s: acknowledgement %s %s", self.name, msg.code, msg.ctag)
                continue
            if isinstance(msg, Autonomous):
                log.info("%s: autonomous %s %s %s", self.name, msg.alarm, msg.verb, "; ".join(msg.data))
                self.autonomous.append(msg)
            elif msg.ctag in waiting:
                del waiting[msg.ctag]
                got[msg.ctag] = msg
            elif msg.ctag in self._early:  # another handle's reply: keep it for its collect
                self._early[msg.ctag] = msg
            else:
                log.info("%s: ignoring reply with ctag %s while waiting for %s (stale)", self.name, msg.ctag,
                         ", ".join(waiting))
        return [got[c.ctag] for c in pending.commands]

    def _receive(self, pending: PendingReply, verb: str) -> None:
        """Read what the socket holds into the block queue, waiting until ``pending``'s deadline at most."""
        assert self._sock is not None
        remaining = pending.deadline - time.monotonic()
        try:
            self._sock.settimeout(max(remaining, 0.0))  # past the deadline: take only what has come already
            data = self._sock.recv(65536)
        except (socket.timeout, BlockingIOError):
            if remaining > 0:
                return
            self._drop()
            raise OcsTimeout(self.name, verb, f"no reply within {pending.timeout_s:g} s; the device may have applied "
                                              "the command: read it back (the next command opens a new session)"
                             ) from None
        except OSError as exc:
            raise _ConnectionLost(str(exc), verb) from None
        if not data:
            raise _ConnectionLost("closed by the device", verb)
        self._blocks.extend(self._splitter.feed(data))
