"""RollArt runtime: real Gymnasium environments, real reward-service processes, nothing lost, bound held."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrl.agents.agentic.buffer import Ledger, LedgerMismatch, SampleBuffer, Trajectory
from orchestrl.agents.agentic.envs import LatencySpec, make_env
from orchestrl.agents.agentic.proxy import LLMProxy
from orchestrl.agents.agentic.reward import HttpRewardClient, LocalRewardClient, RewardFailed
from orchestrl.agents.agentic.runtime import RolloutRuntime, TaskSpec
from orchestrl.agents.agentic.worker import sim_worker
from orchestrl.agents.cli import main
from orchestrl.collectives.emulation.ports import free_port
from orchestrl.compute_sched.agentic.routing import HwMapping, Router
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.agentic.clock import run_virtual
from tests.compute_sched.test_vllm_engine import PauseModes, _LLMEngineSurface

REPO = Path(__file__).resolve().parents[2]
FROZEN = TaskSpec("frozenlake", "FrozenLake-v1", "frozenlake", max_turns=6, reply_median_tokens=24,
                  latency=LatencySpec(0.5, 0.2, 1.0, 0.1, seed=1), reset_timeout_s=5.0, step_timeout_s=5.0)


def _rt(task=FROZEN, workers=2, **kw):
    ws = [sim_worker(f"h800-{i}", "h800", "H800", "Qwen3-8B") for i in range(workers)]
    proxy = LLMProxy(ws, HwMapping({}, ("h800",)))
    return RolloutRuntime(proxy, kw.pop("reward", LocalRewardClient()), [task], group_size=kw.pop("group_size", 4),
                          **kw), proxy


def test_text_wrapper_runs_any_toy_text_env_and_refuses_unknown_ids():
    for env_id in ("FrozenLake-v1", "CliffWalking-v1"):
        env = make_env(env_id)
        obs, _ = env.reset(seed=0)
        assert "actions:" in obs
        obs2, r, *_ = env.step(f"<action>{env.names[1]}</action>")
        assert isinstance(obs2, str)
        _, penalty, *_ = env.step("no idea")
        assert penalty < 0 and env.format_errors == 1
    math_env = make_env("orchestrl/MathSingleTurn-v0")
    q, _ = math_env.reset(seed=3)
    assert "Compute" in q
    with pytest.raises(ConfigError, match="env.id"):
        make_env("NoSuchEnv-v0")


def test_every_started_trajectory_is_accounted_for_under_failures_and_the_bound_holds():
    async def go():
        rt, proxy = _rt(redundancy=0.25, bound=1, max_replacements=16)
        proxy.start()
        out = await rt.train(4, 3, 2.0)
        await proxy.stop()
        return rt, out

    rt, out = run_virtual(go())
    led = out["ledger"]
    assert led["started"] == led.get("buffered", 0) + led.get("aborted", 0) + led.get("discarded", 0)
    assert out["env_failures"] and out["replacements"] > 0  # 10% failures were injected, named and replaced
    assert max(out["staleness"]) <= 1 and out["trained"] == 4 * 3 * 4
    assert all(t.version_started >= v - 1 for t, v in ((t, t.versions and max(t.versions) or 0)
                                                       for t in rt.buffer.trained))


def test_the_ledger_fails_when_a_trajectory_goes_missing_or_ends_twice():
    led = Ledger()
    a, b = Trajectory("a", "g", "x", 0, 0.0), Trajectory("b", "g", "x", 0, 0.0)
    led.start(a)
    led.start(b)
    led.end(a, "buffered")
    with pytest.raises(LedgerMismatch, match="never ended"):
        led.check()
    with pytest.raises(LedgerMismatch, match="twice"):
        led.end(a, "aborted", "redundant")


def test_sample_buffer_never_hands_out_a_trajectory_older_than_the_bound():
    async def go():
        led = Ledger()
        buf = SampleBuffer(1, led)
        old, new = Trajectory("old", "g", "x", 0, 0.0), Trajectory("new", "g", "x", 2, 0.0)
        for t in (old, new):
            led.start(t)
            t.status = "finished"
        buf.set_version(1)
        buf.put(old)  # admitted at version 1 (gap 1)
        buf.set_version(2)  # now gap 2 > bound: dropped from the buffer
        buf.put(new)
        batch = await asyncio.wait_for(buf.get_batch(1), 1.0)
        return batch, led.check()

    batch, counts = run_virtual(go())
    assert [t.trajectory_id for t in batch] == ["new"]
    assert counts["discarded"] == 1 and counts["reasons"]["stale_in_buffer"] == 1


@pytest.mark.parametrize("mode", ["raise", "hang", "malformed"])
def test_a_bad_environment_is_bounded_in_time_named_and_counted(mode):
    task = TaskSpec("bad", "FrozenLake-v1", "x", max_turns=3, latency=LatencySpec(failure_rate=1.0, failure_modes=(mode,)),
                    reset_timeout_s=10.0, step_timeout_s=10.0)

    async def go():
        rt, proxy = _rt(task, max_replacements=2)
        proxy.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        done = await rt.group("g", task)
        await proxy.stop()
        return done, loop.time() - t0, rt.summary()

    done, took, out = run_virtual(go())
    assert done == [] and took <= 3 * 10.0 + 1  # every instance fails; each within its timeout
    assert sum(out["env_failures"].values()) == 4 + 2 and out["replacements"] == 2
    assert out["ledger"]["reasons"]["env_failure"] == 6


def test_a_dead_generation_worker_is_routed_around():
    async def go():
        rt, proxy = _rt(TaskSpec("f", "FrozenLake-v1", "x", max_turns=4, reply_median_tokens=400), group_size=8)
        proxy.start()

        async def killer():
            await asyncio.sleep(0.5)
            proxy.workers[0].kill("GPU fell off the bus")
        asyncio.get_running_loop().create_task(killer())
        done = await rt.group("g", put=False)
        await proxy.stop()
        return done, proxy

    done, proxy = run_virtual(go())
    assert len(done) == 8 and proxy.rerouted > 0


def test_routing_prefers_the_tag_pool_keeps_affinity_and_falls_back_when_full():
    class W:
        def __init__(self, name, pool, load=0):
            self.name, self.pool, self.alive, self.max_batch, self.load = name, pool, True, 2, load
    a, b, c = W("a", "h800", 2), W("b", "h800", 2), W("c", "h20", 0)
    r = Router([a, b, c], HwMapping({"lake": ("h800", "h20")}, ("h20",)))
    assert r.route("t1", "lake") is c and r.fallbacks == 1  # h800 full: fall back to h20
    a.load = 0
    assert r.route("t1", "lake") is c and r.affinity_hits == 1  # the trajectory stays where its prefix is
    assert r.route("t2", "lake") is a
    with pytest.raises(ConfigError, match="hw_mapping"):
        Router([a], HwMapping({"lake": ("nope",)}))


def test_reward_service_answers_over_http_and_a_slow_or_dead_one_fails_in_bounded_time():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrl.agents.agentic.reward", "--listen", f"127.0.0.1:{port}",
                             "--delay-s", "0.0"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def call(url, **kw):
            c = HttpRewardClient(url, **kw)
            try:
                return await c.reward({"env_reward": 1.0, "turns": [[10, 5]]})
            finally:
                await c.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                assert asyncio.run(call(f"http://127.0.0.1:{port}", retries=0, timeout_s=1.0)) == 1.0
                break
            except RewardFailed:
                assert time.monotonic() < deadline and proc.poll() is None, f"service exit status {proc.poll()}"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)
    t0 = time.monotonic()  # the service is gone: every attempt is refused
    with pytest.raises(RewardFailed, match="3 attempts"):
        asyncio.run(call(f"http://127.0.0.1:{port}", retries=2, timeout_s=0.5, backoff_s=0.05))
    assert time.monotonic() - t0 < 5
    slow = subprocess.Popen([sys.executable, "-m", "orchestrl.agents.agentic.reward", "--listen", f"127.0.0.1:{port}",
                             "--delay-s", "30"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.5)
        t0 = time.monotonic()  # a slow judge: each attempt times out, the call ends in bounded time
        with pytest.raises(RewardFailed, match="TimeoutError|attempts"):
            asyncio.run(call(f"http://127.0.0.1:{port}", retries=1, timeout_s=0.5, backoff_s=0.05))
        assert time.monotonic() - t0 < 3
    finally:
        slow.kill()  # a graceful stop would wait for the 30 s request
        slow.wait(10)


def test_cli_runs_a_run_file_and_refuses_a_bad_one_naming_the_field(tmp_path):
    cfg = (REPO / "examples" / "agentic" / "frozenlake-math.yaml").read_text()
    small = cfg.replace("iterations: 3", "iterations: 1").replace("batch_groups: 4", "batch_groups: 1") \
               .replace("model_bytes: 16.4e9", "model_bytes: 1.0e8")
    (tmp_path / "run.yaml").write_text(small)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["agentic", "run", str(tmp_path / "run.yaml"), "--json"]) == 0
    doc = json.loads(buf.getvalue())
    assert doc["trained"] == 4 and doc["ledger"]["started"] >= 4
    (tmp_path / "bad.yaml").write_text(small.replace("env: FrozenLake-v1", "env: FrozenPond-v9"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["agentic", "run", str(tmp_path / "bad.yaml")]) != 0
    assert "tasks[0].env" in err.getvalue() and "FrozenPond-v9" in err.getvalue()
    (tmp_path / "huge.yaml").write_text(small.replace("asynchronous: true}", "asynchronous: true, move_bytes: true}")
                                        .replace("model_bytes: 1.0e8", "model_bytes: 16.4e9"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # 16 GB moved for real every version: refused, naming the field
        assert main(["agentic", "run", str(tmp_path / "huge.yaml")]) != 0
    assert "weights.model_bytes" in err.getvalue() and "move_bytes" in err.getvalue()


def test_the_same_env_managers_run_as_ray_actors():
    ray = pytest.importorskip("ray")
    from orchestrl.agents.agentic.ray_actors import run_on_ray
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        task = TaskSpec("f", "FrozenLake-v1", "f", max_turns=3, reply_median_tokens=8, latency=LatencySpec())
        out = run_on_ray(task, 6, env_actors=2)
    finally:
        ray.shutdown()
    assert len(out) == 6 and all(r["ok"] for r in out), out
    assert all(r["turns"] >= 1 for r in out)



def test_a_turn_in_flight_across_a_weight_update_resumes_with_its_kv_or_recomputes():
    """RollArt's suspend -> model_update -> resume: an engine that keeps KV continues the request where it
    stopped (nothing resubmitted, no prefill again); otherwise the turn is resubmitted with its context."""
    async def go(kv_reuse):
        w = sim_worker("h800-0", "h800", "H800", "Qwen3-8B", kv_reuse=kv_reuse)
        proxy = LLMProxy([w], HwMapping({}, ("h800",)))
        proxy.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        turn = loop.create_task(proxy.generate("traj-0", "x", 6000, 2000))
        await asyncio.sleep(5.0)  # mid-decode: part of its 2,000 tokens are out
        proxy.suspend()
        await asyncio.sleep(3.0)  # the model update
        proxy.resume(1)
        done = await turn
        await proxy.stop()
        return done.output_tokens, loop.time() - t0, (proxy.kv_resumed, proxy.interrupted, w.aborted)

    kept = run_virtual(go(True))
    redone = run_virtual(go(False))
    assert kept[0] == redone[0] == 2000
    assert kept[2] == (1, 0, 0) and redone[2] == (0, 1, 1)
    assert kept[1] < redone[1]  # the paused engine kept its progress: no prefill, no tokens decoded twice


class _ByteTokenizer:
    """A real tokenizer interface (encode/decode, as transformers' tokenizers) over UTF-8 bytes."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


class _ReplyingLLMEngine(_LLMEngineSurface):
    """vLLM ``LLMEngine``'s public surface (tests/compute_sched/test_vllm_engine.py's), one token a step,
    replying with the bytes of a FrozenLake action; it records the prompts it was given."""

    REPLY = list(b"<action>DOWN</action>")

    def __init__(self, step_s=0.001):
        super().__init__(step_s)
        self.prompts = []

    def add_request(self, request_id, prompt, params):
        self.prompts.append(list(prompt["prompt_token_ids"]))
        super().add_request(request_id, prompt, params)

    def step(self):
        from types import SimpleNamespace
        time.sleep(self.step_s)
        outs = []
        for rid, (max_tokens, toks) in list(self.live.items()):
            toks.append(self.REPLY[len(toks)])
            done = len(toks) >= min(max_tokens, len(self.REPLY))
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[SimpleNamespace(token_ids=list(toks))]))
            if done:
                del self.live[rid]
        return outs


