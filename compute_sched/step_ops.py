"""Operator-time predictors interpolated in measured data: GEMMs, element-wise ops, attention, all-reduce.

Design note
-----------
A decode or prefill step is a sum of kernels (Vidur's observation, and how it simulates). Each
predictor here answers "how long does this kernel take at this size" from measured points only,
interpolating inside the measured ranges and saying how it leaves them:

* :class:`GemmModel` -- a linear layer of ``M`` tokens through a ``K x N`` weight. Measured at
  ~80 weight shapes (Vidur's models x their four linear layers x TP 1/2/4/8) and 259 token counts.
  What carries over between shapes is the *efficiency* (datasheet roofline time / measured time):
  at each measured token count it is interpolated linearly over ``(log K, log N)`` between the
  measured shapes (Delaunay triangles, :class:`scipy.spatial.Delaunay`; the nearest measured
  shape outside their hull), then linearly in ``log M`` between token counts. At a measured shape
  the measured time comes back exactly. Beyond the largest token count the time grows linearly
  (compute-bound), below one token it is zero.
* :class:`ElementwiseModel` -- norms, rotary embedding, activation, residual add: time against the
  elements the kernel touches (pooled over the measured models), log-log interpolation.
* :class:`AttentionModel` -- decode attention by the KV bytes one GPU reads, prefill attention by
  (query heads, chunk), from ``attention.csv`` (our own H100 run: Vidur's attention
  profiles are not retrievable, :mod:`compute_sched.step_data`).
* :class:`AllReduceModel` -- NCCL all-reduce on one node by group size and bytes (Vidur's DGX
  profiles), a running median over neighbouring sizes to remove the profile's jitter, made
  non-decreasing in size.

:class:`GpuRatios` carries times measured on one GPU to another by the datasheet ratios of memory
bandwidth, bf16 FLOPs and NVLink bandwidth (an assumption, stated where it is used): a kernel keeps
its measured efficiency, and its roofline moves with the ratios.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from scipy.interpolate import LinearNDInterpolator, RegularGridInterpolator
from scipy.ndimage import median_filter
from scipy.spatial import Delaunay, cKDTree

from orchestrl.compute_sched.hardware import GpuSpec
from orchestrl.compute_sched.step_data import (SMALL_OPS, AttentionTable, CollectiveTable,
                                               OperatorTable)
from orchestrl.fabric.errors import ConfigError

__all__ = ["GpuRatios", "GemmModel", "ElementwiseModel", "AttentionModel", "AllReduceModel", "BF16_BYTES",
           "convex_minorant_knots"]

BF16_BYTES = 2


@dataclass(frozen=True)
class GpuRatios:
    """Datasheet rates of a GPU the times were measured on, and of the GPU they are carried to."""

    measured_hbm_bytes_per_s: float
    measured_flops: float
    target_hbm_bytes_per_s: float
    target_flops: float
    measured_nvlink_bytes_per_s: float
    target_nvlink_bytes_per_s: float

    @classmethod
    def between(cls, measured: GpuSpec, target: GpuSpec) -> "GpuRatios":
        return cls(measured.hbm_bytes_per_s, measured.bf16_flops, target.hbm_bytes_per_s, target.bf16_flops,
                   measured.nvlink_bytes_per_s, target.nvlink_bytes_per_s)

    @property
    def identity(self) -> bool:
        return (self.measured_hbm_bytes_per_s == self.target_hbm_bytes_per_s
                and self.measured_flops == self.target_flops)

    def roofline_ratio(self, bytes_: np.ndarray | float, flops: np.ndarray | float) -> np.ndarray | float:
        """Target roofline time over measured roofline time of a kernel moving ``bytes_`` and running ``flops``."""
        measured = np.maximum(np.asarray(bytes_) / self.measured_hbm_bytes_per_s, np.asarray(flops) / self.measured_flops)
        target = np.maximum(np.asarray(bytes_) / self.target_hbm_bytes_per_s, np.asarray(flops) / self.target_flops)
        return target / measured


def _gemm_roofline_s(m: np.ndarray | float, k: float, n: float, hbm: float, flops: float) -> np.ndarray | float:
    """Datasheet lower bound of a bf16 GEMM: read the weight and the input, write the output, or its FLOPs."""
    m = np.asarray(m, dtype=float)
    return np.maximum(BF16_BYTES * (k * n + m * k + m * n) / hbm, 2.0 * m * k * n / flops)


class GemmModel:
    """Time of a linear layer (``M`` tokens through a ``K x N`` bf16 weight) interpolated in measured GEMMs.

    Parameters
    ----------
    tables
        Measured operator tables of one GPU type (:func:`compute_sched.step_data.operator_tables`).
    hbm_bytes_per_s, flops
        Datasheet peak rates of that GPU: they only normalise the efficiency that is interpolated.
    exclude
        Model names left out (the held-out models of a validation).
    smooth
        Width of a running median over neighbouring token counts applied to each measured shape's
        efficiency: adjacent counts (8 tokens apart) jitter by cuBLAS's kernel choice, and a
        neighbour's jitter should not be carried to another shape. 3 was chosen among 1/3/5/9-point
        medians and 3/5/7-point means by the leave-one-model-out error on the A100 profiles; the
        H100 validation never saw the choice.

    Notes
    -----
    Construction is O(S x T) for S measured shapes and T token counts; :meth:`curve` costs one
    simplex lookup and O(T); :meth:`time_s` an interpolation in the curve.

    Examples
    --------
    >>> from orchestrl.compute_sched.step_data import operator_tables
    >>> g = GemmModel(operator_tables("h100"), 3.35e12, 989e12)
    >>> t = operator_tables("h100")[2]  # internlm-20b: its up projection at TP=1 is a measured shape
    >>> k, n = t.gemm_shapes(1)["mlp_up_proj"]
    >>> round(float(g.time_s(1, k, n)) * 1e3, 4), float(t.times_ms["mlp_up_proj", 1][0])
    (0.1, 0.1)
    """

    def __init__(self, tables: Sequence[OperatorTable], hbm_bytes_per_s: float, flops: float, *,
                 exclude: Iterable[str] = (), smooth: int = 3) -> None:
        skip = set(exclude)
        used = [t for t in tables if t.model not in skip]
        if not used:
            raise ConfigError("GemmModel", "tables", "no measured model left", "at least one operator table")
        self.hbm, self.flops = hbm_bytes_per_s, flops
        self.tokens = np.array(sorted({float(n) for t in used for ns in t.tokens.values() for n in ns}))
        self._log_m = np.log(self.tokens)
        curves: dict[tuple[int, int], list[np.ndarray]] = {}
        for t in used:
            for tp in t.tps:
                for op, (k, n) in t.gemm_shapes(tp).items():
                    ms, sec = t.tokens[tp], t.times_ms[op, tp] * 1e-3
                    if np.any(sec <= 0):
                        continue
                    eff = np.log(_gemm_roofline_s(ms, k, n, self.hbm, self.flops) / sec)
                    if smooth > 1:
                        eff = median_filter(eff, size=smooth, mode="nearest")
                    curves.setdefault((k, n), []).append(np.interp(self._log_m, np.log(ms), eff))
        self.shapes = np.array(sorted(curves), dtype=float)
        self._log_eff = np.array([np.mean(curves[int(k), int(n)], axis=0) for k, n in self.shapes])
        self._points = np.log(self.shapes)
        self._tri = Delaunay(self._points) if len(self.shapes) >= 3 else None
        self._nearest = cKDTree(self._points)
        self.models = tuple(t.model for t in used)

    def curve(self, k: float, n: float) -> np.ndarray:
        """Log efficiency of a ``K x N`` GEMM at every measured token count (:attr:`tokens`)."""
        x = np.log([float(k), float(n)])
        if self._tri is not None:
            s = int(self._tri.find_simplex(x))
            if s >= 0:
                trans = self._tri.transform[s]
                b = trans[:2].dot(x - trans[2])
                w = np.append(b, 1.0 - b.sum())
                return w @ self._log_eff[self._tri.simplices[s]]
        return self._log_eff[int(self._nearest.query(x)[1])]

    def curves(self, k: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Log efficiency curves of many ``K x N`` GEMMs at once, one row per shape (:meth:`curve` vectorised)."""
        x = np.log(np.c_[np.asarray(k, dtype=float).ravel(), np.asarray(n, dtype=float).ravel()])
        out = self._log_eff[self._nearest.query(x)[1]]
        if self._tri is not None:
            s = self._tri.find_simplex(x)
            inside = s >= 0
            if inside.any():
                trans = self._tri.transform[s[inside]]
                b = np.einsum("ijk,ik->ij", trans[:, :2], x[inside] - trans[:, 2])
                w = np.c_[b, 1.0 - b.sum(axis=1)]
                out[inside] = np.einsum("ij,ijt->it", w, self._log_eff[self._tri.simplices[s[inside]]])
        return out

    def time_many(self, m: np.ndarray, k: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Seconds of point ``i``'s ``m[i]`` tokens through a ``k[i] x n[i]`` weight (every argument an array)."""
        m, k, n = (np.asarray(v, dtype=float).ravel() for v in np.broadcast_arrays(m, k, n))
        c = self.curves(k, n)
        mm = np.clip(m, self.tokens[0], self.tokens[-1])
        lm = np.log(mm)
        j = np.clip(np.searchsorted(self._log_m, lm) - 1, 0, len(self._log_m) - 2)
        f = (lm - self._log_m[j]) / (self._log_m[j + 1] - self._log_m[j])
        rows = np.arange(len(m))
        eff = c[rows, j] * (1 - f) + c[rows, j + 1] * f
        t = _gemm_roofline_s(mm, k, n, self.hbm, self.flops) / np.exp(eff)
        t = np.where(m > self.tokens[-1], t * m / self.tokens[-1], t)
        return np.where(m <= 0, 0.0, t)

    def time_s(self, m: np.ndarray | float, k: float, n: float, curve: np.ndarray | None = None) -> np.ndarray:
        """Seconds of ``m`` tokens (scalar or array) through a ``k x n`` weight."""
        m = np.asarray(m, dtype=float)
        c = self.curve(k, n) if curve is None else curve
        mm = np.clip(m, self.tokens[0], self.tokens[-1])
        eff = np.interp(np.log(np.maximum(mm, 1e-9)), self._log_m, c)
        t = _gemm_roofline_s(mm, k, n, self.hbm, self.flops) / np.exp(eff)
        t = np.where(m > self.tokens[-1], t * m / self.tokens[-1], t)  # past the data: compute-bound, linear
        return np.where(m <= 0, 0.0, t)


def convex_minorant_knots(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the greatest convex function below the points ``(x, y)`` (``x`` ascending): the lower hull.

    >>> convex_minorant_knots(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 1.5, 1.0, 3.0]))
    (array([0., 2., 3.]), array([1., 1., 3.]))
    """
    hull: list[int] = []
    for k in range(len(x)):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            if (y[j] - y[i]) * (x[k] - x[i]) >= (y[k] - y[i]) * (x[j] - x[i]):
                hull.pop()  # j lies on or above the chord from i to k
            else:
                break
        hull.append(k)
    return x[hull], y[hull]


def _loglog(xs: np.ndarray, ys: np.ndarray, bins_per_octave: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Median of log y in bins of log x: the knots of a piecewise-linear log-log curve."""
    lx, ly = np.log2(xs), np.log(np.maximum(ys, 1e-12))
    edges = np.arange(np.floor(lx.min() * bins_per_octave), np.ceil(lx.max() * bins_per_octave) + 1) / bins_per_octave
    idx = np.clip(np.digitize(lx, edges) - 1, 0, len(edges) - 1)
    kx, ky = [], []
    for b in np.unique(idx):
        sel = idx == b
        kx.append(float(np.median(lx[sel])))
        ky.append(float(np.median(ly[sel])))
    return np.array(kx), np.array(ky)


