"""RolloutPipe FGD/CGP and RollArt's asynchronous bound and redundant rollouts."""

from __future__ import annotations

import pytest

from orchestrl.compute_sched.admission import (AsyncBound, CompleteGroupHandoff, FrontierAdmission, RedundantRollout,
                                     SerialHandoff)
from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.rollout_pipe import run_pipeline
from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.fabric.errors import ConfigError


def _group(g, k=2):
    return [GenerationRequest(f"{g}-{i}", 10, 100, g) for i in range(k)]


def test_frontier_admits_only_the_lowest_order_open_groups():
    fgd = FrontierAdmission(frontier_width=2)
    for g in ("g0", "g1", "g2", "g3"):
        fgd.submit_group(g, _group(g))
    assert {r.group_id for r in fgd.release()} == {"g0", "g1"} and fgd.release() == []
    fgd.on_finished("g1-0")
    assert fgd.release() == []  # g1 is not serving-complete yet
    fgd.on_finished("g1-1")
    assert [r.group_id for r in fgd.release()] == ["g2", "g2"] and fgd.frontier == ["g0", "g2"]
    with pytest.raises(ConfigError):
        FrontierAdmission(0)


def test_cgp_materialises_complete_groups_and_hands_off_u_at_a_time():
    cgp = CompleteGroupHandoff(k=2, u=2)
    assert cgp.on_response("a", "a0", 1.0, 1.0) is None
    grp = cgp.on_response("a", "a1", 0.0, 2.0)
    assert grp.advantages == pytest.approx((1.0, -1.0), abs=1e-5)  # (r - mean) / (std + eps)
    assert cgp.ready_batches() == []  # one trainable group < U
    cgp.on_response("b", "b0", 1.0, 3.0)
    cgp.on_response("b", "b1", 1.0, 3.0)
    batches = cgp.ready_batches()
    assert [[g.group_id for g in b] for b in batches] == [["a", "b"]]
    assert batches[0][1].advantages == (0.0, 0.0)
    serial = SerialHandoff(k=1, u=1)
    serial.on_response("a", "a0", 1.0, 1.0)
    assert serial.ready_batches() == [] and len(serial.ready_batches(rollout_done=True)) == 1


def test_async_bound_and_redundant_rollouts():
    ab = AsyncBound(bound=1)
    ab.start("old", 1)
    ab.start("new", 2)
    assert ab.admissible("old", 2) and not ab.admissible("old", 3)
    assert ab.on_new_version(3) == ["old"] and ab.admissible("new", 3)
    rr = RedundantRollout(target=3, redundancy=1.0)
    launched = rr.launch([f"t{i}" for i in range(10)])
    assert len(launched) == 6
    assert rr.on_finished("t5") == [] and rr.on_finished("t0") == []
    assert sorted(rr.on_finished("t2")) == ["t1", "t3", "t4"]
    assert rr.on_finished("t1") == []  # already aborted / target met


def test_pipelining_cuts_trainer_waiting_against_the_serial_baseline():
    perf = PerfModel(load_model("Qwen2.5-14B"), load_gpu("A100"))
    layout = homogeneous(InstanceConfig("tp", tp=2), 2)
    trace = heavy_tailed_trace(16, 4, 4096, seed=3)
    serial = run_pipeline(trace, perf, layout, "serial", k=4, u=2, train_s_per_group=2.0)
    cgp = run_pipeline(trace, perf, layout, "cgp", k=4, u=2, train_s_per_group=2.0)
    fgd = run_pipeline(trace, perf, layout, "cgp+fgd", k=4, u=2, train_s_per_group=2.0, frontier_width=8)
    assert serial.first_dispatch_s >= serial.rollout_end_s  # Slime: nothing before the rollout ends
    assert cgp.first_dispatch_s < serial.first_dispatch_s and cgp.waiting_ratio < serial.waiting_ratio
    assert cgp.train_end_s < serial.train_end_s
    assert serial.trainer_compute_s == cgp.trainer_compute_s == fgd.trainer_compute_s  # same work, moved
    assert fgd.rollout_end_s >= cgp.rollout_end_s  # a narrow frontier trades rollout throughput for order
    with pytest.raises(ConfigError, match="K=3"):
        run_pipeline(trace, perf, layout, "cgp", k=3, u=2, train_s_per_group=1.0)
