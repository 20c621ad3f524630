"""A clairvoyant schedule of one generation step: every output length known, free to place and switch.

Design note
-----------
No scheduler knows output lengths, so the best schedule that does is the yardstick for how much of
the room above a static layout a policy captures: ``(veRL-TO - policy) / (veRL-TO - clairvoyant)``.
It is *not* a bound (:mod:`compute_sched.bounds` gives one): it is the best of a family of
schedules, each run on the same simulated engine as the policies (same step times, KV limits,
switching and recompute costs), so a policy can beat it with a schedule outside the family.

The family, all with true lengths:

* **static**: every homogeneous TP layout and every two-type mix at node-granular splits, requests
  placed longest-first on the instance with the least work per GPU (ties: the larger instance, so
  the longest requests sit where a token is cheapest);
* **two-phase**: a static start (homogeneous or mixed) switched at time ``T`` to a homogeneous layout of
  larger instances, the pending requests re-placed the same way by their true remaining length, ``T``
  swept over fractions of the start's own makespan;
* **planner**: Algorithm 1 with every remaining length exact instead of forecast (the former
  "oracle", now ``planner-exact`` in :mod:`compute_sched.replay`).

The result names the winning schedule so that a reader can rerun it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.layout import Instance, InstanceConfig, Layout, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import Trace
from orchestrl.fabric.errors import ConfigError

__all__ = ["ClairvoyantResult", "clairvoyant_schedule", "place_by_true_length", "mixed_layout"]


@dataclass(frozen=True)
class ClairvoyantResult:
    """The best schedule found and how many were tried."""

    makespan_s: float
    schedule: str  # e.g. "tp2x4+tp8x1 static" or "tp2 -> tp8 at 212 s"
    tried: int
    by_family: dict[str, float]  # best makespan of each family ("static", "two-phase", "planner")


def mixed_layout(small: InstanceConfig, large: InstanceConfig, large_gpus: int, gpus: int) -> Layout:
    """Return ``large_gpus`` GPUs of ``large`` instances (lowest GPU ids first) and the rest as ``small``.

    >>> mixed_layout(InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8), 8, 16).describe()
    '1x tp8 + 4x tp2'
    """
    if large_gpus % large.gpus or (gpus - large_gpus) % small.gpus:
        raise ConfigError("mixed_layout", "large_gpus", f"{large_gpus} of {gpus} GPUs do not split into "
                          f"{large.name} and {small.name} instances", "multiples of each instance size")
    out = [Instance(large, tuple(range(s, s + large.gpus))) for s in range(0, large_gpus, large.gpus)]
    out += [Instance(small, tuple(range(s, s + small.gpus))) for s in range(large_gpus, gpus, small.gpus)]
    return Layout(tuple(out), gpus)


def place_by_true_length(layout: Layout, remaining: dict[str, int]) -> dict[str, int]:
    """Return request -> instance: longest first onto the instance with the least tokens per GPU.

    Ties go to the instance with more GPUs, so the longest requests land where one token is
    cheapest. O(R log R + R log K).

    >>> lay = mixed_layout(InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8), 8, 16)
    >>> p = place_by_true_length(lay, {"long": 9000, "a": 100, "b": 100})
    >>> p["long"], lay.instances[p["long"]].config.name
    (0, 'tp8')
    """
    heap = [(0.0, -inst.config.gpus, k) for k, inst in enumerate(layout.instances)]
    heapq.heapify(heap)
    out: dict[str, int] = {}
    for rid in sorted(remaining, key=lambda r: (-remaining[r], r)):
        load, neg_gpus, k = heapq.heappop(heap)
        out[rid] = k
        heapq.heappush(heap, (load + remaining[rid] / -neg_gpus, neg_gpus, k))
    return out


def _engine(perf: PerfModel, layout: Layout, trace: Trace, max_num_seqs: int | None) -> SimEngine:
    lengths = {q.request_id: q.output_tokens for q in trace.requests}
    engine = SimEngine(perf, layout, lengths, max_num_seqs=max_num_seqs)
    reqs = {q.request_id: GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id,
                                            generated_tokens=q.generated_tokens) for q in trace.requests}
    placement = place_by_true_length(layout, {q.request_id: q.output_tokens - q.generated_tokens
                                              for q in trace.requests})
    for k in range(len(layout.instances)):
        engine.add_requests([reqs[r] for r, i in placement.items() if i == k], k)
    return engine


def _run(perf: PerfModel, trace: Trace, start: Layout, max_num_seqs: int | None,
         switch: tuple[Layout, float] | None = None, tick_s: float = 2.0) -> float:
    engine = _engine(perf, start, trace, max_num_seqs)
    lengths = {q.request_id: q.output_tokens for q in trace.requests}
    while not engine.idle():
        if switch is not None and engine.now_s() >= switch[1]:
            pending = engine.snapshot().pending
            remaining = {r.request_id: max(1, min(lengths[r.request_id], r.max_tokens) - r.generated_tokens)
                         for r in pending}
            engine.change_layout(switch[0], place_by_true_length(switch[0], remaining))
            switch = None
        engine.advance(tick_s)
    return engine.now_s()


def clairvoyant_schedule(trace: Trace, perf: PerfModel, gpus: int, *, tps: Sequence[int] = (1, 2, 4, 8),
                         max_num_seqs: int | None = None, switch_fractions: Sequence[float] = (0.3, 0.45, 0.6, 0.75),
                         planner: Callable[[], float] | None = None) -> ClairvoyantResult:
    """Return the best clairvoyant schedule of ``trace`` on ``gpus`` GPUs found in the family above.

    Parameters
    ----------
    tps : sequence of int
        TP degrees the schedules may use (those that do not hold the model are skipped).
    switch_fractions : sequence of float
        Switch times of the two-phase family, as fractions of the start layout's static makespan.
    planner : callable, optional
        Returns the makespan of Algorithm 1 with exact lengths (the caller runs it, so this module
        does not depend on the scheduler); left out when None.

    Notes
    -----
    One simulation per static layout, ``len(switch_fractions)`` per (start, larger TP) pair; about
    40-60 simulations of the step for four TP degrees.
    """
    cfgs = [InstanceConfig("tp", tp=t) for t in sorted(tps)
            if t <= gpus and gpus % t == 0 and perf.fits(InstanceConfig("tp", tp=t))]
    if not cfgs:
        raise ConfigError("clairvoyant_schedule", "tps", f"no TP degree of {tuple(tps)} holds {perf.model.name} "
                          f"on {gpus} GPUs", "a degree that divides the GPUs and fits the model")
    node = perf.gpu.gpus_per_node
    starts: list[tuple[str, Layout]] = [(c.name, homogeneous(c, gpus)) for c in cfgs]
    for i, small in enumerate(cfgs):
        for large in cfgs[i + 1:]:
            unit = max(large.gpus, node)
            for large_gpus in range(unit, gpus, unit):
                if (gpus - large_gpus) % small.gpus == 0:
                    lay = mixed_layout(small, large, large_gpus, gpus)
                    starts.append((lay.describe(), lay))
    results: dict[str, float] = {}
    static = {}
    for name, lay in starts:
        static[name] = _run(perf, trace, lay, max_num_seqs)
        results[f"{name} static"] = static[name]
    for name, lay in starts:
        smallest = min(i.config.gpus for i in lay.instances)
        for target in (c for c in cfgs if c.gpus > smallest):
            end = homogeneous(target, gpus)
            for f in switch_fractions:
                t = f * static[name]
                results[f"{name} -> {target.name} at {t:.0f} s"] = _run(perf, trace, lay, max_num_seqs, (end, t))
    if planner is not None:
        results["Algorithm 1 with exact lengths"] = planner()
    best = min(results, key=results.__getitem__)
    fam = {"static": min(v for k, v in results.items() if k.endswith("static")),
           "two-phase": min((v for k, v in results.items() if " -> " in k), default=float("inf"))}
    if planner is not None:
        fam["planner"] = results["Algorithm 1 with exact lengths"]
    return ClairvoyantResult(results[best], best, len(results), fam)