def _interp_loglog(x: np.ndarray | float, kx: np.ndarray, ky: np.ndarray, grow: float) -> np.ndarray:
    """Evaluate a log-log curve; below its range the first value, above it growing as ``x ** grow``."""
    x = np.maximum(np.asarray(x, dtype=float), 1e-12)
    lx = np.log2(x)
    y = np.exp(np.interp(lx, kx, ky))
    over = lx > kx[-1]
    return np.where(over, np.exp(ky[-1]) * np.exp2((lx - kx[-1]) * grow), y)


class ElementwiseModel:
    """Time of a block's element-wise kernels (norms, rotary, activation, add) from the elements they touch."""

    def __init__(self, tables: Sequence[OperatorTable], *, exclude: Iterable[str] = ()) -> None:
        skip = set(exclude)
        self.knots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for op in SMALL_OPS:
            xs, ys = [], []
            for t in tables:
                if t.model in skip:
                    continue
                for tp in t.tps:
                    sec = t.times_ms[op, tp] * 1e-3
                    keep = sec > 0
                    xs.append(t.tokens[tp][keep] * t.small_elements(tp)[op])
                    ys.append(sec[keep])
            if xs and sum(len(x) for x in xs):
                self.knots[op] = _loglog(np.concatenate(xs), np.concatenate(ys))

    def time_s(self, tokens: np.ndarray | float, elements_per_token: dict[str, float]) -> np.ndarray:
        """Seconds of every element-wise kernel of one block for ``tokens`` tokens (memory-bound: linear above)."""
        tokens = np.asarray(tokens, dtype=float)
        out = np.zeros_like(tokens)
        for op, per in elements_per_token.items():
            if op in self.knots and per > 0:
                out = out + _interp_loglog(tokens * per, *self.knots[op], grow=1.0)
        return np.where(tokens <= 0, 0.0, out)


