"""Against the real megatron-core package: its rank order, and a TP=2 model synced into vLLM layouts.

Skipped where megatron-core is not installed (it is in the ``comms`` extra; it installs on CPU).
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")
ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed (comms extra)")

from orchestrl.collectives.layout import GeneratorLayout, GeneratorRank, TrainerLayout  # noqa: E402
from orchestrl.fabric.layout import ParallelLayout, parallel_groups  # noqa: E402

HIDDEN, HEADS, GROUPS, FFN, VOCAB, LAYERS = 64, 8, 2, 96, 250, 2
PADDED_VOCAB = 256  # Megatron pads 250 to a multiple of 128 x TP 2


@pytest.mark.parametrize("tp,cp,ep,dp,pp,order,expert_tp", [
    (2, 1, 1, 2, 2, "tp-cp-ep-dp-pp", None),
    (2, 2, 1, 2, 1, "tp-cp-ep-dp-pp", None),
    (2, 1, 4, 4, 2, "tp-cp-ep-dp-pp", 1),
    (4, 1, 2, 2, 1, "tp-cp-ep-dp-pp", 2),
    (2, 1, 1, 2, 2, "tp-pp-dp", None),
    (2, 1, 1, 2, 2, "tp-cp-ep-pp-dp", None),
])
def test_rank_order_matches_megatron_cores_rank_generator(tp, cp, ep, dp, pp, order, expert_tp):
    world = tp * cp * dp * pp
    etp = expert_tp or tp
    dense = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = ps.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    ours = parallel_groups(ParallelLayout(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, order=order, expert_tp=expert_tp),
                           range(world))
    for kind, gen, token in [("tp", dense, "tp"), ("pp", dense, "pp"), ("dp", dense, "dp"), ("cp", dense, "cp"),
                             ("dp-cp", dense, "dp-cp"), ("ep", expert, "ep"), ("expert-tp", expert, "tp"),
                             ("tp-ep", expert, "tp-ep"), ("expert-dp", expert, "dp")]:
        assert ours[kind] == gen.get_ranks(token), kind
    lay = TrainerLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, expert_tp=expert_tp, order=order)
    for grp, rank in itertools.product(dense.get_ranks("tp"), range(tp)):
        assert lay.tp_rank(grp[rank]) == rank
    for grp, stage in itertools.product(dense.get_ranks("pp"), range(pp)):
        assert lay.pp_rank(grp[stage]) == stage
    for grp, rank in itertools.product(expert.get_ranks("ep"), range(ep)):
        assert lay.ep_rank(grp[rank]) == rank
    for grp, rank in itertools.product(expert.get_ranks("tp"), range(etp)):
        assert lay.expert_tp_rank(grp[rank]) == rank


def _megatron_model():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                            ffn_hidden_size=FFN, use_cpu_initialization=True, gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, add_bias_linear=False, normalization="RMSNorm",
                            params_dtype=torch.bfloat16, bf16=True)
    torch.manual_seed(1234)  # the same master weights on both ranks; each keeps its own shard
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=PADDED_VOCAB, max_sequence_length=64, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    return cfg, model


def _truth(model) -> dict:
    """What this rank's shards mean, read through megatron-core's own code (not the library's)."""
    out = {"layers": []}
    eye = torch.eye(HIDDEN, dtype=torch.bfloat16).unsqueeze(1)  # [seq=hidden, batch=1, hidden]
    with torch.no_grad():
        for layer in model.decoder.layers:
            q, k, v = layer.self_attention.get_query_key_value_tensors(eye)[:3]  # [hidden, 1, heads, head_dim]
            rows = [t[:, 0].permute(1, 2, 0).reshape(-1, HIDDEN) for t in (q, k, v)]  # weight rows, head order
            gate, up = torch.chunk(layer.mlp.linear_fc1.weight, 2, dim=0)  # as MLP's glu() splits fc1's output
            out["layers"].append({"q": rows[0], "k": rows[1], "v": rows[2], "gate": gate.clone(), "up": up.clone(),
                                  "proj": layer.self_attention.linear_proj.weight.clone(),
                                  "fc2": layer.mlp.linear_fc2.weight.clone(),
                                  "norm1": layer.input_layernorm.weight.clone(),
                                  "norm2": layer.pre_mlp_layernorm.weight.clone()})
    emb = model.embedding.word_embeddings
    out["vocab_rows"] = (emb.vocab_start_index, emb.vocab_end_index)
    out["embed"] = emb.weight.detach().clone()
    out["head"] = model.output_layer.weight.detach().clone()
    out["final_norm"] = model.decoder.final_layernorm.weight.detach().clone()
    return out


def _rank(rank: int, dist_port: int, sync_port: int, generator_json) -> dict:
    from orchestrl.collectives.emulation.runner import _exchange_rank

    if rank >= 2:
        return _exchange_rank(None, rank, sync_port, {}, 60.0, None, False)
    import torch.distributed as dist

    from orchestrl.collectives.layout import FabricLinks
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.collectives.specs import ModelShape, megatron_specs
    from orchestrl.collectives.weight_sync import WeightSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{dist_port}", rank=rank, world_size=2)
    ps.initialize_model_parallel(2, 1)
    cfg, model = _megatron_model()
    specs = megatron_specs(model.named_parameters(), ModelShape.from_megatron(cfg, VOCAB), tp_size=2)
    schedule = None
    if rank == 0:  # plans once; WeightSync.connect hands the schedule to every other rank
        schedule = plan_weight_sync(specs, TrainerLayout(tp=2), GeneratorLayout.from_json(generator_json),
                                    FabricLinks(nic_bps=1e9), chunk_bytes=16 << 10)
    sync = WeightSync.connect(schedule, "127.0.0.1", sync_port, rank, timeout_s=60, join_timeout_s=60)
    report = sync.send(model.named_parameters())
    return {"specs": [p.to_json() for p in specs], "truth": _truth(model), "verified": report.verified}


def test_a_megatron_core_tp2_model_arrives_in_vllm_tp1_and_tp4_engines():
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.runner import free_port

    gen = GeneratorLayout((GeneratorRank(1),) + tuple(GeneratorRank(2, 4, j) for j in range(4)))
    dist_port, sync_port = free_port(), free_port()
    with RankGroup(_rank, [(r, dist_port, sync_port, gen.to_json()) for r in range(7)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * 7) as g:
        results = g.join(240)
    bad = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not bad, bad
    t0, t1 = results[0].value, results[1].value
    assert t0["specs"] == t1["specs"]  # every rank describes the same model
    truth = (t0["truth"], t1["truth"])
    bf16 = torch.bfloat16

    def cat(key, layer, dim=0):
        return torch.cat([truth[k]["layers"][layer][key] for k in range(2)], dim=dim)

    def real_rows(key):  # the true vocabulary: each rank's rows below VOCAB, in vocabulary order
        parts = []
        for k in range(2):
            start, end = truth[k]["vocab_rows"]
            parts.append(truth[k][key][:max(0, min(end, VOCAB) - start)])
        return torch.cat(parts)

    canon = {"model.embed_tokens.weight": real_rows("embed"), "lm_head.weight": real_rows("head"),
             "model.norm.weight": truth[0]["final_norm"].to(bf16)}
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}."
        canon[pre + "self_attn.qkv_proj.weight"] = (cat("q", layer), cat("k", layer), cat("v", layer))
        canon[pre + "mlp.gate_up_proj.weight"] = (cat("gate", layer), cat("up", layer))
        canon[pre + "self_attn.o_proj.weight"] = cat("proj", layer, dim=1)
        canon[pre + "mlp.down_proj.weight"] = cat("fc2", layer, dim=1)
        canon[pre + "input_layernorm.weight"] = truth[0]["layers"][layer]["norm1"].to(bf16)  # fp32 in Megatron
        canon[pre + "post_attention_layernorm.weight"] = truth[0]["layers"][layer]["norm2"].to(bf16)

    def vllm_shard(name: str, tp: int, j: int) -> torch.Tensor:
        """vLLM's local tensor on TP rank j of tp, from the canonical tensors (its loaders' rules)."""
        value = canon[name]
        if name.endswith("qkv_proj.weight"):
            q, k, v = value
            head_dim = q.shape[0] // HEADS
            kv = j // max(1, tp // GROUPS)  # QKVParallelLinear: kv shard = tp_rank // replicas
            kv_rows = max(1, GROUPS // tp) * head_dim
            q_rows = HEADS // tp * head_dim
            return torch.cat([q[j * q_rows:(j + 1) * q_rows], k[kv * kv_rows:(kv + 1) * kv_rows],
                              v[kv * kv_rows:(kv + 1) * kv_rows]])
        if name.endswith("gate_up_proj.weight"):
            gate, up = value
            n = gate.shape[0] // tp
            return torch.cat([gate[j * n:(j + 1) * n], up[j * n:(j + 1) * n]])
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            n = value.shape[1] // tp
            return value[:, j * n:(j + 1) * n]
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):  # padded to 64, split evenly
            padded = torch.cat([value, torch.zeros(-(-VOCAB // 64) * 64 - VOCAB, HIDDEN, dtype=bf16)])
            n = padded.shape[0] // tp
            return padded[j * n:(j + 1) * n]
        return value

    for j, (tp, rank) in enumerate([(1, 0)] + [(4, k) for k in range(4)]):
        r = results[2 + j]
        assert r.value["report"]["verified"]
        got = r.value["received"]
        assert sorted(got) == sorted(canon)
        for name in canon:
            assert torch.equal(got[name], vllm_shard(name, tp, rank)), (j, name)


def _moe_specs(port: int) -> list[dict]:
    import torch.distributed as dist
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from orchestrl.collectives.specs import ModelShape, megatron_specs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                            ffn_hidden_size=48, moe_ffn_hidden_size=16, num_moe_experts=4, moe_router_topk=2,
                            use_cpu_initialization=True, gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, add_bias_linear=False, normalization="RMSNorm",
                            params_dtype=torch.bfloat16, bf16=True)
    spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False, normalization="RMSNorm")
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=128, max_sequence_length=16,
                     position_embedding_type="rope")
    return [p.to_json() for p in megatron_specs(model.named_parameters(), ModelShape.from_megatron(cfg, 100),
                                                tp_size=1)]


def test_megatron_core_moe_experts_become_vllm_stacked_expert_specs():
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.runner import free_port
    from orchestrl.collectives.layout import ParamSpec
    from orchestrl.collectives.sharding import Sharding

    with RankGroup(_moe_specs, [(free_port(),)], env=[{"GLOO_SOCKET_IFNAME": "lo"}]) as g:
        (result,) = g.join(240)
    assert result.ok, result.error
    specs = {p.name: p for p in map(ParamSpec.from_json, result.value)}
    for e in range(4):  # SequentialMLP's local_experts.e -> FusedMoE's stacked w13_weight / w2_weight, expert e
        w13, w2 = specs[f"model.layers.0.mlp.experts.w13_weight[{e}]"], specs[f"model.layers.0.mlp.experts.w2_weight[{e}]"]
        assert (w13.expert, w13.num_experts, w13.shape, w13.tp_dim) == (e, 4, (32, 32), 0)
        assert w13.trainer == w13.engine == Sharding.fused(16, 16)  # [gate; up], each split on its own
        assert (w2.shape, w2.tp_dim) == ((32, 16), 1)
        assert w13.source == f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight"
    assert specs["model.layers.0.mlp.gate.weight"].tp_dim is None  # the router is replicated
    assert specs["lm_head.weight"].shape == (100, 32)  # Megatron's 128 padded rows -> the true vocabulary
