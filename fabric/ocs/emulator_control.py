"""Run an emulated OCS as a real subprocess and steer its faults at run time.

:func:`start_emulator_process` launches ``python -m orchestrl.agents.cli ocs emulate --listen 127.0.0.1:0``
(TL1, NETCONF or gNMI: ``protocol``) and returns once the emulator printed ``listening on HOST:PORT``
and ``control on HOST:PORT``; :class:`EmulatorControl` sends the emulator's control verbs
(documented in :mod:`fabric.ocs.emulator`) to the control address over a fresh TCP connection per
call, so it keeps working across emulated restarts.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from orchestrl.fabric.ocs.errors import OcsConnectionError, OcsError, OcsTimeout, denied_from_code
from orchestrl.fabric.ocs.tl1 import Command, Response, Tl1Splitter, format_command, format_keywords, format_ports, parse_response

__all__ = ["EmulatorControl", "EmulatorProcess", "start_emulator_process", "stop_emulator_process"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
_CONTROL = re.compile(r"control on (\S+):(\d+)")


class EmulatorControl:
    """Client of an emulator's fault-injection verbs (``ED-EMUL``, ``OPR-EMUL-RESTART``, ``RTRV-EMUL``).

    Parameters
    ----------
    host, port : str, int
        The emulator's TL1 listener (the control verbs share it and need no login).
    timeout_s : float
        Seconds to wait for each reply.
    """

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.host, self.port, self.timeout_s = host, int(port), timeout_s
        self.name = f"emulator {host}:{port}"

    def _call(self, verb: str, keywords: dict[str, object] | None = None) -> Response:
        params = ("", format_keywords(keywords)) if keywords else ()
        cmd = Command(verb, "", "1", params=params)
        deadline = time.monotonic() + self.timeout_s
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as sock:
                sock.sendall(format_command(cmd).encode())
                splitter = Tl1Splitter()
                while time.monotonic() < deadline:
                    sock.settimeout(max(deadline - time.monotonic(), 0.01))
                    data = sock.recv(65536)
                    if not data:
                        break
                    for block in splitter.feed(data):
                        msg = parse_response(block, self.name)
                        if isinstance(msg, Response) and msg.ctag == "1":
                            if not msg.ok:
                                raise denied_from_code(self.name, verb, msg.code, msg.comment)
                            return msg
        except socket.timeout:
            raise OcsTimeout(self.name, verb, f"no reply within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise OcsConnectionError(self.name, verb, f"cannot reach the emulator ({exc}); is it running?") from None
        raise OcsTimeout(self.name, verb, f"no reply within {self.timeout_s:g} s")  # connection closed, no reply

    def set(self, **keywords: object) -> None:
        """Send one ``ED-EMUL`` with raw keywords, e.g. ``set(DROP=0.1, DELAYMS=50)``."""
        self._call("ED-EMUL", {k.upper(): v for k, v in keywords.items()})

    def settings(self) -> dict[str, str]:
        """Return the emulator's current settings and counters (``RTRV-EMUL``)."""
        return dict(line.partition("=")[::2] for line in self._call("RTRV-EMUL").data)

    def fail_ports(self, ports: Iterable[int], alarm: str = "LOS") -> None:
        """Fail ``ports``: connects on them are refused (SWFA) and status shows ``failed``."""
        self.set(FAIL=format_ports(ports), ALARM=alarm)

    def repair_ports(self, ports: Iterable[int] | str = "ALL") -> None:
        self.set(REPAIR=ports if isinstance(ports, str) else format_ports(ports))

    def block_ports(self, ports: Iterable[int]) -> None:
        self.set(BLOCK=format_ports(ports))

    def release_ports(self, ports: Iterable[int] | str = "ALL") -> None:
        self.set(RELEASE=ports if isinstance(ports, str) else format_ports(ports))

    def drop_replies(self, probability: float = 0.0, next_n: int = 0) -> None:
        """Drop each reply with ``probability``, and exactly the next ``next_n`` replies."""
        self.set(DROP=probability, DROPNEXT=next_n)

    def delay_replies(self, delay_ms: float) -> None:
        self.set(DELAYMS=delay_ms)

    def partial_bulk(self, k: int | None) -> None:
        """Apply only the first ``k`` pairs of larger bulks, then DENY SABT (None turns it off)."""
        self.set(PARTIAL="OFF" if k is None else k)

    def switch_delay(self, delay_ms: float) -> None:
        self.set(SWITCHMS=delay_ms)

    def clear(self, what: str = "ALL") -> None:
        """Clear ``FAULTS`` (reply faults, failed and blocked ports), the ``TABLE``, or ``ALL``."""
        self.set(CLEAR=what)

    def restart(self, keep_table: bool = True, down_ms: float | None = 200, wait_s: float = 15.0) -> None:
        """Restart the emulator's listener (every session is closed) and wait until it is back.

        ``down_ms=None`` holds the switch down until :meth:`power_up` (``wait_s`` is then not waited; the
        emulator needs its own control listener, ``--control-port``).
        """
        before = int(self.settings().get("RESTARTS", 0))
        self._call("OPR-EMUL-RESTART", {"TABLE": "KEEP" if keep_table else "LOSE",
                                        "DOWNMS": "HOLD" if down_ms is None else down_ms})
        if down_ms is None:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                if int(self.settings().get("RESTARTS", 0)) > before:
                    return
            except OcsError:
                continue  # still down
        raise OcsTimeout(self.name, "OPR-EMUL-RESTART", f"emulator not back within {wait_s:g} s")


    def power_up(self, wait_s: float = 15.0) -> None:
        """End a hold of :meth:`restart` (``down_ms=None``) and wait until the switch is back."""
        before = int(self.settings().get("RESTARTS", 0))
        self._call("OPR-EMUL-UP")
        deadline = time.monotonic() + wait_s
        while int(self.settings().get("RESTARTS", 0)) <= before:
            if time.monotonic() > deadline:
                raise OcsTimeout(self.name, "OPR-EMUL-UP", f"emulator not back within {wait_s:g} s")
            time.sleep(0.02)


