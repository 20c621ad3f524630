"""The analytical model's H800 calibration: fitted to the six measured times of OrchestrRL §2.1, and reproducing them.

The measured step model's calibration (host constants only) is tested in test_step_model.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from orchestrl.compute_sched.calibration import (FitParameter, bundled_calibration, calibration_setup, fit_case_study,
                                       leave_one_out, load_calibration, orderings_ok, perf_model)
from orchestrl.compute_sched.case_study import PAPER_POINTS, CaseStudySetup, PaperPoint, case_study_times
from orchestrl.compute_sched.perf import Calibration
from orchestrl.fabric.errors import ConfigError

TOLERANCE = 0.15  # relative error allowed per measured point


@pytest.fixture(scope="module")
def calibrated_times():
    return case_study_times(perf_model("Qwen2.5-14B", "H800", step_model="analytical"),
                            calibration_setup(bundled_calibration("H800")))


def test_bundled_h800_calibration_reproduces_the_six_measured_times(calibrated_times):
    errors = {(p.phase, p.tp): calibrated_times[p.phase, p.tp] / p.seconds - 1.0 for p in PAPER_POINTS}
    assert all(abs(e) <= TOLERANCE for e in errors.values()), errors


def test_the_roofline_alone_misses_them():
    """Without the calibration file the model is far off: the test above needs the calibration."""
    roofline = case_study_times(perf_model("Qwen2.5-14B", "H800", "roofline", "analytical"),
                                calibration_setup(bundled_calibration("H800")))
    assert max(abs(roofline[p.phase, p.tp] / p.seconds - 1.0) for p in PAPER_POINTS) > 2 * TOLERANCE


def test_calibrated_model_keeps_the_orderings_of_2_1(calibrated_times):
    """Early: TP=2 < TP=4 < TP=8; tail: TP=8 < TP=4 < TP=2 (the effect the compute scheduler exploits)."""
    assert orderings_ok(calibrated_times), calibrated_times
    t = calibrated_times
    assert t["early", 4] / t["early", 2] > 1.10 and t["tail", 2] / t["tail", 8] > 1.15  # paper 1.22, 1.26


def test_calibration_file_records_a_bounded_fit_and_its_residuals(calibrated_times):
    path = bundled_calibration("H800")
    assert path is not None and path.name == "qwen2.5-14b-h800-paper.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    for name, item in doc["fitted"].items():
        assert item["lower"] <= item["value"] <= item["upper"] and item["why"], name
        width = item["upper"] - item["lower"]
        at_edge = min(item["value"] - item["lower"], item["upper"] - item["value"]) <= 0.011 * width
        assert item["on_bound"] == at_edge, name  # a constant pushed to its box edge is flagged as such
    held = {(h["phase"], h["tp"]): h for h in doc["leave_one_out"]}
    assert sorted(held) == sorted((p.phase, p.tp) for p in PAPER_POINTS)  # every point was predicted out of sample
    assert all(abs(h["rel_err"]) <= TOLERANCE for h in held.values()), held
    assert doc["orderings_ok"] is True and len(doc["assumption_sweep"]) >= 2
    assert doc["checks"]["verl_to_best_static_tp_14b_16gpus"]  # the out-of-sample veRL-TO check is recorded
    for row in doc["points"]:
        now = calibrated_times[row["phase"], row["tp"]]
        assert now == pytest.approx(row["model_s"], rel=0.01)  # the stored residuals are this model's
        assert row["rel_err"] == pytest.approx(now / row["paper_s"] - 1.0, abs=0.01)


def test_fit_recovers_known_constants():
    setup = CaseStudySetup(prompts=16, seeds=(0,))
    base = perf_model("Qwen2.5-14B", "H800", "roofline", "analytical")
    truth = replace(base.cal, step_overhead_s=4e-3, seq_overhead_s=30e-6)
    points = [PaperPoint(ph, tp, s) for (ph, tp), s in case_study_times(base.with_calibration(truth), setup).items()]
    params = [FitParameter("step_overhead_s", 1e-4, 1e-2, "host"), FitParameter("seq_overhead_s", 1e-6, 1e-4, "host")]
    fit = fit_case_study(base, params, setup=setup, points=points, starts=1, max_nfev=30)
    assert fit.calibration.step_overhead_s == pytest.approx(4e-3, rel=0.05)
    assert fit.calibration.seq_overhead_s == pytest.approx(30e-6, rel=0.05)
    assert fit.rms_log_error < 0.01


def test_leave_one_out_predicts_each_point_from_the_others():
    """On data the model can produce exactly, every held-out point is predicted (near-)exactly."""
    setup = CaseStudySetup(prompts=16, seeds=(0,), snapshot="tokens", window_tokens=2048)
    base = perf_model("Qwen2.5-14B", "H800", "roofline", "analytical")
    truth = replace(base.cal, step_overhead_s=4e-3)
    points = [PaperPoint(ph, tp, s) for (ph, tp), s in case_study_times(base.with_calibration(truth), setup).items()]
    fit = fit_case_study(base, [FitParameter("step_overhead_s", 1e-4, 1e-2, "host")], setup=setup, points=points,
                         starts=1, max_nfev=20)
    held = leave_one_out(base, fit, max_nfev=10)
    assert [h.point for h in held] == list(fit.points)
    assert max(abs(h.rel_error) for h in held) < 0.01
    assert all(h.fitted["step_overhead_s"] == pytest.approx(4e-3, rel=0.05) for h in held)


def test_calibration_file_names_its_assumptions():
    setup = calibration_setup(bundled_calibration("H800"))
    assert setup.snapshot in ("requests", "tokens", "own-run") and setup.max_tokens > 0


def test_own_run_snapshot_cuts_each_layouts_whole_step_where_a_quarter_is_left():
    """Each TP's early + tail is its own whole-step makespan, and the cut sits where 25% are left."""
    from orchestrl.compute_sched.replay import replay

    pm = perf_model("Qwen2.5-14B", "H800", step_model="analytical")
    setup = CaseStudySetup(snapshot="own-run", tail_fraction=0.25, prompts=16, seeds=(5,))
    t = case_study_times(pm, setup)
    trace = setup.traces()[0]
    for tp in (2, 4, 8):
        run = replay(trace, pm, 8, f"static-tp:{tp}")
        assert t["early", tp] + t["tail", tp] == pytest.approx(run.makespan_s, rel=0.02)
        finish = sorted(f.finish_time_s for f in run.report.finished)
        assert t["early", tp] == pytest.approx(finish[len(finish) - 1 - 32], abs=0.5)  # 32 of 128 left
    # the layouts differ in where their own split leaves the long requests, so the cuts differ too
    assert len({round(t["early", tp], 1) for tp in (2, 4, 8)}) == 3
    with pytest.raises(ConfigError, match="own-run"):
        CaseStudySetup(snapshot="own")


