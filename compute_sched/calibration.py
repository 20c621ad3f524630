"""Fit the performance model's engine constants to measured times; validate out of sample; store, find, load.

Design note
-----------
:class:`compute_sched.perf.Calibration` holds what datasheets do not give (achieved bandwidths,
host overheads, how much host time the engine hides under the GPU's). :func:`fit_case_study`
chooses a few of them, each inside a physically plausible box, so that the simulated §2.1 case
study (:mod:`compute_sched.case_study`) reproduces the paper's six measured times: bounded least
squares (:func:`scipy.optimize.least_squares`, trust-region reflective) on the log error of every
point plus the log error of every within-phase ratio, because §2.1's content is its orderings
(TP=2 fastest early, TP=8 fastest in the tail). :func:`leave_one_out` refits without each point
and predicts it, the fit's out-of-sample error. The result is a YAML document under
``specs/calibrations/`` recording the assumptions, the fixed and fitted constants with their boxes,
the reason for each and whether it ended on a bound, the residuals, the leave-one-out predictions,
the assumption sweep and the checks the fit never saw, so a reader can audit it without rerunning.
:mod:`compute_sched.calibration_h800` is the recipe of the bundled H800 file.

The constants describe the GPU and the serving engine, not the model, so :func:`perf_model` applies
the bundled file of a GPU to every model on that GPU (the 32B runs use the 14B-fitted H800 file).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml
from scipy.optimize import least_squares

from orchestrl.compute_sched.case_study import PAPER_POINTS, CaseStudySetup, PaperPoint, case_study_times
from orchestrl.compute_sched.hardware import SPECS_DIR, GpuSpec, ModelSpec, load_gpu, load_model
from orchestrl.compute_sched.perf import Calibration, PerfModel
from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError

__all__ = ["FitParameter", "CaseStudyFit", "HeldOutPoint", "fit_case_study", "leave_one_out", "orderings_ok",
           "save_calibration", "load_calibration", "calibration_setup", "bundled_calibration", "perf_model",
           "CALIBRATIONS_DIR", "STEP_MODELS", "DEFAULT_STEP_MODEL", "step_model_class"]

CALIBRATIONS_DIR = SPECS_DIR / "calibrations"
_FIELDS = {f.name: f.type for f in fields(Calibration)}


@dataclass(frozen=True)
class FitParameter:
    """One :class:`Calibration` field the fit may move, inside ``[lower, upper]``."""

    name: str
    lower: float
    upper: float
    why: str  # why values in the box are physically plausible (stored beside the result)

    def __post_init__(self) -> None:
        if self.name not in _FIELDS or self.name in ("scale", "offset_s"):
            raise ConfigError("FitParameter", "name", f"{self.name!r} is not a fittable Calibration field",
                              ", ".join(n for n in _FIELDS if n not in ("scale", "offset_s")))
        if not 0 <= self.lower < self.upper:
            raise ConfigError("FitParameter", self.name, f"bounds [{self.lower}, {self.upper}]",
                              "0 <= lower < upper")


@dataclass(frozen=True)
class CaseStudyFit:
    """What :func:`fit_case_study` found, and how well it reproduces the measured points."""

    calibration: Calibration
    parameters: tuple[FitParameter, ...]
    points: tuple[PaperPoint, ...]
    model_s: tuple[float, ...]  # simulated seconds of each point under ``calibration``
    setup: CaseStudySetup
    evaluations: int

    @property
    def times(self) -> dict[tuple[str, int], float]:
        """Simulated seconds per ``(phase, TP)`` point."""
        return {(p.phase, p.tp): m for p, m in zip(self.points, self.model_s)}

    @property
    def rel_errors(self) -> tuple[float, ...]:
        """(model - paper) / paper per point."""
        return tuple(m / p.seconds - 1.0 for m, p in zip(self.model_s, self.points))

    @property
    def on_bound(self) -> tuple[str, ...]:
        """Fitted parameters that ended within 1% of the box width of a bound (the data push past it)."""
        out = []
        for p in self.parameters:
            v, tol = float(getattr(self.calibration, p.name)), 0.01 * (p.upper - p.lower)
            if v <= p.lower + tol or v >= p.upper - tol:
                out.append(p.name)
        return tuple(out)

    @property
    def rms_log_error(self) -> float:
        """Root-mean-square of log(model / paper): the quantity the fit minimises."""
        return float(np.sqrt(np.mean([math.log(m / p.seconds) ** 2 for m, p in zip(self.model_s, self.points)])))


_CONTRASTS = ((0, 1), (0, 2), (1, 2))  # point pairs within one phase (indices into that phase's points)


def _contrast_pairs(points: Sequence[PaperPoint]) -> list[tuple[int, int]]:
    """Index pairs of points measured in the same phase: their log ratio is what the orderings are."""
    by_phase: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        by_phase.setdefault(p.phase, []).append(i)
    return [(idx[a], idx[b]) for idx in by_phase.values() for a, b in _CONTRASTS if b < len(idx)]


def orderings_ok(times: dict[tuple[str, int], float]) -> bool:
    """Whether ``times`` keep §2.1's orderings: early TP=2 < 4 < 8, tail TP=8 < 4 < 2.

    >>> orderings_ok({("early", 2): 79.2, ("early", 4): 96.3, ("early", 8): 138.7,
    ...               ("tail", 2): 208.4, ("tail", 4): 188.3, ("tail", 8): 165.1})
    True
    """
    return (times["early", 2] < times["early", 4] < times["early", 8]
            and times["tail", 8] < times["tail", 4] < times["tail", 2])


def fit_case_study(perf: PerfModel, parameters: Sequence[FitParameter], *, setup: CaseStudySetup | None = None,
                   points: Sequence[PaperPoint] = PAPER_POINTS, starts: int = 3, max_nfev: int = 40,
                   seed: int = 0, start: Calibration | None = None) -> CaseStudyFit:
    """Return the calibration that best reproduces ``points`` with ``parameters`` inside their boxes.

    Every other field keeps its value in ``perf.cal``. The residuals are ``log(model / measured)``
    of every point plus, for every two points of the same phase, the difference of their log
    errors (the error of their ratio), so that a fit which misses a level evenly is preferred to
    one that swaps an ordering (§2.1's point is the orderings). Solved by
    :func:`scipy.optimize.least_squares` (trust-region reflective, so the boxes are honoured
    exactly) from ``start`` (default ``perf.cal`` clipped into the boxes) and ``starts - 1``
    uniform draws inside them; the best run wins.

    Raises
    ------
    ConfigError
        With no parameters, or more parameters than points (the fit would not be determined).

    Notes
    -----
    About ``starts * max_nfev * (len(parameters) + 1)`` evaluations of
    :func:`compute_sched.case_study.case_study_times` (12 simulations per trace seed, about 0.03 s
    per seed), the Jacobian by forward differences of 2% of each box.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> setup = CaseStudySetup(prompts=16, seeds=(0,))
    >>> truth = case_study_times(pm.with_calibration(replace(pm.cal, step_overhead_s=4e-3)), setup)
    >>> pts = [PaperPoint(ph, tp, s) for (ph, tp), s in truth.items()]
    >>> fit = fit_case_study(pm, [FitParameter("step_overhead_s", 1e-4, 1e-2, "host")], setup=setup,
    ...                      points=pts, starts=1)
    >>> round(fit.calibration.step_overhead_s * 1e3, 1)
    4.0
    """
    params = tuple(parameters)
    pts = tuple(points)
    if not params or len(params) > len(pts):
        raise ConfigError("fit_case_study", "parameters", f"{len(params)} parameters for {len(pts)} points",
                          "between 1 and the number of measured points")
    setup = setup or CaseStudySetup()
    tps = tuple(sorted({p.tp for p in pts}))
    target = np.log([p.seconds for p in pts])
    pairs = _contrast_pairs(pts)
    lo = np.array([p.lower for p in params])
    hi = np.array([p.upper for p in params])
    evals = 0

    def times(cal: Calibration) -> np.ndarray:
        t = case_study_times(perf.with_calibration(cal), setup, tps)
        return np.array([t[p.phase, p.tp] for p in pts])

    def calibration_at(x: np.ndarray) -> Calibration:
        return replace(perf.cal, **{p.name: float(v) for p, v in zip(params, x)})

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal evals
        evals += 1
        r = np.log(times(calibration_at(x))) - target
        return np.concatenate([r, [r[a] - r[b] for a, b in pairs]])

    base = start or perf.cal
    rng = np.random.default_rng(seed)
    inits = [np.clip([float(getattr(base, p.name)) for p in params], lo, hi)]
    inits += [lo + (hi - lo) * rng.random(len(params)) for _ in range(starts - 1)]
    best = None
    for x0 in inits:
        run = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.02, max_nfev=max_nfev)
        if best is None or run.cost < best.cost:
            best = run
    cal = calibration_at(best.x)
    return CaseStudyFit(cal, params, pts, tuple(float(v) for v in times(cal)), setup, evals)


@dataclass(frozen=True)
class HeldOutPoint:
    """One point predicted by a fit to the others (leave-one-out)."""

    point: PaperPoint
    predicted_s: float
    fitted: dict[str, float]  # the parameters of the fit that did not see this point

    @property
    def rel_error(self) -> float:
        return self.predicted_s / self.point.seconds - 1.0


def leave_one_out(perf: PerfModel, fit: CaseStudyFit, *, max_nfev: int = 25) -> tuple[HeldOutPoint, ...]:
    """Refit without each point in turn and predict it: the fit's out-of-sample error per point.

    Each refit starts from ``fit``'s calibration (one start) and keeps the same boxes; with ``k``
    parameters a refit needs at least ``k`` remaining points.

    Notes
    -----
    ``len(points)`` refits, each up to ``max_nfev * (k + 1)`` case-study evaluations.
    """
    out = []
    for i, held in enumerate(fit.points):
        rest = fit.points[:i] + fit.points[i + 1:]
        sub = fit_case_study(perf, fit.parameters, setup=fit.setup, points=rest, starts=1, max_nfev=max_nfev,
                             start=fit.calibration)
        t = case_study_times(perf.with_calibration(sub.calibration), fit.setup, (held.tp,))
        out.append(HeldOutPoint(held, t[held.phase, held.tp],
                                {p.name: float(getattr(sub.calibration, p.name)) for p in fit.parameters}))
    return tuple(out)


# -- files --------------------------------------------------------------------------------------
_TOP = {"name", "gpu", "step_model", "source", "engine", "applies_to", "case_study", "objective", "fixed", "fitted",
        "points",
        "rms_log_error", "orderings_ok", "leave_one_out", "assumption_sweep", "checks"}
_SETUP_KEYS = {f.name for f in fields(CaseStudySetup)}


def save_calibration(fit: CaseStudyFit, path: str | os.PathLike[str], *, name: str, gpu: str, source: str,
                     engine: str, fixed: dict[str, tuple[object, str]], uncalibrated_s: Sequence[float],
                     held_out: Sequence[HeldOutPoint] = (), sweep: Sequence[dict] = (),
                     checks: dict[str, object] | None = None, step_model: str = "analytical") -> None:
    """Write ``fit`` as a calibration document (see the bundled files for the layout).

    ``fixed`` maps Calibration fields set from outside the fit to ``(value, why)``;
    ``uncalibrated_s`` are the points' times under the plain roofline, kept for comparison;
    ``held_out`` the leave-one-out predictions, ``sweep`` one row per assumption set tried, and
    ``checks`` out-of-sample checks the fit never saw (name -> result); ``step_model`` names the step
    model whose constants these are (``"analytical"`` or ``"measured"``).
    """
    cal = fit.calibration
    times = fit.times
    doc = {
        "name": name, "gpu": gpu, "step_model": step_model, "source": source, "engine": engine,
        "applies_to": f"every model on {gpu}: the constants describe the GPU and the serving engine",
        "case_study": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(fit.setup).items()},
        "objective": "least squares of log(model/paper) per point plus the log ratio error of every two points "
                     "of one phase (the orderings), scipy.optimize.least_squares inside the boxes",
        "fixed": {k: {"value": v, "why": why} for k, (v, why) in fixed.items()},
        "fitted": {p.name: {"value": float(f"{getattr(cal, p.name):.4g}"), "lower": p.lower, "upper": p.upper,
                            "on_bound": p.name in fit.on_bound, "why": p.why} for p in fit.parameters},
        "points": [{"phase": p.phase, "tp": p.tp, "paper_s": p.seconds, "model_s": round(m, 1),
                    "rel_err": round(e, 3), "roofline_s": round(s0, 1)}
                   for p, m, e, s0 in zip(fit.points, fit.model_s, fit.rel_errors, uncalibrated_s)],
        "rms_log_error": round(fit.rms_log_error, 4),
        "orderings_ok": bool(orderings_ok(times)) if len(times) == 6 else None,
        "leave_one_out": [{"phase": h.point.phase, "tp": h.point.tp, "paper_s": h.point.seconds,
                           "predicted_s": round(h.predicted_s, 1), "rel_err": round(h.rel_error, 3),
                           "fitted": {k: float(f"{v:.4g}") for k, v in h.fitted.items()}} for h in held_out],
        "assumption_sweep": list(sweep),
        "checks": dict(checks or {}),
    }
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"# Calibration of compute_sched.perf for {gpu}; written by `python -m orchestrl.compute_sched.calibration_h800`.\n"
                 "# Fitted to measured times only (OrchestrRL §2.1), never to the benchmark's traces.\n")
        yaml.safe_dump(doc, fh, sort_keys=False, width=110, allow_unicode=True)


def calibration_setup(path: str | os.PathLike[str]) -> CaseStudySetup:
    """Return the case-study assumptions a calibration file was fitted under (its ``case_study`` section)."""
    r = load_document(path)
    sec = r.section("case_study", default={})
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in sec.data.items() if k in _SETUP_KEYS}
    return CaseStudySetup(**kw)


def _value(r: Reader, key: str) -> object:
    kind = _FIELDS[key]
    if kind in (bool, "bool"):
        return r.bool("value")
    if kind in (int, "int"):
        return r.int("value", minimum=0)
    return r.float("value", minimum=0.0)


def load_calibration(path: str | os.PathLike[str], base: Calibration | None = None) -> Calibration:
    """Return ``base`` (default: :class:`Calibration` defaults) with a calibration file's fixed and fitted values.

    Raises
    ------
    ConfigError
        Naming the file and field for an unknown field, a value of the wrong type, or a fitted
        value outside its stored bounds.
    """
    r = load_document(path)
    r.reject_unknown(_TOP)
    values: dict[str, object] = {}
    for section in ("fixed", "fitted"):
        sec = r.section(section, default={})
        for key in sec.data:
            if key not in _FIELDS:
                raise sec.error(str(key), "is not a Calibration field", ", ".join(_FIELDS))
            item = sec.section(key)
            item.reject_unknown({"value", "why", "lower", "upper", "on_bound"})
            values[key] = _value(item, key)
            if section == "fitted":
                lo, hi = item.float("lower"), item.float("upper")
                if not lo <= float(values[key]) <= hi:
                    raise item.error("value", f"{values[key]} outside its bounds [{lo}, {hi}]", "a value inside")
    return replace(base or Calibration(), **values)


def bundled_calibration(gpu: GpuSpec | str, step_model: str = "analytical") -> Path | None:
    """Return the bundled calibration file of a GPU (by name) for a step model, or None when there is none.

    A file without a ``step_model`` key holds the analytical model's constants.
    """
    name = gpu.name if isinstance(gpu, GpuSpec) else str(gpu)
    for path in sorted(CALIBRATIONS_DIR.glob("*.yaml")):
        doc = load_document(path)
        if (str(doc.raw("gpu", "")).lower() == name.lower()
                and str(doc.raw("step_model", "analytical")) == step_model):
            return path
    return None


#: The step models by name; the first is the default of the scheduler and RLSim (docs/step-model.md).
STEP_MODELS = ("measured", "analytical")
DEFAULT_STEP_MODEL = STEP_MODELS[0]


def step_model_class(step_model: str) -> type[PerfModel]:
    """Return the class of a step model by name ("measured" or "analytical")."""
    if step_model == "analytical":
        return PerfModel
    if step_model == "measured":
        from orchestrl.compute_sched.step_measured import MeasuredPerfModel  # heavy tables: load on use
        return MeasuredPerfModel
    raise ConfigError("perf_model", "step_model", f"unknown step model {step_model!r}", ", ".join(STEP_MODELS))


def perf_model(model: ModelSpec | str, gpu: GpuSpec | str, calibration: str | os.PathLike[str] = "bundled",
               step_model: str = DEFAULT_STEP_MODEL) -> PerfModel:
    """Return a step model with the GPU's bundled calibration, none (``"roofline"``), or a file.

    ``step_model`` picks the measured operator sums (default) or the analytical roofline
    (``"analytical"``); the bundled calibration is the one fitted for that step model.

    >>> perf_model("Qwen2.5-32B", "H800", step_model="analytical").cal == Calibration()  # the H800 file applies
    False
    >>> perf_model("Qwen2.5-32B", "H800", "roofline", step_model="analytical").cal == Calibration()
    True
    >>> perf_model("Qwen2.5-14B", "H800").step_model
    'measured'
    """
    cls = step_model_class(step_model)
    m = model if isinstance(model, ModelSpec) else load_model(model)
    g = gpu if isinstance(gpu, GpuSpec) else load_gpu(gpu)
    if calibration == "roofline":
        return cls(m, g)
    path = bundled_calibration(g, step_model) if calibration == "bundled" else Path(calibration)
    return cls(m, g, load_calibration(path) if path is not None else None)
