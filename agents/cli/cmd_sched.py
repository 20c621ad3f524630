"""``orchestrl sched ...``: replay generation steps under the compute scheduler and its baselines."""

from __future__ import annotations

import argparse
import json

from orchestrl.fabric.errors import ConfigError

__all__ = ["register", "ascii_plot"]


def register(groups: argparse._SubParsersAction) -> None:
    sched = groups.add_parser("sched", help="generation compute scheduler (replay, traces, specs)",
                              description="OrchestrRL §4 compute orchestration on the simulated engine.")
    sub = sched.add_subparsers(dest="command", metavar="COMMAND", required=True)

    rep = sub.add_parser("replay", help="replay one generation step under one or more policies",
                         description="Print makespan, reconfigurations and migrations; --plot draws the "
                                     "remaining requests over time (OrchestrRL Figure 11).")
    rep.add_argument("--model", required=True, help="bundled model name (e.g. Qwen2.5-14B) or model YAML")
    rep.add_argument("--gpu", default="H800", help="bundled GPU name (H800, H20, H100, A100) or GPU YAML")
    rep.add_argument("--gpus", type=int, required=True, help="GPUs of the generation cluster")
    rep.add_argument("--trace", required=True, metavar="FILE.json", help="step trace (see `sched trace`)")
    rep.add_argument("--policy", default="orchestrl", metavar="P[,P...]",
                     help="static-tp:K, verl-to, verl-lo, partial-rollout, orchestrl, orchestrl-pp, orchestrl-rb, "
                          "planner-exact; comma-separated to compare (default orchestrl)")
    rep.add_argument("--history", nargs="*", default=[], metavar="FILE.json",
                     help="traces of earlier steps, oldest first, to forecast this step's length histogram from")
    rep.add_argument("--forecast", default="auto", choices=("auto", "prior", "mean", "last", "arima", "oracle"),
                     help="what the planner sees of the step's lengths: auto (default) = the default forecaster "
                          "(mean, k by backtest) over --history, or without --history the bundled Figure 3 prior; "
                          "mean/last/arima = that forecaster over --history; prior = the Figure 3 shape; "
                          "oracle = this trace's own true length histogram (clairvoyant, labelled in the output)")
    rep.add_argument("--plan-interval", type=float, default=30.0, metavar="S", help="proactive planning period")
    rep.add_argument("--tick", type=float, default=2.0, metavar="S", help="monitoring tick of the balancer")
    rep.add_argument("--initial-tp", default="verl-to",
                     help="where the orchestrl policies start: 'verl-to' (its sweep's best TP, default) or a TP degree")
    rep.add_argument("--step-model", default="measured", choices=("measured", "analytical"),
                     help="step times: sums of measured GPU operator times (default, docs/step-model.md) or the "
                          "analytical roofline")
    rep.add_argument("--calibration", default="bundled", metavar="FILE|roofline",
                     help="step-model calibration: the GPU's bundled file for the step model (default; H800's are "
                          "fitted to OrchestrRL §2.1), 'roofline' for none, or a calibration YAML")
    rep.add_argument("--plot", action="store_true", help="draw remaining requests over time in the terminal")
    rep.add_argument("--curve-csv", metavar="FILE", help="write time,policy,remaining rows")
    rep.add_argument("--json", action="store_true", help="print JSON instead of text")
    rep.set_defaults(func=_replay)

    tr = sub.add_parser("trace", help="write a synthetic heavy-tailed step trace (OrchestrRL Figure 3 shape)")
    tr.add_argument("--prompts", type=int, default=128, help="GRPO groups (prompts)")
    tr.add_argument("--k", type=int, default=8, help="responses per prompt")
    tr.add_argument("--max-tokens", type=int, default=15360, help="generation cap")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--scale", type=float, default=1.0, help="multiply every length (drift between steps)")
    tr.add_argument("--out", required=True, metavar="FILE.json")
    tr.set_defaults(func=_trace)

    specs = sub.add_parser("specs", help="list the bundled model (Table 3) and GPU files")
    specs.set_defaults(func=_specs)