@contextlib.asynccontextmanager
async def _on_vllm(surface, tok=None, **worker):
    """One generation worker over the VllmEngine adapter of ``surface`` (an object with LLMEngine's methods),
    behind a started proxy: ``async with _on_vllm(...) as (engine, worker, proxy)``; stops the proxy and
    closes the engine on the way out (both idempotent, so a test may stop it itself)."""
    from orchestrl.agents.agentic.worker import GenerationWorker
    from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
    from orchestrl.compute_sched.vllm_engine import VllmEngine

    eng = VllmEngine(homogeneous(InstanceConfig("tp", tp=1), 1), lambda c, g: surface,
                     kv_capacity_tokens=lambda c: 100_000, sampling_params=lambda n: n)
    w = GenerationWorker("vllm-0", "h800", eng, gpu="H800", tokenizer=tok, **worker)
    proxy = LLMProxy([w], HwMapping({}, ("h800",)))
    proxy.start()
    try:
        yield eng, w, proxy
    finally:
        await asyncio.wait_for(proxy.stop(), 10)
        eng.close()


def test_the_vllm_adapter_path_sends_token_ids_and_the_environment_acts_on_the_engines_reply():
    """The GPU path short of the GPU: manager -> proxy -> worker -> VllmEngine adapter -> LLMEngine's methods."""
    from orchestrl.agents.agentic.buffer import Trajectory as Traj
    from orchestrl.agents.agentic.runtime import EnvManager, Policy

    surface = _ReplyingLLMEngine()
    tok = _ByteTokenizer()
    task = TaskSpec("frozenlake", "FrozenLake-v1", "frozenlake", max_turns=3, reply_median_tokens=400)

    async def go():
        async with _on_vllm(surface, tok) as (_, _, proxy):
            mgr = EnvManager(task, proxy, Policy(1), 3, tokenizer=tok)
            traj = await asyncio.wait_for(mgr.run(Traj("t0", "g", "frozenlake", 0, 0.0)), 30)
        return traj, mgr

    traj, mgr = asyncio.run(go())
    assert len(traj.turns) >= 1 and len(surface.prompts) == len(traj.turns)
    first = tok.decode(surface.prompts[0])
    assert "actions:" in first and "<action>NAME</action>" in first  # the environment's own text, as token ids
    if len(surface.prompts) > 1:  # the next turn's prompt carries the engine's reply and the new observation
        assert "<action>DOWN</action>" in tok.decode(surface.prompts[1])
    assert mgr.env.env.format_errors == 0  # every step parsed the engine's reply as an action


