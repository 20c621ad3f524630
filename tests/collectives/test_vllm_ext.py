"""The vLLM worker extension: target checks (anywhere) and a sync into a running engine (GPU + vLLM only)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout  # noqa: E402
from orchestrl.collectives.plan import plan_weight_sync  # noqa: E402
from orchestrl.collectives.sharding import Sharding  # noqa: E402
from orchestrl.collectives.vllm_ext import engine_targets, vllm_unavailable  # noqa: E402
from orchestrl.fabric.errors import ConfigError  # noqa: E402

needs_vllm = pytest.mark.skipif(vllm_unavailable() is not None, reason=f"vLLM extension {vllm_unavailable()}")


def _engine_schedule():
    params = [ParamSpec("model.layers.0.mlp.gate_up_proj.weight", (8, 4), "bfloat16", tp_dim=0,
                        engine=Sharding.fused(4, 4)),
              ParamSpec("model.norm.weight", (4,), "bfloat16"),
              ParamSpec("model.layers.0.mlp.experts.w2_weight[3]", (4, 4), "bfloat16", tp_dim=1, expert=3,
                        num_experts=4)]
    gen = GeneratorLayout(tuple(GeneratorRank(1, 2, j, ep_size=2, ep_rank=j) for j in range(2)))
    return plan_weight_sync(params, TrainerLayout(), gen, FabricLinks(nic_bps=1e9))


def test_engine_targets_refuse_a_parameter_of_another_dtype():
    """The worker extension writes into the engine's own tensors: a dtype mismatch must stop it, not garble it."""
    sch = _engine_schedule()
    engine = {"model.layers.0.mlp.gate_up_proj.weight": torch.zeros(4, 4, dtype=torch.float16),
              "model.norm.weight": torch.zeros(4, dtype=torch.bfloat16),
              "model.layers.0.mlp.experts.w2_weight": torch.zeros(2, 4, 4, dtype=torch.bfloat16)}
    with pytest.raises(ConfigError, match="gate_up_proj.*torch.float16 tensor but the parameter is bfloat16"):
        engine_targets(sch, sch.generator_rank(1), engine, torch.device("cpu"))


def test_engine_targets_find_stacked_experts_and_refuse_a_slice_without_a_home():
    sch = _engine_schedule()
    rank = sch.generator_rank(1)  # expert-parallel rank 1 holds experts 2 and 3: expert 3 is local slice 1
    stacked = torch.zeros(2, 4, 4, dtype=torch.bfloat16)
    engine = {"model.layers.0.mlp.gate_up_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
              "model.norm.weight": torch.zeros(4, dtype=torch.bfloat16),
              "model.layers.0.mlp.experts.w2_weight": stacked}
    got = engine_targets(sch, rank, engine, torch.device("cpu"))
    assert got[2][0].data_ptr() == stacked[1].data_ptr()
    del engine["model.layers.0.mlp.gate_up_proj.weight"]
    with pytest.raises(ConfigError, match="cannot go through load_weights"):
        engine_targets(sch, rank, engine, torch.device("cpu"))

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def _trainer(schedule_json, port):
    from orchestrl.collectives.emulation.model import synthetic_region
    from orchestrl.collectives.schedule import Schedule
    from orchestrl.collectives.weight_sync import WeightSync

    sch = Schedule.from_json(schedule_json)
    sync = WeightSync.connect(sch, "127.0.0.1", port, 0, timeout_s=120)
    return sync.send({p.name: synthetic_region(p, i, 0, p.split_extent) for i, p in enumerate(sch.params)}).verified


@needs_vllm
def test_receive_into_a_running_vllm_engine(tmp_path):
    import torch
    from vllm import LLM

    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.runner import free_port
    from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync

    (tmp_path / "config.json").write_text(json.dumps(_TINY_LLAMA))
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              gpu_memory_utilization=0.2, max_model_len=128,
              worker_extension_cls="orchestrl.collectives.vllm_ext.WeightSyncWorkerExtension")
    (specs,) = llm.collective_rpc("orchestrl_param_specs")
    params = [ParamSpec(name, tuple(shape), dtype) for name, shape, dtype in specs]
    sch = plan_weight_sync(params, TrainerLayout(), GeneratorLayout.uniform(pods=(1,), ranks_per_pod=1),
                           FabricLinks(nic_bps=1e9))
    port = free_port()
    with RankGroup(_trainer, [(sch.to_json(), port)], env=[{"GLOO_SOCKET_IFNAME": "lo"}]) as trainer:
        llm.collective_rpc("orchestrl_join", args=(None, "127.0.0.1", port, 0, "gloo", 120.0))
        (report,) = llm.collective_rpc("orchestrl_receive")
        (sent,) = trainer.join(120)
    assert sent.ok and sent.value, sent.error
    assert report["verified"] and report["params_loaded"] == len(params)
    (digests,) = llm.collective_rpc("orchestrl_weight_digest")
    from orchestrl.collectives.emulation.model import synthetic_region
    for i, p in enumerate(params):
        want = synthetic_region(p, i, 0, p.split_extent)
        assert digests[p.name] == int(want.reshape(-1).view(torch.uint8).to(torch.int64).sum())
