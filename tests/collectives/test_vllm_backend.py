"""The vLLM weight-transfer backend: its contract with vLLM's interface, and real updates through it.

vLLM (a CUDA build) does not install on these machines, so the contract is checked against vLLM's
own classes where vLLM imports and against the documented signatures otherwise: vLLM's
``vllm/distributed/weight_transfer/base.py`` at commit 02f250b03f38822ccdb63f27a3005d10ca81f385
(vLLM >= 0.25, after PR #44353): ``WeightTransferEngine(config, vllm_config, device, model)`` with
``init_transfer_engine``, ``start_weight_update()``, ``finish_weight_update()``,
``receive_weights(update_info)``, ``shutdown``, static ``trainer_send_weights``; and
``TrainerWeightTransferEngine`` with the classmethod ``trainer_init(config, init_info, *, client,
source)`` and ``send_weights()``. The updates run the engines in real processes: workers execute
the lifecycle calls a client sends them (as vLLM's worker does for ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``), with vLLM's layerwise-reload functions replaced by
recorders, since they need vLLM.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
from dataclasses import asdict, fields
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.vllm_backend import (  # noqa: E402
    ENGINE_LIFECYCLE, VLLM_BASES, OrchestrlTrainerInitInfo, OrchestrlTrainerWeightTransferEngine,
    OrchestrlUpdateInfo, OrchestrlWeightTransferEngine, checkpoint_receivers)

ENGINE = {  # method -> leading parameter names (base.py at 02f250b0)
    "__init__": ["self", "config", "vllm_config"],
    "init_transfer_engine": ["self", "init_info"],
    "start_weight_update": ["self"],
    "finish_weight_update": ["self"],
    "receive_weights": ["self", "update_info"],
    "update_weights": ["self", "update_info"],
    "shutdown": ["self"],
    "trainer_send_weights": ["iterator", "trainer_args"],
    "parse_init_info": ["self", "init_dict"],
    "parse_update_info": ["self", "update_dict"],
}
TRAINER = {"trainer_init": ["config", "init_info", "client", "source"], "send_weights": ["self"], "shutdown": ["self"]}


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _vllm_config(rank: int = 0, tp: int = 1):
    return SimpleNamespace(parallel_config=SimpleNamespace(rank=rank, world_size=tp, tensor_parallel_size=tp,
                                                           data_parallel_index=0),
                           model_config=SimpleNamespace(name="model-config"))


def test_the_engines_have_vllms_interface():
    if VLLM_BASES:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        assert issubclass(OrchestrlWeightTransferEngine, WeightTransferEngine)
        assert not getattr(OrchestrlWeightTransferEngine, "__abstractmethods__", set())
    assert ENGINE_LIFECYCLE or VLLM_BASES  # the stand-in follows vLLM >= 0.25
    for name, params in ENGINE.items():
        assert _params(getattr(OrchestrlWeightTransferEngine, name))[:len(params)] == params, name
    assert isinstance(inspect.getattr_static(OrchestrlWeightTransferEngine, "trainer_send_weights"), staticmethod)
    assert isinstance(inspect.getattr_static(OrchestrlTrainerWeightTransferEngine, "trainer_init"), classmethod)
    sig = inspect.signature(OrchestrlTrainerWeightTransferEngine.trainer_init)
    assert list(sig.parameters)[:2] == TRAINER["trainer_init"][:2]
    assert all(sig.parameters[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("client", "source"))
    assert _params(OrchestrlTrainerWeightTransferEngine.send_weights) == TRAINER["send_weights"]
    rank = {f.name: f for f in fields(OrchestrlTrainerInitInfo)}["rank"]
    assert rank.kw_only  # vLLM's TrainerInitInfo: the rank is given explicitly, by keyword
    engine = OrchestrlWeightTransferEngine(SimpleNamespace(backend="orchestrl"), _vllm_config(), torch.device("cpu"),
                                           torch.nn.Linear(2, 2))
    info = engine.parse_update_info(asdict(OrchestrlUpdateInfo(step=3)))
    assert (info.step, info.is_checkpoint_format) == (3, None)
    with pytest.raises(ValueError, match="Invalid init_info"):
        engine.parse_init_info({"store_host": "h"})  # no port


# -- real updates: trainer ranks with the trainer engine, workers with the worker engine --------------------------

class StoreClient:
    """A ``VLLMWeightSyncClient`` whose calls reach the workers through a TCPStore (vLLM uses HTTP or Ray RPC).

    Each call is numbered; every worker runs it and answers; the call returns when all did, and raises
    the first worker error.
    """

    def __init__(self, port: int, workers: int) -> None:
        from orchestrl.collectives.store import tcp_store

        self.store = tcp_store("127.0.0.1", port, is_master=False, timeout_s=60)
        self.workers = workers
        self.seq = 0
        self.calls: list[str] = []

    def _call(self, method: str, payload=None) -> None:
        self.seq += 1
        self.calls.append(method)
        self.store.set(f"cmd/{self.seq}", json.dumps([method, payload]))
        for w in range(self.workers):
            answer = self.store.get(f"ack/{self.seq}/{w}").decode()
            if answer != "ok":
                raise RuntimeError(f"worker {w}: {answer}")

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call("init", init_info)

    def start_weight_update(self) -> None:
        self._call("start")

    def update_weights(self, update_info: dict) -> None:
        self._call("update", update_info)

    def finish_weight_update(self) -> None:
        self._call("finish")

    def pause_generation(self) -> None:
        self.calls.append("pause")

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")

    def resume_generation(self) -> None:
        self.calls.append("resume")


class _Source:
    """A ``WeightSource``: a fresh pass over this rank's shards each round (values change with the round)."""

    def __init__(self, sch, rank: int) -> None:
        self.sch, self.rank, self.round = sch, rank, 0

    def __iter__(self):
        from orchestrl.collectives.emulation.model import synthetic_local

        self.round += 1
        for i, p in enumerate(self.sch.params):
            runs = self.sch.initial_runs(self.rank, i)
            if runs is not None:
                yield p.source_name, synthetic_local(p, i, runs, seed=self.round)


