"""``orchestrl fabric ...``: the planning core as commands for operators and scripts."""

from __future__ import annotations

import argparse
import json
import sys

from orchestrl.fabric.errors import ConfigError

__all__ = ["register"]


def register(groups: argparse._SubParsersAction) -> None:
    fabric = groups.add_parser("fabric", help="plan OCS circuits (topology, allocation, plans, cost)",
                               description="Fabric planning core of RFabric (OrchestrRL §5, Appendix D).")
    sub = fabric.add_subparsers(dest="command", metavar="COMMAND", required=True)

    show = sub.add_parser("show", help="validate a topology file and print its component counts")
    show.add_argument("--topology", required=True, metavar="T.yaml", help="fabric description (see examples/)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=_show)

    alloc = sub.add_parser("allocate", help="run the Appendix D allocator on a JSON problem",
                           description="Read {link_bps, endpoints, demand, eligible?} and print the circuit "
                                       "multiplicities, per-pair times and unserved pairs as JSON.")
    alloc.add_argument("--input", required=True, metavar="FILE.json", help="problem document ('-' for stdin)")
    alloc.add_argument("--method", default="greedy", choices=("greedy", "greedy+ls", "uniform", "optimal"),
                       help="greedy (Alg. 3, default), greedy+ls (Alg. 3 plus a repair of which pairs are served "
                            "under port starvation), uniform baseline, or exact CP-SAT reference")
    alloc.add_argument("--time-limit", type=float, default=30.0, metavar="S",
                       help="CP-SAT time limit for --method optimal (default 30 s)")
    alloc.set_defaults(func=_allocate)

    plan = sub.add_parser("plan", help="materialise a circuit plan for one intent (Algorithm 2)")
    plan.add_argument("--topology", required=True, metavar="T.yaml", help="fabric description")
    plan.add_argument("--intent", required=True, metavar="I.yaml", help="intent of the communication period")
    plan.add_argument("--method", default="greedy", choices=("greedy", "uniform", "optimal"))
    plan.add_argument("--json", action="store_true", help="print the full plan as JSON")
    plan.set_defaults(func=_plan)

    cost = sub.add_parser("cost", help="print the network cost table (OrchestrRL §7.2.3, Table 4)")
    cost.add_argument("--gpus", type=int, default=2048, help="cluster size in GPUs (default 2048)")
    cost.add_argument("--link-gbps", type=int, nargs="+", default=[100, 200, 400, 800], metavar="G",
                      help="link speeds to price (Table 4 has 100 200 400 800)")
    cost.add_argument("--topology", metavar="T.yaml", help="price this RFabric topology instead of the default")
    cost.add_argument("--clos-tiers", type=int, default=1, choices=(1, 2, 3), metavar="N",
                      help="minimum fat-tree tiers of the electrical baselines (1 = fewest that reach the size; "
                           "3 = always three tiers like Al-Fares, see docs/cost-model.md)")
    cost.add_argument("--json", action="store_true")
    cost.set_defaults(func=_cost)


def _show(args: argparse.Namespace) -> int:
    from orchestrl.fabric.topology import load_topology

    topo = load_topology(args.topology)
    summary = topo.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        width = max(map(len, summary))
        for k, v in summary.items():
            print(f"{k:<{width}}  {v}")
    return 0


def _allocate(args: argparse.Namespace) -> int:
    from orchestrl.fabric.allocator import allocate, allocation_to_json, problem_from_json
    from orchestrl.fabric.config import json_without_duplicates

    source = "<stdin>" if args.input == "-" else args.input
    try:
        if args.input == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(args.input, "rb") as handle:
                raw = handle.read()
    except OSError as exc:
        raise ConfigError(source, "<file>", f"cannot be read: {exc.strerror}", "a readable JSON file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "<file>", f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                          "save the file as UTF-8") from None
    try:
        doc = json.loads(text, object_pairs_hook=json_without_duplicates)
    except ValueError as exc:
        raise ConfigError(source, "<file>", f"is not valid JSON: {exc}") from None
    problem = problem_from_json(doc, source)
    kwargs = {"time_limit_s": args.time_limit} if args.method == "optimal" else {}
    print(json.dumps(allocation_to_json(allocate(problem, args.method, **kwargs)), indent=2))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from orchestrl.fabric.controller import FabricState, materialize
    from orchestrl.fabric.intent import load_intent
    from orchestrl.fabric.plan import format_plan_summary, plan_to_json
    from orchestrl.fabric.templates import TemplateCache
    from orchestrl.fabric.topology import load_topology

    topo = load_topology(args.topology)
    intent = load_intent(args.intent, topo)
    result = materialize(intent, FabricState(topo), TemplateCache(), method=args.method)
    if args.json:
        doc = {"accepted": result.accepted, "violations": list(result.violations), "solve_s": result.solve_s,
               "plan": plan_to_json(result.candidate) if result.candidate else None}
        print(json.dumps(doc, indent=2))
    else:
        print(format_plan_summary(result.candidate, topo))
        print(f"  solve time {result.solve_s * 1e3:.2f} ms; "
              f"{'accepted' if result.accepted else 'REFUSED: ' + '; '.join(result.violations)}")
    return 0 if result.accepted else 1


def _cost(args: argparse.Namespace) -> int:
    from orchestrl.fabric.cost import cost_table, format_cost_table

    spec = None
    if args.topology:
        from orchestrl.fabric.topology import load_topology

        spec = load_topology(args.topology).spec
    rows = cost_table(args.gpus, tuple(args.link_gbps), rfabric_spec=spec, min_clos_tiers=args.clos_tiers)
    if args.json:
        import dataclasses

        print(json.dumps([{**dataclasses.asdict(r), "network_usd": r.network_usd} for r in rows], indent=2))
    else:
        print(format_cost_table(rows))
    return 0
