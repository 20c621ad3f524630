"""Compare a GPU check's measured files (``bench/gpu_step_check.py``) with the step models.

The check times one Qwen2.5-14B-shaped decoder layer on whatever GPU it runs on and writes Vidur's
columns. Three comparisons, each saying what it can and cannot show:

* **linear layers** (our ``mlp.csv``) against the measured step model built from Vidur's profiles
  only -- two independent measurements of the same shapes (Vidur's internlm-20b has Qwen2.5-14B's
  MLP; the QKV projection's shape is interpolated);
* **whole layers** (``layer_steps.csv``, one CUDA graph per point) against the measured step model's
  per-layer sum (Vidur's linear layers and fused element-wise kernels, attention from the bundled
  H100 run) and against the analytical model with the bundled H800 constants on H100 rates;
* **additivity**: the check's own operators summed against its own whole layers (how much a sum of
  separately timed kernels misses; the check's element-wise kernels are unfused PyTorch, slower
  than the fused ones Vidur profiled).

Attention is not compared: the measured step model's attention *is* the bundled copy of such a run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import Calibration, PerfModel
from orchestrl.compute_sched.step_data import (LINEAR_OPS, SMALL_OPS, read_attention_csv, read_operator_csv)
from orchestrl.compute_sched.step_measured import MeasuredPerfModel, block_shapes, operator_set
from orchestrl.fabric.errors import ConfigError

__all__ = ["GpuCheckComparison", "compare_gpu_check"]


@dataclass
class GpuCheckComparison:
    """Errors of the step models against one GPU check's files."""

    folder: str
    gpu: str
    linear: list[dict] = field(default_factory=list)  # per TP and regime: measured model vs our linear layers
    layers: list[dict] = field(default_factory=list)  # per whole-layer point: ours, measured model, analytical
    additivity: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        def agg(rows, key):
            v = [abs(r[key]) for r in rows if r.get(key) is not None]
            return {"median": float(np.median(v)), "worst": float(np.max(v))} if v else None
        return {"linear_vs_vidur": agg(self.linear, "worst"),
                "layer_measured_model": agg(self.layers, "measured_model_err"),
                "layer_analytical_model": agg(self.layers, "analytical_model_err"),
                "layer_sum_of_own_operators": agg(self.additivity, "err")}

    def to_json(self) -> dict:
        return {"folder": self.folder, "gpu": self.gpu, "linear": self.linear, "layers": self.layers,
                "additivity": self.additivity, "summary": self.summary()}

    def table(self) -> str:
        out = [f"GPU check {self.folder} ({self.gpu}) against the step models",
               "  linear layers (QKV, O, gate+up, down) per TP: measured step model (Vidur's profiles only) / ours - 1",
               f"  {'TP':>3} {'regime':<20} {'points':>6} {'median':>7} {'worst':>7}"]
        for r in self.linear:
            out.append(f"  {r['tp']:>3} {r['regime']:<20} {r['points']:>6} {r['median']:>+7.1%} {r['worst']:>+7.1%}")
        out.append("  whole decoder layer at TP=1 (one CUDA graph), ms: ours, measured step model, analytical (H800 "
                   "constants on H100 rates), sum of our own operators")
        out.append(f"  {'phase':<8} {'batch':>5} {'ctx':>6} {'ours':>7} {'measured':>9} {'err':>6} {'analytical':>10} "
                   f"{'err':>6} {'own sum':>8} {'err':>6}")
        for r, a in zip(self.layers, self.additivity):
            out.append(f"  {r['phase']:<8} {r['batch']:>5} {r['context']:>6} {r['ours_ms']:>7.3f} "
                       f"{r['measured_model_ms']:>9.3f} {r['measured_model_err']:>+6.0%} {r['analytical_model_ms']:>10.3f} "
                       f"{r['analytical_model_err']:>+6.0%} {a['own_sum_ms']:>8.3f} {a['err']:>+6.0%}")
        s = self.summary()
        out.append("  summary (|error|): " + "; ".join(f"{k} median {v['median']:.1%} worst {v['worst']:.1%}"
                                                        for k, v in s.items() if v))
        return "\n".join(out)


def _regime(n: float) -> str:
    return "small-batch decode" if n <= 64 else ("large-batch decode" if n <= 1024 else "prefill")


