"""Reactive balancer (Eq. 5) on imbalance that sits in running requests, as a veRL contiguous split leaves it."""

from __future__ import annotations

import pytest

from orchestrl.compute_sched.balancer import BalancerConfig, load_index
from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import GenerationRequest, WorkerState
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.scheduler import GenerationScheduler, SchedulerConfig
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.workload import RequestState
from orchestrl.fabric.errors import ConfigError

PM = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
TP2 = InstanceConfig("tp", tp=2)


def _skewed_step(balancer: BalancerConfig | None, reactive: bool = True) -> tuple[float, int]:
    """Two TP=2 instances, 96 requests running on one and 8 on the other; return (makespan, migrations)."""
    reqs = [GenerationRequest(f"r{k}", 512, 4096) for k in range(104)]
    lengths = {q.request_id: 2048 + 16 * k for k, q in enumerate(reqs)}
    engine = SimEngine(PM, homogeneous(TP2, 4), lengths, max_num_seqs=256)
    engine.add_requests(reqs[:96], 0)
    engine.add_requests(reqs[96:], 1)
    engine.advance(1.0)  # both batches admitted: the imbalance now sits in running requests, nothing waits
    cfg = SchedulerConfig(proactive=False, reactive=reactive, balancer=balancer or BalancerConfig())
    rep = GenerationScheduler(engine, PM, CostModel(PM), None, cfg).run_step()
    assert len(rep.finished) == len(reqs)
    return rep.makespan_s, rep.balancer_migrations


def test_balancer_moves_running_requests_off_the_straggler_and_shortens_the_step():
    static, none = _skewed_step(None, reactive=False)
    balanced, moved = _skewed_step(None)
    assert none == 0 and moved > 0
    assert balanced < 0.9 * static  # the hot instance decodes a smaller batch; the migrations pay for themselves


def _worker(i: int, running: int, used: int, rate: float, max_batch: int | None = 256) -> WorkerState:
    reqs = tuple(RequestState(f"w{i}-{k}", 1000, 0, 8192) for k in range(running))
    return WorkerState(i, TP2, reqs, (), used, 500_000, rate, max_batch=max_batch)


def test_load_index_ranks_the_worker_with_more_running_requests_higher():
    # memory-bound decode: 96 requests at 30 ms per step, 8 at 20 ms
    hot, cold = _worker(0, 96, 96_000, 96 / 0.030), _worker(1, 8, 8_000, 8 / 0.020)
    assert load_index(hot) > 10 * load_index(cold)
    agg = [load_index(w, rate_basis="aggregate") for w in (hot, cold)]
    assert agg[0] < 1.6 * agg[1]  # the aggregate reading: only the step-time ratio is left


def test_batch_limit_caps_b_cap():
    full = _worker(0, 256, 256_000, 5000.0)
    unbounded = _worker(0, 256, 256_000, 5000.0, max_batch=None)
    assert load_index(full) > load_index(unbounded)


def test_unknown_rate_basis_is_refused():
    with pytest.raises(ConfigError, match="rate_basis"):
        load_index(_worker(0, 1, 1000, 10.0), rate_basis="per-gpu")


def test_a_request_placed_recently_is_not_moved_again():
    """With recompute-only migration each move re-prefills the whole context: the hysteresis keeps a running
    request where it was placed for ``moved_cooldown_s``; waiting requests (no KV) may still move."""
    from orchestrl.compute_sched.balancer import plan_migrations
    from orchestrl.compute_sched.engine import ClusterSnapshot

    hot = _worker(0, 96, 96 * 1000, 2000.0)
    cold = _worker(1, 8, 8 * 1000, 2000.0)
    snap = ClusterSnapshot(100.0, homogeneous(TP2, 4), (hot, cold), 0)
    moves = plan_migrations(snap, BalancerConfig())
    assert moves and all(m.src == 0 and m.dst == 1 for m in moves)
    recent = {m.request_id: 90.0 for m in moves}
    again = plan_migrations(snap, BalancerConfig(), recent)
    assert not {m.request_id for m in again} & set(recent)  # none of them moves within the cooldown
    later = plan_migrations(snap, BalancerConfig(moved_cooldown_s=5.0), recent)
    assert {m.request_id for m in later} & set(recent)  # past the cooldown they may move again


def test_a_request_the_planner_just_re_homed_stays_in_the_queue_it_was_sent_to():
    """The planner re-homes requests by migration, so they wait on their new instance; the balancer must not
    move them on before the cooldown (it did, waiting requests being free to move, and undid the plan)."""
    from orchestrl.compute_sched.balancer import plan_migrations
    from orchestrl.compute_sched.engine import ClusterSnapshot

    sent = tuple(RequestState(f"p{k}", 1000, 0, 8192) for k in range(48))  # placed by the planner at t = 90 s
    hot = WorkerState(0, TP2, tuple(RequestState(f"w0-{k}", 1000, 0, 8192) for k in range(48)), sent, 48 * 1000,
                      500_000, 2000.0, max_batch=256)
    cold = _worker(1, 8, 8 * 1000, 2000.0)
    snap = ClusterSnapshot(100.0, homogeneous(TP2, 4), (hot, cold), 0)
    free = plan_migrations(snap, BalancerConfig(move_running=False))
    assert {m.request_id for m in free} & {r.request_id for r in sent}  # without the record they would move
    placed = {r.request_id: 90.0 for r in sent}
    kept = plan_migrations(snap, BalancerConfig(move_running=False), placed)
    assert not {m.request_id for m in kept} & set(placed)
