"""Settings of the co-execution group scheduler, each with its default and where it comes from.

The numbers are RollMux's (Table 1 prices, Table 2 resident-state sizes, §3.2 host memory, §4.3
tail threshold, Figure 4 warm start) and RollArt's (§3.1 H20-vs-H800 rollout speed by workload
kind). They are configuration, not constants: a site with other prices or nodes changes them here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from orchestrl.fabric.errors import ConfigError

__all__ = ["GroupConfig", "TABLE1_PRICE_USD_PER_H", "TABLE2_RESIDENT_GB", "ROLLOUT_KINDS", "POOLS"]

#: RollMux Table 1: on-demand price of one GPU.
TABLE1_PRICE_USD_PER_H: Mapping[str, float] = {"H20": 1.85, "H800": 5.28}

#: RollMux Table 2: host memory (GB) one 8-GPU node needs to keep a job's rollout / training actor
#: resident, by model size in billions of parameters.
TABLE2_RESIDENT_GB: Mapping[int, tuple[float, float]] = {
    3: (113.4, 156.2), 7: (275.7, 240.0), 14: (445.4, 456.1), 32: (490.3, 520.4)}

#: RollArt §3.1: a rollout is prefill-heavy (many turns, compute-bound) or decode-heavy (few turns,
#: memory-bandwidth-bound).
ROLLOUT_KINDS = ("decode", "prefill")
POOLS = ("rollout", "train")


def _h800_rollout_speedup() -> dict[str, float]:
    # Per-node rollout speed of H800 against H20, by generation kind.
    # Prefill-heavy: RollArt §3.1 runs FrozenLake on cost-equivalent 6 H20 vs 2 H800 GPUs; H800 takes
    #   0.53x the time, so per GPU it is (6 / 2) / 0.53 = 5.66x faster (compute-bound; Table 1 FLOPS 6.7x).
    # Decode-heavy: memory-bandwidth-bound, so parity. RollMux Table 4 finds co-locating every phase on
    #   H800 only 7-11% faster than disaggregation even with free weight sync, and Table 1 gives the H20
    #   more HBM bandwidth (4.0 vs 3.35 TB/s). (RollArt's small 2-GPU GEM-Math run favours H800 more.)
    return {"prefill": (6 / 2) / 0.53, "decode": 1.0}


@dataclass(frozen=True)
class GroupConfig:
    """Everything the group scheduler, its baselines and the replay simulator read.

    Examples
    --------
    >>> cfg = GroupConfig()
    >>> cfg.node_price_usd_per_h("H20"), cfg.node_price_usd_per_h("H800")
    (14.8, 42.24)
    >>> round(cfg.rollout_speed("H800", "prefill"), 2), cfg.rollout_speed("H20", "decode")
    (5.66, 1.0)
    """

    gpu_price_usd_per_h: Mapping[str, float] = field(default_factory=lambda: dict(TABLE1_PRICE_USD_PER_H))
    gpus_per_node: int = 8  # every node is an 8-GPU server, as in Table 2 and the testbed
    host_mem_gb: float = 2048.0  # host DRAM per node; §3.2: 1-2 TB, enough for 2-5 resident jobs
    max_group_size: int = 5  # residency cap on jobs per group (§7.5 varies it from 2 to 5)
    train_gpu_type: str = "H800"  # the training pool's GPU (compute-optimised)
    rollout_gpu_types: tuple[str, ...] = ("H20",)  # types a rollout node may be; add "H800" for RollArt affinity
    reference_rollout_gpu: str = "H20"  # jobs state their rollout time on nodes of this type
    h800_rollout_speedup: Mapping[str, float] = field(default_factory=_h800_rollout_speedup)
    warm_start_s: float = 2.0  # load a resident phase from host DRAM (Fig. 4: up to 48x under a ~80 s cold start)
    cold_start_s: float = 80.0  # rebuild a phase from disk / over the cluster link (Fig. 4)
    tail_threshold: float = 0.8  # §4.3: a rollout is tail-bound once this fraction of responses is done
    tail_capacity_fraction: float = 0.125  # share of a job's rollout GPUs its consolidated tail keeps (1 of 8)
    migration_s: float = 1.0  # time to move the tail's requests onto the kept GPUs
    long_tail_migration: bool = True  # §4.3 runtime migration (planning never counts on it)
    prune_saturated: str = "paper"  # "paper": skip T_load >= T_cycle; "train": only a saturated training pool

    def __post_init__(self) -> None:
        src = "group config"
        for gpu in (self.train_gpu_type, self.reference_rollout_gpu, *self.rollout_gpu_types):
            if gpu not in self.gpu_price_usd_per_h:
                raise ConfigError(src, "gpu_price_usd_per_h", f"has no price for GPU type {gpu!r}",
                                  "a price for every GPU type the pools use, e.g. H20: 1.85")
        if not self.rollout_gpu_types:
            raise ConfigError(src, "rollout_gpu_types", "is empty", "at least one GPU type, e.g. ('H20',)")
        for name in ("gpus_per_node", "max_group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(src, name, f"{getattr(self, name)} is below 1", ">= 1")
        for name in ("host_mem_gb", "warm_start_s", "cold_start_s", "migration_s"):
            if getattr(self, name) < 0:
                raise ConfigError(src, name, f"{getattr(self, name)} is negative", ">= 0")
        if not 0.0 < self.tail_threshold <= 1.0:
            raise ConfigError(src, "tail_threshold", f"{self.tail_threshold} is outside (0, 1]", "e.g. 0.8")
        if not 0.0 < self.tail_capacity_fraction < 1.0:
            raise ConfigError(src, "tail_capacity_fraction", f"{self.tail_capacity_fraction} is outside (0, 1)",
                              "e.g. 0.125 (one GPU of eight)")

    def node_price_usd_per_h(self, gpu_type: str) -> float:
        """Return the hourly price of one node of ``gpu_type``."""
        return round(self.gpus_per_node * self.gpu_price_usd_per_h[gpu_type], 10)

    def rollout_speed(self, gpu_type: str, kind: str) -> float:
        """Return how many times faster a rollout of ``kind`` runs on a ``gpu_type`` node than on the reference.

        Types other than the reference and H800 are refused: their speed is not known.
        """
        if kind not in ROLLOUT_KINDS:
            raise ConfigError("job", "rollout_kind", f"unknown kind {kind!r}", ", ".join(ROLLOUT_KINDS))
        if gpu_type == self.reference_rollout_gpu:
            return 1.0
        if gpu_type == "H800" and self.reference_rollout_gpu == "H20":
            return float(self.h800_rollout_speedup[kind])
        raise ConfigError("group config", "rollout_gpu_types",
                          f"no rollout speed known for {gpu_type!r} against {self.reference_rollout_gpu!r}",
                          "H20 (reference) and H800")

    def with_affinity(self) -> "GroupConfig":
        """Return this config with mixed rollout pools (H20 and H800), RollArt §4.1."""
        return dataclasses.replace(self, rollout_gpu_types=("H20", "H800"))
