"""RLSim's fast paths give what the plain ones give (issue 31, speed): batched instance times, lazy balancer sorting."""

import numpy as np
import pytest

from orchestrl.compute_sched.balancer import BalancerConfig, plan_migrations
from orchestrl.compute_sched.engine import ClusterSnapshot, WorkerState
from orchestrl.compute_sched.estimate import build_classes, instance_time_s, instance_times_s
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import Instance, InstanceConfig, Layout
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.step_measured import MeasuredPerfModel
from orchestrl.compute_sched.workload import LengthHistogram, RequestState, StepWorkload


@pytest.mark.parametrize("kind", ["measured", "analytical"])
def test_instance_times_of_many_instances_equal_one_call_per_instance(kind):
    model, gpu = load_model("Qwen2.5-14B"), load_gpu("H800")
    pm = MeasuredPerfModel(model, gpu) if kind == "measured" else PerfModel(model, gpu)
    rng = np.random.default_rng(3)
    reqs = [RequestState(f"r{i}", int(rng.integers(100, 2000)), int(rng.integers(0, 3000)), 8192) for i in range(300)]
    lengths = rng.integers(200, 8000, 400).tolist()
    table = build_classes(reqs, StepWorkload(LengthHistogram.from_lengths(lengths, 8192)))
    counts = rng.random((12, len(table.classes))) * table.counts
    counts[3] = 0.0  # an empty instance
    counts[5] = counts[5] * 1e-3  # one below the tail mass everywhere
    for cfg in (InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8)):
        many = instance_times_s(pm, cfg, table, counts)
        one = [instance_time_s(pm, cfg, table, row) for row in counts]
        assert many.tolist() == one  # exactly: the same elementwise evaluations, each row summed alone


