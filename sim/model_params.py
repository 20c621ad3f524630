"""The parameter list a weight sync moves, built from a Table 3 model description.

Design note
-----------
:func:`collectives.plan.plan_weight_sync` plans over named parameters with their unsharded shapes
and the dimension tensor parallelism splits. A :class:`compute_sched.hardware.ModelSpec` gives the
architecture (OrchestrRL Table 3), so the Megatron / vLLM parameter set of a Qwen decoder follows:
input and output embeddings, per layer two norms, Q/K/V (column-parallel) and O (row-parallel)
projections, and the MLP -- gate and up fused (column-parallel) and down (row-parallel). For a MoE
model the routed experts of a layer are one fused tensor each (``experts.gate_up``,
``experts.down``) plus the router; whatever the table's total holds beyond that (Qwen2-57B-A14B's
shared expert of 20,480) becomes a per-layer shared MLP, so the bytes sum to ``params_total``.

Expert parallelism is not a dimension of :class:`collectives.layout.TrainerLayout`; expert tensors
are described as TP-split like the rest. That changes which trainer rank holds which slice, not
how many bytes cross the fabric: the planner gives every piece one origin among all the ranks that
hold it, so the send load spreads over all trainer ranks either way.
"""

from __future__ import annotations

from orchestrl.compute_sched.hardware import ModelSpec

from orchestrl.collectives.layout import ParamSpec

__all__ = ["model_params", "params_bytes"]

_ALIGN = 64  # rows of a synthesised tensor are a multiple of this, so every TP degree up to 64 divides them


def model_params(model: ModelSpec, dtype: str = "bfloat16", pp: int = 1) -> list[ParamSpec]:
    """Return the parameters of ``model`` as the weight-sync planner reads them (unsharded shapes).

    With ``pp`` pipeline stages, layer ``i`` belongs to stage ``i * pp // layers`` (Megatron's even
    split), the input embedding to the first stage and the output head to the last.

    Notes
    -----
    O(layers). Every split dimension is a multiple of 64 for the bundled models, so TP degrees up to
    8 (and the planner's slicing) divide them.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model
    >>> m = load_model("Qwen2.5-72B")
    >>> ps = model_params(m)
    >>> abs(params_bytes(ps) / (2 * m.params_total) - 1) < 0.01  # within 1% of Table 3's total
    True
    """
    d, hd = model.d_model, model.head_dim
    q_rows, kv_rows = model.query_heads * hd, model.kv_heads * hd
    if pp < 1 or pp > model.layers:
        raise ValueError(f"pp={pp} must be between 1 and the {model.layers} layers of {model.name}")
    out = [ParamSpec("embed_tokens.weight", (model.vocab, d), dtype, 0, 0)]
    per_layer = 2 * d + 2 * q_rows * d + 2 * kv_rows * d
    if model.is_moe:
        per_layer += model.experts * d + 3 * model.experts * model.ffn_intermediate * d
    else:
        per_layer += 3 * model.ffn_intermediate * d
    rest = model.params_total - model.layers * per_layer - 2 * model.vocab * d
    shared = 0
    if rest > 0.01 * model.params_total:  # e.g. a shared expert that Table 3 folds into the total
        shared = int(rest / (3 * d * model.layers)) // _ALIGN * _ALIGN
    for i in range(model.layers):
        p, st = f"layers.{i}.", i * pp // model.layers
        out += [ParamSpec(p + "input_layernorm.weight", (d,), dtype, None, st),
                ParamSpec(p + "self_attn.q_proj.weight", (q_rows, d), dtype, 0, st),
                ParamSpec(p + "self_attn.k_proj.weight", (kv_rows, d), dtype, 0, st),
                ParamSpec(p + "self_attn.v_proj.weight", (kv_rows, d), dtype, 0, st),
                ParamSpec(p + "self_attn.o_proj.weight", (d, q_rows), dtype, 1, st),
                ParamSpec(p + "post_attention_layernorm.weight", (d,), dtype, None, st)]
        if model.is_moe:
            f = model.experts * model.ffn_intermediate
            out += [ParamSpec(p + "mlp.gate.weight", (model.experts, d), dtype, None, st),
                    ParamSpec(p + "mlp.experts.gate_up_proj.weight", (2 * f, d), dtype, 0, st),
                    ParamSpec(p + "mlp.experts.down_proj.weight", (d, f), dtype, 1, st)]
        else:
            f = model.ffn_intermediate
            out += [ParamSpec(p + "mlp.gate_up_proj.weight", (2 * f, d), dtype, 0, st),
                    ParamSpec(p + "mlp.down_proj.weight", (d, f), dtype, 1, st)]
        if shared:
            out += [ParamSpec(p + "mlp.shared_expert.gate_up_proj.weight", (2 * shared, d), dtype, 0, st),
                    ParamSpec(p + "mlp.shared_expert.down_proj.weight", (d, shared), dtype, 1, st)]
    out.append(ParamSpec("lm_head.weight", (model.vocab, d), dtype, 0, pp - 1))
    return out


def params_bytes(params: list[ParamSpec]) -> int:
    """Return the bytes of a parameter list (the unsharded model)."""
    return sum(p.nbytes for p in params)
