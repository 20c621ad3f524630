"""``orchestrl agentic ...``: RollArt's agentic rollout runtime (docs/agentic.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

__all__ = ["register"]


def register(groups: argparse._SubParsersAction) -> None:
    ag = groups.add_parser("agentic", help="run agentic RL rollouts (RollArt runtime)",
                           description="Trajectory-level rollouts of multi-turn environments through an LLM proxy "
                                       "over generation pools (docs/agentic.md).")
    sub = ag.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run a run file's iterations and print what happened",
                         description="Run CONFIG.yaml (see examples/agentic/frozenlake-math.yaml): environment "
                                     "managers, the LLM proxy on simulated engines, rewards, the asynchronous bound.")
    run.add_argument("config", metavar="CONFIG.yaml")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from orchestrl.agents.agentic.config import load_run
    from orchestrl.agents.agentic.session import run_config

    cfg = load_run(args.config)
    progress = (lambda msg: sys.stderr.write(f"[agentic] {msg}\n")) if not args.json or sys.stderr.isatty() else None
    out = asyncio.run(run_config(cfg, progress))
    if args.json:
        print(json.dumps(out, default=str))
        return 0
    led = out["ledger"]
    print(f"{cfg.iterations} iterations in {out['wall_s']:.1f} s: {out['trained']} trajectories trained; "
          f"{led['started']} started = {led.get('buffered', 0)} buffered + {led.get('aborted', 0)} aborted + "
          f"{led.get('discarded', 0)} discarded")
    print(f"  aborted by reason: {led.get('reasons', {})}; env failures {out['env_failures']}, replacements "
          f"{out['replacements']}")
    print(f"  staleness (versions behind -> trajectories): {out['staleness']}; routing p99 {out['routing_p99_ms']:.3f} ms;"
          f" idle s by pool {({k: round(v, 1) for k, v in out['idle_s_by_pool'].items()})}")
    return 0
