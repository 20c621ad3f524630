"""The recipe behind the bundled H800 calibration: what is fitted, what is fixed and why, what is swept.

Run ``python -m orchestrl.compute_sched.calibration_h800`` to refit and rewrite
``specs/calibrations/qwen2.5-14b-h800-paper.yaml`` (``--step-model measured``: the measured step
model's host constants, ``qwen2.5-14b-h800-measured.yaml``, under the assumptions the analytical
sweep chose) (15-30 minutes on 2 cores: one fit per
assumption set of :data:`ASSUMPTIONS`, then six leave-one-out refits, the veRL-TO checks, the
memory-share refits and the 40-draw spread for the chosen one); ``--quick`` fits the chosen
assumptions only.

Design note
-----------
The six §2.1 times cannot pin down many constants, so only the four the datasheets and vLLM's
code leave open are fitted (:data:`H800_PARAMETERS`: achieved HBM bandwidth, per-step and
per-sequence host time, and how much of the host time vLLM hides under the GPU's); the others are
fixed from what veRL and NCCL do (:data:`H800_FIXED`, each with its reason). What the paper leaves
unstated about the experiment itself (where the snapshots sit, how the tail was re-launched) is
swept (:data:`ASSUMPTIONS`) and the set with the lowest in-sample error among those that keep the
orderings is kept; the choice is made on the same six points, so the leave-one-out error measures
the constants' fit given the chosen assumptions, not the choice itself. Every set tried, with its
error, is written into the file. Checks the fit never sees are stored beside it: each point
predicted by a fit to the other five, the best static TP of the §6 14B setting (the paper's
veRL-TO sweep found eight TP=2 instances on 16 GPUs, §6.2.2) and on how many single draws TP=2
wins there, and how far §2.1's ratios move between single trace draws (the paper measured one
batch).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from orchestrl.compute_sched.calibration import (CALIBRATIONS_DIR, CaseStudyFit, FitParameter, fit_case_study,
                                                 leave_one_out, orderings_ok, save_calibration, step_model_class)
from orchestrl.compute_sched.case_study import PAPER_POINTS, CaseStudySetup, case_study_times
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.perf import Calibration, PerfModel
from orchestrl.compute_sched.traces import heavy_tailed_trace

__all__ = ["H800_PARAMETERS", "MEASURED_PARAMETERS", "H800_FIXED", "ASSUMPTIONS", "CHOSEN", "best_static_tp", "memory_share_refits",
           "per_draw_spread", "static_makespans", "tp2_vs_tp4_per_draw", "main"]

H800_PARAMETERS = (
    FitParameter("mem_efficiency", 0.45, 0.9,
                 "achieved / peak (3.35 TB/s) HBM3 bandwidth of decode GEMMs and paged attention; measured decode "
                 "kernels reach 50-90%"),
    FitParameter("step_overhead_s", 0.5e-3, 12e-3,
                 "host time per engine step (scheduling, input preparation, sampling launch, Python); vLLM spends "
                 "1-10 ms per step depending on version and CUDA graphs"),
    FitParameter("seq_overhead_s", 1e-6, 150e-6,
                 "host time per sequence per step, once per instance whatever its TP (scheduler bookkeeping, "
                 "output processing); vLLM V0 measured tens of us per sequence, V1 fewer"),
    FitParameter("host_overlap", 0.0, 1.0,
                 "share of the shorter of host and GPU time hidden under the other: 0 for a synchronous engine "
                 "loop, 1 when the next step is scheduled while the GPU runs this one"),
)
#: The measured step model takes its GPU time from measured operators: only the host constants are free.
MEASURED_PARAMETERS = H800_PARAMETERS[1:]
H800_FIXED: dict[str, tuple[object, str]] = {
    "custom_allreduce": (False, "veRL builds its vLLM rollout with disable_custom_all_reduce=True: TP all-reduces "
                                "are NCCL's ring"),
    "hop_latency_s": (0.5e-6, "one step of NCCL's low-latency protocol over NVLink; a ring all-reduce takes "
                              "2(n-1) steps"),
    "link_efficiency": (0.4, "NCCL ring all-reduce bus bandwidth for the 0.1-5 MB messages of decode is about "
                             "80 GB/s of the H800's 200 GB/s per direction"),
    "mem_utilization": (0.85, "vLLM gpu_memory_utilization of a dedicated rollout cluster (veRL examples use "
                              "0.6-0.9; disaggregated generation GPUs hold no trainer state)"),
    "max_num_seqs": (1024, "vLLM batch limit per instance (veRL raises it for rollout; at 512 requests on "
                           "8 GPUs the limit never binds below TP=8)"),
}
ASSUMPTIONS = (  # swept; the comments of CaseStudySetup say what each field means
    CaseStudySetup(snapshot="requests", tail_fraction=0.2, max_tokens=15360),
    CaseStudySetup(snapshot="requests", tail_fraction=0.25, max_tokens=15360),
    CaseStudySetup(snapshot="requests", tail_fraction=0.2, max_tokens=20480),
    CaseStudySetup(snapshot="requests", tail_fraction=0.25, max_tokens=20480),
    CaseStudySetup(snapshot="requests", tail_fraction=0.3, max_tokens=20480),
    CaseStudySetup(snapshot="requests", tail_fraction=0.25, max_tokens=20480, tail_placement="resplit"),
    CaseStudySetup(snapshot="tokens", window_tokens=3072, max_tokens=15360),
    CaseStudySetup(snapshot="tokens", window_tokens=4096, max_tokens=15360),
    CaseStudySetup(snapshot="own-run", tail_fraction=0.25, max_tokens=15360),
    CaseStudySetup(snapshot="own-run", tail_fraction=0.2, max_tokens=20480),
    CaseStudySetup(snapshot="own-run", tail_fraction=0.25, max_tokens=20480),
)
CHOSEN = ASSUMPTIONS[3]  # what the bundled file was fitted under (the sweep's winner on 2026-11-24)
DEFAULT_PATH = CALIBRATIONS_DIR / "qwen2.5-14b-h800-paper.yaml"
MEASURED_PATH = CALIBRATIONS_DIR / "qwen2.5-14b-h800-measured.yaml"
SOURCE = "OrchestrRL §2.1: Qwen2.5-14B, 8 H800s, TP x DP = 8, batch 512, early and tail phase"


def base_perf(step_model: str = "analytical") -> PerfModel:
    """Qwen2.5-14B on H800 under a step model with the fixed constants applied (the fit's starting point)."""
    base = step_model_class(step_model)(load_model("Qwen2.5-14B"), load_gpu("H800"))
    return base.with_calibration(replace(Calibration(), **{k: v for k, (v, _) in H800_FIXED.items()}))


def static_makespans(perf: PerfModel, *, gpus: int = 16, prompts: int = 128, cap: int = 15360,
                     seeds: Sequence[int] = (11, 12), tps: Sequence[int] = (1, 2, 4, 8)) -> dict[int, list[float]]:
    """Makespan of a static TP layout on each trace draw of the §6 14B setting: ``{tp: [seconds per seed]}``.

    128 GRPO groups of 8 is §2.1's density (64 requests per GPU), the one the paper states.
    """
    from orchestrl.compute_sched.replay import replay  # the replay imports the scheduler; keep this module light

    traces = [heavy_tailed_trace(prompts, 8, cap, seed=s) for s in seeds]
    return {tp: [replay(t, perf, gpus, f"static-tp:{tp}").makespan_s for t in traces] for tp in tps}


def best_static_tp(perf: PerfModel, *, caps: Sequence[int] = (15360, 25600), **kw) -> dict[int, dict[int, float]]:
    """Mean makespan per TP of a static layout in the §6 14B setting, per cap: ``{cap: {tp: seconds}}``.

    The paper's veRL-TO sweep (TP 1, 2, 4, 8) chose eight TP=2 instances on 16 generation GPUs
    (§6.2.2); a model faithful to the testbed picks TP=2 here too. ``kw`` as :func:`static_makespans`.
    """
    return {cap: {tp: float(np.mean(v)) for tp, v in static_makespans(perf, cap=cap, **kw).items()} for cap in caps}


def tp2_vs_tp4_per_draw(perf: PerfModel, *, caps: Sequence[int] = (15360, 25600),
                        seeds: Sequence[int] = range(20), **kw) -> dict[str, dict]:
    """Per cap, on how many single draws a static TP=2 layout beats TP=4 in the §6 14B setting.

    :func:`best_static_tp` averages two draws; this says whether its verdict is one draw's luck.
    ``{cap: {"draws", "tp2_wins", "mean_tp2_over_tp4"}}`` (the mean of the per-draw ratios).
    """
    out = {}
    for cap in caps:
        runs = static_makespans(perf, cap=cap, seeds=seeds, tps=(2, 4), **kw)
        ratios = np.array(runs[2]) / np.array(runs[4])
        out[str(cap)] = {"draws": len(ratios), "tp2_wins": int((ratios < 1.0).sum()),
                         "mean_tp2_over_tp4": round(float(ratios.mean()), 3)}
    return out


def memory_share_refits(setup: CaseStudySetup, shares: Sequence[float] = (0.5, 0.4), *,
                        max_nfev: int = 40) -> list[dict]:
    """Refit at each vLLM ``gpu_memory_utilization`` in ``shares``: does a smaller KV cache give TP=8 its tail edge?

    §2.1 does not state the engine's memory share. A smaller one shrinks every instance's KV
    cache, and TP=8 (one copy of the weights) keeps the most room for KV, so preemption at TP=2
    and TP=4 is the one effect outside the balanced step model (docs/compute_sched.md) that could
    widen TP=8's tail lead. Each row: the share, the refit's rms log error, and the tail
    TP=4/TP=8 and early TP=4/TP=2 ratios it gives (paper: 1.14, 1.22).
    """
    rows = []
    for share in shares:
        perf = base_perf()
        fit = fit_case_study(perf.with_calibration(replace(perf.cal, mem_utilization=share)), H800_PARAMETERS,
                             setup=setup, max_nfev=max_nfev)
        t = fit.times
        rows.append({"mem_utilization": share, "rms_log_error": round(fit.rms_log_error, 4),
                     "tail_tp4_over_tp8": round(t["tail", 4] / t["tail", 8], 3),
                     "early_tp4_over_tp2": round(t["early", 4] / t["early", 2], 3)})
    return rows


_RATIOS = {"early_tp4_over_tp2": (("early", 4), ("early", 2)), "early_tp8_over_tp2": (("early", 8), ("early", 2)),
           "tail_tp4_over_tp8": (("tail", 4), ("tail", 8)), "tail_tp2_over_tp8": (("tail", 2), ("tail", 8))}


def per_draw_spread(perf: PerfModel, setup: CaseStudySetup, seeds: Sequence[int] = range(40),
                    near: float = 0.05) -> dict:
    """How §2.1's four ratios spread over single trace draws under ``perf``: the paper measured one batch.

    The fit matches the mean over ``setup.seeds``; the paper's six times come from one step of
    one batch, whose imbalance is its own. Per ratio: the mean, the 5th/50th/95th percentiles and
    range over ``seeds``, the paper's value, and how many draws reach it (at least as far from 1);
    ``draws_within`` counts draws whose four ratios are all within ``near`` (relative) of the
    paper's, and ``closest`` names the draw nearest to them (largest relative miss).
    """
    paper = {(p.phase, p.tp): p.seconds for p in PAPER_POINTS}
    rows = []
    for seed in seeds:
        t = case_study_times(perf, replace(setup, seeds=(seed,)))
        rows.append({name: t[a] / t[b] for name, (a, b) in _RATIOS.items()})
    out: dict = {"draws": len(rows), "seeds": f"{min(seeds)}-{max(seeds)}", "ratios": {}}
    for name, (a, b) in _RATIOS.items():
        v = np.array([r[name] for r in rows])
        ref = paper[a] / paper[b]
        out["ratios"][name] = {"paper": round(ref, 3), "mean": round(float(v.mean()), 3),
                               "p5_p50_p95": [round(float(q), 3) for q in np.percentile(v, [5, 50, 95])],
                               "min_max": [round(float(v.min()), 3), round(float(v.max()), 3)],
                               "draws_reaching_paper": int((v >= ref).sum())}
    misses = [max(abs(r[n] / (paper[a] / paper[b]) - 1) for n, (a, b) in _RATIOS.items()) for r in rows]
    best = int(np.argmin(misses))
    out["draws_within"] = {"relative": near, "count": int(sum(m <= near for m in misses))}
    out["closest"] = {"seed": int(list(seeds)[best]), "largest_miss": round(misses[best], 3),
                      "ratios": {n: round(v, 3) for n, v in rows[best].items()}}
    return out


def _sweep_row(setup: CaseStudySetup, fit: CaseStudyFit) -> dict:
    times = fit.times
    return {"assumptions": setup.describe(), "rms_log_error": round(fit.rms_log_error, 4),
            "max_abs_rel_err": round(max(abs(e) for e in fit.rel_errors), 3), "orderings_ok": orderings_ok(times),
            "tail_tp4_over_tp8": round(times["tail", 4] / times["tail", 8], 3),
            "fitted": {p.name: float(f"{getattr(fit.calibration, p.name):.4g}") for p in fit.parameters}}


def main(argv: Sequence[str] | None = None) -> int:
    """Refit the bundled H800 calibration of a step model to OrchestrRL §2.1 and write it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-model", choices=("analytical", "measured"), default="analytical",
                    help="whose constants to fit: the analytical roofline's (GPU and host) or the measured step "
                         "model's (host only: its GPU time is measured)")
    ap.add_argument("--out", default=None, help="where to write the document (default: the bundled file)")
    ap.add_argument("--quick", action="store_true", help="fit the chosen assumptions only (no sweep)")
    ap.add_argument("--max-nfev", type=int, default=40, help="least-squares evaluations per start")
    args = ap.parse_args(argv)
    measured = args.step_model == "measured"
    out = args.out or str(MEASURED_PATH if measured else DEFAULT_PATH)
    params = MEASURED_PARAMETERS if measured else H800_PARAMETERS
    perf = base_perf(args.step_model)
    fits: dict[CaseStudySetup, CaseStudyFit] = {}
    # the measured model is fitted under the assumptions the analytical sweep chose, so the two differ only in
    # their step times
    for setup in ((CHOSEN,) if args.quick or measured else ASSUMPTIONS):
        fits[setup] = fit_case_study(perf, params, setup=setup, max_nfev=args.max_nfev)
        row = _sweep_row(setup, fits[setup])
        print(f"{row['assumptions']}: rms {row['rms_log_error']:.3f}, worst {row['max_abs_rel_err']:.1%}, "
              f"orderings {'ok' if row['orderings_ok'] else 'NOT kept'}, tail TP=4/TP=8 {row['tail_tp4_over_tp8']:.3f}",
              file=sys.stderr)
    keeping = [s for s in fits if _sweep_row(s, fits[s])["orderings_ok"]] or list(fits)
    chosen = min(keeping, key=lambda s: fits[s].rms_log_error)
    fit = fits[chosen]
    print(f"chosen: {chosen.describe()}; leave-one-out refits...", file=sys.stderr)
    held = leave_one_out(perf, fit)
    static = best_static_tp(perf.with_calibration(fit.calibration))
    checks = {"verl_to_best_static_tp_14b_16gpus": {str(cap): min(row, key=row.get) for cap, row in static.items()},
              "verl_to_paper": "eight TP=2 instances (§6.2.2)",
              "static_makespan_s": {str(cap): {str(tp): round(v, 1) for tp, v in row.items()}
                                    for cap, row in static.items()}}
    if not args.quick:
        if not measured:
            checks["memory_share_refits"] = memory_share_refits(chosen, max_nfev=args.max_nfev)
        checks["per_draw_spread"] = per_draw_spread(perf.with_calibration(fit.calibration), chosen)
        checks["verl_to_tp2_vs_tp4_per_draw"] = tp2_vs_tp4_per_draw(perf.with_calibration(fit.calibration))
    plain = step_model_class(args.step_model)(load_model("Qwen2.5-14B"), load_gpu("H800"))
    roof = case_study_times(plain, chosen)
    save_calibration(fit, out, name=Path(out).stem, gpu="H800", source=SOURCE,
                     engine="veRL rollout on vLLM (the paper's testbed)", fixed=H800_FIXED,
                     uncalibrated_s=[roof[p.phase, p.tp] for p in fit.points], held_out=held,
                     sweep=[_sweep_row(s, f) for s, f in fits.items()], checks=checks, step_model=args.step_model)
    print(f"wrote {out}; leave-one-out worst {max(abs(h.rel_error) for h in held):.1%}; "
          f"best static TP (14B, 16 GPUs): {checks['verl_to_best_static_tp_14b_16gpus']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
