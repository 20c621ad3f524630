"""OrchestrRL §7.2.1, Figure 13: end-to-end RL throughput on the six fabrics, normalised to FT.

Each case is one RL run through ``orchestrl sim run``'s code (:func:`sim.run.build`: the training,
generation and weight-sync stage models, the real fabric controller on RFabric, the one-step asynchronous loop) on
one fabric at one scale. The models are the paper's: Qwen2.5-72B (TP8 PP2 CP3) and Qwen2-57B-A14B
(TP4 EP16), from the bundled ``examples/sim/fig13-*.yaml``; MoE generation runs in AFD mode
(instances of 3x8 attention and 2x8 FFN GPUs, the shape of §7.3.2 and Figure 14's "Gen (AFD
mode)"), the dense model under OrchestrRL's scheduler. Steps hold 16 responses per generation GPU
(App. F), so the work scales with the cluster.

**Train/Gen split.** §7.2: "With a given budget, we allocate the number of GPUs to Train and Gen
following [67]" (StreamRL). The sweep runs in two phases: first FT, the reference, picks the split
of each (model, scale, link speed) -- every candidate of :func:`sim.workload.split_candidates` in whole
RFabric PoDs is profiled with the run's stages on step 0 and the one with the highest
``samples per step / max(T_gen, T_train)`` wins -- then every other fabric runs on that split, so
the fabrics differ only in their network. (``sim.run.balanced_split`` picks the shortest period,
which with steps scaled to the generation GPUs favours the smallest generation cluster; see
docs/sim-loop.md. Letting each fabric profile its own split costs five stage runs per case and
TopoOpt's at 2,048 GPUs alone took over 2 CPU minutes; ``RLCase(train_gpus=None)`` does it for
one case.)

Paper (text of §7.2.1; the figure's bars are not given as numbers): RFabric ~ FT ~ RO; MixNet
~0.81x; TopoOpt 0.47-0.76x, worse on MoE; FT-OS clearly lower (no number).

Run ``python -m orchestrl.sim.experiments.fig13 [--quick] [--json] [--workers N] [--ray ADDRESS] [--out DIR]``.
This module also holds the RL-run cases Figures 14 and 16 sweep (:class:`RLCase`, :func:`run_case`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.config import RunConfig, load_run_config, validate
from orchestrl.sim.experiments.common import DEFAULT_SEEDS, QUICK_SEEDS, Row, figure_document, format_rows
from orchestrl.sim.network.config import FABRICS
from orchestrl.sim.plot import PlotFiles, check_output, grouped_bars, write_failure
from orchestrl.sim.run import Simulation, _pod_gpus, balanced_split, build, default_stages
from orchestrl.sim.stages.generation import GenerationStage
from orchestrl.sim.sweep import check_ray_address, run_sweep
from orchestrl.sim.workload import split_candidates

__all__ = ["RLCase", "MODELS", "AFD_INSTANCE", "case_config", "run_case", "sweep", "run", "rows_of",
           "add_sweep_options", "sweep_options", "figure_main", "cases", "plot", "main"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
MODELS = {"72b": "fig13-qwen72b-2048.yaml", "57b-moe": "fig13-qwen57b-moe-2048.yaml"}
AFD_INSTANCE = "afd24:16-tp8"  # §7.3.2: 3x8 attention GPUs and 2x8 FFN GPUs per instance
QUICK_WORKLOAD = {"responses_per_gen_gpu": 4, "max_tokens": 4096}  # --quick: short steps, same code path

#: §7.2.1 as numbers: fabric -> its throughput relative to FT ("~ FT" read as 1.0; None: no number).
PAPER_VS_FT = {"ft-os": None, "ro": 1.0, "topoopt": None, "mixnet": 0.81, "rfabric": 1.0}
TOPOOPT_RANGE = (0.47, 0.76)


@dataclass(frozen=True)
class RLCase:
    """One RL run of a sweep: a bundled model config on one fabric, scale and link speed."""

    model: str  # a key of MODELS
    gpus: int
    fabric: str
    link_gbps: int = 200
    train_gpus: int | None = None  # None: the throughput-best split of the candidates (module note)
    quick: bool = False  # short steps (QUICK_WORKLOAD)
    iterations: int = 2  # two iterations give one steady-state window of the asynchronous loop
    seed: int = 0  # the run's trace seed (loop.seed)


def case_config(case: RLCase) -> RunConfig:
    """Return the validated run file of a case (the bundled example with the case's changes)."""
    if case.model not in MODELS:
        raise ConfigError("RLCase", "model", f"unknown model {case.model!r}", ", ".join(MODELS))
    base = load_run_config(EXAMPLES / MODELS[case.model])
    work = replace(base.workload, **QUICK_WORKLOAD) if case.quick else base.workload
    cfg = replace(base, name=f"{case.model}-{case.gpus}-{case.fabric}-{case.link_gbps}g",
                  cluster=replace(base.cluster, gpus=case.gpus, train_gpus=case.train_gpus),
                  fabric=replace(base.fabric, kind=case.fabric, link_gbps=case.link_gbps), workload=work,
                  loop=replace(base.loop, iterations=case.iterations, seed=case.seed))
    return validate(cfg)


def _stages(sim: Simulation):
    """The run's stage models; MoE generation as static AFD instances (Figure 14's Gen mode)."""
    st = default_stages(sim)
    if sim.model.is_moe:
        st.gen = GenerationStage(sim.model, sim.gen_gpus, sim.gpu, sim.net, sim.driver, policy="static",
                                 instance=AFD_INSTANCE, job=sim.config.loop.job)
    return st


def _candidates(cfg: RunConfig) -> list[int]:
    t = cfg.train
    unit = math.lcm(t.tp * t.cp * t.pp, t.tp * t.ep * t.pp)
    pod = _pod_gpus(replace(cfg, fabric=replace(cfg.fabric, kind="rfabric")))  # same sizes on every fabric
    return split_candidates(cfg.cluster.gpus, unit, pod)


def _best_split(cfg: RunConfig) -> tuple[int, list[dict[str, float]]]:
    """Return the candidate with the most samples per step period, and every candidate's profile."""
    cands = _candidates(cfg)
    if not cands:
        raise ConfigError(cfg.source, "cluster.gpus", f"{cfg.cluster.gpus} GPUs leave no split in whole PoDs "
                          "for the training layout", "more GPUs (72B: >= 1024, 57B MoE: >= 512)")
    if len(cands) == 1:
        return cands[0], []
    return balanced_split(cfg, _stages, cands)


def run_case(case: RLCase) -> dict[str, Any]:
    """Run one case; return its throughput, stage times, split and cost as a JSON-ready dict.

    A case whose simulation raises comes back as a result with ``error`` (the exception's type and
    message) and NaN numbers, so one failing stage model does not throw away the rest of a sweep;
    the figure's table shows it as ``nan`` and its notes name it.
    """
    t0 = time.perf_counter()
    try:
        return _run_case(case, t0)
    except Exception as exc:  # reported in the result and the figure's notes, never dropped
        nan = float("nan")
        return {**asdict(case), "error": f"{type(exc).__name__}: {exc}", "gen_gpus": 0, "samples_per_s": nan,
                "tokens_per_s": nan, "gen_s": nan, "train_s": nan, "sync_s": nan, "gen_layout": "",
                "network_usd": nan, "network_relative_to_ft": nan, "usd_per_h": nan, "samples_per_usd": nan,
                "split_profile": [], "wall_s": time.perf_counter() - t0}


def _run_case(case: RLCase, t0: float) -> dict[str, Any]:
    cfg = case_config(case)
    profile: list[dict[str, float]] = []
    n_train = case.train_gpus
    if n_train is None:
        n_train, profile = _best_split(cfg)
    sim = build(cfg, train_gpus=n_train, stages_factory=_stages)
    res = sim.run()
    stages = res.stage_means_s()
    gen = res.iterations[-1].gen
    return {**asdict(case), "train_gpus": n_train, "gen_gpus": len(sim.gen_gpus),
            "samples_per_s": res.throughput.samples_per_s, "tokens_per_s": res.throughput.tokens_per_s,
            "gen_s": stages["gen"], "train_s": stages["train"], "sync_s": stages["weight-sync"],
            "gen_layout": gen.detail.get("final_layout", ""), "network_usd": res.cost.network_usd,
            "network_relative_to_ft": res.cost.network_relative_to_ft, "usd_per_h": res.cost.usd_per_h,
            "samples_per_usd": res.samples_per_usd, "split_profile": profile, "wall_s": time.perf_counter() - t0}


def _group(c: RLCase) -> tuple:
    return (c.model, c.gpus, c.link_gbps, c.quick, c.iterations, c.seed)


def sweep(cases: Sequence[RLCase], *, workers: int | None = None, ray_address: str | None = None,
          label: str = "sim") -> list[dict[str, Any]]:
    """Run ``cases`` on the sweep backend (process pool, or Ray at ``ray_address``), in case order.

    Cases without a split (``train_gpus=None``) take FT's: the FT case of their (model, scale, speed)
    runs first and picks it (module note), then the others run on it in one parallel batch. Progress
    goes to stderr.
    """
    t0 = time.perf_counter()
    backend = "ray" if ray_address else "pool"
    address = None if ray_address in (None, "local") else ray_address

    def batch(todo: list[RLCase], phase: str) -> list[dict[str, Any]]:
        def progress(done: int, total: int) -> None:
            sys.stderr.write(f"[{label}] {phase}: {done}/{total} cases ({time.perf_counter() - t0:.0f} s)\n")
            sys.stderr.flush()
        return run_sweep(run_case, todo, backend=backend, workers=workers, ray_address=address, progress=progress)

    cases = list(cases)
    need = {_group(c) for c in cases if c.train_gpus is None}
    first = [RLCase(g[0], g[1], "ft", g[2], None, g[3], g[4], g[5]) for g in sorted(need)]
    done = dict(zip(first, batch(first, "FT picks the splits"))) if first else {}
    split = {_group(c): r["train_gpus"] for c, r in done.items() if r["train_gpus"] is not None}
    for c, r in done.items():
        if r["train_gpus"] is None:
            raise ConfigError(label, "train_gpus", f"FT could not pick the split of {c}: {r.get('error')}",
                              "a case with train_gpus set")
    todo = [replace(c, train_gpus=split[_group(c)]) if c.train_gpus is None else c for c in cases]
    rest = [c for c, orig in zip(todo, cases) if orig not in done]
    # the phase says what runs: FT's split, unless some cases brought their own
    own = any(orig.train_gpus is not None for orig in cases if orig not in done)
    phase = "the other cases (FT's split where none is set)" if own else "every fabric on FT's split"
    got = dict(zip(rest, batch(rest, phase))) if rest else {}
    out = []
    for orig, c in zip(cases, todo):
        r = dict(done[orig]) if orig in done else dict(got[c])
        r["split_by"] = "ft" if orig.train_gpus is None else "fixed"
        out.append(r)
    return out


def cases(quick: bool = False) -> list[RLCase]:
    """Return the sweep: full = 57B MoE at 512/1,024/2,048 and 72B at 1,024/2,048 GPUs; quick = 57B at 512."""
    scales = {"57b-moe": (512,), "72b": ()} if quick else {"57b-moe": (512, 1024, 2048), "72b": (1024, 2048)}
    return [RLCase(m, n, f, quick=quick) for m, ns in scales.items() for n in ns for f in FABRICS]


def rows_of(results: Sequence[dict[str, Any]]) -> list[Row]:
    """Return one row per (model, scale, fabric) -- throughput over FT's -- and the paper's summary rows."""
    ft = {(r["model"], r["gpus"], r["link_gbps"]): r["samples_per_s"] for r in results if r["fabric"] == "ft"}
    rows: list[Row] = []
    by_fabric: dict[str, list[float]] = {}
    for r in results:
        if r["fabric"] == "ft":
            continue
        base = ft.get((r["model"], r["gpus"], r["link_gbps"]))
        ratio = r["samples_per_s"] / base if base else float("nan")
        r["vs_ft"] = ratio
        by_fabric.setdefault(r["fabric"], []).append(ratio)
        rows.append(Row(f"{r['model']}/{r['gpus']}/{r['fabric']}/ft", PAPER_VS_FT[r["fabric"]], ratio,
                        {"train_gpus": r["train_gpus"], "samples_per_s": r["samples_per_s"]}))
    for fabric, vals in by_fabric.items():
        ok = [v for v in vals if math.isfinite(v)]
        if not ok:
            continue
        if fabric == "topoopt":
            rows.append(Row("topoopt/ft min", TOPOOPT_RANGE[0], min(ok)))
            rows.append(Row("topoopt/ft max", TOPOOPT_RANGE[1], max(ok)))
        else:
            rows.append(Row(f"{fabric}/ft mean", PAPER_VS_FT[fabric], math.exp(sum(map(math.log, ok)) / len(ok))))
    return rows


NOTES = ("ours: steady-state samples/s of the one-step asynchronous loop over FT's at the same model and scale; "
         "every fabric on FT's throughput-best Train/Gen split",
         "paper: §7.2.1 text ('~ FT' read as 1.0; TopoOpt's 0.47-0.76 compared with our min and max); "
         "FT-OS has no number in the text")


def seeded(cases_: Sequence[RLCase], seeds: int) -> list[RLCase]:
    """Every case under ``seeds`` trace seeds (its own, then the next ones), seed by seed."""
    return [replace(c, seed=c.seed + k) for k in range(seeds) for c in cases_]


def seed_rows(rows_of_fn: Callable[[Sequence[dict[str, Any]]], list[Row]], results: Sequence[dict[str, Any]]
              ) -> list[Row]:
    """The figure's rows per seed, then mean and 95% interval per label (sim/experiments/common.py)."""
    from orchestrl.sim.experiments.rowsplot import rows_over_seeds

    return rows_over_seeds(lambda rs: rows_of_fn(rs), list(results))


def mean_over_seeds(results: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One result per case (``keys``): numbers averaged over its seeds, with ``<name>_ci_low/high``; the rest
    from its first seed."""
    from orchestrl.sim.experiments.common import mean_ci

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for rs in groups.values():
        row = dict(rs[0])
        for k, v in rs[0].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keys and k != "seed":
                m, lo, hi = mean_ci([r.get(k) for r in rs])
                row[k], row[f"{k}_ci_low"], row[f"{k}_ci_high"] = m, lo, hi
        row["seeds"] = len(rs)
        out.append(row)
    return out


def run(quick: bool = False, workers: int | None = None, ray_address: str | None = None, seeds: int = 1
        ) -> tuple[list[Row], list[dict[str, Any]]]:
    """Return the figure's rows (mean and 95% interval over ``seeds`` trace seeds) and the per-case results."""
    results = sweep(seeded(cases(quick), seeds), workers=workers, ray_address=ray_address, label="fig13")
    return seed_rows(rows_of, results), results


def plot(results: Sequence[dict[str, Any]], out_dir: str) -> PlotFiles:
    """Write fig13.png (throughput over FT, one panel per model; mean and 95% interval over seeds, the paper's
    values as markers) and fig13.csv (every case, averaged over its seeds)."""
    for r in results:
        r.setdefault("vs_ft", 1.0)
    mean = mean_over_seeds(results, ("model", "gpus", "fabric", "link_gbps"))
    rows = [{k: v for k, v in r.items() if k != "split_profile"} | {"paper_vs_ft": PAPER_VS_FT.get(r["fabric"])}
            for r in mean]
    return grouped_bars(Path(out_dir) / "fig13.png", rows, panel="model", group="gpus", series="fabric",
                        value="vs_ft", title="Figure 13: RL throughput normalised to FT", ylabel="throughput / FT",
                        reference=1.0, ci=("vs_ft_ci_low", "vs_ft_ci_high"), paper="paper_vs_ft")


# ------------------------------------------------------------------ command line (shared by fig14, fig16)


def add_sweep_options(ap: argparse.ArgumentParser) -> None:
    """Add ``--quick --json --workers --ray --out`` to a figure's parser."""
    ap.add_argument("--quick", action="store_true", help="reduced sweep (under a minute on 2 cores)")
    ap.add_argument("--json", action="store_true", help='print {"figure", "rows": [{"label", "paper", "ours", '
                                                         '"ratio", ...}], "notes"}')
    ap.add_argument("--workers", type=int, metavar="N", help="processes of the local pool (default: CPU count)")
    ap.add_argument("--ray", metavar="ADDRESS", help="run the cases as Ray tasks on the cluster at ADDRESS "
                                                     "('local' starts a local Ray instance)")
    ap.add_argument("--out", default=".", metavar="DIR", help="folder for NAME.png and NAME.csv (default: .)")
    ap.add_argument("--seeds", type=int, default=None, metavar="N",
                    help=f"trace seeds per case, reported as mean and 95%% interval (default {DEFAULT_SEEDS}; --quick: "
                         f"{QUICK_SEEDS})")


def sweep_options(args: argparse.Namespace) -> dict[str, Any]:
    """Return run()'s keyword arguments from parsed options; refuse bad ones with a ConfigError.

    ``--ray HOST:PORT`` is probed here (:func:`sim.sweep.check_ray_address`), before any case runs.
    """
    if args.workers is not None and args.workers < 1:
        raise ConfigError("command line", "--workers", f"{args.workers} is not a number of processes", ">= 1")
    if args.ray is not None and args.workers is not None:
        raise ConfigError("command line", "--workers", "sizes the local pool, not a Ray cluster", "--workers or --ray")
    check_ray_address(args.ray)
    seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    if not 1 <= seeds <= 100:
        raise ConfigError("command line", "--seeds", f"{seeds} seeds", "1 to 100")
    return {"quick": args.quick, "workers": args.workers, "ray_address": args.ray, "seeds": seeds}


def figure_main(name: str, title: str, unit: str, notes: Sequence[str], run_fn: Callable[..., tuple],
                plot_fn: Callable[[Sequence[dict[str, Any]], str], PlotFiles], argv=None, doc: str = "") -> int:
    """Parse the options, run the sweep, print the table (or JSON), then write the PNG and CSV.

    The options and the output folder are checked before the sweep (exit status 2 with the option,
    the path and the fix). The table is printed before the files are written, so a write that still
    fails at the end (disk full, the folder removed meanwhile) loses no result: the error names what
    was not written and the exit status is 1.
    """
    ap = argparse.ArgumentParser(prog=f"orchestrl sim figure {name}", description=(doc or title).splitlines()[0])
    add_sweep_options(ap)
    args = ap.parse_args(argv)
    names = [f"{name}.png", f"{name}.csv"]
    try:
        kwargs = sweep_options(args)
        check_output("--out", args.out, names)
        rows, results = run_fn(**kwargs)
    except ConfigError as exc:
        sys.stderr.write(f"orchestrl: error: {exc}\n")
        return 2
    notes = list(notes) + [f"FAILED {r['model']}/{r['gpus']}/{r['fabric']}@{r['link_gbps']}G: {r['error']}"
                           for r in results if r.get("error")]
    if args.json:
        print(json.dumps(figure_document(name, rows, notes)))
    else:
        print(format_rows(title, rows, unit, notes))
    sys.stdout.flush()  # the results are out before anything can go wrong writing the files
    try:
        files = plot_fn(results, args.out)
    except OSError as exc:
        sys.stderr.write(f"orchestrl: error: {write_failure('--out', exc, [str(Path(args.out) / n) for n in names])}\n")
        return 1
    wrote = " and ".join(p for p in (files.png, files.csv) if p)
    sys.stderr.write(f"[{name}] wrote {wrote}\n" + (f"[{name}] {files.note}\n" if files.note else ""))
    return 0


def main(argv=None) -> int:
    return figure_main("fig13", "Figure 13: end-to-end RL throughput relative to FT", "x FT", NOTES, run, plot,
                       argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
