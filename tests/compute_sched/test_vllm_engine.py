"""The vLLM adapter. Its bookkeeping runs everywhere against an object with LLMEngine's public
methods; the real-engine test needs vLLM, CUDA and a local model (ORCHESTRL_VLLM_MODEL)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from compute_sched.engine import Engine, GenerationRequest, Migration
from compute_sched.layout import InstanceConfig, homogeneous
from compute_sched.vllm_engine import VllmEngine


class _LLMEngineSurface:
    """add_request / abort_request / step / has_unfinished_requests / sleep / wake_up, one token per step."""

    def __init__(self):
        self.live, self.slept, self.woken = {}, 0, 0

    def add_request(self, request_id, prompt, params):
        assert set(prompt) == {"prompt_token_ids"}
        self.live[request_id] = [params, []]

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.live.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        time.sleep(0.001)  # a decode step takes time, so advance(seconds) sees a few of them
        outs = []
        for rid, (max_tokens, toks) in list(self.live.items()):
            toks.append(7)
            done = len(toks) >= max_tokens
            outs.append(SimpleNamespace(request_id=rid, finished=done,
                                        outputs=[SimpleNamespace(token_ids=list(toks))]))
            if done:
                del self.live[rid]
        return outs

    def sleep(self, level=1):
        self.slept += 1

    def wake_up(self, tags=None):
        self.woken += 1


def _adapter(layout):
    made = []

    def factory(cfg, gpus):
        made.append((cfg, gpus))
        return _LLMEngineSurface()

    return VllmEngine(layout, factory, kv_capacity_tokens=lambda c: 10_000, sampling_params=lambda n: n), made


def test_adapter_tracks_progress_migrates_by_recompute_and_switches_layouts():
    eng, made = _adapter(homogeneous(InstanceConfig("tp", tp=1), 2))
    assert isinstance(eng, Engine) and len(made) == 2
    reqs = [GenerationRequest(f"r{i}", 3, 50, prompt_token_ids=(1, 2, 3)) for i in range(4)]
    eng.add_requests(reqs, 0)
    eng.advance(0.005)
    snap = eng.snapshot()
    assert all(r.generated_tokens > 0 for r in snap.workers[0].running)
    before = {r.request_id: r.generated_tokens for r in snap.pending}
    rep = eng.migrate([Migration("r0", 0, 1), Migration("r0", 0, 1)])
    assert rep.moved == ("r0",) and len(rep.refused) == 1 and rep.methods == {"recompute": 1}
    assert eng.snapshot().instance_of()["r0"] == 1
    assert {r.request_id: r.generated_tokens for r in eng.snapshot().pending}["r0"] == before["r0"]
    new = homogeneous(InstanceConfig("tp", tp=2), 2)
    sw = eng.change_layout(new, {r.request_id: 0 for r in reqs})
    assert sw.kept_instances == 0 and len(sw.migration.moved) == 4
    back = eng.change_layout(homogeneous(InstanceConfig("tp", tp=1), 2), {r.request_id: 1 for r in reqs})
    assert back.kept_instances == 0 and len(made) == 3  # the TP=1 engines came back from standby
    finished = []
    while not eng.idle():
        finished += eng.advance(0.01)
    assert sorted(f.request_id for f in finished) == ["r0", "r1", "r2", "r3"]
    assert all(f.output_tokens == 50 for f in finished)  # progress survived two re-submissions
    assert eng.abort(["r0"]) == []


@pytest.mark.skipif(not os.environ.get("ORCHESTRL_VLLM_MODEL"), reason="needs ORCHESTRL_VLLM_MODEL (a local model)")
def test_real_vllm_engine_generates_and_migrates():
    vllm = pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from vllm import EngineArgs, LLMEngine

    model = os.environ["ORCHESTRL_VLLM_MODEL"]

    def factory(cfg, gpus):
        args = EngineArgs(model=model, tensor_parallel_size=cfg.tp, enable_sleep_mode=True, disable_log_stats=False,
                          gpu_memory_utilization=0.35, max_model_len=2048)
        return LLMEngine.from_engine_args(args)

    layout = homogeneous(InstanceConfig("tp", tp=1), 1)
    eng = VllmEngine(layout, factory, kv_capacity_tokens=lambda c: 100_000)
    tok = vllm.LLM  # noqa: F841  (import check only)
    reqs = [GenerationRequest(f"q{i}", 4, 64, prompt_token_ids=(1, 2, 3, 4)) for i in range(4)]
    eng.add_requests(reqs, 0)
    eng.advance(0.5)
    assert eng.snapshot().workers[0].kv_capacity_tokens > 0
    done = []
    while not eng.idle():
        done += eng.advance(1.0)
    assert len(done) == 4 and all(f.output_tokens <= 64 for f in done)


def test_adapter_reports_each_engines_batch_limit_so_the_balancer_keeps_full_batches_full():
    from compute_sched.balancer import plan_migrations

    def v1(max_num_seqs):  # later v1: the scheduler config sits under vllm_config
        eng = _LLMEngineSurface()
        eng.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        return eng

    def v0(max_num_seqs):  # v0 and early v1: scheduler_config on the engine
        eng = _LLMEngineSurface()
        eng.scheduler_config = SimpleNamespace(max_num_seqs=max_num_seqs)
        return eng

    layout = homogeneous(InstanceConfig("tp", tp=1), 2)
    reqs = [GenerationRequest(f"r{i}", 3, 500, prompt_token_ids=(1, 2, 3)) for i in range(8)]
    moves = {}
    for limit in (None, 2):
        makers = iter([v1(limit), v0(limit)] if limit else [_LLMEngineSurface(), _LLMEngineSurface()])
        eng = VllmEngine(layout, lambda cfg, gpus: next(makers), kv_capacity_tokens=lambda c: 10_000,
                         sampling_params=lambda n: n)
        eng.add_requests(reqs[:6], 0)
        eng.add_requests(reqs[6:], 1)
        eng.advance(0.005)
        snap = eng.snapshot()
        assert [w.max_batch for w in snap.workers] == [limit, limit]
        moves[limit] = plan_migrations(snap)
    assert moves[None] and all(m.dst == 1 for m in moves[None])  # 6 vs 2 running: worker 1 takes some
    assert moves[2] == []  # worker 1 already decodes its max_num_seqs: a move would only queue there
