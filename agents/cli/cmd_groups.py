"""``orchestrl groups ...``: the multi-job co-execution group scheduler (RollMux) from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json

from orchestrl.fabric.errors import ConfigError

__all__ = ["register"]


def _slo(text: str) -> float | str:
    if text == "uniform":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'uniform' nor a number") from None
    if value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is below 1 (an SLO is a tolerated slowdown)")
    return value


def register(groups: argparse._SubParsersAction) -> None:
    from orchestrl.compute_sched.groups.scenario import PHASE_MODELS, POLICY_NAMES
    from orchestrl.compute_sched.groups.workload import WORKLOADS

    grp = groups.add_parser("groups", help="multi-job co-execution groups (RollMux): replay a trace",
                            description="RollMux inter-group placement (Alg. 1), round-robin intra-group schedule "
                                        "and baselines, replayed over a synthetic §7.5-shaped trace.")
    sub = grp.add_subparsers(dest="command", metavar="COMMAND", required=True)
    rp = sub.add_parser("replay", help="replay a synthetic job trace under one placement policy",
                        description="Print provisioning cost, realised SLO attainment (with every missed job and "
                                    "why), rollout/training bubble fractions and peak GPUs of one policy on a "
                                    "synthetic trace.")
    rp.add_argument("--workload", default="mixed", choices=WORKLOADS, help="Table 6 profile (default mixed)")
    rp.add_argument("--jobs", type=int, default=100, metavar="N", help="jobs in the trace (default 100)")
    rp.add_argument("--seed", type=int, default=0, metavar="S", help="random seed of the trace (default 0)")
    rp.add_argument("--policy", default="rollmux", choices=POLICY_NAMES,
                    help="placement policy (default rollmux; rollmux-paper: Algorithm 1 with the worst-case SLO "
                         "check alone; optimal needs <= 10 concurrent jobs)")
    rp.add_argument("--slo", type=_slo, default="uniform", metavar="uniform|X",
                    help="per-job slowdown tolerance: 'uniform' draws Unif(1, 2) (default), or a fixed X >= 1")
    rp.add_argument("--max-group-size", type=int, default=5, metavar="K", help="residency cap (default 5)")
    rp.add_argument("--arrival-scale", type=float, default=1.0, metavar="X",
                    help="multiply inter-arrival gaps (< 1 means more concurrent jobs; default 1)")
    rp.add_argument("--affinity", action="store_true",
                    help="allow H800 rollout nodes (RollArt hardware affinity); half the multi-turn jobs prefill-heavy")
    rp.add_argument("--rollout-topology", metavar="T.yaml", help="fabric of the rollout cluster (PoD-aware placement)")
    rp.add_argument("--train-topology", metavar="T.yaml", help="fabric of the training cluster")
    rp.add_argument("--fabric-unaware", action="store_true", help="take the lowest free servers, ignoring PoDs")
    rp.add_argument("--prune", default="paper", choices=("paper", "train"),
                    help="saturated groups Algorithm 1 skips: T_load >= T_cycle (paper) or a full training pool")
    rp.add_argument("--phases", default="stochastic", choices=PHASE_MODELS,
                    help="stochastic: heavy-tailed realised phases under Table 6's worst case (default); "
                         "deterministic: every phase at its Table 6 time, as RollMux §7.5 simulates")
    rp.add_argument("--gantt", action="store_true", help="draw the schedule of the largest group (Figure 10)")
    rp.add_argument("--json", action="store_true", help="print JSON instead of text")
    rp.add_argument("--per-job", action="store_true", help="with --json, include every job's outcome")
    rp.add_argument("--misses", type=int, default=10, metavar="N",
                    help="SLO misses to list in the text summary (default 10; --json lists all)")
    rp.set_defaults(func=_replay)

    sv = sub.add_parser("serve", help="run the phase scheduler (run permits) for one co-execution group",
                        description="Serve run permits over HTTP to the jobs of one group (agents/phase.py): "
                                    "round-robin per resource, permits expire after --permit-timeout.")
    sv.add_argument("--job", action="append", required=True, metavar="NAME:NODES",
                    help="a member in round-robin order and its rollout node ids, e.g. a:0 or b:0,1 (repeat)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=0, help="port (default: any free port, printed)")
    sv.add_argument("--permit-timeout", type=float, default=600.0, metavar="S",
                    help="a phase that runs longer loses its permit and its job is failed (default 600 s)")
    sv.add_argument("--turn-timeout", type=float, metavar="S",
                    help="a job absent on its turn this long is failed (default: the permit timeout)")
    sv.add_argument("--tail-threshold", type=float, default=0.8, metavar="F",
                    help="rollout progress at which long-tail migration frees the nodes (default 0.8)")
    sv.set_defaults(func=_serve)


def _replay(args: argparse.Namespace) -> int:
    from orchestrl.compute_sched.groups.scenario import ReplaySetup, gantt_text, run_replay

    if args.jobs < 1:
        raise ConfigError("command line", "--jobs", f"{args.jobs} is below 1", ">= 1")
    if args.max_group_size < 1:
        raise ConfigError("command line", "--max-group-size", f"{args.max_group_size} is below 1", ">= 1")
    if not args.arrival_scale > 0:
        raise ConfigError("command line", "--arrival-scale", f"{args.arrival_scale} is not positive", "> 0")
    setup = ReplaySetup(workload=args.workload, jobs=args.jobs, seed=args.seed, policy=args.policy, slo=args.slo,
                        max_group_size=args.max_group_size, affinity=args.affinity, arrival_scale=args.arrival_scale,
                        rollout_topology=args.rollout_topology, train_topology=args.train_topology,
                        fabric_aware=not args.fabric_unaware, prune_saturated=args.prune,
                        phases=args.phases)
    result = run_replay(setup)
    if args.json:
        doc = result.to_json(with_jobs=args.per_job)
        if args.gantt:
            doc["gantt"] = gantt_text(result, setup)
        print(json.dumps(doc, indent=2))
        return 0
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    rows = [
        ("policy", result.policy),
        ("jobs (rejected)", f"{result.jobs} ({result.rejected})"),
        ("horizon", f"{result.horizon_h:.1f} h"),
        ("provisioning cost", f"${result.cost_usd_total:,.0f} total, ${result.cost_usd_per_h:,.1f}/h average, "
                              f"${result.peak_cost_usd_per_h:,.1f}/h peak"),
        ("SLO attainment", f"{pct(result.slo_attainment)} realised ({len(result.slo_misses)} of {result.jobs} jobs "
                           f"slowed beyond their SLO against their realised solo run; mean slowdown "
                           f"{result.mean_slowdown:.2f}x)"),
        ("  planned", f"{pct(result.slo_attainment_planned)} (§4.2's worst-case check; RollMux admission enforces it, "
                      f"so for RollMux it cannot fail)"),
        ("rollout bubbles", pct(result.rollout_bubble)),
        ("training bubbles", pct(result.train_bubble)),
        ("peak GPUs", f"{result.peak_gpus_rollout} rollout, {result.peak_gpus_train} training"),
        ("placements", ", ".join(f"{k} {v}" for k, v in result.strategies.items())),
        ("decision latency", f"{result.decision_ms_p50:.2f} ms median, {result.decision_ms_max:.2f} ms max"),
    ]
    if args.rollout_topology or args.train_topology:
        rows.append(("cross-PoD traffic", f"{result.cross_pod_tb:,.1f} TB; rollout spans "
                                          f"{result.mean_rollout_pods:.2f} PoDs per job on average"))
    shown = result.slo_misses[: max(0, args.misses)]
    for i, miss in enumerate(shown):
        rows.append(("SLO misses" if i == 0 else "", miss.describe()))
    if len(result.slo_misses) > len(shown):
        rows.append(("" if shown else "SLO misses", f"... and {len(result.slo_misses) - len(shown)} more (--json lists "
                                                    f"all, or --misses N)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.gantt:
        print()
        print(gantt_text(result, setup))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from orchestrl.agents.phase import PhaseServer

    order, placement = [], {}
    for item in args.job:
        name, _, nodes = item.partition(":")
        try:
            placement[name] = [int(n) for n in nodes.split(",") if n != ""]
        except ValueError:
            raise ConfigError("command line", "--job", f"{item!r} has a non-integer node id", "NAME:0 or NAME:0,1")
        if not name or not placement[name]:
            raise ConfigError("command line", "--job", f"{item!r}", "NAME:NODES, e.g. a:0 or b:0,1")
        order.append(name)
    server = PhaseServer(order, placement, permit_timeout_s=args.permit_timeout, turn_timeout_s=args.turn_timeout,
                         tail_threshold=args.tail_threshold, host=args.host, port=args.port).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"phase scheduler for {', '.join(order)} listening on {server.url}", flush=True)
    try:
        # Serve until SIGTERM sets ``done`` or Ctrl-C raises KeyboardInterrupt here (the normal way to
        # stop: shut down like SIGTERM, no traceback). The timed wait wakes every second so the main
        # thread can take Ctrl-C on every platform (an untimed wait is not interruptible on Windows).
        with contextlib.suppress(KeyboardInterrupt):
            while not done.wait(timeout=1.0):
                continue
    finally:
        server.stop()
        print(json.dumps(server.state()), file=sys.stderr)
    return 0
