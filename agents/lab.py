"""A fabric on loopback: one emulated OCS subprocess per topology device, and the proxy in front.

The demo, the end-to-end tests and ``bench/commit.py`` all need the same thing: real emulator
processes speaking TL1, NETCONF or gNMI on ephemeral ports, a ``devices.yaml`` (and its secrets
file) that points at them, and the proxy
(``orchestrl proxy serve``) as a real subprocess that can be killed with SIGKILL and restarted on
the same state file. :class:`EmulatedFabric` owns all of these processes and stops every one of
them on exit, whatever happened.
"""

from __future__ import annotations

import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import yaml

from orchestrl.fabric.ocs.emulator_control import EmulatorControl, EmulatorProcess, start_emulator_process, stop_emulator_process
from orchestrl.fabric.topology import Topology, load_topology

__all__ = ["EmulatedFabric", "ProxyProcess", "start_proxy_process"]

_REPO_ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"listening on (https?://\S+)")


class ProxyProcess:
    """A running ``orchestrl proxy serve`` subprocess; ``output`` keeps its last lines."""

    def __init__(self, process: subprocess.Popen, url: str, output: deque[str]) -> None:
        self.process, self.url, self.output = process, url, output

    def kill(self) -> None:
        """SIGKILL: the process dies wherever it is (a crash, for tests)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


def start_proxy_process(args: Sequence[str], timeout_s: float = 60.0,
                        command: Sequence[str] = ("orchestrl.agents.cli", "proxy", "serve")) -> ProxyProcess:
    """Run ``python -m orchestrl.agents.cli proxy serve ARGS``; return once it prints ``listening on URL``.

    ``command`` names another module to run instead (``("orchestrl.agents.http.legacy",)``: the stdlib server
    that ``bench/proxy.py`` compares with).

    Raises
    ------
    RuntimeError
        If the proxy exits or does not listen within ``timeout_s`` (its output is in the message).
    """
    cmd = [sys.executable, "-u", "-m", *command, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, cwd=_REPO_ROOT, env=env)
    output: deque[str] = deque(maxlen=400)
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:  # keep the pipe empty so the proxy never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line.rstrip("\n"))
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, name=f"proxy-{proc.pid}-stdout", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:
            break
        match = _LISTENING.search(line)
        if match:
            return ProxyProcess(proc, match.group(1), output)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    raise RuntimeError(f"proxy did not start listening within {timeout_s:g} s (exit {proc.returncode}); it printed: "
                       + " | ".join(output)[-1500:])


class EmulatedFabric:
    """Emulated switches for every device of a topology, and the proxy, as subprocesses.

    Parameters
    ----------
    topology_path : str or Path
        The fabric; one emulator per device, with the device's radix and technology profile.
    workdir : str or Path
        Where ``devices.yaml``, ``tokens.yaml`` and the proxy's state file are written.
    profile : str, optional
        Emulator profile for every device (default: each device's technology; ``"test"`` switches
        instantly).
    switch_delay_ms : float, optional
        Override the profile's switching delay (e.g. 0 to measure controller overhead alone).
    timeout_s : float
        Reply timeout of every switch in the devices file (default 10 s).
    protocol : str
        What the switches speak: ``tl1`` (Polatis TL1/TCP), ``netconf`` (Polatis YANG over SSH) or
        ``gnmi`` (SONiC OCS tables); the devices file names the same protocol, so the proxy drives them
        through that adapter. Credentials go to a secrets file (0600) the devices file names.
    device_options : dict, optional
        More defaults for every switch of the devices file (``{"confirm_timeout_s": 0}``: NETCONF commits
        without a confirmed commit).
    """

    def __init__(self, topology_path: str | os.PathLike, workdir: str | os.PathLike, *, profile: str | None = None,
                 switch_delay_ms: float | None = None, timeout_s: float = 10.0, protocol: str = "tl1",
                 device_options: dict | None = None) -> None:
        self.topology_path = str(topology_path)
        self.topology: Topology = load_topology(topology_path)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.profile = profile
        self.switch_delay_ms = switch_delay_ms
        self.timeout_s = timeout_s  # the devices file's reply timeout for every switch
        self.protocol = protocol
        self.device_options = dict(device_options or {})  # more device-file defaults, e.g. NETCONF's datastore
        self.operator_token = secrets.token_urlsafe(24)
        self.switches: dict[str, EmulatorProcess] = {}
        self.proxy: ProxyProcess | None = None
        self.devices_path = self.workdir / "devices.yaml"
        self.secrets_path = self.workdir / "secrets.yaml"
        self.tokens_path = self.workdir / "tokens.yaml"
        self.state_path = self.workdir / "fabric.db"

    # -- switches --------------------------------------------------------------------------------
    def start_switches(self) -> "EmulatedFabric":
        """Start one emulator per device (in parallel) and write ``devices.yaml`` for them."""
        def start(dev) -> tuple[str, EmulatorProcess]:
            # a control listener apart from the switch's own, so a test can hold a switch down and bring it back
            extra = ["--sid", dev.id.replace("/", "-"), "--control-port", "0"]
            if self.switch_delay_ms is not None:
                extra += ["--switch-delay-ms", str(self.switch_delay_ms)]
            return dev.id, start_emulator_process(dev.radix_ports, self.profile or dev.technology.name,
                                                  extra_args=extra, timeout_s=60.0, protocol=self.protocol)

        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(start, dev) for dev in self.topology.devices.values()]
            errors = []
            for f in futures:
                try:
                    name, proc = f.result()
                    self.switches[name] = proc
                except Exception as exc:  # noqa: BLE001 - collected, re-raised after cleanup below
                    errors.append(exc)
        if errors:
            self.close()
            raise errors[0]
        self.secrets_path.write_text(yaml.safe_dump({"credentials": {"default": {"user": "admin", "password": "admin"}}}))
        os.chmod(self.secrets_path, 0o600)
        doc = {"secrets": self.secrets_path.name,
               "defaults": {"protocol": self.protocol, "timeout_s": self.timeout_s, **self.device_options},
               "devices": {name: {"host": p.host, "port": p.port, "ports": self.topology.devices[name].radix_ports,
                                  "profile": self.profile or self.topology.devices[name].technology.name}
                           for name, p in sorted(self.switches.items())}}
        self.devices_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.tokens_path.write_text(yaml.safe_dump({"operator_tokens": [self.operator_token]}))
        os.chmod(self.tokens_path, 0o600)
        return self

    def control(self, device: str) -> EmulatorControl:
        """Return the fault-injection client of one emulated device."""
        return self.switches[device].control()

    def driver(self, device: str):
        """Return a fresh adapter (of the lab's protocol) for one device (the caller closes it)."""
        from orchestrl.fabric.ocs.devices import load_devices, open_device

        return open_device(load_devices(self.devices_path)[device])

    def tables(self) -> dict[str, dict[int, int]]:
        """Return every device's cross-connect table, read over the lab's protocol."""
        out = {}
        for name in sorted(self.switches):
            with self.driver(name) as drv:
                out[name] = drv.cross_connects()
        return out

    # -- proxy -----------------------------------------------------------------------------------
    def start_proxy(self, *extra: str, timeout_s: float = 60.0, legacy: bool = False) -> ProxyProcess:
        """Start the proxy on a free loopback port over the switches and the state file.

        ``legacy``: the stdlib server of before FastAPI (``agents.http.legacy``, for bench/proxy.py),
        started like ``--reset``.
        """
        args = ["--topology", self.topology_path, "--devices", str(self.devices_path), "--listen", "127.0.0.1:0",
                "--state", str(self.state_path), "--tokens", str(self.tokens_path), *extra]
        command = ("orchestrl.agents.http.legacy",) if legacy else ("orchestrl.agents.cli", "proxy", "serve")
        self.proxy = start_proxy_process(args, timeout_s, command)
        return self.proxy

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the proxy and every emulator (SIGTERM, then SIGKILL)."""
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        for proc in self.switches.values():
            stop_emulator_process(proc.process)
        self.switches.clear()

    def __enter__(self) -> "EmulatedFabric":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
