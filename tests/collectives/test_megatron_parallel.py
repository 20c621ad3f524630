"""Real megatron-core models with pipeline, virtual pipeline and expert parallelism, on the documented path.

``megatron_specs(model, ...)`` on every rank, ``merge_specs`` of the gathered lists, one plan, and
``send(megatron_named_parameters(model))``: no renaming by hand. What the engine receives is checked
against what megatron-core's own modules hold on each rank, under the engine's global layer and
expert numbers.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")
ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed (comms extra)")

from orchestrl.collectives.layout import GeneratorLayout, GeneratorRank  # noqa: E402

HIDDEN, HEADS, GROUPS, FFN, VOCAB = 32, 4, 2, 48, 100


def _config(layers: int, pp: int, *, vpp: int | None = None, experts: int = 0):
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra = dict(num_moe_experts=experts, moe_ffn_hidden_size=16, moe_router_topk=2) if experts else {}
    return TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
                             ffn_hidden_size=FFN, use_cpu_initialization=True, gated_linear_unit=True,
                             activation_func=torch.nn.functional.silu, add_bias_linear=False,
                             normalization="RMSNorm", params_dtype=torch.bfloat16, bf16=True,
                             pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                             pipeline_dtype=torch.bfloat16 if pp > 1 else None, **extra)


def _gpt(cfg, padded_vocab: int, *, tied: bool, vp_stage: int | None = None, experts: int = 0):
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    spec = get_gpt_layer_local_spec(num_experts=experts or None, moe_grouped_gemm=False, normalization="RMSNorm")
    # megatron-core copies the tied embedding to the last stage with an all-reduce on .cuda() tensors; on CPU
    # the copy stays as initialised (the test checks names and routes, not that all-reduce)
    original = LanguageModule._is_in_embd_group
    LanguageModule._is_in_embd_group = lambda self: False
    try:
        return GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=padded_vocab, max_sequence_length=64,
                        position_embedding_type="rope", pre_process=pre, post_process=post,
                        share_embeddings_and_output_weights=tied, vp_stage=vp_stage)
    finally:
        LanguageModule._is_in_embd_group = original


def _truth(chunks) -> dict:
    """Each parameter this rank holds, by its engine-independent meaning, from megatron-core's own modules."""
    out: dict = {"layers": {}, "experts": {}}
    eye = torch.eye(HIDDEN, dtype=torch.bfloat16).unsqueeze(1)
    with torch.no_grad():
        for chunk in chunks:
            for layer in chunk.decoder.layers:
                g = layer.layer_number - 1  # megatron-core's own global numbering
                q, k, v = layer.self_attention.get_query_key_value_tensors(eye)[:3]
                rows = [t[:, 0].permute(1, 2, 0).reshape(-1, HIDDEN) for t in (q, k, v)]
                entry = {"q": rows[0], "k": rows[1], "v": rows[2], "proj": layer.self_attention.linear_proj.weight.clone(),
                         "norm1": layer.input_layernorm.weight.clone(), "norm2": layer.pre_mlp_layernorm.weight.clone()}
                mlp = layer.mlp
                if hasattr(mlp, "local_expert_indices"):
                    for i, e in enumerate(mlp.local_expert_indices):
                        fc1 = mlp.experts.local_experts[i].linear_fc1.weight
                        out["experts"][(g, e)] = {"fc1": fc1.clone(),
                                                  "fc2": mlp.experts.local_experts[i].linear_fc2.weight.clone()}
                else:
                    gate, up = torch.chunk(mlp.linear_fc1.weight, 2, dim=0)
                    entry.update(gate=gate.clone(), up=up.clone(), fc2=mlp.linear_fc2.weight.clone())
                out["layers"][g] = entry
            if chunk.pre_process:
                emb = chunk.embedding.word_embeddings
                out["embed"] = (emb.vocab_start_index, emb.weight.detach().clone())
            if chunk.post_process:
                out["final_norm"] = chunk.decoder.final_layernorm.weight.detach().clone()
                if chunk.output_layer.weight is not None and not chunk.share_embeddings_and_output_weights:
                    out["head"] = chunk.output_layer.weight.detach().clone()
    return out


