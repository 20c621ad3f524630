"""orchestrl's schedule as a vLLM weight-transfer backend (``WeightTransferConfig(backend="orchestrl")``).

vLLM moves trainer weights into its workers through a *weight-transfer engine* chosen by name
(``vllm/distributed/weight_transfer/``: ``WeightTransferEngine`` in ``base.py``, the registries in
``factory.py``). This module is that engine, for both shapes of the API:

* **vLLM >= 0.25** (``base.py`` at commit 02f250b0, after vLLM PR #44353 "Weight sync refactor"):
  each engine owns its update's lifecycle. The engine is built with ``(config, vllm_config,
  device, model)``; per update the worker calls ``start_weight_update()``, ``update_weights(info)``
  (-> ``receive_weights(info)``) and ``finish_weight_update()``. With checkpoint-format weights
  (``OrchestrlInitInfo.checkpoint_format=True``, the default and what quantized or post-processed
  layers need) start/finish run vLLM's layerwise reload (``initialize_layerwise_reload(model)`` /
  ``finalize_layerwise_reload(model, model_config)``, as vLLM's NCCL and IPC engines do) and every
  parameter goes through ``model.load_weights``; with ``checkpoint_format=False`` the worker's own
  shards are written in place into vLLM's parameters (checked first: dtype, shape, device) and
  start/finish do nothing, like vLLM's in-place engines. The trainer side is
  :class:`OrchestrlTrainerWeightTransferEngine` (vLLM's ``TrainerWeightTransferEngine``:
  ``trainer_init(config, init_info, client=, source=)`` on every trainer rank, then
  ``send_weights()`` per update; rank 0 drives the workers through the client), for vLLM versions
  that have it (added by vLLM PR #48042; vLLM's own NCCL engine moved to it in 0.28).
* **vLLM 0.22-0.24** (``base.py`` at commit aa1cd966): the worker runs start/finish itself and
  calls ``receive_weights(update_info, load_weights)``; the same class accepts that call, and
  ``trainer_send_weights`` (static; vLLM removes it from its own engines in 0.28) is the trainer side.

Every engine worker joins the job's schedule as generator ``rank_offset + worker rank``, where the
worker rank is vLLM's ``data_parallel_index * world_size + rank`` (as vLLM's NCCL engine numbers
its workers), and the schedule's TP size and rank for it must be the worker's.

With checkpoint format, vLLM's loaders expect whole checkpoint tensors under checkpoint (Hugging
Face) names and cut them to the worker's shard themselves, so the schedule must deliver whole
tensors to every worker: plan it with :func:`checkpoint_receivers`. In place, plan with vLLM's
names and layouts (:func:`orchestrl.collectives.specs.vllm_layout`) and the engine's TP size.

Pausing generation and resetting the prefix cache are the driver's part, as for vLLM's own
backends: :func:`update_engine_weights` does pause -> start -> update -> finish -> reset prefix
cache -> resume on an ``AsyncLLM``, and the trainer engine does the same through its client where
the client offers ``pause_generation`` / ``reset_prefix_cache`` / ``resume_generation``.

It has not run inside a real vLLM here (vLLM needs CUDA and does not install on these machines);
``tests/collectives/test_vllm_backend.py`` checks the classes against vLLM's documented signatures
and runs real updates through them in separate processes, driven the way vLLM's worker and
trainer factory drive them. For vLLM 0.10 to 0.21, :mod:`orchestrl.collectives.vllm_ext` is the
worker extension that writes into the engine's parameters directly (no layerwise reload).

Registration in every vLLM process happens through vLLM's general-plugin entry point
(``vllm.general_plugins``: ``orchestrl = orchestrl.collectives.vllm_backend:register``), installed
with orchestrl; :func:`register` can also be called by hand.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import Any

import torch

from orchestrl.collectives.layout import GeneratorLayout, GeneratorRank
from orchestrl.collectives.schedule import Schedule
from orchestrl.collectives.weight_sync import WeightSync
from orchestrl.fabric.errors import ConfigError

__all__ = ["OrchestrlInitInfo", "OrchestrlUpdateInfo", "OrchestrlTrainerInitInfo", "OrchestrlWeightTransferEngine",
           "OrchestrlTrainerWeightTransferEngine", "register", "checkpoint_receivers", "update_engine_weights",
           "BACKEND", "VLLM_MIN_VERSION", "VLLM_BASES", "ENGINE_LIFECYCLE"]

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
        """Stand-in for vLLM's ``WeightTransferUpdateInfo`` (an empty dataclass from vLLM 0.25 on)."""

    class _Engine:  # type: ignore[no-redef]
        """Stand-in for vLLM >= 0.25's ``WeightTransferEngine``: its constructor, dict parsers and ``update_weights``."""

        init_info_cls: type
        update_info_cls: type

        def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
            self.config = config
            self.vllm_config = vllm_config
            self.parallel_config = vllm_config.parallel_config
            self.model_config = vllm_config.model_config
            self.device = device
            self.model = model

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

        def update_weights(self, update_info: dict[str, Any]) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # type: ignore[attr-defined]