class AttentionModel:
    """Attention kernels of one GPU from a measured ``attention.csv``: decode and prefill.

    Decode attention streams every cached K and V once. :meth:`decode_bytes_s`, what the step
    model uses, times it by the KV bytes one GPU reads in one layer alone: the measured points'
    medians in half-octave bins of bytes, made non-decreasing and replaced by their greatest convex
    minorant (the launch floor, then the bandwidth slope, the knee between rounded down), so a step
    never gets cheaper as its batch or context grows and is convex in the context
    (:mod:`compute_sched.bounds` rests on both). :meth:`decode_s` also uses how the bytes are
    split, (sequences x KV heads, context per sequence), interpolating log time linearly between the
    measured points (Delaunay triangles; outside them the nearest point scaled by bytes): more
    accurate where the launch floor dominates, but faster with more, shorter sequences at equal
    bytes, which a lower bound cannot use; it is reported beside the other in the validation.
    Prefill attention (causal, one chunk of ``n`` tokens) is interpolated over
    ``(log q_heads_per_gpu, log n)`` on the measured grid, linear in log-log outside it.
    """

    def __init__(self, table: AttentionTable, *, exclude_tps: Iterable[int] = ()) -> None:
        skip = set(exclude_tps)
        self.table = table
        dec = np.array([r for r in table.decode if int(r[0]) not in skip])
        pre = np.array([r for r in table.prefill if int(r[0]) not in skip])
        if len(dec) < 3 or len(pre) < 2:
            raise ConfigError(table.source, "rows", "too few decode or prefill rows left", "both kinds of rows")
        self.head_dim = table.head_dim
        units = dec[:, 1] * np.maximum(1.0, table.n_kv_head / dec[:, 0])
        self._dec_x = np.c_[np.log2(units), np.log2(dec[:, 2])]
        self._dec_y = np.log(dec[:, 3])
        self._dec_bytes = units * dec[:, 2]
        self._dec_lin = LinearNDInterpolator(self._dec_x, self._dec_y)
        self._dec_near = cKDTree(self._dec_x)
        kv_bytes = self._dec_bytes * self.kv_token_bytes(table.head_dim)
        kx, ky = _loglog(kv_bytes, dec[:, 3])
        x, y = np.exp2(kx), np.maximum.accumulate(np.exp(ky))
        self.bytes_knots = convex_minorant_knots(x, y)  # (bytes, seconds) vertices, convex and non-decreasing
        heads = np.array(sorted({float(table.n_q_head / tp) for tp in pre[:, 0]}))
        chunks = np.array(sorted({float(n) for n in pre[:, 1]}))
        grid = np.full((len(heads), len(chunks)), np.nan)
        for tp, n, sec in pre:
            grid[int(np.searchsorted(heads, table.n_q_head / tp)), int(np.searchsorted(chunks, n))] = np.log(sec)
        if np.isnan(grid).any():
            raise ConfigError(table.source, "prefill rows", "the (TP, chunk) grid has holes", "every chunk at every TP")
        if len(heads) == 1:  # one head count: time by chunk only
            heads, grid = np.array([heads[0] * 0.5, heads[0] * 2.0]), np.vstack([grid, grid])
        self._pre = RegularGridInterpolator((np.log2(heads), np.log2(chunks)), grid, bounds_error=False,
                                            fill_value=None)

    @staticmethod
    def kv_token_bytes(head_dim: int) -> float:
        """Bytes of K and V of one token and one KV head in one layer."""
        return 2.0 * head_dim * BF16_BYTES

    def decode_bytes_s(self, kv_bytes_per_gpu_layer: np.ndarray | float) -> np.ndarray:
        """Seconds of one layer's decode attention reading this many KV bytes on one GPU (convex, non-decreasing)."""
        b = np.asarray(kv_bytes_per_gpu_layer, dtype=float)
        x, y = self.bytes_knots
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if len(x) > 1 else y[-1] / x[-1]
        t = np.interp(b, x, y)
        return np.where(b <= 0, 0.0, np.where(b > x[-1], y[-1] + slope * (b - x[-1]), t))

    def decode_s(self, seq_heads: np.ndarray | float, context: np.ndarray | float) -> np.ndarray:
        """Seconds of one layer's decode attention: ``seq_heads`` = sequences x KV heads on the GPU, each over
        ``context`` tokens of ``head_dim`` (the measured one; other head sizes scale by bytes)."""
        u = np.atleast_1d(np.asarray(seq_heads, dtype=float))
        c = np.atleast_1d(np.asarray(context, dtype=float))
        u, c = np.broadcast_arrays(u, c)
        ok = (u > 0) & (c > 0)
        x = np.c_[np.log2(np.maximum(u, 1e-9)), np.log2(np.maximum(c, 1e-9))]
        y = self._dec_lin(x)
        out = np.isnan(y) & ok
        if out.any():
            _, near = self._dec_near.query(x[out])
            scale = np.maximum(1.0, u[out] * c[out] / self._dec_bytes[near])
            y[out] = self._dec_y[near] + np.log(scale)
        return np.where(ok, np.exp(np.nan_to_num(y)), 0.0)

    def prefill_s(self, q_heads: float, chunk: np.ndarray | float) -> np.ndarray:
        """Seconds of one layer's causal prefill attention of a ``chunk``-token sequence with ``q_heads`` on the GPU."""
        n = np.atleast_1d(np.asarray(chunk, dtype=float))
        x = np.c_[np.full(n.shape, np.log2(max(q_heads, 1e-9))), np.log2(np.maximum(n, 1e-9))]
        return np.where(n > 0, np.exp(self._pre(x)), 0.0)


