"""A generation worker of the LLM proxy: one engine, one non-blocking command loop (RollArt §5.3).

Design note
-----------
The loop has vLLM's engine-core shape: ``ADD`` and ``ABORT`` commands queue in an inbox; between
engine steps the loop takes them all, then advances the engine until its next possible finish or
until a command arrives, whichever is first (``asyncio.wait`` on the inbox's event with that
timeout); a finished request resolves its caller's future at once -- no batch barrier. The engine is
any :class:`~compute_sched.engine.Engine`: :class:`~compute_sched.sim_engine.SimEngine` here (its
steps take their modelled time as ``asyncio.sleep``: real seconds in the runtime, simulated ones
under RLSim's virtual clock), the vLLM adapter on GPUs (its ``advance`` runs in a thread, so the loop
never blocks).

The simulated engine knows the output length of each request in advance (that is what it
simulates); the worker draws it from the request's ``output_tokens`` hint, which the environment
side's policy stand-in supplies (docs/agentic.md says what is real and what is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.agentic.steps import step_model
from orchestrl.fabric.errors import ConfigError, OrchestrlError

__all__ = ["Completion", "WorkerDied", "GenerationWorker", "sim_worker"]


class WorkerDied(OrchestrlError):
    """The worker's engine died; its requests were not served (the proxy routes them elsewhere)."""


@dataclass(frozen=True)
class Completion:
    """One finished generation: its tokens, the worker that served it and when."""

    request_id: str
    worker: str
    prompt_tokens: int
    output_tokens: int
    text: str = ""
    queued_s: float = 0.0  # from ADD to the engine taking it
    finished_s: float = 0.0


@dataclass
class _Pending:
    req: GenerationRequest
    future: asyncio.Future
    added_at: float
    text: str = ""