class _PausableReplyingEngine(PauseModes, _ReplyingLLMEngine):
    """The replying surface with vLLM's pause modes (tests/compute_sched/test_vllm_engine.py's PauseModes)."""


@pytest.mark.parametrize("pausable", [True, False])
def test_a_turn_in_flight_on_vllm_across_a_weight_update_keeps_its_kv_where_the_engine_can_pause(pausable):
    """On the vLLM adapter: an engine whose sleep() takes mode='keep' is frozen before the update (the proxy
    waits for it) and the turn continues in place; an older engine's turn is aborted and resubmitted."""
    surface = _PausableReplyingEngine(0.01) if pausable else _ReplyingLLMEngine(0.01)
    tok = _ByteTokenizer()

    async def go():
        async with _on_vllm(surface, tok, kv_reuse=True if pausable else None) as (_, w, proxy):
            turn = asyncio.get_running_loop().create_task(
                proxy.generate("traj-0", "x", 3, 400, prompt_token_ids=tuple(tok.encode("hi!"))))
            for _ in range(1000):  # mid-reply: a few of its 22 tokens are out
                if any(len(toks) >= 3 for _, toks in surface.live.values()):
                    break
                await asyncio.sleep(0.005)
            proxy.suspend()
            await asyncio.wait_for(proxy.quiesced(), 10)
            frozen_at = list(getattr(surface, "calls", []))
            await asyncio.sleep(0.05)  # the weight update
            proxy.resume(1)
            done = await asyncio.wait_for(turn, 30)
        return done, frozen_at, (proxy.kv_resumed, proxy.interrupted, w.aborted, w.kv_reuse)

    done, frozen_at, counts = asyncio.run(go())
    assert done.text == "<action>DOWN</action>"
    if pausable:
        assert frozen_at == [("sleep", 0, "keep")]  # frozen before the update, not after
        assert counts == (1, 0, 0, True) and len(surface.prompts) == 1
        assert surface.calls[-1] == ("wake_up", ("scheduling",))
    else:
        assert counts == (0, 1, 1, False) and len(surface.prompts) == 2  # aborted, then the context again


