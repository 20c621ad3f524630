"""vLLM worker extension: receive a weight sync straight into a running vLLM engine's parameters.

vLLM mixes an extension class into every worker when the engine is created with
``worker_extension_cls`` and lets the driver call its methods on all workers with
``collective_rpc`` (the mechanism of vLLM's RLHF examples). The extension connects as generator
rank ``rank_offset + <worker's rank in the engine>`` (the schedule comes from the store, published
by the trainer's rank 0) and receives each parameter slice in place, into the engine's own
tensor-parallel parameters. Plan the schedule with vLLM's names and layouts
(:func:`collectives.specs.megatron_specs` maps Megatron-core's; :func:`collectives.specs.vllm_layout`
describes vLLM's fused QKV with replicated KV heads, fused gate/up, padded vocabularies and
stacked experts, addressed as ``"<name>[<expert>]"``). Every target is checked for dtype, shape and
device before a byte moves; a parameter vLLM does not expose under that name is handed to
``model.load_weights``, which only accepts whole (unsharded) tensors: fine for replicated
parameters and TP=1 engines, refused up front otherwise.

Example (driver process of one engine; the trainer runs ``WeightSync.send`` meanwhile)::

    llm = LLM(model=path, tensor_parallel_size=2,
              worker_extension_cls="orchestrl.collectives.vllm_ext.WeightSyncWorkerExtension")
    llm.collective_rpc("orchestrl_join", args=(None, store_host, store_port, rank_offset))
    reports = llm.collective_rpc("orchestrl_receive")   # once per RL step
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, Mapping

import torch

from orchestrl.fabric.errors import ConfigError

from orchestrl.collectives.schedule import Schedule
from orchestrl.collectives.targets import check_tensor, resolve_targets
from orchestrl.collectives.weight_sync import WeightSync

__all__ = ["WeightSyncWorkerExtension", "vllm_unavailable", "engine_targets", "receive_in_place"]


def vllm_unavailable() -> str | None:
    """Return why the extension cannot run here (no CUDA, no vLLM), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        return f"vllm is not importable ({type(exc).__name__}: {exc})"
    return None


def engine_targets(schedule: Schedule, rank: int, params: Mapping[str, torch.Tensor],
                   device: torch.device) -> dict[int, list[torch.Tensor]]:
    """Return the engine tensors each parameter is written into on ``rank``, all checked.

    Parameters missing from the engine must be whole on this rank (they go through
    ``load_weights``); stacked expert tensors are indexed from this rank's first expert.

    Raises
    ------
    ConfigError
        If an engine tensor has the wrong dtype, shape or device, or a sharded parameter has none.
    """
    first: dict[str, int] = {}
    me = schedule.generator.ranks[rank - schedule.trainer.world_size]
    for spec in schedule.params:
        m = re.match(r"^(.+)\[\d+\]$", spec.name)
        if m and spec.expert is not None:
            first[m.group(1)] = me.ep_rank * (spec.num_experts // me.ep_size)
    targets = resolve_targets(schedule, rank, params, device, where="vLLM engine", first_expert=first)
    for i, spec in enumerate(schedule.params):
        runs = schedule.runs(rank, i)
        if i in targets or runs is None:
            continue
        if runs != (((0, spec.split_extent),), 0):
            raise ConfigError("vLLM engine", spec.name, f"has no parameter of this rank's shard shape "
                              f"{schedule.local_shape(rank, i)} under that name, and a slice cannot go through "
                              "load_weights", "a schedule planned with vLLM's parameter names and layouts")
    return targets


def receive_in_place(sync: WeightSync, model: torch.nn.Module, targets: Mapping[int, list[torch.Tensor]]):
    """One round received into ``model``'s own tensors (``targets`` from :func:`engine_targets`); returns the report.

    Parameters in ``targets`` are written in place; a whole tensor under one of the engine's own names is copied
    into it (shape, dtype checked); anything else goes through ``model.load_weights`` (whole tensors only, as
    :func:`engine_targets` made sure).
    """
    sch = sync.schedule
    params = dict(model.named_parameters())
    names = {name: i for i, p in enumerate(sch.params) for name in p.names}

    def load(batch: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in batch:
            if names.get(name) in targets:
                continue  # already written in place
            if name in params:  # whole tensor under the engine's own name: same dtype, no conversion
                check_tensor(tensor, where="vLLM engine", name=name, shape=tuple(params[name].shape),
                             dtype=str(params[name].dtype).removeprefix("torch."), device=tensor.device)
                params[name].data.copy_(tensor)
            else:
                model.load_weights(weights=[(name, tensor.to(next(iter(params.values())).device))])

    return sync.receive(load, into={sch.params[i].name: ts[0] for i, ts in targets.items()})


class WeightSyncWorkerExtension:
    """Methods vLLM adds to each worker (``self`` is the worker: ``self.model_runner.model``)."""

    def orchestrl_join(self, schedule_json: dict[str, Any] | None, store_host: str, store_port: int,
                       rank_offset: int, backend: str = "nccl", timeout_s: float = 60.0, rejoin: bool = False) -> str:
        """Connect to the weight-sync store; return the schedule digest (the driver checks they agree).

        ``schedule_json`` may be None: the schedule then comes from the store (rank 0 publishes it).
        """
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_world_group

        j = rank_offset + get_world_group().rank
        schedule = (Schedule.from_json(schedule_json) if schedule_json is not None
                    else WeightSync.fetch_schedule(store_host, store_port, timeout_s=timeout_s))
        rank = schedule.generator_rank(j)
        self._orl_sync = WeightSync.connect(schedule, store_host, store_port, rank, backend=backend,
                                            timeout_s=timeout_s, rejoin=rejoin)
        sch = self._orl_sync.schedule
        mine = sch.generator.ranks[j]
        if mine.tp_rank != get_tensor_model_parallel_rank():
            raise ConfigError("orchestrl_join", "rank_offset", f"generator {j} is TP rank {mine.tp_rank} in the "
                              f"schedule but this worker is TP rank {get_tensor_model_parallel_rank()}",
                              "the engine's first generator rank, and a GeneratorLayout in vLLM's worker order")
        params = dict(self.model_runner.model.named_parameters())
        self._orl_into = engine_targets(sch, rank, params, self._orl_sync.transport.device)
        return sch.digest

    def orchestrl_receive(self) -> dict[str, Any]:
        """Receive one sync round; return this worker's :class:`~collectives.weight_sync.SyncReport`."""
        report = receive_in_place(self._orl_sync, self.model_runner.model, self._orl_into)
        torch.cuda.synchronize()
        return asdict(report)

    def orchestrl_param_specs(self) -> list[tuple[str, list[int], str]]:
        """Name, local shape and dtype of every engine parameter (what a schedule must be written in)."""
        return [(n, list(p.shape), str(p.dtype).removeprefix("torch."))
                for n, p in self.model_runner.model.named_parameters()]

    def orchestrl_weight_digest(self) -> dict[str, int]:
        """Byte sum per parameter, so a driver can compare what the engine holds with what was sent."""
        return {n: int(p.detach().reshape(-1).view(torch.uint8).to(torch.int64).sum())
                for n, p in self.model_runner.model.named_parameters()}

    def orchestrl_close(self) -> None:
        """Drop the transport's connections (the next orchestrl_receive reconnects)."""
        self._orl_sync.close()
