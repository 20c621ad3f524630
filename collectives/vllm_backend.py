"""orchestrl's schedule as a vLLM weight-transfer backend (``WeightTransferConfig(backend="orchestrl")``).

Current vLLM moves trainer weights into its workers through a *weight-transfer engine* chosen by
name (``vllm/distributed/weight_transfer/``: ``WeightTransferEngine`` in ``base.py``, the registry
``WeightTransferEngineFactory.register_engine`` in ``factory.py``). Each worker calls
``init_transfer_engine`` once, then per update ``receive_weights(update_info, load_weights)``
between the worker's ``start_weight_update(is_checkpoint_format)`` and ``finish_weight_update()``,
which wrap the loading in vLLM's layerwise reload (so quantized and post-processed layers are
dequantized, repacked and post-processed by vLLM's own loaders). This module is that engine:

* ``init_transfer_engine`` connects the worker as generator rank ``rank_offset + worker rank`` of
  the job's schedule (published in the store by the trainer's rank 0) and checks that the
  schedule's TP layout for this rank is the worker's;
* ``receive_weights`` runs one :class:`~orchestrl.collectives.WeightSync` round and hands every
  completed parameter to ``load_weights``. With ``is_checkpoint_format=True`` (the default, and
  what quantized models need) vLLM's loaders expect whole checkpoint tensors under checkpoint
  (Hugging Face) names and cut them to the worker's shard themselves, so the schedule must deliver
  whole tensors to every rank of the engine: plan it with :func:`checkpoint_receivers`. With
  ``False`` the tensors are the worker's own shards under vLLM's names (plan with
  :func:`orchestrl.collectives.specs.vllm_layout`), which vLLM copies into its parameters;
* ``trainer_send_weights`` is the trainer side: one round of ``WeightSync.send``.

Pausing generation and resetting the prefix cache are the driver's part, as for vLLM's own
backends: :func:`update_engine_weights` does pause -> start -> update -> finish -> reset prefix
cache -> resume on an ``AsyncLLM``.

Supported vLLM: written against ``base.py`` at commit aa1cd966 (the engine API of vLLM 0.22-0.24:
``init_weight_transfer_engine`` / ``update_weights`` with ``start_weight_update`` /
``finish_weight_update`` on the worker). vLLM 0.25 moved ``start_weight_update`` /
``finish_weight_update`` into the engine and 0.26 added a trainer-side engine; this module does not
implement those yet, and :func:`register` declines (with a warning naming the missing methods) on a
vLLM whose base class requires methods it lacks. It has not been run inside a real vLLM here (vLLM
needs CUDA); the tests check the contract and run real rounds through the engine's methods.
For older vLLM (0.10 to 0.21), :mod:`orchestrl.collectives.vllm_ext` is the worker extension that
writes into the engine's parameters directly (no layerwise reload: not for quantized models).

Registration in every vLLM process happens through vLLM's general-plugin entry point
(``vllm.general_plugins``: ``orchestrl = orchestrl.collectives.vllm_backend:register``), installed
with orchestrl; :func:`register` can also be called by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, asdict, dataclass
from typing import Any

import torch

from orchestrl.collectives.layout import GeneratorLayout, GeneratorRank
from orchestrl.collectives.weight_sync import WeightSync
from orchestrl.fabric.errors import ConfigError

__all__ = ["OrchestrlInitInfo", "OrchestrlUpdateInfo", "OrchestrlWeightTransferEngine", "register",
           "checkpoint_receivers", "update_engine_weights", "BACKEND", "VLLM_MIN_VERSION"]

BACKEND = "orchestrl"
VLLM_MIN_VERSION = "0.22"

try:  # vLLM's own base classes where vLLM is installed (GPU machines); the documented shapes otherwise
    from vllm.distributed.weight_transfer.base import (  # type: ignore[import-not-found]
        WeightTransferEngine as _Engine,
        WeightTransferInitInfo as _InitInfo,
        WeightTransferUpdateInfo as _UpdateInfo,
    )
    VLLM_BASES = True
except Exception:  # noqa: BLE001 -- vLLM absent or of another shape: same fields, same method names
    VLLM_BASES = False

    @dataclass
    class _InitInfo:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``WeightTransferInitInfo`` (an empty dataclass there)."""

    @dataclass
    class _UpdateInfo:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``WeightTransferUpdateInfo``: the keyword-only ``is_checkpoint_format``."""

        _: KW_ONLY
        is_checkpoint_format: bool = True

    class _Engine:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``WeightTransferEngine``: the constructor and the dict parsers it provides."""

        init_info_cls: type
        update_info_cls: type

        def __init__(self, config: Any, parallel_config: Any) -> None:
            self.config = config
            self.parallel_config = parallel_config

        def parse_init_info(self, init_dict: dict[str, Any]):
            try:
                return self.init_info_cls(**init_dict)
            except TypeError as e:
                raise ValueError(f"Invalid init_info for {self.__class__.__name__}: {e}") from e

        def parse_update_info(self, update_dict: dict[str, Any]):
            try:
                return self.update_info_cls(**update_dict)
            except TypeError as e:
                raise ValueError(f"Invalid update_info for {self.__class__.__name__}: {e}") from e


