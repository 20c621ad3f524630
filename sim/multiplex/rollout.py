"""One DP worker's rollout on the simulated engine, and the sub-stage chain JigsawRL reads from its steps.

The worker's engine is :class:`~compute_sched.sim_engine.SimEngine` (continuous batching, PerfModel
step times) with its ``step_log`` on; a small driver plays the task's turns: a finished turn's
observation is appended after its tool latency (or, for blocked tools, after the whole batch's
calls, §3.1), and the next turn is submitted with the grown context. The step records go through
:class:`~compute_sched.multiplex.substage.SubStageTracker` (§4.1's buckets and hysteresis) into the
replica's rollout chain. Reference and training follow as FLOPs at calibrated MFUs
(:func:`post_times`), a fixed cost plus FLOPs at an MFU fitted to two rows of Table 1's stage shares
and checked on the other three (:func:`fit_post_model`, :func:`veRL_shares`).
"""

from __future__ import annotations

import heapq
import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import ContextManager, Iterator, Sequence

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.multiplex.grid import IDLE
from orchestrl.compute_sched.multiplex.substage import Segment, StepRecord, SubStageTracker
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex.workload import TASKS, PipelineSpec, Sample

__all__ = ["RolloutTrace", "simulate_replica", "post_times", "perf_model", "steps_after", "veRL_shares", "fit_post_model", "post_model", "MFU_TRAIN", "MFU_REF", "TOOL_GAP_S"]

# veRL's training and reference passes as a fixed cost per step plus FLOPs at an MFU, fitted to Table 1's
# two 4-GPU GSM8K rows (Qwen3-0.6B and Qwen3-4B; fit_post_model) and checked on its other three.
MFU_TRAIN, TRAIN_FIXED_S = 0.237, 2.24
MFU_REF, REF_FIXED_S = 0.140, 1.72
TOOL_GAP_S = 0.05  # a pause between steps longer than this is an idle (tool) sub-stage
_CHUNK_S = 0.25  # the driver submits follow-up turns at this resolution


@dataclass(frozen=True)
class RolloutTrace:
    """What one replica's rollout did: its steps, sub-stages, length, tokens and long tail."""

    records: tuple[StepRecord, ...]
    segments: tuple[Segment, ...]
    end_s: float
    tokens: int  # prompt and response tokens of its samples (the throughput numerator)
    flops: float  # model FLOPs of its prefill and decode
    tail_seqs: int  # samples still decoding when its last sub-stage began
    tail_ctx_tokens: float  # their context then (what a migration recomputes)
    tail_start_s: float
    peak_seqs: int = 0  # the most samples it had in the engine at once
    peak_kv_tokens: float = 0.0  # an upper bound on the KV it held at once (their contexts at the end of their turns)
    finish_s: tuple[tuple[float, float], ...] = ()  # (finish time, final context) of every sample, by finish time

    def done_at_s(self, fraction: float) -> float:
        """When ``fraction`` of its samples had finished (0 with none)."""
        if not self.finish_s:
            return 0.0
        return self.finish_s[max(0, math.ceil(fraction * len(self.finish_s)) - 1)][0]

    @property
    def at80_s(self) -> float:
        """When 80% of its samples had finished (RollMux's default tail threshold)."""
        return self.done_at_s(0.8)


def perf_model(spec: PipelineSpec, gpu: str) -> PerfModel:
    """The performance model of ``spec``'s model on ``gpu`` (cached)."""
    return _perf_cached(spec.model, gpu)


@lru_cache(maxsize=None)
def _perf_cached(model: str, gpu: str) -> PerfModel:
    return PerfModel(load_model(model), load_gpu(gpu))