def _trainer(rank: int, world: int, dist_port: int, sync_port: int, gen_json, kind: str) -> dict:
    from orchestrl.collectives.emulation.runner import _exchange_rank

    if rank >= world:
        return _exchange_rank(None, rank, sync_port, {}, 60.0, None, False)
    import torch.distributed as dist

    from orchestrl.collectives.layout import FabricLinks, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.collectives.specs import ModelShape, megatron_named_parameters, megatron_specs, merge_specs
    from orchestrl.collectives.weight_sync import WeightSync

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{dist_port}", rank=rank, world_size=world)
    if kind == "tp2pp2":
        tp, pp, vpp, layers, tied, layout = 2, 2, None, 4, True, TrainerLayout(tp=2, pp=2)
    else:  # "vpp": PP2 with two virtual chunks of one layer each
        tp, pp, vpp, layers, tied, layout = 1, 2, 2, 4, False, TrainerLayout(pp=2)
    ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp)
    cfg = _config(layers, pp, vpp=vpp)
    padded = -(-VOCAB // (128 * tp)) * 128 * tp
    torch.manual_seed(1000 + ps.get_pipeline_model_parallel_rank())  # TP ranks of a stage share master weights
    chunks = [_gpt(cfg, padded, tied=tied, vp_stage=v) for v in range(vpp or 1)] if vpp else [_gpt(cfg, padded, tied=tied)]
    model = chunks if vpp else chunks[0]
    mine = megatron_specs(model, ModelShape.from_megatron(cfg, VOCAB), tp_size=tp)
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    specs = merge_specs(*every)
    schedule = None
    if rank == 0:
        schedule = plan_weight_sync(specs, layout, GeneratorLayout.from_json(gen_json), FabricLinks(nic_bps=1e9),
                                    chunk_bytes=8 << 10)
    sync = WeightSync.connect(schedule, "127.0.0.1", sync_port, rank, timeout_s=60, join_timeout_s=60)
    report = sync.send(megatron_named_parameters(model))
    return {"truth": _truth(chunks), "tp_rank": ps.get_tensor_model_parallel_rank(), "verified": report.verified,
            "names": sorted(p.name for p in specs)}


def _run(kind: str, world: int):
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.runner import free_port

    gen = GeneratorLayout((GeneratorRank(0),))
    dist_port, sync_port = free_port(), free_port()
    with RankGroup(_trainer, [(r, world, dist_port, sync_port, gen.to_json(), kind) for r in range(world + 1)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * (world + 1)) as g:
        results = g.join(240)
    bad = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not bad, bad
    return [r.value for r in results]


def _canonical(trainers: list[dict], tied: bool) -> dict:
    """The whole tensors a TP=1 vLLM engine holds, assembled from every trainer rank's shards."""
    by_tp: dict[int, list[dict]] = {}
    for t in trainers:
        by_tp.setdefault(t["tp_rank"], []).append(t["truth"])
    tps = sorted(by_tp)

    def layer(tp: int, g: int) -> dict:
        return next(t["layers"][g] for t in by_tp[tp] if g in t["layers"])

    layers = sorted({g for t in trainers for g in t["truth"]["layers"]})
    canon = {}
    for g in layers:
        cat = lambda key, dim=0: torch.cat([layer(k, g)[key] for k in tps], dim=dim)  # noqa: E731
        pre = f"model.layers.{g}."
        canon[pre + "self_attn.qkv_proj.weight"] = torch.cat([cat("q"), cat("k"), cat("v")])
        canon[pre + "mlp.gate_up_proj.weight"] = torch.cat([cat("gate"), cat("up")])
        canon[pre + "self_attn.o_proj.weight"] = cat("proj", 1)
        canon[pre + "mlp.down_proj.weight"] = cat("fc2", 1)
        canon[pre + "input_layernorm.weight"] = layer(0, g)["norm1"].to(torch.bfloat16)
        canon[pre + "post_attention_layernorm.weight"] = layer(0, g)["norm2"].to(torch.bfloat16)
    embed = sorted((t["truth"]["embed"] for t in trainers if "embed" in t["truth"]), key=lambda e: e[0])
    rows = torch.cat([w for _, w in embed])[:VOCAB]
    canon["model.embed_tokens.weight"] = torch.cat([rows, torch.zeros(-(-VOCAB // 64) * 64 - VOCAB, HIDDEN,
                                                                      dtype=torch.bfloat16)])
    canon["model.norm.weight"] = next(t["truth"]["final_norm"] for t in trainers
                                      if "final_norm" in t["truth"]).to(torch.bfloat16)
    if not tied:
        heads = [t["truth"]["head"] for t in sorted(trainers, key=lambda t: t["tp_rank"]) if "head" in t["truth"]]
        head = torch.cat(heads)[:VOCAB]
        canon["lm_head.weight"] = torch.cat([head, torch.zeros(-(-VOCAB // 64) * 64 - VOCAB, HIDDEN,
                                                               dtype=torch.bfloat16)])
    return canon


@pytest.mark.parametrize("kind,world", [("tp2pp2", 4), ("vpp", 2)])
def test_pipeline_and_virtual_pipeline_models_sync_with_global_layer_names(kind, world):
    values = _run(kind, world)
    trainers, engine = values[:world], values[world]
    assert all(t["verified"] for t in trainers) and engine["report"]["verified"]
    # every layer under its global number, each once; a tied output layer is the embedding, sent once
    assert sorted({n.split(".")[2] for n in trainers[0]["names"] if n.startswith("model.layers.")}) == ["0", "1", "2", "3"]
    tied = kind == "tp2pp2"
    assert ("lm_head.weight" in trainers[0]["names"]) is not tied
    canon = _canonical(trainers, tied)
    got = engine["received"]
    assert sorted(got) == sorted(canon)
    for name, want in canon.items():
        assert torch.equal(got[name], want), name


def _moe_rank(rank: int, dist_port: int, sync_port: int) -> dict:
    """Trainer ranks 0-1 (EP2, 4 experts, TP1); generator ranks 2-3 (one vLLM engine, TP2 with EP2)."""
    import torch.distributed as dist

    from orchestrl.collectives.codec import TORCH_DTYPES
    from orchestrl.collectives.layout import FabricLinks, TrainerLayout
    from orchestrl.collectives.plan import plan_weight_sync
    from orchestrl.collectives.specs import ModelShape, megatron_named_parameters, megatron_specs, merge_specs
    from orchestrl.collectives.weight_sync import WeightSync

    torch.set_num_threads(1)
    gen = GeneratorLayout(tuple(GeneratorRank(0, 2, j, ep_size=2, ep_rank=j) for j in range(2)))
    if rank >= 2:
        sync = WeightSync.connect(None, "127.0.0.1", sync_port, rank, timeout_s=60, join_timeout_s=60)
        sch = sync.schedule
        into, loaded = {}, {}
        for i, p in enumerate(sch.params):  # vLLM's FusedMoE stacks this rank's experts under the base name
            shape = sch.local_shape(rank, i)
            if shape is not None and p.expert is not None:
                base = p.name.split("[")[0]
                into.setdefault(base, torch.zeros((2, *shape), dtype=TORCH_DTYPES[p.dtype]))
        report = sync.receive(lambda batch: loaded.update(batch), into=into)
        return {"into": into, "verified": report.verified}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{dist_port}", rank=rank, world_size=2)
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    cfg = _config(1, 1, experts=4)
    torch.manual_seed(7)
    model = _gpt(cfg, 128, tied=False, experts=4)
    mine = megatron_specs(model, ModelShape.from_megatron(cfg, VOCAB), tp_size=1)
    every: list = [None] * 2
    dist.all_gather_object(every, mine)
    schedule = None
    if rank == 0:
        schedule = plan_weight_sync(merge_specs(*every), TrainerLayout(dp=2, ep=2), gen, FabricLinks(nic_bps=1e9),
                                    chunk_bytes=8 << 10)
    sync = WeightSync.connect(schedule, "127.0.0.1", sync_port, rank, timeout_s=60, join_timeout_s=60)
    report = sync.send(megatron_named_parameters(model))
    return {"truth": _truth([model]), "verified": report.verified}


def test_expert_parallel_moe_arrives_in_each_engine_ranks_stacked_experts():
    from orchestrl.collectives.emulation.launch import RankGroup
    from orchestrl.collectives.emulation.runner import free_port

    dist_port, sync_port = free_port(), free_port()
    with RankGroup(_moe_rank, [(r, dist_port, sync_port) for r in range(4)],
                   env=[{"GLOO_SOCKET_IFNAME": "lo"}] * 4) as g:
        results = g.join(240)
    bad = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not bad, bad
    values = [r.value for r in results]
    assert all(v["verified"] for v in values)
    experts = {**values[0]["truth"]["experts"], **values[1]["truth"]["experts"]}
    assert sorted(experts) == [(0, 0), (0, 1), (0, 2), (0, 3)]  # EP rank r holds global experts 2r, 2r+1
    for j in range(2):  # engine EP rank j stacks global experts 2j, 2j+1; expert TP is 1 under vLLM's EP
        into = values[2 + j]["into"]
        for local in range(2):
            e = 2 * j + local
            assert torch.equal(into["model.layers.0.mlp.experts.w13_weight"][local], experts[(0, e)]["fc1"]), e
            assert torch.equal(into["model.layers.0.mlp.experts.w2_weight"][local], experts[(0, e)]["fc2"]), e
