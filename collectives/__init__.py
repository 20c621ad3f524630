"""orchestrl collectives: topology-aware weight synchronisation from trainers to generation engines.

Planning is pure and imports no torch::

    from orchestrl.collectives import ParamSpec, TrainerLayout, GeneratorLayout, FabricLinks, plan_weight_sync
    schedule = plan_weight_sync(params, TrainerLayout(tp=4), GeneratorLayout.uniform((1, 2), 4, tp=2),
                                FabricLinks(nic_bps=400e9, cross_bps=20e9))

Execution needs torch (the ``comms`` extra) and is imported on first use::

    from orchestrl.collectives import TorchTransport, WeightSync
    sync = WeightSync(schedule, TorchTransport.connect(host, port, rank, schedule.world_size))
    sync.send(model.named_parameters())          # trainer ranks
    sync.receive(load_weights=engine_loader)     # generator ranks

See docs/collectives.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from orchestrl.collectives.layout import DTYPE_BYTES, FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout
from orchestrl.collectives.plan import DEFAULT_CHUNK_BYTES, plan_weight_sync
from orchestrl.collectives.schedule import Block, Edge, Schedule, Wave

__all__ = [
    "DTYPE_BYTES", "ParamSpec", "TrainerLayout", "GeneratorRank", "GeneratorLayout", "FabricLinks",
    "DEFAULT_CHUNK_BYTES", "plan_weight_sync", "plan_flat", "Schedule", "Block", "Edge", "Wave",
    "WeightSync", "SyncReport", "WeightSyncError", "IntegrityError", "TorchTransport", "UcxTransport",
    "ColocatedTransport",
    "weight_sync_intent", "schedule_transfers", "schedule_demand", "links_from_topology",
]

_LAZY = {
    "plan_flat": "orchestrl.collectives.baseline",
    "WeightSync": "orchestrl.collectives.weight_sync",
    "SyncReport": "orchestrl.collectives.weight_sync",
    "WeightSyncError": "orchestrl.collectives.errors",
    "IntegrityError": "orchestrl.collectives.errors",
    "TorchTransport": "orchestrl.collectives.transport.torch_dist",
    "UcxTransport": "orchestrl.collectives.transport.ucx",
    "ColocatedTransport": "orchestrl.collectives.transport.colocated",
    "weight_sync_intent": "orchestrl.collectives.fabric_demand",
    "schedule_transfers": "orchestrl.collectives.fabric_demand",
    "schedule_demand": "orchestrl.collectives.fabric_demand",
    "links_from_topology": "orchestrl.collectives.fabric_demand",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestrl.collectives' has no attribute {name!r}")
