"""An emulated optical circuit switch speaking Polatis TL1, over TCP or SSH (a front-end of :mod:`.device_core`).

Design note
-----------
The switch itself (table, port states, switching delay, power readings, faults) is the shared
:class:`fabric.ocs.device_core.DeviceCore`; this module is its TL1 front-end, speaking the dialect
real Polatis switches and their third-party clients use (docs/ocs.md gives the sources):
``ACT-USER``/``CANC-USER``, ``ENT-PATCH`` with ``&`` lists, ``DLT-PATCH``, ``RTRV-PATCH``, port state
through ``RTRV-PORT-SHUTTER`` (``OPEN``/``CLOSED``) and ``RTRV-PORT-POWER`` (dBm), the size through
``RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE;``, the serial number through ``RTRV-INV::OCS``, and
``SET-SID`` (a SID may hold spaces: ``Polatis OXC``). It also *sends* the reply forms a client must
read: every ``DENY`` names its code as ``"<aid>:ERRCDE=<code>"``, and a command still running after
``ack_after_s`` (a bulk whose mirrors move) is acknowledged ``IP <ctag>`` (GR-831) before its
response. A verb a Polatis switch lacks (``RTRV-PORT-STATUS``) is refused ``DENY ICNV``.

Commands on one connection run concurrently (TL1 correlates replies by ctag), but each takes effect
on the table as soon as it is read, before anything is awaited: commands sent back to back (a
pipelined ``DLT-PATCH`` then ``ENT-PATCH``) are applied in the order they arrive, as a device
processes them, and only their replies may overtake each other. An ``ENT-PATCH`` is atomic: it is
checked whole and refused whole, unless the partial-bulk fault is on.

Fault injection (set at start from the command line, changed at run time over TL1 extension
verbs that need no login and are never dropped or delayed; a real switch has none of them)::

    ED-EMUL:::<ctag>::<KEY>=<VALUE>,...;   keys: FAIL=<ports>[,ALARM=<text>]  REPAIR=<ports|ALL>
                                           BLOCK=<ports>  RELEASE=<ports|ALL>  DROP=<probability>
                                           DROPNEXT=<n>  DELAYMS=<ms>  PARTIAL=<k|OFF>  SWITCHMS=<ms>
                                           CLEAR=FAULTS|TABLE|ALL
    OPR-EMUL-RESTART:::<ctag>::TABLE=KEEP|LOSE,DOWNMS=<ms>|HOLD;   close every connection and the listener,
                                           stay down DOWNMS (HOLD: until OPR-EMUL-UP), come back with or
                                           without the table
    OPR-EMUL-UP:::<ctag>:;                 end a HOLD: the switch comes back now (needs the control
                                           listener apart from the switch's own: --control-port)
    RTRV-EMUL:::<ctag>:;                   data lines "<KEY>=<VALUE>": the current settings and counters

A dropped reply means the command was applied and its reply never sent; replies to ``ACT-USER``
and ``CANC-USER`` are never dropped or delayed, so a session can always be opened. The NETCONF and
gNMI emulators serve these verbs on a control listener of their own (:func:`run_emulator`).
:class:`fabric.ocs.emulator_control.EmulatorControl` wraps them.
"""

from __future__ import annotations

from contextlib import suppress
import asyncio
import logging
import time
from itertools import starmap
from typing import Any, Callable

from orchestrl.fabric.ocs.device_core import PROFILES, DeviceCore, EmulatorConfig, profile_delay_s
from orchestrl.fabric.ocs.errors import OcsProtocolError, OcsRequestError
from orchestrl.fabric.ocs.model import PortState
from orchestrl.fabric.ocs.tl1 import (
    Autonomous, Command, Response, Tl1Splitter, format_acknowledgement, format_patch_line, format_response,
    parse_command, parse_keywords, parse_ports, split_pair_lists, unquote,
)

__all__ = ["EmulatorConfig", "Emulator", "run_emulator", "serve", "CONTROL_VERBS", "PROFILES", "profile_delay_s",
           "EMULATOR_PROTOCOLS"]

log = logging.getLogger(__name__)

CONTROL_VERBS = ("ED-EMUL", "OPR-EMUL-RESTART", "OPR-EMUL-UP", "RTRV-EMUL")
EMULATOR_PROTOCOLS = ("tl1", "netconf", "gnmi")
_SESSION_VERBS = ("ACT-USER", "CANC-USER")


