"""The measured step model: decode and prefill steps as sums of measured operator times.

Design note
-----------
:class:`MeasuredPerfModel` has the interface of the analytical :class:`~compute_sched.perf.PerfModel`
(the scheduler, the simulated engine, the bounds and RLSim call either), and replaces its GPU side:
a decode step of ``B`` sequences holding ``C`` context tokens on an instance is

``layers x (linear layers(B) + element-wise(B) + attention(B, C / B) + 2 all-reduces(B x d_model))
+ LM head(B)``

with every term interpolated in measured operator times (:mod:`compute_sched.step_ops`): the
linear layers and element-wise kernels in Vidur's H100/A100 profiles, attention in our own H100
run, the all-reduces in Vidur's NCCL profiles of a DGX node. Nothing is fitted to step times. What
no public profile covers stays as in the analytical model and is said so:

* **host time per step** (scheduling, sampling, output processing): the ``Calibration`` fields
  ``step_overhead_s``, ``seq_overhead_s`` and ``host_overlap``, combined with the GPU time exactly
  as :class:`PerfModel` combines them (Vidur's ``cpu_overheads.csv`` is not public);
* **expert-parallel all-to-alls, AFD's exchange and collectives across nodes**: the analytical
  alpha-beta terms (no measured profile);
* **routed experts** are timed as one GEMM over the weights of the experts a GPU's tokens touch, at
  the tokens each expert receives (what a fused MoE kernel does); no MoE kernel was measured.

GPUs without their own profile are carried from the H100's by datasheet ratios
(:class:`~compute_sched.step_ops.GpuRatios`): the H800 has the H100's compute and HBM, so only its
all-reduces change (NVLink 200 vs 450 GB/s each way); the H20 keeps each kernel's measured
efficiency while its roofline moves to 148 TFLOP/s and 4.0 TB/s. That is an assumption, checked
against RollArt §3.1 in ``bench/step_model.py``.

Every instance configuration's step time is tabulated once over batch sizes (and, for attention,
a log grid of batch x context), so a call costs two interpolations (the simulator makes ~10^6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from orchestrl.compute_sched.hardware import DTYPE_BYTES, GpuSpec, ModelSpec, load_gpu
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.netseam import NetworkSeam
from orchestrl.compute_sched.perf import Calibration, PerfModel
from orchestrl.compute_sched.step_data import attention_table, collective_table, operator_tables
from orchestrl.compute_sched.step_ops import (AllReduceModel, AttentionModel, ElementwiseModel, GemmModel, GpuRatios)

__all__ = ["MeasuredPerfModel", "OperatorSet", "operator_set", "BlockShapes", "block_shapes", "MEASURED_BASE"]

#: GPU types with their own operator profiles, and the profile every other GPU is carried from.
MEASURED_BASE = {"H100": "h100", "A100": "a100"}
_DEFAULT_BASE = "H100"
_BATCH_KNOTS = 4096  # decode steps tabulated for every batch 1..this; beyond, linear in the last slope
_GRID_STEP = 0.125  # log2 step of the attention grid
_LOG_B_MAX, _LOG_C_MAX = 14.0, 20.0  # attention grid: batch up to 16K, mean context up to 1M tokens


@dataclass(frozen=True)
class OperatorSet:
    """The predictors of one measured GPU type, and the ratios that carry them to a target GPU."""

    base: str  # the measured GPU ("H100", "A100")
    gemm: GemmModel
    elementwise: ElementwiseModel
    attention: AttentionModel
    allreduce: AllReduceModel
    ratios: GpuRatios  # base -> target for GEMMs and element-wise kernels
    attention_ratios: GpuRatios  # the H100 (where attention was measured) -> target
    link_ratio: float  # base NVLink bandwidth / target NVLink bandwidth (all-reduce bandwidth term)

    def gemm_s(self, m: np.ndarray, k: float, n: float) -> np.ndarray:
        t = self.gemm.time_s(m, k, n)
        if self.ratios.identity:
            return t
        mm = np.asarray(m, dtype=float)
        return t * self.ratios.roofline_ratio(DTYPE_BYTES * (k * n + mm * (k + n)), 2.0 * mm * k * n)

    def elementwise_s(self, tokens: np.ndarray, elements: dict[str, float]) -> np.ndarray:
        t = self.elementwise.time_s(tokens, elements)
        return t if self.ratios.identity else t * self.ratios.measured_hbm_bytes_per_s / self.ratios.target_hbm_bytes_per_s

    def attention_decode_s(self, seq_heads: np.ndarray, context: np.ndarray) -> np.ndarray:
        t = self.attention.decode_s(seq_heads, context)
        r = self.attention_ratios
        return t if r.identity else t * r.measured_hbm_bytes_per_s / r.target_hbm_bytes_per_s

    def attention_prefill_s(self, q_heads: float, chunk: np.ndarray) -> np.ndarray:
        t = self.attention.prefill_s(q_heads, chunk)
        r = self.attention_ratios
        return t if r.identity else t * r.measured_flops / r.target_flops

    def allreduce_s(self, group: int, nbytes: np.ndarray) -> np.ndarray:
        return self.allreduce.time_s(group, nbytes, self.link_ratio)


@lru_cache(maxsize=None)
def _predictors(base: str, exclude: tuple[str, ...] = ()) -> tuple[GemmModel, ElementwiseModel, AllReduceModel]:
    spec = load_gpu(base)
    tables = operator_tables(MEASURED_BASE[base])
    return (GemmModel(tables, spec.hbm_bytes_per_s, spec.bf16_flops, exclude=exclude),
            ElementwiseModel(tables, exclude=exclude), AllReduceModel(collective_table(MEASURED_BASE[base])))


@lru_cache(maxsize=None)
def _attention() -> AttentionModel:
    return AttentionModel(attention_table("h100"))


def operator_set(gpu: GpuSpec, exclude: tuple[str, ...] = ()) -> OperatorSet:
    """Return the measured predictors for ``gpu``: its own profiles, or the H100's carried by datasheet ratios.

    ``exclude`` leaves measured models out (for out-of-sample validation).
    """
    base = gpu.name.upper() if gpu.name.upper() in MEASURED_BASE else _DEFAULT_BASE
    gemm, elem, ar = _predictors(base, tuple(sorted(exclude)))
    spec = load_gpu(base)
    h100 = load_gpu("H100")
    return OperatorSet(base, gemm, elem, _attention(), ar, GpuRatios.between(spec, gpu),
                       GpuRatios.between(h100, gpu), spec.nvlink_bytes_per_s / gpu.nvlink_bytes_per_s)


@dataclass(frozen=True)
class BlockShapes:
    """Per-GPU operator shapes of one decoder block of a model at attention TP ``tp``."""

    tp: int
    qkv: tuple[int, int]  # (K, N) of the fused QKV projection
    out: tuple[int, int]  # attention output projection
    mlp_up: tuple[int, int] | None  # dense (or shared-expert) gate+up; None when there is none
    mlp_down: tuple[int, int] | None
    q_heads: float  # query heads on one GPU
    kv_heads: float  # KV heads on one GPU (replicated beyond the model's KV heads)
    elements: dict[str, float]  # element-wise kernels: elements per token


def block_shapes(model: ModelSpec, tp: int, mlp_split: int | None = None) -> BlockShapes:
    """Return the per-GPU shapes of ``model``'s block with attention split ``tp`` ways and the dense MLP
    ``mlp_split`` ways (default ``tp``).

    A MoE model's dense MLP is its shared expert, sized from the parameters that are neither routed
    experts, attention nor embeddings (Qwen2-57B-A14B: 20,480 wide; Qwen3-235B-A22B: none).

    >>> from orchestrl.compute_sched.hardware import load_model
    >>> s = block_shapes(load_model("Qwen2.5-14B"), 2)
    >>> s.qkv, s.out, s.mlp_up, s.kv_heads
    ((5120, 3584), (2560, 5120), (5120, 13824), 4.0)
    """
    m, split = model, mlp_split or tp
    hd, kv = m.head_dim, max(1.0, m.kv_heads / tp)
    q = m.query_heads / tp
    attn_params = m.d_model * m.attention_dim * 2 + 2 * m.d_model * m.kv_heads * hd
    if m.is_moe:
        rest = (m.dense_params - 2.0 * m.vocab * m.d_model) / m.layers - attn_params
        ffn = int(rest / (3 * m.d_model)) if rest > 3 * m.d_model * 128 else 0
    else:
        ffn = m.ffn_intermediate
    up = (m.d_model, 2 * ffn // split) if ffn else None
    down = (ffn // split, m.d_model) if ffn else None
    act = 2.0 * (ffn / split + (m.experts_per_token * m.ffn_intermediate / split if m.is_moe else 0.0))
    elements = {"input_layernorm": float(m.d_model), "post_attention_layernorm": float(m.d_model),
                "attn_rope": (q + kv) * hd, "mlp_act": act, "add": float(m.d_model)}
    return BlockShapes(tp, (m.d_model, int(round((q + 2 * kv) * hd))), (int(round(q * hd)), m.d_model), up, down, q,
                       kv, elements)


class _Tables:
    """Step-time tables of one instance configuration: GPU time by batch, attention by (batch, context)."""

    def __init__(self, linear_s: np.ndarray, attn_grid: np.ndarray, layers: int) -> None:
        self.linear = linear_s.tolist()  # index b: seconds of everything but attention at batch b (b = 0..knots)
        self.slope = float(linear_s[-1] - linear_s[-2])
        self.attn = attn_grid  # [log2 batch / step, log2 mean context / step] -> seconds of one layer
        self.nb, self.nc = attn_grid.shape
        self.layers = layers

    def linear_s(self, batch: float) -> float:
        n = len(self.linear) - 1
        if batch >= n:
            return self.linear[n] + self.slope * (batch - n)
        i = int(batch)
        return self.linear[i] + (batch - i) * (self.linear[i + 1] - self.linear[i])

    def attention_s(self, batch: float, context: float) -> float:
        """All layers' decode attention of ``batch`` sequences holding ``context`` tokens in total."""
        if context <= 0 or batch <= 0:
            return 0.0
        x = math.log2(max(batch, 1.0)) / _GRID_STEP
        y = math.log2(max(context / batch, 1.0)) / _GRID_STEP
        scale = 1.0
        if x > self.nb - 1:  # more sequences than the grid: memory-bound, linear in them
            scale, x = batch / 2.0 ** ((self.nb - 1) * _GRID_STEP), self.nb - 1.0
        if y > self.nc - 1:
            scale *= (context / batch) / 2.0 ** ((self.nc - 1) * _GRID_STEP)
            y = self.nc - 1.0
        i, j = min(int(x), self.nb - 2), min(int(y), self.nc - 2)
        fx, fy = x - i, y - j
        a = self.attn
        v = (a[i, j] * (1 - fx) + a[i + 1, j] * fx) * (1 - fy) + (a[i, j + 1] * (1 - fx) + a[i + 1, j + 1] * fx) * fy
        return self.layers * v * scale