class _Model(torch.nn.Module):
    """What the worker engine loads into: vLLM's parameters (in place) or its ``load_weights`` (checkpoint)."""

    def __init__(self, shapes: dict) -> None:
        super().__init__()
        for n, (shape, dtype) in shapes.items():
            self.register_parameter(n.replace(".", "__"), torch.nn.Parameter(torch.zeros(shape, dtype=dtype),
                                                                             requires_grad=False))
        self.loaded: dict = {}

    def named_parameters(self, *a, **k):  # vLLM's names contain dots
        for n, p in super().named_parameters(*a, **k):
            yield n.replace("__", "."), p

    def load_weights(self, weights) -> None:
        for n, w in weights:
            self.loaded[n] = w.clone()


def _install_reload_recorder(events: list) -> None:
    """vLLM's ``vllm.model_executor.model_loader.reload`` where vLLM is absent: records each call."""
    names = ["vllm", "vllm.model_executor", "vllm.model_executor.model_loader", "vllm.model_executor.model_loader.reload"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    mod = sys.modules[names[-1]]
    mod.initialize_layerwise_reload = lambda model: events.append(("initialize", type(model).__name__))
    mod.finalize_layerwise_reload = lambda model, cfg: events.append(("finalize", type(model).__name__, cfg.name))


def _rank(rank: int, port: int, ctl_port: int, schedule_json, checkpoint: bool, rounds: int) -> dict:
    from orchestrl.collectives.codec import TORCH_DTYPES
    from orchestrl.collectives.emulation.model import synthetic_local
    from orchestrl.collectives.schedule import Schedule
    from orchestrl.collectives.store import tcp_store

    torch.set_num_threads(1)
    sch = Schedule.from_json(schedule_json)
    t, g = sch.trainer.world_size, sch.generator.world_size
    if rank < t:
        client = StoreClient(ctl_port, g) if rank == 0 else None
        init = OrchestrlTrainerInitInfo("127.0.0.1", port, schedule=sch if rank == 0 else None, backend="gloo",
                                        timeout_s=20, checkpoint_format=checkpoint, coords=sch.trainer.coords(rank),
                                        rank=rank)
        engine = OrchestrlTrainerWeightTransferEngine.trainer_init({"backend": "orchestrl"}, init, client=client,
                                                                   source=_Source(sch, rank))
        for _ in range(rounds):
            engine.send_weights()
        engine.shutdown()
        if rank == 0:
            client._call("shutdown")
            return {"calls": client.calls}
        return {}
    w = rank - t
    events: list = []
    _install_reload_recorder(events)
    shapes = {p.name: (sch.local_shape(rank, i), TORCH_DTYPES[p.dtype]) for i, p in enumerate(sch.params)
              if not checkpoint and sch.local_shape(rank, i) is not None}
    model = _Model(shapes)  # the two workers of one TP2 engine (checkpoint format: each gets whole tensors)
    engine = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(rank=w, tp=2), torch.device("cpu"),
                                           model)
    ctl = tcp_store("127.0.0.1", ctl_port, is_master=False, timeout_s=60)
    bad_rounds: list = []
    seq = 0
    while True:
        seq += 1
        method, payload = json.loads(ctl.get(f"cmd/{seq}"))
        if method == "shutdown":
            ctl.set(f"ack/{seq}/{w}", "ok")
            break
        try:
            if method == "init":
                engine.init_transfer_engine(engine.parse_init_info(payload))
            elif method == "start":
                engine.start_weight_update()
            elif method == "update":
                engine.update_weights(payload)
                got = model.loaded if checkpoint else dict(model.named_parameters())
                want = {p.name: synthetic_local(p, i, sch.runs(rank, i), seed=payload["step"])
                        for i, p in enumerate(sch.params) if sch.runs(rank, i) is not None}
                bad = [n for n in want if n not in got or not torch.equal(got[n].reshape(-1).view(torch.uint8),
                                                                          want[n].reshape(-1).view(torch.uint8))]
                if bad or len(want) != len(sch.params):
                    bad_rounds.append((payload["step"], bad[:3], len(want)))
            elif method == "finish":
                engine.finish_weight_update()
            ctl.set(f"ack/{seq}/{w}", "ok")
        except Exception as exc:  # noqa: BLE001 -- sent to the client, as vLLM's RPC does
            ctl.set(f"ack/{seq}/{w}", f"{type(exc).__name__}: {exc}")
    engine.shutdown()
    return {"bad": bad_rounds, "events": events}


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpoint-format", "in-place"])
def test_updates_run_through_vllms_lifecycle_on_both_engines(checkpoint):
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.emulation.ports import free_port
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.collectives.store import tcp_store

    gen = checkpoint_receivers([(1, 2)]) if checkpoint else GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2)
    sch = plan_weight_sync(synthetic_model(1 << 20, hidden=64), TrainerLayout(tp=2), gen, FabricLinks(nic_bps=1e9),
                           chunk_bytes=64 << 10)
    port, ctl_port = free_port(), free_port()
    ctl = tcp_store("127.0.0.1", ctl_port, is_master=True, timeout_s=60)  # the client's channel (vLLM's RPC here)
    with RankGroup(_rank, [(r, port, ctl_port, sch.to_json(), checkpoint, 2) for r in range(4)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * 4) as g:
        results = g.join(120)
    del ctl
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    per_update = ["pause", "start", "update", "finish", "reset_prefix_cache", "resume"]
    assert results[0].value["calls"] == ["init"] + per_update * 2 + ["shutdown"]
    for r in results[2:]:
        assert r.value["bad"] == [], r.value["bad"]  # both updates' values arrived, every parameter
        reload = [("initialize", "_Model"), ("finalize", "_Model", "model-config")] * 2
        assert r.value["events"] == (reload if checkpoint else [])  # layerwise reload only for checkpoint format


def _old_api_rank(rank: int, port: int, schedule_json) -> dict:
    """vLLM 0.22-0.24's call shapes: ``trainer_send_weights`` and ``receive_weights(update_info, load_weights)``."""
    from orchestrl.collectives.emulation.model import synthetic_local
    from orchestrl.collectives.schedule import Schedule

    torch.set_num_threads(1)
    sch = Schedule.from_json(schedule_json)
    t = sch.trainer.world_size
    if rank < t:
        local = {p.source_name: synthetic_local(p, i, sch.initial_runs(rank, i)) for i, p in enumerate(sch.params)
                 if sch.initial_runs(rank, i) is not None}
        OrchestrlWeightTransferEngine.trainer_send_weights(
            iter(local.items()), {"store_host": "127.0.0.1", "store_port": port, "rank": rank, "backend": "gloo",
                                  "schedule": sch if rank == 0 else None, "coords": sch.trainer.coords(rank)})
        return {}
    engine = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(rank=rank - t), torch.device("cpu"),
                                           None)
    engine.init_transfer_engine(engine.parse_init_info({"store_host": "127.0.0.1", "store_port": port,
                                                        "backend": "gloo"}))
    got: dict = {}
    engine.receive_weights(engine.parse_update_info({"step": 0, "is_checkpoint_format": True}),
                           lambda batch: got.update({n: w.clone() for n, w in batch}))
    engine.shutdown()
    want = {p.name: synthetic_local(p, i, sch.runs(rank, i)) for i, p in enumerate(sch.params)}
    return {"ok": sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)}


