"""Trainer coordinates: prove that a process holds the shards its schedule rank is planned to hold.

Two trainer ranks holding each other's slices (same shapes) pass every checksum with wrong weights,
so before any byte moves a trainer's TP/PP/EP/expert-TP place, from the caller or from megatron-core's
parallel state, is checked against the schedule's rank order.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from orchestrl.collectives.schedule import Schedule
from orchestrl.fabric.errors import ConfigError

__all__ = ["check_coords", "megatron_coords"]


def megatron_coords() -> dict[str, int] | None:
    """This process's TP/PP/EP/expert-TP ranks from megatron-core's parallel state, or None if it is not set up.

    Only a process that imported megatron-core already can have set it up, so nothing is imported here.
    """
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None
    return {"tp": ps.get_tensor_model_parallel_rank(), "pp": ps.get_pipeline_model_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(), "expert_tp": ps.get_expert_tensor_parallel_rank()}


def _coords_text(coords: Mapping[str, int]) -> str:
    return ", ".join(f"{a} rank {v}" for a, v in coords.items())


def check_coords(sch: Schedule, rank: int, coords: Mapping[str, int] | None) -> None:
    """Raise ConfigError unless this process holds the shards the schedule expects of its rank."""
    lay = sch.trainer
    where = f"{sch.rank_name(rank)}: send()"
    axes = {"tp": (lay.tp, lay.tp_rank), "pp": (lay.pp, lay.pp_rank), "ep": (lay.ep, lay.ep_rank),
            "expert_tp": (lay.expert_tp_size, lay.expert_tp_rank)}
    needed = [a for a, (size, _) in axes.items() if size > 1
              and (a != "expert_tp" or lay.ep > 1 or lay.expert_tp is not None)]  # dense: expert TP is TP
    if not needed:
        return
    have = dict(coords) if coords is not None else megatron_coords()
    if have is None:
        raise ConfigError(where, "coords", "are unknown, so nothing proves this process holds the shards of "
                          f"its schedule rank ({', '.join(f'{a} {axes[a][0]}' for a in needed)} ranks "
                          "hold different shards of the same shape)",
                          "send(..., coords={'tp': tp_rank, 'pp': pp_rank, ...}) from the training framework, "
                          "or initialise megatron-core's parallel state")
    unknown = sorted(set(have) - set(axes))
    if unknown:
        raise ConfigError(where, "coords", f"has unknown keys {unknown}", "tp, pp, ep, expert_tp")
    missing = [a for a in needed if a not in have]
    if missing:
        raise ConfigError(where, "coords", f"lacks {missing}, which this layout splits over",
                          "every axis of size > 1: " + ", ".join(needed))
    mine = {a: axes[a][1](rank) for a in needed}
    claimed = {a: int(have[a]) for a in needed}
    if claimed != mine:
        owners = [r for r in range(lay.world_size) if all(axes[a][1](r) == claimed[a] for a in needed)]
        who = (f"which the schedule gives to {', '.join(sch.rank_name(r) for r in owners[:3])}"
               + (f" and {len(owners) - 3} more" if len(owners) > 3 else "") if owners
               else "which no rank of the schedule has")
        raise ConfigError(where, "coords", f"this process is {_coords_text(claimed)} in its framework, {who}; the "
                          f"schedule expects {sch.rank_name(rank)} to be {_coords_text(mine)}",
                          f"a TrainerLayout whose rank order matches the framework's (order={lay.order!r} now), "
                          "or schedule ranks assigned from the framework's own ranks")