class _Session:
    """One connection (TCP, or an SSH channel): its login state, in-flight command tasks and a serialised writer."""

    def __init__(self, write: Callable[[bytes], Any], drain: Callable[[], Any], close: Callable[[], None],
                 closing: Callable[[], bool]) -> None:
        self._write, self._drain, self._close, self._closing = write, drain, close, closing
        self.logged_in = False
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()

    async def send(self, text: str) -> None:
        async with self._lock:
            if self._closing():
                return
            self._write(text.encode("utf-8"))
            with suppress(ConnectionError, OSError):  # the client went away; its session ends at EOF
                await self._drain()

    def abort(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        with suppress(Exception):  # closing a transport that is already gone
            self._close()


class Emulator:
    """The TL1 front-end of an emulated ``N x N`` switch, on a TCP listener (or SSH with ``ssh=True``).

    Parameters
    ----------
    config : EmulatorConfig
        Size, profile, credentials, SID and initial faults.
    core : DeviceCore, optional
        The switch to serve (a new one from ``config`` when None).
    control_only : bool
        Serve only the control verbs (the control listener of a NETCONF or gNMI emulator).
    ssh : bool
        Serve TL1 over SSH (the user and password of ``config``) instead of plain TCP.

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

    def __init__(self, config: EmulatorConfig, announce: Callable[[str], None] = lambda line: None, *,
                 core: DeviceCore | None = None, control_only: bool = False, ssh: bool = False) -> None:
        self.core = core or DeviceCore(config, announce)
        self.config = self.core.config if core is not None else config
        self.announce = announce
        self.control_only, self.ssh = control_only, ssh
        self.host, self.port = config.host, config.port
        self._server: Any = None
        self._sessions: set[_Session] = set()
        self._stopped = asyncio.Event()
        self._atag = 0
        self._ssh_key: Any = None
        if not control_only:
            self.core.frontends.append(self)
            self.core.alarm_listeners.append(self._report_alarm)

    @property
    def state(self):  # the table and port states (tests and tools read them)
        return self.core.state

    @property
    def counters(self) -> dict[str, int]:
        return self.core.counters

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        """Start listening; return the bound ``(host, port)`` (a restart binds the same port again)."""
        if self.ssh:
            import asyncssh

            from orchestrl.fabric.ocs.ssh_server import password_server, server_key

            self._ssh_key = self._ssh_key or server_key()
            self._server = await asyncssh.create_server(
                password_server(self.config.user, self.config.password), self.host, self.port,
                server_host_keys=[self._ssh_key], process_factory=self._ssh_client, encoding=None)
        else:
            self._server = await asyncio.start_server(self._tcp_client, self.host, self.port)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        return self.host, self.port

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        await self.close()
        self._stopped.set()

    async def close(self) -> None:
        """Close the listener and every session (a restart, or the end)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for session in list(self._sessions):
            session.abort()
        self._sessions.clear()

    # -- connections ------------------------------------------------------------------------
    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, _Session(writer.write, writer.drain, writer.close, writer.is_closing))

    async def _ssh_client(self, process: Any) -> None:  # an asyncssh SSHServerProcess: TL1 on its session channel
        chan = process.channel
        await self._serve(process.stdin, _Session(process.stdout.write, process.stdout.drain,
                                                  lambda: process.exit(0), chan.is_closing))

    async def _serve(self, reader: Any, session: _Session) -> None:
        self._sessions.add(session)
        splitter = Tl1Splitter()
        try:
            with suppress(ConnectionError, OSError):  # the client vanished: nothing to answer
                while data := await reader.read(65536):
                    for text in splitter.feed(data):
                        task = asyncio.create_task(self._run(session, text))
                        session.tasks.add(task)
                        task.add_done_callback(session.tasks.discard)
        except Exception as exc:  # noqa: BLE001 - an SSH channel closing mid-read; the session just ends
            log.debug("session ended: %s", exc)
        finally:
            self._sessions.discard(session)
            session.abort()

    async def _run(self, session: _Session, text: str) -> None:
        try:
            cmd = parse_command(text)
        except OcsProtocolError as exc:
            ctag = text.split(":")[3] if text.count(":") >= 3 else "0"
            await session.send(self._format(self._deny(Command("?", ctag=ctag), "IISP", exc.problem)))
            return
        self.core.counters["commands"] += 1
        work = asyncio.ensure_future(self._execute(session, cmd))
        if self.config.ack_after_s > 0 and cmd.verb not in CONTROL_VERBS:
            done, _ = await asyncio.wait({work}, timeout=self.config.ack_after_s)
            if not done:  # still running (mirrors moving): acknowledge it is in progress, as GR-831 has it
                await session.send(format_acknowledgement(cmd.ctag))
        resp = await work
        if cmd.verb not in CONTROL_VERBS and cmd.verb not in _SESSION_VERBS:
            if not await self.core.reply_allowed():
                log.info("dropping the reply to %s ctag %s (fault injection)", cmd.verb, cmd.ctag)
                return
        await session.send(self._format(resp))

    @staticmethod
    def _format(resp: Response) -> str:
        return format_response(resp, errcde=True)  # a DENY names its code as "<aid>:ERRCDE=<code>"

    def _ok(self, cmd: Command, data: list[str] | tuple[str, ...] = (), comment: str = "") -> Response:
        return Response(cmd.ctag, "COMPLD", tuple(data), comment=comment, sid=self.config.sid, **_stamp())

    def _deny(self, cmd: Command, code: str, text: str, ports: list[int] | tuple[int, ...] = ()) -> Response:
        data = ("&".join(map(str, ports)),) if ports else ()
        return Response(cmd.ctag, "DENY", data, code, text, sid=self.config.sid, **_stamp())

    async def _execute(self, session: _Session, cmd: Command) -> Response:
        handler = _HANDLERS.get(cmd.verb)
        if handler is None or (self.control_only and cmd.verb not in CONTROL_VERBS):
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
        self.core.counters["logins"] += 1
        return self._ok(cmd)

    def _canc_user(self, session: _Session, cmd: Command) -> Response:
        session.logged_in = False
        return self._ok(cmd)

    def _set_sid(self, session: _Session, cmd: Command) -> Response:
        sid = unquote(cmd.params[-1].strip()) if cmd.params else ""
        if not sid.strip():
            return self._deny(cmd, "IDNV", "give the new SID: SET-SID:::<ctag>::<sid>;")
        self.config.sid = sid.strip()
        return self._ok(cmd)

    async def _ent_patch(self, session: _Session, cmd: Command) -> Response:
        ins, outs = split_pair_lists(cmd.aid, self.config.sid)
        if len(ins) != len(outs) or not ins:
            return self._deny(cmd, "IIPG", f"{len(ins)} ingress and {len(outs)} egress ports; give equal lists")
        done = await self.core.apply(list(zip(ins, outs)))
        if done.refusal is not None:
            return self._deny(cmd, done.refusal.status, done.refusal.message, [done.refusal.port])
        if done.aborted:
            applied = ", ".join(f"{i}->{e}" for i, e in done.pairs[:done.applied]) or "none"
            return self._deny(cmd, "SABT", f"applied {done.applied} of {len(done.pairs)} pairs ({applied}), then aborted")
        return self._ok(cmd)

    def _dlt_patch(self, session: _Session, cmd: Command) -> Response:
        ports = (list(self.core.state.cross_connects()) if cmd.aid.strip().upper() == "ALL"
                 else parse_ports(cmd.aid, self.config.sid, cmd.verb))
        if not ports and cmd.aid.strip().upper() != "ALL":
            return self._deny(cmd, "IIPG", "no ports given")
        bad, removed = self.core.remove(ports)  # checked whole, refused whole
        if bad is not None:
            return self._deny(cmd, bad.status, bad.message, [bad.port])
        return self._ok(cmd, list(starmap(format_patch_line, removed)))

    def _rtrv_patch(self, session: _Session, cmd: Command) -> Response:
        table = self.core.state.cross_connects().items()
        if cmd.aid.strip() and cmd.aid.strip().upper() != "ALL":  # RTRV-PATCH::<ports>: those ports' cross-connects
            wanted = set(parse_ports(cmd.aid, self.config.sid, cmd.verb))
            table = [(i, e) for i, e in table if i in wanted or e in wanted]
        return self._ok(cmd, [format_patch_line(i, e) for i, e in table])

    def _ports_of(self, cmd: Command) -> list[int] | Response:
        if cmd.aid.upper() in ("", "ALL"):
            return list(range(1, 2 * self.core.n + 1))
        ports = parse_ports(cmd.aid, self.config.sid, cmd.verb)
        bad = [p for p in ports if self.core.state.side(p) is None]
        if bad or not ports:
            return self._deny(cmd, "IIAC", f"port {bad[0] if bad else '?'} is outside 1..{2 * self.core.n}", bad[:1])
        return ports

    def _rtrv_port_shutter(self, session: _Session, cmd: Command) -> Response:
        ports = self._ports_of(cmd)
        if isinstance(ports, Response):
            return ports
        state = self.core.state.state
        return self._ok(cmd, [f"{p}:{'CLOSED' if state(p) is PortState.FORCE_BLOCKED else 'OPEN'}" for p in ports])

    def _rtrv_port_power(self, session: _Session, cmd: Command) -> Response:
        ports = self._ports_of(cmd)
        if isinstance(ports, Response):
            return ports
        return self._ok(cmd, [f"{p}:{self.core.power_dbm(p):.2f}" for p in ports])

    def _rtrv_alm_all(self, session: _Session, cmd: Command) -> Response:
        severity = {PortState.FAILED: "MJ", PortState.FORCE_BLOCKED: "MN"}
        lines = [f"{p}:{severity[s.state]},{s.alarm or s.state.value}"
                 for p, s in self.core.port_status().items() if s.state in severity]
        return self._ok(cmd, lines)

    def _rtrv_eqpt(self, session: _Session, cmd: Command) -> Response:
        keys = parse_keywords(cmd.params[-1] if cmd.params else "")
        n = self.core.n
        if cmd.aid.upper() != "SYSTEM":
            return self._deny(cmd, "IIAC", f"equipment {cmd.aid!r} is unknown; use SYSTEM")
        parameter = keys.get("PARAMETER", "").upper()
        if parameter == "SIZE":  # RTRV-EQPT::SYSTEM:<ctag>:::PARAMETER=SIZE; as Polatis clients ask it
            return self._ok(cmd, [f"SYSTEM:SIZE={n}x{n}"])
        if parameter:
            return self._deny(cmd, "IDNV", f"PARAMETER={parameter} is not served; use PARAMETER=SIZE")
        delay_ms = self.core.switch_delay_s * 1e3
        return self._ok(cmd, [f"SYSTEM:SIZE={n}x{n},PROFILE={self.config.profile},DELAY_MS={delay_ms:g}"])

    def _rtrv_inv(self, session: _Session, cmd: Command) -> Response:
        n = self.core.n
        return self._ok(cmd, [f"OCS:SN={self.config.serial_number},MODEL=EMU-{n}x{n}-{self.config.profile}"])

    def _rtrv_netype(self, session: _Session, cmd: Command) -> Response:
        n = self.core.n
        return self._ok(cmd, [f"orchestrl,EMU-{n}x{n},OCS,1.0"])

    def _shutter(self, session: _Session, cmd: Command) -> Response:
        ports = self._ports_of(cmd)
        if isinstance(ports, Response):
            return ports
        self.core.set_blocked(ports, cmd.verb == "OPR-PORT-SHUTTER")
        return self._ok(cmd)

    # -- emulator control -------------------------------------------------------------------
    def _ed_emul(self, session: _Session, cmd: Command) -> Response:
        refused = self.core.control(parse_keywords(cmd.params[-1] if cmd.params else ""))
        return self._deny(cmd, "IDNV", refused) if refused else self._ok(cmd)

    def _opr_emul_restart(self, session: _Session, cmd: Command) -> Response:
        keys = parse_keywords(cmd.params[-1] if cmd.params else "")
        table = keys.get("TABLE", "KEEP").upper()
        if table not in ("KEEP", "LOSE"):
            return self._deny(cmd, "IDNV", f"TABLE={table} is not KEEP or LOSE")
        down = keys.get("DOWNMS", "200").upper()
        if down == "HOLD" and not self.control_only:
            # this listener is the switch's own: it goes down too, and nothing could send OPR-EMUL-UP
            return self._deny(cmd, "IDNV", "DOWNMS=HOLD needs a control listener of its own; start the emulator "
                                           "with --control-port")
        try:
            down_s = None if down == "HOLD" else float(down) / 1e3
        except ValueError:
            return self._deny(cmd, "IDNV", f"DOWNMS={down} is not a number of ms or HOLD")
        asyncio.get_running_loop().create_task(self.core.restart(table == "KEEP", down_s))
        return self._ok(cmd, comment=f"restarting, table {table.lower()}")

    def _opr_emul_up(self, session: _Session, cmd: Command) -> Response:
        self.core.power_on.set()
        return self._ok(cmd)

    def _rtrv_emul(self, session: _Session, cmd: Command) -> Response:
        values = self.core.settings(sessions=sum(len(f._sessions) for f in self.core.frontends
                                                 if isinstance(f, Emulator)))
        return self._ok(cmd, [f"{k}={v}" for k, v in values.items()])

    def _report_alarm(self, ports: list[int], alarm: str) -> None:
        """Send an autonomous REPT ALM to every logged-in session (drivers must ignore it)."""
        self._atag += 1
        text = format_response(Autonomous(str(self._atag), "**", "REPT ALM OCS",
                                          tuple(f"{p}:MJ,{alarm}" for p in ports), self.config.sid))
        for session in list(self._sessions):
            if session.logged_in:
                asyncio.get_running_loop().create_task(session.send(text))