@dataclass
class OrchestrlInitInfo(_InitInfo):
    """Where the job's weight-sync store is and which generator ranks this engine's workers are."""

    store_host: str
    store_port: int
    rank_offset: int = 0  # generator rank of the engine's worker 0 (the schedule's generator order)
    backend: str = "nccl"  # transport: "nccl" (GPUs), "ipc" (trainer on the same GPUs), "gloo"
    timeout_s: float = 60.0
    group_name: str = "orchestrl-weight-sync"


@dataclass
class OrchestrlUpdateInfo(_UpdateInfo):
    """One update: nothing travels here but the step (the schedule says what moves)."""

    step: int = -1  # the trainer's step, reported back (-1: not given)


def checkpoint_receivers(engines: list[tuple[int, int]]) -> GeneratorLayout:
    """A generator layout whose every worker receives whole tensors: ``[(pod, workers of the engine), ...]``.

    vLLM's checkpoint-format loading cuts each whole tensor to the worker's shard itself, so each
    worker is a TP=1 receiver here (a tree inside the PoD still sends each byte across the PoD
    boundary once per engine).
    """
    return GeneratorLayout(tuple(GeneratorRank(pod, engine=e) for e, (pod, n) in enumerate(engines)
                                 for _ in range(n)))


class OrchestrlWeightTransferEngine(_Engine):
    """vLLM weight-transfer engine running orchestrl's planned schedule (see the module note)."""

    init_info_cls = OrchestrlInitInfo
    update_info_cls = OrchestrlUpdateInfo

    def __init__(self, config: Any, parallel_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, parallel_config, *args, **kwargs)
        self._sync: WeightSync | None = None

    def init_transfer_engine(self, init_info: OrchestrlInitInfo) -> None:
        worker = int(getattr(self.parallel_config, "rank", 0))
        schedule = WeightSync.fetch_schedule(init_info.store_host, init_info.store_port,
                                             timeout_s=init_info.timeout_s, group_name=init_info.group_name)
        j = init_info.rank_offset + worker
        if not 0 <= j < schedule.generator.world_size:
            raise ConfigError("OrchestrlInitInfo", "rank_offset", f"{init_info.rank_offset} + worker rank {worker} is "
                              f"generator {j}, outside the schedule's {schedule.generator.world_size} generators",
                              f"0..{schedule.generator.world_size - 1} minus the engine's workers")
        self._sync = WeightSync.connect(schedule, init_info.store_host, init_info.store_port,
                                        schedule.generator_rank(j), backend=init_info.backend,
                                        timeout_s=init_info.timeout_s, group_name=init_info.group_name)

    def receive_weights(self, update_info: OrchestrlUpdateInfo,
                        load_weights: Callable[[list[tuple[str, torch.Tensor]]], None]) -> None:
        if self._sync is None:
            raise ConfigError("OrchestrlWeightTransferEngine", "init_info",
                              "receive_weights before init_transfer_engine", "call init_weight_transfer_engine first")
        sch, rank = self._sync.schedule, self._sync.rank
        me = sch.generator.ranks[rank - sch.trainer.world_size]
        tp = int(getattr(self.parallel_config, "tensor_parallel_size", 1))
        if update_info.is_checkpoint_format:
            partial = [p.name for i, p in enumerate(sch.params)
                       if sch.local_shape(rank, i) not in (None, tuple(p.shape))]
            if partial:
                raise ConfigError("OrchestrlUpdateInfo", "is_checkpoint_format",
                                  f"is True, but the schedule gives {sch.rank_name(rank)} shards, not whole tensors "
                                  f"({partial[0]!r} and {len(partial) - 1} more); vLLM's checkpoint loaders cut whole "
                                  "tensors themselves", "a schedule planned with checkpoint_receivers(...), or "
                                  "is_checkpoint_format=False with vLLM's names and layouts")
        elif me.tp_size != tp:
            raise ConfigError("OrchestrlUpdateInfo", "is_checkpoint_format",
                              f"is False (the worker's own shards), but the schedule plans {sch.rank_name(rank)} as "
                              f"one of a TP={me.tp_size} engine and this engine runs TP={tp}",
                              "a GeneratorLayout with the engine's tensor-parallel size")
        self._sync.receive(load_weights)

    def shutdown(self) -> None:
        if self._sync is not None:
            self._sync.close()

    @staticmethod
    def trainer_send_weights(iterator: Iterator[tuple[str, torch.Tensor]], trainer_args: dict[str, Any]) -> None:
        """Trainer side of one update: this rank's shards through the schedule.

        ``trainer_args``: ``store_host``, ``store_port``, ``rank`` (schedule rank), ``schedule`` (rank 0
        only: the planned :class:`~orchestrl.collectives.Schedule`), optional ``coords`` (see
        :meth:`WeightSync.send`), ``backend``, ``timeout_s``, ``group_name``. The connection is kept
        for the next update.
        """
        key = (trainer_args["store_host"], int(trainer_args["store_port"]), int(trainer_args["rank"]))
        with _TRAINERS_LOCK:
            sync = _TRAINERS.get(key)
            if sync is None:
                sync = WeightSync.connect(trainer_args.get("schedule"), key[0], key[1], key[2],
                                          backend=trainer_args.get("backend", "nccl"),
                                          timeout_s=float(trainer_args.get("timeout_s", 60.0)),
                                          group_name=trainer_args.get("group_name", "orchestrl-weight-sync"))
                _TRAINERS[key] = sync
        sync.send(iterator, coords=trainer_args.get("coords"))


