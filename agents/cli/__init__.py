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


# Which module registers each group. ``main`` imports only the one a command names: the simulator's
# and the group scheduler's modules pull in SciPy and networkx (about a second of CPU), which an
# ``ocs emulate`` or ``proxy serve`` process never uses and would pay at every start.
_GROUP_MODULES = {
    "fabric": "orchestrl.agents.cli.cmd_fabric",
    "ocs": "orchestrl.agents.cli.cmd_ocs",
    "proxy": "orchestrl.agents.cli.cmd_proxy",
    "sched": "orchestrl.agents.cli.cmd_sched",
    "groups": "orchestrl.agents.cli.cmd_groups",
    "sim": "orchestrl.agents.cli.cmd_sim",
    "agentic": "orchestrl.agents.cli.cmd_agentic",
    "demo": "orchestrl.agents.demo",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the ``orchestrl`` parser; with ``only`` (a group name) just that group is registered."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="orchestrl",
        description="Control plane and comms library for disaggregated RL on hybrid EPS/OCS fabrics.",
    )
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    for name, module in _GROUP_MODULES.items():
        if only is None or name == only:
            importlib.import_module(module).register(groups)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in _GROUP_MODULES else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OrchestrlError as exc:
        print(f"orchestrl: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `orchestrl ... | head`
        return 0

