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

Every instance configuration's step time is tabulated once over batch sizes (attention is one
function of the KV bytes read), so a call costs two interpolations (the simulator makes ~10^6).
The tables are non-decreasing in batch and context and convex in context (:class:`_Tables`), which
the makespan lower bound (:mod:`compute_sched.bounds`) needs of any step model.
"""

from __future__ import annotations

import bisect
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
        return t if self.ratios.identity else t * self._carry(np.asarray(m, dtype=float), k, n)

    def gemm_many_s(self, m: np.ndarray, k: np.ndarray, n: np.ndarray) -> np.ndarray:
        """:meth:`gemm_s` of many shapes at once (each point its own ``m``, ``k``, ``n``)."""
        t = self.gemm.time_many(m, k, n)
        if self.ratios.identity:
            return t
        m, k, n = (np.asarray(v, dtype=float).ravel() for v in np.broadcast_arrays(m, k, n))
        return t * self._carry(m, k, n)

    def _carry(self, m, k, n):
        return self.ratios.roofline_ratio(DTYPE_BYTES * (k * n + m * (k + n)), 2.0 * m * k * n)

    def elementwise_s(self, tokens: np.ndarray, elements: dict[str, float]) -> np.ndarray:
        t = self.elementwise.time_s(tokens, elements)
        return t if self.ratios.identity else t * self.ratios.measured_hbm_bytes_per_s / self.ratios.target_hbm_bytes_per_s

    def attention_decode_s(self, seq_heads: np.ndarray, context: np.ndarray) -> np.ndarray:
        t = self.attention.decode_s(seq_heads, context)
        r = self.attention_ratios
        return t if r.identity else t * r.measured_hbm_bytes_per_s / r.target_hbm_bytes_per_s

    def attention_knots(self) -> tuple[np.ndarray, np.ndarray]:
        """Vertices (KV bytes per GPU and layer, seconds) of decode attention on the target GPU."""
        x, y = self.attention.bytes_knots
        r = self.attention_ratios
        return x, (y if r.identity else y * r.measured_hbm_bytes_per_s / r.target_hbm_bytes_per_s)

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


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear interpolation in Python lists (a scalar call ~10x faster than numpy's); linear past the ends."""
    if x <= xs[0]:
        return ys[0] * x / xs[0] if xs[0] > 0 else ys[0]
    if x >= xs[-1]:
        return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
    j = bisect.bisect_right(xs, x) - 1
    return ys[j] + (x - xs[j]) * (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])


class _Tables:
    """Step-time tables of one instance configuration, shaped so the step model keeps the bound's premises.

    ``linear[b]`` is everything but attention at batch ``b``, made non-decreasing by taking, at each
    batch, the cheapest time of any batch at least as large (what an engine that pads batches up to
    its captured CUDA-graph sizes gets; vLLM does). Attention is one convex, non-decreasing function
    of the KV bytes a GPU reads (:meth:`~compute_sched.step_ops.AttentionModel.decode_bytes_s`),
    held as its vertices. So a step never gets cheaper as its batch or context grows and is convex
    in the context: :mod:`compute_sched.bounds` rests on both.
    """

    def __init__(self, linear_s: np.ndarray, attn_knots: tuple[np.ndarray, np.ndarray], bytes_per_token: float,
                 layers: int) -> None:
        lin = np.minimum.accumulate(linear_s[::-1])[::-1]
        lin[0] = 0.0
        self.linear = lin.tolist()  # index b: seconds of everything but attention at batch b (b = 0..knots)
        self.slope = max(0.0, float(lin[-1] - lin[-2]))
        x, y = attn_knots
        self.ax, self.ay = (x / bytes_per_token).tolist(), (y * layers).tolist()  # by context tokens, all layers
        self.a_slope = (self.ay[-1] - self.ay[-2]) / (self.ax[-1] - self.ax[-2]) if len(self.ax) > 1 else 0.0

    def linear_s(self, batch: float) -> float:
        n = len(self.linear) - 1
        if batch >= n:
            return self.linear[n] + self.slope * (batch - n)
        i = int(batch)
        return self.linear[i] + (batch - i) * (self.linear[i + 1] - self.linear[i])

    def attention_s(self, batch: float, context: float) -> float:
        """All layers' decode attention of a batch holding ``context`` tokens in total (the batch size does not enter)."""
        if context <= 0 or batch <= 0:
            return 0.0
        x, y = self.ax, self.ay
        if context >= x[-1]:
            return y[-1] + self.a_slope * (context - x[-1])
        if context <= x[0]:
            return y[0]
        j = bisect.bisect_right(x, context) - 1
        return y[j] + (context - x[j]) * (y[j + 1] - y[j]) / (x[j + 1] - x[j])


