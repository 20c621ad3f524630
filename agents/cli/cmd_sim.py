"""``orchestrl sim ...``: the network simulator of RLSim as commands (``sim net``, ``sim collective``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from orchestrl.fabric.errors import ConfigError

__all__ = ["register", "Ticker"]

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p", "m2n")


class Ticker:
    """Progress on stderr for anything that runs over a second: phases, then event-loop progress."""

    def __init__(self, stream=None, after_s: float | None = None, every_s: float = 0.5) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        if after_s is None:  # the environment may lower the 1 s threshold (the tests do)
            after_s = float(os.environ.get("ORCHESTRL_PROGRESS_AFTER_S", "1.0"))
        self.after_s, self.every_s = after_s, every_s
        self.last = -1.0
        self.phase = ""

    def _due(self) -> bool:
        now = time.perf_counter() - self.t0
        if now < self.after_s or now - self.last < self.every_s:
            return False
        self.last = now
        return True

    def step(self, phase: str) -> None:
        if self.phase and time.perf_counter() - self.t0 >= self.after_s:
            self.stream.write(f"[sim {time.perf_counter() - self.t0:6.1f} s] {self.phase} done\n")
        self.phase = phase

    def events(self, t_s: float, finished: int, total: int) -> None:
        if self._due():
            self.stream.write(f"[sim {time.perf_counter() - self.t0:6.1f} s] {self.phase}: simulated "
                              f"{t_s * 1e3:.3f} ms, {finished}/{total} flows finished\n")
            self.stream.flush()


def register(groups: argparse._SubParsersAction) -> None:
    from orchestrl.sim.network.config import FABRICS

    sim = groups.add_parser("sim", help="simulate networks at cluster scale (RLSim network model)",
                            description="Flow-level simulation of the six fabrics of OrchestrRL §7.2 "
                                        "(see docs/sim.md).")
    sub = sim.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--fabric", required=True, choices=FABRICS, help="fabric to simulate")
        p.add_argument("--gpus", required=True, type=int, metavar="N", help="GPUs (servers of 8, one NIC per GPU)")
        p.add_argument("--gbps", type=float, default=200.0, metavar="B", help="link speed in Gb/s (default 200)")
        p.add_argument("--ecmp", choices=("fluid", "hash"), default="fluid",
                       help="ECMP as a fluid split over equal-cost paths (default) or one hashed path per flow")
        p.add_argument("--topology", metavar="T.yaml", help="rfabric only: topology file (default: the cost "
                                                            "model's RFabric for --gpus)")
        p.add_argument("--method", default="greedy", choices=("greedy", "greedy+ls", "uniform"),
                       help="rfabric only: circuit allocation of the controller (default greedy, Algorithm 3)")
        p.add_argument("--json", action="store_true", help="print a JSON document instead of one line")
        p.add_argument("--switch-radix", type=int, default=64, metavar="K",
                       help="ports of every EPS switch (Clos fabrics, RFabric's ToRs; default 64)")
        p.add_argument("--oversubscription", type=int, default=3, metavar="R",
                       help="ft-os only: leaf down:up ratio R:1 (default 3)")
        p.add_argument("--mtu", type=int, default=9216, metavar="BYTES",
                       help="packet size: one MTU of store-and-forward per hop (default 9216, §7.2)")
        p.add_argument("--same-server", choices=("nvlink", "network"), default="nvlink",
                       help="how a flow between two GPUs of one server travels: over NVLink (a DGX; default) or "
                            "out of its NIC and back (one NIC per host, as packet simulators model hosts)")


    net = sub.add_parser("net", help="run a flow file on a fabric to completion",
                         description='FILE is {"flows": [{"src": gpu, "dst": gpu, "bytes": int, "start_s": '
                                     'float}]}; GPU g is NIC g %% 8 of server g // 8.')
    common(net)
    net.add_argument("--flows", required=True, metavar="FILE.json", help="flow file")
    net.add_argument("--engine", choices=("fluid", "htsim"), default="fluid",
                     help="fluid: the flow-level simulator (default); htsim: write the case for the packet-level "
                          "htsim, run it and read its completions back beside the fluid ones (ft/ft-os only; "
                          "needs an htsim binary, docs/sim.md)")
    net.add_argument("--htsim", metavar="PATH", help="htsim_ndp binary (default: $ORCHESTRL_HTSIM, or on the PATH)")
    net.set_defaults(func=_net)

    col = sub.add_parser("collective", help="time one collective and report NCCL-tests bus bandwidth",
                         description="Groups of --group-size GPUs (consecutive, or --stride apart) all run the "
                                     "primitive at once; m2n sends from each group's first half to its second.")
    common(col)
    col.add_argument("--primitive", required=True, choices=_COLLECTIVES)
    col.add_argument("--group-size", required=True, type=int, metavar="G")
    col.add_argument("--bytes-per-rank", required=True, type=float, metavar="X",
                     help="bytes per rank, as nccl-tests' size (all-gather: the gathered buffer)")
    col.add_argument("--stride", type=int, default=1, metavar="S", help="group members S GPUs apart (default 1)")
    col.add_argument("--algorithm", choices=("ring", "tree"), default="ring", help="all-reduce algorithm")
    col.set_defaults(func=_collective)

    fig = sub.add_parser("figure", help="run a paper experiment: paper value, ours and their ratio",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Run one experiment of the OrchestrRL paper: the paper's number, ours and "
                                     "their ratio.\n\n"
                                     + "\n".join(f"  {name}  {what}" for name, (_, what) in _FIGURES.items())
                                     + "\n\nSweeps take --workers/--ray and write NAME.png and NAME.csv into "
                                       "--out; the folder is checked\n(created if missing) before the sweep "
                                       "starts, and --ray HOST:PORT is probed first.")
    fig.add_argument("name", choices=tuple(_FIGURES), help="experiment (see the list above)")
    fig.add_argument("--quick", action="store_true", help="reduced run (under a minute)")
    fig.add_argument("--json", action="store_true",
                     help='print {"figure", "rows": [{"label", "paper", "ours", "ratio", ...}], "notes"}')
    fig.add_argument("--workers", type=int, metavar="N", help="sweeps: processes of the local pool (default: CPUs)")
    fig.add_argument("--ray", metavar="ADDRESS", help="sweeps: run the cases on the Ray cluster at HOST:PORT "
                                                      "('local' starts one here; needs orchestrl[ray])")
    fig.add_argument("--out", metavar="DIR", help="sweeps: folder for NAME.png and NAME.csv (default: .)")
    fig.add_argument("--seeds", type=int, metavar="N", help="sweeps: trace seeds per case, each row the mean with a "
                                                            "95%% interval (default 3; --quick 1)")
    fig.set_defaults(func=_figure)

    from orchestrl.agents.cli import cmd_sim_run  # `sim run` (issue 16) lives in its own module
    cmd_sim_run.register(sub)
    from orchestrl.agents.cli import cmd_sim_jigsaw  # `sim jigsaw` (issue 33): a pair of pipelines on shared GPUs
    cmd_sim_jigsaw.register(sub)


#: name -> (module, one line on what it shows); "(sweep)": takes --workers, --ray and --out
_FIGURES = {
    "fig13": ("orchestrl.sim.experiments.fig13", "§7.2.1: end-to-end RL throughput on the six fabrics, relative to FT (sweep)"),
    "fig14": ("orchestrl.sim.experiments.fig14", "§7.2.2: per-stage time of 57B MoE on the six fabrics, relative to FT (sweep)"),
    "fig16": ("orchestrl.sim.experiments.fig16", "§7.2.4: performance vs network cost at 100-800 Gb/s, Pareto frontier "
                                       "(sweep)"),
    "fig17": ("orchestrl.sim.experiments.fig17", "§7.3.1: 2x2 co-design ablation, scheduler x fabric, Qwen3-235B (sweep)"),
    "fig18": ("orchestrl.sim.experiments.fig18", "§7.3.2: a Gen step switching AFD -> TP layout, RFabric vs FT-OS (sweep)"),
    "fig21": ("orchestrl.sim.experiments.fig21", "Appendix H: one and two NIC-EPS or OCS-layer link failures, per RL stage"),
    "fig22": ("orchestrl.sim.experiments.fig22", "§7.2.5 / Appendix I: each RL stage's sensitivity to the OCS "
                                       "reconfiguration delay (sweep)"),
    "fig23": ("orchestrl.sim.experiments.fig23", "Appendix I: traffic-aware (Algorithm 3) vs uniform circuit allocation"),
    # JigsawRL (docs/jigsaw.md): several pipelines on shared GPUs
    "jigsaw-fig12": ("orchestrl.sim.experiments.jigsaw_fig12", "JigsawRL §5.2: two pipelines on 8 H100s vs veRL, "
                     "RollMux, MuxServe (sweep)"),
    "jigsaw-fig13": ("orchestrl.sim.experiments.jigsaw_fig13", "JigsawRL §5.2: 8-64 A100s, 14B and 32B (sweep)"),
    "jigsaw-fig14": ("orchestrl.sim.experiments.jigsaw_fig14", "JigsawRL §5.2: per-pipeline latency increase (sweep)"),
    "jigsaw-fig15": ("orchestrl.sim.experiments.jigsaw_fig15", "JigsawRL §5.3: asynchronous, vs StreamRL and AReaL "
                     "(sweep)"),
    "jigsaw-fig16": ("orchestrl.sim.experiments.jigsaw_fig16", "JigsawRL §5.3: heterogeneous models (sweep)"),
    "jigsaw-fig19": ("orchestrl.sim.experiments.jigsaw_fig19", "JigsawRL §5.4: average MFU (sweep)"),
    "jigsaw-fig20": ("orchestrl.sim.experiments.jigsaw_fig20", "JigsawRL §5.4: migration ablation (sweep)"),
    # RollArt (docs/agentic.md): the agentic runtime on RLSim's virtual clock
    "rollart-fig10": ("orchestrl.sim.experiments.rollart_fig10", "RollArt §7.2: step time and throughput vs veRL+ and "
                      "StreamRL, scaling (sweep)"),
    "rollart-fig11": ("orchestrl.sim.experiments.rollart_fig11", "RollArt §7.3: hardware affinity, asynchronous "
                      "cross-cluster weight update (sweep)"),
    "rollart-env": ("orchestrl.sim.experiments.rollart_env", "RollArt §3.1 and §7.4: H800 vs H20, environment latency, "
                    "redundancy, bound (sweep)"),
}


def _figure(args: argparse.Namespace) -> int:
    import importlib
    import inspect

    if args.workers is not None and args.workers < 1:
        raise ConfigError("command line", "--workers", f"{args.workers} is not a number of processes", ">= 1")
    argv = (["--quick"] if args.quick else []) + (["--json"] if args.json else [])
    for opt in ("workers", "ray", "out", "seeds"):  # only the sweep options given, so one-process figures keep working
        if getattr(args, opt) is not None:
            argv += [f"--{opt}", str(getattr(args, opt))]
    module = importlib.import_module(_FIGURES[args.name][0])
    ticker = Ticker()
    # fig21/fig23 report progress per configuration; the sweeps print their own per case
    kwargs = {"progress": ticker.step} if "progress" in inspect.signature(module.main).parameters else {}
    try:
        status = int(module.main(argv, **kwargs) or 0)
    except SystemExit as exc:  # the figure's own parser refused an option it does not take (it said which)
        return exc.code if isinstance(exc.code, int) else 2
    ticker.step("")
    return status


def _sim(args: argparse.Namespace, ticker: Ticker):
    from orchestrl.fabric.topology import load_topology
    from orchestrl.sim.network.config import SimConfig
    from orchestrl.sim.network.netsim import NetworkSim

    from orchestrl.fabric.cost import max_clos_gpus

    most = max_clos_gpus(64)
    if args.gpus < 8 or args.gpus % 8 or args.gpus > most:
        raise ConfigError("command line", "--gpus", f"{args.gpus} is not a whole number of 8-GPU servers up to {most}",
                          f"a multiple of 8 from 8 to {most} (GPU g is NIC g % 8 of server g // 8)")
    if not args.gbps > 0 or args.gbps == float("inf"):
        raise ConfigError("command line", "--gbps", f"{args.gbps} is not a link speed", "a number of Gb/s > 0")
    if args.topology and args.fabric != "rfabric":
        raise ConfigError("command line", "--topology", f"describes an RFabric, not {args.fabric}", "--fabric rfabric")
    if args.oversubscription != 3 and args.fabric != "ft-os":
        raise ConfigError("command line", "--oversubscription", f"applies to ft-os, not {args.fabric}", "--fabric ft-os")
    ticker.step("building the fabric")
    topo = load_topology(args.topology) if args.topology else None
    config = SimConfig(link_bps=args.gbps * 1e9, ecmp=args.ecmp, switch_radix=args.switch_radix, mtu_bytes=args.mtu,
                       intra_server=args.same_server, oversubscription=args.oversubscription)
    return NetworkSim(args.fabric, args.gpus, config, topology=topo, method=args.method)


def _net(args: argparse.Namespace) -> int:
    from orchestrl.sim.network.flowfile import load_flows, result_document

    ticker = Ticker()
    sim = _sim(args, ticker)
    ticker.step("reading flows")
    flows = load_flows(args.flows, args.gpus)
    ticker.step("routing and planning")
    sim.state(flows)
    ticker.step("running flows")
    started = time.perf_counter()
    res = sim.time_flows(flows, progress=ticker.events)
    ticker.step("")
    if args.engine == "htsim":
        return _htsim(args, sim, flows, res, time.perf_counter() - started)
    if args.json:
        doc = result_document(args.fabric, args.gpus, flows, res)
        doc["solve_s"] = time.perf_counter() - started
        print(json.dumps(doc))
        return 0
    stuck = int(res.unfinished.sum())
    tail = f"; {stuck} flows never finish (no path)" if stuck else ""
    print(f"{args.fabric} {args.gpus} GPUs @ {args.gbps:g} Gb/s: {len(flows)} flows, makespan "
          f"{_fmt_s(res.makespan_s)}, {res.events} events, solved in {_fmt_s(time.perf_counter() - started)}{tail}")
    return 0


def _htsim(args: argparse.Namespace, sim, flows, res, fluid_s: float) -> int:
    """``sim net --engine htsim``: the same flows through htsim, each flow's completion beside the fluid one."""
    import tempfile

    import numpy as np

    from orchestrl.sim.network.htsim import HTSIM_SETTINGS, find_htsim, missing_htsim_message, run_htsim

    binary = find_htsim(args.htsim)
    if binary is None:
        raise ConfigError("command line", "--htsim", missing_htsim_message(args.htsim),
                          "an htsim_ndp binary (or --engine fluid)")
    if args.same_server != "network":
        raise ConfigError("command line", "--same-server", "htsim hosts have one NIC each; the fluid side must route "
                          "same-server pairs through the NICs too to be comparable", "--same-server network")
    with tempfile.TemporaryDirectory(prefix="orchestrl-htsim-") as work:
        run = run_htsim(binary, sim.fabric, flows, args.gbps, work,
                        settings={"mtu": args.mtu if args.mtu != 9216 else HTSIM_SETTINGS["mtu"]})
    fluid = res.finish_s
    done = np.isfinite(run.finish_s) & np.isfinite(fluid)
    err = (fluid[done] - run.finish_s[done]) / run.finish_s[done]
    doc = {"fabric": args.fabric, "gpus": args.gpus, "engine": "htsim", "htsim": binary,
           "htsim_settings": HTSIM_SETTINGS, "flows": len(flows), "htsim_finished": int(done.sum()),
           "htsim_makespan_s": run.makespan_s if np.isfinite(run.makespan_s) else None,
           "fluid_makespan_s": float(res.makespan_s), "makespan_err": (float(res.makespan_s) / run.makespan_s - 1
                                                                        if np.isfinite(run.makespan_s) else None),
           "median_fct_err": float(np.median(err)) if len(err) else None,
           "htsim_finish_s": [None if not np.isfinite(x) else float(x) for x in run.finish_s],
           "htsim_wall_s": run.wall_s, "htsim_cpu_s": run.cpu_s, "fluid_wall_s": fluid_s}
    if args.json:
        print(json.dumps(doc))
    else:
        mk = "did not finish" if doc["htsim_makespan_s"] is None else _fmt_s(doc["htsim_makespan_s"])
        rel = "" if doc["makespan_err"] is None else f" (fluid {doc['makespan_err']:+.1%})"
        print(f"{args.fabric} {args.gpus} hosts @ {args.gbps:g} Gb/s: {len(flows)} flows; htsim makespan {mk}, fluid "
              f"{_fmt_s(res.makespan_s)}{rel}; median flow error "
              f"{doc['median_fct_err']:+.1%}" if doc["median_fct_err"] is not None else "no flow finished in htsim")
    return 0


