"""Check RLSim's JigsawRL step model against third-party measured RL step breakdowns (out of sample).

RLSim times a JigsawRL pipeline's step as rollout on the simulated engine (``SimEngine``, the project's
``PerfModel``) plus reference and training as a fixed cost plus FLOPs at an MFU
(``sim/multiplex/rollout.py``), fitted to the stage shares of two rows of the JigsawRL paper's Table 1
and checked on its other three. This benchmark checks it on measurements nobody here produced, at far
larger batches than Table 1's: public step-time breakdowns of synchronous, co-located GRPO on 8 H100s.
For each, the same batch (prompts x samples, the measured mean response length, reached by scaling the
task's response lengths) is simulated for one step on 8 DP workers of TP 1, and each stage's time is
printed beside the measured one, with the ratio and the rollout share of the step.

Sources (read 2026-11-29):

* NeMo-RL v0.3 release table, Llama-3.1-8B-Instruct GRPO on OpenMathInstruct-2, one 8-H100 node, vLLM TP 1,
  64 prompts x 32 samples, 795 generated tokens a sample on average, Megatron and DTensor backends, with an
  independent rerun: github.com/NVIDIA-NeMo/RL/issues/959 (quoting nvidia-nemo.github.io/blog/2025/07/21/
  nemo-rl-v0.3). "Get logprobs" there is the policy's and the reference model's forward passes together.
* A public veRL benchmark report, GRPO Qwen2.5-7B on GSM8K, 8 H100, FSDP + vLLM, 1024 prompts x 5, mean
  prompt 93 and response 232 tokens, final step of wandb run 6icl7pbz: ``timing_s/gen`` 33.03 (of which
  ``generate_sequences`` 26.73), ``old_log_prob`` 8.25, ``ref`` 8.74, ``update_actor`` 29.14 (the logged
  114.85 s step includes 16.59 s of validation and 17.93 s of checkpointing). Qwen2.5-7B is not bundled;
  Qwen3-8B (8.2B parameters against 7.6B) stands in for it.

Run from the repository root::

    python bench/jigsaw_stage_check.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrl.sim.multiplex.runner import simulate_steps  # noqa: E402
from orchestrl.sim.multiplex.rollout import (MFU_REF, MFU_TRAIN, REF_FIXED_S, TRAIN_FIXED_S,  # noqa: E402
                                             fit_post_model, veRL_shares)
from orchestrl.sim.multiplex.workload import TABLE1, PipelineSpec, draw_samples  # noqa: E402

#: Table 1's rows the post model's fixed parts (and, today, its MFUs) are fitted to; the other three are held out
FIT_ROWS = (("Qwen3-0.6B", "gsm8k", 4), ("Qwen3-4B", "gsm8k", 4))

#: (label, spec, measured mean response tokens, measured seconds: generation, forward passes after it, training,
#: the step without validation and checkpointing); ranges where a source gives two runs
MEASURED = (
    ("NeMo-RL Llama-3.1-8B math, Megatron (NVIDIA; rerun)",
     PipelineSpec("nemo-rl-8b", "Llama-3.1-8B", "math", prompts=64, group=32, max_response=3900), 795,
     {"gen": (58, 56), "forward": (18, 18), "train": (28, 27), "step": (112, 116)}),
    ("NeMo-RL Llama-3.1-8B math, DTensor (NVIDIA; rerun)",
     PipelineSpec("nemo-rl-8b", "Llama-3.1-8B", "math", prompts=64, group=32, max_response=3900), 795,
     {"gen": (57, 55), "forward": (19, 19), "train": (38, 40), "step": (122, 129)}),
    ("veRL Qwen2.5-7B GSM8K, FSDP (Qwen3-8B stands in)",
     PipelineSpec("verl-7b", "Qwen3-8B", "gsm8k", prompts=1024, group=5, max_response=1024), 232,
     {"gen": (33.03, 33.03), "forward": (16.99, 16.99), "train": (29.14, 29.14), "step": (80.3, 80.3)}),
)

#: the measured model's parameters over the simulated stand-in's, where they differ (Qwen2.5-7B, 7.61B, measured;
#: Qwen3-8B, 8.19B, simulated): the MFU a measurement implies is scaled by it (the stand-in has more FLOPs per token)
FLOPS_SCALE = {"verl-7b": 7.61e9 / 8.19e9}


def scaled(spec: PipelineSpec, mean_tokens: float) -> tuple[PipelineSpec, float]:
    """``spec`` with its response lengths scaled so that step 0's mean response is ``mean_tokens`` (bisection)."""
    lo, hi = 0.05, 4.0
    for _ in range(25):
        mid = (lo + hi) / 2
        mean = statistics.fmean(s.response_tokens for s in draw_samples(replace(spec, length_scale=mid), 0))
        lo, hi = (mid, hi) if mean < mean_tokens else (lo, mid)
    return replace(spec, length_scale=(lo + hi) / 2), mean


def check(label: str, spec: PipelineSpec, mean_tokens: float, measured: dict) -> dict:
    spec, mean = scaled(spec, mean_tokens)
    st = simulate_steps(spec, "H100", 8, 1)
    gen = max(t.end_s for t in st.traces[0])
    ref = max(r for r, _ in st.post[0])
    train = max(t for _, t in st.post[0])
    ours = {"gen": gen, "forward": ref, "train": train, "step": gen + ref + train}
    meas = {k: statistics.fmean(v) for k, v in measured.items()}
    return {"label": label, "model": spec.model, "flops_scale": FLOPS_SCALE.get(spec.name, 1.0),
            "length_scale": spec.length_scale, "mean_response": mean,
            "tokens": st.tokens[0], "ours_s": ours, "measured_s": meas,
            "ratio": {k: ours[k] / meas[k] for k in ours},
            "rollout_share": {"ours": gen / ours["step"], "measured": meas["gen"] / meas["step"]}}


