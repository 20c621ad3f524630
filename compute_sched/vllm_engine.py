"""vLLM adapter: the engine protocol over vLLM's public ``LLMEngine`` API, one engine per instance.

Only public calls are used: ``add_request(request_id, prompt, params)`` with a ``TokensPrompt``
mapping (``{"prompt_token_ids": [...]}``), ``abort_request([ids])``, ``step()`` returning
``RequestOutput`` objects (``request_id``, ``finished``, ``outputs[0].token_ids`` cumulative),
``has_unfinished_requests()``, ``get_metrics()`` (v1 metric snapshot: gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``), the
engine's configs (``cache_config`` block count and size for KV capacity; ``max_num_seqs`` of its
scheduler config for the batch limit the balancer keeps) and,
for layout switches, ``sleep(level=1)`` / ``wake_up()`` (engines built with
``enable_sleep_mode=True``), so an engine left for a standby configuration keeps its weights in host
memory and comes back quickly (§4.1's pre-mapped standby configurations).

Migration is by recomputation: vLLM exposes no public KV export, so a moved request is aborted on
its source and re-submitted on its destination with its prompt plus the tokens generated so far
as the new prompt and the remaining budget as ``max_tokens``. A layout change keeps engines whose
configuration and GPUs do not change and re-homes the requests of the others the same way.

Building engines is the caller's: ``engine_factory(config, gpu_ids)`` returns a ``LLMEngine`` (or
an object with the same methods, e.g. a Ray actor handle wrapper) for that configuration, e.g.
``LLMEngine.from_engine_args(EngineArgs(model=..., tensor_parallel_size=config.tp,
enable_sleep_mode=True, disable_log_stats=False))`` in a process that sees ``gpu_ids``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from compute_sched.engine import (ClusterSnapshot, FinishedRequest, GenerationRequest, Migration, MigrationReport,
                                  SwitchReport, WorkerState)
from compute_sched.layout import InstanceConfig, Layout
from compute_sched.workload import RequestState
from fabric.errors import ConfigError

__all__ = ["VllmEngine", "default_sampling_params"]


def default_sampling_params(max_tokens: int) -> Any:
    """vLLM ``SamplingParams`` for RL rollouts: sample to ``max_tokens`` or EOS."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=1.0)


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
    """Generation cluster of vLLM engines, one per layout instance.

    Parameters
    ----------
    layout : Layout
        Initial deployment.
    engine_factory : callable
        ``(InstanceConfig, gpu_ids) -> LLMEngine``.
    kv_capacity_tokens : callable
        ``InstanceConfig -> tokens`` used when an engine exposes no block count (the perf model's).
    sampling_params : callable
        ``max_tokens -> SamplingParams`` (default :func:`default_sampling_params`).
    """

    def __init__(self, layout: Layout, engine_factory: Callable[[InstanceConfig, tuple[int, ...]], Any], *,
                 kv_capacity_tokens: Callable[[InstanceConfig], int],
                 sampling_params: Callable[[int], Any] = default_sampling_params) -> None:
        self.layout, self._factory, self._cap_of, self._params = layout, engine_factory, kv_capacity_tokens, sampling_params
        self._engines = [engine_factory(i.config, i.gpu_ids) for i in layout.instances]
        self._standby: dict[tuple[InstanceConfig, tuple[int, ...]], Any] = {}
        self._reqs: dict[str, _Tracked] = {}
        self._rate = [0.0] * len(self._engines)
        self._t0 = time.monotonic()
        self._finished = 0

    # -- protocol -----------------------------------------------------------------------------
    def now_s(self) -> float:
        return time.monotonic() - self._t0

    def idle(self) -> bool:
        return not self._reqs

    def _submit(self, t: _Tracked) -> None:
        eng = self._engines[t.instance]
        ids = t.prompt_ids + t.generated_ids
        t.base = t.generated
        remaining = t.req.max_tokens - t.req.generated_tokens - t.generated
        eng.add_request(t.req.request_id, {"prompt_token_ids": ids}, self._params(max(1, remaining)))

    def add_requests(self, requests: Sequence[GenerationRequest], instance: int | None = None) -> None:
        for q in requests:
            if not q.prompt_token_ids:
                raise ConfigError("VllmEngine", "prompt_token_ids", f"request {q.request_id!r} has no token ids",
                                  "the tokenised prompt")
            k = instance if instance is not None else min(range(len(self._engines)), key=self._load)
            t = _Tracked(q, k, list(q.prompt_token_ids) + list(q.generated_token_ids))
            self._reqs[q.request_id] = t
            self._submit(t)

    def _load(self, k: int) -> int:
        return sum(1 for t in self._reqs.values() if t.instance == k)

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        out = []
        for rid in request_ids:
            t = self._reqs.pop(rid, None)
            if t is not None:
                self._engines[t.instance].abort_request([rid])
                out.append(rid)
        return out

    def _metrics(self, k: int) -> dict[str, float]:
        get = getattr(self._engines[k], "get_metrics", None)
        if get is None:
            return {}
        return {m.name: float(m.value) for m in get() if hasattr(m, "value") and m.name.startswith("vllm:")}

    def _capacity(self, k: int) -> int:
        cache = getattr(self._engines[k], "cache_config", None)
        blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        if isinstance(blocks, int) and isinstance(size, int) and blocks > 0:
            return blocks * size
        return int(self._cap_of(self.layout.instances[k].config))

    def _max_batch(self, k: int) -> int | None:
        """The engine's ``max_num_seqs`` (sequences it decodes at once), or ``None`` if it does not say.

        ``LLMEngine`` holds its scheduler config as ``scheduler_config`` (v0, early v1) or under
        ``vllm_config`` (later v1); the balancer needs it to know a worker's stable batch size (Eq. 5).
        """
        eng = self._engines[k]
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
        """Step every engine with work, round-robin, for ``seconds`` of wall time (or until idle)."""
        start = time.monotonic()
        deadline = start + max(0.0, seconds)
        tokens = [0] * len(self._engines)
        done: list[FinishedRequest] = []
        while time.monotonic() < deadline and self._reqs:
            for k, eng in enumerate(self._engines):
                if not eng.has_unfinished_requests():
                    continue
                for out in eng.step():
                    t = self._reqs.get(out.request_id)
                    if t is None or t.instance != k:
                        continue  # aborted or moved meanwhile
                    new = list(out.outputs[0].token_ids) if out.outputs else []
                    tokens[k] += max(0, t.base + len(new) - t.generated)
                    t.generated_ids = t.generated_ids[:t.base] + new
                    if out.finished:
                        del self._reqs[out.request_id]
                        done.append(FinishedRequest(out.request_id, t.req.generated_tokens + t.generated,
                                                    self.now_s(), k, t.req.group_id))
        span = max(1e-9, time.monotonic() - start)
        self._rate = [n / span for n in tokens]
        self._finished += len(done)
        return done

    def migrate(self, moves: Sequence[Migration]) -> MigrationReport:
        moved, refused = [], []
        t0 = time.monotonic()
        for mv in moves:
            t = self._reqs.get(mv.request_id)
            if t is None or t.instance != mv.src or not 0 <= mv.dst < len(self._engines) or mv.src == mv.dst:
                refused.append((mv.request_id, f"not pending on instance {mv.src} or bad destination {mv.dst}"))
                continue
            self._engines[mv.src].abort_request([mv.request_id])
            t.instance = mv.dst
            self._submit(t)
            moved.append(mv.request_id)
        return MigrationReport(tuple(moved), tuple(refused), time.monotonic() - t0,
                               {"recompute": len(moved)} if moved else {})

    def change_layout(self, layout: Layout, placement: Mapping[str, int]) -> SwitchReport:
        missing = [rid for rid in self._reqs if not 0 <= placement.get(rid, -1) < len(layout.instances)]
        if missing:
            raise ConfigError("change_layout", "placement", f"requests without a valid instance: {missing[:5]}",
                              f"an instance 0..{len(layout.instances) - 1} for every pending request")
        t0 = time.monotonic()
        old = {(i.config, i.gpu_ids): k for k, i in enumerate(self.layout.instances)}
        new_engines, kept_from = [], {}
        reuse = {old[(i.config, i.gpu_ids)] for i in layout.instances if (i.config, i.gpu_ids) in old}
        for k, inst in enumerate(self.layout.instances):
            if k not in reuse:
                for rid in [r for r, t in self._reqs.items() if t.instance == k]:
                    self._engines[k].abort_request([rid])
                self._engines[k].sleep(level=1)  # weights to host memory, KV dropped: a warm standby
                self._standby[(inst.config, inst.gpu_ids)] = self._engines[k]
        for k, inst in enumerate(layout.instances):
            key = (inst.config, inst.gpu_ids)
            if key in old and old[key] in reuse and old[key] not in kept_from.values():
                kept_from[k] = old[key]
                new_engines.append(self._engines[old[key]])
            elif key in self._standby:
                eng = self._standby.pop(key)
                eng.wake_up()
                new_engines.append(eng)
            else:
                new_engines.append(self._factory(inst.config, inst.gpu_ids))
        switch_s = time.monotonic() - t0
        moved = []
        for rid, t in self._reqs.items():
            dst = placement[rid]
            if kept_from.get(dst) == t.instance:
                t.instance = dst
                continue
            if t.instance in reuse:  # its engine lives on: take the request off it first
                self._engines[t.instance].abort_request([rid])
            t.instance = dst
            moved.append(t)
        self._engines, self.layout = new_engines, layout
        self._rate = [0.0] * len(new_engines)
        t1 = time.monotonic()
        for t in moved:
            self._submit(t)
        rep = MigrationReport(tuple(t.req.request_id for t in moved), (), time.monotonic() - t1,
                              {"recompute": len(moved)} if moved else {})
        return SwitchReport(switch_s, rep, len(kept_from))
