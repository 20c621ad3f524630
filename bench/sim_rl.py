"""Benchmark RLSim: one RL iteration of Qwen3-235B-A22B on RFabric with OrchestrRL's scheduler.

Run from the repository root::

    python bench/sim_rl.py            # 2,048 GPUs cold and warm, growth 256..8,192, the Figure 17 sweep
    python bench/sim_rl.py --quick    # 256 GPUs cold and warm only (the test suite runs this)
    python bench/sim_rl.py --json     # also print one JSON document at the end

What is measured, all in this run:

1. **One iteration at 2,048 GPUs** (``examples/sim/fig17-qwen235b-2048.yaml``: 1,024 TP4-EP16-PP2
   trainers, 1,024 generators, 16,384 responses per step, piezo OCS). *Cold* is a fresh process's
   first iteration: building the fabric, the controller and the stages, then Gen, Train and Weight
   Sync of step 0 (the weight-sync plan is made here). *Warm* is the next iteration in the same
   process (step 1's trace, the stages' caches filled), what every later iteration of a run costs.
   Targets: cold < 60 s, warm < 15 s; the ratio columns are target / wall time and target / CPU
   time (> 1 meets it; on a loaded machine the CPU seconds stand for an idle machine's wall time).
2. **Where the time goes**: process CPU seconds attributed to the innermost of these parts running
   -- generation engine, generation planner (Algorithm 1's layout planner), balancer, network
   solves (the flow-level event loop and max-min solves), fabric controller (Algorithm 2,
   templates, allocation), weight-sync planner (App. E), and the rest (stage models, loop).
3. **Growth** from 256 to 8,192 GPUs (half train, half generate; responses per step scale with the
   generation GPUs), cold and warm, with the fitted exponent of CPU time against GPUs. Sizes after the
   first run in the same process (imports done; caches are keyed by scale, so nothing is reused).
4. **The full Figure 17 sweep** (``sim.experiments.fig17``; five configurations) against 10 minutes.

Wall times depend on the machine's load (it is shared): each row records the 1-minute load
average when it ran; CPU seconds are the steadier measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrl.fabric.errors import OrchestrlError  # noqa: E402  (path set up above)

TARGET_COLD_S = 60.0
TARGET_WARM_S = 15.0
TARGET_FIG17_S = 600.0
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "sim",
                       "fig17-qwen235b-2048.yaml")


def _parts():
    """(owner, attribute, part) of every function whose CPU time is attributed to a part."""
    import orchestrl.collectives.plan as wsplan
    import orchestrl.compute_sched.scheduler as scheduler
    import orchestrl.fabric.controller as controller
    import orchestrl.sim.network.events as events
    import orchestrl.sim.network.netsim as netsim
    import orchestrl.sim.stages.weight_sync as ws
    from orchestrl.compute_sched.sim_engine import SimEngine

    return ((scheduler, "plan_layout", "gen planner"), (scheduler, "plan_migrations", "gen balancer"),
            (SimEngine, "advance", "gen engine"), (SimEngine, "snapshot", "gen engine"),
            (SimEngine, "change_layout", "gen engine"), (SimEngine, "migrate", "gen engine"),
            (events, "simulate", "network solves"), (netsim, "simulate", "network solves"),
            (controller.FabricController, "materialize", "fabric controller"),
            (wsplan, "plan_weight_sync", "weight-sync planner"), (ws, "plan_weight_sync", "weight-sync planner"))


def attributing(acc: Counter) -> contextlib.AbstractContextManager[None]:
    """CPU time of an RL iteration by part (:func:`_parts`), innermost part running; see gen_profile."""
    from orchestrl.sim.stages.gen_profile import attributing as by_part

    return by_part(acc, _parts())


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def iteration_rows(gpus: int, warm_iterations: int = 1) -> list[dict]:
    """Build the Figure 17 run scaled to ``gpus`` and time a cold and ``warm_iterations`` warm iterations.

    One iteration is the three stages of one RL step in order: Gen of the step's trace, Train on its
    samples, Weight Sync (the asynchronous loop runs the same three calls per iteration).
    """
    from orchestrl.sim.config import load_run_config, validate
    from orchestrl.sim.loop import _finite  # the loop's own check: a stage that never finishes is named, not timed
    from orchestrl.sim.loop import long_lived_frozen
    from orchestrl.sim.run import build

    cfg = load_run_config(EXAMPLE)
    cfg = validate(replace(cfg, name=f"bench-{gpus}", cluster=replace(cfg.cluster, gpus=gpus, train_gpus=gpus // 2)))
    rows = []
    acc: Counter = Counter()
    wall, cpu, load = time.perf_counter(), time.process_time(), _load()
    with attributing(acc):
        sim = build(cfg)
    build_wall, build_cpu = time.perf_counter() - wall, time.process_time() - cpu
    build_parts = dict(acc)
    with long_lived_frozen() as settle:  # the garbage-collector policy of the loop (sim.loop.run_iterations)
        now = 0.0
        for k in range(1 + warm_iterations):
            acc = Counter(build_parts) if k == 0 else Counter()
            wall, cpu = time.perf_counter(), time.process_time()
            load = _load() if k else load
            with attributing(acc):  # the parts in the loop's order, each after settle() as the loop calls it
                settle()
                trace = sim.trace(k)
                settle()
                g = _finite(sim.stages.gen.run(trace, now), k)
                settle()
                t = _finite(sim.stages.train.run(sim.stages.batch_of(trace, g), now + g.time_s), k)
                settle()
                s = _finite(sim.stages.sync.run(now + g.time_s + t.time_s), k)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if k == 0:
                wall, cpu = wall + build_wall, cpu + build_cpu
            now += g.time_s + t.time_s + s.time_s
            parts = {p: round(v, 3) for p, v in sorted(acc.items())}
            parts["other"] = round(cpu - sum(acc.values()), 3)
            rows.append({"gpus": gpus, "run": "cold" if k == 0 else "warm", "requests": len(trace.requests),
                         "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load1": load, "parts_cpu_s": parts,
                         "simulated_s": {"gen": g.time_s, "train": t.time_s, "weight-sync": s.time_s}})
    return rows


def _print_rows(rows: list[dict]) -> None:
    parts = sorted({p for r in rows for p in r["parts_cpu_s"]}, key=lambda p: (p == "other", p))
    head = f"{'GPUs':>6} {'run':>5} {'requests':>8} {'wall s':>8} {'cpu s':>7} {'load':>5} " + " ".join(
        f"{p:>{max(9, len(p))}}" for p in parts)
    print(head)
    for r in rows:
        print(f"{r['gpus']:>6} {r['run']:>5} {r['requests']:>8} {r['wall_s']:>8.2f} {r['cpu_s']:>7.2f} "
              f"{r['load1']:>5.2f} " + " ".join(f"{r['parts_cpu_s'].get(p, 0.0):>{max(9, len(p))}.2f}" for p in parts))


def _exponent(rows: list[dict], run: str) -> float | None:
    pts = [(r["gpus"], r["cpu_s"]) for r in rows if r["run"] == run and r["cpu_s"] > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def exponent_line(exps: dict[str, float | None]) -> str:
    """Return the growth table's fitted-exponent line; a fit needs two or more sizes that ran."""
    fitted = ", ".join(f"{k} {v:.2f}" for k, v in exps.items() if v is not None)
    return "  fitted exponent of CPU seconds against GPUs: " + (fitted or "(needs two or more --sizes)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="256 GPUs only (seconds; used by the tests)")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end")
    ap.add_argument("--sizes", default=None, help="GPU counts of the growth table, comma-separated "
                                                  "(default 256,512,1024,2048,4096,8192)")
    ap.add_argument("--no-fig17", action="store_true", help="skip the Figure 17 sweep")
    ap.add_argument("--workers", type=int, default=None, help="processes of the Figure 17 sweep (default: CPUs)")
    args = ap.parse_args(argv)
    doc: dict = {"machine": f"{platform.machine()} {os.cpu_count()} cores", "quick": args.quick,
                 "date": time.strftime("%Y-%m-%d"), "sections": {}}

    head_gpus = 256 if args.quick else 2048
    print(f"1. one RL iteration of Qwen3-235B-A22B on {head_gpus} GPUs, RFabric, OrchestrRL scheduler "
          "(cold = new process incl. build; warm = the next iteration)")
    rows = iteration_rows(head_gpus)
    cold, warm = rows
    print(f"{'run':>5} {'wall s':>8} {'target s':>9} {'target/wall':>12} {'cpu s':>7} {'target/cpu':>11} {'load':>5}")
    for r, target in ((cold, TARGET_COLD_S), (warm, TARGET_WARM_S)):
        print(f"{r['run']:>5} {r['wall_s']:>8.2f} {target:>9.0f} {target / r['wall_s']:>12.2f} {r['cpu_s']:>7.2f} "
              f"{target / r['cpu_s']:>11.2f} {r['load1']:>5.2f}")
    print("  target/x > 1 meets the target. The machine is shared: with a load above its 2 cores the wall time "
          "stretches by about load/2; the CPU seconds are what an idle machine's wall time would be (one process).")
    doc["sections"]["iteration"] = {"gpus": head_gpus, "rows": rows, "target_cold_s": TARGET_COLD_S,
                                    "target_warm_s": TARGET_WARM_S}

    print("\n2. where the CPU time goes (seconds, innermost part running)")
    _print_rows(rows)

    if not args.quick:
        sizes = [int(s) for s in (args.sizes or "256,512,1024,2048,4096,8192").split(",")]
        print("\n3. growth with scale (half train, half generate; 16 responses per generation GPU)")
        growth, failed = [], {}
        for g in sizes:
            try:
                growth += rows if g == head_gpus else iteration_rows(g)
            except OrchestrlError as exc:  # a stage never finishes at this scale: report it, keep measuring
                failed[g] = f"{type(exc).__name__}: {exc}"
        _print_rows(growth)
        for g, why in failed.items():
            print(f"  {g} GPUs failed: {why}")
        exps = {run: _exponent(growth, run) for run in ("cold", "warm")}
        print(exponent_line(exps))
        doc["sections"]["growth"] = {"rows": growth, "cpu_exponent": exps, "failed": failed}

        if not args.no_fig17:
            from orchestrl.sim.experiments import fig17

            print(f"\n4. the full Figure 17 sweep (5 configurations, {args.workers or os.cpu_count()} workers)")
            load = _load()
            wall = time.perf_counter()
            fig_rows = fig17.run(quick=False, workers=args.workers)
            wall = time.perf_counter() - wall
            print(f"  {wall:.1f} s, target {TARGET_FIG17_S:.0f} s, target/measured {TARGET_FIG17_S / wall:.2f} "
                  f"(load {load:.2f})")
            doc["sections"]["fig17"] = {"wall_s": wall, "target_s": TARGET_FIG17_S, "load1": load,
                                        "rows": [{"label": r.label, "ours": r.ours} for r in fig_rows]}
    if args.json:
        print(json.dumps(doc, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else str(x)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
