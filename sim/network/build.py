"""Build a fabric by name: the one entry point the CLI, the sweeps and the next stage models use."""

from __future__ import annotations

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import Topology
from orchestrl.sim.network.config import FABRICS, SimConfig
from orchestrl.sim.network.fabrics import ClosFabric, Fabric, MixNetFabric, TopoOptFabric
from orchestrl.sim.network.rfabric import RFabricFabric

__all__ = ["build_fabric"]


def build_fabric(name: str, gpus: int, config: SimConfig | None = None, *,
                 topology: Topology | None = None) -> Fabric:
    """Return fabric ``name`` (one of :data:`sim.network.config.FABRICS`) for ``gpus`` GPUs.

    Parameters
    ----------
    name : {"ft", "ft-os", "ro", "topoopt", "mixnet", "rfabric"}
    gpus : int
        A multiple of 8 (servers of eight GPUs, one NIC per GPU).
    config : SimConfig, optional
        Link speed, latencies, ECMP mode (default: the §7.2 setup at 200 Gb/s).
    topology : Topology, optional
        RFabric only: the topology to simulate (default: the cost model's ``default_rfabric_spec``).

    Raises
    ------
    ConfigError
        For an unknown fabric, a bad GPU count, or a topology that does not fit.

    Notes
    -----
    Linear in the number of links of the wiring.

    Examples
    --------
    >>> fab = build_fabric("ft", 64)
    >>> fab.name, fab.gpus, fab.servers
    ('ft', 64, 8)
    """
    config = config or SimConfig()
    if name not in FABRICS:
        raise ConfigError("fabric", "fabric", f"unknown fabric {name!r}", ", ".join(FABRICS))
    if topology is not None and name != "rfabric":
        raise ConfigError("fabric", "topology", f"a topology file describes RFabric, not {name!r}", "rfabric")
    if name in ("ft", "ft-os", "ro"):
        return ClosFabric(name, gpus, config)
    if name == "topoopt":
        return TopoOptFabric(gpus, config)
    if name == "mixnet":
        return MixNetFabric(gpus, config)
    return RFabricFabric(gpus, config, topology)
