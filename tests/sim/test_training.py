"""The training stage of RLSim: the MFU model against published points, the 1F1B pipeline, collectives
timed on the fabric, and RFabric's reconfigurations going through the real controller and gate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.sim.network import NetworkSim, RFabricDriver, SimConfig, build_fabric
from orchestrl.sim.stages.training import TrainBatch, TrainingOptions, TrainingStage, UnservedTraffic
from orchestrl.sim.train.flops import ArchSpec
from orchestrl.sim.train.layouts import train_layout
from orchestrl.sim.train.mfu import IdealNetwork, constant_baseline, default_calibration, load_points
from orchestrl.sim.train.schedule import one_f_one_b
from orchestrl.sim.train.step import Efficiency, LayerComm, TrainLayout, grad_traffic, microbatch_times

H800 = load_gpu("H800")
MOE57 = load_model("Qwen2-57B-A14B")


def _stage(model, layout, fabric="ft", gpus=None, config=None, **kw):
    n = layout.world_size
    return TrainingStage(model, layout, range(n), H800, NetworkSim(fabric, gpus=gpus or n, config=config), **kw)


def _rfabric_runs(switch_s, mode, iterations=3, gap_s=60.0):
    """Steady-state step time of Qwen2-57B-A14B (TP4 EP16 DP128) on a 2-PoD RFabric, and the stage."""
    fab = build_fabric("rfabric", 512)
    stage = TrainingStage(MOE57, ParallelLayout(tp=4, ep=16, dp=128), range(512), H800,
                          NetworkSim(fab, circuits="fixed"), RFabricDriver(fab, switch_delay_s=switch_s),
                          options=TrainingOptions(reconfigure=mode))
    batch, t, res = TrainBatch.uniform(1024, 5120), 0.0, None
    for _ in range(iterations):
        res = stage.run(batch, t)
        t += res.time_s + gap_s  # generation and weight sync happen in between
    return res, stage


# ---------------------------------------------------------------------------------- the MFU model

def test_mfu_model_reproduces_its_points_and_predicts_each_one_left_out():
    cal = default_calibration()
    s = cal.summary()
    assert len(cal.fitted) >= 9
    assert s["in_sample_max_abs"] < 0.15
    # out of sample: every fitted point predicted by a fit that never saw it
    assert s["leave_one_out_mean_abs"] < 0.13 and s["leave_one_out_max_abs"] < 0.22
    # and far better than what one would use without a model: the others' mean MFU
    const_mean, const_max = constant_baseline()
    assert s["leave_one_out_mean_abs"] < 0.5 * const_mean and s["leave_one_out_max_abs"] < 0.5 * const_max


def test_the_published_step_times_are_reproduced_where_the_source_gives_them():
    # AutoModel gives seconds per global step; the model predicts them from FLOPs, layout and network
    published = {"automodel-deepseek-v3-1024gpu": 37.87, "automodel-deepseek-v3-256gpu": 8.18,
                 "automodel-kimi-k2-256gpu": 8.86, "automodel-qwen3-30b-a3b-8gpu": 21.773,
                 "automodel-gpt-oss-20b-8gpu": 10.04, "automodel-gpt-oss-120b-64gpu": 4.30}
    got = {p.id: p.step_s for p in default_calibration().fitted}
    for pid, secs in published.items():
        assert got[pid] == pytest.approx(secs, rel=0.15), pid


def test_a_points_file_with_a_bad_entry_names_the_field(tmp_path):
    text = (load_points.__globals__["POINTS_FILE"]).read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text(text.replace("model: DeepSeek-V3\n", "model: DeepSeek-V9\n", 1))
    with pytest.raises(ConfigError, match=r"points\[3\]\.model"):
        load_points(bad)
    bad.write_text(text.replace("gpus: 8192", "gpus: 8000", 1))
    with pytest.raises(ConfigError, match=r"points\[0\]\.layout\.tp.*divide"):
        load_points(bad)


def test_table3_shapes_give_the_published_sizes():
    for name, total, active in (("Qwen2-57B-A14B", 57.41e9, 14.2e9), ("Qwen3-235B-A22B", 235e9, 22.2e9),
                                ("Qwen2.5-72B", 72.7e9, 72.7e9)):
        a = ArchSpec.from_model(load_model(name))
        assert a.params_total == pytest.approx(total, rel=0.02)
        assert a.params_active == pytest.approx(active, rel=0.03)


# ---------------------------------------------------------------------------------- the network

def test_the_calibration_network_in_closed_form_matches_the_simulator_on_a_fat_tree():
    cfg = SimConfig()  # 200 Gb/s NICs, 400 GB/s NVLink (200 GB/s each way)
    ideal = IdealNetwork(nic_bytes_per_s=cfg.link_bps / 8, nvlink_bytes_per_s=cfg.nvlink_bps / 8)
    sim = NetworkSim("ft", gpus=256)
    g = parallel_groups(ParallelLayout(tp=4, ep=16, dp=16, pp=4), range(256))
    for kind, prim, size in (("ep", "all-to-all", 64e6), ("dp", "reduce-scatter", 2e9), ("dp", "all-gather", 1e9),
                             ("tp", "all-gather", 32e6)):
        groups = tuple(map(tuple, g[kind]))
        n, k = len(groups[0]), int(np.bincount(np.asarray(groups[0]) // 8).max())
        want = ideal.alltoall_s(size, n, k) if prim == "all-to-all" else ideal.ring_s(prim, size, n, k)
        assert sim.time_collective(Collective(prim, groups, size)).time_s == pytest.approx(want, rel=0.03), kind


def test_faster_links_never_make_training_slower():
    layout = ParallelLayout(tp=4, ep=16, dp=64)
    batch = TrainBatch.uniform(256, 4096)
    for fabric in ("ft", "ft-os"):
        times = [_stage(MOE57, layout, fabric, config=SimConfig(link_bps=b)).run(batch).time_s
                 for b in (100e9, 200e9, 400e9, 800e9)]
        assert all(a >= b for a, b in zip(times, times[1:])), (fabric, times)
        assert times[0] > 1.2 * times[-1]  # and the network matters for this MoE job
    ft = _stage(MOE57, layout, "ft").run(batch).time_s
    assert _stage(MOE57, layout, "ft-os").run(batch).time_s > ft  # the all-to-all crosses FT-OS uplinks


def test_ftos_slows_the_dp_sync_by_what_its_uplinks_predict():
    # TP8 x PP8 with DP outermost: DP neighbours are 8 servers apart, so every ring hop leaves its
    # FT-OS leaf (6 servers, 48 NICs, 16 uplinks); 384 GPUs = 8 whole leaves on 2 spines
    model = load_model("Qwen2.5-14B")
    layout = ParallelLayout(tp=8, pp=8, dp=6, order="tp-pp-dp")
    groups = parallel_groups(layout, range(384))["dp"]
    out = np.zeros(8)
    for grp in groups:
        for a, b in zip(grp, grp[1:] + grp[:1]):
            if a // 48 != b // 48:
                out[a // 48] += 1
    predicted = max(1.0, out.max() / 16)  # ring flows leaving the busiest leaf per uplink
    assert predicted == pytest.approx(3.0)
    # the same sync at the NIC rate, which a non-blocking fabric gives
    cfg = SimConfig()
    ideal = IdealNetwork(nic_bytes_per_s=cfg.link_bps / 8, nvlink_bytes_per_s=cfg.nvlink_bps / 8)
    grads = grad_traffic(ArchSpec.from_model(model), TrainLayout.from_parallel(layout))
    nic_bound = (ideal.ring_s("reduce-scatter", grads.reduce_scatter_bytes("dense"), 6, 1)
                 + ideal.ring_s("all-gather", grads.all_gather_bytes("dense"), 6, 1))
    batch = TrainBatch.uniform(64, 4096)
    os3 = _stage(model, layout, "ft-os").run(batch)
    assert os3.breakdown_s["dp_sync_s"] / nic_bound == pytest.approx(predicted, rel=0.03)
    assert os3.time_s > _stage(model, layout, "ft").run(batch).time_s


# ---------------------------------------------------------------------------------- the pipeline

@pytest.mark.parametrize("stages,micro", [(1, 4), (2, 2), (4, 8), (8, 3), (8, 64)])
def test_1f1b_without_transfer_costs_has_the_textbook_bubble(stages, micro):
    run = one_f_one_b(stages, micro, 1.0, 2.0)
    assert run.makespan_s == pytest.approx((micro + stages - 1) * 3.0)
    idle = 1.0 - run.busy_s() / run.makespan_s
    assert idle == pytest.approx((stages - 1) / (micro + stages - 1))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24), st.floats(0.1, 3.0), st.floats(0.1, 3.0), st.floats(0.0, 1.0))
def test_1f1b_respects_every_dependency(stages, micro, f, b, p2p):
    run = one_f_one_b(stages, micro, f, b, p2p)
    eps = 1e-9
    for s in range(1, stages):
        assert np.all(run.fwd_start[s] >= run.fwd_end[s - 1] + p2p - eps)
    for s in range(stages - 1):
        assert np.all(run.bwd_start[s] >= run.bwd_end[s + 1] + p2p - eps)
    assert np.all(run.bwd_start[-1] >= run.fwd_end[-1] - eps)
    for s in range(stages):  # one operation at a time per stage
        spans = sorted(zip(np.r_[run.fwd_start[s], run.bwd_start[s]], np.r_[run.fwd_end[s], run.bwd_end[s]]))
        assert all(e <= n + eps for (_, e), (n, _) in zip(spans, spans[1:]))
    assert run.makespan_s >= (micro + stages - 1) * (f + b) + 2 * (stages - 1) * p2p - eps


def test_the_stage_bubble_on_one_server_is_the_1f1b_formula():
    model = load_model("Qwen2.5-14B")
    stage = _stage(model, ParallelLayout(tp=2, pp=4), gpus=8)  # everything on NVLink
    r = stage.run(TrainBatch.uniform(24, 4096))
    m = r.detail["microbatches"]
    per_mb = (r.breakdown_s["compute_s"] + r.breakdown_s["tp_s"]) / m
    assert r.breakdown_s["bubble_s"] == pytest.approx(3 * per_mb, rel=1e-6)
    assert r.breakdown_s["bubble_s"] / (r.breakdown_s["bubble_s"] + m * per_mb) == pytest.approx(3 / (m + 3))


def test_long_samples_cost_more_than_short_ones_of_the_same_tokens():
    stage = _stage(load_model("Qwen2.5-14B"), ParallelLayout(tp=8, pp=2, dp=2), gpus=32)
    short = stage.run(TrainBatch.uniform(64, 2048))
    long_ = stage.run(TrainBatch((16384,) * 8))
    assert short.tokens == long_.tokens and long_.time_s > 1.05 * short.time_s


def test_recomputation_runs_the_forward_twice():
    layout = ParallelLayout(tp=4, ep=16, dp=64)
    plain = _stage(MOE57, layout).run(TrainBatch.uniform(256, 4096))
    redo = _stage(MOE57, layout, options=TrainingOptions(recompute=True)).run(TrainBatch.uniform(256, 4096))
    assert redo.breakdown_s["compute_s"] == pytest.approx(plain.breakdown_s["compute_s"] * 4 / 3)
    assert redo.detail["mfu"] < plain.detail["mfu"]


def test_warm_iterations_retime_nothing():
    net = NetworkSim("ft-os", gpus=256)
    stage = TrainingStage(MOE57, ParallelLayout(tp=4, ep=16, dp=64), range(256), H800, net)
    first = stage.run(TrainBatch.uniform(256, 4096))
    misses = net.stats.misses
    again = stage.run(TrainBatch.uniform(256, 4096), now_s=100.0)
    assert net.stats.misses == misses and again.time_s == pytest.approx(first.time_s, rel=1e-12)


# ---------------------------------------------------------------------------------- RFabric

def test_rfabric_pays_its_switching_only_when_it_reconfigures_every_period():
    ft = _stage(MOE57, ParallelLayout(tp=4, ep=16, dp=128)).run(TrainBatch.uniform(1024, 5120)).time_s
    free, _ = _rfabric_runs(0.0, "per-period")
    piezo, _ = _rfabric_runs(25e-3, "per-period")
    slow, _ = _rfabric_runs(120.0, "per-period")
    # two boundaries per step (into grad sync, back to fwd/bwd), each waiting for the devices
    assert piezo.time_s - free.time_s == pytest.approx(2 * 25e-3, rel=0.05)
    assert piezo.time_s == pytest.approx(ft, rel=0.10) and piezo.time_s < 1.02 * free.time_s
    assert slow.time_s - free.time_s == pytest.approx(240.0, rel=0.01)
    assert slow.breakdown_s["reconfig_wait_s"] == pytest.approx(240.0, rel=0.01)


def test_with_the_gate_deciding_slow_switches_are_not_waited_for():
    piezo, _ = _rfabric_runs(25e-3, "adaptive")
    slow, _ = _rfabric_runs(120.0, "adaptive")
    assert slow.time_s == pytest.approx(piezo.time_s, rel=0.02)
    assert all(p["action"] in ("kept", "unchanged") for p in slow.detail["periods"])


def test_the_gate_commits_the_train_plan_only_when_the_observed_slack_covers_the_switch():
    fast, stage = _rfabric_runs(25e-3, "per-period", iterations=7)
    assert fast.detail["periods"][0]["action"] == "commit"  # 60 s between steps >> 25 ms
    slow, _ = _rfabric_runs(120.0, "per-period", iterations=7)
    assert slow.detail["periods"][0]["action"] == "forced" and "predicted slack" in slow.detail["periods"][0]["reason"]
    # the gate has seen the per-layer windows of fwd/bwd: short, so no change happens inside it
    rows = [r for r in stage.driver.gate("train", "train").slack_table() if r.previous == r.next == "all-to-all"]
    assert rows and 0 < rows[0].median_s < 25e-3 and rows[0].count > 100
    assert fast.detail["gate_events"] > 100


# ---------------------------------------------------------------------------------- inputs

def test_appendix_c_layouts_scale_data_parallelism():
    lay = train_layout("Qwen2.5-72B", 480)
    assert (lay.tp, lay.pp, lay.cp, lay.dp) == (8, 2, 3, 10)
    assert (train_layout("Qwen2-57B-A14B", 512).ep, train_layout("Qwen2-57B-A14B", 512).dp) == (16, 128)
    with pytest.raises(ConfigError, match="multiple of 48"):
        train_layout("Qwen2.5-72B", 1024)


def test_bad_inputs_name_the_field():
    net = NetworkSim("ft", gpus=64)
    with pytest.raises(ConfigError, match="gpus"):
        TrainingStage(MOE57, ParallelLayout(tp=4, ep=16, dp=16), range(32), H800, net)
    with pytest.raises(ConfigError, match="layout.ep"):
        TrainingStage(MOE57, ParallelLayout(tp=1, ep=24, dp=48), range(48), H800, net)
    with pytest.raises(ConfigError, match="reconfigure"):
        TrainingOptions(reconfigure="sometimes")
    with pytest.raises(ConfigError, match="seq_lens"):
        TrainBatch(())
    assert math.isfinite(TrainingStage(MOE57, ParallelLayout(tp=4, ep=16, dp=16), range(64), H800, net)
                         .run(TrainBatch.uniform(64, 2048)).time_s)


def test_announcing_the_next_step_ahead_takes_the_switch_off_the_critical_path():
    fab = build_fabric("rfabric", 512)
    stage = TrainingStage(MOE57, ParallelLayout(tp=4, ep=16, dp=128), range(512), H800,
                          NetworkSim(fab, circuits="fixed"), RFabricDriver(fab, switch_delay_s=1.0),
                          options=TrainingOptions(reconfigure="per-period"))
    batch, t = TrainBatch.uniform(1024, 5120), 0.0
    for _ in range(6):  # the gate learns that 60 s pass between steps
        t += stage.run(batch, t).time_s + 60.0
    late = stage.run(batch, t)  # announced at the step's start: waits 1 s per add step
    t += late.time_s + 30.0
    entry = stage.prepare(batch, t)  # announced 30 s ahead, in the gap
    ahead = stage.run(batch, t + 30.0)
    assert entry["action"] == "commit"
    assert ahead.detail["periods"][0]["action"] == "unchanged"
    assert late.time_s - ahead.time_s == pytest.approx(late.breakdown_s["reconfig_wait_s"] / 2, rel=0.05)


def test_the_stage_uses_the_calibrated_model():
    from orchestrl.sim.train.mfu import default_params
    assert default_params() == default_calibration().params


def test_the_breakdown_adds_up_to_the_stage_time():
    fab = build_fabric("rfabric", 512)
    stage = TrainingStage(load_model("Qwen3-235B-A22B"), train_layout("Qwen3-235B-A22B", 256), range(256), H800,
                          NetworkSim(fab, circuits="fixed"), RFabricDriver(fab),
                          options=TrainingOptions(recompute=True, optimizer_steps=2))
    for t in (0.0, 100.0):
        r = stage.run(TrainBatch.uniform(256, 4096), t)
        assert sum(r.breakdown_s.values()) == pytest.approx(r.time_s, rel=1e-9)
        assert min(r.breakdown_s.values()) >= 0.0 and r.breakdown_s["bubble_s"] > 0


def test_plans_that_move_a_boundary_fibre_to_another_pod_switch_make_before_break():
    # Qwen2.5-72B on 960 of 2,048 GPUs: the grad-sync plan lifts boundary fibres of PoD 0 that the
    # fwd-bwd plan also lifted, on the same OCS-Agg cross-connects, but the Core plan points them at
    # another PoD (``pod0/up:pod2`` becomes ``pod0/up:pod1``). fabric.reconfig_order keeps those
    # cross-connects (commit e16f730); before, it raised and the stage fell back to tearing every
    # circuit down and re-adding it in one step. A user sees the ordered switch: its add steps are
    # paid on the critical path, the relabelled lift circuits stay up, nothing goes dark.
    from orchestrl.fabric.reconfig_order import order_plan_change

    fab = build_fabric("rfabric", 2048)
    name = "Qwen2.5-72B"
    driver = RFabricDriver(fab)
    stage = TrainingStage(load_model(name), train_layout(name, 960), range(960), H800,
                          NetworkSim(fab, circuits="fixed"), driver)
    first = stage.run(TrainBatch.uniform(512, 5120), 0.0)
    periods = first.detail["periods"]
    assert [p["period"] for p in periods] == ["fwd-bwd", "grad-sync"]
    assert not any("no non-blocking order" in p["reason"] for p in periods)
    fwd, grad = driver.changes[0].plan, driver.changes[-1].plan
    assert fwd.template == "train" and grad.template == "train-dp"
    by_xc = {c.xc: c for c in fwd.circuits}
    relabelled = [c.xc for c in grad.circuits if c.xc in by_xc and (by_xc[c.xc].a, by_xc[c.xc].b) != (c.a, c.b)]
    assert relabelled and all("/up:" in by_xc[x].b + by_xc[x].a for x in relabelled)
    order = order_plan_change(fwd, grad)
    assert not order.outages
    torn = {c.xc for s in order.steps if s.action == "remove" for c in s.circuits}
    assert not torn & set(relabelled)
    switch_s = driver.switching_time_s(order)
    assert periods[1]["reconfigured"] and periods[1]["switching_s"] == pytest.approx(switch_s)
    assert switch_s > 25e-3  # more than the one piezo switching of a teardown: the order has several add steps
    assert first.reconfigurations >= 1 and first.breakdown_s["reconfig_wait_s"] >= switch_s - 1e-12
    # the next step keeps the grad-sync circuits for fwd-bwd when switching back does not pay, and
    # finds them in force for grad-sync: no switching on its critical path
    second = stage.run(TrainBatch.uniform(512, 5120), first.time_s + 60.0)
    assert math.isfinite(second.time_s) and second.breakdown_s["reconfig_wait_s"] == 0.0
    assert [p["action"] for p in second.detail["periods"]] == ["kept", "unchanged"]
    with pytest.raises(ConfigError, match="now_s"):
        stage.run(TrainBatch.uniform(512, 5120), 1.0)


# ------------------------------------------------ circuits that do not carry the step (issue 16, 72B)

QWEN14 = load_model("Qwen2.5-14B")
# TP8 CP2 PP2 with each CP pair in two PoDs of a 512-GPU RFabric (rank = tp + 8 cp + 16 pp): the CP
# ring crosses OCS-Core, as the CP3 groups of Qwen2.5-72B on three PoDs do where they straddle a PoD
CROSS_POD_CP = [*range(0, 8), *range(256, 264), *range(8, 16), *range(264, 272)]


def test_a_step_starting_on_another_stages_plan_switches_instead_of_deadlocking():
    # generation (TP instances, no cross-server traffic) leaves an empty plan in force; on it the
    # CP ring has no path, so keeping it costs inf and the runtime must switch to the train plan
    fab = build_fabric("rfabric", 512)
    drv = RFabricDriver(fab)
    gen = drv.controller.materialize(Intent("gen", "rl", "decode",
                                            (Collective("all-to-all", (tuple(range(128, 136)),), 1e9),)))
    assert gen.accepted and not gen.plan.circuits
    drv.install(gen, at_s=0.0)
    stage = TrainingStage(QWEN14, ParallelLayout(tp=8, cp=2, pp=2), CROSS_POD_CP, H800,
                          NetworkSim(fab, circuits="fixed"), drv, job="rl")
    r = stage.run(TrainBatch.uniform(64, 4096), 10.0)
    assert math.isfinite(r.time_s) and r.breakdown_s["cp_s"] >= 0.0
    fwd = r.detail["periods"][0]
    assert fwd["period"] == "fwd-bwd" and fwd["action"] == "forced" and fwd["reconfigured"]
    # the switch (25 ms piezo) is waited for, and the step is as fast as on circuits installed up front
    assert r.breakdown_s["reconfig_wait_s"] == pytest.approx(0.025)
    ref = TrainingStage(QWEN14, ParallelLayout(tp=8, cp=2, pp=2), CROSS_POD_CP, H800,
                        NetworkSim(fab, circuits="fixed"), RFabricDriver(fab), job="rl")
    ref = ref.run(TrainBatch.uniform(64, 4096))
    assert r.time_s - 0.025 == pytest.approx(ref.time_s, rel=1e-6)


def test_a_step_whose_traffic_has_no_path_raises_naming_the_pairs():
    # RFabric with no circuits and no controller: the pipeline transfers between PoDs cannot move
    fab = build_fabric("rfabric", 512)
    for layout, gpus, what in ((ParallelLayout(tp=8, pp=2), [*range(0, 8), *range(256, 264)], "p2p"),
                               (ParallelLayout(tp=8, cp=2, pp=2), CROSS_POD_CP, "all-gather")):
        stage = TrainingStage(QWEN14, layout, gpus, H800, NetworkSim(fab, circuits="fixed"))
        with pytest.raises(UnservedTraffic, match=rf"fwd-bwd period cannot run: its {what}.*GPU 0 -> 256 "
                                                  r"\(pod0/tor0 -> pod1/tor0\)"):
            stage.run(TrainBatch.uniform(16, 4096))


def test_1f1b_takes_operations_that_never_finish_but_refuses_nan():
    assert one_f_one_b(2, 4, math.inf, math.inf).makespan_s == math.inf
    assert one_f_one_b(2, 4, 1.0, 2.0, math.inf).makespan_s == math.inf
    with pytest.raises(ValueError, match="bwd_s"):
        one_f_one_b(2, 4, 1.0, math.nan)
    with pytest.raises(ValueError, match="fwd_s"):
        one_f_one_b(2, 4, -1.0, 1.0)


def test_a_forward_that_never_finishes_has_an_infinite_backward_not_nan():
    arch, lay = ArchSpec.from_model(QWEN14), TrainLayout(tp=8, cp=2, pp=2)
    flops = arch.flops(np.array([4096.0] * 4))
    for recompute in (False, True):
        mb = microbatch_times(arch, lay, flops, Efficiency(0.4, 0.4, 0.4), LayerComm(cp_step_s=math.inf),
                              H800.bf16_flops, recompute=recompute)
        assert mb.fwd_s == math.inf and mb.bwd_s == math.inf
