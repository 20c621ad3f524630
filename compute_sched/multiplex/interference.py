"""The modelled slowdown grid: an interference model of two sub-stages on disjoint SMs, fitted to JigsawRL.

Design note
-----------
Each sub-stage kind is a pair of kernel groups, priced by the roofline of the project's hardware
table (``compute_sched/specs/gpus``) for a reference model (Qwen3-4B, the model of the paper's
Fig. 7): a compute-bound share ``c`` of its time (GEMMs at large token counts) and a memory-bound
share ``1 - c`` (weight and KV reads). On a share ``sigma`` of the SMs:

* the compute-bound share slows as ``sigma ** -alpha`` (``alpha < 1``: fewer SMs lose less than
  their share, because a kernel alone on the whole GPU does not keep every SM busy);
* the memory-bound share keeps a saturating share of the HBM bandwidth,
  ``beta(sigma) = (1 + k) sigma / (sigma + k)`` (a few SMs already pull most of it; ``k`` small);
* next to a co-runner on the other SMs, only HBM bandwidth is shared: if the two kernels'
  demands (each ``hbm_util / alone_slowdown``) add up to more than the peak, both memory-bound
  shares stretch by the sum (proportional sharing).

Memory levels (the second axis): a rollout kind's KV pool shrinks with its level and caps its batch,
so its time per token follows :class:`~compute_sched.perf.PerfModel` at the batch that fits; training
and reference run smaller micro-batches, paying a fixed per-micro-batch cost (weights read in
forward and backward) over fewer tokens. Neither is fitted.

The fit (:func:`fit`): ``alpha`` and ``k`` by least squares to the paper's Fig. 7 text --
compute-bound sub-stages (training, large-batch rollout) "up to 2.7x slower with 25% SMs", small-batch
rollout "largely insensitive" (read as 1.05x at 25%, an assumption). Not fitted, so checked
(:func:`held_out`): Fig. 8's "two compute-bound sub-stages up to 2.19x" (read at an even split) and
§4.2's "32B rollout 1.43x slower when memory drops from 80% to 40%" (Qwen3-32B on 4 GPUs, TP4), and
every point of the measured H100 grid (:mod:`compute_sched.multiplex.compare`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import least_squares

from orchestrl.compute_sched.hardware import DTYPE_BYTES, GpuSpec, ModelSpec, load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.multiplex.grid import (KINDS, MEM_LEVELS_PCT, SM_BUDGETS_PCT, GridPoint, SlowdownGrid)
from orchestrl.compute_sched.perf import PerfModel

__all__ = ["KindProfile", "InterferenceParams", "PAPER_TARGETS", "kind_profiles", "slowdown", "fit", "held_out",
           "modelled_grid", "memory_curve"]

#: The paper's published measurements this model is fitted to (fit) or checked on (held out).
PAPER_TARGETS = {
    "fig7_compute_bound_at_25pct": (2.7, "fit", "Fig. 7: training and large-batch rollout up to 2.7x at 25% SMs"),
    "fig7_small_batch_at_25pct": (1.05, "fit", "Fig. 7: small-batch rollout 'largely insensitive' (1.05x assumed)"),
    "fig8_compute_pair_even_split": (2.19, "held out", "Fig. 8: two compute-bound sub-stages, up to 2.19x"),
    "sec42_32b_rollout_mem_40_vs_80": (1.43, "held out", "§4.2: Qwen3-32B rollout on 4 H100s, memory 80% -> 40%"),
}

# Reference shapes of the kinds (§4.1's buckets; Fig. 7's "large-batch (> 256)" and "small-batch (< 128)").
DECODE_LARGE_BATCH, DECODE_SMALL_BATCH, DECODE_CONTEXT = 256, 32, 1024
PREFILL_TOKENS, TRAIN_TOKENS = 4096, 8192
_EFF = {"compute": 0.6, "memory": 0.8}  # achieved / peak, as compute_sched.perf.Calibration's defaults


@dataclass(frozen=True)
class KindProfile:
    """A kind's roofline split alone on the whole GPU."""

    compute_frac: float  # share of its time in compute-bound kernels
    hbm_util: float  # average share of peak HBM bandwidth it uses


@dataclass(frozen=True)
class InterferenceParams:
    alpha: float = 0.72  # compute-bound share slows as sigma ** -alpha
    k: float = 0.017  # HBM bandwidth reached on a share sigma of the SMs: (1 + k) sigma / (sigma + k)

    def bandwidth(self, sigma: float) -> float:
        return (1.0 + self.k) * sigma / (sigma + self.k)


def _split(t_compute: float, t_memory: float) -> tuple[float, float]:
    """(compute-bound seconds, memory-bound seconds) of one kernel: whichever bound binds takes it all."""
    return (t_compute, 0.0) if t_compute >= t_memory else (0.0, t_memory)


