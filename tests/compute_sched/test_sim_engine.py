"""The simulated engine: continuous batching, KV limits, migration, layout changes, §2.1 case study."""

from __future__ import annotations

import pytest

from orchestrl.compute_sched.engine import Engine, EngineCapabilities, GenerationRequest, Migration
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.fabric.errors import ConfigError

PM = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))


def _run(tp, reqs, lengths, gpus=8):
    layout = homogeneous(InstanceConfig("tp", tp=tp), gpus)
    e = SimEngine(PM, layout, lengths)
    n = len(layout.instances)
    for k in range(n):
        e.add_requests(reqs[k::n], k)
    last = 0.0
    while not e.idle():
        done = e.advance(5.0)
        last = done[-1].finish_time_s if done else last
    return last, e


def test_it_implements_the_engine_protocol_and_finishes_every_request():
    reqs = [GenerationRequest(f"r{i}", 100, 4096) for i in range(20)]
    lengths = {r.request_id: 50 + 100 * i for i, r in enumerate(reqs)}
    e = SimEngine(PM, homogeneous(InstanceConfig("tp", tp=2), 4), lengths)
    assert isinstance(e, Engine)
    e.add_requests(reqs)
    finished = []
    while not e.idle():
        finished += e.advance(1.0)
    assert sorted(f.request_id for f in finished) == sorted(lengths)
    assert all(f.output_tokens == lengths[f.request_id] for f in finished)
    assert [f.finish_time_s for f in finished] == sorted(f.finish_time_s for f in finished)


def test_kv_limit_preempts_and_recomputes():
    reqs = [GenerationRequest(f"r{i}", 2000, 30000) for i in range(64)]
    lengths = {r.request_id: 30000 for r in reqs}
    _, e = _run(1, reqs, lengths, gpus=1)  # 64 x 32K tokens do not fit one GPU's KV cache
    assert e.preemptions > 0


def test_snapshot_hides_lengths_and_migration_moves_state():
    reqs = [GenerationRequest(f"r{i}", 100, 4096) for i in range(8)]
    e = SimEngine(PM, homogeneous(InstanceConfig("tp", tp=2), 4), {r.request_id: 3000 for r in reqs})
    e.add_requests(reqs, 0)
    e.advance(2.0)
    snap = e.snapshot()
    w0 = snap.workers[0]
    assert len(w0.running) == 8 and all(0 < r.generated_tokens < 3000 for r in w0.running)
    assert w0.kv_used_tokens == sum(r.context_tokens for r in w0.running) and w0.decode_rate_tps > 0
    rep = e.migrate([Migration("r0", 0, 1), Migration("r1", 1, 0)])
    assert rep.moved == ("r0",) and rep.refused[0][0] == "r1"
    assert "r0" in {r.request_id for r in e.snapshot().workers[1].waiting}
    assert e.abort(["r2", "nope"]) == ["r2"]


def test_layout_change_keeps_identical_instances_and_requires_a_placement():
    reqs = [GenerationRequest(f"r{i}", 100, 4096) for i in range(8)]
    e = SimEngine(PM, homogeneous(InstanceConfig("tp", tp=2), 4), {r.request_id: 3000 for r in reqs})
    e.add_requests(reqs[:4], 0)
    e.add_requests(reqs[4:], 1)
    e.advance(1.0)
    new = homogeneous(InstanceConfig("tp", tp=4), 4)
    with pytest.raises(ConfigError, match="placement"):
        e.change_layout(new, {})
    rep = e.change_layout(new, {r.request_id: 0 for r in reqs})
    assert rep.switch_s > 0 and len(rep.migration.moved) == 8 and rep.kept_instances == 0
    while not e.idle():
        e.advance(5.0)


def test_case_study_direction_tp2_early_tp8_tail():
    """§2.1: Qwen2.5-14B, 8 H800s, batch 512: TP=2 finishes the early phase first, TP=8 the tail."""
    trace = heavy_tailed_trace(64, 8, 15360, seed=0)
    reqs = [GenerationRequest(q.request_id, q.prompt_tokens, 15360) for q in trace.requests]
    early_window = {q.request_id: min(q.output_tokens, 1024) for q in trace.requests}
    early = {tp: _run(tp, reqs, early_window)[0] for tp in (2, 4, 8)}
    assert min(early, key=early.get) == 2
    tail_q = sorted(trace.requests, key=lambda q: -q.output_tokens)[:8]
    tail_reqs = [GenerationRequest(q.request_id, q.prompt_tokens, 15360, generated_tokens=q.output_tokens - 4000)
                 for q in tail_q]
    lengths = {q.request_id: q.output_tokens for q in tail_q}
    tail = {tp: _run(tp, tail_reqs, lengths)[0] for tp in (2, 4, 8)}
    assert min(tail, key=tail.get) == 8


def _loaded(capabilities=None):
    """Sixteen long-context requests decoding on instance 0 of 4x tp2: moving them is where transfer would pay."""
    reqs = [GenerationRequest(f"r{i}", 12000, 8192) for i in range(16)]
    e = SimEngine(PM, homogeneous(InstanceConfig("tp", tp=2), 8), {r.request_id: 6000 for r in reqs},
                  capabilities=capabilities)
    e.add_requests(reqs, 0)
    e.advance(5.0)
    assert len(e.snapshot().workers[0].running) == 16
    return e


def test_default_engine_migrates_only_by_recompute_even_when_asked_to_transfer():
    """Default capabilities are the vLLM adapter's: no KV path, so every move is a recompute."""
    e = _loaded()
    assert e.capabilities == EngineCapabilities() and not e.costs.capabilities.kv_transfer
    auto = e.migrate([Migration(f"r{i}", 0, 1) for i in range(8)])
    asked = e.migrate([Migration(f"r{i}", 0, 2, "transfer") for i in range(8, 12)])
    assert auto.methods == {"recompute": 8} and asked.methods == {"recompute": 4}
    lay = e.change_layout(homogeneous(InstanceConfig("tp", tp=4), 8), {f"r{i}": i % 2 for i in range(16)})
    assert "transfer" not in lay.migration.methods and lay.migration.methods["recompute"] > 0


def test_what_if_transfer_engine_ships_large_caches_and_is_labelled():
    real, what_if = _loaded(), _loaded(EngineCapabilities.assume_kv_transfer())
    assert what_if.capabilities.label.startswith("what-if")
    moves = [Migration(f"r{i}", 0, 1) for i in range(8)]
    rep_real, rep_if = real.migrate(moves), what_if.migrate(moves)
    assert rep_if.methods == {"transfer": 8} and rep_real.methods == {"recompute": 8}
    assert rep_if.seconds < rep_real.seconds  # the gain the what-if assumes and vLLM cannot deliver


def test_engine_and_cost_model_must_agree_on_capabilities():
    from orchestrl.compute_sched.costs import CostModel
    from orchestrl.compute_sched.scheduler import GenerationScheduler

    what_if = EngineCapabilities.assume_kv_transfer()
    layout = homogeneous(InstanceConfig("tp", tp=2), 4)
    with pytest.raises(ConfigError, match="capabilities"):
        SimEngine(PM, layout, {}, costs=CostModel(PM, capabilities=what_if), capabilities=EngineCapabilities())
    assert SimEngine(PM, layout, {}, costs=CostModel(PM, capabilities=what_if)).capabilities == what_if
    plain = SimEngine(PM, layout, {})
    with pytest.raises(ConfigError, match="CostModel.for_engine"):
        GenerationScheduler(plain, PM, CostModel(PM, capabilities=what_if), None)
    assert not CostModel.for_engine(PM, plain).capabilities.kv_transfer
