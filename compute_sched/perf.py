"""Roofline performance model of one generation instance: decode step, prefill, KV capacity.

Design note
-----------
Decoding is memory-bound: every step reads the weights a GPU holds plus the KV cache of every
sequence in the batch, and at large batches the weight GEMMs turn compute-bound. GEMMs and
attention are separate kernels, so each is bounded by its own resource and a step costs
``max(weight bytes, GEMM FLOPs) + max(KV bytes, attention FLOPs) + communication + overheads``
(attention's KV read cannot hide a compute-bound GEMM). Communication is what the
configuration adds (TP all-reduces, EP all-to-alls, AFD's per-layer M2N exchange) in an alpha-beta
model (per-hop latency plus bytes over the link that carries it: NVLink inside a node, the NIC
across nodes -- or, with a :class:`~compute_sched.netseam.NetworkSeam`, the rate the fabric gives
the instance's pattern at its placement). AFD overlaps its three stages with two micro-batches when the batch is large enough
and pays their sum when it is not, which is why it loses in the long tail (§4.1). The constants
that datasheets do not give (efficiencies, latencies, overheads, the engine's batch limit) are
:class:`Calibration` fields; :func:`calibrate` fits a scale and offset to measured steps and
:mod:`compute_sched.calibration` fits the constants themselves to the paper's §2.1 times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from orchestrl.compute_sched.hardware import DTYPE_BYTES, GpuSpec, ModelSpec
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.netseam import NetworkSeam
from orchestrl.fabric.errors import ConfigError

__all__ = ["Calibration", "PerfModel", "Plane", "MeasuredStep", "calibrate"]


@dataclass(frozen=True)
class Calibration:
    """Constants of the roofline that datasheets do not give; defaults are typical of vLLM on Hopper."""

    mem_efficiency: float = 0.80  # achieved / peak HBM bandwidth in decode kernels
    compute_efficiency: float = 0.55  # achieved / peak bf16 FLOPs in decode GEMMs
    prefill_efficiency: float = 0.60  # achieved / peak bf16 FLOPs in prefill
    link_efficiency: float = 0.45  # achieved / link bandwidth for the MB-sized collectives of decode
    allreduce_latency_s: float = 6e-6  # fixed cost of one intra-node all-reduce
    custom_allreduce: bool = True  # vLLM's custom all-reduce inside a node; False: NCCL's ring, as veRL runs
    # vLLM (disable_custom_all_reduce=True)
    one_shot_max_bytes: float = 256 * 1024  # up to this size the custom all-reduce is one-shot
    hop_latency_s: float = 3e-6  # per ring step of an intra-node NCCL all-reduce
    net_hop_latency_s: float = 8e-6  # per ring hop across nodes (RDMA)
    a2a_latency_s: float = 10e-6  # fixed cost of one all-to-all / M2N exchange
    layer_overhead_s: float = 4e-6  # kernel launches per layer that parallelism does not shrink
    extra_layer_s: float = 0.0  # time added to every layer of every step by something outside the kernels (RLSim's
    # Figure 22: two OCS reconfigurations per MoE layer); both step models add it
    step_overhead_s: float = 1.5e-3  # scheduler, sampling and bookkeeping per engine step
    host_overlap: float = 0.0  # share of the shorter of host and GPU time hidden under the other: 0 sums them
    # (a synchronous engine loop), 1 takes their maximum (scheduling step n+1 while the GPU runs step n)
    seq_overhead_s: float = 4e-6  # per sequence per step on the instance's host and sampling rank (scheduling,
    # sampling, output processing): the instance does it once for its whole batch, TP does not shrink it
    mem_utilization: float = 0.90  # share of HBM the engine may use (vLLM gpu_memory_utilization)
    activation_reserve_bytes: float = 3e9  # activations, CUDA graphs, allocator slack per GPU
    max_num_seqs: int = 512  # sequences one instance decodes at once (vLLM max_num_seqs); the rest queue
    afd_microbatch_min: int = 64  # AFD overlaps two micro-batches only at or above 2x this batch
    scale: float = 1.0  # fitted by :func:`calibrate`: step = scale * roofline + offset_s
    offset_s: float = 0.0


@dataclass(frozen=True)
class Plane:
    """Affine bound ``fixed_s + per_seq_s * B + per_ctx_s * C`` on a decode step (B seqs, C context tokens)."""

    fixed_s: float
    per_seq_s: float
    per_ctx_s: float

    def at(self, batch: float, context_tokens: float) -> float:
        return self.fixed_s + self.per_seq_s * batch + self.per_ctx_s * context_tokens


@dataclass(frozen=True)
class MeasuredStep:
    """One measured decode step, for :func:`calibrate`."""

    config: InstanceConfig
    batch: int
    context_tokens: float
    step_s: float


class PerfModel:
    """Step times and KV capacity of ``model`` on ``gpu`` under any :class:`InstanceConfig`.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> tp2, tp8 = InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8)
    >>> pm.decode_step_s(tp8, 4, 4 * 12000) < pm.decode_step_s(tp2, 4, 4 * 12000)  # tail: TP=8 faster
    True

    ``network`` (a :class:`~compute_sched.netseam.NetworkSeam`) replaces the NIC rate of the
    cross-node terms by the fabric's; None keeps the NIC rate. :meth:`at` binds the model to one
    instance's GPUs, so its rate is that of its placement.
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None, *,
                 network: NetworkSeam | None = None, placement: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.gpu = gpu
        self.cal = calibration or Calibration()
        self.network = network  # None: cross-node bytes at the NIC rate (the profiled model of §4.1)
        self.placement = placement  # cluster-local GPUs of the one instance this model times (None: any)

    #: Name of the step model (``perf_model(..., step_model=...)``): this class is the analytical roofline.
    step_model = "analytical"

    def _clone(self, calibration: Calibration, network: NetworkSeam | None,
               placement: tuple[int, ...] | None) -> "PerfModel":
        """A copy with other constants or rates; subclasses (the measured step model) keep their class."""
        return type(self)(self.model, self.gpu, calibration, network=network, placement=placement)

    def with_calibration(self, calibration: Calibration) -> "PerfModel":
        return self._clone(calibration, self.network, self.placement)

    def with_network(self, network: NetworkSeam | None) -> "PerfModel":
        """Return this model with its cross-node rates taken from ``network`` (None: the NIC)."""
        return self._clone(self.cal, network, None)

    def at(self, gpu_ids: tuple[int, ...]) -> "PerfModel":
        """Return this model for the instance on ``gpu_ids`` (itself when there is no network seam)."""
        if self.network is None:
            return self
        return self._clone(self.cal, self.network, tuple(gpu_ids))

    # -- memory -------------------------------------------------------------------------------
    def _ffn_side_bytes(self) -> float:
        """Bytes of the layers AFD moves to FFN GPUs (routed experts; the MLPs of a dense model)."""
        m = self.model
        if m.is_moe:
            return m.expert_params * DTYPE_BYTES
        return float(m.layers * 3 * m.d_model * m.ffn_intermediate * DTYPE_BYTES)

    def weights_per_gpu_bytes(self, cfg: InstanceConfig) -> float:
        """Weight bytes on the most loaded GPU of an instance."""
        m = self.model
        if cfg.kind == "tp":
            return m.weight_bytes / cfg.tp
        if cfg.kind == "ep":
            return m.dense_params * DTYPE_BYTES / cfg.tp + m.expert_params * DTYPE_BYTES / cfg.ep
        attn = (m.weight_bytes - self._ffn_side_bytes()) / cfg.tp
        return max(attn, self._ffn_side_bytes() / cfg.ffn_gpus)

    def _kv_split(self, tp: int) -> int:
        return min(tp, self.model.kv_heads)  # beyond kv_heads, KV heads are replicated

    def _kv_replicas(self, cfg: InstanceConfig) -> int:
        """Independent KV pools of an instance (DP-attention groups or AFD attention replicas)."""
        if cfg.kind == "ep":
            return cfg.ep // cfg.tp
        if cfg.kind == "afd":
            return cfg.attn_gpus // cfg.tp
        return 1

    def kv_capacity_tokens(self, cfg: InstanceConfig) -> int:
        """Tokens of KV cache the instance can hold; 0 when the weights do not fit."""
        c, m = self.cal, self.model
        budget = self.gpu.hbm_bytes * c.mem_utilization - c.activation_reserve_bytes
        if cfg.kind == "afd":
            if self._ffn_side_bytes() / cfg.ffn_gpus > budget:
                return 0
            free = budget - (m.weight_bytes - self._ffn_side_bytes()) / cfg.tp
        else:
            free = budget - self.weights_per_gpu_bytes(cfg)
        if free <= 0:
            return 0
        per_gpu_per_token = m.kv_bytes_per_token / self._kv_split(cfg.tp)
        return int(free / per_gpu_per_token) * self._kv_replicas(cfg)

    def fits(self, cfg: InstanceConfig, min_tokens: int = 16384) -> bool:
        """Whether the weights fit with room for at least ``min_tokens`` of KV cache."""
        return self.kv_capacity_tokens(cfg) >= min_tokens

    # -- communication ------------------------------------------------------------------------
    def _net_bytes_per_s(self, cfg: InstanceConfig | None) -> float:
        """Per-GPU cross-node bytes/s of an instance of ``cfg``: the NIC, or what the network seam gives."""
        if self.network is None or cfg is None:
            return self.gpu.nic_bytes_per_s
        return self.network.link_bytes_per_s(cfg, self.placement)

    def _link(self, gpus: int, cfg: InstanceConfig | None = None) -> tuple[float, float]:
        """(bytes/s, per-hop latency) of a group of ``gpus`` GPUs: NVLink inside a node, else the network."""
        c = self.cal
        if gpus <= self.gpu.gpus_per_node:
            return self.gpu.nvlink_bytes_per_s * c.link_efficiency, c.hop_latency_s
        return self._net_bytes_per_s(cfg) * c.link_efficiency, c.net_hop_latency_s

    def _allreduce_s(self, group: int, nbytes: float, cfg: InstanceConfig | None = None) -> float:
        """All-reduce of ``nbytes`` over ``group`` GPUs, as vLLM does it.

        Inside a node, vLLM's custom all-reduce reads peers over NVLink directly: one shot
        (``(n-1) S`` bytes per GPU) for small buffers, reduce-scatter + all-gather (``2 (n-1)/n S``)
        for large ones, each at a latency that does not grow with ``n``. With it disabled
        (``custom_allreduce=False``), NCCL's ring moves ``2 (n-1)/n S`` per GPU in ``2 (n-1)``
        steps. Across nodes, a ring.
        """
        if group <= 1:
            return 0.0
        bw, hop = self._link(group, cfg)
        if group <= self.gpu.gpus_per_node and not self.cal.custom_allreduce:
            return self.cal.allreduce_latency_s + 2 * (group - 1) * hop + 2 * (group - 1) / group * nbytes / bw
        if group <= self.gpu.gpus_per_node:
            one_shot = (group - 1) * nbytes
            two_shot = 2 * (group - 1) / group * nbytes
            return self.cal.allreduce_latency_s + (one_shot if nbytes <= self.cal.one_shot_max_bytes else two_shot) / bw
        return 2 * (group - 1) * hop + 2 * (group - 1) / group * nbytes / bw

    def _touched_experts(self, tokens: float) -> float:
        """Expected distinct experts a layer reads for ``tokens`` tokens routed top-k uniformly."""
        m = self.model
        if not m.is_moe or tokens <= 0:
            return 0.0
        return m.experts * (1.0 - (1.0 - m.experts_per_token / m.experts) ** tokens)

    # -- decode -------------------------------------------------------------------------------
    def _attention_s(self, tp: int, ctx: float, hbm: float, flops: float) -> float:
        """Attention of one step on a TP group holding ``ctx`` context tokens: KV read or FLOPs, whichever binds.

        A kernel of its own, next to the weight GEMMs (see the module note); ``hbm`` and ``flops``
        are the achieved bytes/s and FLOP/s.
        """
        m = self.model
        return max(ctx * m.kv_bytes_per_token / self._kv_split(tp) / hbm,
                   4.0 * m.layers * m.attention_dim * ctx / tp / flops)

    def _roofline_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        """Uncalibrated decode step time (seconds) for ``batch`` sequences holding ``ctx`` context tokens."""
        c = self.cal
        gpu = self._gpu_step_s(cfg, batch, ctx)
        host = c.step_overhead_s + c.seq_overhead_s * batch
        return gpu + host - c.host_overlap * min(gpu, host)

    def _gpu_step_s(self, cfg: InstanceConfig, batch: float, ctx: float) -> float:
        """GPU time of one decode step: kernels and collectives, without the host's share."""
        m, g, c = self.model, self.gpu, self.cal
        hbm = g.hbm_bytes_per_s * c.mem_efficiency
        flops = g.bf16_flops * c.compute_efficiency
        act = batch * m.d_model * DTYPE_BYTES  # one hidden state per sequence
        overhead = m.layers * (c.layer_overhead_s + c.extra_layer_s)
        expert_bytes = self._touched_experts(batch) * m.expert_bytes_each * m.layers
        if cfg.kind == "tp":
            gemm = max((m.dense_params * DTYPE_BYTES + expert_bytes) / cfg.tp / hbm,
                       2.0 * m.active_params * batch / cfg.tp / flops)
            attn = self._attention_s(cfg.tp, ctx, hbm, flops)
            comm = 2 * m.layers * self._allreduce_s(cfg.tp, act, cfg)
            return gemm + attn + comm + overhead
        if cfg.kind == "ep":
            groups = cfg.ep // cfg.tp
            b, cx = batch / groups, ctx / groups
            touched_per_gpu = self._touched_experts(batch) / cfg.ep
            expert_flops = 2.0 * (m.active_params - m.dense_params) * batch / cfg.ep
            gemm = max((m.dense_params * DTYPE_BYTES / cfg.tp + touched_per_gpu * m.expert_bytes_each * m.layers) / hbm,
                       (2.0 * m.dense_params * b / cfg.tp + expert_flops) / flops)
            attn = self._attention_s(cfg.tp, cx, hbm, flops)
            comm = m.layers * (self._ep_dispatch_s(cfg, batch) + 2 * self._allreduce_s(cfg.tp, b * m.d_model
                                                                                      * DTYPE_BYTES))
            return gemm + attn + comm + overhead
        # AFD: attention replicas <-> FFN GPUs every layer, pipelined over micro-batches when large.
        reps = cfg.attn_gpus // cfg.tp
        b, cx = batch / reps, ctx / reps
        attn_bytes = (m.weight_bytes - self._ffn_side_bytes()) / cfg.tp
        ffn_active = (m.active_params - m.dense_params) if m.is_moe else self._ffn_side_bytes() / DTYPE_BYTES
        a_gemm = max(attn_bytes / hbm, 2.0 * (m.active_params - ffn_active) * b / cfg.tp / flops)
        a_attn = self._attention_s(cfg.tp, cx, hbm, flops)
        a = a_gemm + a_attn + 2 * m.layers * self._allreduce_s(cfg.tp, b * m.d_model * DTYPE_BYTES)
        ffn_read = (expert_bytes if m.is_moe else self._ffn_side_bytes()) / cfg.ffn_gpus
        f = max(ffn_read / hbm, 2.0 * ffn_active * batch / cfg.ffn_gpus / flops)
        x = m.layers * self._afd_exchange_s(cfg, batch)
        return self._afd_pipeline_s(batch, a, f, x) + overhead

    def _ep_dispatch_s(self, cfg: InstanceConfig, batch: float) -> float:
        """One layer's expert-parallel dispatch and combine (two all-to-alls) of ``batch`` tokens."""
        m, c = self.model, self.cal
        bw, _ = self._link(cfg.ep, cfg)
        a2a_bytes = batch / cfg.ep * m.experts_per_token * m.d_model * DTYPE_BYTES * (cfg.ep - 1) / cfg.ep
        return 2 * (c.a2a_latency_s + a2a_bytes / bw)

    def _afd_exchange_s(self, cfg: InstanceConfig, batch: float) -> float:
        """One layer's attention -> FFN -> attention exchange of AFD (the M2N hop and back) for ``batch`` tokens."""
        m, c = self.model, self.cal
        fan = min(m.experts_per_token, cfg.ffn_gpus) if m.is_moe else 1
        per_link = 2.0 * batch * m.d_model * DTYPE_BYTES * fan / min(cfg.attn_gpus, cfg.ffn_gpus)
        bw = self._net_bytes_per_s(cfg) * c.link_efficiency
        return 2 * c.a2a_latency_s + per_link / bw

    def _afd_pipeline_s(self, batch: float, a: float, f: float, x: float) -> float:
        """AFD's attention, FFN and exchange times overlapped over two micro-batches when the batch is large."""
        micro = 2 if batch >= 2 * self.cal.afd_microbatch_min else 1
        return (a + f + x + (micro - 1) * max(a, f, x)) / micro

    def decode_step_s(self, cfg: InstanceConfig, batch: float, context_tokens: float) -> float:
        """Seconds of one decode step of ``batch`` sequences holding ``context_tokens`` in total."""
        if batch <= 0:
            return 0.0
        return self.cal.scale * self._roofline_s(cfg, batch, context_tokens) + self.cal.offset_s

    def decode_steps_s(self, cfg: InstanceConfig, batch: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """:meth:`decode_step_s` over arrays of batches and contexts (one value per pair).

        The analytical model evaluates each pair; the measured step model answers from its tables at once.
        """
        b = np.asarray(batch, dtype=float)
        c = np.broadcast_to(np.asarray(context_tokens, dtype=float), b.shape)
        return np.array([self.decode_step_s(cfg, float(x), float(y)) for x, y in zip(b.ravel(), c.ravel())]
                        ).reshape(b.shape)

    def decode_planes(self, cfg: InstanceConfig, hints: Sequence[tuple[float, float]]) -> list[Plane]:
        """Tangent planes of the step time at each ``(batch, context_tokens)`` hint.

        The step time is a maximum of affine pieces in (B, C) for a fixed routing, so the maximum of
        these planes approximates it from below and is exact at the hints; the planner uses them to
        keep Eq. 1 linear.
        """
        planes = []
        for b, cx in hints:
            b, cx = max(b, 1.0), max(cx, 1.0)
            db, dc = max(1.0, 0.05 * b), max(256.0, 0.05 * cx)
            base = self.decode_step_s(cfg, b, cx)
            per_seq = (self.decode_step_s(cfg, b + db, cx) - base) / db
            per_ctx = (self.decode_step_s(cfg, b, cx + dc) - base) / dc
            per_seq, per_ctx = max(per_seq, 0.0), max(per_ctx, 0.0)
            planes.append(Plane(base - per_seq * b - per_ctx * cx, per_seq, per_ctx))
        return planes

    # -- prefill ------------------------------------------------------------------------------
    def prefill_s(self, cfg: InstanceConfig, tokens: float, mean_context: float | None = None) -> float:
        """Seconds to prefill (or recompute) ``tokens`` tokens whose mean causal context is ``mean_context``."""
        if tokens <= 0:
            return 0.0
        m, g, c = self.model, self.gpu, self.cal
        ctx = tokens / 2.0 if mean_context is None else mean_context
        flops = 2.0 * m.active_params * tokens + 4.0 * m.layers * m.attention_dim * tokens * ctx / 2.0
        comp = flops / (cfg.gpus * g.bf16_flops * c.prefill_efficiency)
        mem = self.weights_per_gpu_bytes(cfg) / (g.hbm_bytes_per_s * c.mem_efficiency)
        comm = self._prefill_comm_s(cfg, tokens)
        return (self.cal.scale * (max(comp, mem) + comm + m.layers * (c.layer_overhead_s + c.extra_layer_s))
                + self.cal.offset_s)

    def _prefill_comm_s(self, cfg: InstanceConfig, tokens: float) -> float:
        """Communication of a prefill of ``tokens``: two all-reduces per layer over the TP (EP) group."""
        m = self.model
        group = cfg.tp if cfg.kind != "ep" else cfg.ep
        return 2 * m.layers * PerfModel._allreduce_s(self, group, tokens / max(1, cfg.gpus // cfg.tp) * m.d_model
                                                     * DTYPE_BYTES, cfg)


def calibrate(perf: PerfModel, points: Iterable[MeasuredStep]) -> PerfModel:
    """Return ``perf`` with ``scale`` and ``offset_s`` fitted to measured decode steps (least squares).

    Raises
    ------
    ConfigError
        With fewer than two points, or when the fit would give a non-positive scale.

    Notes
    -----
    O(P) for P points.

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> cfg = InstanceConfig("tp", tp=2)
    >>> pts = [MeasuredStep(cfg, b, b * 2000.0, 1.2 * pm.decode_step_s(cfg, b, b * 2000.0) + 0.001)
    ...        for b in (8, 64, 256)]
    >>> round(calibrate(pm, pts).cal.scale, 3)
    1.2
    """
    pts = list(points)
    if len(pts) < 2:
        raise ConfigError("calibrate", "points", f"got {len(pts)} measured steps", "two or more")
    raw = perf.with_calibration(replace(perf.cal, scale=1.0, offset_s=0.0))
    x = np.array([[raw.decode_step_s(p.config, p.batch, p.context_tokens), 1.0] for p in pts])
    y = np.array([p.step_s for p in pts])
    (scale, offset), *_ = np.linalg.lstsq(x, y, rcond=None)
    if scale <= 0:
        raise ConfigError("calibrate", "points", f"measured times give scale {scale:.3g}",
                          "steps that grow with batch and context")
    return perf.with_calibration(replace(perf.cal, scale=float(scale), offset_s=float(offset)))