def compare_gpu_check(folder: str | os.PathLike[str]) -> GpuCheckComparison:
    """Return the comparison of the files a GPU check wrote in ``folder`` with the step models.

    Raises
    ------
    ConfigError
        When ``folder`` lacks ``mlp.csv``, ``attention.csv`` or ``layer_steps.csv``.
    """
    d = Path(folder)
    for name in ("mlp.csv", "attention.csv", "layer_steps.csv"):
        if not (d / name).exists():
            raise ConfigError(str(d), name, "missing", "the folder bench/gpu_step_check.py --out wrote")
    meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").exists() else {}
    gpu_name = "H100" if "H100" in str(meta.get("gpu", "H100")) else str(meta.get("gpu"))
    gpu = load_gpu("H100")  # the check's shapes were only ever run on an H100; say so if not
    model = load_model("Qwen2.5-14B")
    ours = read_operator_csv(d / "mlp.csv", "h100", "Qwen/Qwen2.5-14B (this project's GPU check)")
    ops = operator_set(gpu)
    res = GpuCheckComparison(str(d), str(meta.get("gpu", gpu_name)))
    for tp in ours.tps:
        ms = ours.tokens[tp]
        sh = block_shapes(model, tp)
        pred = sum(ops.gemm_s(ms, *shape) for shape in (sh.qkv, sh.out, sh.mlp_up, sh.mlp_down))
        meas = sum(ours.times_ms[op, tp] for op in LINEAR_OPS) * 1e-3
        err = pred / meas - 1
        for regime in ("small-batch decode", "large-batch decode", "prefill"):
            sel = np.array([_regime(n) == regime for n in ms])
            if sel.any():
                e = err[sel]
                res.linear.append({"tp": int(tp), "regime": regime, "points": int(sel.sum()),
                                   "median": float(np.median(e)), "worst": float(e[np.argmax(np.abs(e))])})
    measured = MeasuredPerfModel(model, gpu, Calibration())
    analytical = PerfModel(model, gpu, _h800_constants())
    att = read_attention_csv(d / "attention.csv")
    tp1 = InstanceConfig("tp", tp=1)
    layers = model.layers
    for row in _layer_rows(d / "layer_steps.csv"):
        b, c, n, t = row
        if row[0] == "prefill":
            continue
        # one layer: the measured model's GPU step minus its LM head, over the layers
        m = (measured._gpu_step_s(tp1, b, b * c) - float(measured._lm_head_s(np.array([b]), 1)[0])) / layers
        a = (analytical._gpu_step_s(tp1, b, b * c) - _lm_head_bytes(model) / _ana_hbm(analytical)) / layers
        res.layers.append(_layer_row("decode", b, c, t, m, a))
        res.additivity.append(_own_sum(ours, att, b, c, t, decode=True))
    for row in _layer_rows(d / "layer_steps.csv", phase="prefill"):
        _, _, n, t = row
        m = (measured.prefill_s(tp1, n, n / 2.0) - float(measured._lm_head_s(np.array([1.0]), 1)[0])) / layers
        a = analytical.prefill_s(tp1, n, n / 2.0) / layers
        res.layers.append(_layer_row("prefill", 1, n, t, m, a))
        res.additivity.append(_own_sum(ours, att, 1, n, t, decode=False))
    return res


def _h800_constants() -> Calibration:
    """The bundled H800 calibration's GPU constants, host time removed (a layer has none)."""
    from orchestrl.compute_sched.calibration import bundled_calibration, load_calibration
    path = bundled_calibration("H800")
    cal = load_calibration(path) if path is not None else Calibration()
    return Calibration(**{**cal.__dict__, "step_overhead_s": 0.0, "seq_overhead_s": 0.0})


def _ana_hbm(pm: PerfModel) -> float:
    return pm.gpu.hbm_bytes_per_s * pm.cal.mem_efficiency


def _lm_head_bytes(model) -> float:
    return 2.0 * model.vocab * model.d_model  # the analytical model reads it with the other weights


def _layer_rows(path: Path, phase: str = "decode"):
    import csv
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["phase"] == phase:
                yield (int(r["batch_size"]), int(r["context_tokens"]), int(r["tokens"]), float(r["layer_ms"]) * 1e-3)


def _layer_row(phase, b, c, ours_s, measured_s, analytical_s) -> dict:
    return {"phase": phase, "batch": int(b), "context": int(c), "ours_ms": ours_s * 1e3,
            "measured_model_ms": measured_s * 1e3, "measured_model_err": measured_s / ours_s - 1,
            "analytical_model_ms": analytical_s * 1e3, "analytical_model_err": analytical_s / ours_s - 1}


def _own_sum(ours, att, b, c, t, decode: bool) -> dict:
    """Our own operators at this point (interpolated in our own tables) summed, against our whole layer."""
    n = b if decode else c
    ms = ours.tokens[1]
    ops = sum(np.interp(n, ms, ours.times_ms[op, 1]) for op in LINEAR_OPS + SMALL_OPS) * 1e-3
    if decode:
        rows = att.decode[att.decode[:, 0] == 1]
        pts = {(r[1], r[2]): r[3] for r in rows}
        a = pts.get((b, c))
        if a is None:  # not measured at this point: the nearest batch's curve, linear in KV bytes past its end
            same = rows[rows[:, 1] == min(rows[:, 1], key=lambda x: abs(np.log(x / b)))]
            same = same[np.argsort(same[:, 2])]
            cc = min(c, same[-1, 2])
            a = float(np.exp(np.interp(np.log(cc), np.log(same[:, 2]), np.log(same[:, 3]))))
            a *= (c / cc) * (b / same[0, 1])
    else:
        rows = att.prefill[att.prefill[:, 0] == 1]
        a = float(np.exp(np.interp(np.log(c), np.log(rows[:, 1]), np.log(rows[:, 2]))))
    own = ops + a
    return {"phase": "decode" if decode else "prefill", "batch": int(b), "context": int(c), "own_sum_ms": own * 1e3,
            "err": own / t - 1}