def test_vllm_0_22_call_shapes_still_work():
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.emulation.ports import free_port
    from orchestrl.collectives.layout import FabricLinks, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync

    sch = plan_weight_sync(synthetic_model(1 << 19, hidden=64), TrainerLayout(tp=2), checkpoint_receivers([(1, 1)]),
                           FabricLinks(nic_bps=1e9), chunk_bytes=64 << 10)
    port = free_port()
    with RankGroup(_old_api_rank, [(r, port, sch.to_json()) for r in range(3)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * 3) as g:
        results = g.join(120)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert results[2].value["ok"]


def test_checkpoint_format_with_a_sharded_schedule_is_refused_with_the_fix():
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.fabric.errors import ConfigError

    sch = plan_weight_sync(synthetic_model(1 << 16, hidden=16), TrainerLayout(tp=2),
                           GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2), FabricLinks(nic_bps=1e9))
    engine = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(tp=2), torch.device("cpu"),
                                           torch.nn.Linear(2, 2))
    engine._sync = SimpleNamespace(schedule=sch, rank=2, receive=lambda load, into=None: None)
    with pytest.raises(ConfigError, match="checkpoint_receivers"):
        engine.receive_weights(OrchestrlUpdateInfo())
    engine._checkpoint = False
    with pytest.raises(ConfigError, match="initialised with checkpoint_format=False"):
        engine.receive_weights(OrchestrlUpdateInfo(is_checkpoint_format=True))


