"""Benchmark the step models against measured operator times, out of sample, and against published ratios.

Run from the repository root::

    python bench/step_model.py            # everything (about 2-4 minutes on 2 cores)
    python bench/step_model.py --quick    # H100 only, a smaller RollArt grid
    python bench/step_model.py --json     # also print one JSON document at the end

Everything a ratio divides by is measured in the same run; the papers' figures are printed beside
ours as references only. docs/step-model.md explains each part.

A. Blocks, leave one model out (Vidur's H100 profiles, measured by others; A100 too without
   --quick): each profiled model's decoder block (linear layers + element-wise kernels) predicted
   by the measured step model rebuilt without it, and by the analytical roofline of
   compute_sched/perf.py with its constants fitted to the other models. Errors per regime
   (small-batch decode 1-64 tokens, large-batch decode 65-1,024, prefill 1,025-4,096) and TP degree.
   Target: median <= 10% and worst <= 25% in every cell; the analytical model's errors on the same
   points beside them.
B. Attention, leave one TP degree out (our own H100 run, labelled so: Vidur's attention profiles are
   not retrievable), and all-reduce, every other measured size held out (Vidur's NCCL profiles).
C. The GPU check (bench/gpu_step_check.py, committed H100 run): Vidur-based linear layers against
   ours, whole layers against each model.
D. What makes TP=8 faster than TP=4 in §2.1's tail: the §2.1 case study on the measured step model
   with one term at a time (all-reduce, attention, linear layers) taken from the analytical model.
E. Other GPU types against RollArt §3.1 (Qwen3-8B, 2 H800s against 6 H20s, the H800 and H20 carried
   from the H100 by datasheet ratios): H800/H20 rollout time over swept task shapes, for both step
   models; paper: FrozenLake 0.53 (H800 faster), GEM-math H20/H800 0.49-0.79 (reference).
F. Training: the training stage's dense-GEMM efficiency (fitted to published MFU) against the
   measured forward efficiency of linear layers at 2,048-4,096 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrl.compute_sched.calibration import DEFAULT_STEP_MODEL, bundled_calibration, load_calibration  # noqa: E402
from orchestrl.compute_sched.hardware import load_gpu, load_model  # noqa: E402
from orchestrl.compute_sched.hw_affinity import PAPER, rollout_rows  # noqa: E402
from orchestrl.compute_sched.perf import Calibration, PerfModel  # noqa: E402
from orchestrl.compute_sched.step_check import compare_gpu_check  # noqa: E402
from orchestrl.compute_sched.step_data import MEASURED_DIR  # noqa: E402
from orchestrl.compute_sched.step_measured import MeasuredPerfModel  # noqa: E402
from orchestrl.compute_sched.step_validation import validate_allreduce, validate_attention, validate_blocks  # noqa: E402
from orchestrl.sim.train.gemm_check import gemm_gap  # noqa: E402

TARGET_MEDIAN = 0.10
TARGET_WORST = 0.25


def part_a(gpus) -> dict:
    out = {}
    for gpu in gpus:
        v = validate_blocks(gpu)
        print(f"\nA. {gpu} blocks, leave one model out ({len(v.held_out)} models: "
              f"{', '.join(m.split('/')[-1] for m in v.held_out)}); |relative error|")
        print(f"   {'regime':<20} {'TP':>2} {'points':>6} {'median':>7} {'worst':>7} {'analytical med':>15} "
              f"{'worst':>7}")
        for c in v.cells:
            print(f"   {c.regime:<20} {c.tp:>2} {c.points:>6} {c.median:>7.1%} {c.worst:>7.1%} "
                  f"{c.analytical_median:>15.1%} {c.analytical_worst:>7.1%}")
        ok = all(c.median <= TARGET_MEDIAN and c.worst <= TARGET_WORST for c in v.cells)
        better = sum(c.median < c.analytical_median for c in v.cells)
        print(f"   measured step model: largest cell median {v.median:.1%}, worst {v.worst:.1%} (target <= "
              f"{TARGET_MEDIAN:.0%} / {TARGET_WORST:.0%}: {'met' if ok else 'NOT met'}); analytical: largest median "
              f"{v.analytical_median:.1%}, worst {max(c.analytical_worst for c in v.cells):.1%}; the measured model's "
              f"median is lower in {better} of {len(v.cells)} cells")
        fit = next(iter(v.fitted.values()))
        print("   analytical constants fitted without the first model: " + ", ".join(
            f"{k}={val:.3g}" for k, val in fit.items()))
        out[gpu] = {**v.to_json(), "target_met": ok, "cells_better": better}
    return out


def part_b() -> dict:
    print("\nB. Attention (our own H100 run), leave one TP degree out; |relative error|")
    print(f"   {'TP':>2} {'decode med':>10} {'worst':>7} {'by split med':>12} {'worst':>7} {'analytical med':>15} "
          f"{'worst':>7} {'prefill med':>11} {'worst':>7}")
    att = validate_attention()
    for r in att:
        print(f"   {r['tp']:>2} {r['decode_median']:>10.1%} {r['decode_worst']:>7.1%} "
              f"{r['decode_by_split_median']:>12.1%} {r['decode_by_split_worst']:>7.1%} "
              f"{r['analytical_decode_median']:>15.1%} {r['analytical_decode_worst']:>7.1%} "
              f"{r['prefill_median']:>11.1%} {r['prefill_worst']:>7.1%}")
    print("   decode: the step model's curve of KV bytes (convex, for the lower bound); 'by split' also uses how the "
          "bytes split into sequences")
    print("   All-reduce (Vidur, H100 DGX), every other size predicted from the rest")
    ar = validate_allreduce("h100")
    for r in ar:
        print(f"   {r['gpus']} GPUs: median {r['median']:.1%}, p90 {r['p90']:.1%}, worst {r['worst']:.0%} "
              f"({r['points']} sizes; the worst are the profile's own jumps between neighbouring sizes)")
    return {"attention": att, "allreduce": ar}


def part_c() -> dict:
    folders = sorted(MEASURED_DIR.glob("h100-*"))
    rep = compare_gpu_check(folders[-1])
    s = rep.summary()
    print(f"\nC. GPU check {folders[-1].name} (ours, H100) against the step models, |relative error|")
    for k, v in s.items():
        if v:
            print(f"   {k:<28} median {v['median']:>6.1%}  worst {v['worst']:>6.1%}")
    print("   per TP (linear layers, Vidur-based / ours - 1): " + "; ".join(
        f"TP={r['tp']} {r['regime']} {r['median']:+.0%}" for r in rep.linear if r["regime"] != "prefill"))
    return rep.to_json()


class _Swapped(MeasuredPerfModel):
    """The measured step model with some terms taken from the analytical model (a probe, not a model)."""

    swap: tuple[str, ...] = ()
    analytical_cal = Calibration()

    def _gpu_step_s(self, cfg, batch, ctx):
        t = super()._gpu_step_s(cfg, batch, ctx)
        if cfg.kind != "tp" or not self.swap:
            return t
        m, g, c = self.model, self.gpu, self.analytical_cal
        ana = PerfModel(m, g, c)
        b = np.array([float(batch)])
        measured_ar = m.layers * 2 * float(self._ar_s(cfg.tp, b * m.d_model * 2, cfg)[0])
        if "all-reduce" in self.swap:
            t += m.layers * 2 * ana._allreduce_s(cfg.tp, batch * m.d_model * 2, cfg) - measured_ar
        if "attention" in self.swap:
            hbm, flops = g.hbm_bytes_per_s * c.mem_efficiency, g.bf16_flops * c.compute_efficiency
            t += ana._attention_s(cfg.tp, ctx, hbm, flops) - self._table(cfg).attention_s(batch, ctx)
        if "linear layers" in self.swap:  # GEMMs, element-wise kernels and LM head -> the roofline's GEMM term
            hbm, flops = g.hbm_bytes_per_s * c.mem_efficiency, g.bf16_flops * c.compute_efficiency
            gemm = max(m.dense_params * 2 / cfg.tp / hbm, 2.0 * m.active_params * batch / cfg.tp / flops)
            t += gemm + m.layers * c.layer_overhead_s - (self._table(cfg).linear_s(batch) - measured_ar)
        return t


def part_d(quick: bool) -> dict:
    """Which measured term gives TP=8 its tail edge: the §2.1 case study with each term swapped for the analytical."""
    from orchestrl.compute_sched.calibration import calibration_setup
    from orchestrl.compute_sched.case_study import case_study_times

    path = bundled_calibration("H800", "measured")
    setup = calibration_setup(path)
    if quick:
        setup = replace(setup, seeds=setup.seeds[:1])
    cal = load_calibration(path)
    ana_path = bundled_calibration("H800", "analytical")
    ana_cal = load_calibration(ana_path) if ana_path is not None else Calibration()
    model, gpu = load_model("Qwen2.5-14B"), load_gpu("H800")
    print(f"\nD. What gives TP=8 its tail edge in §2.1 (Qwen2.5-14B, 8 H800s; {os.path.basename(str(path))}, "
          f"{len(setup.seeds)} trace draw(s)): the measured model with one term at a time taken from the analytical "
          "model (its bundled H800 constants)")
    print(f"   {'analytical term(s)':<34} {'tail TP=4/TP=8':>14} {'tail TP=2/TP=8':>14} {'early TP=4/TP=2':>15}")
    out = {}
    for swap in ((), ("all-reduce",), ("attention",), ("linear layers",), ("all-reduce", "attention", "linear layers")):
        pm = _Swapped(model, gpu, cal)
        pm.swap, pm.analytical_cal = swap, ana_cal
        t = case_study_times(pm, setup)
        row = {"tail_tp4_over_tp8": t["tail", 4] / t["tail", 8], "tail_tp2_over_tp8": t["tail", 2] / t["tail", 8],
               "early_tp4_over_tp2": t["early", 4] / t["early", 2]}
        name = ", ".join(swap) or "none (the measured model)"
        out[name] = row
        print(f"   {name:<34} {row['tail_tp4_over_tp8']:>14.3f} {row['tail_tp2_over_tp8']:>14.3f} "
              f"{row['early_tp4_over_tp2']:>15.3f}")
    print("   paper: tail TP=4/TP=8 1.141, TP=2/TP=8 1.262, early TP=4/TP=2 1.216 (reference)")
    pm = MeasuredPerfModel(model, gpu, cal)
    ana = PerfModel(model, gpu, ana_cal)
    print("   one straggler step, b sequences at 12K tokens on one instance, ms (measured all-reduce | analytical ring): "
          + "; ".join(f"b={b}: TP=4 {pm._allreduce_s(4, b * 10240) * 96e3:.1f} | {ana._allreduce_s(4, b * 10240) * 96e3:.1f}"
                      f", TP=8 {pm._allreduce_s(8, b * 10240) * 96e3:.1f} | {ana._allreduce_s(8, b * 10240) * 96e3:.1f}"
                      for b in (4, 32)))
    return out


def part_e(quick: bool) -> dict:
    batches = (128,) if quick else (64, 256)
    print(f"\nE. RollArt §3.1: Qwen3-8B rollouts, 2 H800s vs 6 H20s (derived from H100 data by datasheet ratios), "
          f"batches {', '.join(map(str, batches))}; H800 time / H20 time")
    out = {}
    for sm in ("measured", "analytical"):
        rows = rollout_rows(sm, batches)
        fl = [r["h800_over_h20"] for r in rows if r["task"] == "FrozenLake"]
        gm = [1.0 / r["h800_over_h20"] for r in rows if r["task"] == "GEM-math"]
        lo, hi = PAPER["gem_math_h20_over_h800"]
        out[sm] = {"rows": rows, "frozenlake_h800_over_h20": [min(fl), float(np.median(fl)), max(fl)],
                   "gem_math_h20_over_h800": [min(gm), float(np.median(gm)), max(gm)],
                   "frozenlake_reaches_paper": bool(min(fl) <= PAPER["frozenlake_h800_over_h20"]),
                   "gem_math_overlaps_paper": bool(min(gm) <= hi and max(gm) >= lo)}
        print(f"   {sm:<10} FrozenLake H800/H20 {min(fl):.2f}-{max(fl):.2f} (median {np.median(fl):.2f}; paper "
              f"{PAPER['frozenlake_h800_over_h20']}); GEM-math H20/H800 {min(gm):.2f}-{max(gm):.2f} (median "
              f"{np.median(gm):.2f}; paper {lo}-{hi})")
        best = min((r for r in rows if r["task"] == "FrozenLake"), key=lambda r: r["h800_over_h20"])
        print(f"   {'':<10} fastest H800 shape: {best['turns']} turns, {best['obs_tokens']} observation and "
              f"{best['act_tokens']} action tokens per turn, {best['trajectories']} trajectories")
    return out


def part_f() -> dict:
    rows = gemm_gap()
    print("\nF. Training: dense-GEMM efficiency of the MFU model vs measured forward linear layers (H100, >= 2,048 "
          "tokens)")
    print(f"   {'model':<28} {'TP':>2} {'measured linear':>15} {'measured block':>14} {'MFU model':>9} {'ratio':>6}")
    for r in rows:
        print(f"   {r['model'].split('/')[-1]:<28} {r['tp']:>2} {r['measured_linear_eff']:>15.1%} "
              f"{r['measured_block_eff']:>14.1%} {r['model_dense_eff']:>9.1%} {r['model_over_measured_time']:>5.2f}x")
    gap = [r["model_over_measured_time"] for r in rows]
    print(f"   the training model charges dense GEMMs {min(gap):.2f}-{max(gap):.2f}x the measured forward kernel time "
          "(its fitted efficiency also carries backward, element-wise kernels and what published MFU includes)")
    return {"rows": rows, "gap_min": min(gap), "gap_max": max(gap)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="H100 only and a smaller RollArt grid")
    ap.add_argument("--json", action="store_true", help="also print one JSON document at the end")
    args = ap.parse_args(argv)
    t0 = time.time()
    print(f"step_model benchmark, {platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
          f"{' (quick)' if args.quick else ''}; default step model: {DEFAULT_STEP_MODEL}")
    doc = {"blocks": part_a(("H100",) if args.quick else ("H100", "A100")), "attention_allreduce": part_b(),
           "gpu_check": part_c(), "tail_terms": part_d(args.quick), "rollart": part_e(args.quick), "training": part_f()}
    h100 = doc["blocks"]["H100"]["cells"]
    key = lambda c: f"{c['regime']}/tp{c['tp']}"  # noqa: E731
    doc.update(
        oos_median_error={**{key(c): c["median"] for c in h100}, "max": max(c["median"] for c in h100)},
        oos_worst_error={**{key(c): c["worst"] for c in h100}, "max": max(c["worst"] for c in h100)},
        analytical_oos_median_error={**{key(c): c["analytical_median"] for c in h100},
                                     "max": max(c["analytical_median"] for c in h100)},
        analytical_oos_worst_error={**{key(c): c["analytical_worst"] for c in h100},
                                    "max": max(c["analytical_worst"] for c in h100)},
        default_step_model=DEFAULT_STEP_MODEL, wall_s=time.time() - t0, date=time.strftime("%Y-%m-%d"),
        machine=f"{platform.machine()} {os.cpu_count()} cores")
    print(f"\nout of sample (H100 blocks): median <= {doc['oos_median_error']['max']:.1%}, worst "
          f"{doc['oos_worst_error']['max']:.1%}; analytical median <= {doc['analytical_oos_median_error']['max']:.1%}, "
          f"worst {doc['analytical_oos_worst_error']['max']:.1%}; wall time {doc['wall_s']:.0f} s")
    if args.json:
        print(json.dumps(doc, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
