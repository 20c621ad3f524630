"""``orchestrl sim run CONFIG.yaml``: RL iterations of one configuration, simulated at cluster scale.

Prints one line by default (``--json`` for the whole result), a progress line per iteration on
stderr, and with ``--plot out.png`` a timeline of both clusters plus ``out.csv`` with every bar.
Bad input is refused with the file, the field and what is allowed (exit status 2); the ``--plot``
location is checked before the simulation, and the result is printed before the files are written,
so a write that still fails (disk full) costs the files, never the result (exit status 1).

A part of a step that runs longer than ``ORCHESTRL_PROGRESS_EVERY_S`` (default 10 s) is named on
stderr every that many seconds (building the step's trace, generation, training, weight sync), so a
big step shows where it is.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from orchestrl.fabric.errors import ConfigError

__all__ = ["register", "summary_line", "timeline_rows", "write_plot"]

_BAR = 24


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` to the ``orchestrl sim`` subcommands."""
    from orchestrl.sim.network.config import FABRICS

    p = sub.add_parser("run", help="simulate RL iterations of one configuration (throughput, per dollar)",
                       description="Run the RL iterations a CONFIG.yaml describes: training, generation and "
                                   "weight sync on the simulated fabric, with the project's schedulers and "
                                   "fabric controller. `--fields` lists every field of the file.")
    p.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="run file (see examples/sim/)")
    p.add_argument("--json", action="store_true", help="print the whole result as one JSON document")
    p.add_argument("--plot", metavar="OUT.png", help="write a timeline of both clusters, and OUT.csv beside it")
    p.add_argument("--fabric", choices=FABRICS, help="run on this fabric instead of the file's fabric.kind")
    p.add_argument("--iterations", type=int, metavar="N", help="override loop.iterations")
    p.add_argument("--fields", action="store_true", help="print every field of a run file and exit")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run N trace seeds (loop.seed, +1, ...) on the sweep backend and report each number's mean "
                        "and 95%% interval (default 1: one run, with its timeline)")
    p.add_argument("--workers", type=int, metavar="N", help="--seeds: processes of the local pool (default: CPUs)")
    p.add_argument("--ray", metavar="ADDRESS", help="--seeds: run the seeds on this Ray cluster ('local': here)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, stages_factory=None, stream: TextIO | None = None) -> int:
    from orchestrl.sim.config import config_reference, load_run_config, validate
    from orchestrl.sim.run import simulate

    err = stream if stream is not None else sys.stderr
    if args.fields:
        print(config_reference())
        return 0
    if not args.config:
        raise ConfigError("command line", "CONFIG.yaml", "is required", "a run file, e.g. examples/sim/demo-64gpu.yaml")
    if args.plot:
        _check_plot(args.plot)
    plot_files = [args.plot, str(Path(args.plot).with_suffix(".csv"))] if args.plot else []
    cfg = load_run_config(args.config)
    if args.fabric:
        cfg = cfg.with_fabric(args.fabric)
    if args.iterations is not None:
        if args.iterations < 1:
            raise ConfigError("command line", "--iterations", f"{args.iterations}", "an integer >= 1")
        cfg = validate(replace(cfg, loop=replace(cfg.loop, iterations=args.iterations)))
    if not 1 <= args.seeds <= 100:
        raise ConfigError("command line", "--seeds", f"{args.seeds}", "1 to 100 trace seeds")
    if args.seeds > 1:
        return _run_seeds(args, cfg, err)
    c, w = cfg.cluster, cfg.workload
    split = f"{c.train_gpus} train" if c.train_gpus else "balanced split"
    step = (f"{w.prompts_per_step * w.responses_per_prompt:,} responses per step" if w.prompts_per_step
            else f"{w.responses_per_gen_gpu} responses per generation GPU per step")
    err.write(f"[sim run] {cfg.name}: {cfg.model} on {cfg.fabric.kind} {c.gpus} GPUs ({split}), "
              f"{cfg.loop.mode}, {cfg.loop.iterations} iteration(s), {step}\n")
    started = time.perf_counter()
    total = cfg.loop.iterations
    beat = _Heartbeat(err, _every_s(), "building the fabric and stage models" if c.train_gpus
                      else "profiling the Train/Gen splits")

    def on_split(rows):
        for r in rows:
            err.write(f"[sim run] split {r['train_gpus']} train: gen {r['gen_s']:.2f} s, train {r['train_s']:.2f} s\n")
        beat.phase("building the fabric and stage models")

    def on_stage(step: int, part: str) -> None:
        beat.phase(f"step {step + 1}/{total}: {_PARTS.get(part, part)}")

    def on_iteration(it):
        done = it.index + 1
        bar = "#" * round(_BAR * done / total) + "-" * (_BAR - round(_BAR * done / total))
        err.write(f"[sim run] [{bar}] {done}/{total}  gen {it.gen.time_s:.2f} s  train {it.train.time_s:.2f} s  "
                  f"sync {it.sync.time_s:.3f} s  (simulated in {it.wall_s:.1f} s)\n")
        err.flush()

    with beat:
        result = simulate(cfg, stages_factory=stages_factory, on_iteration=on_iteration, on_split=on_split,
                          on_stage=on_stage)
    wall = time.perf_counter() - started
    if args.json:
        doc = {"name": cfg.name, "model": cfg.model, "fabric": cfg.fabric.kind, "gpus": c.gpus,
               "train_gpus": result.detail["train_gpus"], "gen_gpus": result.detail["gen_gpus"],
               "mode": cfg.loop.mode, "iterations": cfg.loop.iterations,
               "samples_per_s": result.throughput.samples_per_s, "tokens_per_s": result.throughput.tokens_per_s,
               "samples_per_usd": result.samples_per_usd, "tokens_per_usd": result.tokens_per_usd,
               "wall_s": wall, "config": cfg.to_json(), "result": result.to_json()}
        print(json.dumps(_finite(doc)))
    else:
        print(summary_line(cfg, result, wall))
    sys.stdout.flush()  # the result is out before anything can go wrong writing the plot
    if args.plot:
        try:
            write_plot(result, args.plot, title=f"{cfg.name}: {cfg.model} on {cfg.fabric.kind}, {cfg.loop.mode}")
        except OSError as exc:
            from orchestrl.sim.plot import write_failure

            err.write(f"orchestrl: error: {write_failure('--plot', exc, plot_files)}\n")
            return 1
        err.write(f"[sim run] wrote {plot_files[0]} and {plot_files[1]}\n")
    return 0


def _every_s() -> float:
    """Seconds between progress lines inside a step (``ORCHESTRL_PROGRESS_EVERY_S``; the tests lower it)."""
    raw = os.environ.get("ORCHESTRL_PROGRESS_EVERY_S", "10")
    try:
        return float(raw)
    except ValueError:
        raise ConfigError("environment", "ORCHESTRL_PROGRESS_EVERY_S", f"{raw!r} is not a number of seconds",
                          "a number such as 10, or unset it") from None


_PARTS = {"trace": "building the step's length trace", "gen": "generation", "train": "training",
          "weight-sync": "weight sync"}


class _Heartbeat:
    """Names the running part of the run on stderr every ``every_s`` while it lasts longer than that.

    A daemon thread, so the stage models stay free of progress calls: a part that finishes sooner
    prints nothing, one that takes minutes (a huge step's trace or generation) says so.
    """

    def __init__(self, stream: TextIO, every_s: float, first: str) -> None:
        self.stream, self.every_s = stream, max(every_s, 0.01)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._name, self._since = first, time.perf_counter()
        self._thread = threading.Thread(target=self._beat, name="sim-run-progress", daemon=True)

    def phase(self, name: str) -> None:
        with self._lock:
            self._name, self._since = name, time.perf_counter()

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                name, ran_s = self._name, time.perf_counter() - self._since
            if ran_s >= self.every_s:
                self.stream.write(f"[sim run] {name}: running for {ran_s:.1f} s\n")
                self.stream.flush()

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _run_seeds(args: argparse.Namespace, cfg, err: TextIO) -> int:
    """``--seeds N``: N independent runs, one line per metric with its mean and 95% interval."""
    from orchestrl.sim.seeds import METRICS, run_seeds
    from orchestrl.sim.sweep import check_ray_address

    if args.workers is not None and args.workers < 1:
        raise ConfigError("command line", "--workers", f"{args.workers} is not a number of processes", ">= 1")
    check_ray_address(args.ray)
    if args.plot:
        err.write("[sim run] --plot draws one run's timeline: it is written for the first seed only\n")
    err.write(f"[sim run] {cfg.name}: {args.seeds} seeds from {cfg.loop.seed} on {cfg.fabric.kind}, "
              f"{cfg.cluster.gpus} GPUs\n")
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        err.write(f"[sim run] {done}/{total} seeds ({time.perf_counter() - started:.0f} s)\n")
        err.flush()

    summary = run_seeds(cfg, args.seeds, workers=args.workers, ray_address=args.ray, progress=progress)
    if args.json:
        print(json.dumps(_finite({"name": cfg.name, "model": cfg.model, "fabric": cfg.fabric.kind,
                                  "gpus": cfg.cluster.gpus, **summary.to_json(),
                                  "wall_s": time.perf_counter() - started})))
    else:
        print(f"{cfg.name}: {cfg.model} on {cfg.fabric.kind}, {cfg.cluster.gpus} GPUs, {args.seeds} seeds "
              f"(mean, 95% interval):")
        for m in METRICS:
            mean, lo, hi = summary.stat(m)
            print(f"  {m:<16} {mean:12.4g}  [{lo:.4g}, {hi:.4g}]")
    sys.stdout.flush()
    if args.plot:
        args1 = argparse.Namespace(**{**vars(args), "seeds": 1, "json": False})
        with open(os.devnull, "w") as sink:
            saved, sys.stdout = sys.stdout, sink
            try:
                return _run(args1, stream=err)
            finally:
                sys.stdout = saved
    return 0


def summary_line(cfg, result, wall_s: float) -> str:
    """Return the one-line summary of a run."""
    d, th, cost = result.detail, result.throughput, result.cost
    stages = result.stage_means_s()
    window = "steady state" if th.window == "steady" else "whole run"
    return (f"{cfg.name}: {cfg.model} on {cfg.fabric.kind} {cfg.cluster.gpus} GPUs ({d['train_gpus']} train / "
            f"{d['gen_gpus']} gen) @ {cfg.fabric.link_gbps} Gb/s, {cfg.loop.mode}, {len(result.iterations)} "
            f"iteration(s): {th.samples_per_s:.3f} samples/s, {th.tokens_per_s:,.0f} tokens/s ({window}); "
            f"mean gen {stages['gen']:.2f} s, train {stages['train']:.2f} s, weight sync {stages['weight-sync']:.3f} s; "
            f"{result.samples_per_usd:.1f} samples/$ at ${cost.usd_per_h:,.1f}/h (GPUs ${cost.gpu_usd_per_h:,.1f} + "
            f"network ${cost.network_usd_per_h:,.2f}); simulated in {wall_s:.1f} s")


def timeline_rows(result) -> list[dict[str, object]]:
    """Return one row per stage bar: iteration, stage, cluster, start, end, duration (seconds)."""
    rows = []
    for it in result.iterations:
        for stage, cluster, start, res in (("gen", "gen", it.gen_start_s, it.gen), ("train", "train", it.train_start_s,
                                                                                     it.train),
                                           ("weight-sync", "both", it.sync_start_s, it.sync)):
            rows.append({"iteration": it.index, "stage": stage, "cluster": cluster, "start_s": start,
                         "end_s": start + res.time_s, "duration_s": res.time_s})
    return rows


def _check_plot(path: str) -> None:
    """Refuse a --plot path before the simulation: not .png, no matplotlib, or a folder it cannot write."""
    from orchestrl.sim.plot import check_output

    if not path.lower().endswith(".png"):
        raise ConfigError("command line", "--plot", f"{path!r} is not a .png file", "a path ending in .png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("command line", "--plot", "needs matplotlib, which is not installed",
                          "pip install matplotlib, or run without --plot (--json has every number)") from None
    png = Path(path)  # checked last: it creates the folder
    check_output("--plot", png.parent, [png.name, png.with_suffix(".csv").name], given=path,
                 example="results/run.png")


def write_plot(result, path: str, title: str = "") -> None:
    """Write the run's timeline as a PNG (matplotlib) and every bar behind it as CSV beside it."""
    rows = timeline_rows(result)
    with open(Path(path).with_suffix(".csv"), "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = {"gen": "tab:blue", "train": "tab:orange", "weight-sync": "tab:green"}
    lane = {"gen": 1, "train": 0}
    fig, ax = plt.subplots(figsize=(11, 2.8))
    span = max((r["end_s"] for r in rows), default=1.0) - min((r["start_s"] for r in rows), default=0.0)
    floor = span / 400.0  # a bar narrower than ~2 px would vanish: draw it that wide, and label it
    for r in rows:
        shade = 0.55 if r["iteration"] % 2 else 1.0  # alternate iterations: neighbours never merge
        for y in ((0, 1) if r["cluster"] == "both" else (lane[r["cluster"]],)):
            ax.broken_barh([(r["start_s"], max(r["duration_s"], floor))], (y - 0.35, 0.7), color=colour[r["stage"]],
                           alpha=shade, edgecolor="black", linewidth=0.4)
        if r["stage"] == "weight-sync" and r["duration_s"] < floor * 4:
            ax.annotate(f"{r['duration_s'] * 1e3:.0f} ms" if r["duration_s"] < 1 else f"{r['duration_s']:.1f} s",
                        (r["start_s"], 1.42), fontsize=6, ha="center")
        if r["stage"] == "gen":
            ax.annotate(f"it {r['iteration']}", (r["start_s"], 1.42), fontsize=6, ha="left", color="grey")
    ax.set_yticks([0, 1], ["Train cluster", "Gen cluster"])
    ax.set_ylim(-0.6, 1.7)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colour.values()], labels=list(colour),
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finite(x):
    """JSON has no inf/nan: write them as null (a stage that never finished shows as null)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