class AllReduceModel:
    """NCCL all-reduce inside one node, from a measured collective table, by group size and bytes.

    To carry it to a GPU with other NVLink bandwidth, the per-byte cost is the slope of the measured
    times over the messages of 8 MB and more (where NCCL is bandwidth-bound), and only that part,
    slope x bytes, scales with the NVLink ratio; what small messages cost (launch, synchronisation,
    protocol) is kept.

    Examples
    --------
    >>> from orchestrl.compute_sched.step_data import collective_table
    >>> ar = AllReduceModel(collective_table("h100"))
    >>> 15e-6 < float(ar.time_s(8, 1e6)) < 60e-6  # a 1 MB all-reduce over 8 H100s: tens of microseconds
    True
    """

    def __init__(self, table: CollectiveTable, *, window: int = 15, keep_every: int = 1, offset: int = 0) -> None:
        self.table = table
        self.curves: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.slopes: dict[int, float] = {}  # seconds per byte where bandwidth-bound
        for w, sizes in table.sizes.items():
            t = table.times_s[w]
            idx = np.arange(offset, len(sizes), keep_every)  # keep_every > 1: every other size held out
            s, t = sizes[idx], t[idx]
            half = window // 2
            smooth = np.array([np.median(t[max(0, i - half): i + half + 1]) for i in range(len(t))])
            self.curves[w] = (s, np.maximum.accumulate(smooth))
            big = s >= 8 * 1024 * 1024
            self.slopes[w] = float(np.polyfit(s[big], t[big], 1)[0]) if big.sum() >= 2 else float(t[-1] / s[-1])

    @property
    def groups(self) -> tuple[int, ...]:
        return tuple(sorted(self.curves))

    def time_s(self, group: int, nbytes: np.ndarray | float, link_ratio: float = 1.0) -> np.ndarray:
        """Seconds of one all-reduce of ``nbytes`` over ``group`` GPUs of one node.

        ``link_ratio`` = measured NVLink bandwidth / target NVLink bandwidth (1 on the measured GPU).
        A group size that was not measured takes the next larger measured one.
        """
        nbytes = np.asarray(nbytes, dtype=float)
        if group <= 1:
            return np.zeros_like(nbytes)
        sizes = [g for g in self.groups if g >= group]
        if not sizes:
            raise ConfigError(self.table.source, "num_workers", f"no all-reduce over {group} GPUs measured",
                              f"groups of {', '.join(map(str, self.groups))} GPUs")
        s, t = self.curves[sizes[0]]
        slope = self.slopes[sizes[0]]
        base = np.interp(np.log(np.clip(nbytes, s[0], s[-1])), np.log(s), t)
        base = np.where(nbytes > s[-1], t[-1] + slope * (nbytes - s[-1]), base)
        return base + slope * nbytes * (link_ratio - 1.0)