def _snap(n_workers=6, per=40, seed=0):
    rng = np.random.default_rng(seed)
    cfg = InstanceConfig("tp", tp=4)
    workers, k = [], 0
    for w in range(n_workers):
        size = per * (3 if w == 0 else 1)
        run = tuple(RequestState(f"r{k + i}", int(rng.integers(50, 900)), int(rng.integers(0, 500)), 4096)
                    for i in range(size // 2))
        k += size // 2
        wait = tuple(RequestState(f"r{k + i}", int(rng.integers(50, 900)), 0, 4096) for i in range(size // 2))
        k += size // 2
        used = sum(r.context_tokens for r in run)
        workers.append(WorkerState(w, cfg, run, wait, used, 400_000, 50.0 * (1 + w % 3), True, 256))
    layout = Layout(tuple(Instance(cfg, tuple(range(4 * w, 4 * w + 4))) for w in range(n_workers)), 4 * n_workers)
    return ClusterSnapshot(100.0, layout, tuple(workers), ())


def _eager(snap, cfg, last):
    """The balancer as it was: every queue sorted up front, the cooldown set built each tick."""
    import orchestrl.compute_sched.balancer as bal

    recent = {r for r, t in last.items() if snap.time_s - t < cfg.moved_cooldown_s}
    workers = [w for w in snap.workers if w.available]
    sorted_workers = [WorkerState(w.instance, w.config, tuple(sorted(w.running, key=lambda r: r.context_tokens)),
                                  tuple(sorted(w.waiting, key=lambda r: r.context_tokens)), w.kv_used_tokens,
                                  w.kv_capacity_tokens, w.decode_rate_tps, w.available, w.max_batch) for w in workers]
    return bal._balance(sorted_workers, cfg, recent)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balancer_moves_equal_the_eager_sorting_ones(seed):
    snap = _snap(seed=seed)
    last = {"r3": 90.0, "r7": -1000.0, "r11": 99.0}
    cfg = BalancerConfig(theta_relative=0.05)
    got = plan_migrations(snap, cfg, last)
    assert got, "the overloaded worker 0 should shed requests"
    assert got == _eager(snap, cfg, last)
    assert not {m.request_id for m in got} & {"r3", "r11"}  # cooling down


def test_engine_request_states_equal_constructed_ones():
    from orchestrl.compute_sched.sim_engine import _Seq

    s = _Seq("r1", 300, 12, 900, 4096, "g7")
    got, want = s.state(), RequestState("r1", 300, 12, 4096, "g7")
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert s.state() is got  # unchanged progress: the same object
    s.generated += 5
    assert s.state() == RequestState("r1", 300, 17, 4096, "g7") and s.state().context_tokens == 317


def test_instances_kept_across_layouts_equal_the_pairwise_comparison():
    from orchestrl.compute_sched.planner import _same_instances

    tp2, tp4 = InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=4)
    old = Layout(tuple(Instance(tp2, (2 * i, 2 * i + 1)) for i in range(8)), 16)
    new = Layout((Instance(tp4, (0, 1, 2, 3)),) + old.instances[2:6] + (Instance(tp4, (12, 13, 14, 15)),), 16)
    pairwise = {k: o for k, inst in enumerate(new.instances) for o, x in enumerate(old.instances) if x == inst}
    assert _same_instances(new, old) == pairwise == {1: 2, 2: 3, 3: 4, 4: 5}


def _loads(snap):
    from orchestrl.compute_sched.balancer import WorkerLoad

    return [WorkerLoad(w.config, len(w.running), len(w.waiting), sum(r.context_tokens for r in w.running),
                       float(w.kv_free_tokens), w.decode_rate_tps, w.available, w.max_batch) for w in snap.workers]


@pytest.mark.parametrize("theta_relative", [0.01, 0.05, 0.5, 5.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_count_only_check_says_no_move_exactly_when_the_balancer_moves_nothing(seed, theta_relative):
    from orchestrl.compute_sched.balancer import would_migrate

    snap = _snap(seed=seed)
    for basis in ("sequence", "aggregate"):
        cfg = BalancerConfig(theta_relative=theta_relative, rate_basis=basis, move_running=False, max_moves=1)
        moves = plan_migrations(snap, cfg, {})
        if not would_migrate(_loads(snap), cfg):
            assert moves == []  # the snapshot the scheduler skipped would have moved nothing
    assert not would_migrate(_loads(snap), BalancerConfig(theta_relative=1e9))
    assert would_migrate(_loads(snap), BalancerConfig(theta_relative=0.01))  # worker 0 holds 3x the others


def test_sim_engine_reports_the_loads_its_snapshot_implies():
    from orchestrl.compute_sched.sim_engine import SimEngine

    model, gpu = load_model("Qwen2.5-14B"), load_gpu("H800")
    pm = MeasuredPerfModel(model, gpu)
    cfg = InstanceConfig("tp", tp=4)
    layout = Layout(tuple(Instance(cfg, tuple(range(4 * w, 4 * w + 4))) for w in range(3)), 12)
    from orchestrl.compute_sched.engine import GenerationRequest

    reqs = [GenerationRequest(f"r{i}", 200 + 10 * i, 4096) for i in range(30)]
    eng = SimEngine(pm, layout, {q.request_id: 50 + 37 * i for i, q in enumerate(reqs)})
    eng.add_requests(reqs[:20], instance=0)
    eng.add_requests(reqs[20:], instance=2)
    eng.advance(1.0)
    assert eng.worker_loads() == _loads(eng.snapshot())
    # the loads keep adding up through migrations, a layout change and KV-pressure preemptions
    from orchestrl.compute_sched.engine import Migration

    snap = eng.snapshot()
    moving = [r.request_id for r in snap.workers[0].running[:3]] + [r.request_id for r in snap.workers[2].waiting[:2]]
    eng.migrate([Migration(r, 0 if r in {x.request_id for x in snap.workers[0].running} else 2, 1) for r in moving])
    eng.advance(0.5)
    assert eng.worker_loads() == _loads(eng.snapshot())
    two = Layout((Instance(InstanceConfig("tp", tp=8), tuple(range(8))), Instance(cfg, tuple(range(8, 12)))), 12)
    eng.change_layout(two, {r.request_id: k % 2 for k, r in enumerate(eng.snapshot().pending)})
    for _ in range(5):
        eng.advance(0.7)
        assert eng.worker_loads() == _loads(eng.snapshot())
    tight = SimEngine(pm, Layout((Instance(cfg, tuple(range(4))),), 4), {q.request_id: 4000 for q in reqs})
    tight.add_requests(reqs)
    tight._insts[0].cap = 6000  # room for a few contexts: requests are preempted as contexts grow
    for _ in range(10):
        tight.advance(2.0)
        assert tight.worker_loads() == _loads(tight.snapshot())
    assert tight.preemptions > 0


def test_snapshot_maps_are_read_only_and_the_snapshot_stays_picklable():
    import pickle

    from orchestrl.compute_sched.estimate import build_classes

    snap = _snap(seed=1)
    where = snap.instance_of()
    rid = next(iter(where))
    with pytest.raises(TypeError):
        where[rid] = 99  # the planner shares one map per snapshot: nobody may change it
    assert snap.instance_of()[rid] == where[rid] and dict(snap.running_context())
    assert pickle.loads(pickle.dumps(snap)).instance_of() == where
    table = build_classes(snap.pending, None)
    assert table.class_of()[rid] >= 0
    assert pickle.loads(pickle.dumps(table)).class_of() == table.class_of()