_HANDLERS = {
    "ACT-USER": Emulator._act_user, "CANC-USER": Emulator._canc_user, "SET-SID": Emulator._set_sid,
    "ENT-PATCH": Emulator._ent_patch, "DLT-PATCH": Emulator._dlt_patch, "RTRV-PATCH": Emulator._rtrv_patch,
    "RTRV-PORT-SHUTTER": Emulator._rtrv_port_shutter, "RTRV-PORT-POWER": Emulator._rtrv_port_power,
    "RTRV-ALM-ALL": Emulator._rtrv_alm_all, "RTRV-EQPT": Emulator._rtrv_eqpt, "RTRV-INV": Emulator._rtrv_inv,
    "RTRV-NETYPE": Emulator._rtrv_netype, "OPR-PORT-SHUTTER": Emulator._shutter, "RLS-PORT-SHUTTER": Emulator._shutter,
    "ED-EMUL": Emulator._ed_emul, "OPR-EMUL-RESTART": Emulator._opr_emul_restart, "RTRV-EMUL": Emulator._rtrv_emul,
    "OPR-EMUL-UP": Emulator._opr_emul_up,
}


def _stamp() -> dict[str, str]:
    now = time.gmtime()
    return {"date": time.strftime("%y-%m-%d", now), "time": time.strftime("%H:%M:%S", now)}


