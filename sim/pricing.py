"""What a simulated cluster costs per hour: GPUs at their hourly price plus the fabric from ``fabric.cost``.

Design note
-----------
Throughput per dollar (OrchestrRL §7.3.1: ``TPD = Throughput / Cost``, Cost including the network)
needs GPU and network cost in one unit. GPUs are priced per hour as RollMux Table 1 lists them
(``000_932eeda4e8ffe0cc.txt``, citing its [61]): H800 $5.28/h, H20 $1.85/h. The network is priced
by :func:`fabric.cost.network_cost` from OrchestrRL Table 4 (NICs, transceivers, EPS and OCS ports,
patch-panel ports, fibres of the fabric as built for the simulated GPU count and link speed) -- a
purchase price, which we spread evenly over ``amortization_years`` (default 3 years of 8,760 hours;
an assumption the run file can change). Both parts are reported so a reader can re-weigh them.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.fabric.cost import network_cost
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import Topology
from orchestrl.sim.network.config import DESIGN_OF

__all__ = ["GPU_USD_PER_HOUR", "HOURS_PER_YEAR", "ClusterCost", "cluster_cost"]

#: RollMux Table 1 (hourly price, from its reference [61]).
GPU_USD_PER_HOUR = {"H800": 5.28, "H20": 1.85}
HOURS_PER_YEAR = 8760.0


@dataclass(frozen=True)
class ClusterCost:
    """Hourly cost of a cluster: GPUs plus the amortised network."""

    fabric: str
    gpus: int
    link_gbps: int
    gpu_usd_per_hour: float  # per GPU
    network_usd: float  # purchase price of the fabric (Table 4 components), incl. NICs
    network_relative_to_ft: float  # the cost model's ratio to a fat-tree of the same size and speed
    amortization_years: float

    @property
    def gpu_usd_per_h(self) -> float:
        return self.gpus * self.gpu_usd_per_hour

    @property
    def network_usd_per_h(self) -> float:
        return self.network_usd / (self.amortization_years * HOURS_PER_YEAR)

    @property
    def usd_per_h(self) -> float:
        return self.gpu_usd_per_h + self.network_usd_per_h

    def per_usd(self, rate_per_s: float) -> float:
        """Return how many units a rate (per second) yields per dollar."""
        return rate_per_s * 3600.0 / self.usd_per_h if self.usd_per_h > 0 else float("inf")

    def to_json(self) -> dict[str, float | str | int]:
        return {"fabric": self.fabric, "gpus": self.gpus, "link_gbps": self.link_gbps,
                "gpu_usd_per_hour": self.gpu_usd_per_hour, "network_usd": self.network_usd,
                "network_relative_to_ft": self.network_relative_to_ft, "amortization_years": self.amortization_years,
                "gpu_usd_per_h": self.gpu_usd_per_h, "network_usd_per_h": self.network_usd_per_h,
                "usd_per_h": self.usd_per_h}


def cluster_cost(fabric: str, gpus: int, link_gbps: int, gpu: str, *, gpu_usd_per_hour: float | None = None,
                 amortization_years: float = 3.0, topology: Topology | None = None,
                 min_clos_tiers: int = 1, switch_radix: int = 64) -> ClusterCost:
    """Return the hourly cost of ``gpus`` GPUs of type ``gpu`` on ``fabric`` at ``link_gbps``.

    Raises
    ------
    ConfigError
        If the GPU has no known price and none is given, or the cost model refuses the fabric.

    Examples
    --------
    >>> ft, os3 = cluster_cost("ft", 2048, 200, "H800"), cluster_cost("ft-os", 2048, 200, "H800")
    >>> ft.gpu_usd_per_h == os3.gpu_usd_per_h and os3.network_usd < ft.network_usd
    True
    """
    price = gpu_usd_per_hour if gpu_usd_per_hour is not None else GPU_USD_PER_HOUR.get(gpu)
    if price is None:
        raise ConfigError("run", "cost.gpu_usd_per_hour", f"no price known for GPU {gpu!r}",
                          f"set it, or use one of {', '.join(GPU_USD_PER_HOUR)} (RollMux Table 1)")
    if not amortization_years > 0:
        raise ConfigError("run", "cost.network_amortization_years", f"{amortization_years}", "> 0")
    row = network_cost(DESIGN_OF[fabric], gpus, link_gbps, min_clos_tiers=min_clos_tiers, switch_radix=switch_radix,
                       rfabric_spec=topology.spec if topology is not None else None)
    return ClusterCost(fabric, gpus, link_gbps, float(price), row.network_usd, row.relative_to_fat_tree,
                       float(amortization_years))
