"""Turn a weight-sync schedule into the demand the fabric controller plans circuits for.

The fabric's weight-sync template (OrchestrRL §5.2 item 3) needs to know which GPU sends how many
bytes to which GPU. :mod:`fabric.traffic` has a stand-in model for that; the real schedule
replaces it through :attr:`fabric.intent.Collective.transfers`, the seam this module fills:

>>> from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
>>> from orchestrl.collectives.plan import plan_weight_sync
>>> sch = plan_weight_sync([ParamSpec("w", (4, 4), "float32", tp_dim=0)], TrainerLayout(tp=2, gpus=(0, 1)),
...                        GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, gpus=(8, 9)), FabricLinks(nic_bps=1e9))
>>> schedule_transfers(sch)
[(0, 8, 32.0), (1, 9, 32.0), (8, 9, 32.0), (9, 8, 32.0)]
>>> weight_sync_intent(sch, job="rl-job").collectives[0].primitive
'weight-sync'
"""

from __future__ import annotations

from typing import Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.topology import Topology
from orchestrl.fabric.traffic import AggregateDemand, aggregate_demand, transfer_pair_bytes

from orchestrl.collectives.layout import FabricLinks
from orchestrl.collectives.schedule import Schedule

__all__ = ["schedule_gpus", "schedule_transfers", "weight_sync_collective", "weight_sync_intent",
           "schedule_demand", "links_from_topology"]


def schedule_gpus(schedule: Schedule, trainer_gpus: Sequence[int] = (), generator_gpus: Sequence[int] = ()) -> list[int]:
    """Return the fabric GPU of every schedule rank (trainers first).

    GPUs come from the arguments when given, else from the layouts (``TrainerLayout.gpus``,
    ``GeneratorRank.gpu``).

    Raises
    ------
    ConfigError
        If a rank has no GPU.
    """
    t = list(trainer_gpus) or list(schedule.trainer.gpus)
    g = list(generator_gpus) or [r.gpu for r in schedule.generator.ranks]
    if len(t) != schedule.trainer.world_size or len(g) != schedule.generator.world_size or min(t + g) < 0:
        raise ConfigError("weight-sync schedule", "gpus", "some trainer or generator rank has no fabric GPU",
                          "TrainerLayout(gpus=...) and GeneratorRank(gpu=...), or pass trainer_gpus/generator_gpus")
    return t + g


def schedule_transfers(schedule: Schedule, trainer_gpus: Sequence[int] = (),
                       generator_gpus: Sequence[int] = ()) -> list[tuple[int, int, float]]:
    """Return ``(src GPU, dst GPU, bytes)`` for every edge of the schedule, in schedule order.

    Notes
    -----
    O(E) for E edges.
    """
    gpu = schedule_gpus(schedule, trainer_gpus, generator_gpus)
    return [(gpu[e.src], gpu[e.dst], float(schedule.blocks[e.block].nbytes)) for e in schedule.edges]


def weight_sync_collective(schedule: Schedule, trainer_gpus: Sequence[int] = (),
                           generator_gpus: Sequence[int] = ()) -> Collective:
    """Return the ``weight-sync`` collective whose demand is exactly this schedule's transfers."""
    gpu = schedule_gpus(schedule, trainer_gpus, generator_gpus)
    t = schedule.trainer.world_size
    return Collective("weight-sync", src_gpus=tuple(gpu[:t]), dst_gpus=tuple(gpu[t:]),
                      bytes_per_rank=float(schedule.model_bytes),
                      transfers=tuple(schedule_transfers(schedule, trainer_gpus, generator_gpus)))


def weight_sync_intent(schedule: Schedule, job: str, period: str = "weight-sync", trainer_gpus: Sequence[int] = (),
                       generator_gpus: Sequence[int] = ()) -> Intent:
    """Return the intent a job announces before a weight sync (stage ``weight-sync``)."""
    return Intent("weight-sync", job, period, (weight_sync_collective(schedule, trainer_gpus, generator_gpus),))


def schedule_demand(schedule: Schedule, topology: Topology, trainer_gpus: Sequence[int] = (),
                    generator_gpus: Sequence[int] = ()) -> AggregateDemand:
    """Return the ToR- and PoD-level demand of the schedule on ``topology``."""
    pairs = transfer_pair_bytes(schedule_transfers(schedule, trainer_gpus, generator_gpus))
    return aggregate_demand(pairs, topology)


def links_from_topology(topology: Topology, cross_bps: float | None = None) -> FabricLinks:
    """Return the planner's view of a fabric: NIC = circuit rate, ``d_p`` = usable boundary fibres.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, pods=2, servers_per_pod=1,
    ...                            boundary_ports_per_pod=4, core_devices=1))
    >>> links_from_topology(topo).budget(1)
    4
    """
    budgets = {p: len(topology.usable_boundary(p)) for p in topology.pods}
    return FabricLinks(nic_bps=topology.link_bps, budgets=budgets, default_budget=max([1, *budgets.values()]),
                       cross_bps=cross_bps)
