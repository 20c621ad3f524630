"""vLLM adapter: the engine protocol over vLLM's public ``LLMEngine`` API, one engine per instance.

Only public calls are used: ``add_request(request_id, prompt, params)`` with a ``TokensPrompt``
mapping (``{"prompt_token_ids": [...]}``), ``abort_request([ids])``, ``step()`` returning
``RequestOutput`` objects (``request_id``, ``finished``, ``outputs[0].token_ids`` cumulative),
``has_unfinished_requests()``, ``get_metrics()`` (v1 metric snapshot: gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``), the
engine's configs (``cache_config`` block count and size for KV capacity; ``max_num_seqs`` of its
scheduler config for the batch limit the balancer keeps; ``kv_transfer_config`` for the KV
connector it was built with) and, for layout switches, ``sleep(level=1)`` / ``wake_up()`` (engines
built with ``enable_sleep_mode=True``), so an engine left for a standby configuration keeps its
weights in host memory and comes back quickly (§4.1's pre-mapped standby configurations).

Design note: engines run concurrently
-------------------------------------
A deployment runs every instance at once (one process or thread per engine), so the adapter gives
each engine one worker thread that builds it and is the only thread that ever calls it (vLLM's
engine is not thread-safe, and a CUDA device set while building is per thread). ``advance`` starts
every engine's step loop at once and waits for all of them, so its wall time is the slowest
engine's, not the sum. This is real parallelism because ``LLMEngine.step()`` spends its time
outside the GIL: with vLLM v1's default ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the engine core runs
in its own process (TP>1: its workers in further processes) and ``step()`` blocks in
``SyncMPClient.get_output()`` on ``queue.Queue.get()``; in-process engines (``InprocClient``) wait
on their TP workers or on the GPU. An error raised in any engine's thread reaches the caller as
:class:`EngineFailure` naming that engine; :meth:`VllmEngine.close` (or leaving a ``with`` block,
or garbage collection) stops every thread.

Migration is by recomputation: a moved request is aborted on its source and re-submitted on its
destination with its prompt plus the tokens generated so far as the new prompt and the remaining
budget as ``max_tokens``. vLLM's KV connectors (``kv_transfer_config``: ``NixlConnector``,
``LMCacheConnectorV1``, ...) move KV only for disaggregated prefill: a request submitted with
``kv_transfer_params={"do_remote_decode": True}`` hands its blocks over when it finishes
*length-capped*; an aborted request's blocks are freed (``NixlConnector.request_finished``), and
no public call ends a running request length-capped, so a running request cannot be handed over.
:attr:`VllmEngine.capabilities` therefore reports recompute only, naming the connector if one is
configured. A layout change keeps engines whose configuration and GPUs do not change and re-homes
the requests of the others the same way.

Weight updates with requests in flight (RollArt's ``suspend -> model_update -> resume``):
:meth:`VllmEngine.pause_generation` calls ``sleep(level=0, mode="keep")`` on every engine (vLLM's
``PauseMode``: level 0 pauses only the scheduler, nothing is offloaded or cleared; ``keep`` leaves
running and waiting requests in their queues with their KV), and
:meth:`VllmEngine.resume_generation` calls ``wake_up(tags=["scheduling"])`` (``vllm/v1/engine/core.py``:
``pause_scheduler``, ``sleep``, ``wake_up``). :attr:`VllmEngine.can_keep_kv` says whether the engines'
``sleep`` takes ``mode``; older ones can only abort, and callers recompute. Level 0 clears no cache:
the weight loader resets the prefix cache after loading (``collectives.vllm_backend`` calls
``reset_prefix_cache()``, which frees only blocks no running request holds), so frozen requests keep
their KV and later turns do not hit prefixes computed under the old weights.

Building engines is the caller's: ``engine_factory(config, gpu_ids)`` returns a ``LLMEngine`` (or
an object with the same methods, e.g. a Ray actor handle wrapper) for that configuration, e.g.
``LLMEngine.from_engine_args(EngineArgs(model=..., tensor_parallel_size=config.tp,
enable_sleep_mode=True, disable_log_stats=False))`` in a process that sees ``gpu_ids``. Factories
are called one at a time (they may set process-wide state such as ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import inspect
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from orchestrl.compute_sched.engine import (ClusterSnapshot, EngineCapabilities, FinishedRequest, GenerationRequest, Migration,
                                  MigrationReport, SwitchReport, WorkerState)
from orchestrl.compute_sched.layout import InstanceConfig, Layout
from orchestrl.compute_sched.multiplex.substage import StepRecord
from orchestrl.compute_sched.workload import RequestState
from orchestrl.fabric.errors import ConfigError, OrchestrlError

__all__ = ["VllmEngine", "EngineFailure", "default_sampling_params"]


def default_sampling_params(max_tokens: int) -> Any:
    """vLLM ``SamplingParams`` for RL rollouts: sample to ``max_tokens`` or EOS."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=1.0)