class MeasuredPerfModel(PerfModel):
    """:class:`PerfModel` whose GPU time is the sum of measured operator times (see the module note).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = MeasuredPerfModel(load_model("Qwen2.5-14B"), load_gpu("H100"))
    >>> tp1 = InstanceConfig("tp", tp=1)
    >>> 10e-3 < pm._gpu_step_s(tp1, 1, 1000) < 20e-3  # one sequence: ~30 GB of weights at ~3 TB/s
    True
    >>> pm.step_model
    'measured'
    """

    step_model = "measured"

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None, *,
                 network: NetworkSeam | None = None, placement: tuple[int, ...] | None = None,
                 operators: OperatorSet | None = None) -> None:
        super().__init__(model, gpu, calibration, network=network, placement=placement)
        self.ops = operators or operator_set(gpu)
        self._tables: dict[InstanceConfig, _Tables] = {}

    def _clone(self, calibration: Calibration, network: NetworkSeam | None,
               placement: tuple[int, ...] | None) -> "MeasuredPerfModel":
        out = MeasuredPerfModel(self.model, self.gpu, calibration, network=network, placement=placement,
                                operators=self.ops)
        if network is None:
            out._tables = self._tables  # the tables hold no network terms: share them
        return out

    # -- operator sums -----------------------------------------------------------------------
    def _ar_s(self, group: int, nbytes: np.ndarray, cfg: InstanceConfig | None = None) -> np.ndarray:
        """All-reduces: measured NCCL inside a node, the analytical ring across nodes."""
        if group <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=float))
        if group <= self.gpu.gpus_per_node:
            return self.ops.allreduce_s(group, nbytes)
        return np.vectorize(lambda b: PerfModel._allreduce_s(self, group, float(b), cfg))(nbytes)

    def _allreduce_s(self, group: int, nbytes: float, cfg: InstanceConfig | None = None) -> float:
        return float(self._ar_s(group, np.asarray(nbytes, dtype=float), cfg))

    def _dense_block_s(self, shapes: BlockShapes, tokens: np.ndarray, ar_group: int,
                       cfg: InstanceConfig | None) -> np.ndarray:
        """One block without attention and routed experts: GEMMs, element-wise kernels, two all-reduces."""
        o = self.ops
        t = o.gemm_s(tokens, *shapes.qkv) + o.gemm_s(tokens, *shapes.out)
        if shapes.mlp_up is not None:
            t = t + o.gemm_s(tokens, *shapes.mlp_up) + o.gemm_s(tokens, *shapes.mlp_down)
        t = t + o.elementwise_s(tokens, shapes.elements)
        return t + 2 * self._ar_s(ar_group, tokens * self.model.d_model * DTYPE_BYTES, cfg)

    def _experts_s(self, tokens: np.ndarray, touched_per_gpu: np.ndarray, ffn_split: int) -> np.ndarray:
        """One layer's routed experts on one GPU: a GEMM over the touched experts' weights (module note)."""
        m = self.model
        if not m.is_moe:
            return np.zeros_like(tokens)
        f = m.ffn_intermediate // ffn_split
        tokens = np.asarray(tokens, dtype=float)
        touched = np.asarray(touched_per_gpu, dtype=float)
        # each distinct width is a curve lookup: evaluate on ~100 log-spaced knots, interpolate between them
        knots = np.unique(np.concatenate([np.geomspace(1.0, max(2.0, tokens.max()), 96), [tokens.max()]]))
        kt = np.interp(knots, tokens.ravel(), touched.ravel()) if tokens.size > 1 else np.full(knots.shape, float(touched.ravel()[0]))
        per_expert = np.maximum(1.0, knots * m.experts_per_token / np.maximum(self._touched(knots), 1e-9))
        vals = np.array([float(self.ops.gemm_s(mm, m.d_model, 2 * f * max(e, 1e-3))
                               + self.ops.gemm_s(mm, f * max(e, 1e-3), m.d_model)) for mm, e in zip(per_expert, kt)])
        out = np.interp(tokens, knots, vals)
        return np.where(tokens > 0, out, 0.0)

    def _touched(self, tokens: np.ndarray) -> np.ndarray:
        m = self.model
        if not m.is_moe:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        return m.experts * (1.0 - (1.0 - m.experts_per_token / m.experts) ** np.asarray(tokens, dtype=float))

    def _lm_head_s(self, tokens: np.ndarray, tp: int) -> np.ndarray:
        return self.ops.gemm_s(tokens, self.model.d_model, self.model.vocab / tp)

    def _attn_grid(self, shapes: BlockShapes) -> np.ndarray:
        """One layer's decode attention on a (log2 batch, log2 mean context) grid for these shapes."""
        lb = np.arange(0.0, _LOG_B_MAX + 1e-9, _GRID_STEP)
        lc = np.arange(0.0, _LOG_C_MAX + 1e-9, _GRID_STEP)
        b, c = np.meshgrid(2.0 ** lb, 2.0 ** lc, indexing="ij")
        hd_scale = self.model.head_dim / self.ops.attention.head_dim  # other head sizes: by bytes read
        t = self.ops.attention_decode_s((b * shapes.kv_heads).ravel(), (c * hd_scale).ravel())
        return t.reshape(b.shape)

    def _table(self, cfg: InstanceConfig) -> _Tables:
        tab = self._tables.get(cfg)
        if tab is None:
            tab = self._tables[cfg] = self._build(cfg)
        return tab

    def _build(self, cfg: InstanceConfig) -> _Tables:
        m = self.model
        b = np.arange(0, _BATCH_KNOTS + 1, dtype=float)
        L = m.layers
        if cfg.kind == "tp":
            sh = block_shapes(m, cfg.tp)
            touched = self._touched(b)
            lin = L * (self._dense_block_s(sh, b, cfg.tp, cfg) + self._experts_s(b, touched, cfg.tp))
            lin = lin + self._lm_head_s(b, cfg.tp)
            return _Tables(np.where(b > 0, lin, 0.0), self._attn_grid(sh), L)
        if cfg.kind == "ep":
            groups = cfg.ep // cfg.tp
            sh = block_shapes(m, cfg.tp)
            per_group = b / groups
            lin = L * (self._dense_block_s(sh, per_group, cfg.tp, cfg)
                       + self._experts_s(b, self._touched(b) / cfg.ep, 1))
            lin = lin + self._lm_head_s(per_group, cfg.tp)
            return _Tables(np.where(b > 0, lin, 0.0), self._attn_grid(sh), L)
        raise ValueError(cfg.kind)  # AFD is composed per call (_gpu_step_s)

    # -- the PerfModel interface -------------------------------------------------------------
    def _gpu_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        m = self.model
        if cfg.kind == "tp":
            tab = self._table(cfg)
            return tab.linear_s(batch) + tab.attention_s(batch, ctx)
        if cfg.kind == "ep":
            tab = self._table(cfg)
            groups = cfg.ep // cfg.tp
            comm = m.layers * self._ep_dispatch_s(cfg, batch)
            return tab.linear_s(batch) + tab.attention_s(batch / groups, ctx / groups) + comm
        return self._afd_step_s(cfg, batch, ctx)

    def _afd_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        """AFD: attention replicas and FFN GPUs timed from measured operators, the exchange analytical."""
        m = self.model
        reps = cfg.attn_gpus // cfg.tp
        b = np.array([batch / reps])
        attn_side = block_shapes(m, cfg.tp)
        no_mlp = BlockShapes(attn_side.tp, attn_side.qkv, attn_side.out, None, None, attn_side.q_heads,
                             attn_side.kv_heads, {k: v for k, v in attn_side.elements.items() if k != "mlp_act"})
        a = m.layers * float(self._dense_block_s(no_mlp, b, cfg.tp, cfg)[0])
        a += self._table_attn(cfg, attn_side).attention_s(batch / reps, ctx / reps)
        full = np.array([float(batch)])
        if m.is_moe:
            f = m.layers * float(self._experts_s(full, self._touched(full) / cfg.ffn_gpus, 1)[0])
            ffn = block_shapes(m, cfg.tp, cfg.ffn_gpus)
            if ffn.mlp_up is not None:
                f += m.layers * float(self.ops.gemm_s(full, *ffn.mlp_up)[0] + self.ops.gemm_s(full, *ffn.mlp_down)[0])
        else:
            ffn = block_shapes(m, cfg.tp, cfg.ffn_gpus)
            f = m.layers * float(self.ops.gemm_s(full, *ffn.mlp_up)[0] + self.ops.gemm_s(full, *ffn.mlp_down)[0])
        x = m.layers * self._afd_exchange_s(cfg, batch)
        return self._afd_pipeline_s(batch, a, f, x) + float(self._lm_head_s(b, cfg.tp)[0])

    def _table_attn(self, cfg: InstanceConfig, shapes: BlockShapes) -> _Tables:
        key = InstanceConfig("tp", tp=cfg.tp)  # attention of a TP group is what the grid holds
        tab = self._tables.get(("attn", key))  # type: ignore[call-overload]
        if tab is None:
            tab = _Tables(np.zeros(3), self._attn_grid(shapes), self.model.layers)
            self._tables[("attn", key)] = tab  # type: ignore[index]
        return tab

    def prefill_s(self, cfg: InstanceConfig, tokens: float, mean_context: float | None = None) -> float:
        """Seconds to prefill ``tokens`` tokens with mean causal context ``mean_context`` (default ``tokens / 2``).

        The tokens are split evenly over the instance's attention groups; causal attention of all of
        them is timed as one chunk of the same FLOPs (``n = sqrt(2 x tokens x mean_context)``).
        """
        if tokens <= 0:
            return 0.0
        m = self.model
        ctx = tokens / 2.0 if mean_context is None else float(mean_context)
        groups = (cfg.ep // cfg.tp) if cfg.kind == "ep" else (cfg.attn_gpus // cfg.tp if cfg.kind == "afd" else 1)
        per = np.array([tokens / groups])
        sh = block_shapes(m, cfg.tp, cfg.ffn_gpus if cfg.kind == "afd" else None)
        # TP groups: the measured all-reduces; EP and AFD: the analytical model's communication (no profile)
        t = self._dense_block_s(sh, per, cfg.tp if cfg.kind == "tp" else 1, cfg)
        if m.is_moe:
            experts_gpus = cfg.ep if cfg.kind == "ep" else (cfg.ffn_gpus if cfg.kind == "afd" else 1)
            split = cfg.tp if cfg.kind == "tp" else 1
            full = np.array([float(tokens)])
            t = t + self._experts_s(full, self._touched(full) / experts_gpus, split)
        chunk = math.sqrt(max(2.0 * float(per[0]) * max(ctx, 1.0), 1.0))
        t = t + self.ops.attention_prefill_s(sh.q_heads, np.array([chunk]))
        seqs = max(1.0, float(per[0]) / max(1.0, 2.0 * ctx))  # logits for each sequence's last token only
        total = m.layers * float(t[0]) + float(self._lm_head_s(np.array([seqs]), cfg.tp)[0])
        if cfg.kind != "tp":
            total += self._prefill_comm_s(cfg, tokens)
        return self.cal.scale * total + self.cal.offset_s