try:  # vLLM with the trainer-side engine and its registry (vLLM PR #48042, July 2026; NCCL's uses it from 0.28)
    from vllm.distributed.weight_transfer.base import (  # type: ignore[import-not-found]
        TrainerInitInfo as _TrainerInitInfo,
        TrainerWeightTransferEngine as _TrainerEngine,
    )
except Exception:  # noqa: BLE001
    @dataclass
    class _TrainerInitInfo:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``TrainerInitInfo``: the keyword-only ``rank`` of this trainer process."""

        rank: int = field(kw_only=True)

        @property
        def is_sender(self) -> bool:
            return self.rank == 0

    class _TrainerEngine:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``TrainerWeightTransferEngine``: its constructor."""

        def __init__(self, config: Any, *, client: Any, source: Any, is_sender: bool = True) -> None:
            self.config = config
            self.is_sender = is_sender
            self.client = client
            self.source = source

#: True where the engine owns start/finish (vLLM >= 0.25, and the stand-in); False on vLLM 0.22-0.24.
ENGINE_LIFECYCLE = "model" in inspect.signature(_Engine.__init__).parameters


@dataclass
class OrchestrlInitInfo(_InitInfo):
    """Where the job's weight-sync store is, which generator ranks this engine's workers are, and the format."""

    store_host: str
    store_port: int
    rank_offset: int = 0  # generator rank of the engine's worker 0 (the schedule's generator order)
    backend: str = "nccl"  # transport: "nccl" (GPUs), "ipc" (trainer on the same GPUs), "gloo"
    timeout_s: float = 60.0
    group_name: str = "orchestrl-weight-sync"
    checkpoint_format: bool = True  # whole checkpoint tensors through vLLM's loaders (False: own shards, in place)


@dataclass
class OrchestrlUpdateInfo(_UpdateInfo):
    """One update: nothing travels here but the step (the schedule says what moves)."""

    step: int = -1  # the trainer's step, reported back (-1: not given)
    _: KW_ONLY
    is_checkpoint_format: bool | None = None  # None: as the engine was initialised (vLLM 0.22-0.24 sends it)


@dataclass
class OrchestrlTrainerInitInfo(_TrainerInitInfo):
    """A trainer rank's side of the job (vLLM's ``TrainerWeightTransferEngine``); ``rank`` is the schedule's trainer rank.

    Rank 0 passes the planned ``schedule`` (a :class:`~orchestrl.collectives.Schedule`, or its JSON) and
    hosts the store; the others pass None. Rank 0 sends the workers an :class:`OrchestrlInitInfo` built from
    these fields through the client (``worker_store_host``, if set, is the store's address as they reach it).
    """

    store_host: str
    store_port: int
    schedule: Any = None
    backend: str = "nccl"
    timeout_s: float = 60.0
    group_name: str = "orchestrl-weight-sync"
    rank_offset: int = 0
    checkpoint_format: bool = True
    coords: dict[str, int] | None = None  # this rank's TP/PP/EP/DP coordinates, checked against the schedule
    worker_store_host: str | None = None  # the store's address as the workers reach it (default: store_host)