class EngineFailure(OrchestrlError):
    """One or more engines raised in their worker threads.

    ``failures`` lists ``(engine name, exception)``; ``finished`` holds the requests that finished
    on the healthy engines during the same call (already removed from the pending set), and
    ``lost`` the requests that no engine holds any more (a submission that failed), so the caller
    can account for every request.
    """

    def __init__(self, action: str, failures: Sequence[tuple[str, BaseException]],
                 finished: Sequence[FinishedRequest] = (), lost: Sequence[str] = ()) -> None:
        self.action, self.failures = action, list(failures)
        self.finished, self.lost = list(finished), list(lost)
        what = "; ".join(f"{name}: {type(exc).__name__}: {exc}" for name, exc in self.failures)
        gone = f"; requests no longer pending: {self.lost[:5]}{' ...' if len(self.lost) > 5 else ''}" if lost else ""
        super().__init__(f"{action} failed on {len(self.failures)} engine(s): {what}{gone}")


class _Worker:
    """One engine and the one thread that builds it and makes every call on it."""

    def __init__(self, name: str, factory: Callable[[InstanceConfig, tuple[int, ...]], Any], config: InstanceConfig,
                 gpu_ids: tuple[int, ...]) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vllm-engine {name}")
        try:
            self.engine = self.call("build", factory, config, gpu_ids)
        except EngineFailure:
            self.pool.shutdown(wait=True)
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self.pool.submit(fn, *args)

    def call(self, action: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on this engine's thread and return its result; its error names the engine."""
        try:
            return self.submit(fn, *args).result()
        except Exception as exc:
            raise EngineFailure(action, [(self.name, exc)]) from exc

    def close(self, wait_s: bool = True) -> None:
        self.pool.shutdown(wait=wait_s)


def _stop_workers(workers: list[_Worker]) -> None:
    # Runs at garbage collection, possibly on one of these very threads: signal, do not join.
    for w in workers:
        w.close(wait_s=False)


def _step_until(engine: Any, deadline: float, t0: float, log: list | None = None, instance: int = 0,
                seen: set | None = None) -> dict[str, tuple[bool, list[int], float]]:
    """Step ``engine`` until ``deadline`` or idle, on its own thread; return each request's last output.

    The value is ``(finished, cumulative token ids, seconds since t0 when this output arrived)``;
    outputs are cumulative, so the last one per request carries everything. With ``log`` each step is
    appended as a :class:`~compute_sched.multiplex.substage.StepRecord`: one token per request that
    produced output, plus its prompt the first time it appears (``seen``), as JigsawRL's tracker counts.
    """
    last: dict[str, tuple[Any, float]] = {}
    while time.monotonic() < deadline and engine.has_unfinished_requests():
        began = time.monotonic()
        outs = engine.step()
        now = time.monotonic() - t0
        if log is not None:
            tokens = 0
            for out in outs:
                tokens += 1
                if seen is not None and out.request_id not in seen:
                    seen.add(out.request_id)
                    tokens += len(getattr(out, "prompt_token_ids", None) or ())
            log.append(StepRecord(instance, began - t0, now - (began - t0), tokens))
        for out in outs:
            last[out.request_id] = (out, now)
    return {rid: (bool(out.finished), list(out.outputs[0].token_ids) if out.outputs else [], at)
            for rid, (out, at) in last.items()}


@dataclass
class _Tracked:
    req: GenerationRequest
    instance: int
    prompt_ids: list[int]
    generated_ids: list[int] = field(default_factory=list)  # across re-submissions
    base: int = 0  # generated tokens folded into the prompt by the last re-submission

    @property
    def generated(self) -> int:
        return len(self.generated_ids)

    def state(self) -> RequestState:
        return RequestState(self.req.request_id, self.req.prompt_tokens, self.req.generated_tokens + self.generated,
                            self.req.max_tokens, self.req.group_id)


class VllmEngine:
    """Generation cluster of vLLM engines, one per layout instance, each on its own thread.

    Parameters
    ----------
    layout : Layout
        Initial deployment.
    engine_factory : callable
        ``(InstanceConfig, gpu_ids) -> LLMEngine``; called on the new engine's own thread, one at a time.
    kv_capacity_tokens : callable
        ``InstanceConfig -> tokens`` used when an engine exposes no block count (the perf model's).
    sampling_params : callable
        ``max_tokens -> SamplingParams`` (default :func:`default_sampling_params`).

    Raises
    ------
    EngineFailure
        From any call, when an engine raised; the message names the engine.
    """

    def __init__(self, layout: Layout, engine_factory: Callable[[InstanceConfig, tuple[int, ...]], Any], *,
                 kv_capacity_tokens: Callable[[InstanceConfig], int],
                 sampling_params: Callable[[int], Any] = default_sampling_params,
                 can_keep_kv: bool | None = None) -> None:
        self.layout, self._factory, self._cap_of, self._params = layout, engine_factory, kv_capacity_tokens, sampling_params
        self._can_keep_kv = can_keep_kv  # None: read it from each engine's sleep() signature (a wrapper: say so)
        self._all: list[_Worker] = []  # every worker ever started, so close() and GC stop them all
        self._finalizer = weakref.finalize(self, _stop_workers, self._all)
        self._workers: list[_Worker] = []
        try:
            for inst in layout.instances:
                self._workers.append(self._start(inst.config, inst.gpu_ids))
        except EngineFailure:
            self.close()  # the engines built so far: no thread outlives a failed constructor
            raise
        self._standby: dict[tuple[InstanceConfig, tuple[int, ...]], _Worker] = {}
        self._reqs: dict[str, _Tracked] = {}
        self._rate = [0.0] * len(self._workers)
        self._t0 = time.monotonic()
        self._finished = 0
        self.step_log: list | None = None  # set to a list to record forward steps (JigsawRL's tracker reads them)
        self._seen: dict[int, set] = {}  # per instance: requests whose prompt was counted as prefill
        self.paused = False  # pause_generation froze every engine's requests (with their KV) until resume

    def _start(self, config: InstanceConfig, gpu_ids: tuple[int, ...]) -> _Worker:
        w = _Worker(f"{config.name} on GPUs {list(gpu_ids)}", self._factory, config, gpu_ids)
        self._all.append(w)
        return w

    @property
    def _engines(self) -> list[Any]:
        return [w.engine for w in self._workers]

    def close(self) -> None:
        """Shut every engine's thread down (and the engine, if it has ``shutdown()``); idempotent.

        Every thread is stopped even if an engine's ``shutdown()`` raises; those errors follow as one
        :class:`EngineFailure`.
        """
        failures = []
        while self._all:
            w = self._all.pop()
            stop = getattr(w.engine, "shutdown", None)
            if stop is not None:
                try:
                    w.call("shutdown", stop)
                except EngineFailure as exc:
                    failures += exc.failures
            w.close()
        self._finalizer.detach()
        if failures:
            raise EngineFailure("shutdown", failures)

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- protocol -----------------------------------------------------------------------------
    @property
    def capabilities(self) -> EngineCapabilities:
        """Recompute only; names the KV connector the engines were built with, if any (module note)."""
        found = sorted({c for c in map(_kv_connector, self._engines) if c})
        return EngineCapabilities(kv_transfer=False, kv_connector=", ".join(found) or None)

    @property
    def can_keep_kv(self) -> bool:
        """Whether a weight update *can* freeze requests in place with their KV (:meth:`pause_generation`).

        True when every engine's ``sleep`` takes vLLM's pause ``mode`` (``"abort" | "wait" | "keep"``), or
        when the constructor was told so (``can_keep_kv=True``, for a wrapper whose ``sleep(*args,
        **kwargs)`` hides the signature); older engines only abort. A capability, not a choice: the
        agentic runtime keeps KV only when the run asks for it (``rollout.resume: kv_reuse``).
        """
        if self._can_keep_kv is not None:
            return self._can_keep_kv
        return bool(self._workers) and all(_can_keep(e) for e in self._engines)

    def pause_generation(self) -> None:
        """Freeze every engine's requests where they are, KV kept, for an in-place weight update.

        ``sleep(level=0, mode="keep")``: level 0 only pauses the scheduler (weights and KV stay on the
        GPU, nothing is cleared), ``keep`` leaves running and waiting requests in their queues. Nothing
        is stepped until :meth:`resume_generation` (a paused engine core produces no output, so a
        ``step()`` would block). Raises :class:`~fabric.errors.ConfigError` on engines without ``mode``.
        """
        if not self.can_keep_kv:
            raise ConfigError("VllmEngine", "rollout.resume",
                              "these vLLM engines cannot keep requests across a weight update (their sleep() "
                              "takes no pause mode)", "recompute, or kv_reuse on a vLLM whose LLMEngine.sleep "
                              "takes mode='keep'")
        self._on_each("pause", {k: _pause_keep for k in range(len(self._workers))})
        self.paused = True

    def resume_generation(self) -> None:
        """Let every engine schedule again: the frozen requests continue under the weights loaded meanwhile."""
        self._on_each("resume", {k: _resume_scheduling for k in range(len(self._workers))})
        self.paused = False

    def now_s(self) -> float:
        return time.monotonic() - self._t0

    def idle(self) -> bool:
        return not self._reqs

    def _on_each(self, action: str, jobs: Mapping[int, Callable[[Any], Any]],
                 workers: Sequence[_Worker] | None = None) -> dict[int, Any]:
        """Run ``jobs[k](engine k)`` on every engine's own thread at once; wait for all; name every failure.

        ``workers`` defaults to the current instances' (``k`` is then the instance index).
        """
        pool = self._workers if workers is None else workers
        futures = {k: pool[k].submit(job, pool[k].engine) for k, job in jobs.items()}
        wait(futures.values())
        where = "instance {k} ({name})" if workers is None else "{name}"
        failures = [(where.format(k=k, name=pool[k].name), f.exception()) for k, f in futures.items()
                    if f.exception() is not None]
        if failures:
            raise EngineFailure(action, failures)
        return {k: f.result() for k, f in futures.items()}

    def _submit_job(self, items: list[_Tracked], done: list[str]) -> Callable[[Any], None]:
        def job(eng: Any) -> None:
            for t in items:
                ids = t.prompt_ids + t.generated_ids
                remaining = t.req.max_tokens - t.req.generated_tokens - t.generated
                eng.add_request(t.req.request_id, {"prompt_token_ids": ids}, self._params(max(1, remaining)))
                t.base = t.generated
                done.append(t.req.request_id)
        return job

    def _submit(self, tracked: Sequence[_Tracked], action: str) -> None:
        """Add ``tracked`` to their instances' engines, all engines at once; a failed add is untracked."""
        by: dict[int, list[_Tracked]] = {}
        for t in tracked:
            by.setdefault(t.instance, []).append(t)
        done: list[str] = []
        try:
            self._on_each(action, {k: self._submit_job(items, done) for k, items in by.items()})
        except EngineFailure as exc:
            ok = set(done)
            lost = [t.req.request_id for t in tracked if t.req.request_id not in ok]
            for rid in lost:
                self._reqs.pop(rid, None)  # on no engine: no longer pending
            raise EngineFailure(exc.action, exc.failures, lost=lost) from exc

    def add_requests(self, requests: Sequence[GenerationRequest], instance: int | None = None) -> None:
        new = []
        for q in requests:
            if not q.prompt_token_ids:
                raise ConfigError("VllmEngine", "prompt_token_ids", f"request {q.request_id!r} has no token ids",
                                  "the tokenised prompt")
            k = instance if instance is not None else min(range(len(self._workers)), key=self._load)
            t = _Tracked(q, k, list(q.prompt_token_ids) + list(q.generated_token_ids))
            self._reqs[q.request_id] = t
            new.append(t)
        self._submit(new, "add_request")

    def _load(self, k: int) -> int:
        return sum(1 for t in self._reqs.values() if t.instance == k)

    def _abort_on(self, by: Mapping[int, list[str]], action: str) -> None:
        self._on_each(action, {k: (lambda eng, ids=ids: eng.abort_request(ids)) for k, ids in by.items() if ids})

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        out, by = [], {}
        for rid in request_ids:
            t = self._reqs.pop(rid, None)
            if t is not None:
                by.setdefault(t.instance, []).append(rid)
                out.append(rid)
        self._abort_on(by, "abort_request")
        return out

    def _metrics(self, k: int) -> dict[str, float]:
        get = getattr(self._workers[k].engine, "get_metrics", None)
        if get is None:
            return {}
        snap = self._workers[k].call("get_metrics", get)
        return {m.name: float(m.value) for m in snap if hasattr(m, "value") and m.name.startswith("vllm:")}

    def _capacity(self, k: int) -> int:
        cache = getattr(self._workers[k].engine, "cache_config", None)
        blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        if isinstance(blocks, int) and isinstance(size, int) and blocks > 0:
            return blocks * size
        return int(self._cap_of(self.layout.instances[k].config))

    def _max_batch(self, k: int) -> int | None:
        """The engine's ``max_num_seqs`` (sequences it decodes at once), or ``None`` if it does not say.

        ``LLMEngine`` holds its scheduler config as ``scheduler_config`` (v0, early v1) or under
        ``vllm_config`` (later v1); the balancer needs it to know a worker's stable batch size (Eq. 5).
        """
        eng = self._workers[k].engine
        for sched in (getattr(getattr(eng, "vllm_config", None), "scheduler_config", None),
                      getattr(eng, "scheduler_config", None)):
            seqs = getattr(sched, "max_num_seqs", None)
            if isinstance(seqs, int) and seqs > 0:
                return seqs
        return None

    def snapshot(self) -> ClusterSnapshot:
        workers = []
        for k, inst in enumerate(self.layout.instances):
            mine = [t for t in self._reqs.values() if t.instance == k]
            running = [t for t in mine if t.generated > t.base]  # produced a token since (re)submission
            waiting = [t for t in mine if t.generated <= t.base]
            cap = self._capacity(k)
            used = sum(t.req.prompt_tokens + t.req.generated_tokens + t.generated for t in running)
            perc = self._metrics(k).get("vllm:kv_cache_usage_perc")
            workers.append(WorkerState(k, inst.config, tuple(t.state() for t in running),
                                       tuple(t.state() for t in waiting), int(perc * cap) if perc is not None else used,
                                       cap, self._rate[k], max_batch=self._max_batch(k)))
        return ClusterSnapshot(self.now_s(), self.layout, tuple(workers), self._finished)

    def advance(self, seconds: float) -> list[FinishedRequest]:
        """Step every engine with work, all at once, for ``seconds`` of wall time (or until all are idle).

        Returns the requests that finished, in finishing order, each stamped with the time its
        engine returned it. If an engine raised, the others' results are still applied and
        :class:`EngineFailure` names the failed engine and carries the finished requests.
        """
        start = time.monotonic()
        deadline = start + max(0.0, seconds)
        if self.paused:  # frozen for a weight update: time passes, nothing is stepped
            time.sleep(max(0.0, seconds))
            self._rate = [0.0] * len(self._workers)
            return []
        busy = sorted({t.instance for t in self._reqs.values()})
        futures = {k: self._workers[k].submit(_step_until, self._workers[k].engine, deadline, self._t0, self.step_log, k,
                                              self._seen.setdefault(k, set())) for k in busy}
        wait(futures.values())
        tokens = [0] * len(self._workers)
        done: list[FinishedRequest] = []
        failures = []
        for k, fut in futures.items():
            if fut.exception() is not None:
                failures.append((f"instance {k} ({self._workers[k].name})", fut.exception()))
                continue
            for rid, (finished, new, at) in fut.result().items():
                t = self._reqs.get(rid)
                if t is None or t.instance != k:
                    continue  # aborted or moved before this advance
                tokens[k] += max(0, t.base + len(new) - t.generated)
                t.generated_ids = t.generated_ids[:t.base] + new
                if finished:
                    del self._reqs[rid]
                    done.append(FinishedRequest(rid, t.req.generated_tokens + t.generated, at, k, t.req.group_id,
                                                tuple(t.req.generated_token_ids) + tuple(t.generated_ids)))
        span = max(1e-9, time.monotonic() - start)
        self._rate = [n / span for n in tokens]
        done.sort(key=lambda f: f.finish_time_s)
        self._finished += len(done)
        if failures:
            raise EngineFailure("step", failures, done)
        return done

    def migrate(self, moves: Sequence[Migration]) -> MigrationReport:
        """Move requests by recomputation (any ``method``): abort on the source, re-submit on the destination.

        ``seconds`` is the time to re-queue them; the prefill that rebuilds their KV runs in later steps.
        """
        t0 = time.monotonic()
        plan: dict[str, tuple[_Tracked, int]] = {}
        refused, aborts = [], {}
        for mv in moves:
            t = self._reqs.get(mv.request_id)
            if t is None or t.instance != mv.src or not 0 <= mv.dst < len(self._workers) or mv.src == mv.dst \
                    or mv.request_id in plan:
                refused.append((mv.request_id, f"not pending on instance {mv.src} or bad destination {mv.dst}"))
                continue
            plan[mv.request_id] = (t, mv.dst)
            aborts.setdefault(mv.src, []).append(mv.request_id)
        self._abort_on(aborts, "abort_request (migration)")
        for t, dst in plan.values():
            t.instance = dst
        self._submit([t for t, _ in plan.values()], "add_request (migration)")
        return MigrationReport(tuple(plan), tuple(refused), time.monotonic() - t0,
                               {"recompute": len(plan)} if plan else {})

    def change_layout(self, layout: Layout, placement: Mapping[str, int]) -> SwitchReport:
        """Redeploy as ``layout``: keep unchanged engines, put the others to sleep, wake or build the new ones.

        Sleeps and wake-ups run on all engines at once; new engines are built one at a time.
        """
        missing = [rid for rid in self._reqs if not 0 <= placement.get(rid, -1) < len(layout.instances)]
        if missing:
            raise ConfigError("change_layout", "placement", f"requests without a valid instance: {missing[:5]}",
                              f"an instance 0..{len(layout.instances) - 1} for every pending request")
        t0 = time.monotonic()
        old = {(i.config, i.gpu_ids): k for k, i in enumerate(self.layout.instances)}
        reuse = {old[(i.config, i.gpu_ids)] for i in layout.instances if (i.config, i.gpu_ids) in old}
        leaving = [k for k in range(len(self._workers)) if k not in reuse]
        doomed = {k: [r for r, t in self._reqs.items() if t.instance == k] for k in leaving}
        # Requests whose engine lives on but that move elsewhere leave it first.
        kept_from: dict[int, int] = {}
        for k, inst in enumerate(layout.instances):
            key = (inst.config, inst.gpu_ids)
            if key in old and old[key] in reuse and old[key] not in kept_from.values():
                kept_from[k] = old[key]
        stays = {v: k for k, v in kept_from.items()}
        for rid, t in self._reqs.items():
            if t.instance in stays and placement[rid] != stays[t.instance]:
                doomed.setdefault(t.instance, []).append(rid)
        self._abort_on(doomed, "abort_request (layout change)")

        def to_sleep(eng: Any) -> None:
            eng.sleep(level=1)  # weights to host memory, KV dropped: a warm standby

        self._on_each("sleep", {k: to_sleep for k in leaving})
        for k in leaving:
            inst = self.layout.instances[k]
            self._standby[(inst.config, inst.gpu_ids)] = self._workers[k]
        new_workers: list[_Worker | None] = []
        waking: list[_Worker] = []
        for k, inst in enumerate(layout.instances):
            key = (inst.config, inst.gpu_ids)
            if k in kept_from:
                new_workers.append(self._workers[kept_from[k]])
            elif key in self._standby:
                waking.append(self._standby.pop(key))
                new_workers.append(waking[-1])
            else:
                new_workers.append(None)  # built below, after the wake-ups
        self._on_each("wake_up", {i: (lambda eng: eng.wake_up()) for i in range(len(waking))}, waking)
        self._workers = [w if w is not None else self._start(inst.config, inst.gpu_ids)
                         for w, inst in zip(new_workers, layout.instances)]
        switch_s = time.monotonic() - t0
        moved = []
        for rid, t in self._reqs.items():
            dst = placement[rid]
            if kept_from.get(dst) == t.instance:
                t.instance = dst
                continue
            t.instance = dst
            moved.append(t)
        self.layout = layout
        self._rate = [0.0] * len(self._workers)
        t1 = time.monotonic()
        self._submit(moved, "add_request (layout change)")
        rep = MigrationReport(tuple(t.req.request_id for t in moved), (), time.monotonic() - t1,
                              {"recompute": len(moved)} if moved else {})
        return SwitchReport(switch_s, rep, len(kept_from))


def _can_keep(engine: Any) -> bool:
    """Does ``engine.sleep`` take vLLM's pause ``mode`` (``vllm/v1/engine/core.py``: ``pause_scheduler``)?"""
    try:
        return "mode" in inspect.signature(engine.sleep).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def _pause_keep(engine: Any) -> None:
    engine.sleep(level=0, mode="keep")


def _resume_scheduling(engine: Any) -> None:
    engine.wake_up(tags=["scheduling"])


def _kv_connector(engine: Any) -> str | None:
    """The KV connector ``engine`` was built with (``vllm_config.kv_transfer_config.kv_connector``), if any."""
    cfg = getattr(getattr(engine, "vllm_config", None), "kv_transfer_config", None)
    name = getattr(cfg, "kv_connector", None)
    return name if isinstance(name, str) and name else None
