"""The network seam of the generation engine: where bytes that leave a server get their rate.

Design note
-----------
Without a seam (``PerfModel(..., network=None)``, the default) every cross-node byte moves at the
GPU's NIC rate, ``GpuSpec.nic_bytes_per_s``: the EP all-to-all and AFD M2N terms of a decode step
(scaled by ``Calibration.link_efficiency``), the peer path of a weight reshard, and one NIC per KV
transfer. That is the profiled, fabric-blind cost model of OrchestrRL §4.1 and the numbers every
test of :mod:`compute_sched` pins.

A :class:`NetworkSeam` replaces those constants with what a fabric gives. It is consulted at four
points, and only there:

* :meth:`~NetworkSeam.link_bytes_per_s` -- the per-GPU rate that stands in for the NIC in a decode
  step's cross-node term, for one instance configuration, optionally at one placement
  (``PerfModel.at(gpu_ids)`` binds a model to its instance's GPUs);
* :meth:`~NetworkSeam.transfer_bytes_per_s` -- the per-GPU rate the *estimates* of ``C^sw`` and
  ``C^mig`` use (the planner's objective, the transfer-vs-recompute choice);
* :meth:`~NetworkSeam.deploy` -- the engine tells the fabric that a layout takes over, with the
  bulk transfers the change causes (so a reconfigurable fabric can plan circuits for them), and
  learns when the fabric is ready for the new instances' decode traffic;
* :meth:`~NetworkSeam.transfer_times_s` -- the engine times a batch of concurrent KV migrations or
  weight fetches as flows on the fabric.

GPU indices are cluster-local (``0..G-1``), as in :class:`~compute_sched.layout.Layout`; the seam
maps them to the fabric. :mod:`compute_sched` never imports an implementation: the RL simulator
(``sim.stages.gen_network``) provides one on its network simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from orchestrl.compute_sched.layout import Instance, InstanceConfig, Layout

__all__ = ["Transfer", "NetworkSeam", "kv_gpus", "crosses_nodes"]


@dataclass(frozen=True)
class Transfer:
    """One bulk transfer of a reconfiguration: a request's KV cache, or weights a GPU fetches from peers.

    The bytes are spread evenly: ``max(len(src), len(dst))`` streams, stream ``k`` from
    ``src_gpus[k % len(src)]`` to ``dst_gpus[k % len(dst)]`` (a GPU never sends to itself).
    """

    src_gpus: tuple[int, ...]  # cluster-local GPUs holding the bytes
    dst_gpus: tuple[int, ...]  # cluster-local GPUs receiving them
    size_bytes: float
    kind: str = "kv"  # "kv" (request state) or "weights" (parameter reload from peers)
    start_s: float = 0.0  # offset from the batch's start (a KV transfer waits for its destination's switch)


@runtime_checkable
class NetworkSeam(Protocol):
    """What the generation engine asks of a network; see the module note."""

    def link_bytes_per_s(self, cfg: InstanceConfig, gpu_ids: Sequence[int] | None = None) -> float:
        """Per-GPU bytes/s of the instance's cross-node decode traffic (the NIC rate it stands in for)."""

    def transfer_bytes_per_s(self, cfg: InstanceConfig | None) -> float:
        """Per-GPU bytes/s an estimate of a bulk transfer into an instance of ``cfg`` should assume."""

    def deploy(self, layout: Layout, now_s: float, transfers: Sequence[Transfer] = ()) -> float:
        """``layout`` takes over at ``now_s`` (engine clock); return when its decode traffic may start."""

    def transfer_times_s(self, transfers: Sequence[Transfer], now_s: float) -> list[float]:
        """Seconds from ``now_s`` until each of a batch of concurrent transfers has landed."""


def kv_gpus(inst: Instance) -> tuple[int, ...]:
    """Return the GPUs of an instance that hold KV cache: the attention side of AFD, else all.

    >>> from orchestrl.compute_sched.layout import parse_config
    >>> kv_gpus(Instance(parse_config("afd6:2-tp2"), tuple(range(8))))
    (0, 1, 2, 3, 4, 5)
    """
    if inst.config.kind == "afd":
        return inst.gpu_ids[:inst.config.attn_gpus]
    return inst.gpu_ids


def crosses_nodes(cfg: InstanceConfig, gpus_per_node: int) -> bool:
    """Whether an instance of ``cfg`` sends decode traffic that the performance model puts on the NIC.

    >>> from orchestrl.compute_sched.layout import parse_config
    >>> crosses_nodes(parse_config("tp8"), 8), crosses_nodes(parse_config("ep16-tp1"), 8)
    (False, True)
    """
    return cfg.kind == "afd" or cfg.gpus > gpus_per_node