def kind_profiles(model: ModelSpec, gpu: GpuSpec) -> dict[str, KindProfile]:
    """Return each kind's roofline split for ``model`` on one ``gpu`` (weights and KV read from HBM).

    >>> p = kind_profiles(load_model("Qwen3-4B"), load_gpu("H100"))
    >>> p["train"].compute_frac, round(p["decode_small"].compute_frac, 2)
    (1.0, 0.0)
    """
    flops = gpu.bf16_flops * _EFF["compute"]
    bw = gpu.hbm_bytes_per_s * _EFF["memory"]
    w = model.params_total * DTYPE_BYTES
    kv = model.kv_bytes_per_token
    attn_flops_per_ctx = 4.0 * model.layers * model.query_heads * model.head_dim

    def decode(batch: int) -> KindProfile:
        g = _split(2.0 * model.params_total * batch / flops, w / bw)
        a = _split(attn_flops_per_ctx * batch * DECODE_CONTEXT / flops, kv * batch * DECODE_CONTEXT / bw)
        c, m = g[0] + a[0], g[1] + a[1]
        byts = w + kv * batch * DECODE_CONTEXT
        return KindProfile(c / (c + m), min(1.0, byts / ((c + m) * gpu.hbm_bytes_per_s)))

    def dense(tokens: int, passes: float) -> KindProfile:
        f = passes * 2.0 * model.params_total * tokens + passes * attn_flops_per_ctx * tokens * 1024 / 2
        c, m = _split(f / flops, passes * w / bw)
        return KindProfile(c / (c + m), min(1.0, passes * w / ((c + m) * gpu.hbm_bytes_per_s)))

    return {"train": dense(TRAIN_TOKENS, 3.0), "reference": dense(TRAIN_TOKENS, 1.0),
            "prefill": dense(PREFILL_TOKENS, 1.0), "decode_large": decode(DECODE_LARGE_BATCH),
            "decode_small": decode(DECODE_SMALL_BATCH)}


def _alone(p: KindProfile, sigma: float, q: InterferenceParams) -> float:
    return p.compute_frac * sigma ** -q.alpha + (1.0 - p.compute_frac) / q.bandwidth(sigma)


def slowdown(a: KindProfile, b: KindProfile | None, sigma_a: float, q: InterferenceParams) -> float:
    """Time of ``a`` on ``sigma_a`` of the SMs (next to ``b`` on the rest) over its time alone on all of them."""
    ta = _alone(a, sigma_a, q)
    if b is None:
        return ta
    tb = _alone(b, 1.0 - sigma_a, q)
    demand = a.hbm_util / ta + b.hbm_util / tb
    stretch = max(1.0, demand)
    return a.compute_frac * sigma_a ** -q.alpha + (1.0 - a.compute_frac) / q.bandwidth(sigma_a) * stretch


def _fig7(profiles: dict[str, KindProfile], q: InterferenceParams) -> tuple[float, float]:
    compute = max(_alone(profiles[k], 0.25, q) for k in ("train", "decode_large"))
    return compute, _alone(profiles["decode_small"], 0.25, q)


@lru_cache(maxsize=None)
def fit(gpu_name: str = "H100") -> InterferenceParams:
    """Return ``alpha`` and ``k`` fitted to Fig. 7 (Qwen3-4B on ``gpu_name``; bounded least squares).

    >>> q = fit()
    >>> round(q.alpha, 3), round(q.k, 4)
    (0.716, 0.0169)
    """
    prof = kind_profiles(load_model("Qwen3-4B"), load_gpu(gpu_name))
    t_c = PAPER_TARGETS["fig7_compute_bound_at_25pct"][0]
    t_s = PAPER_TARGETS["fig7_small_batch_at_25pct"][0]

    def resid(x: np.ndarray) -> np.ndarray:
        c, s = _fig7(prof, InterferenceParams(float(x[0]), float(x[1])))
        return np.array([math.log(c / t_c), math.log(s / t_s)])

    sol = least_squares(resid, x0=np.array([0.8, 0.05]), bounds=([0.1, 1e-4], [2.0, 1.0]))
    return InterferenceParams(float(sol.x[0]), float(sol.x[1]))


