"""How the training stage's FLOPs-at-MFU model compares with measured linear-layer times.

The training stage (:mod:`sim.train.step`) charges dense GEMMs at an efficiency fitted to published
end-to-end MFU (:func:`sim.train.mfu.efficiency`: about 0.30 of peak for a 5,120-wide model). Where
that overlaps measured data -- the forward pass of a block's linear layers at the token counts of a
training micro-batch (2,048-4,096 tokens per GPU), in Vidur's H100 profiles -- :func:`gemm_gap`
reports the measured efficiency beside the model's. The gap is not an error of either: the fitted
efficiency also carries the backward pass, element-wise kernels, recomputation and everything else
a published MFU includes, while the measured one is forward GEMM kernels alone; the table says how
much of the model's time those kernels account for.
"""

from __future__ import annotations

import numpy as np

from orchestrl.compute_sched.step_data import LINEAR_OPS, SMALL_OPS, operator_tables
from orchestrl.sim.train.flops import ArchSpec
from orchestrl.sim.train.mfu import default_params, efficiency

__all__ = ["gemm_gap"]

H100_BF16_FLOPS = 989e12


def _arch(t) -> ArchSpec:
    hd = t.head_dim
    return ArchSpec(name=t.model, d_model=t.n_embd, layers=1, vocab=1,
                    attn_params_per_layer=2.0 * t.n_embd * t.n_head * hd + 2.0 * t.n_embd * t.n_kv_head * hd,
                    attn_qk_dim=t.n_head * hd, attn_v_dim=t.n_head * hd,
                    kv_bytes_per_token_layer=4.0 * t.n_kv_head * hd, dense_ffn=t.n_expanded_embd)


def gemm_gap(min_tokens: int = 2048) -> list[dict]:
    """Per profiled H100 model and TP degree: measured forward efficiency of its linear layers (and of its
    whole block) at ``min_tokens`` tokens or more, against the training model's dense-GEMM efficiency.

    >>> rows = gemm_gap()
    >>> all(r["measured_linear_eff"] > r["model_dense_eff"] for r in rows)  # kernels alone run faster
    True
    """
    params = default_params()
    rows = []
    for t in operator_tables("h100"):
        model_eff = float(efficiency(_arch(t), 1, 1, params).dense)
        for tp in t.tps:
            ms = t.tokens[tp]
            sel = ms >= min_tokens
            if not sel.any():
                continue
            flops = 2.0 * ms[sel] * sum(k * n for k, n in t.gemm_shapes(tp).values())
            lin = sum(t.times_ms[op, tp][sel] for op in LINEAR_OPS) * 1e-3
            block = lin + sum(t.times_ms[op, tp][sel] for op in SMALL_OPS) * 1e-3
            eff_lin = float(np.median(flops / lin / H100_BF16_FLOPS))
            eff_block = float(np.median(flops / block / H100_BF16_FLOPS))
            rows.append({"model": t.model, "tp": int(tp), "d_model": t.n_embd, "points": int(sel.sum()),
                         "measured_linear_eff": eff_lin, "measured_block_eff": eff_block,
                         "model_dense_eff": model_eff, "model_over_measured_time": eff_lin / model_eff})
    return rows
