"""The ``orchestrl`` command: one subcommand group per area, ``--help`` at every level.

Each area registers its subcommands from its own module (``agents/cli/cmd_fabric.py``, ...), so this
file only wires groups together and turns orchestrl's own errors into one-line messages with exit
status 2 (bad input) instead of tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from orchestrl.agents import demo
    from orchestrl.agents.cli import cmd_agentic, cmd_fabric, cmd_groups, cmd_ocs, cmd_proxy, cmd_sched, cmd_sim

    parser = argparse.ArgumentParser(
        prog="orchestrl",
        description="Control plane and comms library for disaggregated RL on hybrid EPS/OCS fabrics.",
    )
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    cmd_fabric.register(groups)
    cmd_ocs.register(groups)
    cmd_proxy.register(groups)
    cmd_sched.register(groups)
    cmd_groups.register(groups)
    cmd_sim.register(groups)
    cmd_agentic.register(groups)
    demo.register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OrchestrlError as exc:
        print(f"orchestrl: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `orchestrl ... | head`
        return 0

