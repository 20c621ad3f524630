"""Where a transformer's training FLOPs and parameters are: dense GEMMs, routed experts, attention.

Design note
-----------
The training stage needs three numbers per token and per GPU, and the MFU model needs them split,
because each part runs at its own efficiency:

* **dense GEMMs** -- attention projections, dense / shared-expert MLPs, the router and the LM head;
* **expert GEMMs** -- the ``topk`` routed experts a token visits;
* **attention core** -- ``Q K^T`` and ``A V`` (flash attention), which grows with the context.

Training runs each GEMM three times (forward, and two in backward), so a GEMM of ``P`` parameters
costs ``6 P`` FLOPs per token. The attention core of a token at context ``c`` costs
``3 x 2 (d_qk + d_v) c`` per layer; a causal sequence of length ``s`` has mean context ``s / 2``.
*Executed* FLOPs (what the GPU runs, so what takes time) use that causal mean and multiply by 4/3
under full activation recomputation; *model* FLOPs (the MFU numerator) use the same count without
recomputation, the convention of Megatron-LM and NeMo's "model TFLOP/s" (causal attention).

:class:`ArchSpec` describes any decoder (Table 3 models via :meth:`ArchSpec.from_model`, and the
calibration models of ``sim/specs/mfu_points.yaml``, e.g. DeepSeek-V3 with MLA, via
:meth:`ArchSpec.from_mapping`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from orchestrl.compute_sched.hardware import ModelSpec
from orchestrl.fabric.config import Reader

__all__ = ["ArchSpec", "TokenFlops", "RECOMPUTE_FACTOR"]

#: Full activation recomputation runs every forward twice: (2 + 4 + 2) / (2 + 4) of the work.
RECOMPUTE_FACTOR = 4.0 / 3.0
BF16_BYTES = 2


@dataclass(frozen=True)
class TokenFlops:
    """Training FLOPs of a batch, split by the kind of kernel that runs them (fwd + bwd)."""

    dense_gemm: float
    expert_gemm: float
    attention: float

    @property
    def total(self) -> float:
        return self.dense_gemm + self.expert_gemm + self.attention

    def scaled(self, factor: float) -> "TokenFlops":
        return TokenFlops(self.dense_gemm * factor, self.expert_gemm * factor, self.attention * factor)


@dataclass(frozen=True)
class ArchSpec:
    """Shapes of a decoder-only transformer that set its training FLOPs, parameters and traffic.

    Parameters
    ----------
    name : str
    d_model : int
    layers : int
        Transformer blocks.
    vocab : int
        Vocabulary (input embedding and an untied LM head).
    attn_params_per_layer : float
        Parameters of one attention block's projections (MLA included).
    attn_qk_dim, attn_v_dim : int
        Per-token widths of the attention core: heads x query/key head dim, heads x value head dim.
    kv_bytes_per_token_layer : float
        Bytes of K and V one token holds in one layer (what context parallelism exchanges).
    full_attention_fraction : float
        Share of layers with full causal attention (GPT-OSS alternates with a 128-token window).
    dense_ffn : int
        MLP width of dense layers (0 for a model whose every layer is MoE).
    moe_layers : int
        Layers whose MLP is a mixture of experts.
    experts, topk, expert_ffn : int
        Routed experts per MoE layer, experts a token visits, and each expert's MLP width.
    shared_ffn : int
        Width of the shared expert(s) of an MoE layer, summed (0: none).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model
    >>> a = ArchSpec.from_model(load_model("Qwen2-57B-A14B"))
    >>> a.moe_layers, a.shared_ffn  # the shared expert of Qwen2-57B-A14B is 20480 wide
    (28, 20480)
    >>> round(a.params_active / 1e9, 1)
    14.2
    """

    name: str
    d_model: int
    layers: int
    vocab: int
    attn_params_per_layer: float
    attn_qk_dim: int
    attn_v_dim: int
    kv_bytes_per_token_layer: float
    full_attention_fraction: float = 1.0
    dense_ffn: int = 0
    moe_layers: int = 0
    experts: int = 0
    topk: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_model(cls, model: ModelSpec) -> "ArchSpec":
        """Return the shapes of a Table 3 model; an MoE model's shared expert is what its dense
        parameters leave after attention and embeddings (Qwen2-57B-A14B: 20,480; Qwen3: none)."""
        d = model.d_model
        q_dim = model.query_heads * model.head_dim
        kv_dim = model.kv_heads * model.head_dim
        attn = 2.0 * d * q_dim + 2.0 * d * kv_dim
        embed = 2.0 * model.vocab * d
        shared = 0
        if model.is_moe:
            rest = model.dense_params - model.layers * attn - embed
            # the shared MLP is 3 d x ffn per layer; widths come in multiples of 128
            shared = max(0, int(round(rest / (3.0 * d * model.layers) / 128.0)) * 128)
        return cls(name=model.name, d_model=d, layers=model.layers, vocab=model.vocab, attn_params_per_layer=attn,
                   attn_qk_dim=q_dim, attn_v_dim=q_dim, kv_bytes_per_token_layer=2.0 * kv_dim * BF16_BYTES,
                   dense_ffn=0 if model.is_moe else model.ffn_intermediate,
                   moe_layers=model.layers if model.is_moe else 0, experts=model.experts,
                   topk=model.experts_per_token, expert_ffn=model.ffn_intermediate if model.is_moe else 0,
                   shared_ffn=shared)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str, path: str = "") -> "ArchSpec":
        """Return the shapes stored in a mapping (a ``models:`` entry of the MFU points file).

        Raises
        ------
        ConfigError
            Naming the file and field of a missing or out-of-range value.
        """
        r = Reader(data, source, path)
        r.reject_unknown({"name", "d_model", "layers", "vocab", "attn_params_per_layer", "query_heads", "kv_heads",
                          "head_dim", "qk_head_dim", "v_head_dim", "kv_bytes_per_token_layer",
                          "full_attention_fraction", "dense_ffn", "moe_layers", "experts", "topk", "expert_ffn",
                          "shared_ffn", "params_total_check"})
        d = r.int("d_model", minimum=1)
        heads = r.int("query_heads", minimum=1)
        head = r.int("head_dim", minimum=1)
        kv_heads = r.int("kv_heads", minimum=1)
        qk = heads * r.int("qk_head_dim", default=head, minimum=1)
        v = heads * r.int("v_head_dim", default=head, minimum=1)
        default_attn = 2.0 * d * heads * head + 2.0 * d * kv_heads * head
        spec = cls(name=r.str("name"), d_model=d, layers=r.int("layers", minimum=1), vocab=r.int("vocab", minimum=1),
                   attn_params_per_layer=r.float("attn_params_per_layer", default=default_attn, minimum=0.0),
                   attn_qk_dim=qk, attn_v_dim=v,
                   kv_bytes_per_token_layer=r.float("kv_bytes_per_token_layer",
                                                    default=2.0 * kv_heads * head * BF16_BYTES, minimum=0.0),
                   full_attention_fraction=r.float("full_attention_fraction", default=1.0, minimum=0.0, maximum=1.0),
                   dense_ffn=r.int("dense_ffn", default=0, minimum=0), moe_layers=r.int("moe_layers", default=0, minimum=0),
                   experts=r.int("experts", default=0, minimum=0), topk=r.int("topk", default=0, minimum=0),
                   expert_ffn=r.int("expert_ffn", default=0, minimum=0), shared_ffn=r.int("shared_ffn", default=0, minimum=0))
        if spec.moe_layers > spec.layers:
            raise r.error("moe_layers", f"{spec.moe_layers} > layers={spec.layers}", f"0..{spec.layers}")
        if spec.moe_layers and not (spec.experts and 1 <= spec.topk <= spec.experts and spec.expert_ffn):
            raise r.error("experts", "an MoE model needs experts, topk (1..experts) and expert_ffn", "positive values")
        if spec.moe_layers < spec.layers and spec.dense_ffn == 0:
            raise r.error("dense_ffn", f"{spec.layers - spec.moe_layers} dense layers need an MLP width", "> 0")
        check = r.float("params_total_check", minimum=1.0) if r.has("params_total_check") else None
        if check is not None and abs(spec.params_total / check - 1.0) > 0.03:
            raise r.error("params_total_check", f"the shapes give {spec.params_total:.4g} parameters, not {check:.4g}",
                          "shapes that add up to the published size (within 3%)")
        return spec

    # ------------------------------------------------------------------ parameters
    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def expert_params(self) -> float:
        """Parameters of every routed expert of every MoE layer."""
        return float(self.moe_layers * self.experts * 3 * self.d_model * self.expert_ffn)

    @property
    def dense_params(self) -> float:
        """Parameters every token uses (everything but the routed experts)."""
        mlp = (self.layers - self.moe_layers) * 3.0 * self.d_model * self.dense_ffn
        shared = self.moe_layers * (3.0 * self.d_model * self.shared_ffn + self.d_model * self.experts)
        return self.layers * self.attn_params_per_layer + mlp + shared + 2.0 * self.vocab * self.d_model

    @property
    def params_total(self) -> float:
        return self.dense_params + self.expert_params

    @property
    def params_active(self) -> float:
        """Parameters one token touches."""
        routed = self.moe_layers * self.topk * 3.0 * self.d_model * self.expert_ffn
        return self.dense_params + routed

    # ------------------------------------------------------------------ FLOPs
    def flops(self, seq_lens: np.ndarray | float, tokens: float | None = None) -> TokenFlops:
        """Return the model FLOPs (fwd + bwd, causal attention) of training on sequences ``seq_lens``.

        ``seq_lens`` is an array of sequence lengths (each sequence attends within itself, as packed
        sequences do) or one length; ``tokens`` (default: their sum) scales a single length.

        Notes
        -----
        O(len(seq_lens)).

        Examples
        --------
        >>> from orchestrl.compute_sched.hardware import load_model
        >>> a = ArchSpec.from_model(load_model("Qwen2.5-72B"))
        >>> f = a.flops(4096.0, tokens=1.0)
        >>> round(f.dense_gemm / (6 * (a.params_active - a.vocab * a.d_model)), 6)  # 6 N per token
        1.0
        """
        lens = np.atleast_1d(np.asarray(seq_lens, dtype=np.float64))
        if tokens is None:
            tokens = float(lens.sum())
            sq = float((lens * lens).sum())
        else:  # `tokens` tokens, all in sequences of length lens[0]
            sq = float(tokens * lens[0])
        d = self.d_model
        dense_per_token = 6.0 * (self.dense_params - self.vocab * d)  # the input embedding is a lookup
        expert_per_token = 6.0 * self.moe_layers * self.topk * 3.0 * d * self.expert_ffn
        # sum over tokens of the causal context (~ s^2 / 2 per sequence), 3 x 2 (d_qk + d_v) per unit
        attn = 6.0 * (self.attn_qk_dim + self.attn_v_dim) * self.layers * self.full_attention_fraction * sq / 2.0
        return TokenFlops(dense_per_token * tokens, expert_per_token * tokens, attn)
