"""The measured step model: bundled data, predictors, out-of-sample accuracy, interface and derived GPUs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from orchestrl.compute_sched.calibration import (DEFAULT_STEP_MODEL, bundled_calibration, load_calibration,
                                                 perf_model)
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import Calibration, PerfModel
from orchestrl.compute_sched.step_data import (VIDUR_COMMIT, VIDUR_DIR, collective_table, operator_tables,
                                               read_operator_csv)
from orchestrl.compute_sched.step_measured import MeasuredPerfModel, block_shapes, operator_set
from orchestrl.compute_sched.step_validation import analytical_block_s, validate_blocks
from orchestrl.fabric.errors import ConfigError

TP = [InstanceConfig("tp", tp=t) for t in (1, 2, 4, 8)]


def test_bundled_vidur_data_carries_its_licence_and_provenance():
    assert "MIT License" in (VIDUR_DIR / "LICENSE").read_text()
    readme = (VIDUR_DIR / "README.md").read_text()
    assert VIDUR_COMMIT in readme and "LFS" in readme and "cpu_overheads.csv" in readme
    h100 = operator_tables("h100")
    assert len(h100) == 6 and all(t.tps == (1, 2, 4, 8) for t in h100 if "phi-2" not in t.model)
    assert sorted(collective_table("h100").sizes) == [2, 4, 8]


def test_a_malformed_profile_is_refused_naming_file_column_and_line(tmp_path):
    src = VIDUR_DIR / "compute" / "h100" / "internlm__internlm-20b.csv"
    lines = src.read_text().splitlines()
    cols = lines[0].split(",")
    row = lines[1].split(",")
    row[cols.index("time_stats.mlp_up_proj.median")] = "fast"
    bad = tmp_path / "mlp.csv"
    bad.write_text("\n".join([lines[0], ",".join(row)]) + "\n")
    with pytest.raises(ConfigError, match=r"mlp.csv.*time_stats.mlp_up_proj.median \(line 2\).*'fast'"):
        read_operator_csv(bad, "h100", "x")
    missing = tmp_path / "short.csv"
    missing.write_text("num_tokens,num_tensor_parallel_workers\n1,1\n")
    with pytest.raises(ConfigError, match="column missing"):
        read_operator_csv(missing, "h100", "x")


def test_a_measured_shape_comes_back_as_measured_and_others_are_interpolated():
    ops = operator_set(load_gpu("H100"))
    t = next(x for x in operator_tables("h100") if x.model == "internlm/internlm-20b")
    k, n = t.gemm_shapes(2)["mlp_down_proj"]
    ms = t.tokens[2]
    got = ops.gemm_s(ms, k, n)
    measured = t.times_ms["mlp_down_proj", 2] * 1e-3
    assert np.median(np.abs(got / measured - 1)) < 0.01  # exact up to the 3-point running median
    # Qwen2.5-14B's QKV projection was never measured: it lands between the measured shapes' times
    s = block_shapes(load_model("Qwen2.5-14B"), 1)
    assert ops.gemm_s(1, 5120, 5120) < ops.gemm_s(1, *s.qkv) < ops.gemm_s(1, *s.mlp_up)


def test_out_of_sample_block_errors_meet_the_target_and_beat_the_analytical_model():
    """One held-out model (the full leave-one-model-out table is bench/step_model.py's part A)."""
    v = validate_blocks("H100", held_out=["codellama/CodeLlama-34b-Instruct-hf"])
    assert {c.tp for c in v.cells} == {1, 2, 4, 8} and len(v.cells) == 12
    assert all(c.median <= 0.10 and c.worst <= 0.25 for c in v.cells), [c.to_json() for c in v.cells]
    assert sum(c.median < c.analytical_median for c in v.cells) >= 9  # 12 of 12 over all six held-out models
    assert v.median < v.analytical_median and v.worst < max(c.analytical_worst for c in v.cells)


def test_the_validations_analytical_block_is_perf_models_formula():
    """analytical_block_s is PerfModel's GEMM term + layer overhead for a one-layer model of the block."""
    t = next(x for x in operator_tables("h100") if x.model == "meta-llama/Llama-2-70b-hf")
    params = float(sum(k * n for k, n in t.gemm_shapes(1).values()))
    spec = replace(load_model("Qwen2.5-14B"), name="block", params_total=params, layers=1)
    gpu = load_gpu("H100")
    x = (0.9, 0.5, 0.6, 5e-5)
    cal = Calibration(mem_efficiency=x[0], compute_efficiency=x[1], prefill_efficiency=x[2], layer_overhead_s=x[3],
                      step_overhead_s=0.0, seq_overhead_s=0.0)
    pm = PerfModel(spec, gpu, cal)
    for tp in (1, 4):
        cfg = InstanceConfig("tp", tp=tp)
        for m in (1.0, 300.0):
            comm = 2 * pm._allreduce_s(tp, m * spec.d_model * 2, cfg)
            ours = analytical_block_s(x, np.array([params / tp]), np.array([m]), gpu)[0]
            assert ours == pytest.approx(pm._gpu_step_s(cfg, m, 0.0) - comm, rel=1e-9)
        m = 2048.0
        ours = analytical_block_s(x, np.array([params / tp]), np.array([m]), gpu)[0]
        assert ours == pytest.approx(pm.prefill_s(cfg, m, 0.0) - pm._prefill_comm_s(cfg, m), rel=1e-9)


def test_measured_model_keeps_its_class_through_perf_models_copies():
    pm = MeasuredPerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    assert type(pm.with_calibration(Calibration(step_overhead_s=1e-3))) is MeasuredPerfModel
    assert type(pm.with_network(None)) is MeasuredPerfModel and pm.at((0, 1)).step_model == "measured"


def test_steps_grow_with_batch_and_context_and_tp_shortens_a_lone_sequence():
    pm = MeasuredPerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    for cfg in TP:
        f = [pm.decode_step_s(cfg, b, b * c) for b, c in ((1, 1000), (64, 1000), (64, 8000), (256, 8000))]
        assert f == sorted(f)
    lone = [pm.decode_step_s(cfg, 1, 4000) for cfg in TP]
    assert lone == sorted(lone, reverse=True)
    assert pm.prefill_s(TP[0], 8192) > pm.prefill_s(TP[0], 1024) > 0


def test_derived_gpus_follow_their_datasheets():
    model = load_model("Qwen2.5-14B")
    h100, h800, h20 = (MeasuredPerfModel(model, load_gpu(g), Calibration()) for g in ("H100", "H800", "H20"))
    tp1, tp8 = TP[0], TP[3]
    # the H800 is an H100 with slower NVLink: TP=1 identical, TP=8 all-reduces of a prefill slower
    assert h800._gpu_step_s(tp1, 64, 64 * 4000) == pytest.approx(h100._gpu_step_s(tp1, 64, 64 * 4000))
    assert h800.prefill_s(tp8, 8192) > 1.2 * h100.prefill_s(tp8, 8192)
    # the H20: 4.0 TB/s but 148 TFLOP/s -- faster for a lone decode, several times slower to prefill
    assert h20._gpu_step_s(tp1, 1, 2000) < h800._gpu_step_s(tp1, 1, 2000)
    assert h20.prefill_s(tp1, 4096) > 4 * h800.prefill_s(tp1, 4096)


def test_moe_and_afd_instances_are_timed():
    pm = MeasuredPerfModel(load_model("Qwen2-57B-A14B"), load_gpu("H800"))
    for cfg in (InstanceConfig("tp", tp=8), InstanceConfig("ep", ep=16, tp=1),
                InstanceConfig("afd", attn_gpus=8, ffn_gpus=8, tp=8)):
        small, big = pm.decode_step_s(cfg, 8, 8 * 2000), pm.decode_step_s(cfg, 256, 256 * 2000)
        assert 0 < small < big and pm.prefill_s(cfg, 4096) > 0


def test_perf_model_defaults_to_the_measured_step_model_and_names_the_other():
    assert DEFAULT_STEP_MODEL == "measured"
    pm = perf_model("Qwen2.5-14B", "H800")
    assert isinstance(pm, MeasuredPerfModel) and pm.cal == load_calibration(bundled_calibration("H800", "measured"))
    assert type(perf_model("Qwen2.5-14B", "H800", step_model="analytical")) is PerfModel
    with pytest.raises(ConfigError, match="step_model.*measured, analytical"):
        perf_model("Qwen2.5-14B", "H800", step_model="vidur")


def test_the_measured_calibration_fits_host_constants_only_and_keeps_the_orderings():
    import yaml

    path = bundled_calibration("H800", "measured")
    doc = yaml.safe_load(path.read_text())
    assert doc["step_model"] == "measured"
    assert set(doc["fitted"]) == {"step_overhead_s", "seq_overhead_s", "host_overlap"}
    assert doc["orderings_ok"] is True and len(doc["leave_one_out"]) == 6
    assert all(abs(h["rel_err"]) <= 0.15 for h in doc["leave_one_out"])  # each point predicted from the other five
    from orchestrl.compute_sched.calibration import calibration_setup
    from orchestrl.compute_sched.case_study import case_study_times

    now = case_study_times(perf_model("Qwen2.5-14B", "H800"), calibration_setup(path))
    for row in doc["points"]:  # the stored residuals are this model's
        assert now[row["phase"], row["tp"]] == pytest.approx(row["model_s"], rel=0.01)
    assert now["tail", 4] / now["tail", 8] > 1.10  # TP=8's tail edge (paper 1.141), from the measured all-reduces


def test_gpu_check_comparison_reads_the_committed_run(tmp_path):
    from orchestrl.compute_sched.step_check import compare_gpu_check
    from orchestrl.compute_sched.step_data import MEASURED_DIR

    rep = compare_gpu_check(sorted(MEASURED_DIR.glob("h100-*"))[-1])
    text = rep.table()
    assert "whole decoder layer" in text and rep.to_json()["summary"]["layer_sum_of_own_operators"]["median"] < 0.1
    with pytest.raises(ConfigError, match="mlp.csv"):
        compare_gpu_check(tmp_path)
