"""A provable lower bound on the makespan of any schedule of one generation step.

Design note
-----------
Whatever a scheduler does (layouts, switches, placement, migration), two things cannot be beaten
under the performance model (:class:`compute_sched.perf.PerfModel`):

* **the longest request alone.** A request decodes one token per engine step, and an engine step
  with a batch of one costs at least ``decode_step_s(c, 1, context)`` on the fastest configuration
  ``c`` that can host the model; its prefill has to happen first. So request ``r`` needs at least
  ``min_c [prefill_s(c, prompt_r) + sum_t decode_step_s(c, 1, prompt_r + t)]`` seconds, and the
  step at least the largest of these over its requests;
* **the batch's throughput.** A decode step of ``B`` requests holding ``C`` context tokens costs
  ``f_B(C) = decode_step_s(c, B, C)``, which is convex in ``C`` (the KV read and attention FLOPs
  are a maximum of linear terms, and the host/GPU overlap ``g + h - o min(g, h)`` only steepens
  once the GPU side passes the host side). Every request holds at least ``c_min`` tokens, so
  ``C >= B c_min`` and, by convexity, ``f_B(C) >= f_B(B c_min) + s_B (C - B c_min)`` for any slope
  ``s_B`` not above the right derivative at ``B c_min`` (a backward difference is one). Spread over
  the step's ``B`` tokens, a token decoded at context ``x`` costs the instance at least
  ``alpha_B + s_B x`` seconds, hence at least ``alpha* + s* x`` with the minima over ``B`` (up to the
  batch limit and the KV cache). In GPU-seconds (times the instance's GPUs), minimised over
  configurations, summed over every token of the step and divided by the cluster's GPUs, that is
  a floor on the makespan of any layout, mixed or switched.

Both use only that a step never gets cheaper when the batch or its context grows (bytes, FLOPs,
collectives and host time are non-decreasing in both), its convexity in the context, and that
contexts only grow during a step. Reconfiguration, migration, queueing and imbalance are ignored, so the bound is
loose where those dominate; it is a floor, not an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.fabric.errors import ConfigError

__all__ = ["LowerBound", "makespan_lower_bound", "solo_decode_s"]

_CHUNK_TOKENS = 256  # the left Riemann sum of a non-decreasing step time over chunks of this many tokens


@dataclass(frozen=True)
class LowerBound:
    """The step's makespan lower bound and its two parts (seconds)."""

    seconds: float  # max of the two below
    longest_request_s: float  # the slowest request alone on its fastest configuration
    throughput_s: float  # all decode tokens at the best per-GPU throughput of any configuration
    longest_request_config: str  # where the longest request is fastest
    throughput_config: str  # the configurations whose per-token costs the throughput floor uses


def solo_decode_s(perf: PerfModel, cfg: InstanceConfig, prompt_tokens: int, output_tokens: int,
                  generated_tokens: int = 0) -> float:
    """Return a lower bound on the seconds one request needs alone on one ``cfg`` instance.

    Prefill of the prompt (and of tokens generated earlier) plus every decode step at batch 1,
    each priced at the context it starts its 256-token chunk with (the step time does not fall
    as the context grows, so the chunked sum is a lower bound on the token-by-token one).

    Notes
    -----
    O(output_tokens / 256).

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> tp2, tp8 = InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8)
    >>> solo_decode_s(pm, tp8, 400, 10_000) < solo_decode_s(pm, tp2, 400, 10_000)
    True
    """
    remaining = max(0, output_tokens - generated_tokens)
    start = prompt_tokens + generated_tokens
    total = perf.prefill_s(cfg, start)
    for offset in range(0, remaining, _CHUNK_TOKENS):
        n = min(_CHUNK_TOKENS, remaining - offset)
        total += n * perf.decode_step_s(cfg, 1, start + offset)
    return total