_TRAINERS: dict[tuple[str, int, int], WeightSync] = {}
_TRAINERS_LOCK = threading.Lock()


def register() -> None:
    """Register the ``"orchestrl"`` backend with vLLM (idempotent; a no-op where vLLM is not installed)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 -- no vLLM (or one without weight transfer): nothing to register with
        return
    missing = sorted(getattr(OrchestrlWeightTransferEngine, "__abstractmethods__", ()))
    if missing:  # a vLLM newer than this engine's API: refuse here rather than fail inside a worker
        logging.getLogger(__name__).warning(
            "orchestrl weight-transfer backend not registered: this vLLM's WeightTransferEngine requires %s, "
            "which orchestrl %s does not implement (written for vLLM %s-0.24); use "
            "orchestrl.collectives.vllm_ext or another backend", missing, BACKEND, VLLM_MIN_VERSION)
        return
    if BACKEND not in getattr(WeightTransferEngineFactory, "_registry", {}):
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "OrchestrlWeightTransferEngine")


async def update_engine_weights(engine: Any, *, is_checkpoint_format: bool = True, step: int = -1) -> None:
    """Driver side of one update on an ``AsyncLLM``: pause, start, update, finish, reset the prefix cache, resume.

    The trainer ranks call :meth:`OrchestrlWeightTransferEngine.trainer_send_weights` meanwhile. The
    prefix cache is reset because cached KV blocks were computed with the old weights.
    """
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest  # type: ignore[import-not-found]

    missing = [m for m in ("pause_generation", "start_weight_update", "update_weights", "finish_weight_update",
                           "reset_prefix_cache", "resume_generation") if not hasattr(engine, m)]
    if missing:
        raise ConfigError("update_engine_weights", "engine", f"has no {missing} (vLLM older than "
                          f"{VLLM_MIN_VERSION}?)", f"vLLM >= {VLLM_MIN_VERSION}, or orchestrl.collectives.vllm_ext")
    await engine.pause_generation()
    try:
        await engine.start_weight_update(is_checkpoint_format=is_checkpoint_format)
        info = asdict(OrchestrlUpdateInfo(step=step, is_checkpoint_format=is_checkpoint_format))
        await engine.update_weights(WeightTransferUpdateRequest(update_info=info))
        await engine.finish_weight_update()
        await engine.reset_prefix_cache()
    finally:
        await engine.resume_generation()

