"""An emulated optical circuit switch: an asyncio TCP server speaking the TL1 dialect of :mod:`.tl1`.

Design note
-----------
The emulator behaves like a device in the ways a control plane must survive: a connect answers
``COMPLD`` only after the profile's switching delay (OrchestrRL Table 2, :data:`OCS_TECHNOLOGIES`),
and one bulk ``ENT-PATCH`` of k pairs costs *one* delay since all mirrors move together. While the
mirrors move, the ports are ``tuning`` and any command touching them is refused with ``SNVS``
(with a zero delay, as in the zero-delay measurement mode and the ``test`` profile, no mirror moves
for any time: the bulk answers at once and no port shows ``tuning``).
Commands on one connection run concurrently (TL1 correlates replies by ctag), but each takes
effect on the table as soon as it is read, before anything is awaited: commands sent back to back
(a pipelined ``DLT-PATCH`` then ``ENT-PATCH``) are applied in the order they arrive, as a device
processes them, and only their replies may overtake each other. An ``ENT-PATCH`` is atomic: it is
checked whole and refused whole, unless the partial-bulk fault is on.

Fault injection (set at start from the command line, changed at run time over TL1 extension
verbs that need no login and are never dropped or delayed; a real switch has none of them)::

    ED-EMUL:::<ctag>::<KEY>=<VALUE>,...;   keys: FAIL=<ports>[,ALARM=<text>]  REPAIR=<ports|ALL>
                                           BLOCK=<ports>  RELEASE=<ports|ALL>  DROP=<probability>
                                           DROPNEXT=<n>  DELAYMS=<ms>  PARTIAL=<k|OFF>  SWITCHMS=<ms>
                                           CLEAR=FAULTS|TABLE|ALL
    OPR-EMUL-RESTART:::<ctag>::TABLE=KEEP|LOSE,DOWNMS=<ms>;   close every connection and the listener,
                                           stay down DOWNMS, come back with or without the table
    RTRV-EMUL:::<ctag>:;                   data lines "<KEY>=<VALUE>": the current settings and counters

A dropped reply means the command was applied and its reply never sent; replies to ``ACT-USER``
and ``CANC-USER`` are never dropped or delayed, so a session can always be opened.
:class:`fabric.ocs.emulator_control.EmulatorControl` wraps these verbs.
"""

from __future__ import annotations

from contextlib import suppress
import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from itertools import starmap
from typing import Callable

from orchestrl.fabric.ocs.errors import OcsProtocolError, OcsRequestError
from orchestrl.fabric.ocs.model import PortState, SwitchState
from orchestrl.fabric.ocs.tl1 import (
    Autonomous, Command, Response, Tl1Splitter, format_patch_line, format_response, parse_command,
    parse_keywords, parse_ports, split_pair_lists, unquote,
)
from orchestrl.fabric.topology import OCS_TECHNOLOGIES

__all__ = ["EmulatorConfig", "Emulator", "run_emulator", "CONTROL_VERBS", "PROFILES", "profile_delay_s"]

log = logging.getLogger(__name__)

CONTROL_VERBS = ("ED-EMUL", "OPR-EMUL-RESTART", "RTRV-EMUL")
# Profile name -> (switch_delay_s, max ports per side); "test" is a zero-delay profile for unit tests.
PROFILES: dict[str, tuple[float, int]] = {
    **{name: (t.switch_delay_s, t.radix_ports) for name, t in OCS_TECHNOLOGIES.items()},
    "test": (0.0, 4096),
}
_SESSION_VERBS = ("ACT-USER", "CANC-USER")


def profile_delay_s(profile: str) -> float:
    """Return the switching delay of a profile, refusing unknown names with the list of known ones."""
    if profile not in PROFILES:
        raise OcsRequestError("", "emulate", f"unknown profile {profile!r}; use one of {', '.join(PROFILES)}")
    return PROFILES[profile][0]


@dataclass
class EmulatorConfig:
    """Everything an emulated switch is started with; the fault fields can change at run time."""

    ports: int = 16  # N ports per side
    profile: str = "mems-3d"  # a key of PROFILES: sets the switching delay
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    user: str = "admin"
    password: str = "admin"
    sid: str = "OCS-EMU"  # TL1 source identifier in every response header
    switch_delay_s: float | None = None  # None: the profile's delay
    fail_ports: list[int] = field(default_factory=list)  # ports failed from the start
    drop_probability: float = 0.0  # chance that a reply is not sent (the command still runs)
    drop_next: int = 0  # drop exactly the next n replies
    delay_replies_s: float = 0.0  # extra time before every reply
    partial_bulk: int | None = None  # apply only the first k pairs of larger ENT-PATCH, then DENY SABT
    seed: int | None = None  # seeds the random dropping