def _collective(args: argparse.Namespace) -> int:
    from orchestrl.fabric.intent import Collective
    from orchestrl.sim.network.collectives import groups_of

    if args.group_size < 1 or args.gpus % args.group_size:
        raise ConfigError("command line", "--group-size", f"{args.group_size} does not divide --gpus {args.gpus}",
                          f"a divisor of {args.gpus}")
    if args.stride < 1 or args.gpus % (args.group_size * args.stride):
        raise ConfigError("command line", "--stride", f"groups of {args.group_size} GPUs {args.stride} apart do not "
                          f"tile {args.gpus} GPUs", f"a stride >= 1 with group size x stride dividing {args.gpus}")
    if not args.bytes_per_rank >= 0 or args.bytes_per_rank == float("inf"):
        raise ConfigError("command line", "--bytes-per-rank", f"{args.bytes_per_rank} is not a byte count",
                          "a finite number >= 0")
    ticker = Ticker()
    sim = _sim(args, ticker)
    groups = groups_of(args.gpus, args.group_size, args.stride)
    if args.primitive == "m2n":
        if args.group_size < 2:
            raise ConfigError("command line", "--group-size", "m2n needs at least 2 GPUs per group", ">= 2")
        half = args.group_size // 2
        src = tuple(g for grp in groups for g in grp[:half])
        dst = tuple(g for grp in groups for g in grp[half:])
        c = Collective("m2n", src_gpus=src, dst_gpus=dst, bytes_per_rank=args.bytes_per_rank)
    else:
        c = Collective(args.primitive, groups=groups, bytes_per_rank=args.bytes_per_rank)
    ticker.step("timing the collective")
    started = time.perf_counter()
    t = sim.time_collective(c, args.algorithm)
    ticker.step("")
    solve_s = time.perf_counter() - started
    if args.json:
        print(json.dumps({"fabric": args.fabric, "gpus": args.gpus, "groups": len(groups),
                          "algorithm": args.algorithm, **t.to_json(), "solve_s": solve_s}))
        return 0
    algo = f" ({args.algorithm})" if args.primitive == "all-reduce" else ""
    print(f"{args.primitive}{algo} over {len(groups)} group(s) of {args.group_size} on {args.fabric} "
          f"{args.gpus} GPUs @ {args.gbps:g} Gb/s, {args.bytes_per_rank:g} B per rank: {_fmt_s(t.time_s)}, "
          f"algbw {t.algbw_bytes_per_s / 1e9:.2f} GB/s, busbw {t.busbw_bytes_per_s / 1e9:.2f} GB/s "
          f"(solved in {_fmt_s(solve_s)})")
    return 0


def _fmt_s(x: float) -> str:
    if x != x or x == float("inf"):
        return "inf"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if x >= scale or unit == "us":
            return f"{x / scale:.3f} {unit}"
    return f"{x:.3g} s"
