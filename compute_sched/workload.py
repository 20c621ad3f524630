"""The generation workload as the scheduler sees it: requests with progress, the step-level
remaining-workload histogram (§4.1), and its ARIMA forecast from recent steps.

Design note
-----------
Per-request output lengths cannot be predicted, so the planner works with a *step-level* histogram
of output lengths in fixed 256-token bins, each bin standing for its upper bound (a conservative
length). At the start of a step the histogram is forecast from recent steps; as requests finish
their bins are emptied, and a pending request that has produced ``g`` tokens is expected to end in
one of the bins above ``g``, in proportion to what is left there (:meth:`StepWorkload.conditional`).

The forecast fits an ARIMA model (statsmodels) to each of a few *quantiles* of the log-length
distribution across recent steps and rebuilds per-bin counts from the forecast quantiles: the
quantiles of a drifting length distribution move smoothly, whereas a single bin's count is mostly
sampling noise, and a dozen series fit in a fraction of a second where a hundred bins would not.
While the history is shorter than ``min_history`` steps, or a fit fails, it falls back to the
mean of the recent histograms, and says so in :attr:`Forecast.method`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from fabric.errors import ConfigError

__all__ = ["BIN_TOKENS", "RequestState", "LengthHistogram", "Forecast", "LengthForecaster", "StepWorkload",
           "forecast_errors"]

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
    method: str  # "arima" or "fallback: <reason>"


class LengthForecaster:
    """Forecast next step's per-bin counts from the output lengths of recent steps.

    Parameters
    ----------
    max_tokens : int
        Generation cap (the histogram's last bin ends there).
    quantiles : int
        Quantile series the ARIMA models are fitted to.
    min_history : int
        Steps needed before ARIMA is used; fewer use the mean of what there is.
    window : int
        Most recent steps kept.
    order : tuple
        ARIMA ``(p, d, q)``; with ``d = 1`` a drift term is fitted too. Pure AR orders (``q = 0``)
        are fitted with Burg's method, others by maximum likelihood.
    """

    def __init__(self, max_tokens: int, *, bin_tokens: int = BIN_TOKENS, quantiles: int = 12, min_history: int = 4,
                 window: int = 12, order: tuple[int, int, int] = (1, 1, 0)) -> None:
        if max_tokens < 1 or quantiles < 2 or min_history < 2 or window < min_history:
            raise ConfigError("LengthForecaster", "max_tokens", f"max_tokens={max_tokens}, quantiles={quantiles}, "
                                                                f"min_history={min_history}, window={window}",
                              "max_tokens >= 1, quantiles >= 2, 2 <= min_history <= window")
        self.max_tokens, self.bin_tokens = max_tokens, bin_tokens
        self.levels = (np.arange(quantiles) + 0.5) / quantiles
        self.min_history, self.window, self.order = min_history, window, order
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

    def _hist(self, lengths: np.ndarray) -> LengthHistogram:
        return LengthHistogram.from_lengths(lengths.astype(int), self.max_tokens, self.bin_tokens)

    def _fallback(self, n: int, reason: str) -> Forecast:
        if not self._steps:
            bins = LengthHistogram.bins_for(self.max_tokens, self.bin_tokens)
            return Forecast(LengthHistogram(np.full(bins, n / bins), self.bin_tokens), f"fallback: {reason}")
        recent = self._steps[-self.min_history:]
        mean = sum(self._hist(s).scaled_to(1.0).counts for s in recent) / len(recent)
        return Forecast(LengthHistogram(mean * n, self.bin_tokens), f"fallback: {reason}")

    def forecast(self, n_requests: int) -> Forecast:
        """Return the expected histogram of the next step's ``n_requests`` output lengths.

        Notes
        -----
        O(Q * fit) for Q quantile series; each ARIMA fit is on at most ``window`` points.
        """
        if self.history < self.min_history:
            return self._fallback(n_requests, f"history of {self.history} steps < {self.min_history}")
        try:
            from statsmodels.tsa.arima.model import ARIMA
        except ImportError:
            return self._fallback(n_requests, "statsmodels is not installed")
        logq = np.log(np.array([np.quantile(s, self.levels) for s in self._steps]))  # steps x Q
        predicted = np.empty(len(self.levels))
        failed = 0
        for k in range(len(self.levels)):
            series = logq[:, k]
            if np.ptp(series) < 1e-9:
                predicted[k] = series[-1]
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # convergence chatter on short series
                    model = ARIMA(series, order=self.order, trend="t" if self.order[1] == 1 else "c")
                    # Burg's estimator for the AR part: ~10x faster than the state-space MLE.
                    fit = model.fit(method="burg" if self.order[2] == 0 else None)
                    predicted[k] = float(np.asarray(fit.forecast(1))[0])
            except (np.linalg.LinAlgError, ValueError):
                failed += 1
                predicted[k] = series[-1] + (series[-1] - series[0]) / max(1, len(series) - 1)
        if failed == len(self.levels):
            return self._fallback(n_requests, "every ARIMA fit failed")
        q = np.clip(np.exp(np.maximum.accumulate(predicted)), 1.0, float(self.max_tokens))
        return Forecast(self._from_quantiles(q, n_requests), "arima" if not failed else f"arima ({failed} drift)")

    def _from_quantiles(self, q: np.ndarray, n: int) -> LengthHistogram:
        """Rebuild per-bin counts from forecast quantiles (piecewise-linear CDF, mass at the cap kept)."""
        last = self._steps[-1]
        cap_share = float(np.mean(last >= self.max_tokens))
        lo = max(1.0, float(last[0]) * q[0] / max(1.0, float(np.quantile(last, self.levels[0]))))
        xs = np.concatenate(([min(lo, q[0])], q, [float(self.max_tokens)]))
        ps = np.concatenate(([0.0], self.levels, [1.0]))
        if cap_share > 0:  # a point mass at the cap: the CDF jumps there
            ps = np.minimum(ps, 1.0 - cap_share)
            ps[-1] = 1.0
            xs[-2] = min(xs[-2], self.max_tokens - 1e-6)
        xs = np.maximum.accumulate(xs)
        edges = np.arange(LengthHistogram.bins_for(self.max_tokens, self.bin_tokens) + 1) * self.bin_tokens
        cdf = np.interp(np.minimum(edges, self.max_tokens), xs, ps, left=0.0, right=1.0)
        cdf[-1] = 1.0
        return LengthHistogram(np.diff(cdf) * n, self.bin_tokens)


def forecast_errors(predicted: LengthHistogram, actual_lengths: Sequence[int]) -> dict[str, float]:
    """Relative errors of a forecast against a step's real lengths.

    ``bin_l1``: sum of per-bin count errors over the number of requests; ``workload``: error of the
    total remaining workload (each bin at its upper bound), the quantity the planner optimises.

    >>> h = LengthHistogram.from_lengths([100, 300], max_tokens=512)
    >>> forecast_errors(h, [100, 300])
    {'bin_l1': 0.0, 'workload': 0.0}
    """
    n = len(actual_lengths)
    act = LengthHistogram.from_lengths(actual_lengths, int(predicted.upper_bounds[-1]), predicted.bin_tokens)
    pred = predicted.scaled_to(n)
    return {"bin_l1": float(np.abs(pred.counts - act.counts).sum() / n),
            "workload": abs(pred.workload_tokens() - act.workload_tokens()) / act.workload_tokens()}


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
