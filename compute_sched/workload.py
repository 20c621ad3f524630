"""The generation workload as the scheduler sees it: requests with progress, the step-level
remaining-workload histogram (§4.1), and its forecast from recent steps.

Design note
-----------
Per-request output lengths cannot be predicted, so the planner works with a *step-level* histogram
of output lengths in fixed 256-token bins, each bin standing for its upper bound (a conservative
length). At the start of a step the histogram is forecast from recent steps; as requests finish
their bins are emptied, and a pending request that has produced ``g`` tokens is expected to end in
one of the bins above ``g``, in proportion to what is left there (:meth:`StepWorkload.conditional`).

The forecast (:class:`LengthForecaster`) is one of the methods in :mod:`compute_sched.forecast`:
by default the mean of the last ``k`` steps' histograms with ``k`` chosen by backtest, which
beat the last step alone and ARIMA on quantiles of log length in ``bench/forecast.py``; the
others stay selectable (``method="last"`` / ``"arima"``). Without any history it returns a uniform
histogram and says so in :attr:`Forecast.method`; :func:`prior_histogram` is a Figure 3 prior for
callers that have no history but want a shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from orchestrl.compute_sched.forecast import (
    ARIMA_LEVELS,
    DEFAULT_METHOD,
    METHODS,
    arima_quantile_shares,
    bin_shares,
    figure3_prior_shares,
    last_step_shares,
    moving_mean_shares,
    select_mean_steps,
    share_errors,
)
from orchestrl.fabric.errors import ConfigError

__all__ = ["BIN_TOKENS", "RequestState", "LengthHistogram", "Forecast", "LengthForecaster", "StepWorkload",
           "forecast_errors", "prior_histogram"]

BIN_TOKENS = 256


@dataclass(frozen=True)
class RequestState:
    """One pending request as an engine reports it (nothing about its final length)."""

    request_id: str
    prompt_tokens: int
    generated_tokens: int  # progress so far
    max_tokens: int  # the step's generation cap
    group_id: str = ""  # GRPO group (prompt) it belongs to

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


@dataclass(frozen=True)
class LengthHistogram:
    """Expected number of requests per output-length bin ``(b*w, (b+1)*w]`` (``w`` = bin_tokens).

    Examples
    --------
    >>> h = LengthHistogram.from_lengths([100, 300, 300, 1000], max_tokens=1024)
    >>> h.counts.tolist(), h.upper_bounds.tolist()
    ([1.0, 2.0, 0.0, 1.0], [256, 512, 768, 1024])
    """

    counts: np.ndarray
    bin_tokens: int = BIN_TOKENS

    @staticmethod
    def bins_for(max_tokens: int, bin_tokens: int = BIN_TOKENS) -> int:
        return max(1, math.ceil(max_tokens / bin_tokens))

    @classmethod
    def from_lengths(cls, lengths: Iterable[int], max_tokens: int, bin_tokens: int = BIN_TOKENS) -> "LengthHistogram":
        counts = np.zeros(cls.bins_for(max_tokens, bin_tokens))
        for n in lengths:
            counts[min(len(counts) - 1, max(0, math.ceil(n / bin_tokens) - 1))] += 1
        return cls(counts, bin_tokens)

    @property
    def upper_bounds(self) -> np.ndarray:
        return (np.arange(len(self.counts)) + 1) * self.bin_tokens

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def scaled_to(self, n: float) -> "LengthHistogram":
        tot = self.total
        if tot <= 0:
            return LengthHistogram(np.full(len(self.counts), n / len(self.counts)), self.bin_tokens)
        return LengthHistogram(self.counts * (n / tot), self.bin_tokens)

    def workload_tokens(self) -> float:
        """Tokens the histogram stands for, counting each bin at its upper bound."""
        return float(self.counts @ self.upper_bounds)


@dataclass(frozen=True)
class Forecast:
    """Next step's histogram and how it was obtained."""

    histogram: LengthHistogram
    method: str  # e.g. "mean, k=2 by backtest", "mean, k=4", "last", "arima", "fallback: <reason>"