def test_a_worker_in_the_wrong_tp_place_is_refused_naming_both_places():
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.fabric.errors import ConfigError

    sch = plan_weight_sync(synthetic_model(1 << 16, hidden=16), TrainerLayout(tp=2),
                           GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2), FabricLinks(nic_bps=1e9))
    engine = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(rank=0, tp=4), torch.device("cpu"),
                                           None)
    with pytest.raises(ConfigError, match="TP rank 0 of 2 in the schedule, but this worker is TP rank 0 of 4"):
        engine._check_layout(sch, 0)
    with pytest.raises(ConfigError, match="TP rank 1 of 2 in the schedule, but this worker is TP rank 0 of 4"):
        engine._check_layout(sch, 1)
    engine2 = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(rank=1, tp=2), torch.device("cpu"),
                                            None)
    engine2._check_layout(sch, 1)  # the right place: accepted


def test_trainer_rank_0_without_a_client_is_refused_with_the_fix():
    from orchestrl.fabric.errors import ConfigError

    init = OrchestrlTrainerInitInfo("127.0.0.1", 1, backend="gloo", rank=0)
    with pytest.raises(ConfigError, match="client.*is None on trainer rank 0"):
        OrchestrlTrainerWeightTransferEngine.trainer_init({"backend": "orchestrl"}, init, client=None, source=[])


