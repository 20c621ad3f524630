"""Files behind a paper-comparison figure: a CSV of every row, and a PNG of paper vs ours when matplotlib is there.

Used by fig17, fig18 and fig22, with what they share: the command line (``figure_main``) and the
``sweep``/``run``/``main`` each exports (``SweepFigure``: a figure module names its cases, how one runs
and how rows come from results, and binds the three). The CSV writer and matplotlib set-up are
``sim/plot.py``'s. matplotlib is optional: without it the CSV is still written and the returned note
says why the PNG is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.experiments.common import (DEFAULT_SEEDS, QUICK_SEEDS, Row, aggregate_rows, figure_document,
                                              format_rows)
from orchestrl.sim.plot import _pyplot, check_output, matplotlib_available, write_csv, write_failure
from orchestrl.sim.sweep import check_ray_address, run_sweep

#: ``rows -> (xlabel, {series: [(x, y), ...]})``: what a figure plots as lines (fig22: time vs OCS delay).
Curves = Callable[[Sequence[Row]], "tuple[str, dict[str, list[tuple[float, float]]]]"]

__all__ = ["Curves", "FigureCli", "SweepFigure", "figure_main", "row_dicts", "sweep_cases", "write_rows",
           "rows_over_seeds", "with_seed"]


def row_dicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Return one flat dict per row: label, paper, ours, ratio, then every scalar detail."""
    out = []
    for r in rows:
        d = {"label": r.label, "paper": r.paper, "ours": r.ours, "ratio": r.ratio}
        d.update({k: v for k, v in r.detail.items() if isinstance(v, (int, float, str)) or v is None})
        out.append(d)
    return out


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return "" if v is None else v