class _Session:
    """One TCP connection: its login state, its in-flight command tasks and a serialised writer."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.logged_in = False
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()

    async def send(self, text: str) -> None:
        async with self._lock:
            if self.writer.is_closing():
                return
            self.writer.write(text.encode("utf-8"))
            with suppress(ConnectionError):  # the client went away; its session ends when the reader sees EOF
                await self.writer.drain()

    def abort(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.writer.close()


class Emulator:
    """An emulated ``N x N`` switch serving TL1 on a TCP listener.

    Examples
    --------
    >>> import asyncio
    >>> async def demo():
    ...     emu = Emulator(EmulatorConfig(ports=4, profile="test"))
    ...     host, port = await emu.start()
    ...     await emu.stop()
    ...     return port > 0
    >>> asyncio.run(demo())
    True
    """

    def __init__(self, config: EmulatorConfig, announce: Callable[[str], None] = lambda line: None) -> None:
        profile_delay_s(config.profile)
        radix = PROFILES[config.profile][1]
        if not 1 <= config.ports <= radix:
            raise OcsRequestError(config.sid, "emulate", f"ports={config.ports} per side is outside 1..{radix} for "
                                                         f"profile {config.profile!r}; use fewer ports or profile 'test'")
        self.config = config
        self.announce = announce
        self.state = SwitchState(config.ports, config.sid)
        self.switch_delay_s = PROFILES[config.profile][0] if config.switch_delay_s is None else config.switch_delay_s
        self.state.set_port_state(config.fail_ports, PortState.FAILED, "LOS")
        self._rng = random.Random(config.seed)
        self._server: asyncio.AbstractServer | None = None
        self._sessions: set[_Session] = set()
        self._tuning: dict[int, object] = {}  # port -> token of the ENT-PATCH moving its mirror
        self._stopped = asyncio.Event()
        self.counters = {"logins": 0, "restarts": 0, "dropped": 0, "commands": 0}
        self._atag = 0

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        """Start listening; return the bound ``(host, port)``."""
        self._server = await asyncio.start_server(self._client, self.config.host, self.config.port)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.config.host, self.config.port = host, port  # a restart re-binds the same port
        return host, port

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        self._close_all()
        self._stopped.set()

    def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for session in list(self._sessions):
            session.abort()
        self._sessions.clear()

    async def _restart(self, keep_table: bool, down_s: float) -> None:
        await asyncio.sleep(0.02)  # let the COMPLD of OPR-EMUL-RESTART reach the client first
        self._close_all()
        await asyncio.sleep(down_s)
        if keep_table:
            self._settle(list(self._tuning))
        else:
            self.state.clear(keep_port_states=True)
        self._tuning.clear()
        for attempt in range(50):
            try:
                await self.start()
                break
            except OSError:  # the old listener's port may take a moment to free
                await asyncio.sleep(0.05 * (attempt + 1))
        else:
            raise OSError(f"emulator could not re-bind {self.config.host}:{self.config.port} after a restart")
        self.counters["restarts"] += 1
        table = "kept" if keep_table else "lost"
        self.announce(f"restarted ({table} cross-connect table), listening on {self.config.host}:{self.config.port}")

    # -- connections ------------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = _Session(writer)
        self._sessions.add(session)
        splitter = Tl1Splitter()
        try:
            with suppress(ConnectionError):  # the client vanished: nothing to answer
                while data := await reader.read(65536):
                    for text in splitter.feed(data):
                        task = asyncio.create_task(self._run(session, text))
                        session.tasks.add(task)
                        task.add_done_callback(session.tasks.discard)
        finally:
            self._sessions.discard(session)
            session.abort()

    async def _run(self, session: _Session, text: str) -> None:
        try:
            cmd = parse_command(text)
        except OcsProtocolError as exc:
            ctag = text.split(":")[3] if text.count(":") >= 3 else "0"
            await session.send(format_response(self._deny(Command("?", ctag=ctag), "IISP", exc.problem)))
            return
        self.counters["commands"] += 1
        resp = await self._execute(session, cmd)
        if cmd.verb not in CONTROL_VERBS and cmd.verb not in _SESSION_VERBS:
            if self._should_drop():
                log.info("dropping the reply to %s ctag %s (fault injection)", cmd.verb, cmd.ctag)
                return
            if self.config.delay_replies_s > 0:
                await asyncio.sleep(self.config.delay_replies_s)
        await session.send(format_response(resp))

    def _should_drop(self) -> bool:
        if self.config.drop_next > 0:
            self.config.drop_next -= 1
        elif not (self.config.drop_probability > 0 and self._rng.random() < self.config.drop_probability):
            return False
        self.counters["dropped"] += 1
        return True

    def _ok(self, cmd: Command, data: list[str] | tuple[str, ...] = (), comment: str = "") -> Response:
        return Response(cmd.ctag, "COMPLD", tuple(data), comment=comment, sid=self.config.sid, **_stamp())

    def _deny(self, cmd: Command, code: str, text: str, ports: list[int] | tuple[int, ...] = ()) -> Response:
        data = ("&".join(map(str, ports)),) if ports else ()
        return Response(cmd.ctag, "DENY", data, code, text, sid=self.config.sid, **_stamp())

    async def _execute(self, session: _Session, cmd: Command) -> Response:
        handler = _HANDLERS.get(cmd.verb)
        if handler is None:
            return self._deny(cmd, "ICNV", f"unknown command {cmd.verb}")
        if cmd.verb not in CONTROL_VERBS and cmd.verb != "ACT-USER" and not session.logged_in:
            return self._deny(cmd, "PLNA", "log in with ACT-USER first")
        try:
            result = handler(self, session, cmd)
            return await result if asyncio.iscoroutine(result) else result
        except OcsProtocolError as exc:
            return self._deny(cmd, "IISP", exc.problem)
        except (OcsRequestError, ValueError) as exc:
            return self._deny(cmd, "IDNV", str(exc))

    # -- TL1 verbs --------------------------------------------------------------------------
    def _act_user(self, session: _Session, cmd: Command) -> Response:
        password = unquote(cmd.params[1]) if len(cmd.params) > 1 else ""
        if cmd.aid != self.config.user or password != self.config.password:
            return self._deny(cmd, "PIUI", f"user {cmd.aid!r} or its password is wrong")
        session.logged_in = True
        self.counters["logins"] += 1
        return self._ok(cmd)

    def _canc_user(self, session: _Session, cmd: Command) -> Response:
        session.logged_in = False
        return self._ok(cmd)

    async def _ent_patch(self, session: _Session, cmd: Command) -> Response:
        ins, outs = split_pair_lists(cmd.aid, self.config.sid)
        if len(ins) != len(outs) or not ins:
            return self._deny(cmd, "IIPG", f"{len(ins)} ingress and {len(outs)} egress ports; give equal lists")
        pairs = list(zip(ins, outs))
        k = self.config.partial_bulk
        applied = len(pairs) if k is None else min(k, len(pairs))
        bad = self.state.connect_atomic(pairs, applied)  # checked whole, refused whole
        if bad is not None:
            return self._deny(cmd, bad.status, bad.message, [bad.port])
        if self.switch_delay_s > 0:  # a zero delay moves no mirror for any time: nothing to show tuning
            moving = [p for pair in pairs[:applied] for p in pair]
            token = object()
            self.state.set_port_state(moving, PortState.TUNING)
            self._tuning.update((p, token) for p in moving)
            try:
                await asyncio.sleep(self.switch_delay_s)  # every mirror of the bulk moves at once
            finally:
                self._settle([p for p in moving if self._tuning.get(p) is token])
        if applied < len(pairs):
            done = ", ".join(f"{i}->{e}" for i, e in pairs[:applied]) or "none"
            return self._deny(cmd, "SABT", f"applied {applied} of {len(pairs)} pairs ({done}), then aborted")
        return self._ok(cmd)

    def _settle(self, ports: list[int]) -> None:
        for p in ports:
            self._tuning.pop(p, None)
        self.state.set_port_state(self.state.ports_in_state(ports, PortState.TUNING), PortState.NORMAL)

    def _dlt_patch(self, session: _Session, cmd: Command) -> Response:
        ports = parse_ports(cmd.aid, self.config.sid, cmd.verb)
        if not ports:
            return self._deny(cmd, "IIPG", "no ports given")
        bad, removed = self.state.disconnect_atomic(ports)  # checked whole, refused whole
        if bad is not None:
            return self._deny(cmd, bad.status, bad.message, [bad.port])
        return self._ok(cmd, list(starmap(format_patch_line, removed)))

    def _rtrv_patch(self, session: _Session, cmd: Command) -> Response:
        return self._ok(cmd, [format_patch_line(i, e) for i, e in self.state.cross_connects().items()])

    def _ports_of(self, cmd: Command) -> list[int] | Response:
        if cmd.aid.upper() in ("", "ALL"):
            return list(range(1, 2 * self.state.n + 1))
        ports = parse_ports(cmd.aid, self.config.sid, cmd.verb)
        bad = [p for p in ports if self.state.side(p) is None]
        if bad or not ports:
            return self._deny(cmd, "IIAC", f"port {bad[0] if bad else '?'} is outside 1..{2 * self.state.n}", bad[:1])
        return ports

    def _rtrv_port_status(self, session: _Session, cmd: Command) -> Response:
        ports = self._ports_of(cmd)
        if isinstance(ports, Response):
            return ports
        lines = [f"{p}:{s.state.value}" + (f",{s.alarm}" if s.alarm else "")
                 for p, s in self.state.port_status(ports).items()]
        return self._ok(cmd, lines)

    def _rtrv_alm_all(self, session: _Session, cmd: Command) -> Response:
        severity = {PortState.FAILED: "MJ", PortState.FORCE_BLOCKED: "MN"}
        lines = [f"{p}:{severity[s.state]},{s.alarm or s.state.value}"
                 for p, s in self.state.port_status().items() if s.state in severity]
        return self._ok(cmd, lines)

    def _rtrv_eqpt(self, session: _Session, cmd: Command) -> Response:
        n, delay_ms = self.state.n, self.switch_delay_s * 1e3
        return self._ok(cmd, [f"SYSTEM:SIZE={n}x{n},PROFILE={self.config.profile},DELAY_MS={delay_ms:g}"])

    def _shutter(self, session: _Session, cmd: Command) -> Response:
        ports = self._ports_of(cmd)
        if isinstance(ports, Response):
            return ports
        if cmd.verb == "OPR-PORT-SHUTTER":
            self.state.set_port_state(ports, PortState.FORCE_BLOCKED, "force-blocked by operator")
        else:
            self.state.set_port_state([p for p in ports if self.state.state(p) is PortState.FORCE_BLOCKED],
                                      PortState.NORMAL)
        return self._ok(cmd)

    # -- emulator control -------------------------------------------------------------------
    def _ed_emul(self, session: _Session, cmd: Command) -> Response:
        keys = parse_keywords(cmd.params[-1] if cmd.params else "")
        unknown = set(keys) - _CONTROL_KEYS
        if unknown:
            return self._deny(cmd, "IDNV", f"unknown key(s) {', '.join(sorted(unknown))}; "
                                           f"use {', '.join(sorted(_CONTROL_KEYS))}")
        ports = lambda key: (list(range(1, 2 * self.state.n + 1)) if keys[key].upper() == "ALL"  # noqa: E731
                             else parse_ports(keys[key], self.config.sid, cmd.verb))
        c = self.config
        if "CLEAR" in keys:
            what = keys["CLEAR"].upper()
            if what in ("FAULTS", "ALL"):
                c.drop_probability, c.drop_next, c.delay_replies_s, c.partial_bulk = 0.0, 0, 0.0, None
                self.switch_delay_s = PROFILES[c.profile][0] if c.switch_delay_s is None else c.switch_delay_s
                self.state.set_port_state([p for p, s in self.state.port_status().items()
                                           if s.state is not PortState.TUNING], PortState.NORMAL)
            if what in ("TABLE", "ALL"):
                self.state.clear()
                self._tuning.clear()
        if "FAIL" in keys:
            failed = ports("FAIL")
            alarm = keys.get("ALARM", "LOS")
            self.state.set_port_state(failed, PortState.FAILED, alarm)
            self._report_alarm(failed, alarm)
        if "REPAIR" in keys:
            self.state.set_port_state([p for p in ports("REPAIR") if self.state.state(p) is PortState.FAILED],
                                      PortState.NORMAL)
        if "BLOCK" in keys:
            self.state.set_port_state(ports("BLOCK"), PortState.FORCE_BLOCKED, "force-blocked by operator")
        if "RELEASE" in keys:
            self.state.set_port_state([p for p in ports("RELEASE")
                                       if self.state.state(p) is PortState.FORCE_BLOCKED], PortState.NORMAL)
        if "DROP" in keys:
            c.drop_probability = float(keys["DROP"])
        if "DROPNEXT" in keys:
            c.drop_next = int(keys["DROPNEXT"])
        if "DELAYMS" in keys:
            c.delay_replies_s = float(keys["DELAYMS"]) / 1e3
        if "PARTIAL" in keys:
            c.partial_bulk = None if keys["PARTIAL"].upper() in ("OFF", "NONE", "") else int(keys["PARTIAL"])
        if "SWITCHMS" in keys:
            self.switch_delay_s = float(keys["SWITCHMS"]) / 1e3
        return self._ok(cmd)

    def _opr_emul_restart(self, session: _Session, cmd: Command) -> Response:
        keys = parse_keywords(cmd.params[-1] if cmd.params else "")
        table = keys.get("TABLE", "KEEP").upper()
        if table not in ("KEEP", "LOSE"):
            return self._deny(cmd, "IDNV", f"TABLE={table} is not KEEP or LOSE")
        asyncio.get_running_loop().create_task(self._restart(table == "KEEP", float(keys.get("DOWNMS", 200)) / 1e3))
        return self._ok(cmd, comment=f"restarting, table {table.lower()}")

    def _rtrv_emul(self, session: _Session, cmd: Command) -> Response:
        c, states = self.config, self.state.port_status()
        by_state = lambda st: "&".join(str(p) for p, s in states.items() if s.state is st)  # noqa: E731
        values = {
            "PROFILE": c.profile, "PORTS": self.state.n, "SWITCHMS": f"{self.switch_delay_s * 1e3:g}",
            "DROP": c.drop_probability, "DROPNEXT": c.drop_next, "DELAYMS": f"{c.delay_replies_s * 1e3:g}",
            "PARTIAL": "OFF" if c.partial_bulk is None else c.partial_bulk,
            "FAILED": by_state(PortState.FAILED), "BLOCKED": by_state(PortState.FORCE_BLOCKED),
            "SESSIONS": len(self._sessions), **{k.upper(): v for k, v in self.counters.items()},
        }
        return self._ok(cmd, [f"{k}={v}" for k, v in values.items()])

    def _report_alarm(self, ports: list[int], alarm: str) -> None:
        """Send an autonomous REPT ALM to every logged-in session (drivers must ignore it)."""
        self._atag += 1
        text = format_response(Autonomous(str(self._atag), "**", "REPT ALM OCS",
                                          tuple(f"{p}:MJ,{alarm}" for p in ports), self.config.sid))
        for session in list(self._sessions):
            if session.logged_in:
                asyncio.get_running_loop().create_task(session.send(text))


_CONTROL_KEYS = {"FAIL", "ALARM", "REPAIR", "BLOCK", "RELEASE", "DROP", "DROPNEXT", "DELAYMS", "PARTIAL",
                 "SWITCHMS", "CLEAR"}
_HANDLERS = {
    "ACT-USER": Emulator._act_user, "CANC-USER": Emulator._canc_user, "ENT-PATCH": Emulator._ent_patch,
    "DLT-PATCH": Emulator._dlt_patch, "RTRV-PATCH": Emulator._rtrv_patch,
    "RTRV-PORT-STATUS": Emulator._rtrv_port_status, "RTRV-ALM-ALL": Emulator._rtrv_alm_all,
    "RTRV-EQPT": Emulator._rtrv_eqpt, "OPR-PORT-SHUTTER": Emulator._shutter, "RLS-PORT-SHUTTER": Emulator._shutter,
    "ED-EMUL": Emulator._ed_emul, "OPR-EMUL-RESTART": Emulator._opr_emul_restart, "RTRV-EMUL": Emulator._rtrv_emul,
}


def _stamp() -> dict[str, str]:
    now = time.gmtime()
    return {"date": time.strftime("%y-%m-%d", now), "time": time.strftime("%H:%M:%S", now)}


def run_emulator(config: EmulatorConfig, announce: Callable[[str], None] = print) -> None:
    """Serve an emulated switch until interrupted; ``announce`` gets ``listening on HOST:PORT``."""

    async def main() -> None:
        emu = Emulator(config, announce)
        host, port = await emu.start()
        announce(f"listening on {host}:{port}")
        await emu.serve_forever()

    with suppress(KeyboardInterrupt):  # Ctrl-C is how an operator stops an emulator
        asyncio.run(main())
