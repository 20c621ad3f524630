"""The device-adapter interface: what the control plane needs from an optical switch, whatever it speaks.

Design note
-----------
The commit, reconcile, audit and operator paths (:mod:`fabric.runtime.commit`,
:mod:`fabric.runtime.reconcile`, :mod:`agents.service.audit`, :mod:`agents.service.operator`) use a
switch only through :class:`OcsAdapter`: bulk apply (``connect``) and bulk remove (``disconnect``)
of cross-connects, the read-back of every cross-connect, the port states, the switch's own identity
(a serial number, or the TL1 SID where no serial is served: one switch reached under two addresses
answers the same), its :class:`Capabilities`, and a caller's ``deadline`` that caps every wait.
Nothing vendor-specific sits above it. One adapter per protocol:

=========  ==============================================  =========================================
protocol   adapter                                         targets
=========  ==============================================  =========================================
tl1        :class:`fabric.ocs.driver.Tl1Driver`            Polatis TL1 over TCP (3082) or SSH
netconf    :class:`fabric.ocs.netconf_driver.NetconfDriver`  Polatis optical-switch YANG over NETCONF/SSH
gnmi       :class:`fabric.ocs.gnmi_driver.GnmiDriver`      SONiC OCS tables (OCS_CROSS_CONNECT, OCS_PORT)
=========  ==============================================  =========================================

The device file picks the adapter per switch (``protocol:``) and :func:`fabric.ocs.devices.open_adapter` builds it (kept
there: the adapters import this module, so building them here would be an import circle);
credentials come from the secrets file (:mod:`fabric.ocs.secrets`), never from the device file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol, runtime_checkable

from orchestrl.fabric.ocs.errors import OcsAborted, OcsDenied, OcsRequestError
from orchestrl.fabric.ocs.model import BulkResult, PortStatus, XcStatus, applied_status

__all__ = ["PROTOCOLS", "Capabilities", "OcsAdapter", "check_ports", "check_pairs", "chunked", "bulk_connect",
           "ingress_ids"]

PROTOCOLS = ("tl1", "netconf", "gnmi")


@dataclass(frozen=True)
class Capabilities:
    """What one adapter (and the switch behind it) can do, for the callers that plan around it."""

    protocol: str  # tl1 | netconf | gnmi
    transport: str  # tcp | ssh | grpc | grpc+tls
    max_bulk: int  # cross-connects per command (ENT-PATCH, edit-config, SetRequest); larger bulks are split
    atomic: bool  # a bulk within max_bulk is applied whole or not at all (a refusal changes nothing)
    pipelined: bool  # a step's removal and addition go out in one round trip (send/collect split)
    confirmed_commit: bool = False  # NETCONF: the switch advertises :confirmed-commit (the adapter uses it)
    candidate: bool = False  # NETCONF: edits go to the candidate datastore and are committed


@runtime_checkable
class OcsAdapter(Protocol):
    """One optical circuit switch, as the commit, reconcile, audit and operator paths use it.

    Port numbers are device ports: ingress ``1..ports``, egress ``ports+1..2*ports`` (the SONiC
    names ``<i>A``/``<i>B`` and Polatis port ids map onto them, see docs/ocs.md).
    """

    name: str  # topology device name ("core0", "pod0/agg0")
    ports: int | None  # N, ports per side (read from the switch at open when not configured)
    deadline: float | None  # time.monotonic() that caps every wait of the next calls (None: the timeout alone)
    sessions: int  # successful logins so far: > 1 means the adapter reconnected

    @property
    def capabilities(self) -> Capabilities: ...

    def open(self) -> "OcsAdapter":
        """Connect and log in now; afterwards :attr:`ports` is known."""
        ...

    def cross_connects(self) -> dict[int, int]:
        """Read back every cross-connect, as ``{ingress: egress}``."""
        ...

    def connect(self, pairs: list[tuple[int, int]], *, mode: str = "stop") -> BulkResult:
        """Bulk apply ``(ingress, egress)`` cross-connects (mode ``stop``: all or a refusal raised)."""
        ...

    def disconnect(self, ports: list[int]) -> BulkResult:
        """Bulk remove the cross-connects on ``ports`` (either side); statuses name the removed ones."""
        ...

    def port_status(self, ports: Iterable[int] | None = None) -> dict[int, PortStatus]:
        """Read the state (normal, failed, force-blocked) and alarm text of ``ports`` (all when None)."""
        ...

    def identity(self) -> str:
        """Who the switch says it is (serial number or TL1 SID), the same under any address."""
        ...

    def close(self) -> None:
        """Release the session; the switch keeps its cross-connects."""
        ...


def check_ports(ports: Iterable[int], n: int, device: str, command: str) -> list[int]:
    """``ports`` as ints, each a port of an ``n x n`` switch (else :class:`OcsRequestError` naming the first bad one)."""
    ports = list(map(int, ports))
    if ports and (min(ports) < 1 or max(ports) > 2 * n):
        p = next(p for p in ports if not 1 <= p <= 2 * n)
        raise OcsRequestError(device, command, f"port {p} is outside 1..{2 * n}; use device ports of this {n}x{n} "
                                               "switch", [p])
    return ports


def check_pairs(pairs: Iterable[tuple[int, int]], n: int, device: str, command: str) -> list[tuple[int, int]]:
    """``pairs`` as int ``(ingress, egress)`` pairs of an ``n x n`` switch, no port twice (else :class:`OcsRequestError`).

    Set operations decide the usual case; a bad request is walked in order to name its first bad port.
    """
    pairs = list(pairs)
    ins, outs = zip(*pairs) if pairs else ((), ())
    ins, outs = tuple(map(int, ins)), tuple(map(int, outs))
    pairs = list(zip(ins, outs))
    if not pairs or (1 <= min(ins) and max(ins) <= n and n < min(outs) and max(outs) <= 2 * n
                     and len(set(ins)) == len(ins) and len(set(outs)) == len(outs)):
        return pairs
    seen: set[int] = set()
    for ingress, egress in pairs:
        if not 1 <= ingress <= n:
            raise OcsRequestError(device, command, f"port {ingress} is not an ingress port (1..{n}); give pairs as "
                                                   "(ingress, egress)", [ingress])
        if not n < egress <= 2 * n:
            raise OcsRequestError(device, command, f"port {egress} is not an egress port ({n + 1}..{2 * n}); give "
                                                   "pairs as (ingress, egress)", [egress])
        for p in (ingress, egress):
            if p in seen:
                raise OcsRequestError(device, command, f"port {p} is named twice in one bulk; each port joins at most "
                                                       "one cross-connect", [p])
            seen.add(p)
    return pairs


def chunked(items: list, size: int) -> list[list]:
    """``items`` in consecutive chunks of at most ``size`` (one chunk when ``size`` covers them all)."""
    if size <= 0 or len(items) <= size:
        return [items]
    return [items[i:i + size] for i in range(0, len(items), size)]


def bulk_connect(pairs: list[tuple[int, int]], max_bulk: int, mode: str, send: Callable[[list[tuple[int, int]]], None],
                 read_table: Callable[[], Mapping[int, int]],
                 fatal: tuple[type[BaseException], ...] = ()) -> BulkResult:
    """Create checked ``pairs`` with one ``send`` (a whole transaction) per ``max_bulk`` of them.

    For adapters whose protocol applies a request whole or not at all (NETCONF ``edit-config``, gNMI ``Set``).
    ``mode="stop"``: a refusal raises its :class:`OcsDenied`. ``mode="continue"``: the refused pairs get their
    code and the rest are sent again, unless the refusal names none of them or is one of ``fatal``. A bulk the
    device stopped part way (:class:`OcsAborted`) is read back and raised with what was and was not applied.
    """
    statuses: dict[tuple[int, int], XcStatus] = {}
    for part in chunked(pairs, max_bulk):
        remaining = list(part)
        while remaining:
            try:
                send(remaining)
            except OcsDenied as exc:
                if isinstance(exc, OcsAborted):
                    table = read_table()
                    exc.applied = tuple(p for p in remaining if table.get(p[0]) == p[1])
                    exc.unapplied = tuple(p for p in remaining if p not in exc.applied)
                    raise
                refused = [p for p in remaining if set(exc.ports) & set(p)]
                if mode == "stop" or not refused or isinstance(exc, fatal):
                    raise
                statuses.update((p, XcStatus(*p, exc.code, exc.message, (set(exc.ports) & set(p)).pop()))
                                for p in refused)
                remaining = [p for p in remaining if p not in refused]
                continue
            statuses.update((p, applied_status(*p)) for p in remaining)
            break
    return BulkResult([statuses[p] for p in pairs], mode)


def ingress_ids(ports: Iterable[int], table: Mapping[int, int]) -> list[int]:
    """The cross-connects (by ingress port) that hold any of ``ports`` (either side) in ``table``, each once."""
    by_egress = {e: i for i, e in table.items()}
    return list(dict.fromkeys(p if p in table else by_egress[p] for p in ports if p in table or p in by_egress))
