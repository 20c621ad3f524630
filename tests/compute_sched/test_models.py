"""Specs, performance model and reconfiguration costs: what a planner relies on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import EngineCapabilities
from orchestrl.compute_sched.hardware import bundled_gpus, bundled_models, load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, Layout, Instance, aligned, candidate_configs, homogeneous, parse_config
from orchestrl.compute_sched.perf import MeasuredStep, PerfModel, calibrate
from orchestrl.fabric.errors import ConfigError

TP = {k: InstanceConfig("tp", tp=k) for k in (1, 2, 4, 8)}


@pytest.fixture(scope="module")
def pm14():
    return PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))


def test_table3_models_and_four_gpus_are_bundled():
    # Table 3, RollArt §3.1's model, and JigsawRL's pipelines (Qwen3-0.6B/4B/14B/32B, Llama-3.1-8B)
    assert set(bundled_models()) == {"Qwen2.5-14B", "Qwen2.5-32B", "Qwen2-57B-A14B", "Qwen2.5-72B", "Qwen3-235B-A22B",
                                     "Qwen3-8B", "Qwen3-0.6B", "Qwen3-4B", "Qwen3-14B", "Qwen3-32B", "Llama-3.1-8B"}
    assert set(bundled_gpus()) == {"H800", "H20", "H100", "A100"}
    moe = load_model("Qwen3-235B-A22B")
    assert moe.is_moe and 21e9 < moe.active_params < 23e9  # "A22B"
    assert 13.5e9 < load_model("qwen2-57b-a14b").active_params < 15e9


def test_bad_model_file_names_the_field(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("name: x\nparams_total: 1e9\nd_model: 10\nlayers: 2\nffn_intermediate: 4\n"
                   "query_heads: 4\nkv_heads: 3\nhead_dim: 8\nvocab: 10\n")
    with pytest.raises(ConfigError, match="kv_heads"):
        load_model(bad)
    with pytest.raises(ConfigError, match="bundled"):
        load_gpu("B200")


def test_kv_capacity_grows_with_tp_and_weights_must_fit(pm14):
    caps = [pm14.kv_capacity_tokens(TP[k]) for k in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[0] > 0
    big = PerfModel(load_model("Qwen2.5-72B"), load_gpu("H800"))
    assert not big.fits(TP[1]) and big.fits(TP[4])


def test_case_study_direction_in_the_roofline(pm14):
    """§2.1: with 512 requests on 8 H800s TP=2 has the best throughput; in the tail TP=8 is fastest."""
    early = {k: 512 / pm14.decode_step_s(TP[k], 512 / (8 // k), 512 / (8 // k) * 1500) for k in (2, 4, 8)}
    assert max(early, key=early.get) == 2
    tail = {k: pm14.decode_step_s(TP[k], max(1, 8 / (8 // k)), 8 / (8 // k) * 11000) for k in (2, 4, 8)}
    assert min(tail, key=tail.get) == 8


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.integers(1, 512), st.integers(0, 4_000_000))
def test_step_time_grows_with_batch_and_context(tp, batch, ctx):
    pm = PerfModel(load_model("Qwen2.5-32B"), load_gpu("H100"))
    cfg = InstanceConfig("tp", tp=tp)
    base = pm.decode_step_s(cfg, batch, ctx)
    assert base > 0
    # One exception, as in vLLM: where the step's all-reduce buffer (batch x d_model bf16) crosses the
    # custom all-reduce's one-shot limit, the kernel switches to two-shot, which moves fewer bytes (the
    # model has no extra latency for the two-shot), so the step may get faster there; with the
    # one-shot kept on both sides, the step must still grow.
    one_shot = pm.with_calibration(replace(pm.cal, one_shot_max_bytes=math.inf))
    switch = 1 < tp <= 8 and batch * pm.model.d_model * 2 <= pm.cal.one_shot_max_bytes < (batch + 1) * pm.model.d_model * 2
    assert (one_shot if switch else pm).decode_step_s(cfg, batch + 1, ctx) >= base
    assert pm.decode_step_s(cfg, batch, ctx + 10_000) >= base


def test_moe_configurations_and_afd_loses_its_overlap_in_the_tail():
    pm = PerfModel(load_model("Qwen2-57B-A14B"), load_gpu("H800"))
    configs = candidate_configs(32, 8, moe=True)
    names = [c.name for c in configs]
    assert "ep16-tp1" in names and "afd12:4-tp1" in names and "tp16" in names
    afd = parse_config("afd12:4-tp1")
    ep = parse_config("ep16-tp1")
    # AFD pays its three stages in sequence at small batch, so per token it degrades more than EP.
    ratio = lambda c: (pm.decode_step_s(c, 8, 8 * 8000) / 8) / (pm.decode_step_s(c, 512, 512 * 2000) / 512)
    assert ratio(afd) > 1 and ratio(ep) > 1
    assert pm.kv_capacity_tokens(afd) > 0


def test_layouts_refuse_overlapping_gpus():
    tp4 = InstanceConfig("tp", tp=4)
    with pytest.raises(ConfigError, match="Eq. 3"):
        Layout((Instance(tp4, (0, 1, 2, 3)), Instance(tp4, (3, 4, 5, 6))), 8)
    assert homogeneous(tp4, 16).describe() == "4x tp4"
    with pytest.raises(ConfigError):
        parse_config("tpx")


def test_aligned_layouts_keep_instances_inside_their_domain():
    afd = parse_config("afd24:16-tp8")
    pods = [g // 256 for g in range(768)] + [3] * 96  # three PoDs and a 96-GPU remainder
    lay = aligned(afd, pods)
    assert lay.describe() == "20x afd24:16-tp8"  # 6 + 6 + 6 + 2, where packing end to end fits 21
    assert all(len({pods[g] for g in inst.gpu_ids}) == 1 for inst in lay.instances)
    assert aligned(parse_config("tp8"), pods).describe() == homogeneous(parse_config("tp8"), len(pods)).describe()
    with pytest.raises(ConfigError, match="consecutive"):
        aligned(afd, [0] * 40 + [1] * 40 + [0] * 8)
    assert aligned(afd, [g // 16 for g in range(64)]).describe() == "1x afd24:16-tp8"  # larger than any domain


def test_calibration_recovers_a_known_scale(pm14):
    pts = [MeasuredStep(TP[2], b, b * 3000.0, 0.8 * pm14.decode_step_s(TP[2], b, b * 3000.0) + 0.002)
           for b in (4, 32, 128, 256)]
    cal = calibrate(pm14, pts)
    assert cal.cal.scale == pytest.approx(0.8, rel=1e-6) and cal.cal.offset_s == pytest.approx(0.002, abs=1e-9)
    with pytest.raises(ConfigError):
        calibrate(pm14, pts[:1])


def test_switch_and_migration_costs_follow_appendix_a(pm14):
    costs = CostModel(pm14)
    assert costs.switch(TP[2], TP[2]).seconds == 0.0
    finer = costs.switch(TP[2], TP[8])  # a TP=8 shard is a slice of the TP=2 shard already held
    coarser = costs.switch(TP[8], TP[2])
    assert finer.bytes_moved == 0 and coarser.bytes_moved > 0 and coarser.seconds > finer.seconds
    # Figure 19, for an engine that can ship KV: recomputation for a small cache, transfer for a large one.
    what_if = CostModel(pm14, capabilities=EngineCapabilities.assume_kv_transfer())
    assert what_if.migration(TP[8], [500]).method == "recompute"
    assert what_if.migration(TP[8], [12000] * 64).method == "transfer"
    slow = CostModel(pm14, capabilities=what_if.capabilities, transfer_link_bps=1e9)  # a thin link: recompute wins
    assert slow.migration(TP[8], [12000] * 64).method == "recompute"


@given(contexts=st.lists(st.integers(1, 32_000), min_size=1, max_size=128), tp=st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_a_recompute_only_cost_model_never_prices_a_transfer(contexts, tp):
    """The default (what the vLLM adapter can do) recomputes even where a transfer would be cheaper."""
    pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    plain = CostModel(pm).migration(TP[tp], contexts)
    what_if = CostModel(pm, capabilities=EngineCapabilities.assume_kv_transfer()).migration(TP[tp], contexts)
    assert plain.method == "recompute"
    assert plain.seconds == pytest.approx(CostModel(pm).recompute_s(TP[tp], contexts))
    assert what_if.seconds <= plain.seconds  # the what-if only ever adds an option