class GenerationWorker:
    """One engine behind a command loop; ``generate`` is the only call clients make."""

    def __init__(self, name: str, pool: str, engine: Any, *, gpu: str = "", max_batch: int | None = None,
                 kv_reuse: bool | None = None, tokenizer: Any = None) -> None:
        self.name, self.pool, self.engine, self.gpu = name, pool, engine, gpu
        self.max_batch = max_batch
        # Whether a weight update pauses this engine with its requests' KV kept (resume continues them)
        # instead of aborting them (resume recomputes their context). Opt-in (rollout.resume: kv_reuse),
        # and only where the engine can: the vLLM adapter where vLLM's sleep() takes the pause mode "keep"
        # (VllmEngine.can_keep_kv); the simulated engine when built with kv_reuse=True (its default here).
        self.kv_reuse = bool(getattr(engine, "kv_reuse", False)) if kv_reuse is None else kv_reuse
        if self.kv_reuse and not getattr(engine, "can_keep_kv", True):
            raise ConfigError(name, "rollout.resume", "this engine cannot keep requests across a weight update",
                              "recompute, or kv_reuse on an engine that can (VllmEngine.can_keep_kv)")
        # A real engine keeps stepping on its own (vLLM's engine core has its own loop), so a pause is a call
        # to it (pause_generation / resume_generation); ``frozen`` is set once that call has returned.
        self._engine_pause = getattr(engine, "pause_generation", None) if self.kv_reuse else None
        self._engine_paused = False
        self.frozen = asyncio.Event()
        self.tokenizer = tokenizer  # decodes a real engine's output token ids into the completion's text
        self._paused = False
        self.kept_on_update = 0  # requests that survived a weight update with their KV (not recomputed)
        self._inbox: deque[tuple[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._pending: dict[str, _Pending] = {}
        self._task: asyncio.Task | None = None
        self.alive = True
        self.failure = ""  # why the worker died (an engine that raised, or kill's reason), "" while alive
        self.busy_s = 0.0  # engine time with requests in flight (for idle time per pool)
        self.started_s = 0.0
        self.served = 0
        self.aborted = 0

    # -- client side ------------------------------------------------------------------------------
    @property
    def load(self) -> int:
        """Requests in flight (queued or running): what least-loaded routing compares."""
        return len(self._pending)

    def generate(self, req: GenerationRequest, text: str = "") -> asyncio.Future:
        """Queue ``req`` (an ``ADD``); the future resolves to a :class:`Completion` when it finishes."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self.alive:
            fut.set_exception(WorkerDied(f"worker {self.name} is dead"))
            return fut
        self._pending[req.request_id] = _Pending(req, fut, loop.time(), text)
        self._inbox.append(("ADD", req))
        self._wake.set()
        return fut

    def abort(self, request_id: str) -> None:
        """Queue an ``ABORT``; the request's future is cancelled when the loop takes it."""
        if request_id in self._pending:
            self._inbox.append(("ABORT", request_id))
            self._wake.set()

    def pause(self) -> list[str]:
        """Stop stepping the engine, keeping its requests and their KV (a weight update); returns those kept.

        The engine is frozen when :attr:`frozen` is set (at once for the simulated engine; after the
        engine's own ``pause_generation`` call for a real one): await it before loading new weights.
        """
        self._paused = True
        if self._engine_pause is None:
            self.frozen.set()
        self.kept_on_update += len(self._pending)
        self._wake.set()
        return list(self._pending)

    async def wait_frozen(self) -> None:
        """Return once the engine is frozen for the update, or the worker has stopped or died (nothing to wait for)."""
        if self.frozen.is_set() or not self.alive or self._task is None or self._task.done():
            return
        frozen = asyncio.ensure_future(self.frozen.wait())
        try:
            await asyncio.wait({frozen, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            frozen.cancel()

    def unpause(self) -> None:
        """Step the engine again: the kept requests continue where they stopped, under the new weights."""
        self._paused = False
        self.frozen.clear()
        self._wake.set()

    def kill(self, reason: str = "killed") -> None:
        """The engine dies: every request in flight fails with :class:`WorkerDied` (the proxy re-routes)."""
        if self.alive:
            self.failure = reason
        self.alive = False
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(WorkerDied(f"worker {self.name} died: {reason}"))
        self._pending.clear()
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.started_s = asyncio.get_running_loop().time()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"worker {self.name}")

    async def stop(self) -> None:
        self.alive = False
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def _take_commands(self) -> None:
        adds = []
        while self._inbox:
            cmd, arg = self._inbox.popleft()
            if cmd == "ADD":
                if arg.request_id in self._pending:
                    adds.append(arg)
            else:
                p = self._pending.pop(arg, None)
                if p is not None:
                    self.engine.abort([arg])
                    adds = [a for a in adds if a.request_id != arg]
                    self.aborted += 1
                    if not p.future.done():
                        p.future.cancel()
        if adds:
            lengths = getattr(self.engine, "lengths", None)
            if lengths is not None:  # the simulated engine: its hidden output length is the request's cap
                for a in adds:
                    lengths[a.request_id] = a.max_tokens
            self.engine.add_requests(adds)

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine raised: a dead worker, its requests fail over (the proxy re-routes)
            self.kill(f"{type(exc).__name__}: {exc}")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        eng = self.engine
        clock = loop.time()
        while self.alive:
            self._take_commands()
            if self._paused:  # a weight update: the engine's clock stands still, its requests keep their KV
                if self._engine_pause is not None and not self._engine_paused:
                    # a wake-up during the call (stop, kill, unpause) is not lost: back to the top to re-check
                    await loop.run_in_executor(None, self._engine_pause)
                    self._engine_paused = True
                    if self._paused:
                        self.frozen.set()
                    continue
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            if self._engine_paused:  # resumed: the frozen requests continue under the new weights
                await loop.run_in_executor(None, eng.resume_generation)
                self._engine_paused = False
                self.frozen.clear()
                clock = loop.time()
                continue
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                now = loop.time()
                eng.advance(now - clock)  # an idle engine: keep its clock with the loop's
                clock = now
                continue
            horizon = eng.next_event_s() if hasattr(eng, "next_event_s") else 0.01
            horizon = 1e-4 if not math.isfinite(horizon) or horizon <= 0 else horizon
            self._wake.clear()
            # woken by new work or by the engine's next event, whichever comes first
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=horizon)
            now = loop.time()
            dt = now - clock
            clock = now
            self.busy_s += dt
            if hasattr(eng, "next_event_s"):  # the simulated engine: advancing is bookkeeping
                finished = eng.advance(dt)
            else:  # a real engine steps for dt of wall time: on a thread, so the loop keeps taking commands
                finished = await loop.run_in_executor(None, eng.advance, max(dt, 0.005))
                clock = loop.time()
            for f in finished:
                p = self._pending.pop(f.request_id, None)
                if p is None or p.future.done():
                    continue
                self.served += 1
                ids = getattr(f, "token_ids", ())
                text = self.tokenizer.decode(list(ids)) if self.tokenizer is not None and ids else p.text
                p.future.set_result(Completion(f.request_id, self.name, p.req.prompt_tokens, f.output_tokens, text,
                                               0.0, now))


def sim_worker(name: str, pool: str, gpu: str, model: str, tp: int = 1, max_batch: int | None = None,
               kv_reuse: bool = False) -> GenerationWorker:
    """A worker on the simulated engine: ``model`` at TP ``tp`` on ``gpu`` (step times from :func:`step_model`).

    ``kv_reuse``: the engine keeps a request's KV across a weight update (it simply stops stepping),
    what an engine with pause/resume offers; the default is recompute, what the vLLM adapter does.
    """
    perf = step_model(load_model(model), load_gpu(gpu))
    cfg = InstanceConfig("tp", tp=tp)
    eng = SimEngine(perf, homogeneous(cfg, tp), {}, max_num_seqs=max_batch)
    return GenerationWorker(name, pool, eng, gpu=gpu, max_batch=max_batch, kv_reuse=kv_reuse)
