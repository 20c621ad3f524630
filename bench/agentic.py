"""Benchmark RollArt's runtime: trajectory- vs batch-level rollout, redundancy, accounting, routing at 10,000.

Run from the repository root::

    python bench/agentic.py            # the full run (about three minutes)
    python bench/agentic.py --quick    # smaller counts (under a minute)
    python bench/agentic.py --json     # also print one JSON document at the end

Measured in one run, each against its baseline in the same run:

* ``trajectory_vs_batch_speedup`` (real time): FrozenLake-v1 through the text wrapper, Qwen3-8B on two
  simulated H800 workers, environment latency injected lognormal with p99 = 10.3x the median; the same
  trajectories run trajectory-level (each at its own pace) and batch-level (veRL: a barrier after every
  reset, generation and step of the batch); trajectories per second, ours over the batch's;
* ``redundancy_p99_cut`` (virtual time, the same runtime on RLSim's clock): 10% of environments fail
  (5% of their ``reset`` and ``step`` calls raise or hang until the 300 s timeout), ``reset`` latency
  lognormal with a median of 10 s and a p99 of 160 s (tails of hundreds of seconds, RollArt §3.1);
  p99 of the step time (4 GRPO groups of 8) with 25% redundancy against none over 100 steps (30
  with ``--quick``): ``1 - p99(25%) / p99(0%)``;
* ``lost_trajectories``: started minus (buffered + aborted + discarded) over every run here (the ledger
  raises if it is not 0); ``bound_violations``: trained trajectories older than the bound;
* ``concurrent_trajectories`` and ``routing_p99_ms`` (real time): that many trajectories at once through
  the proxy over 32 simulated workers, the p99 of the routing decision, beside the engine's step time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrl.agents.agentic.envs import LatencySpec  # noqa: E402
from orchestrl.agents.agentic.proxy import LLMProxy  # noqa: E402
from orchestrl.agents.agentic.reward import LocalRewardClient  # noqa: E402
from orchestrl.agents.agentic.runtime import RolloutRuntime, TaskSpec  # noqa: E402
from orchestrl.agents.agentic.worker import sim_worker  # noqa: E402
from orchestrl.compute_sched.agentic.routing import HwMapping  # noqa: E402
from orchestrl.sim.agentic.clock import run_virtual  # noqa: E402

LOST = {"lost": 0, "bound_violations": 0}


def _runtime(workers: int, task: TaskSpec, group_size: int, redundancy: float = 0.0, bound: int = 1,
             max_batch: int = 256, seed: int = 0) -> tuple[RolloutRuntime, LLMProxy]:
    ws = [sim_worker(f"h800-{i}", "h800", "H800", "Qwen3-8B", 1, max_batch) for i in range(workers)]
    proxy = LLMProxy(ws, HwMapping({}, ("h800",)))
    return RolloutRuntime(proxy, LocalRewardClient(), [task], group_size=group_size, redundancy=redundancy,
                          bound=bound, seed=seed, max_replacements=64), proxy


def _account(rt: RolloutRuntime) -> dict:
    led = rt.ledger.check()
    LOST["lost"] += led["started"] - sum(v for k, v in led.items() if k in ("buffered", "aborted", "discarded"))
    LOST["bound_violations"] += sum(n for gap, n in rt.metrics.staleness.items() if gap > rt.buffer.bound)
    return led


async def _trajectory_vs_batch(n: int, median_s: float) -> dict:
    task = TaskSpec("frozenlake", "FrozenLake-v1", "frozenlake", max_turns=8, reply_median_tokens=32,
                    latency=LatencySpec(median_s, median_s, 1.0, 0.0, seed=3))
    out = {}
    for mode in ("trajectory", "batch"):
        rt, proxy = _runtime(2, task, n, seed=11)
        proxy.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await (rt.group("g", task, put=False) if mode == "trajectory" else rt.batched_group("g", task))
        out[mode] = len(got) / (loop.time() - t0)
        out[f"{mode}_s"] = loop.time() - t0
        await proxy.stop()
        _account(rt)
    out["speedup"] = out["trajectory"] / out["batch"]
    return out


async def _redundancy(steps: int, groups: int, redundancy: float) -> list[float]:
    task = TaskSpec("math", "orchestrl/MathSingleTurn-v0", "math", max_turns=1, reply_median_tokens=400,
                    latency=LatencySpec(reset_median_s=10.0, step_median_s=2.0, sigma=1.2, failure_rate=0.05,
                                        failure_modes=("raise", "hang"), seed=5),
                    reset_timeout_s=300.0, step_timeout_s=300.0)
    rt, proxy = _runtime(4, task, 8, redundancy, seed=17)
    proxy.start()
    loop = asyncio.get_running_loop()
    times = []
    for s in range(steps):
        t0 = loop.time()
        await asyncio.gather(*(rt.group(f"s{s}g{g}", task, put=False) for g in range(groups)))
        times.append(loop.time() - t0)
    await proxy.stop()
    _account(rt)
    return times


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


async def _concurrency(n: int) -> dict:
    task = TaskSpec("frozenlake", "FrozenLake-v1", "frozenlake", max_turns=4, reply_median_tokens=16,
                    latency=LatencySpec(0.05, 0.02, 1.0, 0.0, seed=9))
    rt, proxy = _runtime(32, task, n, max_batch=512, seed=23)
    proxy.start()
    t0 = time.perf_counter()
    got = await rt.group("big", task, put=False)
    wall = time.perf_counter() - t0
    await proxy.stop()
    _account(rt)
    w = proxy.workers[0]
    step_ms = 1e3 * w.engine.perf.decode_step_s(w.engine.layout.instances[0].config, 256, 256 * 600)
    return {"concurrent": rt.concurrent_peak, "finished": len(got), "routing_p99_ms": proxy.routing_p99_ms(),
            "engine_step_ms": step_ms, "wall_s": wall}


def _bounded_training(quick: bool) -> dict:
    """The example run file's asynchronous loop (bound 1) on the virtual clock: what it trained on, how stale."""
    import dataclasses

    from orchestrl.agents.agentic.config import load_run
    from orchestrl.agents.agentic.session import build

    cfg = load_run(Path(__file__).resolve().parents[1] / "examples" / "agentic" / "frozenlake-math.yaml")
    cfg = dataclasses.replace(cfg, iterations=4 if quick else 12)

    async def go() -> dict:
        rt, proxy = build(cfg)
        proxy.start()
        out = await rt.train(cfg.iterations, cfg.batch_groups, cfg.train_step_s)
        rt.weights.close()
        await proxy.stop()
        _account(rt)
        return out
    return run_virtual(go())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts (under a minute)")
    ap.add_argument("--json", action="store_true", help="also print one JSON document at the end")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tb = asyncio.run(_trajectory_vs_batch(32 if args.quick else 64, 0.05 if args.quick else 0.1))
    print(f"trajectory-level {tb['trajectory']:.2f} traj/s ({tb['trajectory_s']:.1f} s) vs batch-level "
          f"{tb['batch']:.2f} traj/s ({tb['batch_s']:.1f} s): {tb['speedup']:.2f}x (target >= 1.5)", flush=True)
    steps = 30 if args.quick else 100
    none = run_virtual(_redundancy(steps, 4, 0.0))
    red = run_virtual(_redundancy(steps, 4, 0.25))
    cut = 1 - _p99(red) / _p99(none)
    print(f"step time p99 with 10% of environments failing: no redundancy {_p99(none):.0f} s, 25% {_p99(red):.0f} s "
          f"(median {statistics.median(none):.0f} / {statistics.median(red):.0f} s): cut {cut:.0%} (target >= 30%)",
          flush=True)
    conc = asyncio.run(_concurrency(2000 if args.quick else 10_000))
    print(f"{conc['concurrent']} trajectories at once ({conc['finished']} finished, {conc['wall_s']:.1f} s): routing p99 "
          f"{conc['routing_p99_ms']:.3f} ms against an engine step of {conc['engine_step_ms']:.1f} ms (target <= 1 ms)",
          flush=True)
    trained = _bounded_training(args.quick)
    print(f"asynchronous training (bound 1, virtual time): {trained['trained']} trajectories trained, staleness "
          f"{trained['staleness']}", flush=True)
    print(f"lost trajectories {LOST['lost']}, bound violations {LOST['bound_violations']}; "
          f"{time.perf_counter() - t0:.0f} s")
    doc = {"trajectory_vs_batch_speedup": tb["speedup"], "redundancy_p99_cut": cut, "lost_trajectories": LOST["lost"],
           "bound_violations": LOST["bound_violations"], "routing_p99_ms": conc["routing_p99_ms"],
           "concurrent_trajectories": conc["concurrent"], "engine_step_ms": conc["engine_step_ms"],
           "step_p99_s": {"none": _p99(none), "redundancy_25": _p99(red)}, "wall_s": time.perf_counter() - t0,
           "machine": "x86_64 2 cores"}
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