async def serve(config: EmulatorConfig, protocol: str = "tl1", announce: Callable[[str], None] = print, *,
                ssh: bool = False, control_port: int | None = None) -> None:
    """Serve one emulated switch in ``protocol`` until cancelled; announce ``listening on`` and ``control on``.

    TL1 over TCP takes its control verbs on its own listener unless ``control_port`` is given; NETCONF,
    gNMI and TL1 over SSH always get a TL1 control listener on ``control_port`` (0 or None: a free one)
    next to theirs, on the same core, which stays up while the switch is restarted or held down.
    """
    if protocol not in EMULATOR_PROTOCOLS:
        raise OcsRequestError(config.sid, "emulate", f"protocol {protocol!r} is unknown; use {', '.join(EMULATOR_PROTOCOLS)}")
    core = DeviceCore(config, announce)
    if protocol == "tl1":
        front: Any = Emulator(config, announce, core=core, ssh=ssh)
    elif protocol == "netconf":
        from orchestrl.fabric.ocs.netconf_emulator import NetconfEmulator
        front = NetconfEmulator(core)
    else:
        from orchestrl.fabric.ocs.gnmi_emulator import GnmiEmulator
        front = GnmiEmulator(core)
    host, port = await front.start()
    if protocol == "tl1" and not ssh and control_port is None:
        control_host, control = host, port
    else:
        ctl = Emulator(EmulatorConfig(host=config.host, port=control_port or 0), announce, core=core, control_only=True)
        control_host, control = await ctl.start()
    announce(f"listening on {host}:{port}")
    announce(f"control on {control_host}:{control}")
    await asyncio.Event().wait()


def run_emulator(config: EmulatorConfig, announce: Callable[[str], None] = print, *, protocol: str = "tl1",
                 ssh: bool = False, control_port: int | None = None) -> None:
    """Serve an emulated switch until interrupted; ``announce`` gets ``listening on HOST:PORT``."""
    with suppress(KeyboardInterrupt):  # Ctrl-C is how an operator stops an emulator
        asyncio.run(serve(config, protocol, announce, ssh=ssh, control_port=control_port))