class LengthForecaster:
    """Forecast next step's per-bin counts from the output lengths of recent steps.

    Parameters
    ----------
    max_tokens : int
        Generation cap (the histogram's last bin ends there).
    method : str
        ``"mean"`` (default), ``"last"`` or ``"arima"``; see :mod:`compute_sched.forecast`. The
        default is the method with the lowest mean workload error in ``bench/forecast.py`` over
        seven step-to-step regimes at 512 and 2,048 responses per step
        (:data:`compute_sched.forecast.DEFAULT_METHOD` gives the numbers).
    mean_steps : int or "auto"
        Window of ``mean``; ``"auto"`` re-chooses it from 1, 2, 4, 8 at every forecast by a
        rolling backtest on the history.
    quantiles : int
        Evenly spaced quantile series the ARIMA models are fitted to (three tail levels, 0.975,
        0.99 and 0.995, are always added).
    min_history : int
        Steps ``arima`` needs; with fewer it uses the mean of what there is and says so.
    window : int
        Most recent steps kept.
    order : tuple
        ARIMA ``(p, d, q)``; with ``d = 1`` a drift term is fitted too. Pure AR orders (``q = 0``)
        are fitted with Burg's method, others by maximum likelihood.

    Examples
    --------
    >>> f = LengthForecaster(1024, method="last")
    >>> f.observe_step([100, 300, 300, 1000])
    >>> fc = f.forecast(8)
    >>> fc.histogram.counts.tolist(), fc.method
    ([2.0, 4.0, 0.0, 2.0], 'last')
    """

    def __init__(self, max_tokens: int, *, method: str = DEFAULT_METHOD, bin_tokens: int = BIN_TOKENS,
                 quantiles: int = 12, min_history: int = 4, window: int = 12, order: tuple[int, int, int] = (1, 1, 0),
                 mean_steps: int | str = "auto") -> None:
        if max_tokens < 1 or quantiles < 2 or min_history < 2 or window < min_history:
            raise ConfigError("LengthForecaster", "max_tokens", f"max_tokens={max_tokens}, quantiles={quantiles}, "
                                                                f"min_history={min_history}, window={window}",
                              "max_tokens >= 1, quantiles >= 2, 2 <= min_history <= window")
        if method not in METHODS:
            raise ConfigError("LengthForecaster", "method", f"unknown method {method!r}", ", ".join(METHODS))
        if mean_steps != "auto" and not (isinstance(mean_steps, int) and mean_steps >= 1):
            raise ConfigError("LengthForecaster", "mean_steps", f"{mean_steps!r}", "an integer >= 1 or 'auto'")
        self.max_tokens, self.bin_tokens, self.method = max_tokens, bin_tokens, method
        self.levels = np.concatenate(((np.arange(quantiles) + 0.5) / quantiles, ARIMA_LEVELS[-3:]))
        self.min_history, self.window, self.order, self.mean_steps = min_history, window, order, mean_steps
        self._steps: list[np.ndarray] = []  # sorted lengths of each observed step

    @property
    def history(self) -> int:
        return len(self._steps)

    def observe_step(self, lengths: Sequence[int]) -> None:
        """Record the output lengths of a finished step."""
        arr = np.clip(np.sort(np.asarray(lengths, dtype=float)), 1, self.max_tokens)
        if arr.size == 0:
            raise ConfigError("LengthForecaster", "lengths", "a step with no finished request", "one or more lengths")
        self._steps = (self._steps + [arr])[-self.window:]

    def _hist(self, shares: np.ndarray, n: int) -> LengthHistogram:
        return LengthHistogram(shares * n, self.bin_tokens)

    def _mean(self, n: int, k: int, label: str) -> Forecast:
        return Forecast(self._hist(moving_mean_shares(self._steps, k, self.max_tokens, self.bin_tokens), n), label)

    def forecast(self, n_requests: int) -> Forecast:
        """Return the expected histogram of the next step's ``n_requests`` output lengths.

        With no history at all every method returns a uniform histogram (``"fallback: no
        history"``); pass a prior yourself (:func:`prior_histogram`) if you have a better guess.

        Notes
        -----
        ``last`` and ``mean``: O(k * R) for R lengths per step; ``mean`` with ``"auto"`` adds a
        backtest of O(32 * R); ``arima``: O(Q * fit) for Q quantile series of at most ``window``
        points (~60 ms for 15 series of 12 points on one core).
        """
        if not self._steps:
            bins = LengthHistogram.bins_for(self.max_tokens, self.bin_tokens)
            return Forecast(LengthHistogram(np.full(bins, n_requests / bins), self.bin_tokens), "fallback: no history")
        if self.method == "last":
            return Forecast(self._hist(last_step_shares(self._steps, self.max_tokens, self.bin_tokens), n_requests),
                            "last")
        if self.method == "mean":
            if self.mean_steps == "auto":
                k = select_mean_steps(self._steps, self.max_tokens, self.bin_tokens)
                return self._mean(n_requests, k, f"mean, k={min(k, self.history)} by backtest")
            return self._mean(n_requests, int(self.mean_steps), f"mean, k={min(int(self.mean_steps), self.history)}")
        if self.history < self.min_history:
            return self._mean(n_requests, self.min_history,
                              f"fallback: history of {self.history} steps < {self.min_history}")
        try:
            shares, failed = arima_quantile_shares(self._steps, self.order, self.max_tokens, self.bin_tokens,
                                                   levels=self.levels)
        except ImportError:
            return self._mean(n_requests, self.min_history, "fallback: statsmodels is not installed")
        if failed == len(self.levels):
            return self._mean(n_requests, self.min_history, "fallback: every ARIMA fit failed")
        return Forecast(self._hist(shares, n_requests), "arima" if not failed else f"arima ({failed} drift)")