def checkpoint_receivers(engines: list[tuple[int, int]]) -> GeneratorLayout:
    """A generator layout whose every worker receives whole tensors: ``[(pod, workers of the engine), ...]``.

    vLLM's checkpoint-format loading cuts each whole tensor to the worker's shard itself, so each
    worker is a TP=1 receiver here (a tree inside the PoD still sends each byte across the PoD
    boundary once per engine).
    """
    return GeneratorLayout(tuple(GeneratorRank(pod, engine=e) for e, (pod, n) in enumerate(engines)
                                 for _ in range(n)))


def _worker_rank(parallel_config: Any) -> int:
    """The worker's rank across the engine's data-parallel groups (vLLM's NCCL engine numbers workers this way)."""
    dp = int(getattr(parallel_config, "data_parallel_index", 0) or 0)
    return dp * int(getattr(parallel_config, "world_size", 1) or 1) + int(getattr(parallel_config, "rank", 0))


class OrchestrlWeightTransferEngine(_Engine):
    """vLLM weight-transfer engine running orchestrl's planned schedule (see the module note)."""

    init_info_cls = OrchestrlInitInfo
    update_info_cls = OrchestrlUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, vllm_config, *args, **kwargs)  # vLLM 0.22-0.24 pass (config, parallel_config)
        self._sync: WeightSync | None = None
        self._checkpoint = True
        self._into: dict[int, list[torch.Tensor]] | None = None
        self._reloading = False

    # -- lifecycle (vLLM >= 0.25 calls these; older vLLM runs its own around receive_weights) ---------
    def init_transfer_engine(self, init_info: OrchestrlInitInfo) -> None:
        pc = self.parallel_config
        worker = _worker_rank(pc)
        schedule = WeightSync.fetch_schedule(init_info.store_host, init_info.store_port,
                                             timeout_s=init_info.timeout_s, group_name=init_info.group_name)
        j = init_info.rank_offset + worker
        if not 0 <= j < schedule.generator.world_size:
            raise ConfigError("OrchestrlInitInfo", "rank_offset", f"{init_info.rank_offset} + worker rank {worker} is "
                              f"generator {j}, outside the schedule's {schedule.generator.world_size} generators",
                              f"0..{schedule.generator.world_size - 1} minus the engine's workers")
        self._checkpoint = bool(init_info.checkpoint_format)
        if not self._checkpoint:  # own shards (whole tensors suit any TP: vLLM's loaders cut them)
            self._check_layout(schedule, j)
        self._sync = WeightSync.connect(schedule, init_info.store_host, init_info.store_port,
                                        schedule.generator_rank(j), backend=init_info.backend,
                                        timeout_s=init_info.timeout_s, group_name=init_info.group_name)
        model = getattr(self, "model", None)
        if not self._checkpoint and model is not None:  # in place: every target checked before a byte moves
            from orchestrl.collectives.vllm_ext import engine_targets
            self._into = engine_targets(self._sync.schedule, self._sync.rank, dict(model.named_parameters()),
                                        self._sync.transport.device)

    def start_weight_update(self) -> None:
        """Begin vLLM's layerwise reload for checkpoint-format weights (nothing to do in place)."""
        if self._checkpoint and getattr(self, "model", None) is not None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload  # type: ignore[import-not-found]
            initialize_layerwise_reload(self.model)
            self._reloading = True

    def finish_weight_update(self) -> None:
        """Finalise vLLM's layerwise reload (quantized and post-processed layers are processed here)."""
        if self._reloading:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload  # type: ignore[import-not-found]
            self._reloading = False
            finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: OrchestrlUpdateInfo,
                        load_weights: Callable[[list[tuple[str, torch.Tensor]]], None] | None = None) -> None:
        """One round of the schedule. ``load_weights`` is vLLM 0.22-0.24's argument; later vLLM loads into ``model``."""
        if self._sync is None:
            raise ConfigError("OrchestrlWeightTransferEngine", "init_info",
                              "receive_weights before init_transfer_engine", "call init_weight_transfer_engine first")
        sch, rank = self._sync.schedule, self._sync.rank
        checkpoint = self._checkpoint if update_info.is_checkpoint_format is None else update_info.is_checkpoint_format
        if checkpoint != self._checkpoint and ENGINE_LIFECYCLE:
            raise ConfigError("OrchestrlUpdateInfo", "is_checkpoint_format",
                              f"is {checkpoint} but the engine was initialised with checkpoint_format={self._checkpoint}",
                              "leave it out (the format is the engine's, set in init_info), or re-initialise")
        if checkpoint:
            self._check_whole(sch, rank)
        else:  # the worker's own shards: the schedule must plan it where the engine runs it
            self._check_layout(sch, rank - sch.trainer.world_size)
        model = getattr(self, "model", None)
        if load_weights is None:
            if model is None:
                raise ConfigError("OrchestrlWeightTransferEngine", "load_weights", "is None and the engine has no "
                                  "model (vLLM 0.22-0.24 pass the worker's loader)", "pass model.load_weights")
            if not checkpoint and self._into is not None:
                from orchestrl.collectives.vllm_ext import receive_in_place
                receive_in_place(self._sync, model, self._into)
                return
            load_weights = model.load_weights
        self._sync.receive(load_weights)

    def shutdown(self) -> None:
        if self._sync is not None:
            self._sync.close()

    # -- checks ----------------------------------------------------------------------------------
    def _check_layout(self, schedule: Schedule, j: int) -> None:
        """Refuse a worker whose TP place in the engine is not the one the schedule planned for generator ``j``."""
        me = schedule.generator.ranks[j]
        pc = self.parallel_config
        tp = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        tp_rank = int(getattr(pc, "rank", 0)) % tp
        if me.tp_size != tp or me.tp_rank != tp_rank:
            raise ConfigError("OrchestrlInitInfo", "rank_offset",
                              f"generator {j} is TP rank {me.tp_rank} of {me.tp_size} in the schedule, but this worker "
                              f"is TP rank {tp_rank} of {tp}", "a GeneratorLayout with the engine's tensor-parallel "
                              "size in vLLM's worker order, and the engine's first generator rank as rank_offset")

    @staticmethod
    def _check_whole(sch: Schedule, rank: int) -> None:
        partial = [p.name for i, p in enumerate(sch.params) if sch.local_shape(rank, i) not in (None, tuple(p.shape))]
        if partial:
            raise ConfigError("OrchestrlUpdateInfo", "is_checkpoint_format",
                              f"is True, but the schedule gives {sch.rank_name(rank)} shards, not whole tensors "
                              f"({partial[0]!r} and {len(partial) - 1} more); vLLM's checkpoint loaders cut whole "
                              "tensors themselves", "a schedule planned with checkpoint_receivers(...), or "
                              "checkpoint_format=False with vLLM's names and layouts")

    # -- trainer side, for vLLM without the trainer engine ---------------------------------------
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


