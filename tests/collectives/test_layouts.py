"""Real model layouts: fused, interleaved, replicated-head, padded and expert parameters arrive right.

Every expected local shard below is built by hand from the canonical tensors, the way the
framework that owns the layout builds it (Megatron-core's interleaved ``linear_qkv`` and ``[g_k; u_k]``
SwiGLU shards, vLLM's ``QKVParallelLinear`` rule ``kv shard = tp_rank // replicas``, vocabulary
padding rules), not with the library's own layout code, and the data moves through real processes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.emulation.runner import exchange  # noqa: E402
from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout  # noqa: E402
from orchestrl.collectives.plan import plan_weight_sync  # noqa: E402
from orchestrl.collectives.sharding import Sharding  # noqa: E402
from orchestrl.collectives.specs import ModelShape, state_dict_specs, vllm_layout  # noqa: E402

LINKS = FabricLinks(nic_bps=1e9)
BF16 = torch.bfloat16


def _rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(BF16)


def _received(results, schedule, gen: int) -> dict[str, torch.Tensor]:
    r = results[schedule.generator_rank(gen)]
    assert r.ok, r.error
    assert r.value["report"]["verified"]
    return r.value["received"]


def _assert_all_ok(results) -> None:
    bad = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not bad, bad


def test_megatron_swiglu_tp2_arrives_unpermuted_in_a_vllm_tp1_engine():
    inter, hidden = 8, 4
    g, u = _rand(inter, hidden, seed=1), _rand(inter, hidden, seed=2)
    half = inter // 2
    megatron = [torch.cat([g[k * half:(k + 1) * half], u[k * half:(k + 1) * half]]) for k in range(2)]  # [g_k; u_k]
    spec = ParamSpec("mlp.gate_up_proj.weight", (2 * inter, hidden), "bfloat16", tp_dim=0,
                     trainer=Sharding.fused(inter, inter), engine=Sharding.fused(inter, inter))
    sch = plan_weight_sync([spec], TrainerLayout(tp=2), GeneratorLayout((GeneratorRank(1),)), LINKS)
    results = exchange(sch, {0: {spec.name: megatron[0]}, 1: {spec.name: megatron[1]}})
    _assert_all_ok(results)
    assert torch.equal(_received(results, sch, 0)[spec.name], torch.cat([g, u]))  # vLLM TP1: [g; u]


def test_megatron_interleaved_gqa_qkv_reaches_vllm_tp4_with_replicated_kv_heads():
    heads, kv_heads, head_dim, hidden = 8, 2, 2, 4
    q = _rand(heads * head_dim, hidden, seed=3)
    k = _rand(kv_heads * head_dim, hidden, seed=4)
    v = _rand(kv_heads * head_dim, hidden, seed=5)
    per_group = heads // kv_heads * head_dim
    # Megatron-core's global linear_qkv: q heads of group g, then k_g, then v_g, group after group ...
    interleaved = torch.cat([torch.cat([q[grp * per_group:(grp + 1) * per_group],
                                        k[grp * head_dim:(grp + 1) * head_dim],
                                        v[grp * head_dim:(grp + 1) * head_dim]]) for grp in range(kv_heads)])
    megatron = interleaved.chunk(2)  # ... split evenly over TP ranks
    shape = ModelShape(heads, kv_heads, head_dim, vocab_size=16)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    tp_dim, engine = vllm_layout(name, interleaved.shape[0], shape)
    spec = ParamSpec(name, tuple(interleaved.shape), "bfloat16", tp_dim=tp_dim,
                     trainer=Sharding.interleaved(*shape.qkv_parts, groups=kv_heads), engine=engine)
    gen = GeneratorLayout((GeneratorRank(1, 4, 0), GeneratorRank(1, 4, 1), GeneratorRank(1, 4, 2),
                           GeneratorRank(1, 4, 3), GeneratorRank(2)))
    sch = plan_weight_sync([spec], TrainerLayout(tp=2), gen, LINKS)
    results = exchange(sch, {0: {name: megatron[0]}, 1: {name: megatron[1]}})
    _assert_all_ok(results)
    replicas = 4 // kv_heads
    for j in range(4):  # vLLM: q shard = tp_rank, kv shard = tp_rank // replicas
        kv = j // replicas
        want = torch.cat([q[j * 2 * head_dim:(j + 1) * 2 * head_dim], k[kv * head_dim:(kv + 1) * head_dim],
                          v[kv * head_dim:(kv + 1) * head_dim]])
        assert torch.equal(_received(results, sch, j)[name], want), j
    assert torch.equal(_received(results, sch, 4)[name], torch.cat([q, k, v]))  # TP1: [q; k; v]


def test_padded_vocabulary_moves_only_real_rows_and_lands_where_each_side_pads():
    vocab, hidden = 250, 4
    emb = _rand(vocab, hidden, seed=6)
    padded = torch.cat([emb, torch.full((6, hidden), 7.0, dtype=BF16)])  # Megatron: 250 -> 256 (128 x TP 2)
    megatron = padded.chunk(2)
    spec = ParamSpec("model.embed_tokens.weight", (vocab, hidden), "bfloat16", tp_dim=0,
                     trainer=Sharding.padded(128, per_tp=True), engine=Sharding.padded(64))
    gen = GeneratorLayout(tuple(GeneratorRank(1, 4, j) for j in range(4)))
    sch = plan_weight_sync([spec], TrainerLayout(tp=2), gen, LINKS)
    assert sch.model_bytes == vocab * hidden * 2  # padding is not part of the model
    results = exchange(sch, {0: {spec.name: megatron[0]}, 1: {spec.name: megatron[1]}})
    _assert_all_ok(results)
    vllm_padded = torch.cat([emb, torch.zeros(6, hidden, dtype=BF16)])  # vLLM: 250 -> 256 (64), split in 4
    for j in range(4):
        assert torch.equal(_received(results, sch, j)[spec.name], vllm_padded[j * 64:(j + 1) * 64]), j


def test_expert_parameters_go_from_expert_parallel_trainers_to_tp_and_ep_engines():
    experts, inter, hidden = 4, 4, 4
    trainer = TrainerLayout(tp=2, dp=2, ep=2, expert_tp=1)
    specs, canon = [], {}
    for e in range(experts):
        w13 = ParamSpec(f"experts.w13_weight[{e}]", (2 * inter, hidden), "bfloat16", tp_dim=0,
                        trainer=Sharding.fused(inter, inter), engine=Sharding.fused(inter, inter),
                        expert=e, num_experts=experts)
        w2 = ParamSpec(f"experts.w2_weight[{e}]", (hidden, inter), "bfloat16", tp_dim=1, expert=e, num_experts=experts)
        specs += [w13, w2]
        canon[w13.name] = (_rand(inter, hidden, seed=10 + e), _rand(inter, hidden, seed=20 + e))
        canon[w2.name] = _rand(hidden, inter, seed=30 + e)
    tp_engine = [GeneratorRank(1, 2, j) for j in range(2)]  # vLLM without EP: every expert split over TP
    ep_engine = [GeneratorRank(2, 2, j, ep_size=2, ep_rank=j) for j in range(2)]  # with EP: whole experts
    sch = plan_weight_sync(specs, trainer, GeneratorLayout(tuple(tp_engine + ep_engine)), LINKS)
    sources: dict[int, dict] = {}
    for r in range(trainer.world_size):  # expert e lives on expert-parallel rank e // 2, whole (expert TP 1)
        mine = {e for e in range(experts) if e // 2 == trainer.ep_rank(r)}
        sources[r] = {}
        for p in specs:
            if p.expert in mine:
                value = canon[p.name]
                sources[r][p.name] = torch.cat(value) if isinstance(value, tuple) else value
    results = exchange(sch, sources)
    _assert_all_ok(results)
    for j in range(2):
        got = _received(results, sch, j)
        for e in range(experts):
            gate, up = canon[f"experts.w13_weight[{e}]"]
            half = inter // 2
            assert torch.equal(got[f"experts.w13_weight[{e}]"],
                               torch.cat([gate[j * half:(j + 1) * half], up[j * half:(j + 1) * half]]))
            assert torch.equal(got[f"experts.w2_weight[{e}]"], canon[f"experts.w2_weight[{e}]"][:, j * half:(j + 1) * half])
        got = _received(results, sch, 2 + j)
        assert sorted(got) == sorted(f"experts.{w}_weight[{e}]" for e in (2 * j, 2 * j + 1) for w in ("w13", "w2"))
        for e in (2 * j, 2 * j + 1):
            assert torch.equal(got[f"experts.w13_weight[{e}]"], torch.cat(canon[f"experts.w13_weight[{e}]"]))


def test_fp32_masters_under_trainer_names_arrive_as_bf16_under_engine_names():
    masters = [torch.randn(8, 4, generator=torch.Generator().manual_seed(40 + k)) for k in range(2)]
    spec = ParamSpec("model.layers.0.mlp.down_proj.weight", (8, 8), "bfloat16", tp_dim=1,
                     source="decoder.layers.0.mlp.linear_fc2.weight", source_dtype="float32")
    sch = plan_weight_sync([spec], TrainerLayout(tp=2), GeneratorLayout((GeneratorRank(1),)), LINKS)
    results = exchange(sch, {k: {spec.source: masters[k]} for k in range(2)})
    _assert_all_ok(results)
    assert torch.equal(_received(results, sch, 0)[spec.name], torch.cat(masters, dim=1).to(BF16))


def test_a_tied_weight_is_found_sent_once_and_delivered_under_both_names():
    emb = _rand(16, 4, seed=50)
    norm = _rand(4, seed=51)
    state = {"model.embed_tokens.weight": emb, "model.norm.weight": norm, "lm_head.weight": emb}  # tied: one storage
    specs = state_dict_specs(state, ModelShape(2, 2, 2, vocab_size=16))
    assert [p.name for p in specs] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert specs[0].aliases == ("lm_head.weight",)
    sch = plan_weight_sync(specs, TrainerLayout(), GeneratorLayout((GeneratorRank(1),)), LINKS)
    results = exchange(sch, {0: state})
    _assert_all_ok(results)
    got = _received(results, sch, 0)
    vllm_rows = torch.cat([emb, torch.zeros(48, 4, dtype=BF16)])  # vLLM pads the vocabulary to 64, even at TP 1
    assert torch.equal(got["lm_head.weight"], vllm_rows) and torch.equal(got["model.embed_tokens.weight"], vllm_rows)
    payload = results[0].value["report"]["bytes_sent"]
    assert payload < 1.5 * (emb.numel() + norm.numel()) * 2  # the shared tensor crossed once


def test_a_receive_buffer_of_the_wrong_dtype_is_refused_on_every_rank():
    spec = ParamSpec("w", (8, 4), "bfloat16", tp_dim=0)
    sch = plan_weight_sync([spec], TrainerLayout(tp=2), GeneratorLayout((GeneratorRank(1),)), LINKS)
    src = _rand(8, 4, seed=60).chunk(2)
    results = exchange(sch, {0: {"w": src[0]}, 1: {"w": src[1]}}, into_dtype="float32", timeout_s=5)
    gen = results[sch.generator_rank(0)]
    assert gen.error_type == "ConfigError" and "torch.float32" in gen.error and "bfloat16" in gen.error
    for r in results[:2]:
        assert r.error_type == "WeightSyncError" and "refused its arguments" in r.error, r.error