def simulate_replica(spec: PipelineSpec, samples: Sequence[Sample], gpu: str) -> RolloutTrace:
    """Run ``samples`` on one DP worker (TP ``spec.tp`` on ``gpu``) and return its trace."""
    perf = perf_model(spec, gpu)
    cfg = InstanceConfig("tp", tp=spec.tp)
    eng = SimEngine(perf, homogeneous(cfg, spec.tp), {})
    eng.step_log = []
    task = TASKS[spec.task]
    ctx = {s.sample_id: s.prompt_tokens for s in samples}
    turn = {s.sample_id: 0 for s in samples}
    by_id = {s.sample_id: s for s in samples}
    pending: list[tuple[float, str]] = [(0.0, s.sample_id) for s in samples]  # (submit at, sample)
    heapq.heapify(pending)
    finish: dict[str, float] = {}
    blocked: list[tuple[str, float]] = []  # (sample, its tool latency) waiting for the batch (blocked tools)
    active = len(samples)
    decoded = prefilled = 0
    inflight: dict[str, float] = {}  # sample -> its context at the end of the turn it is decoding
    peak = [0, 0.0]

    def submit(sid: str) -> None:
        nonlocal prefilled
        s = by_id[sid]
        d = s.turns[turn[sid]][0]
        rid = f"{sid}#{turn[sid]}"
        eng.lengths[rid] = d
        inflight[sid] = ctx[sid] + d
        peak[0] = max(peak[0], len(inflight))
        peak[1] = max(peak[1], sum(inflight.values()))
        prefilled += ctx[sid] if turn[sid] == 0 else s.turns[turn[sid] - 1][1]
        eng.add_requests([GenerationRequest(rid, ctx[sid], d, spec.name)])

    guard = 0
    while pending or not eng.idle() or blocked:
        guard += 1
        if guard > 10_000_000:
            raise RuntimeError("rollout driver does not terminate")  # a bug, never an input
        now = eng.now_s()
        while pending and pending[0][0] <= now + 1e-12:
            submit(heapq.heappop(pending)[1])
        if eng.idle() and not pending and blocked:  # the batch's blocked tool calls
            wait = max(t for _, t in blocked)
            for sid, _ in blocked:
                heapq.heappush(pending, (now + wait, sid))
            blocked = []
            continue
        horizon = min(pending[0][0], now + _CHUNK_S) if pending else now + _CHUNK_S
        if eng.idle() and pending:
            horizon = pending[0][0]
        for f in eng.advance(max(1e-9, horizon - now)):
            sid, t = f.request_id.rsplit("#", 1)
            s = by_id[sid]
            d, obs, tool = s.turns[int(t)]
            decoded += d
            ctx[sid] += d + obs
            inflight.pop(sid, None)
            if int(t) + 1 < len(s.turns):
                turn[sid] = int(t) + 1
                if task.blocked_tools:
                    blocked.append((sid, tool))
                else:
                    heapq.heappush(pending, (f.finish_time_s + tool, sid))
            else:
                finish[sid] = f.finish_time_s
                active -= 1
    records = tuple(eng.step_log)
    tracker = SubStageTracker(idle_gap_s=TOOL_GAP_S)
    for r in records:
        tracker.observe(r)
    segs = tuple(tracker.close())
    end = max(finish.values(), default=0.0)
    tail = next((sg for sg in reversed(segs) if sg.kind != IDLE), None)
    tail_start = tail.start_s if tail is not None else end
    after = steps_after(records, tail_start)
    tail_ids = [sid for sid, f in finish.items() if f > tail_start + 1e-12]
    tail_ctx = 0.0
    for sid in tail_ids:
        remaining = after(finish[sid])
        tail_ctx += max(by_id[sid].prompt_tokens, ctx[sid] - remaining)
    tokens = sum(s.prompt_tokens + s.response_tokens for s in samples)
    flops = 2.0 * perf.model.active_params * (decoded + prefilled)
    fin = tuple(sorted((f, float(ctx[sid])) for sid, f in finish.items()))
    return RolloutTrace(records, segs, end, tokens, flops, len(tail_ids), tail_ctx, tail_start, peak[0], peak[1], fin)


def steps_after(records: Sequence[StepRecord], start_s: float):
    """A function ``t -> decode steps between start_s and t`` over the records (for the tail's context)."""
    marks = []
    acc = 0
    for r in records:
        if r.start_s >= start_s - 1e-12:
            acc += r.steps
            marks.append((r.start_s + r.duration_s, acc))

    def f(t: float) -> int:
        n = 0
        for end, a in marks:
            if end <= t + 1e-9:
                n = a
            else:
                break
        return n
    return f


def post_times(spec: PipelineSpec, tokens: float, gpu: str, gpus: int | None = None,
               fitted: tuple[float, float, float, float] | None = None) -> tuple[float, float]:
    """Return (reference s, training s) for ``tokens`` on ``gpus`` GPUs (default: one worker's TP).

    ``fitted`` = (train MFU, train fixed s, reference MFU, reference fixed s); default the module's fit.
    The MFUs are low because they are veRL's (FSDP, small micro-batches, padding) on small models.
    """
    mt, ft, mr, fr = _check_fit(fitted) if fitted is not None else (MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S)
    perf = perf_model(spec, gpu)
    n = perf.model.active_params
    g = gpus or spec.tp
    peak = perf.gpu.bf16_flops
    return fr + 2.0 * n * tokens / (g * peak * mr), ft + 6.0 * n * tokens / (g * peak * mt)


def _check_fit(fitted) -> tuple[float, float, float, float]:
    ok = isinstance(fitted, (tuple, list)) and len(fitted) == 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in fitted)
    if not ok or not (0 < fitted[0] <= 1 and 0 < fitted[2] <= 1 and fitted[1] >= 0 and fitted[3] >= 0):
        raise ConfigError("post model", "fitted", f"{fitted!r}",
                          "(train MFU in (0, 1], train fixed s >= 0, reference MFU in (0, 1], reference fixed s >= 0), "
                          "e.g. (0.237, 2.24, 0.14, 1.72)")
    return tuple(float(v) for v in fitted)  # type: ignore[return-value]