class EmulatorProcess(NamedTuple):
    """A running emulator subprocess, the address it serves its protocol on, and its control address.

    ``process.output`` (a deque) holds the last lines it printed.
    """

    process: subprocess.Popen
    host: str
    port: int
    control_port: int = 0  # the control verbs' listener (the TL1 listener itself for a TL1 switch)
    protocol: str = "tl1"

    def control(self) -> "EmulatorControl":
        return EmulatorControl(self.host, self.control_port or self.port)


def start_emulator_process(ports: int = 16, profile: str = "test", *, user: str = "admin", password: str = "admin",
                           extra_args: Sequence[str] = (), timeout_s: float = 30.0,
                           protocol: str = "tl1") -> EmulatorProcess:
    """Launch ``python -m orchestrl.agents.cli ocs emulate`` on an ephemeral port; return once it listens.

    Raises
    ------
    OcsConnectionError
        If the process exits or prints no ``listening on HOST:PORT`` line within ``timeout_s``.
    """
    cmd = [sys.executable, "-u", "-m", "orchestrl.agents.cli", "ocs", "emulate", "--listen", "127.0.0.1:0",
           "--ports", str(ports), "--profile", profile, "--user", user, "--password", password, "--protocol", protocol,
           *extra_args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, cwd=_REPO_ROOT, env=env)
    output: deque[str] = deque(maxlen=200)
    proc.output = output  # type: ignore[attr-defined]
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:  # keeps the pipe empty so the emulator never blocks on print
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, name=f"emulator-{proc.pid}-stdout", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    listening = None
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            line = None
        listening = listening or _LISTENING.search(line or "")
        control = _CONTROL.search(line or "")
        if listening and control:
            return EmulatorProcess(proc, listening.group(1), int(listening.group(2)), int(control.group(2)), protocol)
        if line is None:
            stop_emulator_process(proc)
            raise OcsConnectionError(f"emulator {profile}", "emulate",
                                     f"did not start listening within {timeout_s:g} s; it printed: "
                                     + " | ".join(output)[-800:])


def stop_emulator_process(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """Terminate an emulator subprocess (kill it if it does not exit within ``timeout_s``)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
