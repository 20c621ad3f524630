"""RollArt §3.1 and §7.4: H800 vs H20 cost-equivalent rollouts; environment latency, redundancy, the bound.

* §3.1: one task's rollout on 2 H800s against 6 H20s (same cost): paper FrozenLake down to 0.53x on
  H800, GEM-math on H20 0.49-0.79x of H800's time;
* Fig. 12a: trajectory-level over batch-level interaction as injected environment latency grows;
* Fig. 12b: redundant environments (25%, 50%) against none;
* Fig. 13: asynchronous bound 1..6, step time over bound 1 (paper: at most 1.22x faster).

Run ``python -m orchestrl.sim.experiments.rollart_env [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from orchestrl.sim.agentic.cluster import Pool
from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.rollart_common import Case, by, cluster, figure, scaled


def cases(quick: bool = False) -> list:
    its = 3 if quick else 4
    out = []
    for task in ("frozenlake", "gem-math"):  # §3.1: 2 H800 vs 6 H20, one task, rollout only (synchronous steps)
        for gpu, n in (("H800", 2), ("H20", 6)):
            c = replace(cluster("Qwen3-8B", (Pool(gpu.lower(), gpu, n),), quick, tasks=(task,)), batch_groups=4)
            out.append(Case("env", f"3.1/{task}/{gpu}", c, "verl+", 2, extra={"check": "3.1", "task": task, "gpu": gpu}))
    base = cluster("Qwen3-8B", (Pool("h800", "H800", scaled(32, quick)),), quick, tasks=("frozenlake",))
    for lat in ((1, 5) if quick else (1, 5, 10)):
        c = replace(base, latency_scale=float(lat))
        out.append(Case("env", f"12a/traj/{lat}", c, "verl+", its, extra={"latency": lat, "mode": "trajectory"}))
        out.append(Case("env", f"12a/batch/{lat}", c, "verl+", its, batched=True, extra={"latency": lat,
                                                                                         "mode": "batch"}))
    failing = replace(base, tasks=("gem-math",))
    for red in (0.0, 0.25, 0.5):
        out.append(Case("env", f"12b/red/{red}", failing, "rollart", its, 1, red, extra={"redundancy": red}))
    for b in ((1, 2, 4) if quick else (1, 2, 3, 4, 6)):
        out.append(Case("env", f"13/bound/{b}", base, "rollart", its, b, extra={"bound_sweep": b}))
    return out


def rows_of(results: list[dict]) -> list[Row]:
    rows = []
    for task, paper in (("frozenlake", 0.53), ("gem-math", 0.79)):
        h800, h20 = by(results, check="3.1", task=task, gpu="H800"), by(results, check="3.1", task=task, gpu="H20")
        if task == "frozenlake":
            rows.append(Row("3.1 FrozenLake: 2 H800 / 6 H20 rollout time", paper, h800["step_s"] / h20["step_s"]))
        else:
            rows.append(Row("3.1 GEM-math: 6 H20 / 2 H800 rollout time", paper, h20["step_s"] / h800["step_s"],
                            {"paper_range": "0.49-0.79"}))
    for lat in sorted({r["latency"] for r in results if "latency" in r}):
        t, b = by(results, latency=lat, mode="trajectory"), by(results, latency=lat, mode="batch")
        rows.append(Row(f"12a latency x{lat}: batch / trajectory step", None, b["step_s"] / t["step_s"]))
    none = by(results, redundancy=0.0)
    for red in (0.25, 0.5):
        rows.append(Row(f"12b redundancy {red:.0%}: step speedup", None, none["step_s"] / by(results, redundancy=red)["step_s"]))
    b1 = by(results, bound_sweep=1)
    best = max(b1["step_s"] / r["step_s"] for r in results if "bound_sweep" in r)
    for r in sorted((r for r in results if "bound_sweep" in r), key=lambda r: r["bound_sweep"]):
        rows.append(Row(f"13 bound {r['bound_sweep']}: bound-1 step / this", None, b1["step_s"] / r["step_s"]))
    rows.append(Row("13 best bound's step reduction", 1.22, best))
    return rows


NOTES = ("§3.1 runs synchronous rollout steps of one task (no training overlap) on the two GPU sets; H20 is derived "
         "from its datasheet in the roofline, not measured",)
FIGURE = figure("rollart-env", "RollArt §3.1 and §7.4: hardware, environment latency, redundancy, bound", "ratio",
                NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
