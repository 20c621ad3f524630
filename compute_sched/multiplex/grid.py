"""JigsawRL's slowdown model ``s(k_A, k_B, sigma_A, Mem_A)`` (§4.2): grid files and their interpolation.

Design note
-----------
A grid file (format ``"orchestrl slowdown grid v1"``) is a list of points, each recording where it
came from (``source``): a sub-stage ``a`` alone on a share of the SMs or at a memory level, or
co-located with ``b`` on the remaining SMs. The measured H100 grid
(``compute_sched/data/slowdown/``, written by ``bench/gpu_slowdown_profile.py``) and the modelled one
(:mod:`compute_sched.multiplex.interference`) share the format, so either loads here.

The paper profiles a sparse grid and interpolates (“configurations with similar (sigma_A, Mem_A)
exhibit similar slowdown behavior”). :class:`SlowdownModel` does that:

* alone: piecewise-linear in the SM share (through ``(1.0, 1.0)``), times the memory curve;
* in a pair: piecewise-linear in ``sigma_A`` over the pair's points, clamped at the measured ends
  (a pair's SM shares never reach 0 or 1: the co-runner needs some); where the pair was measured at
  one memory level only (the H100 grid: 80%), the memory effect is the kind's own memory curve
  relative to that level (separable); where several levels exist, linear between them;
* ``idle`` (a tool call, a wait) uses no SMs: a sub-stage next to it runs as if alone.

Kinds a grid lacks are answered through ``aliases`` (the H100 grid has no ``reference``: a
forward pass at large token counts, profiled as ``prefill``); a kind with neither is refused when
the grid is loaded. ``scale`` stretches every slowdown's excess (``1 + scale (s - 1)``) for the
±25% sensitivity runs. Lookups are cached: the scheduler asks the same few points many times.
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["FORMAT", "KINDS", "IDLE", "SM_BUDGETS_PCT", "MEM_LEVELS_PCT", "MEMORY_BUDGET_PCT", "DEFAULT_ALIASES", "GridPoint",
           "SlowdownGrid", "SlowdownModel", "load_grid", "DATA_DIR"]

FORMAT = "orchestrl slowdown grid v1"
#: Sub-stage types the scheduler uses (JigsawRL §4.1: rollout split by tokens per forward step).
KINDS = ("train", "reference", "prefill", "decode_large", "decode_small")
IDLE = "idle"  # a sub-stage that uses no SMs: tool calls, environment waits
SM_BUDGETS_PCT = (25, 50, 75, 100)  # §4.2: four SM budgets
MEM_LEVELS_PCT = (20, 40, 60, 80)  # §4.2: four memory levels
MEMORY_BUDGET_PCT = 100.0  # levels are percentages of the GPU's memory budget; two must fit in it
DEFAULT_ALIASES = {"reference": "prefill"}  # a kind a grid may lack -> the profiled kind that stands for it
DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "slowdown"


@dataclass(frozen=True)
class GridPoint:
    """One profiled (or modelled) point: ``a``'s time over its time alone on the whole GPU at 80% memory."""

    a: str
    b: str | None  # co-runner on the other SMs; None: alone
    sm_a_frac: float  # a's share of the SMs
    mem_a_pct: float  # a's memory level (percent of the GPU's memory budget)
    slowdown: float
    source: str  # where the number came from (GPU and date, or the model and its fit)
    b_slowdown: float | None = None  # the co-runner's own slowdown in the same run, if recorded


