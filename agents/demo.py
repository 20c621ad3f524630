"""``orchestrl demo``: the main job on the bundled example.

Plans the communication periods of RL iterations (train fwd/bwd, gradient sync, weight sync,
generation) on the 64-GPU example fabric and prints each period's plan. The first iteration fills
the template cache (Phase 1 of §5.3); the second reuses it and reports what changed on the devices.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agents.progress import Progress

__all__ = ["register", "run_demo", "EXAMPLES_DIR", "DEMO_PERIODS"]

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
# One RL iteration, in the order its communication periods occur.
DEMO_PERIODS = ("train-fwd-bwd.yaml", "train-grad-sync.yaml", "weight-sync.yaml", "gen.yaml")


def register(groups: argparse._SubParsersAction) -> None:
    demo = groups.add_parser("demo", help="plan RL iterations on the bundled 64-GPU example and print the plans")
    demo.add_argument("--examples", type=Path, default=EXAMPLES_DIR, metavar="DIR",
                      help="folder holding topology-64gpu-h800.yaml and intents/ (default: bundled examples)")
    demo.add_argument("--iterations", type=int, default=2, help="RL iterations to plan (default 2)")
    demo.set_defaults(func=lambda a: run_demo(a.examples, a.iterations))


def run_demo(examples: Path = EXAMPLES_DIR, iterations: int = 2) -> int:
    from fabric.controller import FabricController
    from fabric.intent import load_intent
    from fabric.plan import format_plan_summary
    from fabric.topology import load_topology

    topo = load_topology(examples / "topology-64gpu-h800.yaml")
    s = topo.summary()
    print(f"fabric {s['name']}: {s['gpus']} GPUs, {s['pods']} PoDs, {s['tors']} ToRs, "
          f"{s['ocs_agg_devices']} OCS-Agg + {s['ocs_core_devices']} OCS-Core ({s['agg_technology']}), "
          f"{s['link_gbps']:.0f} Gbps links")
    intents = [load_intent(examples / "intents" / name, topo) for name in DEMO_PERIODS]
    controller = FabricController(topo)
    progress = Progress(iterations * len(intents), "planning")
    for it in range(iterations):
        print(f"\n=== RL iteration {it + 1} ===")
        for intent in intents:
            with progress.step(f"iteration {it + 1} {intent.stage}/{intent.period}"):
                result = controller.materialize(intent)
                diff = controller.apply(result)
            head = (f"\n--- period {intent.period} (stage {intent.stage}): template {result.template}, "
                    f"cache {'hit' if result.cache_hit else 'miss (filled)'}, "
                    f"{'accepted' if result.accepted else 'REFUSED, previous plan kept'}, "
                    f"solve {result.solve_s * 1e3:.2f} ms")
            print(head)
            if diff is not None:
                print(f"    device changes vs. previous period: -{len(diff.remove)} +{len(diff.add)} cross-connects "
                      f"({len(diff.keep)} kept) on {len(diff.devices())} device(s)")
            if not result.accepted:
                for v in result.violations:
                    print(f"    violation: {v}")
            if it == 0 and result.candidate is not None:
                print(format_plan_summary(result.candidate, topo, max_rows=12))
    print(f"\ntemplate cache: {len(controller.cache)} entries, {controller.cache.hits} hits, "
          f"{controller.cache.misses} misses")
    return 0
