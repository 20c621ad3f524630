"""Figures of the RLSim experiments: a matplotlib PNG and, beside it, a CSV of every row behind it.

Design note
-----------
A plot is only as useful as the numbers a reader can re-plot, so every writer here takes the rows
behind the figure as plain dicts, writes them *all* to ``NAME.csv`` first (one column per key, in
first-seen order) and then draws ``NAME.png`` from the same rows. matplotlib is the optional ``sim``
extra (``pip install 'orchestrl[sim]'``): without it the CSV is still written and the result says
why the PNG is missing, so a sweep that ran for minutes is never lost to a missing plotting library.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["PlotFiles", "matplotlib_available", "check_output", "write_failure", "write_csv", "grouped_bars",
           "scatter_frontier", "pareto_frontier"]

MISSING_MATPLOTLIB = "matplotlib is not installed (pip install 'orchestrl[sim]'); wrote the CSV only"


@dataclass(frozen=True)
class PlotFiles:
    """What a writer produced: the CSV always, the PNG when matplotlib is installed."""

    csv: str
    png: str | None
    note: str | None = None  # why the PNG is missing, if it is


def matplotlib_available() -> bool:
    """Return whether matplotlib can be imported (the ``sim`` extra)."""
    return importlib.util.find_spec("matplotlib") is not None


def check_output(option: str, folder: str | os.PathLike[str], files: Sequence[str] = (), *,
                 given: str | None = None, example: str = "results") -> Path:
    """Return ``folder`` once it is a folder this process can write ``files`` into; refuse it otherwise.

    Run before a sweep or a simulation, so a bad output location costs seconds, not the run: the
    folder is created (with its parents) if missing, a temporary file is written and removed in it
    (the only test that sees read-only mounts, full quotas and root alike), and none of ``files`` may
    be an existing folder.

    Parameters
    ----------
    option : str
        The command-line option that named the location (``"--out"``, ``"--plot"``), for the message.
    folder : path
        Where the files go.
    files : sequence of str
        Names of the files that will be written in ``folder``.
    given : str, optional
        The option's value as the user typed it, when it is not ``folder`` itself (``--plot a/b.png``).
    example : str
        A value of ``option`` the fix suggests.

    Raises
    ------
    ConfigError
        Naming ``option``, the path and the fix, when the folder is an existing file, cannot be
        created or cannot be written, or a file to write is an existing folder.

    Examples
    --------
    >>> import tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "figs")
    >>> check_output("--out", d, ["fig13.csv"]).is_dir()
    True
    """
    path = Path(folder)
    head = f"{given!r}: " if given is not None else ""
    fix = f"a folder this user can write to (it is created if missing), e.g. {option} {example}"
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is" if existing == path else f"is inside {existing}, which is"
        raise ConfigError("command line", option, f"{head}the folder {str(folder)!r} {where} an existing file",
                          fix)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("command line", option, f"{head}cannot create the folder {str(folder)!r}: "
                          f"{exc.strerror or exc}", fix) from None
    try:
        tempfile.TemporaryFile(dir=path, prefix=".orchestrl-write-check-").close()  # created and removed: writable
    except OSError as exc:
        raise ConfigError("command line", option, f"{head}cannot write in the folder {str(folder)!r}: "
                          f"{exc.strerror or exc}", fix) from None
    for name in files:
        if (path / name).is_dir():
            raise ConfigError("command line", option, f"{head}{str(path / name)!r} is a folder, so {name} cannot "
                              "be written", f"another {option}, or move that folder away")
    return path


def write_failure(option: str, exc: OSError, files: Sequence[str]) -> str:
    """Return the message of an output that failed after the work was done (the results are printed).

    ``files`` are the paths the command meant to write; the message names the one that failed and
    says that every one of them may be missing or stale.
    """
    failed = exc.filename if exc.filename is not None else (files[0] if files else "?")
    return str(ConfigError("command line", option, f"could not write {failed} ({exc.strerror or exc}); "
                           f"not written (or incomplete): {', '.join(map(str, files))}",
                           "the results printed above are complete; free space or pick another "
                           f"{option} and run again to get the files"))


def write_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """Write ``rows`` to ``path`` with one column per key (first-seen order); return the path.

    Examples
    --------
    >>> import tempfile, os
    >>> p = write_csv(os.path.join(tempfile.mkdtemp(), "x.csv"), [{"a": 1}, {"a": 2, "b": "y"}])
    >>> open(p).read().splitlines()
    ['a,b', '1,', '2,y']
    """
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(v) for k, v in r.items()})
    return str(path)


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple, dict)):
        return repr(v)
    return v


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _paths(png_path: str | os.PathLike[str]) -> tuple[str, str]:
    png = str(png_path)
    return png, str(Path(png).with_suffix(".csv"))


def grouped_bars(png_path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], *, panel: str, group: str,
                 series: str, value: str, title: str, ylabel: str, reference: float | None = None,
                 ci: tuple[str, str] | None = None, paper: str | None = None) -> PlotFiles:
    """Write grouped bars (one panel per ``panel`` value, groups on x, one bar per ``series``) and the CSV.

    Parameters
    ----------
    png_path : path
        Where the PNG goes; the CSV goes beside it with the suffix ``.csv``.
    rows : sequence of dict
        Every row is written to the CSV; rows with a finite ``value`` are drawn.
    panel, group, series, value : str
        Keys of the rows: subplot, x group, bar colour and bar height.
    reference : float, optional
        Draw a dashed horizontal line here (e.g. 1.0 for "normalised to FT").
    ci : (str, str), optional
        Keys of each row's interval (low, high): drawn as error bars.
    paper : str, optional
        Key of the paper's value for the bar, drawn as a black marker where the paper gives one.
    """
    png, csv_path = _paths(png_path)
    write_csv(csv_path, rows)
    if not matplotlib_available():
        return PlotFiles(csv_path, None, MISSING_MATPLOTLIB)
    plt = _pyplot()
    panels = _unique(r[panel] for r in rows)
    names = _unique(r[series] for r in rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.0, 4.2 * len(panels)), 3.6), squeeze=False)
    width = 0.8 / max(1, len(names))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, p in zip(axes[0], panels):
        sub = [r for r in rows if r[panel] == p]
        groups = _unique(r[group] for r in sub)
        for k, name in enumerate(names):
            xs, ys, lo, hi, px, py = [], [], [], [], [], []
            for i, g in enumerate(groups):
                hit = [r for r in sub if r[group] == g and r[series] == name]
                x = i + (k - (len(names) - 1) / 2) * width
                if hit and _finite(hit[0][value]):
                    y = hit[0][value]
                    xs.append(x)
                    ys.append(y)
                    if ci is not None:
                        a, b = hit[0].get(ci[0]), hit[0].get(ci[1])
                        lo.append(max(0.0, y - a) if _finite(a) else 0.0)
                        hi.append(max(0.0, b - y) if _finite(b) else 0.0)
                    if paper is not None and _finite(hit[0].get(paper)):
                        px.append(x)
                        py.append(hit[0][paper])
                elif hit:  # a case without a number (e.g. a failed run): say so where its bar would be
                    ax.annotate("n/a", (x, 0), fontsize=6, rotation=90, ha="center", va="bottom")
            ax.bar(xs, ys, width, label=str(name), color=colours[k % len(colours)],
                   yerr=[lo, hi] if ci is not None and xs else None, capsize=2)
            if px:
                ax.scatter(px, py, marker="_", s=120, color="black", zorder=3)
        if reference is not None:
            ax.axhline(reference, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(groups)), [str(g) for g in groups])
        ax.set_title(str(p), fontsize=9)
        ax.set_ylabel(ylabel)
    from matplotlib.patches import Patch  # one legend entry per series, even where a panel drew none of its bars

    handles = [Patch(color=colours[k % len(colours)], label=str(n)) for k, n in enumerate(names)]
    if paper is not None:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="black", marker="_", linestyle="", markersize=10, label="paper"))
    if ci is not None:
        handles.append(Patch(color="white", label="bars: mean, 95% CI over seeds"))
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return PlotFiles(csv_path, png)


def pareto_frontier(points: Sequence[tuple[float, float]], rel_tol: float = 1e-4) -> list[int]:
    """Return the indices of the points no other point beats on both cost (lower) and performance (higher).

    Points are ``(cost, performance)``; the frontier is returned in order of increasing cost. Values
    within ``rel_tol`` of each other count as equal, so a point beats another only where it is
    better beyond that on one axis and no worse on the other: FT and RO in Figure 16 cost the same
    and differ in throughput by a few parts per million of simulation detail, and are both on it
    or both off it.

    Notes
    -----
    Every pair is compared: O(n^2) for n points (a figure has a few dozen).

    Examples
    --------
    >>> pareto_frontier([(1.0, 1.0), (2.0, 0.5), (3.0, 2.0), (0.5, 0.2)])
    [3, 0, 2]
    >>> pareto_frontier([(1.0, 1.0), (1.0, 1.000001), (2.0, 1.0)])
    [1, 0]
    """
    def close(a: float, b: float) -> bool:
        return abs(a - b) <= rel_tol * max(abs(a), abs(b))

    def beats(j: int, i: int) -> bool:
        (cj, pj), (ci, pi) = points[j], points[i]
        no_worse = (cj <= ci or close(cj, ci)) and (pj >= pi or close(pj, pi))
        return no_worse and not (close(cj, ci) and close(pj, pi))

    on = [i for i in range(len(points)) if not any(beats(j, i) for j in range(len(points)) if j != i)]
    return sorted(on, key=lambda i: (points[i][0], -points[i][1], i))


def scatter_frontier(png_path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]], *, x: str, y: str,
                     series: str, label: str, title: str, xlabel: str, ylabel: str,
                     frontier: Sequence[int] = ()) -> PlotFiles:
    """Write one marker line per ``series`` (points joined in row order) and the frontier; and the CSV.

    ``label`` is the key whose value annotates each marker (e.g. the link speed); ``frontier`` holds
    indices into ``rows`` drawn as a dashed step line.
    """
    png, csv_path = _paths(png_path)
    write_csv(csv_path, rows)
    if not matplotlib_available():
        return PlotFiles(csv_path, None, MISSING_MATPLOTLIB)
    if not any(_finite(r.get(x)) and _finite(r.get(y)) for r in rows):
        raise OSError(f"{png}: no point has both {x} and {y}; an empty plot is not written (see {csv_path})")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    for name in _unique(r[series] for r in rows):
        sub = [r for r in rows if r[series] == name and _finite(r.get(x)) and _finite(r.get(y))]
        line, = ax.plot([r[x] for r in sub], [r[y] for r in sub], marker="o", label=str(name))
        for r in sub:
            ax.annotate(str(r[label]), (r[x], r[y]), fontsize=6, xytext=(3, 3), textcoords="offset points",
                        color=line.get_color())
    if frontier:
        ax.step([rows[i][x] for i in frontier], [rows[i][y] for i in frontier], where="post", color="black",
                linestyle="--", linewidth=0.8, label="Pareto frontier")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a point
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return PlotFiles(csv_path, png)


def _unique(values: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and v == v and v not in (float("inf"), float("-inf"))