def memory_curve(kind: str, model: ModelSpec, gpu: GpuSpec, tp: int = 1, train_shards: int = 4) -> dict[int, float]:
    """Return ``{level: time per token at level / at 80%}`` for ``kind`` (inf where its weights do not fit).

    Rollout kinds: the KV pool at a level caps the decode batch (``PerfModel`` prices the step);
    training and reference: the micro-batch that fits, with one weight read per micro-batch and pass;
    training state (bf16 weights and gradients, fp32 Adam moments and master weights: 16 bytes a
    parameter) is sharded over ``train_shards`` GPUs (FSDP, as the paper trains; Fig. 9 uses 4).
    """
    pm = PerfModel(model, gpu)
    cfg = InstanceConfig("tp", tp=tp)
    budget = gpu.hbm_bytes * pm.cal.mem_utilization
    weights = model.weight_bytes / tp
    out: dict[int, float] = {}
    if kind in ("decode_large", "decode_small", "prefill"):
        want = DECODE_LARGE_BATCH if kind == "decode_large" else DECODE_SMALL_BATCH
        per_token: dict[int, float] = {}
        for lvl in MEM_LEVELS_PCT:
            free = budget * lvl / 80.0 - weights - pm.cal.activation_reserve_bytes * lvl / 80.0
            kv_tokens = free / (model.kv_bytes_per_token / min(tp, model.kv_heads))
            batch = min(want, int(kv_tokens // (2 * DECODE_CONTEXT)))  # room to grow to twice the context
            if kind == "prefill":
                per_token[lvl] = 1.0 if batch >= 1 else math.inf  # a chunked prefill needs no large pool
            else:
                per_token[lvl] = (pm.decode_step_s(cfg, batch, batch * DECODE_CONTEXT) / batch) if batch >= 1 \
                    else math.inf
        if not math.isfinite(per_token[80]):
            return {lvl: math.inf for lvl in MEM_LEVELS_PCT}
        return {lvl: per_token[lvl] / per_token[80] for lvl in MEM_LEVELS_PCT}
    passes = 3.0 if kind == "train" else 1.0
    state = (16.0 * model.params_total / train_shards) if kind == "train" else weights
    act_per_seq = 34.0 * model.d_model * 1024 * model.layers / tp  # activations of a 1,024-token sequence
    flops = gpu.bf16_flops * _EFF["compute"]
    bw = gpu.hbm_bytes_per_s * _EFF["memory"]
    times = {}
    for lvl in MEM_LEVELS_PCT:
        mb = int((budget * lvl / 80.0 - state) // act_per_seq)
        if mb < 1:
            times[lvl] = math.inf
            continue
        per_mb = passes * (2.0 * model.params_total / tp * mb * 1024 / flops + weights / bw)
        times[lvl] = per_mb / mb
    if not math.isfinite(times[80]):
        return {lvl: math.inf for lvl in MEM_LEVELS_PCT}
    return {lvl: times[lvl] / times[80] for lvl in MEM_LEVELS_PCT}


def held_out(q: InterferenceParams | None = None, gpu_name: str = "H100") -> dict[str, tuple[float, float]]:
    """Return ``{target: (paper, model)}`` for every paper number, fitted or held out (see PAPER_TARGETS)."""
    q = q or fit(gpu_name)
    gpu = load_gpu(gpu_name)
    prof = kind_profiles(load_model("Qwen3-4B"), gpu)
    comp, small = _fig7(prof, q)
    pair = max(slowdown(prof[a], prof[b], 0.5, q) for a in ("train", "decode_large", "prefill")
               for b in ("train", "decode_large", "prefill"))
    mem32 = memory_curve("decode_large", load_model("Qwen3-32B"), gpu, tp=4)[40]
    ours = {"fig7_compute_bound_at_25pct": comp, "fig7_small_batch_at_25pct": small,
            "fig8_compute_pair_even_split": pair, "sec42_32b_rollout_mem_40_vs_80": mem32}
    return {k: (PAPER_TARGETS[k][0], ours[k]) for k in PAPER_TARGETS}


def modelled_grid(model: str = "Qwen3-4B", gpu: str = "H100", tp: int = 1, train_shards: int = 4) -> SlowdownGrid:
    """Return the modelled grid for ``model`` on ``gpu``: every kind alone and in every ordered pair, at the
    four SM budgets and four memory levels (§4.2), each point's ``source`` naming the model and its fit.

    >>> g = modelled_grid()
    >>> len(g.points)  # 5 kinds x (3 SM budgets + 3 memory levels + 5 partners x 3 budgets x 4 levels)
    330
    """
    q = fit(gpu)
    m, g = load_model(model), load_gpu(gpu)
    prof = kind_profiles(m, g)
    src = (f"modelled: interference model (alpha={q.alpha:.3f}, k={q.k:.4f} fitted to JigsawRL "
           f"Fig. 7), {m.name} on {g.name} roofline, tp={tp}")
    mem = {k: memory_curve(k, m, g, tp, train_shards) for k in KINDS}
    pts = []
    finite = lambda v: v if math.isfinite(v) else 1e3  # noqa: E731 - a level that cannot hold the kind
    for a in KINDS:
        for pct in SM_BUDGETS_PCT[:-1]:
            pts.append(GridPoint(a, None, pct / 100, 80, slowdown(prof[a], None, pct / 100, q), src))
        for lvl in MEM_LEVELS_PCT[:-1]:
            pts.append(GridPoint(a, None, 1.0, lvl, finite(mem[a][lvl]), src))
        for b in KINDS:
            for pct in SM_BUDGETS_PCT[:-1]:
                s_sm = slowdown(prof[a], prof[b], pct / 100, q)
                b_s = slowdown(prof[b], prof[a], 1 - pct / 100, q)
                for lvl in MEM_LEVELS_PCT:
                    pts.append(GridPoint(a, b, pct / 100, lvl, finite(s_sm * mem[a][lvl]), src, b_s))
    meta = {"model": m.name, "tp": tp, "train_shards": train_shards, "alpha": q.alpha, "k": q.k,
            "profiles": {k: [round(p.compute_frac, 4), round(p.hbm_util, 4)] for k, p in prof.items()}}
    return SlowdownGrid(f"modelled-{m.name}-{g.name}".lower(), g.name, tuple(pts), meta, {})
