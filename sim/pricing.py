"""What a simulated cluster costs per hour: GPUs at their hourly price plus the fabric from ``fabric.cost``.

Design note
-----------
Throughput per dollar (OrchestrRL §7.3.1: ``TPD = Throughput / Cost``, Cost including the network)
needs GPU and network cost in one unit, and two accountings give very different weights to the
network, so both are reported:

* **rental** (``usd_per_h``): GPUs at an hourly rental price, the network's purchase price spread
  over ``amortization_years``. Rental prices carry the provider's margin, power and operations, so
  the network is a few per cent of the bill (2,048 H800s on a 200 Gb/s fat-tree: ~4%);
* **purchase** (``purchase_usd_per_h``): GPUs and network both at purchase price over the same
  years, the accounting behind §7.2.3's "network ~37% of GPU cost". No H800 price is published;
  :func:`implied_gpu_price_usd` takes the one §7.2.3's 37% implies for the cost model's 3-tier
  fat-tree at 200 Gb/s (docs/cost-model.md, "GPU cross-check"), so the network weighs as in the paper. GPUs are priced per hour as RollMux Table 1 lists them
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

__all__ = ["GPU_USD_PER_HOUR", "HOURS_PER_YEAR", "ClusterCost", "cluster_cost", "PAPER_NETWORK_SHARE",
           "implied_gpu_price_usd"]

#: RollMux Table 1 (hourly price, from its reference [61]).
GPU_USD_PER_HOUR = {"H800": 5.28, "H20": 1.85}
HOURS_PER_YEAR = 8760.0
#: OrchestrRL §7.2.3: a fat-tree's network costs ~37% of the GPUs at 200 Gb/s and ~59% at 400 Gb/s (purchase prices).
PAPER_NETWORK_SHARE = {200: 0.37, 400: 0.59}


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
        """Return how many units a rate (per second) yields per dollar (rental accounting)."""
        return rate_per_s * 3600.0 / self.usd_per_h if self.usd_per_h > 0 else float("inf")

    def purchase_usd_per_h(self, gpu_price_usd: float) -> float:
        """Hourly cost when GPUs are bought at ``gpu_price_usd`` each and amortised like the network."""
        return (self.gpus * gpu_price_usd + self.network_usd) / (self.amortization_years * HOURS_PER_YEAR)

    def per_usd_purchase(self, rate_per_s: float, gpu_price_usd: float) -> float:
        """Return how many units a rate (per second) yields per dollar (purchase accounting)."""
        cost = self.purchase_usd_per_h(gpu_price_usd)
        return rate_per_s * 3600.0 / cost if cost > 0 else float("inf")

    def network_share(self, gpu_price_usd: float | None = None) -> float:
        """Network cost over GPU cost: rental (``None``) or purchase at ``gpu_price_usd``."""
        if gpu_price_usd is None:
            return self.network_usd_per_h / self.gpu_usd_per_h
        return self.network_usd / (self.gpus * gpu_price_usd)

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


def implied_gpu_price_usd(gpus: int, link_gbps: int = 200, switch_radix: int = 64) -> float:
    """Return the GPU purchase price at which the cost model's 3-tier fat-tree costs §7.2.3's share of the GPUs.

    >>> 15_000 < implied_gpu_price_usd(2048) < 30_000
    True
    """
    share = PAPER_NETWORK_SHARE.get(link_gbps, PAPER_NETWORK_SHARE[200])
    ft = network_cost(DESIGN_OF["ft"], gpus, link_gbps, min_clos_tiers=3, switch_radix=switch_radix)
    return ft.network_usd / share / gpus
