"""Forecasting methods for next step's output-length histogram, as plain functions over past steps.

Design note
-----------
Every method takes the output lengths of recent steps and returns the *shares* of next step's
responses per 256-token bin (they sum to 1); :class:`compute_sched.workload.LengthForecaster` scales
them to the step's batch and is what the scheduler calls. Keeping the methods here, free of the
scheduler's types, lets ``bench/forecast.py`` run each as a competitor on the same steps.

* ``last``: the previous step's histogram (the forecast of a random walk; all of one step's noise).
* ``mean``: the mean of the last ``k`` steps' histograms. ``k`` trades sampling noise (one step of
  512 responses has ~6% noise in its mean length) against lag behind drift; by default it is
  chosen anew at every forecast by a backtest on the history (:func:`select_mean_steps`).
* ``arima``: ARIMA(p, d, q) per quantile of log length across recent steps (OrchestrRL §4.1
  forecasts with ARIMA); the recent steps' lengths are then moved by the forecast quantile shift
  (:func:`quantile_warp_shares`), so the shape between quantiles and the mass at the cap survive.

Which one is the default is decided by ``bench/forecast.py``; see :data:`DEFAULT_METHOD`.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

__all__ = ["METHODS", "DEFAULT_METHOD", "MEAN_STEP_CHOICES", "ARIMA_LEVELS", "bin_shares", "last_step_shares",
           "moving_mean_shares", "select_mean_steps", "arima_quantile_shares", "quantile_warp_shares",
           "figure3_prior_shares", "histogram_quantile", "share_errors"]

METHODS = ("last", "mean", "arima")
#: The method :class:`~compute_sched.workload.LengthForecaster` uses unless told otherwise: ``mean``
#: with ``k`` chosen by backtest, the lowest workload error pooled over both batch sizes in
#: ``python bench/forecast.py`` (2026-11-24, 7 regimes x 10 seeds x 22 forecasts): 6.62% (512
#: responses per step: 8.4%; 2,048: 4.8%) against mean of 2 steps 6.64%, ARIMA 6.89% (8.8%, 5.0%),
#: last step 7.21%, mean of all steps 14.8%. The margin over a fixed k = 2 is within noise; ``auto``
#: is kept because the best fixed k moves with regime and batch size (8 or more for stationary or
#: task-mix steps at 512 responses, 1-2 under drift at 2,048).
#: ARIMA wins only under steady drift at 2,048 (``drift``, ``shorter-skewed``); see docs/compute_sched.md.
DEFAULT_METHOD = "mean"
#: Window lengths the backtest of ``mean`` chooses from (1 is the last step).
MEAN_STEP_CHOICES = (1, 2, 4, 8)
#: Quantile levels the ARIMA series are fitted to: 12 evenly spaced, plus the tail the planner's
#: survival curves depend on (without them ARIMA's p99 error was 4.5% against 2.8% for a mean at 512
#: responses per step, 3.5% against 0.6% at 2,048).
ARIMA_LEVELS = np.concatenate(((np.arange(12) + 0.5) / 12, [0.975, 0.99, 0.995]))


def _bins(max_tokens: int, bin_tokens: int) -> int:
    return max(1, math.ceil(max_tokens / bin_tokens))


def bin_shares(lengths: Sequence[float], max_tokens: int, bin_tokens: int) -> np.ndarray:
    """Return the share of ``lengths`` in each bin ``(b*w, (b+1)*w]``; lengths past the cap count in the last.

    >>> bin_shares([100, 300, 300, 1000], 1024, 256).tolist()
    [0.25, 0.5, 0.0, 0.25]
    """
    arr = np.asarray(lengths, dtype=float)
    idx = np.clip(np.ceil(arr / bin_tokens).astype(int) - 1, 0, _bins(max_tokens, bin_tokens) - 1)
    counts = np.bincount(idx, minlength=_bins(max_tokens, bin_tokens)).astype(float)
    return counts / max(1, arr.size)


def last_step_shares(steps: Sequence[np.ndarray], max_tokens: int, bin_tokens: int) -> np.ndarray:
    """The last step's histogram."""
    return bin_shares(steps[-1], max_tokens, bin_tokens)


def moving_mean_shares(steps: Sequence[np.ndarray], k: int, max_tokens: int, bin_tokens: int) -> np.ndarray:
    """The mean of the last ``k`` steps' histograms (fewer if there are fewer; each step weighs the same).

    >>> moving_mean_shares([np.array([100.0]), np.array([300.0])], 4, 512, 256).tolist()
    [0.5, 0.5]
    """
    recent = steps[-k:]
    return sum(bin_shares(s, max_tokens, bin_tokens) for s in recent) / len(recent)