def ascii_plot(curves: dict[str, list[tuple[float, int]]], width: int = 72, height: int = 16) -> str:
    """Return a text chart of remaining requests over time, one marker per policy.

    >>> print(ascii_plot({"a": [(0.0, 4), (10.0, 0)]}, width=10, height=3).splitlines()[-1])
    a=*
    """
    marks = "*o+x#@%&"
    t_max = max((t for c in curves.values() for t, _ in c), default=1.0) or 1.0
    n_max = max((n for c in curves.values() for _, n in c), default=1) or 1
    grid = [[" "] * width for _ in range(height)]
    for i, pts in enumerate(curves.values()):
        for t, n in pts:
            x = min(width - 1, int(t / t_max * (width - 1)))
            y = min(height - 1, int(n / n_max * (height - 1)))
            grid[height - 1 - y][x] = marks[i % len(marks)]
    lines = [f"{n_max if r == 0 else '':>6} |" + "".join(row) for r, row in enumerate(grid)]
    lines.append(f"{0:>6} +" + "-" * width)
    lines.append(" " * 8 + f"0 s{' ' * (width - 12)}{t_max:.0f} s")
    lines.append("  ".join(f"{name}={marks[i % len(marks)]}" for i, name in enumerate(curves)))
    return "\n".join(lines)


def _initial_tp(text: str) -> int | str:
    """``--initial-tp``: 'verl-to' or a positive TP degree."""
    if text == "verl-to":
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError("--initial-tp", "initial_tp", f"{text!r}", "'verl-to' or a positive TP degree such as 2")


def _replay(args: argparse.Namespace) -> int:
    from orchestrl.compute_sched.calibration import perf_model
    from orchestrl.compute_sched.replay import ReplayOptions, replay
    from orchestrl.compute_sched.scheduler import SchedulerConfig
    from orchestrl.compute_sched.traces import load_trace

    if args.gpus < 1:
        raise ConfigError("--gpus", "gpus", f"{args.gpus}", "a positive number of GPUs")
    if args.plan_interval <= 0 or args.tick <= 0:
        raise ConfigError("--plan-interval/--tick", "seconds", f"{args.plan_interval}/{args.tick}", "numbers > 0")
    perf = perf_model(args.model, args.gpu, args.calibration, args.step_model)
    trace = load_trace(args.trace)
    forecast, forecast_label = _forecast(args, trace)
    opts = ReplayOptions(scheduler=SchedulerConfig(plan_interval_s=args.plan_interval, tick_s=args.tick),
                         initial_tp=_initial_tp(args.initial_tp))
    results = [replay(trace, perf, args.gpus, p.strip(), forecast=forecast, options=opts)
               for p in args.policy.split(",") if p.strip()]
    if args.curve_csv:
        with open(args.curve_csv, "w", encoding="utf-8") as fh:
            fh.write("time_s,policy,remaining\n")
            for r in results:
                fh.writelines(f"{t:.3f},{r.policy},{n}\n" for t, n in r.report.remaining_curve)
    if args.json:
        print(json.dumps([_as_json(r) | {"forecast": forecast_label} for r in results], indent=2))
        return 0
    base = results[0].makespan_s
    print(f"{trace.name}: {len(trace.requests)} requests, {perf.model.name} on {args.gpus} x {perf.gpu.name}")
    print(f"forecast: {forecast_label}")
    print(f"{'policy':<16} {'makespan_s':>10} {'vs first':>8} {'reconfigs':>9} {'migrations':>10} {'unfinished':>10}"
          "  layout")
    for r in results:
        rep = r.report
        layouts = " -> ".join([r.initial_layout] + [e.to_layout for e in rep.reconfigurations])
        print(f"{r.policy:<16} {r.makespan_s:>10.1f} {base / r.makespan_s:>7.2f}x {len(rep.reconfigurations):>9} "
              f"{rep.balancer_migrations + sum(e.migrated for e in rep.reconfigurations):>10} "
              f"{len(rep.unfinished):>10}  {layouts}")
        for e in rep.reconfigurations:
            print(f"    t={e.time_s:7.1f}s  {e.from_layout} -> {e.to_layout}: predicted gain {e.predicted_gain_s:.1f} s, "
                  f"switch {e.switch_s:.1f} s, migration {e.migration_s:.1f} s ({e.migrated} requests "
                  f"{dict(e.methods)}), solved in {e.solve_s * 1e3:.0f} ms")
    if args.plot:
        print(ascii_plot({r.policy: list(r.report.remaining_curve) for r in results}))
    return 0