def write_rows(name: str, rows: Sequence[Row], out_dir: str | os.PathLike[str], *, title: str, ylabel: str,
               log_y: bool = False, curves: "Curves | None" = None,
               band: "tuple[float, float, str] | None" = None) -> tuple[str, str | None, str | None]:
    """Write ``NAME.csv`` (every row) and ``NAME.png`` (ours beside the paper's value) into ``out_dir``.

    With ``curves`` the PNG is one line per series against a numeric x (log scale) instead of bars:
    ``curves(rows)`` returns ``(xlabel, {series: [(x, y), ...]})``.

    Returns
    -------
    (csv_path, png_path or None, note or None)
        ``note`` says why there is no PNG.
    """
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    csv_path = write_csv(os.path.join(out_dir, f"{name}.csv"),
                         [{k: _cell(v) for k, v in d.items()} for d in row_dicts(rows)])
    if not matplotlib_available():
        return csv_path, None, "matplotlib is not installed (pip install 'orchestrl[sim]'); wrote the CSV only"
    plt = _pyplot()
    png_path = os.path.join(out_dir, f"{name}.png")
    if curves is not None:
        xlabel, series = curves(rows)
        fig, ax = plt.subplots(figsize=(8.0, 4.0))
        ci = {(r.detail.get("delay_s"), r.ours): (r.detail.get("ci_low"), r.detail.get("ci_high")) for r in rows}
        for label, pts in series.items():
            pts = sorted(pts)
            lo = [max(0.0, y - (ci.get(p, (None, None))[0] if ci.get(p, (None, None))[0] is not None else y))
                  for p in pts for y in [p[1]]]
            hi = [max(0.0, (ci.get(p, (None, None))[1] if ci.get(p, (None, None))[1] is not None else y) - y)
                  for p in pts for y in [p[1]]]
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[lo, hi], marker="o", capsize=3, label=label)
        if band is not None:  # the paper's reported range
            ax.axhspan(band[0], band[1], color="grey", alpha=0.15, label=band[2])
        ax.set_xscale("symlog", linthresh=1e-5)
        ax.set_xlabel(xlabel)
    else:
        x = range(len(rows))
        fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.0))
        err = None
        if any("ci_low" in r.detail for r in rows):  # 95% intervals over seeds
            err = [[max(0.0, r.ours - r.detail.get("ci_low", r.ours)) for r in rows],
                   [max(0.0, r.detail.get("ci_high", r.ours) - r.ours) for r in rows]]
        seeds = max((int(r.detail.get("seeds", 1)) for r in rows), default=1)
        ax.bar([i - 0.2 for i in x], [r.ours for r in rows], width=0.4, yerr=err, capsize=3,
               label=f"ours (mean, 95% CI, {seeds} seeds)" if err else "ours")
        ax.bar([i + 0.2 for i in x], [r.paper if r.paper is not None else 0.0 for r in rows], width=0.4,
               label="paper (0 = no number)", alpha=0.6)
        ax.set_xticks(list(x))
        ax.set_xticklabels([r.label for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log_y:
        ax.set_yscale("log")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a bar
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return csv_path, png_path, None


def sweep_cases(run_case: Callable[[Any], dict[str, Any]], cases: Sequence[Any], workers: int | None = None,
                ray_address: str | None = None) -> list[dict[str, Any]]:
    """Run independent cases on a process pool, or on Ray with ``ray_address`` (``"local"`` starts one
    here); return the raw per-case results in case order."""
    backend = "ray" if ray_address else "pool"
    address = None if ray_address in (None, "local") else ray_address
    return run_sweep(run_case, cases, backend=backend, workers=workers, ray_address=address)


@dataclass(frozen=True)
class FigureCli:
    """What a sweep figure's command line needs: its name, texts, and how rows come from results."""

    name: str
    description: str
    quick_help: str
    plot_title: str
    ylabel: str
    heading: str
    unit: str
    notes: Sequence[str]
    results_key: str
    log_y: bool = False
    curves: "Curves | None" = None  # draw lines against a numeric x instead of bars (see write_rows)
    band: "tuple[float, float, str] | None" = None  # the paper's range, shaded (low, high, label)
    orderings: "Callable[[Sequence[Row]], list[str]] | None" = None  # claims, stated only where intervals separate


def figure_main(fig: FigureCli, sweep: Callable[..., list[dict[str, Any]]],
                rows_of: Callable[[list[dict[str, Any]]], list[Row]], argv: Sequence[str] | None = None) -> int:
    """``--quick/--json/--workers/--ray/--out`` for a sweep figure: run, print the table, write CSV (+ PNG).

    ``--workers``, ``--ray`` and the ``--out`` folder are checked before the sweep (exit status 2 with
    the option, the value and the fix). The table is printed before the files are written, so a write
    that still fails at the end (disk full, the folder removed meanwhile) loses no result: the error
    names what was not written and the exit status is 1.
    """
    ap = argparse.ArgumentParser(prog=f"orchestrl sim figure {fig.name}", description=fig.description)
    ap.add_argument("--quick", action="store_true", help=fig.quick_help)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=None, help="processes of the local pool (default: CPUs)")
    ap.add_argument("--ray", default=None, metavar="ADDRESS", help="run the cases on this Ray cluster ('local': here)")
    ap.add_argument("--out", default=".", metavar="DIR",
                    help=f"folder for {fig.name}.png and {fig.name}.csv (default: .)")
    ap.add_argument("--seeds", type=int, default=None, metavar="N",
                    help=f"trace seeds per case, reported as mean and 95%% interval (default {DEFAULT_SEEDS}; "
                         f"--quick: {QUICK_SEEDS})")
    args = ap.parse_args(argv)
    names = [f"{fig.name}.csv", f"{fig.name}.png"]
    try:
        if args.workers is not None and args.workers < 1:
            raise ConfigError("command line", "--workers", f"{args.workers} is not a number of processes", ">= 1")
        seeds = _seeds(args)
        check_ray_address(args.ray)
        check_output("--out", args.out, names)
    except ConfigError as exc:
        sys.stderr.write(f"orchestrl: error: {exc}\n")
        return 2
    results = sweep(args.quick, args.workers, args.ray, seeds)
    rows = rows_over_seeds(rows_of, results)
    notes = list(fig.notes) + (fig.orderings(rows) if fig.orderings is not None else [])
    if args.json:
        doc = figure_document(fig.name, rows, notes)
        doc[fig.results_key] = results
        print(json.dumps(doc, default=str))
    else:
        print(format_rows(fig.heading, rows, fig.unit, notes))
    sys.stdout.flush()  # the results are out before anything can go wrong writing the files
    try:
        csv_path, png_path, why = write_rows(fig.name, rows, args.out, title=fig.plot_title, ylabel=fig.ylabel,
                                             log_y=fig.log_y, curves=fig.curves, band=fig.band)
    except OSError as exc:
        paths = [os.path.join(args.out, n) for n in names]
        sys.stderr.write(f"orchestrl: error: {write_failure('--out', exc, paths)}\n")
        return 1
    sys.stderr.write(f"[{fig.name}] wrote {csv_path}" + (f" and {png_path}\n" if png_path else f"; {why}\n"))
    return 0


def _seeds(args: argparse.Namespace) -> int:
    n = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else DEFAULT_SEEDS)
    if not 1 <= n <= 100:
        raise ConfigError("command line", "--seeds", f"{n} seeds", "1 to 100")
    return n