def prior_histogram(max_tokens: int, n_requests: int, bin_tokens: int = BIN_TOKENS) -> LengthHistogram:
    """Return a histogram of the Figure 3 shape for a step with no history (never read from a trace).

    It is the distribution ``orchestrl sched trace`` samples from at scale 1 (most responses under
    7.5K tokens, 12% hard prompts in the tail, mass at the cap), so for synthetic traces drawn at
    scale 1 it is their generating distribution; for anything else it is only a shape.

    >>> h = prior_histogram(15360, 512)
    >>> round(h.total), int(h.counts.argmax()) < 12
    (512, True)
    """
    return LengthHistogram(figure3_prior_shares(max_tokens, bin_tokens) * n_requests, bin_tokens)


def forecast_errors(predicted: LengthHistogram, actual_lengths: Sequence[int]) -> dict[str, float]:
    """Relative errors of a forecast against a step's real lengths (see :func:`compute_sched.forecast.share_errors`).

    ``workload``: error of the total remaining workload (each bin at its upper bound, what the
    planner optimises); ``bin_l1``: sum of per-bin count errors over the number of requests;
    ``p90``, ``p99``: relative error of those percentile lengths; ``w1``: Wasserstein-1 distance
    over the actual mean length.

    >>> h = LengthHistogram.from_lengths([100, 300], max_tokens=512)
    >>> forecast_errors(h, [100, 300])
    {'bin_l1': 0.0, 'workload': 0.0, 'p90': 0.0, 'p99': 0.0, 'w1': 0.0}
    """
    actual = bin_shares(actual_lengths, int(predicted.upper_bounds[-1]), predicted.bin_tokens)
    return share_errors(predicted.counts, actual, predicted.bin_tokens)


class StepWorkload:
    """The remaining-workload histogram of the current step, emptied as requests finish.

    >>> w = StepWorkload(LengthHistogram.from_lengths([200, 600, 1000, 1000], max_tokens=1024))
    >>> w.observe_finished(200)
    >>> probs, remaining = w.conditional(512)  # a request that has produced 512 tokens
    >>> probs.round(2).tolist(), remaining.tolist()
    ([0.33, 0.67], [256, 512])
    """

    def __init__(self, forecast: LengthHistogram) -> None:
        self.bin_tokens = forecast.bin_tokens
        self.counts = forecast.counts.astype(float).copy()
        self.uppers = forecast.upper_bounds

    def observe_finished(self, output_tokens: int) -> None:
        b = min(len(self.counts) - 1, max(0, math.ceil(output_tokens / self.bin_tokens) - 1))
        self.counts[b] = max(0.0, self.counts[b] - 1.0)

    def conditional(self, progress: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (probability, remaining tokens) over the bins a request at ``progress`` may end in.

        When the forecast has no mass left above ``progress`` the request is taken to run to the cap
        (the conservative upper bound).
        """
        first = min(len(self.counts) - 1, progress // self.bin_tokens)
        if progress % self.bin_tokens == 0 and progress > 0:
            first = min(len(self.counts) - 1, first)  # bin (g-w, g] is done; g itself ends that bin
        mass = self.counts[first:]
        remaining = self.uppers[first:] - progress
        keep = remaining > 0
        mass, remaining = mass[keep], remaining[keep]
        if mass.size == 0 or mass.sum() <= 0:
            cap = int(self.uppers[-1])
            return np.array([1.0]), np.array([max(1, cap - progress)])
        return mass / mass.sum(), remaining.astype(int)