def test_the_batch_level_baseline_takes_the_same_tokenizer_path_as_trajectory_level_runs():
    """veRL's barrier-per-turn loop on vLLM: token ids in, the engine's decoded reply is the action."""
    surface = _ReplyingLLMEngine()
    tok = _ByteTokenizer()
    task = TaskSpec("frozenlake", "FrozenLake-v1", "frozenlake", max_turns=3, reply_median_tokens=400)

    async def go():
        async with _on_vllm(surface, tok) as (_, _, proxy):
            rt = RolloutRuntime(proxy, LocalRewardClient(), [task], group_size=3, tokenizer=tok)
            out = await asyncio.wait_for(rt.batched_group("g", task), 60)
        return rt, out

    rt, out = asyncio.run(go())
    rt.ledger.check()
    assert len(out) == 3 and sum(len(t.turns) for t in out) == len(surface.prompts)
    prompts = [tok.decode(p) for p in surface.prompts]
    assert all("actions:" in p for p in prompts)  # the environment's own text, as token ids
    later = prompts[3:]  # after the first barrier every prompt carries the engine's earlier reply
    assert all("<action>DOWN</action>" in p for p in later)
    assert all(t.reward is not None and t.turns for t in out)


def test_kv_reuse_is_opt_in_and_refused_on_an_engine_that_cannot_keep_kv():
    from orchestrl.agents.agentic.worker import GenerationWorker
    from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
    from orchestrl.compute_sched.vllm_engine import VllmEngine

    layout = homogeneous(InstanceConfig("tp", tp=1), 1)
    able = VllmEngine(layout, lambda c, g: _PausableReplyingEngine(), kv_capacity_tokens=lambda c: 1000,
                      sampling_params=lambda n: n)
    old = VllmEngine(layout, lambda c, g: _ReplyingLLMEngine(), kv_capacity_tokens=lambda c: 1000,
                     sampling_params=lambda n: n)
    try:
        assert GenerationWorker("a", "p", able).kv_reuse is False  # capable, but recompute unless asked
        assert GenerationWorker("a", "p", able, kv_reuse=True).kv_reuse is True
        with pytest.raises(ConfigError, match="rollout.resume"):
            GenerationWorker("b", "p", old, kv_reuse=True)
    finally:
        able.close()
        old.close()


class _SlowPause(_PausableReplyingEngine):
    def __init__(self, fail=False):
        super().__init__()
        self.fail = fail

    def sleep(self, level=1, mode="abort"):
        time.sleep(0.3)  # the pause call is still running when the caller gives up
        if self.fail:
            raise RuntimeError("engine core gone")
        super().sleep(level, mode)


@pytest.mark.parametrize("fail", [False, True])
def test_a_worker_stopped_or_failing_during_its_engines_pause_never_hangs_the_update(fail):
    """stop() while the engine's pause call runs returns; a pause that raises kills the worker, named, and
    quiesced() returns instead of waiting for a freeze that will never come."""
    surface = _SlowPause(fail)

    async def go():
        async with _on_vllm(surface, kv_reuse=True) as (_, w, proxy):
            proxy.suspend()
            if fail:
                await asyncio.wait_for(proxy.quiesced(), 5)
            else:
                await asyncio.sleep(0.05)  # the pause call is in flight
            await asyncio.wait_for(proxy.stop(), 5)  # what is tested: stop returns while the pause runs
        return w

    w = asyncio.run(go())
    assert not w.alive
    if fail:
        assert "engine core gone" in w.failure
