"""The emulated switch itself, shared by every protocol the emulators speak (TL1, NETCONF, gNMI).

Design note
-----------
One :class:`DeviceCore` holds what a switch is, whatever protocol drives it: the cross-connect
table and port states (:class:`fabric.ocs.model.SwitchState`), the switching delay of its
technology (OrchestrRL Table 2: one delay per bulk, since all mirrors of a bulk move together;
meanwhile the ports are ``tuning`` and refuse commands with ``SNVS``), its optical power readings,
and the injected faults (failed or blocked ports, dropped or delayed replies, bulks aborted part
way, restarts that keep or lose the table). A protocol front-end (:mod:`.emulator` for TL1,
:mod:`.netconf_emulator`, :mod:`.gnmi_emulator`) only translates its wire format into these calls,
so a fault set once behaves the same over every protocol and a test proves the same thing over each.

Faults are changed at run time with the TL1 control verbs of :mod:`.emulator` (``ED-EMUL``,
``OPR-EMUL-RESTART``, ``RTRV-EMUL``): on the TL1 listener itself for a TL1 switch, on a control
listener of their own for the others (``control on HOST:PORT``), so
:class:`fabric.ocs.emulator_control.EmulatorControl` drives every emulator alike.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Protocol

from orchestrl.fabric.ocs.errors import OcsRequestError
from orchestrl.fabric.ocs.model import PortState, PortStatus, SwitchState, XcStatus
from orchestrl.fabric.ocs.tl1 import parse_ports
from orchestrl.fabric.topology import OCS_TECHNOLOGIES

__all__ = ["EmulatorConfig", "DeviceCore", "Frontend", "PROFILES", "profile_delay_s", "CONTROL_KEYS",
           "LIT_DBM", "NO_LIGHT_DBM", "INSERTION_LOSS_DB"]

log = logging.getLogger(__name__)

# Profile name -> (switch_delay_s, max ports per side); "test" is a zero-delay profile for unit tests.
PROFILES: dict[str, tuple[float, int]] = {
    **{name: (t.switch_delay_s, t.radix_ports) for name, t in OCS_TECHNOLOGIES.items()},
    "test": (0.0, 4096),
}
# Optical power the emulated power monitors read (dBm). Every port of an RFabric OCS faces a transceiver, so
# light enters every working ingress port; it leaves an egress port only through a cross-connect, less the
# switch's insertion loss. A failed port reads no light (loss of signal).
LIT_DBM = -3.0
INSERTION_LOSS_DB = 1.2
NO_LIGHT_DBM = -60.0
CONTROL_KEYS = frozenset({"FAIL", "ALARM", "REPAIR", "BLOCK", "RELEASE", "DROP", "DROPNEXT", "DELAYMS", "PARTIAL",
                          "SWITCHMS", "CLEAR"})


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
    sid: str = "OCS-EMU"  # TL1 source identifier; NETCONF and gNMI serve it as the serial number
    serial: str = ""  # serial number (RTRV-INV, product-information); empty: derived from the SID
    switch_delay_s: float | None = None  # None: the profile's delay
    fail_ports: list[int] = field(default_factory=list)  # ports failed from the start
    drop_probability: float = 0.0  # chance that a reply is not sent (the command still runs)
    drop_next: int = 0  # drop exactly the next n replies
    delay_replies_s: float = 0.0  # extra time before every reply
    partial_bulk: int | None = None  # apply only the first k pairs of larger bulks, then refuse (SABT)
    seed: int | None = None  # seeds the random dropping
    ack_after_s: float = 0.2  # TL1: a command still running after this long is acknowledged "IP <ctag>" (GR-831)

    @property
    def serial_number(self) -> str:
        return self.serial or "".join(ch for ch in self.sid if ch.isalnum()).upper() or "OCSEMU"


class Frontend(Protocol):
    """A protocol listener on a :class:`DeviceCore` (what a restart closes and opens again)."""

    async def start(self) -> tuple[str, int]: ...
    async def close(self) -> None: ...  # the listener and every session


@dataclass
class ApplyOutcome:
    """What a bulk connect did: the refusal (None: accepted) and how many pairs were applied."""

    refusal: XcStatus | None
    applied: int
    pairs: list[tuple[int, int]]

    @property
    def aborted(self) -> bool:  # accepted, but the partial-bulk fault stopped it part way
        return self.refusal is None and self.applied < len(self.pairs)


class DeviceCore:
    """An emulated ``N x N`` switch, independent of the protocol that drives it.

    Parameters
    ----------
    config : EmulatorConfig
        Size, technology profile, credentials and the initial faults.
    announce : callable
        Receives one line per event an operator should see (restarts).

    Examples
    --------
    >>> core = DeviceCore(EmulatorConfig(ports=4, profile="test"))
    >>> asyncio.run(core.apply([(1, 5), (2, 6)])).refusal is None, core.state.cross_connects()
    (True, {1: 5, 2: 6})
    >>> core.control({"FAIL": "3"}); core.port_status()[3].state.value
    'failed'
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
        self._tuning: dict[int, object] = {}  # port -> token of the bulk moving its mirror
        self.frontends: list[Frontend] = []  # closed and reopened by a restart
        self.counters = {"logins": 0, "restarts": 0, "dropped": 0, "commands": 0}
        self.alarm_listeners: list[Callable[[list[int], str], None]] = []  # TL1 sessions report REPT ALM
        # Set while a restart holds the switch down until told (DOWNMS=HOLD): tests that must see a switch
        # down for as long as a proxy takes to start cannot use a fixed window, whose length a loaded host decides.
        self.power_on = asyncio.Event()
        self.power_on.set()

    @property
    def n(self) -> int:
        return self.state.n

    # -- the switch ---------------------------------------------------------------------------
    async def apply(self, pairs: list[tuple[int, int]]) -> ApplyOutcome:
        """Create ``pairs`` as one bulk: checked whole and refused whole; answers after the switching delay.

        The table changes at once (before any wait), so commands that arrive after this one see it,
        as on a device that processes commands in arrival order; with the partial-bulk fault only the
        first k pairs are applied (:attr:`ApplyOutcome.aborted`).
        """
        k = self.config.partial_bulk
        applied = len(pairs) if k is None else min(k, len(pairs))
        bad = self.state.connect_atomic(pairs, applied)
        if bad is not None:
            return ApplyOutcome(bad, 0, pairs)
        if self.switch_delay_s > 0:  # a zero delay moves no mirror for any time: nothing to show tuning
            moving = [p for pair in pairs[:applied] for p in pair]
            token = object()
            self.state.set_port_state(moving, PortState.TUNING)
            self._tuning.update((p, token) for p in moving)
            try:
                await asyncio.sleep(self.switch_delay_s)  # every mirror of the bulk moves at once
            finally:
                self._settle([p for p in moving if self._tuning.get(p) is token])
        return ApplyOutcome(None, applied, pairs)

    def remove(self, ports: list[int]) -> tuple[XcStatus | None, list[tuple[int, int]]]:
        """Remove the cross-connects on ``ports`` (either side), or none if one is refused; immediate."""
        return self.state.disconnect_atomic(ports)

    def _settle(self, ports: list[int]) -> None:
        for p in ports:
            self._tuning.pop(p, None)
        self.state.set_port_state(self.state.ports_in_state(ports, PortState.TUNING), PortState.NORMAL)

    def port_status(self, ports: list[int] | None = None) -> dict[int, PortStatus]:
        return self.state.port_status(ports)

    def power_dbm(self, port: int) -> float:
        """The power monitor's reading on ``port``: light in on ingress, light out through a cross-connect on egress."""
        if self.state.state(port) is PortState.FAILED:
            return NO_LIGHT_DBM
        if port <= self.n:
            return LIT_DBM
        ingress = self.state.peer(port)
        if ingress is None or self.state.state(ingress) in (PortState.FAILED, PortState.FORCE_BLOCKED, PortState.TUNING):
            return NO_LIGHT_DBM  # nothing patched to it, or its source is dark or its shutter closed
        return LIT_DBM - INSERTION_LOSS_DB

    def set_blocked(self, ports: list[int], blocked: bool) -> None:
        """Close (force-block) or open the shutters of ``ports``."""
        if blocked:
            self.state.set_port_state(ports, PortState.FORCE_BLOCKED, "force-blocked by operator")
        else:
            self.state.set_port_state([p for p in ports if self.state.state(p) is PortState.FORCE_BLOCKED],
                                      PortState.NORMAL)

    # -- reply faults --------------------------------------------------------------------------
    async def reply_allowed(self) -> bool:
        """Apply the reply faults before a reply goes out: wait the injected delay; False to drop it."""
        if self.config.drop_next > 0:
            self.config.drop_next -= 1
            self.counters["dropped"] += 1
            return False
        if self.config.drop_probability > 0 and self._rng.random() < self.config.drop_probability:
            self.counters["dropped"] += 1
            return False
        if self.config.delay_replies_s > 0:
            await asyncio.sleep(self.config.delay_replies_s)
        return True

    # -- fault control (ED-EMUL keywords) ---------------------------------------------------------
    def control(self, keys: Mapping[str, str]) -> str | None:
        """Change faults by ``ED-EMUL`` keywords; return the refusal in words (None: done)."""
        unknown = set(keys) - CONTROL_KEYS
        if unknown:
            return f"unknown key(s) {', '.join(sorted(unknown))}; use {', '.join(sorted(CONTROL_KEYS))}"
        ports = lambda key: (list(range(1, 2 * self.n + 1)) if keys[key].upper() == "ALL"  # noqa: E731
                             else parse_ports(keys[key], self.config.sid, "ED-EMUL"))
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
            for listener in list(self.alarm_listeners):
                listener(failed, alarm)
        if "REPAIR" in keys:
            self.state.set_port_state([p for p in ports("REPAIR") if self.state.state(p) is PortState.FAILED],
                                      PortState.NORMAL)
        if "BLOCK" in keys:
            self.set_blocked(ports("BLOCK"), True)
        if "RELEASE" in keys:
            self.set_blocked(ports("RELEASE"), False)
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
        return None

    def settings(self, sessions: int = 0) -> dict[str, object]:
        """The current settings and counters (``RTRV-EMUL``)."""
        c, states = self.config, self.state.port_status()
        by_state = lambda st: "&".join(str(p) for p, s in states.items() if s.state is st)  # noqa: E731
        return {
            "PROFILE": c.profile, "PORTS": self.n, "SWITCHMS": f"{self.switch_delay_s * 1e3:g}",
            "DROP": c.drop_probability, "DROPNEXT": c.drop_next, "DELAYMS": f"{c.delay_replies_s * 1e3:g}",
            "PARTIAL": "OFF" if c.partial_bulk is None else c.partial_bulk,
            "FAILED": by_state(PortState.FAILED), "BLOCKED": by_state(PortState.FORCE_BLOCKED),
            "TUNING": by_state(PortState.TUNING), "SESSIONS": sessions,
            **{k.upper(): v for k, v in self.counters.items()},
        }

    async def restart(self, keep_table: bool, down_s: float | None,
                      before: Callable[[], Awaitable[None]] | None = None) -> None:
        """Close every protocol listener and session, stay down ``down_s`` (None: until :meth:`power_up`),
        come back with or without the table."""
        await asyncio.sleep(0.02)  # let the reply to the restart command reach the client first
        for front in self.frontends:
            await front.close()
        if down_s is None:
            self.power_on.clear()
            await self.power_on.wait()
        else:
            await asyncio.sleep(down_s)
        if keep_table:
            self._settle(list(self._tuning))
        else:
            self.state.clear(keep_port_states=True)
        self._tuning.clear()
        for front in self.frontends:
            for attempt in range(50):
                try:
                    await front.start()
                    break
                except OSError:  # the old listener's port may take a moment to free
                    await asyncio.sleep(0.05 * (attempt + 1))
            else:
                raise OSError(f"emulator could not re-bind its listener after a restart ({front!r})")
        self.counters["restarts"] += 1
        table = "kept" if keep_table else "lost"
        self.announce(f"restarted ({table} cross-connect table)")