class OrchestrlTrainerWeightTransferEngine(_TrainerEngine):
    """vLLM's trainer-side engine (``TrainerWeightTransferEngine``) for orchestrl: every trainer rank sends its shards.

    Unlike vLLM's broadcast engines, where only rank 0 transmits, every trainer rank sends the pieces
    the schedule gives it; rank 0 alone talks to the workers through ``client`` (vLLM's
    ``VLLMWeightSyncClient``: ``init_weight_transfer_engine``, ``start_weight_update``,
    ``update_weights``, ``finish_weight_update``), running ``update_weights`` on a thread while it
    sends, since the workers' receive returns only when the round is done. A client that also has
    ``pause_generation`` / ``reset_prefix_cache`` / ``resume_generation`` is paused for the update,
    its prefix cache reset after it (cached KV came from the old weights) and resumed. A failed
    round raises on every rank and leaves generation paused: the workers' tensors may be partly
    updated (docs/collectives.md, Failures); call :meth:`send_weights` again (a retry
    rewrites every tensor) or restore and resume yourself.
    """

    init_info_cls = OrchestrlTrainerInitInfo
    config_cls = dict  # orchestrl needs no trainer config beyond the init info (vLLM passes WeightTransferConfig)

    def __init__(self, config: Any, *, client: Any, source: Iterable[tuple[str, torch.Tensor]],
                 is_sender: bool = True) -> None:
        super().__init__(config, client=client, source=source, is_sender=is_sender)
        self.init_info: OrchestrlTrainerInitInfo | None = None
        self._sync: WeightSync | None = None
        self.step = 0

    @classmethod
    def trainer_init(cls, config: Any, init_info: OrchestrlTrainerInitInfo, *, client: Any,
                     source: Iterable[tuple[str, torch.Tensor]]) -> "OrchestrlTrainerWeightTransferEngine":
        """Connect this trainer rank; rank 0 also has the workers join (through ``client``) meanwhile."""
        if isinstance(init_info, dict):
            init_info = OrchestrlTrainerInitInfo(**init_info)
        if init_info.rank == 0 and client is None:
            raise ConfigError("trainer_init", "client", "is None on trainer rank 0, which drives the workers' "
                              "init, start, update and finish", "vLLM's client of the inference deployment (e.g. its "
                              "HTTP client); the other trainer ranks may pass None")
        engine = cls(config, client=client, source=source, is_sender=init_info.rank == 0)
        engine.init_info = init_info
        schedule = init_info.schedule
        if isinstance(schedule, dict):
            schedule = Schedule.from_json(schedule)
        worker_init = asdict(OrchestrlInitInfo(
            store_host=init_info.worker_store_host or init_info.store_host, store_port=init_info.store_port,
            rank_offset=init_info.rank_offset, backend=init_info.backend, timeout_s=init_info.timeout_s,
            group_name=init_info.group_name, checkpoint_format=init_info.checkpoint_format))
        call = _Call(client.init_weight_transfer_engine, worker_init) if engine.is_sender else None
        try:
            engine._sync = WeightSync.connect(schedule if engine.is_sender else None, init_info.store_host,
                                              init_info.store_port, init_info.rank, backend=init_info.backend,
                                              timeout_s=init_info.timeout_s, group_name=init_info.group_name)
        except BaseException:
            if call is not None:  # the workers' join fails with it; this rank's error says why
                call.join(init_info.timeout_s * 3, "init_weight_transfer_engine", raise_error=False)
            raise
        if call is not None:
            call.join(init_info.timeout_s * 3, "init_weight_transfer_engine")
        return engine

    def send_weights(self) -> None:
        """One update: this rank's shards through the schedule; rank 0 drives the workers' start/update/finish."""
        if self._sync is None or self.init_info is None:
            raise ConfigError("OrchestrlTrainerWeightTransferEngine", "send_weights", "called on an engine that "
                              "trainer_init did not build", "OrchestrlTrainerWeightTransferEngine.trainer_init(...)")
        info = self.init_info
        self.step += 1
        if not self.is_sender:
            self._sync.send(iter(self.source), coords=info.coords)
            return
        client = self.client
        _maybe(client, "pause_generation")
        client.start_weight_update()
        call = _Call(client.update_weights, asdict(OrchestrlUpdateInfo(step=self.step)))
        try:
            self._sync.send(iter(self.source), coords=info.coords)
        except BaseException:
            call.join(info.timeout_s * 3, "update_weights", raise_error=False)  # the workers' side failed too
            raise  # this rank's error names the rank that failed
        call.join(info.timeout_s * 3, "update_weights")
        client.finish_weight_update()
        _maybe(client, "reset_prefix_cache")
        _maybe(client, "resume_generation")

    def shutdown(self) -> None:
        if self._sync is not None:
            self._sync.close()