def post_model(fitted: tuple[float, float, float, float]) -> ContextManager[None]:
    """Simulate steps under another post model inside the ``with`` (a what-if, e.g. a refit to other data).

    ``fitted`` = (train MFU, train fixed s, reference MFU, reference fixed s), checked here (a bad one raises
    :class:`ConfigError` before the ``with``). Steps simulated inside keep the fixed parts they were simulated
    with (:attr:`~sim.multiplex.runner.PipelineSteps.post_fixed_s`). It swaps this module's constants, so it is
    process-local and not thread-safe: worker processes (``sim.sweep``, Ray) do not see it, and RollMux's
    baseline recomputes training times from the model active when it runs. Simulate and evaluate inside one
    ``with``, in one process (as ``bench/jigsaw.py --post-fit`` does).
    """
    return _post_model(_check_fit(fitted))


@contextmanager
def _post_model(new: tuple[float, float, float, float]) -> Iterator[None]:
    global MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S
    saved = (MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S)
    MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S = new
    try:
        yield
    finally:
        MFU_TRAIN, TRAIN_FIXED_S, MFU_REF, REF_FIXED_S = saved


def veRL_shares(spec: PipelineSpec, gpu: str, gpus: int, step: int = 0,
                fitted: tuple[float, float, float, float] | None = None) -> tuple[tuple[float, ...], float, float]:
    """Return ((rollout, reference, training) shares, rollout s, tokens per GPU) of veRL on ``gpus`` GPUs.

    The rollout share includes tool time (Table 1 lists it apart); ``fitted`` as for :func:`post_times`.
    """
    from orchestrl.sim.multiplex.workload import draw_samples, per_replica
    reps = per_replica(draw_samples(spec, step), max(1, gpus // spec.tp))
    trs = [simulate_replica(spec, r, gpu) for r in reps]
    roll = max(t.end_s for t in trs)
    tok = sum(t.tokens for t in trs) / len(trs)
    ref, train = post_times(spec, tok, gpu, fitted=fitted)
    tot = roll + ref + train
    return (roll / tot, ref / tot, train / tot), roll, tok


def fit_post_model(rows, gpu: str = "H100", mfus: tuple[float, float] | None = None) -> tuple[float, float, float, float]:
    """Fit (train MFU, train fixed s, reference MFU, reference fixed s) to Table 1 rows next to simulated rollouts.

    Each row's shares give the training and reference times relative to the simulated rollout; two rows
    determine the two affine models exactly. With ``mfus`` = (train MFU, reference MFU) given (e.g. from
    measurements elsewhere) only the fixed parts are fitted, by least squares over ``rows``.
    """
    import numpy as np
    from orchestrl.sim.multiplex.workload import TABLE1
    if mfus is not None and (not isinstance(mfus, (tuple, list)) or len(mfus) != 2 or not all(
            isinstance(m, (int, float)) and not isinstance(m, bool) and 0 < m <= 1 for m in mfus)):
        raise ConfigError("post model", "mfus", f"{mfus!r}", "(train MFU, reference MFU), each in (0, 1], e.g. (0.38, 0.40)")
    a, bt, br = [], [], []
    for model, task, g in rows:
        spec = PipelineSpec("fit", model, task)
        _, roll, tok = veRL_shares(spec, gpu, g)
        sh = TABLE1[(model, task, g)]
        n = perf_model(spec, gpu).model.active_params
        a.append([1.0, 2.0 * n * tok / perf_model(spec, gpu).gpu.bf16_flops])
        bt.append(roll * sh[2] / (sh[0] + sh[3]) / 3.0)
        br.append(roll * sh[1] / (sh[0] + sh[3]))
    a, bt, br = np.array(a), np.array(bt), np.array(br)
    if mfus is not None:  # fixed part = mean of (time - FLOPs at the given MFU) over the rows
        mt, mr = mfus
        fit = float(mt), float(3 * np.mean(bt - a[:, 1] / mt)), float(mr), float(np.mean(br - a[:, 1] / mr))
    else:
        xt, xr = np.linalg.solve(a, bt), np.linalg.solve(a, br)
        fit = (float(1 / xt[1]), float(3 * xt[0]), float(1 / xr[1]), float(xr[0]))
    try:
        return _check_fit(fit)
    except ConfigError:  # given MFUs too low for the rows (negative fixed parts), or rows implying an MFU above 1
        raise ConfigError("post model", "rows" if mfus is None else "mfus", f"{list(rows)!r} fit to {fit!r}",
                          "higher MFUs (the rows' stages are shorter than their FLOPs at these)" if mfus is not None
                          else "rows whose shares give an MFU in (0, 1] and fixed parts >= 0 (Table 1's GSM8K rows do)") from None