@dataclass(frozen=True)
class SlowdownGrid:
    """A grid file's content: its points and what it describes."""

    name: str
    gpu: str
    points: tuple[GridPoint, ...]
    meta: Mapping[str, object] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ALIASES))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({p.a for p in self.points}))

    def to_json(self) -> dict:
        """Return the grid as a format-v1 document (what :func:`load_grid` reads)."""
        pts = []
        for p in self.points:
            d = {k: v for k, v in asdict(p).items() if v is not None or k == "b"}
            d["sm_a_pct"] = 100 * d.pop("sm_a_frac")  # unrounded: a saved grid reloads to the same numbers
            pts.append(d)
        return {"format": FORMAT, "name": self.name, "gpu": self.gpu, **dict(self.meta),
                "aliases": dict(self.aliases), "points": pts}

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _num(src: str, fld: str, v: object, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ConfigError(src, fld, f"{v!r} is not a number in [{lo:g}, {hi:g}]", f"a number in [{lo:g}, {hi:g}]")
    return float(v)


def load_grid(path: str | os.PathLike[str]) -> SlowdownGrid:
    """Return the grid in ``path`` (format v1), refusing a malformed file with the field that is wrong.

    A point gives its SM share as ``sm_a`` (SMs) with the file's ``sm_count``, or as ``sm_a_pct``.

    >>> g = load_grid(DATA_DIR / "h100-green-context-2026-11-27.json")
    >>> g.gpu, len(g.points), g.kinds
    ('NVIDIA H100 80GB HBM3', 70, ('decode_large', 'decode_small', 'prefill', 'train'))
    """
    src = os.fspath(path)
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(src, "<file>", f"cannot be read: {exc.strerror or exc}", "a readable grid file") from None
    except ValueError as exc:
        raise ConfigError(src, "<file>", f"is not JSON: {exc}", f"a JSON document of format {FORMAT!r}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(src, "format", f"is {got!r}", repr(FORMAT))
    pts = doc.get("points")
    if not isinstance(pts, list) or not pts:
        raise ConfigError(src, "points", "is missing or empty", "a list of grid points")
    sm_count = doc.get("sm_count")
    if sm_count is not None:
        sm_count = _num(src, "sm_count", sm_count, 1, 1e5)
    file_source = doc.get("source")
    if file_source is not None and (not isinstance(file_source, str) or not file_source.strip()):
        raise ConfigError(src, "source", f"{file_source!r} is not a description",
                          "a string saying where the points came from (GPU and date, or the model)")
    known = KINDS + (IDLE,)
    points = []
    for i, p in enumerate(pts):
        f = f"points[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(src, f, f"is {type(p).__name__}", "an object")
        a, b = p.get("a"), p.get("b")
        if a not in known:  # a mistyped kind would load and never be used
            raise ConfigError(src, f"{f}.a", f"{a!r} is not a sub-stage kind", ", ".join(known))
        if b is not None and b not in known:
            raise ConfigError(src, f"{f}.b", f"{b!r} is not a sub-stage kind", "null (alone) or one of " + ", ".join(known))
        if "sm_a" in p:
            if sm_count is None:
                raise ConfigError(src, "sm_count", f"is missing, and {f}.sm_a gives SMs",
                                  "the GPU's SM count at the top level (132 on an H100), or sm_a_pct per point")
            frac = _num(src, f"{f}.sm_a", p["sm_a"], 1, sm_count) / sm_count
        else:
            frac = _num(src, f"{f}.sm_a_pct", p.get("sm_a_pct"), 1, 100) / 100.0
        mem = _num(src, f"{f}.mem_a_pct", p.get("mem_a_pct", 80), 1, 100)
        s = _num(src, f"{f}.slowdown", p.get("slowdown"), 0.05, 1e3)
        bs = p.get("b_slowdown")
        bs = None if bs is None else _num(src, f"{f}.b_slowdown", bs, 0.05, 1e3)
        source = p.get("source", file_source)
        if not isinstance(source, str) or not source.strip():  # the grid's provenance is per point
            raise ConfigError(src, f"{f}.source", "is missing" if source is None else f"{source!r} is not a description",
                              "where the point came from (GPU and date, or the model and its fit), per point or once "
                              "as the file's 'source'")
        points.append(GridPoint(a, b, frac, mem, s, source, bs))
    meta = {k: v for k, v in doc.items() if k not in ("format", "points", "aliases", "name", "gpu")}
    aliases = doc.get("aliases", DEFAULT_ALIASES)
    if not isinstance(aliases, dict):
        raise ConfigError(src, "aliases", f"is {type(aliases).__name__}", "an object kind -> kind")
    grid = SlowdownGrid(str(doc.get("name", Path(src).stem)), str(doc.get("gpu", "?")), tuple(points), meta,
                        {**DEFAULT_ALIASES, **aliases})
    SlowdownModel(grid, source=src)  # refuse a grid that cannot answer every kind now, not mid-run
    return grid


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through sorted ``xs``, constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _curve(pairs: Iterable[tuple[float, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    d: dict[float, list[float]] = {}
    for x, y in pairs:
        d.setdefault(round(x, 6), []).append(y)
    xs = sorted(d)
    return tuple(xs), tuple(sum(d[x]) / len(d[x]) for x in xs)


class SlowdownModel:
    """Interpolated ``s(a, b, sigma_a, mem_a)`` over a :class:`SlowdownGrid` (see the module note).

    Examples
    --------
    >>> m = SlowdownModel(load_grid(DATA_DIR / "h100-green-context-2026-11-27.json"))
    >>> round(m.s("train", None, 1.0, 80), 3), round(m.s("train", "decode_small", 0.5, 80), 2)
    (1.0, 2.83)
    >>> m.s("decode_small", "idle", 0.25, 80)  # the co-runner is idle: alone on the whole GPU
    1.0
    """

    def __init__(self, grid: SlowdownGrid, scale: float = 1.0, source: str | None = None) -> None:
        if not scale >= 0:
            raise ConfigError("SlowdownModel", "scale", f"{scale!r}", "a factor >= 0 on each slowdown's excess")
        self.grid, self.scale = grid, float(scale)
        src = source or grid.name
        alone_sm: dict[str, list[tuple[float, float]]] = {}
        alone_mem: dict[str, list[tuple[float, float]]] = {}
        pair: dict[tuple[str, str], dict[float, list[tuple[float, float]]]] = {}
        for p in grid.points:
            if p.b is None:
                if abs(p.sm_a_frac - 1.0) < 1e-9:
                    alone_mem.setdefault(p.a, []).append((p.mem_a_pct, p.slowdown))
                if abs(p.mem_a_pct - 80.0) < 1e-9:
                    alone_sm.setdefault(p.a, []).append((p.sm_a_frac, p.slowdown))
            else:
                pair.setdefault((p.a, p.b), {}).setdefault(p.mem_a_pct, []).append((p.sm_a_frac, p.slowdown))
        self._alone_sm = {k: _curve(v + [(1.0, 1.0)]) for k, v in alone_sm.items()}
        self._alone_mem = {k: _curve(v + [(80.0, 1.0)]) for k, v in alone_mem.items()}
        self._pair = {k: {m: _curve(v) for m, v in levels.items()} for k, levels in pair.items()}
        self.aliases = dict(grid.aliases)
        self._known = frozenset(KINDS) | {IDLE} | set(self._alone_sm) | set(self.aliases)
        have = set(self._alone_sm)
        for k in KINDS:
            kk = self._kind(k)
            if kk not in have:
                raise ConfigError(src, "points", f"grid has no points for sub-stage {k!r}"
                                  + (f" (nor its alias {kk!r})" if kk != k else ""),
                                  f"points alone for every kind of {', '.join(KINDS)}, or an alias in 'aliases'")
            for o in KINDS:
                if (kk, self._kind(o)) not in self._pair:
                    raise ConfigError(src, "points", f"grid has no pair points for {kk!r} next to {self._kind(o)!r}",
                                      "a point for every ordered pair of profiled kinds")
        self.s = lru_cache(maxsize=65536)(self._s)  # type: ignore[method-assign]

    def _kind(self, k: str) -> str:
        return k if k in self._alone_sm else self.aliases.get(k, k)

    def memory_factor(self, a: str, mem_pct: float, ref_pct: float = 80.0) -> float:
        """``a``'s slowdown at ``mem_pct`` relative to ``ref_pct`` (1.0 where the grid has no memory points)."""
        c = self._alone_mem.get(self._kind(a))
        if c is None:
            return 1.0
        return _interp(*c, mem_pct) / _interp(*c, ref_pct)

    def alone(self, a: str, sm_frac: float = 1.0, mem_pct: float = 80.0) -> float:
        """Slowdown of ``a`` alone on ``sm_frac`` of the SMs at ``mem_pct`` against the whole GPU at 80%."""
        return self.s(a, None, sm_frac, mem_pct)

    def _s(self, a: str, b: str | None, sm_a_frac: float, mem_a_pct: float = 80.0) -> float:
        # checked on a cache miss only (the scheduler asks the same few points many times)
        for fld, k in (("a", a), ("b", b)):
            if k not in self._known and not (fld == "b" and k is None):
                raise ConfigError("slowdown model", fld, f"{k!r} is not a sub-stage kind",
                                  ", ".join(KINDS + (IDLE,)) + ("" if fld == "a" else " (or None: alone)"))
        if isinstance(sm_a_frac, bool) or not isinstance(sm_a_frac, numbers.Real) or not 0 < sm_a_frac <= 1:
            raise ConfigError("slowdown model", "sm_a_frac", f"{sm_a_frac!r}",
                              "a share of the SMs in (0, 1], e.g. 0.25 (not 25)")
        if isinstance(mem_a_pct, bool) or not isinstance(mem_a_pct, numbers.Real) or not 0 <= mem_a_pct <= 100:
            raise ConfigError("slowdown model", "mem_a_pct", f"{mem_a_pct!r}",
                              "a memory level in percent of the GPU's budget, in [0, 100], e.g. 40 (not 0.4)")
        if a == IDLE:
            return 1.0
        ka = self._kind(a)
        if b is None or b == IDLE:
            sm = 1.0 if b == IDLE else sm_a_frac
            raw = _interp(*self._alone_sm[ka], sm) * self.memory_factor(ka, mem_a_pct)
        else:
            levels = self._pair[(ka, self._kind(b))]
            ms = sorted(levels)
            if len(ms) == 1:
                raw = _interp(*levels[ms[0]], sm_a_frac) * self.memory_factor(ka, mem_a_pct, ms[0])
            else:
                vals = [_interp(*levels[m], sm_a_frac) for m in ms]
                raw = _interp(ms, vals, mem_a_pct)
        return 1.0 + self.scale * (raw - 1.0)

    def with_scale(self, scale: float) -> "SlowdownModel":
        """Return this model with every slowdown's excess multiplied by ``scale`` (sensitivity runs)."""
        return SlowdownModel(self.grid, scale)

    def pair(self, a: str, b: str, sm_a_frac: float, mem_a_pct: float = 80.0,
             other: "SlowdownModel | None" = None) -> tuple[float, float]:
        """Both slowdowns of ``a`` on ``sm_a_frac`` and ``b`` on the rest (memory split likewise); ``b``'s from
        ``other`` where it is another pipeline's sub-stage with a model of its own (default: this one)."""
        if isinstance(sm_a_frac, bool) or not isinstance(sm_a_frac, numbers.Real) or not 0 < sm_a_frac < 1:
            raise ConfigError("slowdown model", "sm_a_frac", f"{sm_a_frac!r}",
                              "a's share of the SMs in (0, 1): b runs on the rest")
        return self.s(a, b, sm_a_frac, mem_a_pct), (other or self).s(b, a, 1.0 - sm_a_frac,
                                                                         MEMORY_BUDGET_PCT - mem_a_pct)
