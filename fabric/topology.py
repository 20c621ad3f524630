"""The hybrid EPS/OCS fabric of OrchestrRL §5.1 (Figure 7), built from a YAML description.

Design note
-----------
Servers hold ``gpus_per_server`` GPUs and as many NICs, one per GPU; NIC ``i`` sits on rail ``i``.
Servers are grouped into PoDs; inside a PoD, servers are further grouped into racks
(``servers_per_tor``) and each rack has one static EPS ToR per *rail group* (``rails_per_tor``
consecutive rails). Host-facing links never change. Above the ToRs everything is optical:

* each PoD has ``devices_per_pod`` OCS-Agg devices; every ToR uplink lands on one Agg port
  (uplinks striped round-robin across the PoD's Agg devices) and so do the PoD's *boundary* fibres;
* each boundary fibre joins an Agg port to a port of one OCS-Core device (striped round-robin),
  so inter-PoD traffic goes ToR -(Agg lift)-> boundary -(Core)-> boundary -(Agg drop)-> ToR.

A circuit is a cross-connect between two duplex ports of the *same* device. Port numbers are
1-based front-panel numbers, as real switches count them. Masked ports (failed or reserved) are
kept in the topology and never offered to the allocator.

The planning code addresses GPUs by a global index ``gpu = server * gpus_per_server + local``,
servers pod-major, so a job placement is just a list of GPU indices.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import networkx as nx

from orchestrl.fabric.config import load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.fabric_spec import OCS_TECHNOLOGIES, FabricSpec, OcsTechnology, _spec_from_reader, spec_from_mapping

__all__ = [
    "OcsTechnology",
    "OCS_TECHNOLOGIES",
    "PortRef",
    "BoundaryFibre",
    "Tor",
    "OcsDevice",
    "FabricSpec",
    "Topology",
    "load_topology",
    "tor_endpoint",
    "uplink_endpoint",
    "spec_from_mapping",
]


@dataclass(frozen=True, order=True)
class PortRef:
    """A duplex port of an OCS device, by device id and 1-based port number."""

    device: str
    port: int

    def __str__(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class BoundaryFibre:
    """A fibre from a PoD's OCS-Agg device to an OCS-Core device: the unit of PoD boundary capacity."""

    pod: int
    index: int  # index among the PoD's boundary fibres
    agg: PortRef
    core: PortRef


@dataclass(frozen=True)
class Tor:
    """A static EPS top-of-rack switch serving one rail group of one rack."""

    id: str
    pod: int
    rack: int  # rack index within the PoD
    rails: tuple[int, ...]  # NIC indices (rails) this ToR terminates
    servers: tuple[int, ...]  # global server indices attached
    uplinks: tuple[PortRef, ...]  # Agg ports its uplinks land on, in uplink order


@dataclass(frozen=True)
class OcsDevice:
    """One optical circuit switch (OCS-Agg of one PoD, or OCS-Core)."""

    id: str
    tier: str  # "agg" | "core"
    pod: int | None  # owning PoD for Agg devices; None for Core
    technology: OcsTechnology
    radix_ports: int


def tor_endpoint(tor_id: str) -> str:
    """Allocator endpoint name of a ToR (the ToR id itself)."""
    return tor_id


def uplink_endpoint(pod: int, peer_pod: int) -> str:
    """Allocator endpoint name of PoD ``pod``'s boundary ports whose Core circuits reach ``peer_pod``."""
    return f"pod{pod}/up:pod{peer_pod}"