_SHARED_TABLES: dict = {}  # (model, gpu, operator set) -> {instance shape or key: table}


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
        # tables depend on the model, the GPU and the measured data only (not on host constants or the network):
        # every model object of the same three shares them, so a scheduler re-planning with fresh objects
        # builds each instance shape's table once per process
        self._tables: dict = _SHARED_TABLES.setdefault((model, gpu, self.ops), {})

    def _clone(self, calibration: Calibration, network: NetworkSeam | None,
               placement: tuple[int, ...] | None) -> "MeasuredPerfModel":
        out = MeasuredPerfModel(self.model, self.gpu, calibration, network=network, placement=placement,
                                operators=self.ops)
        # the tables hold no network terms (TP groups within a server: measured all-reduces; EP and AFD
        # exchanges are added per call), so every copy -- one per instance of a layout -- shares them
        out._tables = self._tables
        return out

    # -- operator sums -----------------------------------------------------------------------
    def _ar_s(self, group: int, nbytes: np.ndarray, cfg: InstanceConfig | None = None) -> np.ndarray:
        """All-reduces: measured NCCL inside a node, the analytical ring across nodes."""
        if group <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=float))
        if group <= self.gpu.gpus_per_node:
            return self.ops.allreduce_s(group, nbytes)
        # across servers the analytical ring, which is affine in the bytes: two evaluations serve the whole array
        fixed = PerfModel._allreduce_s(self, group, 0.0, cfg)
        per_byte = (PerfModel._allreduce_s(self, group, 1e6, cfg) - fixed) / 1e6
        return fixed + per_byte * np.asarray(nbytes, dtype=float)

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
        tokens = np.asarray(tokens, dtype=float).ravel()
        touched = np.broadcast_to(np.asarray(touched_per_gpu, dtype=float).ravel(), tokens.shape)
        # a handful of log-spaced knots carry the whole range: the widths differ at every point, so each is a lookup
        top = max(2.0, float(tokens.max(initial=1.0)))
        knots = np.unique(np.concatenate([np.geomspace(1.0, top, 48), [top]]))
        kt = np.interp(knots, tokens, touched) if tokens.size > 1 else np.full(knots.shape, float(touched[0]))
        kt = np.maximum(kt, 1e-3)
        per_expert = np.maximum(1.0, knots * m.experts_per_token / np.maximum(self._touched(knots), 1e-9))
        vals = (self.ops.gemm_many_s(per_expert, m.d_model, 2 * f * kt)
                + self.ops.gemm_many_s(per_expert, f * kt, m.d_model))
        out = np.interp(tokens, knots, vals)
        return np.where(tokens > 0, out, 0.0)

    def _touched(self, tokens: np.ndarray) -> np.ndarray:
        m = self.model
        if not m.is_moe:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        return m.experts * (1.0 - (1.0 - m.experts_per_token / m.experts) ** np.asarray(tokens, dtype=float))

    def _lm_head_s(self, tokens: np.ndarray, tp: int) -> np.ndarray:
        return self.ops.gemm_s(tokens, self.model.d_model, self.model.vocab / tp)

    def _attn_bytes_per_token(self, shapes: BlockShapes) -> float:
        """KV bytes one GPU reads per context token in one layer (what decode attention's time follows)."""
        return shapes.kv_heads * self.ops.attention.kv_token_bytes(self.model.head_dim)

    def _table(self, cfg: InstanceConfig) -> _Tables:
        tab = self._tables.get(cfg)
        if tab is None:
            tab = self._build(cfg)
            if cfg.tp <= self.gpu.gpus_per_node:  # a TP group across servers times its all-reduces on the network
                self._tables[cfg] = tab
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
            return _Tables(np.where(b > 0, lin, 0.0), self.ops.attention_knots(), self._attn_bytes_per_token(sh), L)
        if cfg.kind == "ep":
            groups = cfg.ep // cfg.tp
            sh = block_shapes(m, cfg.tp)
            per_group = b / groups
            lin = L * (self._dense_block_s(sh, per_group, cfg.tp, cfg)
                       + self._experts_s(b, self._touched(b) / cfg.ep, 1))
            lin = lin + self._lm_head_s(per_group, cfg.tp)
            return _Tables(np.where(b > 0, lin, 0.0), self.ops.attention_knots(), self._attn_bytes_per_token(sh), L)
        raise ValueError(cfg.kind)  # AFD is composed per call (_gpu_step_s)

    def decode_terms(self, cfg: InstanceConfig, batch: float, context_tokens: float) -> dict[str, float]:
        """Seconds of each measured term of one decode step of a TP instance (what a step time is made of).

        >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
        >>> pm = MeasuredPerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
        >>> t = pm.decode_terms(InstanceConfig("tp", tp=8), 128, 128 * 8000)
        >>> sorted(t)
        ['all-reduce', 'attention', 'element-wise', 'host', 'linear layers', 'lm head']
        """
        if cfg.kind != "tp":
            raise ValueError("decode_terms covers TP instances")
        m, o = self.model, self.ops
        b = np.array([float(batch)])
        sh = block_shapes(m, cfg.tp)
        lin = sum(o.gemm_s(b, *x) for x in (sh.qkv, sh.out, sh.mlp_up, sh.mlp_down) if x is not None)
        lin = lin + self._experts_s(b, self._touched(b), cfg.tp)
        gpu = self._gpu_step_s(cfg, batch, context_tokens)
        host = self.cal.step_overhead_s + self.cal.seq_overhead_s * batch
        return {"linear layers": m.layers * float(lin[0]),
                "element-wise": m.layers * float(o.elementwise_s(b, sh.elements)[0]),
                "all-reduce": m.layers * 2 * float(self._ar_s(cfg.tp, b * m.d_model * DTYPE_BYTES, cfg)[0]),
                "attention": self._table(cfg).attention_s(batch, context_tokens),
                "lm head": float(self._lm_head_s(b, cfg.tp)[0]),
                "host": host - self.cal.host_overlap * min(gpu, host)}

    # -- the PerfModel interface -------------------------------------------------------------
    def _gpu_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        return self._measured_step_s(cfg, batch, ctx) + self.model.layers * self.cal.extra_layer_s

    def _measured_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
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

    def decode_steps_s(self, cfg: InstanceConfig, batch: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """:meth:`decode_step_s` over arrays, from the tables in a few numpy calls (TP and EP instances)."""
        b = np.asarray(batch, dtype=float)
        c = np.broadcast_to(np.asarray(context_tokens, dtype=float), b.shape)
        if cfg.kind == "afd" or self.cal.extra_layer_s:
            return super().decode_steps_s(cfg, b, c)
        tab = self._table(cfg)
        lin = np.asarray(tab.linear)
        n = len(lin) - 1
        gpu = np.where(b >= n, lin[n] + tab.slope * (b - n), np.interp(b, np.arange(n + 1, dtype=float), lin))
        groups = cfg.ep // cfg.tp if cfg.kind == "ep" else 1
        cc = c / groups
        ax, ay = np.asarray(tab.ax), np.asarray(tab.ay)
        att = np.where(cc >= ax[-1], ay[-1] + tab.a_slope * (cc - ax[-1]), np.interp(cc, ax, ay))
        gpu = gpu + np.where((cc > 0) & (b > 0), att, 0.0)
        if cfg.kind == "ep":  # the analytical dispatch is affine in the batch: two evaluations serve the array
            d0 = self._ep_dispatch_s(cfg, 0.0)
            d1 = self._ep_dispatch_s(cfg, 1.0) - d0
            gpu = gpu + self.model.layers * (d0 + d1 * b)
        k = self.cal
        host = k.step_overhead_s + k.seq_overhead_s * b
        step = gpu + host - k.host_overlap * np.minimum(gpu, host)
        return np.where(b > 0, k.scale * step + k.offset_s, 0.0)

    def _afd_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        """AFD: attention replicas and FFN GPUs timed from measured operators, the exchange analytical."""
        attn_side, ffn_side = self._afd_tables(cfg)
        reps = cfg.attn_gpus // cfg.tp
        a = attn_side.linear_s(batch) + attn_side.attention_s(batch / reps, ctx / reps)
        f = ffn_side.linear_s(batch)
        x = self.model.layers * self._afd_exchange_s(cfg, batch)
        return self._afd_pipeline_s(batch, a, f, x)

    def _afd_tables(self, cfg: InstanceConfig) -> tuple[_Tables, _Tables]:
        """(attention side, FFN side) of an AFD instance by batch; the attention side carries the LM head."""
        key = ("afd", cfg)
        if key not in self._tables:
            m = self.model
            b = np.arange(0, _BATCH_KNOTS + 1, dtype=float)
            reps = cfg.attn_gpus // cfg.tp
            sh = block_shapes(m, cfg.tp)
            no_mlp = BlockShapes(sh.tp, sh.qkv, sh.out, None, None, sh.q_heads, sh.kv_heads,
                                 {k: v for k, v in sh.elements.items() if k != "mlp_act"})
            a = m.layers * self._dense_block_s(no_mlp, b / reps, cfg.tp, cfg) + self._lm_head_s(b / reps, cfg.tp)
            ffn = block_shapes(m, cfg.tp, cfg.ffn_gpus)
            f = np.zeros_like(b)
            if m.is_moe:
                f = f + m.layers * self._experts_s(b, self._touched(b) / cfg.ffn_gpus, 1)
            if ffn.mlp_up is not None:
                f = f + m.layers * (self.ops.gemm_s(b, *ffn.mlp_up) + self.ops.gemm_s(b, *ffn.mlp_down))
            knots, per_tok = self.ops.attention_knots(), self._attn_bytes_per_token(sh)
            self._tables[key] = (_Tables(np.where(b > 0, a, 0.0), knots, per_tok, m.layers),  # type: ignore[index]
                                 _Tables(np.where(b > 0, f, 0.0), knots, per_tok, m.layers))
        return self._tables[key]  # type: ignore[index]

    def _prefill_table(self, cfg: InstanceConfig) -> tuple[list[float], list[float], list[float], list[float]]:
        """Log-spaced token counts and the prefill's token-driven seconds there (everything but attention and LM
        head), with the causal attention of one chunk of each count."""
        key = ("prefill", cfg)
        if key not in self._tables:
            m = self.model
            tokens = np.unique(np.round(np.geomspace(1.0, 2.0 ** 24, 193)))
            groups = (cfg.ep // cfg.tp) if cfg.kind == "ep" else (cfg.attn_gpus // cfg.tp if cfg.kind == "afd" else 1)
            sh = block_shapes(m, cfg.tp, cfg.ffn_gpus if cfg.kind == "afd" else None)
            # TP groups: the measured all-reduces; EP and AFD: the analytical model's communication (no profile)
            t = self._dense_block_s(sh, tokens / groups, cfg.tp if cfg.kind == "tp" else 1, cfg)
            if m.is_moe:
                experts_gpus = cfg.ep if cfg.kind == "ep" else (cfg.ffn_gpus if cfg.kind == "afd" else 1)
                t = t + self._experts_s(tokens, self._touched(tokens) / experts_gpus, cfg.tp if cfg.kind == "tp" else 1)
            attn = m.layers * self.ops.attention_prefill_s(sh.q_heads, tokens)
            head = self._lm_head_s(tokens, cfg.tp)
            tab = (tokens.tolist(), (m.layers * t).tolist(), attn.tolist(), head.tolist())
            if cfg.tp > self.gpu.gpus_per_node:  # all-reduces across servers depend on the network: not shared
                return tab
            self._tables[key] = tab  # type: ignore[index]
        return self._tables[key]  # type: ignore[index]

    def prefill_s(self, cfg: InstanceConfig, tokens: float, mean_context: float | None = None) -> float:
        """Seconds to prefill ``tokens`` tokens with mean causal context ``mean_context`` (default ``tokens / 2``).

        The tokens are split evenly over the instance's attention groups; causal attention of all of
        them is timed as one chunk of the same FLOPs (``n = sqrt(2 x tokens x mean_context)``), and the
        LM head runs for each sequence's last token (``tokens / (2 x mean_context)`` sequences).
        """
        if tokens <= 0:
            return 0.0
        ctx = tokens / 2.0 if mean_context is None else float(mean_context)
        groups = (cfg.ep // cfg.tp) if cfg.kind == "ep" else (cfg.attn_gpus // cfg.tp if cfg.kind == "afd" else 1)
        grid, body, attn, head = self._prefill_table(cfg)
        per = tokens / groups
        chunk = math.sqrt(max(2.0 * per * max(ctx, 1.0), 1.0))
        seqs = max(1.0, per / max(1.0, 2.0 * ctx))
        total = _interp(tokens, grid, body) + _interp(chunk, grid, attn) + _interp(seqs, grid, head)
        if cfg.kind != "tp":
            total += self._prefill_comm_s(cfg, tokens)
        total += self.model.layers * self.cal.extra_layer_s
        return self.cal.scale * total + self.cal.offset_s
