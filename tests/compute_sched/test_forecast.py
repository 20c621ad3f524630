"""Forecasters as the scheduler and a user see them: exactness, the default, drift, the traces they are judged on."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from orchestrl.compute_sched.forecast import DEFAULT_METHOD, METHODS, _arima_one_step, select_mean_steps
from orchestrl.compute_sched.traces import REGIMES, step_sequence
from orchestrl.compute_sched.workload import LengthForecaster, LengthHistogram, forecast_errors
from orchestrl.fabric.errors import ConfigError

CAP = 15360
DOCS = Path(__file__).resolve().parents[2] / "docs" / "compute_sched.md"


def _forecaster(method: str, **kw) -> LengthForecaster:
    return LengthForecaster(CAP, method=method, **kw)


@pytest.mark.parametrize("method,kw", [("last", {}), ("mean", {"mean_steps": 3}), ("mean", {}), ("arima", {})])
def test_every_method_is_exact_when_every_step_is_the_same(method, kw):
    step = step_sequence("stationary", 1, 512, CAP, seed=4)[0]
    f = _forecaster(method, **kw)
    for _ in range(6):
        f.observe_step(step)
    got = f.forecast(512)
    assert not got.method.startswith("fallback")
    np.testing.assert_allclose(got.histogram.counts, LengthHistogram.from_lengths(step, CAP).counts, atol=1e-9)
    assert forecast_errors(got.histogram, step) == pytest.approx({"bin_l1": 0, "workload": 0, "p90": 0, "p99": 0,
                                                                  "w1": 0}, abs=1e-9)


def test_last_step_forecast_is_the_last_histogram_scaled_to_the_batch():
    a, b = step_sequence("random-walk", 2, 256, CAP, seed=1)
    f = _forecaster("last")
    f.observe_step(a)
    f.observe_step(b)
    got = f.forecast(1024)
    np.testing.assert_allclose(got.histogram.counts, LengthHistogram.from_lengths(b, CAP).counts * 4)
    assert got.method == "last"


def test_fixed_window_mean_averages_exactly_the_last_k_steps():
    steps = step_sequence("drift", 5, 256, CAP, seed=2)
    f = _forecaster("mean", mean_steps=2)
    for s in steps:
        f.observe_step(s)
    want = sum(LengthHistogram.from_lengths(s, CAP).counts for s in steps[-2:]) / 2
    np.testing.assert_allclose(f.forecast(256).histogram.counts, want)


def test_default_is_the_documented_method():
    f = LengthForecaster(CAP)
    assert f.method == DEFAULT_METHOD == "mean" and f.mean_steps == "auto"
    f.observe_step([1000, 2000])
    assert f.forecast(2).method.startswith("mean, k=1 by backtest")
    text = DOCS.read_text(encoding="utf-8")
    assert re.search(r"default forecaster is `mean`", text), "docs/compute_sched.md must name the default forecaster"


def test_backtest_picks_averaging_for_noise_and_the_last_step_for_a_trend():
    """An alternating length (noise around a level) is best averaged; a steady climb is best followed."""
    base = np.array(step_sequence("stationary", 1, 512, CAP, seed=3)[0], dtype=float)
    alternating = [base * (1.3 if i % 2 else 1.0) for i in range(10)]
    climbing = [np.minimum(base * 1.08 ** i, CAP) for i in range(10)]
    assert select_mean_steps(alternating, CAP, 256) == 2
    assert select_mean_steps(climbing, CAP, 256) == 1


def test_arima_follows_a_steady_climb_that_every_mean_lags():
    base = np.array(step_sequence("stationary", 1, 2048, CAP, seed=5)[0], dtype=float)
    steps = [np.minimum(base * 1.05 ** i, CAP) for i in range(13)]
    errs = {}
    for name, kw in {"arima": {"method": "arima"}, "last": {"method": "last"}, "mean": {"method": "mean"}}.items():
        f = LengthForecaster(CAP, **kw)
        for s in steps[:-1]:
            f.observe_step(s)
        errs[name] = forecast_errors(f.forecast(len(base)).histogram, steps[-1])["workload"]
    assert errs["arima"] < 0.01 and errs["arima"] < errs["last"] / 3 and errs["last"] <= errs["mean"]


@pytest.mark.parametrize("order", [(1, 1, 0), (2, 1, 0), (1, 0, 0), (0, 1, 0)])
def test_arima_shortcut_forecasts_what_statsmodels_arima_forecasts(order):
    from statsmodels.tsa.arima.model import ARIMA

    y = 8.0 + np.cumsum(np.random.default_rng(7).normal(0.02, 0.05, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ARIMA(y, order=order, trend="t" if order[1] == 1 else "c").fit(method="burg").forecast(1)[0]
        assert _arima_one_step(y, order) == pytest.approx(float(want), abs=1e-10)


def test_arima_without_enough_history_says_it_fell_back():
    f = _forecaster("arima", min_history=4)
    for s in step_sequence("drift", 3, 256, CAP, seed=0):
        f.observe_step(s)
    got = f.forecast(256)
    assert got.method.startswith("fallback: history of 3 steps") and got.histogram.total == pytest.approx(256)


def test_bad_method_or_window_names_the_field():
    with pytest.raises(ConfigError, match="method.*last, mean, arima"):
        LengthForecaster(CAP, method="prophet")
    with pytest.raises(ConfigError, match="mean_steps"):
        LengthForecaster(CAP, mean_steps=0)
    assert set(METHODS) == {"last", "mean", "arima"}


def test_errors_score_the_tail_and_the_distance_mass_moves():
    actual = [300] * 90 + [5000] * 10
    late = LengthHistogram.from_lengths([556] * 90 + [5256] * 10, CAP)  # every response one bin longer
    e = forecast_errors(late, actual)
    assert e["bin_l1"] == pytest.approx(2.0) and e["w1"] > 0
    assert e["p99"] == pytest.approx(256 / 5107.2, rel=0.05) and e["p90"] > 0.3
    assert e["workload"] == pytest.approx(256 / (0.9 * 512 + 0.1 * 5120))


@pytest.mark.parametrize("regime", REGIMES)
def test_step_sequences_are_reproducible_grpo_steps(regime):
    a = step_sequence(regime, 12, 256, CAP, seed=3)
    b = step_sequence(regime, 12, 256, CAP, seed=3)
    assert len(a) == 12 and all(x.shape == (256,) and x.min() >= 16 and x.max() <= CAP for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], step_sequence(regime, 12, 256, CAP, seed=4)[0])
    # responses to one prompt share its difficulty: group means spread more than independent draws would
    groups = np.log(a[0].reshape(32, 8))
    assert groups.mean(axis=1).var() > 2 * groups.var(axis=1).mean() / 8


def test_regimes_move_the_distribution_the_way_their_sources_say():
    mean = {r: np.array([np.mean(s) for s in step_sequence(r, 30, 2048, CAP, seed=0)]) for r in REGIMES}
    assert abs(mean["stationary"][-5:].mean() / mean["stationary"][:5].mean() - 1) < 0.1
    assert mean["growth-plateau"][-5:].mean() > 1.8 * mean["growth-plateau"][:5].mean()
    assert abs(mean["growth-plateau"][-1] / mean["growth-plateau"][-8] - 1) < 0.1  # the plateau
    assert np.any(np.diff(mean["random-walk"]) > 0) and np.any(np.diff(mean["random-walk"]) < 0)
    skew = [np.percentile(s, 99) / np.median(s) for s in step_sequence("shorter-skewed", 30, 2048, CAP, seed=0)]
    assert mean["shorter-skewed"][-1] < 0.8 * mean["shorter-skewed"][0] and skew[-1] > 1.3 * skew[0]
    jumps = np.abs(np.diff(np.log(mean["curriculum-shift"])))
    assert jumps.max() > 0.3 and np.sort(jumps)[-2] < 0.15  # one shift, otherwise sampling noise
    with pytest.raises(ConfigError, match="regime"):
        step_sequence("sideways", 3, 64, CAP)


class _Captured(Exception):
    pass


def _forecast_replay_plans_with(monkeypatch, trace, **kw) -> np.ndarray:
    """The histogram ``replay`` hands the scheduler (the step itself is not run)."""
    import orchestrl.compute_sched.replay as rp
    from orchestrl.compute_sched.hardware import load_gpu, load_model
    from orchestrl.compute_sched.perf import PerfModel

    seen = []

    def spy(engine, perf, costs, forecast, *args, **kwargs):
        seen.append(forecast.counts.copy())
        raise _Captured

    monkeypatch.setattr(rp, "GenerationScheduler", spy)
    with pytest.raises(_Captured):  # start on TP=2, so no veRL-TO sweep (forecast-free) runs first
        rp.replay(trace, PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800")), 8, "orchestrl",
                  options=rp.ReplayOptions(initial_tp=2), **kw)
    return seen[0]


def test_replay_without_history_never_reads_the_traces_lengths(monkeypatch):
    from dataclasses import replace

    from orchestrl.compute_sched.traces import heavy_tailed_trace

    trace = heavy_tailed_trace(12, 8, 8192, seed=1)
    lengths = [q.output_tokens for q in trace.requests]
    other = replace(trace, requests=tuple(replace(q, output_tokens=min(8192, 2 * n))
                                          for q, n in zip(trace.requests, reversed(lengths))))
    a, b = (_forecast_replay_plans_with(monkeypatch, t) for t in (trace, other))
    np.testing.assert_array_equal(a, b)  # changed and permuted lengths: the same forecast
    assert a.sum() == pytest.approx(len(lengths))
    oa, ob = (_forecast_replay_plans_with(monkeypatch, t, forecast="oracle") for t in (trace, other))
    assert not np.array_equal(oa, ob)  # only the explicit oracle reads them
    np.testing.assert_array_equal(oa, LengthHistogram.from_lengths(lengths, 8192).counts)


def test_replay_labels_its_forecast_and_rejects_unknown_ones():
    from orchestrl.compute_sched.hardware import load_gpu, load_model
    from orchestrl.compute_sched.perf import PerfModel
    from orchestrl.compute_sched.replay import replay
    from orchestrl.compute_sched.traces import heavy_tailed_trace

    pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    trace = heavy_tailed_trace(8, 8, 4096, seed=2)
    assert replay(trace, pm, 8, "orchestrl").detail["forecast"].startswith("prior: bundled Figure 3 shape")
    assert "clairvoyant" in replay(trace, pm, 8, "orchestrl", forecast="oracle").detail["forecast"]
    with pytest.raises(ConfigError, match="forecast.*oracle"):
        replay(trace, pm, 8, "orchestrl", forecast="truth")