def test_shards_planned_for_another_tp_size_are_refused_at_the_update():
    """The worker's TP size is checked again when an update asks for shards (vLLM 0.22-0.24 choose the format
    per update, so the check at init may not have run)."""
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.fabric.errors import ConfigError

    sch = plan_weight_sync(synthetic_model(1 << 16, hidden=16), TrainerLayout(tp=2),
                           GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2), FabricLinks(nic_bps=1e9))
    engine = OrchestrlWeightTransferEngine({"backend": "orchestrl"}, _vllm_config(rank=0, tp=1), torch.device("cpu"),
                                           None)
    engine._sync = SimpleNamespace(schedule=sch, rank=2, receive=lambda load, into=None: None)
    engine._checkpoint = False
    with pytest.raises(ConfigError, match="TP rank 0 of 2 in the schedule, but this worker is TP rank 0 of 1"):
        engine.receive_weights(OrchestrlUpdateInfo(), lambda batch: None)


def test_update_engine_weights_drives_an_async_llm_in_vllms_order_and_stays_paused_after_a_failure(monkeypatch):
    """The driver's calls on an ``AsyncLLM``-shaped engine (vLLM's method names; ``WeightTransferUpdateRequest``
    stood in where vLLM is absent): pause, start, update, finish, reset the prefix cache, resume; the format goes
    to ``start_weight_update`` only where it takes one (vLLM 0.22-0.24); a failing update is not resumed."""
    import asyncio
    from dataclasses import dataclass, field

    from orchestrl.collectives.vllm_backend import update_engine_weights

    if not VLLM_BASES:
        @dataclass
        class WeightTransferUpdateRequest:
            update_info: dict = field(default_factory=dict)

        for n in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer",
                  "vllm.distributed.weight_transfer.base"):
            monkeypatch.setitem(sys.modules, n, sys.modules.get(n) or types.ModuleType(n))
        monkeypatch.setattr(sys.modules["vllm.distributed.weight_transfer.base"], "WeightTransferUpdateRequest",
                            WeightTransferUpdateRequest, raising=False)

    class Engine:
        def __init__(self, old: bool, fail: bool = False) -> None:
            self.calls, self.fail = [], fail
            if old:  # vLLM 0.22-0.24: the format is given at start
                async def start_weight_update(is_checkpoint_format: bool = True) -> None:
                    self.calls.append(("start", is_checkpoint_format))
                self.start_weight_update = start_weight_update

        async def pause_generation(self):
            self.calls.append("pause")

        async def start_weight_update(self):
            self.calls.append(("start",))

        async def update_weights(self, request):
            self.calls.append(("update", request.update_info))
            if self.fail:
                raise RuntimeError("a trainer rank died")

        async def finish_weight_update(self):
            self.calls.append("finish")

        async def reset_prefix_cache(self):
            self.calls.append("reset_prefix_cache")

        async def resume_generation(self):
            self.calls.append("resume")

    new, old = Engine(old=False), Engine(old=True)
    asyncio.run(update_engine_weights(new, step=7))
    asyncio.run(update_engine_weights(old, step=7))
    update = ("update", {"step": 7, "is_checkpoint_format": None})
    assert new.calls == ["pause", ("start",), update, "finish", "reset_prefix_cache", "resume"]
    assert old.calls == ["pause", ("start", True), update, "finish", "reset_prefix_cache", "resume"]
    failing = Engine(old=False, fail=True)
    with pytest.raises(RuntimeError, match="a trainer rank died"):
        asyncio.run(update_engine_weights(failing))
    assert failing.calls[-1][0] == "update" and "resume" not in failing.calls  # stays paused: weights may be torn
