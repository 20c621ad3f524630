"""Histogram, forecast and traces."""

from __future__ import annotations

import json

import pytest

from orchestrl.compute_sched.traces import heavy_tailed_trace, load_trace, save_trace
from orchestrl.compute_sched.workload import LengthForecaster, LengthHistogram, StepWorkload
from orchestrl.fabric.errors import ConfigError


def test_histogram_bins_use_their_upper_bound():
    h = LengthHistogram.from_lengths([1, 256, 257, 5000], max_tokens=1024)
    assert h.counts.tolist() == [2, 1, 0, 1]  # the cap bin absorbs lengths beyond it
    assert h.workload_tokens() == 2 * 256 + 512 + 1024


def test_step_workload_is_emptied_as_requests_finish():
    w = StepWorkload(LengthHistogram.from_lengths([300, 300, 900, 900], max_tokens=1024))
    probs, rem = w.conditional(0)
    assert probs.sum() == pytest.approx(1.0) and rem.max() == 1024
    w.observe_finished(900)
    w.observe_finished(900)
    probs, rem = w.conditional(600)  # nothing left above 600: conservative, run to the cap
    assert probs.tolist() == [1.0] and rem.tolist() == [424]


def test_forecast_without_history_falls_back_and_sums_to_the_batch():
    f = LengthForecaster(4096)
    fc = f.forecast(100)
    assert fc.method.startswith("fallback") and fc.histogram.total == pytest.approx(100)
    f.observe_step([100, 200, 4096])
    assert f.forecast(30).histogram.total == pytest.approx(30)
    with pytest.raises(ConfigError):
        f.observe_step([])


def test_trace_round_trip_and_validation(tmp_path):
    t = heavy_tailed_trace(8, 4, 2048, seed=2)
    path = tmp_path / "t.json"
    save_trace(t, path)
    assert load_trace(path) == t
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"max_tokens": 100, "requests": [{"prompt_tokens": 5, "output_tokens": 500}]}))
    with pytest.raises(ConfigError, match=r"requests\[0\].output_tokens"):
        load_trace(bad)