def select_mean_steps(steps: Sequence[np.ndarray], max_tokens: int, bin_tokens: int, *,
                      choices: Sequence[int] = MEAN_STEP_CHOICES, backtest: int = 8) -> int:
    """Return the window ``k`` whose moving mean forecast the last ``backtest`` steps best.

    Each choice forecasts each of the last ``backtest`` observed steps from the steps before it only
    (rolling origin, so the choice is out of sample for every step it is scored on); the score is the
    mean workload error (:func:`share_errors`). Ties go to the shorter window.

    Notes
    -----
    O(C * B * (k_max * R + H)) for C choices, B backtest steps, R lengths per step and H bins.

    Examples
    --------
    >>> flat = [np.full(64, 1000.0 + 300 * (i % 2)) for i in range(9)]  # alternating: averaging wins
    >>> select_mean_steps(flat, 2048, 256)
    2
    """
    if len(steps) < 2:
        return 1
    shares = [bin_shares(s, max_tokens, bin_tokens) for s in steps]
    best_k, best_err = 1, math.inf
    for k in choices:
        errs = []
        for t in range(max(1, len(steps) - backtest), len(steps)):
            recent = shares[max(0, t - k):t]
            errs.append(share_errors(sum(recent) / len(recent), shares[t], bin_tokens)["workload"])
        err = float(np.mean(errs))
        if err < best_err - 1e-12:
            best_k, best_err = k, err
    return best_k


def arima_quantile_shares(steps: Sequence[np.ndarray], order: tuple[int, int, int], max_tokens: int, bin_tokens: int,
                          *, levels: np.ndarray = ARIMA_LEVELS, pool: int = 4) -> tuple[np.ndarray, int]:
    """Forecast each quantile of log length by ARIMA and move the last ``pool`` steps' lengths to match.

    Returns the shares and how many quantile series fell back to linear drift because their fit
    failed (all of them failing is the caller's to handle).

    Notes
    -----
    O(Q * fit + pool * R) for Q = ``len(levels)`` series of ``len(steps)`` points. With ``d = 1`` a
    drift term is fitted. Quantiles of a drifting distribution move smoothly where one bin's count
    is mostly sampling noise, and a dozen series fit in a fraction of a second where a hundred bins
    would not.
    """
    sorted_steps = [np.sort(np.asarray(s, dtype=float)) for s in steps]
    logq = np.log(np.array([np.quantile(s, levels) for s in sorted_steps]))  # steps x Q
    predicted = np.empty(len(levels))
    failed = 0
    for j in range(len(levels)):
        series = logq[:, j]
        if np.ptp(series) < 1e-9:
            predicted[j] = series[-1]
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # convergence chatter on short series
                predicted[j] = _arima_one_step(series, order)
        except (np.linalg.LinAlgError, ValueError):
            failed += 1
            predicted[j] = series[-1] + (series[-1] - series[0]) / max(1, len(series) - 1)
    predicted = np.minimum(np.maximum.accumulate(predicted), math.log(max_tokens))
    return quantile_warp_shares(sorted_steps[-pool:], logq[-pool:], predicted, max_tokens, bin_tokens), failed


def _arima_one_step(series: np.ndarray, order: tuple[int, int, int]) -> float:
    """One-step forecast of ``series`` by ARIMA ``order`` with a constant (a drift when ``d = 1``).

    Pure AR orders with ``d`` of 0 or 1 call the estimator ``ARIMA(...).fit(method="burg")`` runs
    (statsmodels' GLS with Burg's method for the AR part) directly and forecast by hand: the same
    forecast to 1e-10 (tests compare them), ~2x faster, without building state-space results the
    forecast does not need. Other orders go through ``statsmodels.tsa.arima.model.ARIMA`` by MLE.
    """
    p, d, q = order
    if q == 0 and d in (0, 1):
        from statsmodels.tsa.arima.estimators.gls import gls

        x = np.diff(series) if d == 1 else series
        params, _ = gls(x, exog=np.ones((len(x), 1)), order=(p, 0, 0), arma_estimator="burg")
        mu = float(params.exog_params[0])
        ar = np.asarray(params.ar_params, dtype=float)
        step = mu + (float(ar @ (x[::-1][:p] - mu)) if p else 0.0)
        return float(series[-1] + step) if d == 1 else step
    from statsmodels.tsa.arima.model import ARIMA

    fit = ARIMA(series, order=order, trend="t" if d == 1 else "c").fit()
    return float(np.asarray(fit.forecast(1))[0])


