"""The vLLM weight-transfer backend: its contract with vLLM's interface, and real rounds through it.

vLLM (a CUDA build) does not install on these machines, so the contract is checked against vLLM's
own classes where vLLM imports and against the documented signatures otherwise (vLLM's
``vllm/distributed/weight_transfer/base.py``: ``WeightTransferEngine`` with ``init_transfer_engine``,
``receive_weights(update_info, load_weights)``, ``shutdown``, static
``trainer_send_weights(iterator, trainer_args)``, the ``parse_init_info``/``parse_update_info`` dict
parsers, and ``WeightTransferUpdateInfo``'s keyword-only ``is_checkpoint_format``). The rounds run
the backend in real generator processes, driven as a vLLM worker drives it.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, fields
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.vllm_backend import (  # noqa: E402
    VLLM_BASES, OrchestrlUpdateInfo, OrchestrlWeightTransferEngine, checkpoint_receivers)

DOCUMENTED = {  # method -> parameter names (vLLM base.py, commit aa1cd966f0c8e8ee5520457758b08000d6415cd6)
    "init_transfer_engine": ["self", "init_info"],
    "receive_weights": ["self", "update_info", "load_weights"],
    "shutdown": ["self"],
    "trainer_send_weights": ["iterator", "trainer_args"],
    "parse_init_info": ["self", "init_dict"],
    "parse_update_info": ["self", "update_dict"],
}


def test_the_engine_has_vllms_interface():
    if VLLM_BASES:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        assert issubclass(OrchestrlWeightTransferEngine, WeightTransferEngine)
        assert not getattr(OrchestrlWeightTransferEngine, "__abstractmethods__", set())
    for name, params in DOCUMENTED.items():
        assert list(inspect.signature(getattr(OrchestrlWeightTransferEngine, name)).parameters)[:len(params)] == params
    assert isinstance(inspect.getattr_static(OrchestrlWeightTransferEngine, "trainer_send_weights"), staticmethod)
    update = {f.name: f for f in fields(OrchestrlUpdateInfo)}
    assert update["is_checkpoint_format"].kw_only and update["is_checkpoint_format"].default is True
    engine = OrchestrlWeightTransferEngine(SimpleNamespace(backend="orchestrl"), SimpleNamespace(rank=0))
    info = engine.parse_update_info(asdict(OrchestrlUpdateInfo(step=3, is_checkpoint_format=False)))
    assert (info.step, info.is_checkpoint_format) == (3, False)
    with pytest.raises(ValueError, match="Invalid init_info"):
        engine.parse_init_info({"store_host": "h"})  # no port


def _rank(rank: int, port: int, schedule_json, checkpoint: bool) -> dict:
    from orchestrl.collectives.emulation.model import synthetic_local
    from orchestrl.collectives.schedule import Schedule

    torch.set_num_threads(1)
    sch = Schedule.from_json(schedule_json)
    t = sch.trainer.world_size
    if rank < t:
        local = {p.source_name: synthetic_local(p, i, sch.initial_runs(rank, i)) for i, p in enumerate(sch.params)
                 if sch.initial_runs(rank, i) is not None}
        for _ in range(2):  # two updates on one connection
            OrchestrlWeightTransferEngine.trainer_send_weights(
                iter(local.items()), {"store_host": "127.0.0.1", "store_port": port, "rank": rank, "backend": "gloo",
                                      "schedule": sch if rank == 0 else None, "coords": sch.trainer.coords(rank)})
        return {}
    j = rank - t
    engine = OrchestrlWeightTransferEngine(SimpleNamespace(backend="orchestrl"),
                                           SimpleNamespace(rank=j, tensor_parallel_size=1 if checkpoint else 2))
    engine.init_transfer_engine(engine.parse_init_info(
        {"store_host": "127.0.0.1", "store_port": port, "rank_offset": 0, "backend": "gloo"}))
    got: dict = {}
    for step in range(2):  # what vLLM's worker does between start_ and finish_weight_update
        engine.receive_weights(engine.parse_update_info({"step": step, "is_checkpoint_format": checkpoint}),
                               lambda batch: got.update({n: w.clone() for n, w in batch}))
    engine.shutdown()
    want = {}
    for i, p in enumerate(sch.params):
        runs = sch.runs(rank, i)
        if runs is not None:
            want[p.name] = synthetic_local(p, i, runs)
    bad = [n for n in want if n not in got or not torch.equal(_bits(got[n]), _bits(want[n]))]
    return {"ok": sorted(got) == sorted(want) and not bad, "n": len(got), "bad": bad[:3],
            "shapes": [(tuple(got[n].shape), tuple(want[n].shape)) for n in bad[:2] if n in got]}


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_rounds_through_the_backend_deliver_what_load_weights_expects(checkpoint):
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.emulation.runner import free_port
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync

    gen = checkpoint_receivers([(1, 2)]) if checkpoint else GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2)
    sch = plan_weight_sync(synthetic_model(1 << 20, hidden=64), TrainerLayout(tp=2), gen, FabricLinks(nic_bps=1e9),
                           chunk_bytes=64 << 10)
    port = free_port()
    with RankGroup(_rank, [(r, port, sch.to_json(), checkpoint) for r in range(4)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * 4) as g:
        results = g.join(120)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for r in results[2:]:
        assert r.value["ok"] and r.value["n"] == len(sch.params), str(r.value)[:3000]


def test_checkpoint_format_with_a_sharded_schedule_is_refused_with_the_fix():
    from orchestrl.collectives.emulation.model import synthetic_model
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.fabric.errors import ConfigError

    sch = plan_weight_sync(synthetic_model(1 << 16, hidden=16), TrainerLayout(tp=2),
                           GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2, tp=2), FabricLinks(nic_bps=1e9))
    engine = OrchestrlWeightTransferEngine(SimpleNamespace(backend="orchestrl"),
                                           SimpleNamespace(rank=0, tensor_parallel_size=2))
    engine._sync = SimpleNamespace(schedule=sch, rank=2, receive=lambda load: None)
    with pytest.raises(ConfigError, match="checkpoint_receivers"):
        engine.receive_weights(OrchestrlUpdateInfo(is_checkpoint_format=True), lambda batch: None)
    engine.receive_weights(OrchestrlUpdateInfo(is_checkpoint_format=False), lambda batch: None)  # shards: fine
