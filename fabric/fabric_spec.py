"""The validated content of a topology file (:class:`FabricSpec`) and the OCS technologies of Table 2.

:mod:`fabric.topology` builds the fabric from a spec; this module only reads and checks the YAML
(every refusal names the file, the field and what is allowed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from orchestrl.fabric.config import Reader

__all__ = ["OcsTechnology", "OCS_TECHNOLOGIES", "FabricSpec", "spec_from_mapping"]


@dataclass(frozen=True)
class OcsTechnology:
    """One row of OrchestrRL Table 2: how long a device of this kind takes to switch."""

    name: str
    switch_delay_s: float  # reconfiguration delay; what a safe window must cover
    radix_ports: int  # duplex ports of one commodity device
    example: str  # the product line Table 2 cites, for humans


OCS_TECHNOLOGIES: Mapping[str, OcsTechnology] = {
    t.name: t
    for t in (
        OcsTechnology("rotor", 0.01e-3, 128, "RotorNet (InFocus)"),
        OcsTechnology("mems-3d", 10e-3, 320, "3D MEMS (Calient)"),
        OcsTechnology("piezo", 25e-3, 576, "Piezo (Polatis)"),
        OcsTechnology("liquid-crystal", 100e-3, 512, "Liquid crystal (Coherent)"),
        OcsTechnology("robotic", 120.0, 1008, "Robotic (Telescent)"),
    )
}


@dataclass(frozen=True)
class FabricSpec:
    """The validated content of a topology file; every field documents one design choice."""

    name: str
    link_bps: float  # line rate of every NIC, ToR uplink and OCS port (one direction)
    gpus_per_server: int = 8  # also NICs per server (one NIC per GPU, rail-aligned)
    pods: int = 1
    servers_per_pod: int = 4
    servers_per_tor: int = 0  # rack size; 0 means the whole PoD is one rack
    rails_per_tor: int = 1  # consecutive rails terminated on one ToR
    tor_uplinks: int = 0  # uplinks per ToR into OCS-Agg; 0 means non-blocking (= down ports)
    agg_technology: str = "mems-3d"
    agg_devices_per_pod: int = 1
    agg_radix_ports: int = 0  # 0 means the technology's radix (Table 2)
    boundary_ports_per_pod: int = 0  # fibres from a PoD's Agg layer to OCS-Core
    core_technology: str = "mems-3d"
    core_devices: int = 1
    core_radix_ports: int = 0
    masked_ports: tuple[tuple[str, int, str], ...] = ()  # (device, port, reason)
    gpu_type: str = "H800"
    source: str = "<spec>"  # where the spec came from, for error messages

    @property
    def effective_servers_per_tor(self) -> int:
        return self.servers_per_tor or self.servers_per_pod

    @property
    def tor_down_ports(self) -> int:
        return self.effective_servers_per_tor * self.rails_per_tor

    @property
    def effective_tor_uplinks(self) -> int:
        return self.tor_uplinks or self.tor_down_ports


def _spec_from_reader(r: Reader) -> FabricSpec:
    r.reject_unknown({"name", "link_gbps", "gpu_type", "server", "pods", "tor", "ocs_agg", "ocs_core", "masked_ports"})
    server = r.section("server", default={})
    server.reject_unknown({"gpus"})
    pods = r.section("pods")
    pods.reject_unknown({"count", "servers"})
    tor = r.section("tor", default={})
    tor.reject_unknown({"servers_per_tor", "rails_per_tor", "uplinks"})
    agg = r.section("ocs_agg", default={})
    agg.reject_unknown({"technology", "devices_per_pod", "radix_ports", "boundary_ports"})
    core = r.section("ocs_core", default={})
    core.reject_unknown({"technology", "devices", "radix_ports"})

    gpus = server.int("gpus", default=8, minimum=1, maximum=64)
    n_pods = pods.int("count", minimum=1, maximum=4096)
    servers_per_pod = pods.int("servers", minimum=1, maximum=100_000)
    servers_per_tor = tor.int("servers_per_tor", default=servers_per_pod, minimum=1)
    if servers_per_pod % servers_per_tor:
        raise tor.error("servers_per_tor", f"{servers_per_tor} does not divide pods.servers={servers_per_pod}",
                        f"a divisor of {servers_per_pod}")
    rails_per_tor = tor.int("rails_per_tor", default=1, minimum=1, maximum=gpus)
    if gpus % rails_per_tor:
        raise tor.error("rails_per_tor", f"{rails_per_tor} does not divide server.gpus={gpus}", f"a divisor of {gpus}")
    down = servers_per_tor * rails_per_tor
    uplinks = tor.int("uplinks", default=down, minimum=0)
    agg_tech = agg.str("technology", default="mems-3d", choices=OCS_TECHNOLOGIES)
    agg_devices = agg.int("devices_per_pod", default=1, minimum=1)
    agg_radix = agg.int("radix_ports", default=OCS_TECHNOLOGIES[agg_tech].radix_ports, minimum=2)
    boundary = agg.int("boundary_ports", default=0 if n_pods == 1 else uplinks, minimum=0)
    core_tech = core.str("technology", default=agg_tech, choices=OCS_TECHNOLOGIES)
    core_devices = core.int("devices", default=1 if n_pods > 1 else 0, minimum=0)
    core_radix = core.int("radix_ports", default=OCS_TECHNOLOGIES[core_tech].radix_ports, minimum=2)

    tors_per_pod = (servers_per_pod // servers_per_tor) * (gpus // rails_per_tor)
    agg_ports_needed = tors_per_pod * uplinks + boundary
    if agg_ports_needed > agg_devices * agg_radix:
        raise agg.error("devices_per_pod",
                        f"{agg_devices} device(s) of {agg_radix} ports cannot hold {tors_per_pod} ToRs x {uplinks} "
                        f"uplinks + {boundary} boundary ports = {agg_ports_needed} ports",
                        f">= {-(-agg_ports_needed // agg_radix)} devices, or fewer tor.uplinks / boundary_ports")
    if boundary and n_pods > 1 and core_devices == 0:
        raise core.error("devices", "is 0 but PoDs have boundary ports", ">= 1 OCS-Core device")
    core_needed = n_pods * boundary if n_pods > 1 else 0
    if core_needed > core_devices * core_radix:
        raise core.error("devices", f"{core_devices} device(s) of {core_radix} ports cannot terminate {n_pods} PoDs x "
                                    f"{boundary} boundary ports = {core_needed}",
                         f">= {-(-core_needed // core_radix)} devices")
    masked = []
    for m in r.sections("masked_ports", default=[]):
        m.reject_unknown({"device", "port", "reason"})
        masked.append((m.str("device"), m.int("port", minimum=1), m.str("reason", default="failed",
                                                                          choices=("failed", "reserved"))))
    return FabricSpec(
        name=r.str("name"),
        link_bps=r.float("link_gbps", minimum=0.0, exclusive_minimum=True) * 1e9,
        gpus_per_server=gpus, pods=n_pods, servers_per_pod=servers_per_pod,
        servers_per_tor=servers_per_tor, rails_per_tor=rails_per_tor, tor_uplinks=uplinks,
        agg_technology=agg_tech, agg_devices_per_pod=agg_devices, agg_radix_ports=agg_radix,
        boundary_ports_per_pod=boundary if n_pods > 1 else 0,
        core_technology=core_tech, core_devices=core_devices if n_pods > 1 else 0, core_radix_ports=core_radix,
        masked_ports=tuple(masked), gpu_type=r.str("gpu_type", default="H800"), source=r.source,
    )


def spec_from_mapping(data: Mapping[str, object], source: str = "<mapping>") -> FabricSpec:
    """Return a validated :class:`FabricSpec` from an already-parsed mapping."""
    return _spec_from_reader(Reader(data, source))
