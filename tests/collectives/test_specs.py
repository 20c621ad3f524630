"""Spec builders: state dicts (Hugging Face / vLLM names, whole or TP-local) and name maps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.sharding import Sharding  # noqa: E402
from orchestrl.collectives.specs import (MEGATRON_TO_VLLM, ModelShape, hf_layout, merge_specs, rename,  # noqa: E402
                               state_dict_specs)
from orchestrl.fabric.errors import ConfigError  # noqa: E402

SHAPE = ModelShape(num_attention_heads=8, num_key_value_heads=2, head_dim=4, vocab_size=250)


def _vllm_tp4_rank_state() -> dict[str, torch.Tensor]:
    """What one rank of a TP=4 vLLM Llama holds (local shapes: KV heads replicated, vocab padded to 256)."""
    bf16 = torch.bfloat16
    return {"model.embed_tokens.weight": torch.zeros(64, 32, dtype=bf16),
            "model.layers.0.self_attn.qkv_proj.weight": torch.zeros(2 * 4 + 2 * 4, 32, dtype=bf16),
            "model.layers.0.self_attn.o_proj.weight": torch.zeros(32, 8, dtype=bf16),
            "model.layers.0.mlp.gate_up_proj.weight": torch.zeros(2 * 24, 32, dtype=bf16),
            "model.layers.0.mlp.down_proj.weight": torch.zeros(32, 24, dtype=bf16),
            "model.norm.weight": torch.zeros(32, dtype=torch.float32)}


def test_a_tp_local_vllm_state_dict_gives_canonical_shapes_and_both_layouts():
    specs = {p.name: p for p in state_dict_specs(_vllm_tp4_rank_state(), SHAPE, tp_size=4, dtype="bfloat16")}
    qkv = specs["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (8 * 4 + 2 * 2 * 4, 32)  # q + k + v of the whole model, not local rows x 4
    assert qkv.engine == qkv.trainer == Sharding.fused(32, 8, 8, heads=(8, 2, 2))
    assert specs["model.embed_tokens.weight"].shape == (250, 32)  # the true vocabulary
    assert specs["model.layers.0.mlp.gate_up_proj.weight"].shape == (4 * 48, 32)
    assert specs["model.layers.0.self_attn.o_proj.weight"].tp_dim == 1
    norm = specs["model.norm.weight"]
    assert norm.tp_dim is None and norm.source_dtype == "float32" and norm.dtype == "bfloat16"


def test_a_name_map_renames_and_skips_and_two_tensors_on_one_name_are_refused():
    state = {"decoder.final_layernorm.weight": torch.zeros(4), "rotary.inv_freq": torch.zeros(2)}
    specs = state_dict_specs(state, SHAPE, name_map=lambda n: rename(n, MEGATRON_TO_VLLM))
    assert [(p.name, p.source) for p in specs] == [("model.norm.weight", "decoder.final_layernorm.weight")]
    with pytest.raises(ConfigError, match="maps to 'x'"):
        state_dict_specs({"a": torch.zeros(4), "b": torch.zeros(4)}, SHAPE, name_map={"a": "x", "b": "x"})


def test_a_hugging_face_checkpoint_keeps_its_true_vocabulary_and_replicates_kv_heads_past_their_count():
    state = {"model.embed_tokens.weight": torch.zeros(250, 32), "model.layers.0.self_attn.k_proj.weight":
             torch.zeros(8, 32)}
    specs = {p.name: p for p in state_dict_specs(state, SHAPE, layout=hf_layout)}
    assert specs["model.embed_tokens.weight"].trainer == Sharding()  # unpadded on the trainer ...
    assert specs["model.embed_tokens.weight"].engine == Sharding.padded(64)  # ... padded where it lands
    k = specs["model.layers.0.self_attn.k_proj.weight"]
    assert k.engine.runs(8, 4, 3) == (((4, 8),), 0)  # TP 4 over 2 KV heads: ranks 2 and 3 hold head 1


def test_merge_specs_keeps_one_copy_of_a_tied_output_layer():
    a = state_dict_specs({"model.embed_tokens.weight": torch.zeros(250, 32)}, SHAPE)
    b = state_dict_specs({"model.embed_tokens.weight": torch.zeros(250, 32), "model.norm.weight": torch.zeros(32)},
                         SHAPE, pp_stage=1)
    merged = merge_specs(a, b)
    assert [(p.name, p.pp_stage) for p in merged] == [("model.embed_tokens.weight", 0), ("model.norm.weight", 1)]


def test_hf_q_k_v_mapped_onto_a_fused_qkv_proj_is_refused_with_what_to_do_instead():
    """Weight sync does not concatenate tensors: the error says so and names the two ways that work."""
    state = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(SHAPE.num_attention_heads * SHAPE.head_dim, 8),
             "model.layers.0.self_attn.k_proj.weight": torch.zeros(SHAPE.num_key_value_heads * SHAPE.head_dim, 8),
             "model.layers.0.self_attn.v_proj.weight": torch.zeros(SHAPE.num_key_value_heads * SHAPE.head_dim, 8)}
    fuse = [(r"(.*)\.(q|k|v)_proj\.(.*)", r"\1.qkv_proj.\3")]
    for tp in (1, 2):
        with pytest.raises(ConfigError, match=r"q_proj.weight.*fused engine tensor .*qkv_proj.*does not concatenate.*"
                                              r"is_checkpoint_format=True.*torch.cat"):
            state_dict_specs({k: v[: v.shape[0] // tp] for k, v in state.items()}, SHAPE, tp_size=tp, name_map=fuse)
    assert len(state_dict_specs(state, SHAPE)) == 3  # unfused checkpoint names go through as they are


def test_a_name_map_that_matches_nothing_is_an_error_not_an_empty_model():
    state = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8)}
    with pytest.raises(ConfigError, match=r"name_map.*none of the 1 tensors.*re.match"):
        state_dict_specs(state, SHAPE, name_map=[(r"\.q_proj\.", ".qkv_proj.")])  # re.match: anchored at the start
