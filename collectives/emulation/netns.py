"""An emulated two-cluster network built from Linux network namespaces, veth pairs and ``tc``.

Design note
-----------
One namespace per server (one NIC, ``eth0``) plus one *fabric* namespace holding the switches:

    trainer servers --NIC-- [br-train] ==cross link== [br-gen] --PoD link-- [br-pod<p>] --NIC-- generator servers

Every NIC is shaped to ``nic_bps`` in both directions (``tbf`` on both ends of its veth), the
cross-cluster link to ``cross_bps`` (RollMux's testbed: 400 Gbps inside a cluster, 20 Gbps
between), and PoD links optionally to ``pod_link_bps``. All addresses sit in one private /16 that
exists only inside these namespaces, which have no route anywhere else, so no byte leaves them.
Namespace names carry a per-instance prefix and :meth:`EmulatedCluster.down` deletes them all
(deleting a namespace deletes its veths); :func:`remove_stale` cleans up after a killed run.
Needs root and iproute2 (``ip``, ``tc``); :func:`unavailable_reason` says why not when it can't run.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

__all__ = ["Host", "ClusterSpec", "EmulatedCluster", "unavailable_reason", "remove_stale", "PREFIX"]

PREFIX = "orlws"  # every namespace this module creates starts with it
_SUBNET = "10.213"
_counter = itertools.count()


def unavailable_reason() -> str | None:
    """Return why namespaces cannot be built here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's `{tool}`, which is not installed"
    return None


@dataclass(frozen=True)
class Host:
    """One emulated server: its namespace, address and role."""

    name: str  # "t0", "g1.2" (PoD 1, third server)
    netns: str
    ip: str
    role: str  # "trainer" | "generator"
    pod: int


@dataclass(frozen=True)
class ClusterSpec:
    """Shape and rates of the emulated cluster."""

    trainers: int
    gen_pods: int
    gens_per_pod: int
    nic_bps: float
    cross_bps: float
    pod_link_bps: float | None = None  # None: PoD links unshaped (the NICs limit them)
    train_pod: int = 0  # PoD number of the trainer cluster; generator PoDs follow it
    burst_bytes: int = 128 * 1024  # tbf bucket; must exceed a GSO super-packet (64 KiB)
    queue_latency_ms: int = 50


@dataclass
class EmulatedCluster:
    """Build with :meth:`up`, tear down with :meth:`down`; also a context manager."""

    spec: ClusterSpec
    prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid() % 100000}x{next(_counter)}")
    hosts: list[Host] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    def __enter__(self) -> "EmulatedCluster":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def fabric_ns(self) -> str:
        return f"{self.prefix}-fab"

    @property
    def trainers(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "trainer"]

    @property
    def generators(self) -> list[Host]:
        return [h for h in self.hosts if h.role == "generator"]

    def unplug_command(self, host: Host) -> list[str]:
        """The command that pulls ``host``'s cable: its link goes down on the fabric side, packets vanish silently."""
        return ["ip", "-n", self.fabric_ns, "link", "set", f"h{self.hosts.index(host)}", "down"]

    def gen_pod_ids(self) -> list[int]:
        return [self.spec.train_pod + 1 + p for p in range(self.spec.gen_pods)]

    def up(self) -> "EmulatedCluster":
        """Create namespaces, bridges, links and shapers; on any failure undo what was made."""
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"cannot build an emulated cluster: {reason}")
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Delete every namespace this cluster made (idempotent)."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    # -- construction ---------------------------------------------------------------------------
    def _ns(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def _build(self) -> None:
        s = self.spec
        fab = self._ns("fab")
        bridges = ["brt", "brg"] + [f"brp{p}" for p in range(s.gen_pods)]
        for br in bridges:
            _ip("-n", fab, "link", "add", br, "type", "bridge")
            _ip("-n", fab, "link", "set", br, "up")
        self._link(fab, "xt", "brt", fab, "xg", "brg", s.cross_bps)  # the cross-cluster link
        for p in range(s.gen_pods):
            self._link(fab, f"pu{p}", "brg", fab, f"pd{p}", f"brp{p}", s.pod_link_bps)
        n = 0
        for i in range(s.trainers):
            self._server(f"t{i}", "trainer", s.train_pod, "brt", f"{_SUBNET}.1.{i + 1}", n)
            n += 1
        for p, pod in enumerate(self.gen_pod_ids()):
            for j in range(s.gens_per_pod):
                self._server(f"g{pod}.{j}", "generator", pod, f"brp{p}", f"{_SUBNET}.{10 + p}.{j + 1}", n)
                n += 1

    def _server(self, name: str, role: str, pod: int, bridge: str, ip: str, n: int) -> None:
        ns = self._ns(name.replace(".", "-"))
        self._link(self.fabric_ns, f"h{n}", bridge, ns, "eth0", None, self.spec.nic_bps)
        _ip("-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0")
        self.hosts.append(Host(name, ns, ip, role, pod))

    def _link(self, ns_a: str, a: str, bridge_a: str | None, ns_b: str, b: str, bridge_b: str | None,
              rate_bps: float | None) -> None:
        """A veth pair ``a`` (in ``ns_a``) -- ``b`` (in ``ns_b``), each optionally on a bridge, shaped both ways."""
        _ip("-n", ns_a, "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns_b)
        for ns, dev, br in ((ns_a, a, bridge_a), (ns_b, b, bridge_b)):
            if br:
                _ip("-n", ns, "link", "set", dev, "master", br)
            _ip("-n", ns, "link", "set", dev, "up")
            if rate_bps:
                _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(rate_bps)}bit",
                    "burst", str(self.spec.burst_bytes), "latency", f"{self.spec.queue_latency_ms}ms")


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces left by clusters whose creating process is gone; return their names.

    Names are ``<prefix><pid % 100000>x<n>-<host>``; a namespace whose creator still runs (another
    test or benchmark in progress) is left alone.
    """
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    alive = {int(d) % 100000 for d in os.listdir("/proc") if d.isdigit()}
    stale = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.match(rf"{re.escape(prefix)}(\d+)x\d+-", name)
        if m and int(m.group(1)) not in alive:
            stale.append(name)
    for ns in stale:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return stale


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _tc(ns: str, *args: str) -> None:
    _run(["ip", "netns", "exec", ns, "tc", *args])


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
