"""Out-of-sample validation of the step models against measured operator times.

Design note
-----------
Both step models are built from data and judged on data they did not see:

* **Blocks (Vidur's profiles, measured by others).** For every profiled model in turn, the measured
  step model's predictors are rebuilt without it (:func:`compute_sched.step_measured.operator_set`
  with ``exclude``) and predict its block -- the four linear layers plus the element-wise kernels,
  what Vidur's ``mlp.csv`` holds -- at every TP degree and token count. The analytical roofline of
  :mod:`compute_sched.perf` gets the same chance: its free constants (``mem_efficiency``,
  ``compute_efficiency``, ``prefill_efficiency``, ``layer_overhead_s``) are fitted by bounded
  least squares to the other models' blocks, then it predicts the held-out one. Errors are
  reported per regime -- small-batch decode (1-64 tokens), large-batch decode (65-1,024), prefill
  (1,025-4,096) -- and per TP degree.
* **Attention (our own H100 run, labelled so).** Each TP degree's points are predicted from the
  other three (the TP degree changes the heads per GPU), by the bytes-only curve the step model
  uses and by the split-aware interpolation; the analytical attention term with its memory
  efficiency and a launch floor fitted to the same other points is the baseline.
* **All-reduce (Vidur's NCCL profiles).** Every other message size is predicted from the rest.

The analytical block time is :class:`~compute_sched.perf.PerfModel`'s GEMM term and layer overhead
for a one-layer model of the block's parameters, evaluated in closed form over arrays
(:func:`analytical_block_s`; ``tests/compute_sched/test_step_model.py`` checks it equals
``PerfModel`` point by point).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares

from orchestrl.compute_sched.hardware import GpuSpec, load_gpu
from orchestrl.compute_sched.step_data import (LINEAR_OPS, SMALL_OPS, OperatorTable, attention_table,
                                               collective_table, operator_tables)
from orchestrl.compute_sched.step_measured import operator_set
from orchestrl.compute_sched.step_ops import AllReduceModel, AttentionModel

__all__ = ["REGIMES", "ErrorCell", "BlockValidation", "validate_blocks", "validate_attention",
           "validate_allreduce", "analytical_block_s", "regime_of"]

#: (name, first token count, last token count) of each regime of a block's token count.
REGIMES = (("small-batch decode", 1, 64), ("large-batch decode", 65, 1024), ("prefill", 1025, 4096))
_BOUNDS = {"mem_efficiency": (0.3, 1.0), "compute_efficiency": (0.2, 1.0), "prefill_efficiency": (0.2, 1.0),
           "layer_overhead_s": (0.0, 2e-4)}


def regime_of(tokens: np.ndarray) -> np.ndarray:
    """Regime name of each token count (empty string outside every regime)."""
    out = np.full(np.shape(tokens), "", dtype=object)
    for name, lo, hi in REGIMES:
        out[(tokens >= lo) & (tokens <= hi)] = name
    return out


@dataclass(frozen=True)
class ErrorCell:
    """Absolute relative errors of one (regime, TP) cell: measured step model and analytical model."""

    regime: str
    tp: int
    points: int
    median: float
    worst: float
    analytical_median: float
    analytical_worst: float

    def to_json(self) -> dict:
        return {"regime": self.regime, "tp": self.tp, "points": self.points, "median": self.median,
                "worst": self.worst, "analytical_median": self.analytical_median,
                "analytical_worst": self.analytical_worst}


@dataclass
class BlockValidation:
    """Leave-one-model-out errors of block times on one GPU type."""

    gpu: str
    held_out: list[str]
    cells: list[ErrorCell]
    fitted: dict[str, dict[str, float]]  # held-out model -> the analytical constants fitted without it
    by_model: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)  # med, worst, ana med, worst

    @property
    def median(self) -> float:
        return max(c.median for c in self.cells)

    @property
    def worst(self) -> float:
        return max(c.worst for c in self.cells)

    @property
    def analytical_median(self) -> float:
        return max(c.analytical_median for c in self.cells)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "held_out": self.held_out, "cells": [c.to_json() for c in self.cells],
                "fitted_analytical": self.fitted,
                "by_model": {k: dict(zip(("median", "worst", "analytical_median", "analytical_worst"), v))
                             for k, v in self.by_model.items()}}


def _points(tables: Sequence[OperatorTable]) -> dict[str, np.ndarray]:
    """Every (model, TP, tokens) block time of the tables, with what the analytical model needs."""
    cols: dict[str, list] = {k: [] for k in ("model", "tp", "tokens", "measured_s", "params")}
    for t in tables:
        for tp in t.tps:
            ms = t.tokens[tp]
            sec = sum(t.times_ms[op, tp] for op in LINEAR_OPS + SMALL_OPS) * 1e-3
            params = sum(k * n for k, n in t.gemm_shapes(tp).values())  # on one GPU of the group
            cols["model"] += [t.model] * len(ms)
            cols["tp"] += [tp] * len(ms)
            cols["tokens"] += list(ms)
            cols["measured_s"] += list(sec)
            cols["params"] += [params] * len(ms)
    return {k: np.array(v) for k, v in cols.items()}


def analytical_block_s(x: Sequence[float], params_per_gpu: np.ndarray, tokens: np.ndarray, gpu: GpuSpec) -> np.ndarray:
    """The analytical model's time of one block (no attention, no communication), over arrays.

    ``x`` = (mem_efficiency, compute_efficiency, prefill_efficiency, layer_overhead_s). Decode
    (up to 1,024 tokens): ``max(weight bytes / (HBM x mem_eff), 2 P M / (FLOPs x compute_eff)) +
    layer_overhead`` (``PerfModel._gpu_step_s``); prefill: the same with ``prefill_efficiency``
    (``PerfModel.prefill_s``).
    """
    mem_eff, comp_eff, pre_eff, overhead = x
    mem = 2.0 * params_per_gpu / (gpu.hbm_bytes_per_s * mem_eff)
    eff = np.where(tokens > 1024, pre_eff, comp_eff)
    comp = 2.0 * params_per_gpu * tokens / (gpu.bf16_flops * eff)
    return np.maximum(mem, comp) + overhead


def _fit_analytical(pts: dict[str, np.ndarray], sel: np.ndarray, gpu: GpuSpec) -> np.ndarray:
    names = list(_BOUNDS)
    lo = np.array([_BOUNDS[n][0] for n in names])
    hi = np.array([_BOUNDS[n][1] for n in names])
    p, m, y = pts["params"][sel], pts["tokens"][sel], pts["measured_s"][sel]

    def res(x):
        return np.log(analytical_block_s(x, p, m, gpu) / y)
    return least_squares(res, np.array([0.8, 0.55, 0.6, 4e-6]), bounds=(lo, hi)).x


def _cells(pts, pred, ana, sel) -> list[ErrorCell]:
    reg = regime_of(pts["tokens"])
    cells = []
    for name, _, _ in REGIMES:
        for tp in sorted(set(pts["tp"][sel].tolist())):
            s = sel & (reg == name) & (pts["tp"] == tp)
            if not s.any():
                continue
            e = np.abs(pred[s] / pts["measured_s"][s] - 1.0)
            a = np.abs(ana[s] / pts["measured_s"][s] - 1.0)
            cells.append(ErrorCell(name, int(tp), int(s.sum()), float(np.median(e)), float(e.max()),
                                   float(np.median(a)), float(a.max())))
    return cells


def validate_blocks(gpu: str = "H100", held_out: Iterable[str] | None = None) -> BlockValidation:
    """Leave-one-model-out validation of block times on ``gpu`` ("H100" or "A100"); see the module note.

    Notes
    -----
    One rebuild of the predictors and one bounded least-squares fit per held-out model (a few
    seconds each on one core).
    """
    spec = load_gpu(gpu)
    tables = operator_tables(gpu.lower())
    pts = _points(tables)
    names = list(held_out) if held_out is not None else [t.model for t in tables]
    pred = np.full(len(pts["tokens"]), np.nan)
    ana = np.full(len(pts["tokens"]), np.nan)
    fitted: dict[str, dict[str, float]] = {}
    for name in names:
        ops = operator_set(spec, exclude=(name,))
        t = next(x for x in tables if x.model == name)
        for tp in t.tps:
            sel = (pts["model"] == name) & (pts["tp"] == tp)
            m = pts["tokens"][sel]
            shapes = t.gemm_shapes(tp)
            p = sum(ops.gemm_s(m, k, n) for k, n in shapes.values())
            pred[sel] = p + ops.elementwise_s(m, t.small_elements(tp))
        train = pts["model"] != name
        x = _fit_analytical(pts, train, spec)
        fitted[name] = dict(zip(_BOUNDS, (float(v) for v in x)))
        sel = pts["model"] == name
        ana[sel] = analytical_block_s(x, pts["params"][sel], pts["tokens"][sel], spec)
    test = np.isin(pts["model"], names)
    by_model = {}
    for name in names:
        s = pts["model"] == name
        e = np.abs(pred[s] / pts["measured_s"][s] - 1)
        a = np.abs(ana[s] / pts["measured_s"][s] - 1)
        by_model[name] = (float(np.median(e)), float(e.max()), float(np.median(a)), float(a.max()))
    return BlockValidation(gpu, names, _cells(pts, pred, ana, test), fitted, by_model)


def validate_attention() -> list[dict]:
    """Leave-one-TP-out errors of decode and prefill attention (our own H100 run) against the analytical term."""
    table = attention_table("h100")
    spec = load_gpu("H100")
    out = []
    for tp in sorted({int(r[0]) for r in table.decode}):
        model = AttentionModel(table, exclude_tps=(tp,))
        dec = table.decode[table.decode[:, 0] == tp]
        kv = max(1.0, table.n_kv_head / tp)
        kv_bytes = dec[:, 1] * dec[:, 2] * kv * 2 * table.head_dim * 2  # one layer, one GPU
        pred = model.decode_bytes_s(kv_bytes)  # what the step model uses
        split = model.decode_s(dec[:, 1] * kv, dec[:, 2])  # also by how the bytes are split
        flops = 4.0 * table.n_q_head / tp * table.head_dim * dec[:, 1] * dec[:, 2]
        train = table.decode[table.decode[:, 0] != tp]
        tkv = np.maximum(1.0, table.n_kv_head / train[:, 0])
        tb = train[:, 1] * train[:, 2] * tkv * 4 * table.head_dim
        tf = 4.0 * table.n_q_head / train[:, 0] * table.head_dim * train[:, 1] * train[:, 2]

        def ana(x, b, f):  # PerfModel._attention_s with its memory efficiency and a launch floor
            return np.maximum(b / (spec.hbm_bytes_per_s * x[0]), f / (spec.bf16_flops * 0.55)) + x[1]
        fit = least_squares(lambda x: np.log(ana(x, tb, tf) / train[:, 3]), [0.8, 5e-6],
                            bounds=([0.2, 0.0], [1.0, 1e-4])).x
        e = np.abs(pred / dec[:, 3] - 1)
        e2 = np.abs(split / dec[:, 3] - 1)
        a = np.abs(ana(fit, kv_bytes, flops) / dec[:, 3] - 1)
        pre = table.prefill[table.prefill[:, 0] == tp]
        pp = model.prefill_s(table.n_q_head / tp, pre[:, 1])
        ep = np.abs(pp / pre[:, 2] - 1)
        out.append({"tp": tp, "decode_points": len(dec), "decode_median": float(np.median(e)),
                    "decode_worst": float(e.max()), "decode_by_split_median": float(np.median(e2)),
                    "decode_by_split_worst": float(e2.max()), "analytical_decode_median": float(np.median(a)),
                    "analytical_decode_worst": float(a.max()), "prefill_points": len(pre),
                    "prefill_median": float(np.median(ep)), "prefill_worst": float(ep.max())})
    return out


def validate_allreduce(gpu: str = "h100") -> list[dict]:
    """Errors of every other measured all-reduce size predicted from the remaining sizes."""
    table = collective_table(gpu)
    fit = AllReduceModel(table, keep_every=2, offset=0)
    out = []
    for w in sorted(table.sizes):
        sizes, times = table.sizes[w][1::2], table.times_s[w][1::2]
        e = np.abs(fit.time_s(w, sizes) / times - 1)
        out.append({"gpus": w, "points": len(sizes), "median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)),
                    "worst": float(e.max())})
    return out