def _token_cost(perf: PerfModel, cfg: InstanceConfig, min_context: int, max_batch: int) -> tuple[float, float]:
    """``(alpha*, s*)`` in GPU-seconds: a token decoded at context ``x`` on ``cfg`` costs at least ``alpha* + s* x``.

    See the module note; ``inf`` when no request of ``min_context`` tokens fits the KV cache.
    """
    cap = perf.kv_capacity_tokens(cfg)
    limit = min(max_batch, cap // max(1, min_context))
    if limit < 1:
        return float("inf"), float("inf")
    alphas, slopes = [], []
    h = 64.0  # tokens: the backward difference's width (any width gives a slope not above the derivative)
    for b in range(1, limit + 1):
        c0 = float(b * min_context)
        f0 = perf.decode_step_s(cfg, float(b), c0)
        slope = max(0.0, (f0 - perf.decode_step_s(cfg, float(b), max(0.0, c0 - h))) / h)
        alphas.append(f0 / b - slope * min_context)
        slopes.append(slope)
    return min(alphas) * cfg.gpus, min(slopes) * cfg.gpus


def makespan_lower_bound(perf: PerfModel, gpus: int, requests: Iterable[tuple[int, int, int]],
                         configs: Sequence[InstanceConfig], *, max_num_seqs: int | None = None) -> LowerBound:
    """Return a lower bound on the makespan of any schedule of ``requests`` on ``gpus`` GPUs.

    Parameters
    ----------
    perf : PerfModel
    gpus : int
        GPUs of the generation cluster.
    requests : iterable of (prompt_tokens, output_tokens, generated_tokens)
        Every request of the step with its true output length (a bound may know it).
    configs : sequence of InstanceConfig
        The configurations a scheduler may use; those that do not hold the model or do not fit
        ``gpus`` are skipped.
    max_num_seqs : int, optional
        Batch limit per instance (default: the calibration's).

    Raises
    ------
    ConfigError
        When no configuration can host the model on ``gpus`` GPUs, or there are no requests.

    Notes
    -----
    O(R L / 256 + |configs| * max_num_seqs) for R requests of at most L tokens.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> cfgs = [InstanceConfig("tp", tp=t) for t in (1, 2, 4, 8)]
    >>> lb = makespan_lower_bound(pm, 8, [(400, 15_000, 0)] + [(400, 1_000, 0)] * 511, cfgs)
    >>> lb.seconds == max(lb.longest_request_s, lb.throughput_s) and lb.longest_request_config
    'tp8'
    """
    usable = [c for c in configs if c.gpus <= gpus and gpus % c.gpus == 0 and perf.fits(c)]
    if not usable:
        raise ConfigError("makespan_lower_bound", "configs", f"none holds {perf.model.name} on {gpus} GPUs",
                          "a configuration that fits the cluster and the model")
    reqs = [(int(p), int(o), int(g)) for p, o, g in requests]
    if not reqs:
        raise ConfigError("makespan_lower_bound", "requests", "no requests", "one or more requests")
    limit = max_num_seqs if max_num_seqs is not None else perf.cal.max_num_seqs
    # The longest request alone: the 64 with most tokens left decide it in practice; a maximum over
    # a subset of requests is still a lower bound, so skipping the rest never makes it invalid.
    longest, longest_cfg = 0.0, usable[0]
    for p, o, g in sorted(set(reqs), key=lambda r: -(r[1] - r[2]))[:64]:
        times = {c: solo_decode_s(perf, c, p, o, g) for c in usable}
        c = min(times, key=times.__getitem__)
        if times[c] > longest:
            longest, longest_cfg = times[c], c
    tokens = float(sum(o - g for _, o, g in reqs))
    # sum over every decode token of the context it is decoded at: sum_t (start + t), t < L
    context_sum = float(sum((o - g) * (p + g) + (o - g) * (o - g - 1) / 2.0 for p, o, g in reqs))
    min_ctx = min(p + g for p, _, g in reqs)
    costs = {c: _token_cost(perf, c, min_ctx, limit) for c in usable}
    by_alpha = min(costs, key=lambda c: costs[c][0])
    by_slope = min(costs, key=lambda c: costs[c][1])
    throughput = (tokens * max(0.0, costs[by_alpha][0]) + context_sum * costs[by_slope][1]) / gpus
    return LowerBound(max(longest, throughput), longest, throughput, longest_cfg.name,
                      f"per token {by_alpha.name}, per context token {by_slope.name}")
