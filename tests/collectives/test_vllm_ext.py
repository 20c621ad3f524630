"""The vLLM worker extension receives a sync into a running engine (GPU machines with vLLM only)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from collectives.vllm_ext import vllm_unavailable  # noqa: E402

pytestmark = pytest.mark.skipif(vllm_unavailable() is not None, reason=f"vLLM extension {vllm_unavailable()}")

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def _trainer(schedule_json, port):
    from collectives.emulation.model import synthetic_region
    from collectives.schedule import Schedule
    from collectives.transport.torch_dist import TorchTransport
    from collectives.weight_sync import WeightSync

    sch = Schedule.from_json(schedule_json)
    sync = WeightSync(sch, TorchTransport.connect("127.0.0.1", port, 0, sch.world_size, timeout_s=120), timeout_s=120)
    return sync.send({p.name: synthetic_region(p, i, 0, p.split_extent) for i, p in enumerate(sch.params)}).verified


def test_receive_into_a_running_vllm_engine(tmp_path):
    import torch
    from vllm import LLM

    from collectives.emulation.launch import RankGroup
    from collectives.emulation.runner import free_port
    from collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
    from collectives.plan import plan_weight_sync

    (tmp_path / "config.json").write_text(json.dumps(_TINY_LLAMA))
    llm = LLM(model=str(tmp_path), load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              gpu_memory_utilization=0.2, max_model_len=128,
              worker_extension_cls="collectives.vllm_ext.WeightSyncWorkerExtension")
    (specs,) = llm.collective_rpc("orchestrl_param_specs")
    params = [ParamSpec(name, tuple(shape), dtype) for name, shape, dtype in specs]
    sch = plan_weight_sync(params, TrainerLayout(), GeneratorLayout.uniform(pods=(1,), ranks_per_pod=1),
                           FabricLinks(nic_bps=1e9))
    port = free_port()
    with RankGroup(_trainer, [(sch.to_json(), port)], env=[{"GLOO_SOCKET_IFNAME": "lo"}]) as trainer:
        llm.collective_rpc("orchestrl_join", args=(sch.to_json(), "127.0.0.1", port, 0, "gloo", 120.0))
        (report,) = llm.collective_rpc("orchestrl_receive")
        (sent,) = trainer.join(120)
    assert sent.ok and sent.value, sent.error
    assert report["verified"] and report["params_loaded"] == len(params)
    (digests,) = llm.collective_rpc("orchestrl_weight_digest")
    from collectives.emulation.model import synthetic_region
    for i, p in enumerate(params):
        want = synthetic_region(p, i, 0, p.split_extent)
        assert digests[p.name] == int(want.reshape(-1).view(torch.uint8).to(torch.int64).sum())
