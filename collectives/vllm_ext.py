"""vLLM worker extension: receive a weight sync straight into a running vLLM engine's parameters.

vLLM mixes an extension class into every worker when the engine is created with
``worker_extension_cls`` and lets the driver call its methods on all workers with
``collective_rpc`` (the mechanism of vLLM's RLHF examples). The extension joins the schedule's
transport as generator rank ``rank_offset + <worker's rank in the engine>`` and receives each
parameter slice in place, into the engine's own tensor-parallel parameters, when the schedule's
parameter names and local shapes match the engine's (write schedules in vLLM's naming; a trainer
converts its own names and fused layouts before sending). A parameter vLLM does not expose under
that name is handed to ``model.load_weights``, which only accepts whole (unsharded) tensors: fine
for replicated parameters and TP=1 engines, refused up front otherwise.

Example (driver process of one engine; the trainer runs ``WeightSync.send`` meanwhile)::

    llm = LLM(model=path, tensor_parallel_size=2,
              worker_extension_cls="collectives.vllm_ext.WeightSyncWorkerExtension")
    llm.collective_rpc("orchestrl_join", args=(schedule.to_json(), store_host, store_port, rank_offset))
    reports = llm.collective_rpc("orchestrl_receive")   # once per RL step
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from collectives.schedule import Schedule
from collectives.transport.torch_dist import TorchTransport
from collectives.weight_sync import WeightSync

__all__ = ["WeightSyncWorkerExtension", "vllm_unavailable"]


def vllm_unavailable() -> str | None:
    """Return why the extension cannot run here (no CUDA, no vLLM), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        return f"vllm is not importable ({type(exc).__name__}: {exc})"
    return None


class WeightSyncWorkerExtension:
    """Methods vLLM adds to each worker (``self`` is the worker: ``self.model_runner.model``)."""

    def orchestrl_join(self, schedule_json: dict[str, Any], store_host: str, store_port: int, rank_offset: int,
                       backend: str = "nccl", timeout_s: float = 60.0) -> str:
        """Join the weight-sync transport; return the schedule digest (the driver checks they agree)."""
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_world_group

        schedule = Schedule.from_json(schedule_json)
        j = rank_offset + get_world_group().rank
        mine = schedule.generator.ranks[j]
        if mine.tp_rank != get_tensor_model_parallel_rank():
            raise ValueError(f"generator {j} is TP rank {mine.tp_rank} in the schedule but this worker is TP rank "
                             f"{get_tensor_model_parallel_rank()}; fix rank_offset or the GeneratorLayout")
        rank = schedule.generator_rank(j)
        self._orl_transport = TorchTransport.connect(store_host, store_port, rank, schedule.world_size,
                                                     backend=backend, timeout_s=2 * timeout_s)
        self._orl_sync = WeightSync(schedule, self._orl_transport, timeout_s=timeout_s)
        self._orl_into = self._orl_targets(schedule, rank)
        return schedule.digest

    def _orl_targets(self, schedule: Schedule, rank: int) -> dict[str, torch.Tensor]:
        params = dict(self.model_runner.model.named_parameters())
        device = self._orl_transport.device
        into: dict[str, torch.Tensor] = {}
        for i, spec in enumerate(schedule.params):
            lo, hi = schedule.region(rank, i)
            p = params.get(spec.name)
            if p is not None and tuple(p.shape) == spec.region_shape(lo, hi) and p.is_contiguous():
                into[spec.name] = p.data
            elif (lo, hi) != (0, spec.split_extent):  # a whole tensor can go through the model's own loader
                raise ValueError(f"parameter {spec.name!r}: vLLM has no contiguous parameter of local shape "
                                 f"{spec.region_shape(lo, hi)} under that name, and a slice cannot go through "
                                 "load_weights; plan the schedule with vLLM's parameter names")
        return into if device.type == "cuda" else {}  # gloo receives on the host; copied in on completion

    def orchestrl_receive(self) -> dict[str, Any]:
        """Receive one sync round; return this worker's :class:`~collectives.weight_sync.SyncReport`."""
        model = self.model_runner.model
        params = dict(model.named_parameters())

        def load(batch: list[tuple[str, torch.Tensor]]) -> None:
            for name, tensor in batch:
                if name in self._orl_into:
                    continue  # already written in place
                if name in params and tuple(params[name].shape) == tuple(tensor.shape):
                    params[name].data.copy_(tensor)
                else:
                    model.load_weights(weights=[(name, tensor.to(next(iter(params.values())).device))])

        report = self._orl_sync.receive(load, into=self._orl_into)
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
        """Drop the transport (call after a failed sync before joining again)."""
        self._orl_transport.close()
