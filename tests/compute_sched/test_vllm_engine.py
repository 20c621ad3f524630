"""The vLLM adapter. Its bookkeeping runs everywhere against an object with LLMEngine's public
methods; the real-engine test needs vLLM, CUDA and a local model (ORCHESTRL_VLLM_MODEL)."""

from __future__ import annotations

import gc
import os
import threading
import time
from types import SimpleNamespace

import pytest

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import Engine, EngineCapabilities, GenerationRequest, Migration
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.vllm_engine import EngineFailure, VllmEngine


class _LLMEngineSurface:
    """add_request / abort_request / step / has_unfinished_requests / sleep / wake_up, one token per step."""

    def __init__(self, step_s=0.001):
        self.live, self.slept, self.woken = {}, 0, 0
        self.step_s = step_s
        self.threads = set()  # every thread that called this engine

    def add_request(self, request_id, prompt, params):
        assert set(prompt) == {"prompt_token_ids"}
        self.live[request_id] = [params, []]

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.live.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        self.threads.add(threading.get_ident())
        time.sleep(self.step_s)  # a decode step blocks outside the GIL, as vLLM's step() waits on its engine core
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
    eng.close()


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
    eng.close()


def _advance_until_running(eng, counts, timeout_s=10.0):
    """Advance in short slices until each worker has ``counts`` requests running; return that snapshot.

    A worker thread that the OS starts late may not step inside one short slice; a fixed slice
    then leaves its requests waiting, or measures a rate from a handful of steps, and the test
    would see a different cluster (seen under load 8-10).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        eng.advance(0.005)
        running = [len(w.running) for w in eng.snapshot().workers]
        if running == counts:
            break
        assert time.monotonic() < deadline, f"workers run {running} requests after {timeout_s} s, expected {counts}"
    eng.advance(0.25)  # the balancer reads each worker's observed rate: measure it over ~250 steps, not a few
    return eng.snapshot()


def test_adapter_reports_each_engines_batch_limit_so_the_balancer_keeps_full_batches_full():
    from orchestrl.compute_sched.balancer import plan_migrations

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
        snap = _advance_until_running(eng, [6, 2])
        assert [w.max_batch for w in snap.workers] == [limit, limit]
        moves[limit] = plan_migrations(snap)
        eng.close()
    assert moves[None] and all(m.dst == 1 for m in moves[None])  # 6 vs 2 running: worker 1 takes some
    assert moves[2] == []  # worker 1 already decodes its max_num_seqs: a move would only queue there


def _engine_threads():
    return [t for t in threading.enumerate() if t.name.startswith("vllm-engine")]


def _time_to_finish(n_engines, step_s=0.02, steps=10):
    """Wall time for ``n_engines`` engines, one request each, to decode ``steps`` tokens of ``step_s``."""
    made = []

    def factory(cfg, gpus):
        made.append(_LLMEngineSurface(step_s))
        return made[-1]

    with VllmEngine(homogeneous(InstanceConfig("tp", tp=1), n_engines), factory, kv_capacity_tokens=lambda c: 10_000,
                    sampling_params=lambda n: n) as eng:
        for k in range(n_engines):
            eng.add_requests([GenerationRequest(f"q{k}", 3, steps, prompt_token_ids=(1, 2, 3))], k)
        t0 = time.monotonic()
        done = []
        while not eng.idle():
            done += eng.advance(10.0)
        took = time.monotonic() - t0
    assert sorted(f.request_id for f in done) == [f"q{k}" for k in range(n_engines)]
    assert all(f.output_tokens == steps for f in done)
    return took, made


def test_engines_step_concurrently_so_four_take_about_as_long_as_one():
    """A deployment runs its engines at once; stepping them in turn would make four take ~4x one."""
    one, _ = _time_to_finish(1)
    four, made = _time_to_finish(4)
    assert four < 2.5 * one, f"4 engines took {four:.3f} s, one took {one:.3f} s: stepped one after another"
    threads = [e.threads for e in made]
    assert all(len(t) == 1 for t in threads)  # each engine is only ever stepped from its own thread ...
    assert len(set.union(*threads)) == 4 and threading.get_ident() not in set.union(*threads)  # ... none shared
    assert _engine_threads() == []  # leaving the with-block stopped them


def test_an_engine_that_raises_is_named_and_the_others_results_are_kept():
    class Broken(_LLMEngineSurface):
        def step(self):
            if any(len(toks) >= 2 for _, toks in self.live.values()):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().step()

    def factory(cfg, gpus):
        return Broken() if gpus == (2,) else _LLMEngineSurface()

    eng = VllmEngine(homogeneous(InstanceConfig("tp", tp=1), 4), factory, kv_capacity_tokens=lambda c: 10_000,
                     sampling_params=lambda n: n)
    for k in range(4):
        eng.add_requests([GenerationRequest(f"q{k}", 3, 3, prompt_token_ids=(1, 2, 3))], k)
    with pytest.raises(EngineFailure) as info:
        eng.advance(5.0)
    err = info.value
    assert "instance 2 (tp1 on GPUs [2])" in str(err) and "illegal memory access" in str(err)
    assert [name for name, _ in err.failures] == ["instance 2 (tp1 on GPUs [2])"]
    assert isinstance(err.failures[0][1], RuntimeError)
    assert sorted(f.request_id for f in err.finished) == ["q0", "q1", "q3"]  # the healthy engines' work is kept
    assert [r.request_id for r in eng.snapshot().pending] == ["q2"]
    eng.close()
    assert _engine_threads() == []


def test_a_failed_submission_names_the_engine_and_leaves_nothing_half_tracked():
    class Full(_LLMEngineSurface):
        def add_request(self, request_id, prompt, params):
            raise ValueError("prompt is longer than max_model_len")

    eng = VllmEngine(homogeneous(InstanceConfig("tp", tp=1), 2), lambda cfg, gpus: Full() if gpus == (1,)
                     else _LLMEngineSurface(), kv_capacity_tokens=lambda c: 10_000, sampling_params=lambda n: n)
    with pytest.raises(EngineFailure, match=r"instance 1 \(tp1 on GPUs \[1\]\).*max_model_len") as info:
        eng.add_requests([GenerationRequest("a", 3, 5, prompt_token_ids=(1, 2, 3))], 1)
    assert info.value.lost == ["a"] and eng.idle()  # it never reached an engine, so it is not pending
    eng.close()


def test_a_factory_that_fails_names_the_engine_and_leaves_no_thread_behind():
    before = len(_engine_threads())

    def factory(cfg, gpus):
        if gpus == (2,):
            raise RuntimeError("no GPU 2 in CUDA_VISIBLE_DEVICES")
        return _LLMEngineSurface()

    with pytest.raises(EngineFailure, match=r"build failed.*tp1 on GPUs \[2\].*CUDA_VISIBLE_DEVICES"):
        VllmEngine(homogeneous(InstanceConfig("tp", tp=1), 4), factory, kv_capacity_tokens=lambda c: 1,
                   sampling_params=lambda n: n)
    assert len(_engine_threads()) == before


def test_engine_threads_stop_on_close_and_on_garbage_collection():
    before = len(_engine_threads())
    eng, _ = _adapter(homogeneous(InstanceConfig("tp", tp=1), 3))
    assert len(_engine_threads()) == before + 3
    eng.close()
    eng.close()  # idempotent
    assert len(_engine_threads()) == before
    eng, _ = _adapter(homogeneous(InstanceConfig("tp", tp=1), 3))
    eng.add_requests([GenerationRequest("r", 3, 5, prompt_token_ids=(1, 2, 3))], 0)
    eng.advance(0.005)
    del eng
    gc.collect()
    deadline = time.monotonic() + 5.0
    while len(_engine_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_engine_threads()) == before


def test_adapter_reports_recompute_only_even_with_a_kv_connector():
    """vLLM's connectors hand KV over only for a request that finished length-capped; a running one cannot go."""
    def with_connector(cfg, gpus):
        eng = _LLMEngineSurface()
        eng.vllm_config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector="NixlConnector"))
        return eng

    layout = homogeneous(InstanceConfig("tp", tp=1), 2)
    with VllmEngine(layout, with_connector, kv_capacity_tokens=lambda c: 10_000, sampling_params=lambda n: n) as eng:
        caps = eng.capabilities
        assert caps == EngineCapabilities(kv_transfer=False, kv_connector="NixlConnector")
        eng.add_requests([GenerationRequest("r", 3, 50, prompt_token_ids=(1, 2, 3))], 0)
        eng.advance(0.005)
        assert eng.migrate([Migration("r", 0, 1, "transfer")]).methods == {"recompute": 1}
    plain, _ = _adapter(layout)
    assert plain.capabilities == EngineCapabilities()
    pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    big = [12000] * 64  # where a transfer would win (Figure 19)
    assert CostModel(pm, capabilities=EngineCapabilities.assume_kv_transfer()).migration(TP8, big).method == "transfer"
    assert CostModel.for_engine(pm, plain).migration(TP8, big).method == "recompute"
    plain.close()