class Topology:
    """A built fabric: ToRs, OCS devices, their port wiring and the masked ports.

    Examples
    --------
    >>> spec = FabricSpec(name="t", link_bps=200e9, pods=2, servers_per_pod=2, boundary_ports_per_pod=4,
    ...                   core_devices=1)
    >>> topo = Topology(spec)
    >>> topo.gpu_count, len(topo.tors), topo.pod_of_gpu(17)
    (32, 16, 1)
    >>> topo.tor_of_gpu(17)
    'pod1/tor1'
    """

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self._build()
        self._check_masks()

    # -- construction -----------------------------------------------------------------------
    def _build(self) -> None:
        s = self.spec
        racks = s.servers_per_pod // s.effective_servers_per_tor
        groups = s.gpus_per_server // s.rails_per_tor
        agg_tech = OCS_TECHNOLOGIES[s.agg_technology]
        core_tech = OCS_TECHNOLOGIES[s.core_technology]
        self.devices: dict[str, OcsDevice] = {}
        self.tors: dict[str, Tor] = {}
        self._gpu_tor: list[str] = []
        self.port_owner: dict[PortRef, str] = {}  # port -> ToR id or boundary tag
        self.boundary: dict[int, tuple[BoundaryFibre, ...]] = {}
        core_ids = [f"core{c}" for c in range(s.core_devices)]
        for cid in core_ids:
            self.devices[cid] = OcsDevice(cid, "core", None, core_tech, s.core_radix_ports)
        core_next = {cid: 1 for cid in core_ids}
        boundary_counter = 0
        for pod in range(s.pods):
            agg_ids = [f"pod{pod}/agg{d}" for d in range(s.agg_devices_per_pod)]
            for aid in agg_ids:
                self.devices[aid] = OcsDevice(aid, "agg", pod, agg_tech, s.agg_radix_ports)
            agg_next = {aid: 1 for aid in agg_ids}

            def take_agg(k: int) -> PortRef:
                aid = agg_ids[k % len(agg_ids)]
                ref = PortRef(aid, agg_next[aid])
                agg_next[aid] += 1
                return ref

            tor_index = 0
            for rack in range(racks):
                first = pod * s.servers_per_pod + rack * s.effective_servers_per_tor
                servers = tuple(range(first, first + s.effective_servers_per_tor))
                for g in range(groups):
                    tid = f"pod{pod}/tor{tor_index}"
                    ups = tuple(take_agg(u) for u in range(s.effective_tor_uplinks))
                    for ref in ups:
                        self.port_owner[ref] = tid
                    rails = tuple(range(g * s.rails_per_tor, (g + 1) * s.rails_per_tor))
                    self.tors[tid] = Tor(tid, pod, rack, rails, servers, ups)
                    tor_index += 1
            fibres = []
            for b in range(s.boundary_ports_per_pod):
                agg_ref = take_agg(b)
                cid = core_ids[boundary_counter % len(core_ids)]
                boundary_counter += 1
                core_ref = PortRef(cid, core_next[cid])
                core_next[cid] += 1
                fibre = BoundaryFibre(pod, b, agg_ref, core_ref)
                self.port_owner[agg_ref] = f"boundary:pod{pod}:{b}"
                self.port_owner[core_ref] = f"boundary:pod{pod}:{b}"
                fibres.append(fibre)
            self.boundary[pod] = tuple(fibres)
        # GPU -> ToR index (rail-aligned: NIC i goes to the ToR of its rail group in its rack).
        tor_by_key = {(t.pod, t.rack, t.rails[0] // s.rails_per_tor): t.id for t in self.tors.values()}
        for gpu in range(self.gpu_count):
            server = gpu // s.gpus_per_server
            local = gpu % s.gpus_per_server
            pod = server // s.servers_per_pod
            rack = (server % s.servers_per_pod) // s.effective_servers_per_tor
            self._gpu_tor.append(tor_by_key[(pod, rack, local // s.rails_per_tor)])
        self.masked: dict[PortRef, str] = {PortRef(d, p): why for d, p, why in s.masked_ports}
        self._usable_uplinks: dict[str, tuple[PortRef, ...]] = {}
        self._usable_boundary: dict[int, tuple[BoundaryFibre, ...]] = {}

    def _check_masks(self) -> None:
        for i, (device, port, _) in enumerate(self.spec.masked_ports):
            where = f"masked_ports[{i}]"
            if device not in self.devices:
                raise ConfigError(self.spec.source, f"{where}.device", f"unknown device {device!r}",
                                  ", ".join(sorted(self.devices)[:8]) + (" ..." if len(self.devices) > 8 else ""))
            radix = self.devices[device].radix_ports
            if port > radix:
                raise ConfigError(self.spec.source, f"{where}.port", f"port {port} exceeds {device}'s radix {radix}",
                                  f"1..{radix}")

    # -- derived sizes ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def link_bps(self) -> float:
        return self.spec.link_bps

    @property
    def gpu_count(self) -> int:
        s = self.spec
        return s.pods * s.servers_per_pod * s.gpus_per_server

    @property
    def server_count(self) -> int:
        return self.spec.pods * self.spec.servers_per_pod

    @property
    def pods(self) -> range:
        return range(self.spec.pods)

    # -- placement lookups ------------------------------------------------------------------
    def server_of_gpu(self, gpu: int) -> int:
        self._check_gpu(gpu)
        return gpu // self.spec.gpus_per_server

    def pod_of_gpu(self, gpu: int) -> int:
        return self.server_of_gpu(gpu) // self.spec.servers_per_pod

    def tor_of_gpu(self, gpu: int) -> str:
        self._check_gpu(gpu)
        return self._gpu_tor[gpu]

    def gpus_of_pod(self, pod: int) -> range:
        per = self.spec.servers_per_pod * self.spec.gpus_per_server
        return range(pod * per, (pod + 1) * per)

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < self.gpu_count:
            raise IndexError(f"GPU {gpu} is outside fabric {self.name!r} (0..{self.gpu_count - 1})")

    @cached_property
    def tors_by_pod(self) -> dict[int, tuple[str, ...]]:
        out: dict[int, list[str]] = {p: [] for p in self.pods}
        for t in self.tors.values():
            out[t.pod].append(t.id)
        return {p: tuple(v) for p, v in out.items()}

    @cached_property
    def _agg_devices(self) -> dict[int, tuple[str, ...]]:
        out: dict[int, list[str]] = {p: [] for p in self.pods}
        for d in self.devices.values():
            if d.tier == "agg":
                out.setdefault(d.pod, []).append(d.id)
        return {p: tuple(v) for p, v in out.items()}

    def agg_devices(self, pod: int) -> tuple[str, ...]:
        return self._agg_devices.get(pod, ())

    @cached_property
    def _core_devices(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices.values() if d.tier == "core")

    def core_devices(self) -> tuple[str, ...]:
        return self._core_devices

    # -- port availability ------------------------------------------------------------------
    # A Topology never changes after construction (with_masked builds a new one), so the lookups
    # below are computed once per instance: planning a one-PoD intent then costs O(that PoD), not
    # O(every boundary fibre of the fabric).
    def is_masked(self, ref: PortRef) -> bool:
        return ref in self.masked

    def usable_uplinks(self, tor_id: str) -> tuple[PortRef, ...]:
        """Agg ports of a ToR's uplinks that are not masked (computed once per ToR)."""
        got = self._usable_uplinks.get(tor_id)
        if got is None:
            got = self._usable_uplinks[tor_id] = tuple(p for p in self.tors[tor_id].uplinks if p not in self.masked)
        return got

    def usable_boundary(self, pod: int) -> tuple[BoundaryFibre, ...]:
        """Boundary fibres of a PoD whose Agg and Core ends are both unmasked (computed once per PoD)."""
        got = self._usable_boundary.get(pod)
        if got is None:
            got = self._usable_boundary[pod] = tuple(f for f in self.boundary.get(pod, ())
                                                     if f.agg not in self.masked and f.core not in self.masked)
        return got

    @cached_property
    def fibre_by_agg(self) -> dict[PortRef, BoundaryFibre]:
        """Every boundary fibre by its OCS-Agg end (masked or not)."""
        return {f.agg: f for fs in self.boundary.values() for f in fs}

    @cached_property
    def fibre_by_core(self) -> dict[PortRef, BoundaryFibre]:
        """Every boundary fibre by its OCS-Core end (masked or not)."""
        return {f.core: f for fs in self.boundary.values() for f in fs}

    def with_masked(self, ports: Iterable[tuple[str, int, str]]) -> "Topology":
        """Return a copy of this topology with more ports masked (e.g. after a port failure)."""
        merged = dict(((d, p), why) for d, p, why in self.spec.masked_ports)
        for d, p, why in ports:
            merged[(d, p)] = why
        spec = dataclasses.replace(self.spec, masked_ports=tuple((d, p, w) for (d, p), w in sorted(merged.items())))
        return Topology(spec)

    # -- export -----------------------------------------------------------------------------
    def to_networkx(self) -> nx.Graph:
        """Return the physical wiring as an undirected graph.

        Nodes carry ``kind`` (gpu, tor, ocs) and edges carry ``bps`` and ``kind``
        (nic: GPU NIC to ToR; uplink: ToR to Agg; boundary: Agg to Core). Masked ports' links carry
        ``masked=True``. Parallel uplinks between the same pair are summed into ``count``.
        """
        g = nx.Graph(name=self.name)
        bps = self.link_bps
        for dev in self.devices.values():
            g.add_node(dev.id, kind="ocs", tier=dev.tier, pod=dev.pod, technology=dev.technology.name,
                       radix_ports=dev.radix_ports)
        for tor in self.tors.values():
            g.add_node(tor.id, kind="tor", pod=tor.pod, rails=tor.rails)
            for ref in tor.uplinks:
                _add_parallel(g, tor.id, ref.device, bps, "uplink", ref in self.masked)
        for gpu in range(self.gpu_count):
            node = f"gpu{gpu}"
            g.add_node(node, kind="gpu", server=self.server_of_gpu(gpu), pod=self.pod_of_gpu(gpu))
            g.add_edge(node, self._gpu_tor[gpu], bps=bps, kind="nic", count=1)
        for fibres in self.boundary.values():
            for f in fibres:
                _add_parallel(g, f.agg.device, f.core.device, bps, "boundary",
                              f.agg in self.masked or f.core in self.masked)
        return g

    def summary(self) -> dict[str, object]:
        """Return component counts, as the cost model and ``orchestrl fabric show`` need them."""
        s = self.spec
        return {
            "name": s.name,
            "gpus": self.gpu_count,
            "servers": self.server_count,
            "pods": s.pods,
            "tors": len(self.tors),
            "tor_down_ports": s.tor_down_ports,
            "tor_uplinks": s.effective_tor_uplinks,
            "ocs_agg_devices": sum(1 for d in self.devices.values() if d.tier == "agg"),
            "ocs_core_devices": len(self.core_devices()),
            "agg_ports_used": sum(1 for p in self.port_owner if self.devices[p.device].tier == "agg"),
            "core_ports_used": sum(1 for p in self.port_owner if self.devices[p.device].tier == "core"),
            "boundary_ports_per_pod": s.boundary_ports_per_pod,
            "masked_ports": len(self.masked),
            "link_gbps": s.link_bps / 1e9,
            "agg_technology": s.agg_technology,
            "core_technology": s.core_technology,
        }


def _add_parallel(g: nx.Graph, a: str, b: str, bps: float, kind: str, masked: bool) -> None:
    if g.has_edge(a, b):
        data = g.edges[a, b]
        if not masked:
            data["count"] += 1
            data["bps"] += bps
        data["masked_count"] = data.get("masked_count", 0) + int(masked)
    else:
        g.add_edge(a, b, bps=0.0 if masked else bps, kind=kind, count=0 if masked else 1, masked_count=int(masked))


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Return the topology described by a YAML file, refusing bad files with a :class:`ConfigError`."""
    reader = load_document(path)
    return Topology(_spec_from_reader(reader))