def test_fit_refuses_an_underdetermined_problem():
    params = [FitParameter("step_overhead_s", 1e-4, 1e-2, "x")] * 7
    with pytest.raises(ConfigError, match="parameters"):
        fit_case_study(perf_model("Qwen2.5-14B", "H800", "roofline", "analytical"), params)
    with pytest.raises(ConfigError, match="not a fittable"):
        FitParameter("scale", 0.5, 2.0, "x")


def test_load_calibration_names_bad_fields(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: H800\nfitted:\n  mem_efficency: {value: 0.7, lower: 0.5, upper: 0.9}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mem_efficency"):
        load_calibration(bad)
    out = tmp_path / "out.yaml"
    out.write_text("gpu: H800\nfitted:\n  mem_efficiency: {value: 0.95, lower: 0.5, upper: 0.9}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="outside its bounds"):
        load_calibration(out)


def test_perf_model_picks_the_gpus_file_or_the_roofline():
    analytical = perf_model("Qwen2.5-32B", "H800", step_model="analytical")
    assert analytical.cal == load_calibration(bundled_calibration("H800"))
    assert perf_model("Qwen2.5-32B", "H800", "roofline", "analytical").cal == Calibration()
    assert perf_model("Qwen2.5-14B", "A100", step_model="analytical").cal == Calibration()  # no A100 file


def test_per_draw_spread_reports_where_the_papers_ratios_fall_among_single_draws():
    from orchestrl.compute_sched.calibration_h800 import per_draw_spread

    pm = perf_model("Qwen2.5-14B", "H800", step_model="analytical")
    setup = CaseStudySetup(prompts=16, seeds=(0,))
    spread = per_draw_spread(pm, setup, seeds=range(3))
    tail = spread["ratios"]["tail_tp4_over_tp8"]
    assert tail["paper"] == pytest.approx(188.3 / 165.1, abs=1e-3)
    lo, mid, hi = tail["p5_p50_p95"]
    assert tail["min_max"][0] <= lo <= mid <= hi <= tail["min_max"][1]
    seed = spread["closest"]["seed"]
    one = case_study_times(pm, replace(setup, seeds=(seed,)))
    assert spread["closest"]["ratios"]["tail_tp4_over_tp8"] == pytest.approx(one["tail", 4] / one["tail", 8], abs=1e-3)
    # the bundled file carries the 40-draw spread of its own constants
    doc = yaml.safe_load(bundled_calibration("H800").read_text())
    assert doc["checks"]["per_draw_spread"]["draws"] == 40