TP8 = InstanceConfig("tp", tp=8)


class PauseModes:
    """vLLM's pause modes over an LLMEngine surface: ``sleep(level=0, mode="keep")`` freezes the scheduler
    (requests and their KV stay), ``wake_up(tags=["scheduling"])`` lets it run again. A paused engine
    core produces no output, so a ``step()`` on it would block forever: here it fails the test."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.paused, self.calls = False, []

    def step(self):
        assert not self.paused, "step() on a paused vLLM engine blocks"
        return super().step()

    def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", level, mode))
        self.paused = level == 0 and mode == "keep"

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))
        if tags and "scheduling" in tags:
            self.paused = False


class _PausableSurface(PauseModes, _LLMEngineSurface):
    def __init__(self, step_s=0.001):
        super().__init__(step_s)
        self.added = 0

    def add_request(self, request_id, prompt, params):
        self.added += 1
        super().add_request(request_id, prompt, params)


def test_kv_reuse_across_a_weight_update_is_declared_only_where_vllms_sleep_takes_the_pause_mode():
    from orchestrl.fabric.errors import ConfigError
    layout = homogeneous(InstanceConfig("tp", tp=1), 2)
    old, _ = _adapter(layout)  # sleep(level) only: vLLM without the pause modes
    with old:
        assert old.can_keep_kv is False
        with pytest.raises(ConfigError, match="rollout.resume.*allowed: recompute"):
            old.pause_generation()
    with VllmEngine(layout, lambda c, g: _PausableSurface(), kv_capacity_tokens=lambda c: 10_000,
                    sampling_params=lambda n: n) as eng:
        assert eng.can_keep_kv is True

    class Wrapper:  # e.g. a Ray actor handle wrapper: sleep(*args, **kwargs) hides vLLM's signature
        def __init__(self):
            self.inner = _PausableSurface()

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def sleep(self, *args, **kwargs):
            return self.inner.sleep(*args, **kwargs)

    wrapped = [Wrapper(), Wrapper()]
    it = iter(wrapped)
    with VllmEngine(layout, lambda c, g: next(it), kv_capacity_tokens=lambda c: 10_000, sampling_params=lambda n: n,
                    can_keep_kv=True) as eng:
        eng.pause_generation()  # told so: the pause goes through the wrapper to the engine
        assert [w.inner.calls for w in wrapped] == [[("sleep", 0, "keep")]] * 2


def test_a_paused_engine_keeps_its_requests_in_place_and_continues_them_after_resume():
    """RollArt's suspend -> model_update -> resume on vLLM: nothing aborted or resubmitted, no step while frozen."""
    surfaces = []

    def factory(cfg, gpus):
        surfaces.append(_PausableSurface(step_s=0.002))
        return surfaces[-1]

    layout = homogeneous(InstanceConfig("tp", tp=1), 2)
    with VllmEngine(layout, factory, kv_capacity_tokens=lambda c: 10_000, sampling_params=lambda n: n) as eng:
        eng.add_requests([GenerationRequest("a", 3, 40, prompt_token_ids=(1, 2, 3))], 0)
        eng.add_requests([GenerationRequest("b", 3, 40, prompt_token_ids=(4, 5, 6))], 1)
        eng.advance(0.02)
        def progress():
            return {r.request_id: r.generated_tokens for w in eng.snapshot().workers for r in w.running + w.waiting}

        got = progress()
        assert len(got) == 2 and all(0 < n < 40 for n in got.values())
        eng.pause_generation()
        assert eng.paused and [s.calls for s in surfaces] == [[("sleep", 0, "keep")]] * 2
        assert eng.advance(0.02) == []  # frozen: time passes, no step, no token
        assert progress() == got
        eng.resume_generation()
        assert [s.calls[-1] for s in surfaces] == [("wake_up", ("scheduling",))] * 2
        done = []
        for _ in range(200):
            done += eng.advance(0.02)
            if len(done) == 2:
                break
        assert sorted((f.request_id, f.output_tokens) for f in done) == [("a", 40), ("b", 40)]
        assert [s.added for s in surfaces] == [1, 1]  # continued in place: never resubmitted