def _forecast(args: argparse.Namespace, trace) -> tuple[object, str]:
    """What the planning policies see (``replay``'s ``forecast``) and its label; the trace's lengths only if asked.

    A user without history gets the labelled Figure 3 prior, never the step's own lengths; asking a
    history forecaster for a forecast without history is an error naming --history.
    """
    from orchestrl.compute_sched.forecast import DEFAULT_METHOD
    from orchestrl.compute_sched.replay import step_forecast
    from orchestrl.compute_sched.traces import load_trace
    from orchestrl.compute_sched.workload import LengthForecaster

    method = args.forecast
    if method in ("prior", "oracle"):
        if args.history:
            raise ConfigError("--forecast", "forecast", f"'{method}' does not use --history",
                              "drop --history, or --forecast auto|mean|last|arima to forecast from it")
        return method, step_forecast(trace, method)[1]
    if not args.history:
        if method == "auto":
            return "prior", step_forecast(trace, "prior")[1] + " (pass --history for a forecast from earlier steps)"
        raise ConfigError("--forecast", "forecast", f"'{method}' forecasts from earlier steps and none were given",
                          "--history FILE.json [FILE.json ...] (traces of earlier steps), or --forecast prior")
    method = DEFAULT_METHOD if method == "auto" else method
    fc = LengthForecaster(trace.max_tokens, method=method, min_history=min(4, max(2, len(args.history))))
    for path in args.history:
        fc.observe_step([q.output_tokens for q in load_trace(path).requests])
    out = fc.forecast(len(trace.requests))
    return out.histogram, f"{out.method}, from {len(args.history)} earlier step(s) in --history"


def _as_json(r) -> dict:
    rep = r.report
    return {"policy": r.policy, "initial_layout": r.initial_layout, "makespan_s": rep.makespan_s,
            "reconfigurations": [e.__dict__ | {"methods": dict(e.methods)} for e in rep.reconfigurations],
            "balancer_migrations": rep.balancer_migrations, "finished": len(rep.finished),
            "unfinished": len(rep.unfinished), "plan_solve_s": list(rep.plan_solve_s),
            "remaining_curve": [list(p) for p in rep.remaining_curve], "detail": r.detail}


def _trace(args: argparse.Namespace) -> int:
    from orchestrl.compute_sched.traces import heavy_tailed_trace, save_trace

    for name in ("prompts", "k", "max_tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", name, f"{getattr(args, name)}", "an integer >= 1")
    t = heavy_tailed_trace(args.prompts, args.k, args.max_tokens, seed=args.seed, scale=args.scale)
    save_trace(t, args.out)
    print(f"wrote {len(t.requests)} requests to {args.out}")
    return 0


def _specs(args: argparse.Namespace) -> int:
    from orchestrl.compute_sched.hardware import bundled_gpus, bundled_models, load_gpu, load_model

    for name in bundled_models():
        m = load_model(name)
        print(f"model {m.name:<18} {m.params_total / 1e9:7.1f}B total, {m.active_params / 1e9:5.1f}B active, "
              f"{m.layers} layers, KV {m.kv_bytes_per_token / 1024:.0f} KiB/token")
    for name in bundled_gpus():
        g = load_gpu(name)
        print(f"gpu   {g.name:<18} {g.hbm_bytes / 1e9:4.0f} GB, {g.hbm_bytes_per_s / 1e12:.2f} TB/s, "
              f"{g.bf16_flops / 1e12:.0f} TFLOPS bf16, NVLink {g.nvlink_bytes_per_s / 1e9:.0f} GB/s/dir")
    return 0
