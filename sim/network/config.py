"""Settings of the network simulator, with the defaults of OrchestrRL §7.2."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.fabric.errors import ConfigError

__all__ = ["SimConfig", "FABRICS", "DESIGN_OF", "GPUS_PER_SERVER"]

#: Fabric names of the CLI, and the cost model's design each is built from (one wiring per fabric).
DESIGN_OF = {
    "ft": "fat-tree",
    "ft-os": "fat-tree-os3",
    "ro": "rail-optimized",
    "topoopt": "topoopt",
    "mixnet": "mixnet",
    "rfabric": "rfabric",
}
FABRICS = tuple(DESIGN_OF)
GPUS_PER_SERVER = 8  # §7.2: eight H800 GPUs and eight NICs per server


@dataclass(frozen=True)
class SimConfig:
    """How links, switches and routing behave; every field has the §7.2 default.

    Parameters
    ----------
    link_bps : float
        Line rate of every NIC, switch link and optical circuit, one direction (default 200 Gb/s).
    nvlink_bidir_bytes_per_s : float
        NVLink bandwidth per GPU, both directions together (§7.2: "effective bidirectional
        bandwidth of 400 GB/s per GPU"); each direction gets half.
    link_latency_s : float
        Propagation per link (§7.2: 1 us).
    switch_latency_s : float
        Processing per switch hop (§7.2: 0.8 us).
    mtu_bytes : int
        Packet size (§7.2: 9216 B); a store-and-forward hop adds one MTU of serialisation.
    nvlink_latency_s : float
        Latency of one NVLink hop inside a server.
    ecmp : {"fluid", "hash"}
        ``fluid``: every flow splits over all equal-cost next hops (per-hop ECMP as a fluid);
        ``hash``: every flow takes one path chosen by a hash of the flow, as switches do per flow.
    hash_seed : int
        Seed of the per-flow hash.
    intra_server : {"nvlink", "network"}
        ``network`` sends even same-server flows through the NICs, as a packet simulator whose hosts
        have one NIC each does (used to compare with htsim).
    switch_radix : int
        Ports of every EPS switch of the Clos fabrics (cost model default 64).
    oversubscription : int
        FT-OS's leaf down:up ratio (§7.2: 3).
    merge_bundles : bool
        Merge switch links that every route loads alike into one bundle (exact; see docs/sim.md).
    """

    link_bps: float = 200e9
    nvlink_bidir_bytes_per_s: float = 400e9
    link_latency_s: float = 1e-6
    switch_latency_s: float = 0.8e-6
    mtu_bytes: int = 9216
    nvlink_latency_s: float = 1e-6
    ecmp: str = "fluid"
    hash_seed: int = 0
    intra_server: str = "nvlink"
    switch_radix: int = 64
    merge_bundles: bool = True
    oversubscription: int = 3

    def __post_init__(self) -> None:
        src = "SimConfig"
        for name in ("link_bps", "nvlink_bidir_bytes_per_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and v != float("inf")):
                raise ConfigError(src, name, f"expected a positive finite rate, got {v!r}", "> 0")
        for name in ("link_latency_s", "switch_latency_s", "nvlink_latency_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v < 1):
                raise ConfigError(src, name, f"expected a latency in seconds in [0, 1), got {v!r}", "e.g. 1e-6")
        if not isinstance(self.mtu_bytes, int) or self.mtu_bytes <= 0:
            raise ConfigError(src, "mtu_bytes", f"expected a positive integer, got {self.mtu_bytes!r}", "e.g. 9216")
        if self.ecmp not in ("fluid", "hash"):
            raise ConfigError(src, "ecmp", f"unknown ECMP mode {self.ecmp!r}", "fluid, hash")
        if self.intra_server not in ("nvlink", "network"):
            raise ConfigError(src, "intra_server", f"unknown mode {self.intra_server!r}", "nvlink, network")
        if not isinstance(self.oversubscription, int) or not 1 <= self.oversubscription < self.switch_radix:
            raise ConfigError(src, "oversubscription", f"{self.oversubscription!r}",
                              f"an integer ratio from 1 to {self.switch_radix - 1}")
        if not 64 <= self.mtu_bytes <= 65536:
            raise ConfigError(src, "mtu_bytes", f"{self.mtu_bytes}", "64 to 65536 bytes")

    @property
    def nvlink_bps(self) -> float:
        """NVLink rate per GPU per direction, in bits per second."""
        return self.nvlink_bidir_bytes_per_s * 8 / 2

    def hop_latency_s(self, link_bps: float | None = None) -> float:
        """Latency of one link: propagation plus one MTU of store-and-forward serialisation."""
        return self.link_latency_s + self.mtu_bytes * 8 / (link_bps or self.link_bps)
