"""The LLM proxy (RollArt §5.3 ``LLMProxy``): a gateway over the generation workers.

Clients (environment managers) call :meth:`LLMProxy.generate` per turn; the proxy routes it
(:class:`~compute_sched.agentic.routing.Router`: environment affinity, hardware affinity by task tag
with fallback, least loaded), hands it to the worker's command loop and returns the completion as
soon as that request finishes. A worker that dies fails its requests with ``WorkerDied``; the proxy
routes them again (counted, bounded by ``retries``). ``suspend`` / ``resume`` implement the
weight-update protocol: while suspended no request starts, requests in flight are aborted and wait,
and on ``resume`` they are submitted again under the new version with their context (recompute) --
except on a worker whose engine keeps KV across an update (``GenerationWorker.kv_reuse``): that
worker is paused instead, its requests keep their place and KV, and continue on ``resume``.
The routing time of every request is kept, so its overhead can be reported against the engine's
step time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Sequence

from orchestrl.agents.agentic.worker import Completion, GenerationWorker, WorkerDied
from orchestrl.compute_sched.agentic.routing import HwMapping, Router
from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.fabric.errors import OrchestrlError

__all__ = ["LLMProxy", "GenerationFailed"]


class GenerationFailed(OrchestrlError):
    """A request could not be served: every retry landed on a dying worker, or no worker is left."""


class LLMProxy:
    """Route, submit, retry; suspend and resume for weight updates (see the module note)."""

    def __init__(self, workers: Sequence[GenerationWorker], mapping: HwMapping, *, retries: int = 3) -> None:
        self.workers = list(workers)
        self.router = Router(self.workers, mapping)
        self.retries = retries
        self.version = 0
        self._open = asyncio.Event()
        self._open.set()
        self._inflight: dict[str, GenerationWorker] = {}
        self.route_s: deque[float] = deque(maxlen=200_000)
        self.rerouted = 0
        self.interrupted = 0
        self.kv_resumed = 0  # requests carried across an update with their KV (no recompute)
        self._paused: list[GenerationWorker] = []
        self._seq = 0

    def start(self) -> None:
        for w in self.workers:
            w.start()

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers))

    async def generate(self, trajectory_id: str, tag: str, prompt_tokens: int, max_tokens: int,
                       text: str = "", prompt_token_ids: tuple[int, ...] = ()) -> Completion:
        """Serve one turn; retries on a dead worker; waits out a suspension and resubmits (recompute)."""
        tries = 0
        while True:
            await self._open.wait()
            t0 = time.perf_counter()
            try:
                worker = self.router.route(trajectory_id, tag)
            except Exception as exc:
                raise GenerationFailed(f"trajectory {trajectory_id}: {exc}") from None
            self._seq += 1
            rid = f"{trajectory_id}/{self._seq}"
            fut = worker.generate(GenerationRequest(rid, prompt_tokens, max_tokens, tag,
                                                    prompt_token_ids=tuple(prompt_token_ids)), text)
            self.route_s.append(time.perf_counter() - t0)
            self._inflight[rid] = worker
            try:
                return await fut
            except WorkerDied:
                tries += 1
                self.rerouted += 1
                self.router.forget(trajectory_id)
                if tries > self.retries:
                    raise GenerationFailed(f"trajectory {trajectory_id}: {tries} workers died under it") from None
            except asyncio.CancelledError:
                if self._open.is_set() or asyncio.current_task().cancelling():
                    worker.abort(rid)  # the caller cancelled (a redundant or stale trajectory): free the engine
                    raise
                self.interrupted += 1  # suspended mid-turn: resubmit after resume with the context so far
            finally:
                self._inflight.pop(rid, None)

    def suspend(self) -> None:
        """Stop starting requests and abort those in flight (they resubmit on resume)."""
        self._open.clear()
        for w in self.workers:
            if w.kv_reuse and w.alive:
                self.kv_resumed += len(w.pause())
                self._paused.append(w)
        for rid, w in list(self._inflight.items()):
            if not w.kv_reuse:
                w.abort(rid)

    async def quiesced(self) -> None:
        """Wait until every paused worker's engine is frozen (a real engine's pause is a call to it)."""
        for w in list(self._paused):
            await w.wait_frozen()

    def resume(self, version: int) -> None:
        self.version = version
        for w in self._paused:
            w.unpause()
        self._paused.clear()
        self._open.set()

    def routing_p99_ms(self) -> float:
        xs = sorted(self.route_s)
        return 1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0