def implied_mfus(rows: list[dict], fixed: tuple[float, float]) -> list[tuple[float, float]]:
    """The (train, reference) MFUs each measurement implies, the fixed parts per step held at ``fixed``.

    Our training is ``fixed + FLOPs / MFU``, so the measured time less the fixed part gives the MFU; the measured
    forward time is two passes (the policy's old log-probs and the reference), each costing one reference pass.
    A stand-in model's extra FLOPs are taken out (:data:`FLOPS_SCALE`).
    """
    ft, fr = fixed
    out = []
    for r in rows:
        o, m, k = r["ours_s"], r["measured_s"], r["flops_scale"]
        out.append((k * MFU_TRAIN * (o["train"] - TRAIN_FIXED_S) / (m["train"] - ft),
                    k * MFU_REF * (o["forward"] - REF_FIXED_S) / (m["forward"] / 2 - fr)))
    return out


def refit(rows: list[dict]) -> dict:
    """Refit the post model to these measurements' MFUs (the median each implies) and Table 1's two fit rows'
    fixed parts, alternating until both settle, and compare Table 1's rollout shares under both fits."""
    fixed = (TRAIN_FIXED_S, REF_FIXED_S)
    for _ in range(20):
        per = implied_mfus(rows, fixed)
        mfus = (statistics.median(p[0] for p in per), statistics.median(p[1] for p in per))
        fit = fit_post_model(FIT_ROWS, mfus=mfus)
        if abs(fit[1] - fixed[0]) + abs(fit[3] - fixed[1]) < 1e-6:
            break
        fixed = (fit[1], fit[3])
    current = (MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S)
    table = []
    for key, paper in TABLE1.items():
        spec = PipelineSpec("table1", key[0], key[1])
        ours = {name: veRL_shares(spec, "H100", key[2], fitted=f)[0][0] for name, f in (("current", current),
                                                                                          ("refit", fit))}
        table.append({"row": list(key), "fit_row": key in FIT_ROWS, "paper": paper[0] + paper[3], **ours})
    err = {name: {"held_out": statistics.fmean(abs(t[name] - t["paper"]) for t in table if not t["fit_row"]),
                  "all": statistics.fmean(abs(t[name] - t["paper"]) for t in table)} for name in ("current", "refit")}
    return {"implied_mfus": per, "refit": fit, "current": current, "table1": table, "mean_abs_error": err}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the same checks (they take seconds)")
    ap.add_argument("--json", action="store_true", help="also print one JSON document at the end")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = [check(*m) for m in MEASURED]
    print("RLSim's JigsawRL step model against third-party measured GRPO steps (8 H100, co-located, synchronous); "
          "seconds, ours / measured")
    print(f"  {'setting':52s} {'generation':>17s} {'fwd passes':>17s} {'training':>17s} {'rollout share':>14s}")
    for r in rows:
        o, m, q = r["ours_s"], r["measured_s"], r["ratio"]
        cell = lambda k: f"{o[k]:5.1f}/{m[k]:5.1f} {q[k]:4.2f}x"  # noqa: E731
        print(f"  {r['label']:52s} {cell('gen'):>17s} {cell('forward'):>17s} {cell('train'):>17s} "
              f"{r['rollout_share']['ours']:5.0%} / {r['rollout_share']['measured']:4.0%}")
    print("  (forward passes: ours one reference pass, measured the policy's old log-probs and the reference together)")
    rf = refit(rows)
    print("\nWhat refitting the post model to these measurements would do (MFUs from them, fixed parts from Table 1's "
          "two fit rows):")
    print("  implied (train, reference) MFU per measurement: "
          + ", ".join(f"({a:.0%}, {b:.0%})" for a, b in rf["implied_mfus"]))
    for name in ("current", "refit"):
        mt, ft, mr, fr = rf[name]
        print(f"  {name:8s} train {mt:.1%} MFU + {ft:.2f} s, reference {mr:.1%} MFU + {fr:.2f} s")
    print(f"  {'Table 1 row (rollout + tool share)':38s} {'paper':>6s} {'current':>8s} {'refit':>6s}")
    for t in rf["table1"]:
        label = f"{t['row'][0]} {t['row'][1]} {t['row'][2]} GPUs" + (" (fit)" if t["fit_row"] else "")
        print(f"  {label:38s} {t['paper']:6.1%} {t['current']:8.1%} {t['refit']:6.1%}")
    e = rf["mean_abs_error"]
    print(f"  mean |error| in points, held-out rows: current {100 * e['current']['held_out']:.1f}, refit "
          f"{100 * e['refit']['held_out']:.1f}; all five rows: current {100 * e['current']['all']:.1f}, refit "
          f"{100 * e['refit']['all']:.1f}  ({time.perf_counter() - t0:.0f} s)")
    print("  Fig. 12 under the refit (a what-if): python bench/jigsaw.py --post-fit "
          + ",".join(f"{v:.4g}" for v in rf["refit"]))
    if args.json:
        print(json.dumps({"checks": rows, "refit": rf, "wall_s": time.perf_counter() - t0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
