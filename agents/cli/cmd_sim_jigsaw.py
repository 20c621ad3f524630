"""``orchestrl sim jigsaw A B``: two RL pipelines on shared GPUs in RLSim (JigsawRL), against the alternatives.

For a pair a team wants to co-run, the same run the ``jigsaw-fig*`` figures make for the paper's pairs: both
pipelines' steps simulated once on the engine model, then veRL (its better configuration: in turn on all
GPUs, or side by side on half each), RollMux at its best configuration, JigsawRL-MuxServe and JigsawRL (the
layout its profile chooses, look-ahead, merging, balancing) on those same steps. Prints each system's
throughput and its ratio to veRL, the layout chosen, and each pipeline's step time against its step alone on
all the GPUs (what sharing costs one job). Every system also runs at each rollout TP degree of ``--tp`` (default:
the pipelines' tp, 2x and 4x it within a node) and is reported at its best, with the degree it ran at: a larger
degree shortens a long tail's decode, which veRL's rollout TP setting buys a user too. docs/jigsaw.md gives the
model and its limits.

Throughput counts both pipelines' tokens until both have done ``--steps`` steps. For two pipelines of
different step lengths use ``--steady``: the shorter one runs as many more steps as fit, and throughput
counts tokens only while both are still running (what the fixed-steps measure does not credit to veRL split).

``--long-run --rule longrun`` lets JigsawRL also pick a pool layout (both pipelines' rollouts on a pool of workers,
both trainings on the rest: RollMux's pools under JigsawRL's policy), decided on the profiles' long-run pass, and
times JigsawRL and MuxServe by the pass a long run adds, as RollMux is timed (docs/jigsaw.md, "A pool layout").

A pipeline is ``MODEL/TASK`` with optional ``,tp=N`` (GPUs per DP worker) and ``,scale=X`` (response
lengths times X), e.g. ``Llama-3.1-8B/gsm8k-mt,scale=0.7``. Bad input is refused naming the argument and
what is allowed (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from orchestrl.fabric.errors import ConfigError

__all__ = ["register", "parse_pipeline"]

SYSTEMS = ("verl", "rollmux", "muxserve", "jigsaw")
_NAMES = {"verl": "veRL", "rollmux": "RollMux", "muxserve": "JigsawRL-MuxServe", "jigsaw": "JigsawRL"}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``jigsaw`` to the ``orchestrl sim`` subcommands."""
    p = sub.add_parser("jigsaw", help="two RL pipelines on shared GPUs (JigsawRL) vs veRL, RollMux, MuxServe",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("pipelines", nargs=2, metavar="MODEL/TASK[,tp=N][,scale=X]",
                   help="the two pipelines (models: the bundled ones, e.g. Qwen3-4B; tasks: "
                        "gsm8k, math, aime, gsm8k-mt, search-r1)")
    p.add_argument("--gpu", default="H100", help="GPU type, a bundled name (H100, H800, A100, H20; default H100)")
    p.add_argument("--gpus", type=int, default=8, metavar="N", help="GPUs the two pipelines share (default 8)")
    p.add_argument("--steps", type=int, default=2, metavar="N", help="RL steps per pipeline (default 2)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="trace seed (default 0)")
    how = p.add_mutually_exclusive_group()  # --steady already runs the steps many times over
    how.add_argument("--long-run", action="store_true",
                     help="time JigsawRL and MuxServe over the steps repeated 4 times (as jigsaw-fig12; slower)")
    how.add_argument("--steady", action="store_true",
                   help="steady state: the shorter pipeline runs as many more steps as fit while the longer runs its "
                        "steps 4 times over, and throughput counts tokens while both still run (RollMux: the better "
                        "of one group, where both jobs run the longer job's step count, and each job alone on its half)")
    p.add_argument("--tp", default="auto", metavar="auto|N[,N...]",
                   help="rollout TP degrees every system is run at, each reported at its best (veRL, RollMux, MuxServe "
                        "at their fastest, JigsawRL at the degree and layout its profile picks); auto (default): the "
                        "pipelines' tp, 2x and 4x it within one 8-GPU node, where each pipeline keeps an even share "
                        "of whole workers (1,2,4 for tp=1 on 8 GPUs); a single N runs that degree only")
    p.add_argument("--rule", choices=("twostep", "longrun"), default="twostep",
                   help="how JigsawRL picks its layout: twostep (default, the figures'): uniform, halves or split on "
                        "two-step profiles; longrun (needs --long-run): those and the pool layouts (both rollouts on a "
                        "pool of workers, both trainings on the rest) on the profiles' marginal pass, JigsawRL and "
                        "MuxServe then timed by the pass a long run adds, as RollMux is (docs/jigsaw.md, \"A pool layout\")")
    p.add_argument("--systems", default=",".join(SYSTEMS), metavar="LIST",
                   help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all; veRL is always run)")
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON document")
    p.set_defaults(func=_run)


def parse_pipeline(text: str, which: str = "pipeline") -> tuple[str, str, int, float]:
    """``MODEL/TASK[,tp=N][,scale=X]`` -> ``(model, task, tp, scale)``; a ConfigError naming the part that is wrong.

    >>> parse_pipeline("Llama-3.1-8B/gsm8k-mt,scale=0.7")
    ('Llama-3.1-8B', 'gsm8k-mt', 1, 0.7)
    """
    from orchestrl.compute_sched.hardware import load_model
    from orchestrl.sim.multiplex.workload import TASKS

    head, *opts = [x.strip() for x in text.split(",")]
    model, sep, task = head.partition("/")
    if not sep or not model or not task:
        raise ConfigError("command line", which, f"{text!r} is not MODEL/TASK", "e.g. Qwen3-4B/gsm8k")
    name = load_model(model).name  # refuses an unknown model, listing the bundled ones
    if task not in TASKS:
        raise ConfigError("command line", f"{which} task", f"unknown task {task!r}", ", ".join(TASKS))
    tp, scale = 1, 1.0
    for opt in opts:
        key, eq, val = opt.partition("=")
        if key not in ("tp", "scale") or not eq:
            raise ConfigError("command line", which, f"unknown option {opt!r} in {text!r}",
                              "tp=N (GPUs per DP worker) or scale=X (response lengths times X, 0.05-10)")
        try:
            if key == "tp":
                tp = int(val)
                if tp < 1:
                    raise ValueError
            else:
                scale = float(val)
                if not 0.05 <= scale <= 10:  # also refuses nan
                    raise ValueError
        except ValueError:
            raise ConfigError("command line", f"{which} {key}", f"{val!r}",
                              "an integer >= 1" if key == "tp" else "a number in [0.05, 10]") from None
    return name, task, tp, scale


def _run(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    from orchestrl.compute_sched.hardware import bundled_gpus
    from orchestrl.sim.experiments.jigsaw_common import Case, run_case, tp_candidates, tp_search
    from orchestrl.sim.multiplex.baselines import PASSES, STEADY_CAP
    from orchestrl.sim.multiplex.layouts import ROUTING_MARGIN

    out = stream or sys.stdout
    pls = tuple(parse_pipeline(t, f"pipeline {'AB'[i]}") for i, t in enumerate(args.pipelines))
    names = {g.lower(): g for g in bundled_gpus()}
    if args.gpu.lower() not in names:  # the simulator looks GPUs up by name, so a GPU YAML elsewhere cannot run
        raise ConfigError("command line", "--gpu", f"{args.gpu!r} is not a bundled GPU", ", ".join(sorted(names.values())))
    gpu = names[args.gpu.lower()]
    args.margin_pct = 100 * ROUTING_MARGIN
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise ConfigError("command line", "--systems", f"{args.systems!r}", f"a comma-separated subset of {', '.join(SYSTEMS)}")
    systems = ("verl",) + tuple(s for s in SYSTEMS[1:] if s in systems)
    if pls[0][2] != pls[1][2]:
        raise ConfigError("command line", "pipelines", f"tp={pls[0][2]} and tp={pls[1][2]}",
                          "the same tp for both (their DP workers share GPUs one to one)")
    tp = pls[0][2]
    if not 2 * tp <= args.gpus <= 64 or args.gpus % (2 * tp):
        raise ConfigError("command line", "--gpus", f"{args.gpus} GPUs for tp={tp}",
                          f"a multiple of {2 * tp} up to 64 (an even number of DP workers of {tp} GPU(s), so each "
                          "pipeline can also have half; Fig. 13's largest setting is 64)")
    if not 1 <= args.steps <= 20:
        raise ConfigError("command line", "--steps", f"{args.steps}", "1 to 20")
    if args.seed < 0:
        raise ConfigError("command line", "--seed", f"{args.seed}", ">= 0")
    label = " + ".join(f"{m}/{t}" for m, t, _, _ in pls)
    if args.steady and args.steps > 4:
        raise ConfigError("command line", "--steps", f"{args.steps} with --steady",
                          f"at most 4 (the shorter pipeline may run up to {STEADY_CAP * PASSES}x as many steps; "
                          "2 x 64 steps take about 2 minutes)")
    if args.tp.strip().lower() == "auto":
        tps = tp_search(tp, args.gpus)  # () where no larger degree fits: the pipelines' own
    else:
        try:
            tps = tuple(int(x) for x in args.tp.split(","))
        except ValueError:
            raise ConfigError("command line", "--tp", f"{args.tp!r}", "auto, or comma-separated integers, e.g. 1,2,4") from None
    if args.rule == "longrun" and not args.long_run:
        raise ConfigError("command line", "--rule", "longrun without --long-run",
                          "add --long-run (the rule compares runs of one and of several passes), or --rule twostep")
    case = Case("cli", label, gpu, args.gpus, pls, args.steps, systems, seed=args.seed, longrun=args.long_run,
                steady=args.steady, tps=tps, rule=args.rule)
    try:  # refuses degrees that are not >= 1 or leave a pipeline part of a worker, before simulating
        tp_candidates(case)
    except ConfigError as e:
        raise ConfigError("command line", "--tp", f"{args.tp!r} for {args.gpus} GPUs ({e.problem})", e.allowed) from None
    print(f"simulating {label} on {args.gpus} {gpu}, {args.steps} step(s), seed {args.seed} ...", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    res = run_case(case)
    res["wall_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(res, indent=1, default=str), file=out)
        return 0
    _print(res, systems, pls, out, args.margin_pct)
    return 0


def _print(res: dict[str, Any], systems: tuple[str, ...], pls: tuple, out: TextIO, margin_pct: float) -> None:
    base = res["verl_tps"]
    print(f"{res['label']} on {res['gpus']} {res['gpu']}, {res['steps']} step(s) "
          f"(RLSim, default slowdown grid; {res['wall_s']:.0f} s)", file=out)
    for name, step in res["exclusive_step_s"].items():
        print(f"  {name}: step alone on all {res['gpus']} GPUs {step:.1f} s", file=out)
    print(f"  rollout share of a step under veRL: {100 * res['rollout_share_verl']:.0f}% (mean of the two)", file=out)
    if "steady_passes" in res:
        n = [res["steps"] * p for p in res["steady_passes"]]
        print(f"  steady state: the pipelines run {n[0]} and {n[1]} steps (as many as fit in the other's time on "
              "veRL split's halves); throughput counts tokens only while both are still running"
              + (f"; RollMux ({res['rollmux_config']}) runs {' and '.join(map(str, res['rollmux_steps_run']))} steps"
                 + (" (in one group its round robin runs one step of each job a turn)"
                    if not res["rollmux_config"].startswith("isolated") else "") if "rollmux_steps_run" in res else ""),
              file=out)
    tp = res.get("tp", {})
    print(f"  {'system':20s} {'tokens/s':>10s} {'vs veRL':>8s} {'TP':>3s}", file=out)
    rows = [("veRL (" + res["verl_config"] + ")", base, tp.get("verl"))]
    rows += [(_NAMES[s], res[f"{s}_tps"], tp.get(s)) for s in systems[1:] if f"{s}_tps" in res]
    for name, tps, deg in rows:
        print(f"  {name:20s} {tps:10.0f} {tps / base:8.3f} {deg if deg else tp['candidates'][0]:>3}", file=out)
    if len(tp.get("candidates", ())) > 1:
        print(f"  rollout TP searched: {', '.join(map(str, tp['candidates']))} (JigsawRL's by its profile, the others' "
              "at their fastest on this run)" + (f"; veRL at tp={pls[0][2]}: {res['verl_own_tp_tps'] / base:.3f}x"
                                                 if res.get("verl_own_tp_tps") else ""), file=out)
    per = [(s, res[f"{s}_per_pipeline_vs_split"]) for s in systems[1:] if f"{s}_per_pipeline_vs_split" in res]
    if per:  # the sum above can hide one job paying for the other's gain
        names = list(res["exclusive_step_s"])
        print("  each pipeline's tokens/s against its own on veRL split's half: " + "; ".join(
            f"{_NAMES[s]} " + ", ".join(f"{n.split(':', 1)[0]} {x:.3f}" for n, x in zip(names, v)) for s, v in per),
            file=out)
    if "jigsaw_tps" in res:
        layout = res.get("routing", "uniform")
        why = {"split": f"each pipeline wholly on its half: sharing workers was not predicted {margin_pct:g}% faster",
               "halves": "each pipeline's rollout on its half, reference and training on every worker",
               "uniform": "both pipelines on every worker"}.get(layout)
        if why is None:  # pool:k (the long-run rule)
            k = int(layout.split(":")[1])
            why = (f"both pipelines' rollouts on a pool of {k} worker(s), both trainings on the other "
                   f"{res['gpus'] // (tp.get('jigsaw') or pls[0][2]) - k}")
        print(f"  JigsawRL layout: {layout} ({why})", file=out)
        if "jigsaw_makespan_tps" in res:
            print(f"  long-run rule: JigsawRL and MuxServe timed by the pass a long run adds (RollMux's measure); "
                  f"JigsawRL by its makespan per pass instead: {res['jigsaw_makespan_tps'] / base:.3f}x veRL", file=out)
        alone = res["exclusive_step_s"]
        for name, lat in res["jigsaw_latency_s"].items():
            print(f"  {name}: mean step under JigsawRL {lat:.1f} s, {lat / alone[name]:.2f}x its step "
                  "alone on all the GPUs", file=out)
        for name, lat in res["jigsaw_latency_s"].items():
            other = max(v for k, v in alone.items() if k != name)
            if lat / alone[name] > 1.5 and alone[name] < 0.5 * other:
                if "steady_passes" in res:  # the window measure does show the short one's loss, but summed
                    why = ("the throughput above sums both pipelines' tokens/s, so time it loses can be made up by "
                           "the other's tokens")
                else:
                    why = ("the throughput above counts both pipelines' tokens until both have done their steps, so "
                           "what the short one loses does not show in it (--steady runs it as many steps as fit instead)")
                print(f"  note: {name}'s steps are much shorter than the other's and run {lat / alone[name]:.2f}x as long "
                      f"as alone; {why} (docs/jigsaw.md, \"Your own pair\")", file=out)
    # the chain bound holds for a makespan; the long-run measure's pass (M(P) - M(1)) / (P - 1) can fall below a
    # pipeline's chain where the one-pass run starts slower than the long run's first pass, so it is not bounded by it
    what = "any schedule's makespan per pass" if "jigsaw_makespan_tps" in res else "any schedule"
    bound = (f"upper bound for {what}{' running each pipeline at one of the TP degrees searched' if len(tp.get('candidates', ())) > 1 else ''}: "
             f"{res['bound_tps'] / base:.3f}x veRL; ") if "bound_tps" in res else ""
    print(f"  {bound}memory violations: {res['memory_violations']}", file=out)