class _Call:
    """A client call on its own thread, joined with a bound; its exception is raised by :meth:`join`."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name="orchestrl-vllm-client", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # raised in the trainer's thread by join()
            self.error = exc

    def join(self, timeout_s: float, what: str, raise_error: bool = True) -> None:
        self._thread.join(timeout_s)
        if not raise_error:
            return
        if self._thread.is_alive():
            raise TimeoutError(f"the vLLM client's {what} did not return within {timeout_s:.0f} s (3 x timeout_s); "
                               "check that every engine worker is up and reaches the store")
        if self.error is not None:
            raise RuntimeError(f"the vLLM client's {what} failed: {type(self.error).__name__}: "
                               f"{self.error}") from self.error


def _maybe(client: Any, method: str) -> None:
    fn = getattr(client, method, None)
    if callable(fn):
        fn()


def register() -> None:
    """Register the ``"orchestrl"`` backend with vLLM (idempotent; a no-op where vLLM is not installed)."""
    try:
        from vllm.distributed.weight_transfer import factory  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 -- no vLLM (or one without weight transfer): nothing to register with
        return
    missing = sorted(getattr(OrchestrlWeightTransferEngine, "__abstractmethods__", ()))
    if missing:  # a vLLM newer than this engine's API: refuse here rather than fail inside a worker
        logging.getLogger(__name__).warning(
            "orchestrl weight-transfer backend not registered: this vLLM's WeightTransferEngine requires %s, "
            "which orchestrl's engine does not implement (written for vLLM %s and later up to base.py at "
            "02f250b0); use orchestrl.collectives.vllm_ext or another backend", missing, VLLM_MIN_VERSION)
        return
    engines = factory.WeightTransferEngineFactory
    if BACKEND not in getattr(engines, "_registry", {}):
        engines.register_engine(BACKEND, __name__, "OrchestrlWeightTransferEngine")
    trainers = getattr(factory, "WeightTransferTrainerFactory", None)  # vLLM with trainer engines
    if trainers is not None and BACKEND not in getattr(trainers, "_registry", {}) \
            and not getattr(OrchestrlTrainerWeightTransferEngine, "__abstractmethods__", ()):
        trainers.register_engine(BACKEND, __name__, "OrchestrlTrainerWeightTransferEngine")


async def update_engine_weights(engine: Any, *, is_checkpoint_format: bool | None = None, step: int = -1) -> None:
    """Driver side of one update on an ``AsyncLLM``: pause, start, update, finish, reset the prefix cache, resume.

    The trainer ranks send meanwhile. The prefix cache is reset because cached KV blocks were computed
    with the old weights. If a step raises, generation stays paused: the engine's weights may be partly
    updated, so run the update again (a retry rewrites every tensor) before ``resume_generation``.
    On vLLM >= 0.25 the format is the engine's (``OrchestrlInitInfo.checkpoint_format``) and
    ``is_checkpoint_format``, if given, must agree with it; vLLM 0.22-0.24 take it at start (default True).
    """
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest  # type: ignore[import-not-found]

    missing = [m for m in ("pause_generation", "start_weight_update", "update_weights", "finish_weight_update",
                           "reset_prefix_cache", "resume_generation") if not hasattr(engine, m)]
    if missing:
        raise ConfigError("update_engine_weights", "engine", f"has no {missing} (vLLM older than "
                          f"{VLLM_MIN_VERSION}?)", f"vLLM >= {VLLM_MIN_VERSION}, or orchestrl.collectives.vllm_ext")
    takes_format = "is_checkpoint_format" in inspect.signature(engine.start_weight_update).parameters
    await engine.pause_generation()
    if takes_format:  # vLLM 0.22-0.24
        await engine.start_weight_update(is_checkpoint_format=True if is_checkpoint_format is None
                                         else is_checkpoint_format)
    else:
        await engine.start_weight_update()
    info = asdict(OrchestrlUpdateInfo(step=step, is_checkpoint_format=is_checkpoint_format))
    await engine.update_weights(WeightTransferUpdateRequest(update_info=info))
    await engine.finish_weight_update()
    await engine.reset_prefix_cache()
    await engine.resume_generation()  # not after a failure: the weights may be partly updated (see the docs)
