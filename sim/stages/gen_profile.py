"""Where a generation stage spends host CPU: engine, snapshots, balancer, planner, reconfiguration, fabric.

Run ``python -m orchestrl.sim.stages.gen_profile --gpus 256,512,1024,1400`` (options: ``--help``). Each size
runs the stage twice on a trace scaled to the GPU count -- cold (fresh caches), then warm (a new
trace on the same stage, as the next RL iteration) -- and attributes CPU seconds exclusively to
the innermost of the functions below that was running (a planner call that times the fabric counts
as fabric). Not a benchmark: no targets; ``bench/sim_rl.py`` owns those.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import Counter
from typing import Any, Iterator, Sequence

import orchestrl.compute_sched.scheduler as scheduler
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.sim.network import NetworkSim, RFabricDriver
from orchestrl.sim.stages.gen_network import FabricSeam
from orchestrl.sim.stages.generation import POLICIES, GenerationStage

__all__ = ["attributing", "profile_generation", "main"]

_PARTS = ((scheduler, "plan_layout", "planner"), (scheduler, "plan_migrations", "balancer"),
          (SimEngine, "advance", "engine"), (SimEngine, "snapshot", "snapshot"),
          (SimEngine, "change_layout", "reconfig"), (SimEngine, "migrate", "reconfig"),
          (FabricSeam, "deploy", "fabric"), (FabricSeam, "transfer_times_s", "fabric"),
          (FabricSeam, "_estimate", "fabric"))


@contextlib.contextmanager
def attributing(acc: Counter, parts: Sequence[tuple[Any, str, str]] | None = None) -> Iterator[None]:
    """Wrap ``(owner, attribute, label)`` functions (default ``_PARTS``) so CPU time goes to the innermost
    one running, accumulated per label in ``acc``; restore them after. Owners lacking the attribute are
    skipped."""
    parts = [p for p in (_PARTS if parts is None else parts) if hasattr(p[0], p[1])]
    stack: list[str] = []
    mark = [time.process_time()]

    def wrap(f, label):
        def timed(*args, **kwargs):
            now = time.process_time()
            if stack:
                acc[stack[-1]] += now - mark[0]
            stack.append(label)
            mark[0] = now
            try:
                return f(*args, **kwargs)
            finally:
                now = time.process_time()
                acc[stack.pop()] += now - mark[0]
                mark[0] = now
        return timed

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in parts]
    try:
        for (owner, name, label), (_, _, f) in zip(parts, saved):
            setattr(owner, name, wrap(f, label))
        yield
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)


def profile_generation(gpus: int, *, fabric: str = "ft-os", model: str = "Qwen3-235B-A22B", per_gpu: float = 16.0,
                       policy: str = "orchestrl", instance: str | None = None, slice_gpus: int | None = None,
                       fabric_gpus: int = 2048, max_tokens: int = 15360, seed: int = 3) -> list[dict]:
    """Run the stage cold and warm on ``gpus`` generation GPUs; return one row per run.

    The generation GPUs are 30 of every 32 servers of the fabric (whole RFabric PoDs hold six AFD
    instances of 5 servers), as many as ``gpus`` needs.
    """
    servers = [s for p in range(fabric_gpus // 256) for s in range(32 * p, 32 * p + 30)][:gpus // 8]
    if len(servers) * 8 != gpus:
        raise ValueError(f"{gpus} generation GPUs do not fit a {fabric_gpus}-GPU fabric at 30 servers per PoD")
    net = NetworkSim(fabric, gpus=fabric_gpus, circuits="fixed" if fabric == "rfabric" else "per-pattern")
    driver = RFabricDriver(net.fabric) if fabric == "rfabric" else None
    extra = {"switch_to": "tp8", "max_num_seqs": 1536} if policy == "two-phase" else {}
    stage = GenerationStage(load_model(model), [s * 8 + r for s in servers for r in range(8)], load_gpu("H800"), net,
                            driver, policy=policy, instance=instance, slice_gpus=slice_gpus, **extra)
    rows, now = [], 0.0
    for run, trace_seed in (("cold", seed), ("warm", seed + 1)):
        trace = heavy_tailed_trace(max(1, int(gpus * per_gpu / 8)), 8, max_tokens, seed=trace_seed)
        acc: Counter = Counter()
        wall, cpu = time.perf_counter(), time.process_time()
        with attributing(acc):
            res = stage.run(trace, now_s=now)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        now += res.time_s + 1.0
        parts = {k: round(v, 3) for k, v in sorted(acc.items())}
        rows.append({"gpus": gpus, "requests": len(trace.requests), "fabric": fabric, "policy": policy,
                     "slice_gpus": slice_gpus, "run": run, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                     "step_s": round(res.time_s, 2), "parts_cpu_s": parts,
                     "other_cpu_s": round(cpu - sum(acc.values()), 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrl.sim.stages.gen_profile", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="256,512,1024,1400", help="generation GPU counts, comma-separated")
    ap.add_argument("--fabric", default="ft-os", help="fabric name (ft, ft-os, ro, topoopt, mixnet, rfabric)")
    ap.add_argument("--model", default="Qwen3-235B-A22B", help="bundled model name or YAML file")
    ap.add_argument("--per-gpu", type=float, default=16.0, help="responses per generation GPU")
    ap.add_argument("--policy", default="orchestrl", choices=POLICIES, help="scheduling policy")
    ap.add_argument("--instance", default=None, help="instance configuration (e.g. afd24:16-tp8)")
    ap.add_argument("--slice", type=int, default=None, help="simulate this many GPUs as one of identical copies")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = [r for g in args.gpus.split(",") for r in profile_generation(
        int(g), fabric=args.fabric, model=args.model, per_gpu=args.per_gpu, policy=args.policy,
        instance=args.instance, slice_gpus=args.slice)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    parts = sorted({k for r in rows for k in r["parts_cpu_s"]})
    head = ["gpus", "requests", "run", "step_s", "wall_s", "cpu_s", *parts, "other"]
    print(" ".join(f"{h:>9}" for h in head))
    for r in rows:
        vals = [r["gpus"], r["requests"], r["run"], r["step_s"], r["wall_s"], r["cpu_s"],
                *(r["parts_cpu_s"].get(p, 0.0) for p in parts), r["other_cpu_s"]]
        print(" ".join(f"{v:>9}" for v in vals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