def quantile_warp_shares(steps: Sequence[np.ndarray], log_quantiles: np.ndarray, predicted: np.ndarray,
                         max_tokens: int, bin_tokens: int) -> np.ndarray:
    """Bin shares of ``steps`` after moving each one's log-quantiles onto ``predicted``.

    Each step's lengths go through the piecewise-linear map (in log length) from that step's own
    quantiles to the predicted ones, shifted by the end quantiles' move beyond them; lengths at the
    cap stay there. Pooling several steps averages their sampling noise; when the prediction equals
    the steps' quantiles the result is exactly their mean histogram.

    >>> lengths = np.array([100.0, 200.0, 400.0, 800.0])
    >>> lq = np.log(np.quantile(lengths, [0.25, 0.75]))[None, :]
    >>> quantile_warp_shares([lengths], lq, lq[0] + np.log(2), 2048, 256).tolist()[:4]  # everything doubles
    [0.25, 0.25, 0.0, 0.25]
    """
    out = np.zeros(_bins(max_tokens, bin_tokens))
    for s, lq in zip(steps, log_quantiles):
        lx = np.log(np.maximum(s, 1.0))
        ly = np.interp(lx, lq, predicted)
        ly = np.where(lx < lq[0], lx + predicted[0] - lq[0], ly)
        ly = np.where(lx > lq[-1], lx + predicted[-1] - lq[-1], ly)
        moved = np.where(s >= max_tokens, float(max_tokens), np.minimum(np.exp(ly), float(max_tokens)))
        out += bin_shares(moved, max_tokens, bin_tokens)
    return out / len(steps)


def figure3_prior_shares(max_tokens: int, bin_tokens: int) -> np.ndarray:
    """Bin shares of the Figure 3 length distribution that ``heavy_tailed_trace`` samples from (scale 1).

    A prior for a step with no history: 88% easy prompts (median 2,400 tokens) and 12% hard ones
    (7,000), log-normal prompt (sigma 0.35) and response (0.55) spread, clipped to ``[16, cap]``.
    It is computed from those constants, never from a trace.

    >>> s = figure3_prior_shares(15360, 256)
    >>> round(float(s.sum()), 6), round(float(s[:30].sum()), 2)  # share under 7,680 tokens
    (1.0, 0.91)
    """
    from scipy.stats import norm

    sigma = math.hypot(0.35, 0.55)
    edges = np.minimum(np.arange(_bins(max_tokens, bin_tokens) + 1) * bin_tokens, max_tokens).astype(float)
    logs = np.log(np.maximum(edges, 16.0))
    cdf = 0.88 * norm.cdf(logs, math.log(2400.0), sigma) + 0.12 * norm.cdf(logs, math.log(7000.0), sigma)
    cdf[0], cdf[-1] = 0.0, 1.0  # clipping puts everything below 16 in the first bin, past the cap in the last
    return np.diff(cdf)


def histogram_quantile(shares: np.ndarray, level: float, bin_tokens: int) -> float:
    """Return the ``level`` quantile of a binned distribution, linear within each bin.

    >>> histogram_quantile(np.array([0.5, 0.5]), 0.75, 256), histogram_quantile(np.array([0, 0, 1.0]), 0.5, 256)
    (384.0, 640.0)
    """
    cdf = np.cumsum(shares) / max(1e-12, float(np.sum(shares)))
    b = min(len(cdf) - 1, int(np.searchsorted(cdf, level - 1e-12)))  # first bin whose upper CDF reaches level
    below = float(cdf[b - 1]) if b > 0 else 0.0
    frac = (level - below) / max(1e-12, float(cdf[b]) - below)
    return float(bin_tokens * (b + min(1.0, max(0.0, frac))))


def share_errors(predicted: np.ndarray, actual: np.ndarray, bin_tokens: int) -> dict[str, float]:
    """Relative errors of forecast bin shares against a step's actual shares (same bins).

    ``workload``: error of the total remaining workload, each bin at its upper bound (what the
    planner optimises); ``bin_l1``: sum of per-bin share errors; ``p90``/``p99``: relative error of
    the 90th/99th percentile length (linear within bins on both sides, so a perfect forecast scores
    0); ``w1``: Wasserstein-1 distance between the two length distributions over the actual mean
    length (how far, in tokens, mass has to move, as a share of a response).

    >>> share_errors(np.array([0.5, 0.5]), np.array([0.5, 0.5]), 256)["w1"]
    0.0
    """
    p = np.asarray(predicted, dtype=float) / max(1e-12, float(np.sum(predicted)))
    a = np.asarray(actual, dtype=float) / max(1e-12, float(np.sum(actual)))
    upper = (np.arange(len(a)) + 1.0) * bin_tokens
    out = {"bin_l1": float(np.abs(p - a).sum()),
           "workload": abs(float(p @ upper) - float(a @ upper)) / float(a @ upper)}
    for level in (0.90, 0.99):
        q_act = histogram_quantile(a, level, bin_tokens)
        out[f"p{round(level * 100)}"] = abs(histogram_quantile(p, level, bin_tokens) - q_act) / q_act
    out["w1"] = bin_tokens * float(np.abs(np.cumsum(p) - np.cumsum(a)).sum()) / float(a @ (upper - bin_tokens / 2))
    return out