def rows_over_seeds(rows_of: Callable[[list[dict[str, Any]]], list[Row]], results: list[dict[str, Any]]) -> list[Row]:
    """Rows of each seed's results (``result["seed"]``), aggregated into mean and 95% interval per label."""
    seeds = sorted({int(r.get("seed", 0)) for r in results})
    per_seed = [rows_of([r for r in results if int(r.get("seed", 0)) == s]) for s in seeds]
    return aggregate_rows(per_seed, seeds)


def with_seed(case: Any, seed: int) -> Any:
    """The case with its trace seed set (its ``seed`` field), so one case runs under several seeds."""
    import dataclasses

    if not dataclasses.is_dataclass(case) or "seed" not in {f.name for f in dataclasses.fields(case)}:
        raise ConfigError(type(case).__name__, "seed", "the case has no seed field", "a dataclass with seed: int")
    return dataclasses.replace(case, seed=seed)


def _run_seeded(run_case: Callable[[Any], dict[str, Any]], case: Any) -> dict[str, Any]:
    return {**run_case(case), "seed": int(case.seed)}


@dataclass(frozen=True)
class _Seeded:
    """A picklable ``case -> result`` that records the case's seed in its result."""

    run_case: Callable[[Any], dict[str, Any]]

    def __call__(self, case: Any) -> dict[str, Any]:
        return _run_seeded(self.run_case, case)


@dataclass(frozen=True)
class SweepFigure:
    """A sweep figure's whole: its command line, its cases, how one case runs and how rows come from results.

    A figure module exports the three entry points bound from it, e.g.
    ``sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main``, with the signatures below.
    """

    cli: FigureCli
    run_case: Callable[[Any], dict[str, Any]]  # module-level, so a process pool or Ray can pickle it
    cases: Callable[[bool], Sequence[Any]]  # quick -> the cases, in the order results come back
    rows_of: Callable[[list[dict[str, Any]]], list[Row]]

    def sweep(self, quick: bool = False, workers: int | None = None, ray_address: str | None = None,
              seeds: int = 1) -> list[dict[str, Any]]:
        """Run every case under ``seeds`` trace seeds (its own seed, then the next ones) on a process pool, or
        Ray with ``ray_address`` (``"local"`` starts one here); return the raw per-case results (each with
        its ``seed``), seed by seed in case order."""
        base = self.cases(quick)
        todo = [with_seed(c, int(c.seed) + k) for k in range(seeds) for c in base]
        return sweep_cases(_Seeded(self.run_case), todo, workers, ray_address)

    def run(self, quick: bool = False, workers: int | None = None, ray_address: str | None = None,
            seeds: int = 1) -> list[Row]:
        """Run every case (process pool, or Ray with ``ray_address``) and return the figure's rows (mean and 95%
        interval over ``seeds`` seeds)."""
        return rows_over_seeds(self.rows_of, self.sweep(quick, workers, ray_address, seeds))

    def main(self, argv: Sequence[str] | None = None) -> int:
        """The figure's command line (:func:`figure_main`); return the exit status."""
        return figure_main(self.cli, self.sweep, self.rows_of, argv)
