"""JigsawRL's two graph operations (§4.2, §4.3): multiplex a pair, merge long tails, and balance around them.

* :func:`corun` -- two sub-stages on one worker under an SM split: how long until the first ends and
  how much work the other has left (each progresses at ``1 / s`` of its alone rate).
* :func:`merge_gain` -- §4.3's ``Delta T = T_origin - T_migr`` for moving the long-tail samples of
  several DP workers onto one target, with the migration cost ``M`` from
  :func:`migration_cost_s`: recompute FLOPs at the prefill MFU, or a KV transfer where the engine
  declares one (:class:`~compute_sched.engine.EngineCapabilities`).
* :func:`balanced_shares` -- §4.3's multiplexing-aware balancing: the worker that carries a
  co-located sub-stage (slowdown ``s``) gets the work ``bs_t`` with ``T(bs_t) / T(bs_i) = 1 / s``;
  :func:`overlap_balanced_shares` generalises it to co-runners that end at different times, and
  :func:`co_runner_overlap` says how a share runs beside one (shared, or after it where sharing loses).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

from orchestrl.compute_sched.engine import EngineCapabilities
from orchestrl.compute_sched.hardware import ModelSpec
from orchestrl.fabric.errors import ConfigError

__all__ = ["corun", "Tail", "MergeDecision", "migration_cost_s", "merge_gain", "balanced_shares",
           "overlap_balanced_shares", "co_runner_overlap"]


def corun(work_a: float, work_b: float, s_a: float, s_b: float) -> tuple[float, float, float]:
    """Run ``a`` and ``b`` together until the first ends; return ``(elapsed, a's work left, b's work left)``.

    Work is in alone-seconds; a sub-stage with slowdown ``s`` does ``1/s`` of it per second.

    >>> [round(x, 3) for x in corun(1.0, 3.0, 2.0, 1.5)]  # a ends after 2 s; b did 2/1.5 of its 3 s
    [2.0, 0.0, 1.667]
    """
    for fld, v, lo in (("work_a", work_a, 0.0), ("work_b", work_b, 0.0), ("s_a", s_a, None), ("s_b", s_b, None)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or \
                (v < lo if lo is not None else v <= 0):
            raise ConfigError("corun", fld, f"{v!r}", "alone-seconds >= 0" if lo is not None else "a slowdown > 0")
    t = min(work_a * s_a, work_b * s_b)
    return t, max(0.0, work_a - t / s_a), max(0.0, work_b - t / s_b)


@dataclass(frozen=True)
class Tail:
    """One DP worker's low-utilisation rollout sub-stage and what runs next to it."""

    replica: int
    work_s: float  # the tail's alone time on this worker, ``T(k_i)``
    context_tokens: float  # tokens of context its samples hold (what a migration recomputes or ships)
    sequences: int  # samples still decoding
    corunner: str | None  # kind next to it (None: nothing)
    corunner_work_s: float = 0.0  # the co-runner's remaining alone time, ``T(k'_i)``
    s_tail: float = 1.0  # s(k_i, k'_i) under the current split
    s_corunner: float = 1.0  # s(k'_i, k_i)


@dataclass(frozen=True)
class MergeDecision:
    target: int  # replica that receives the tails
    t_origin_s: float
    t_migr_s: float
    migration_s: float  # sum of M(k_i) over the moved tails

    @property
    def delta_s(self) -> float:
        """§4.3's ``Delta T``: merge when it is positive."""
        return self.t_origin_s - self.t_migr_s


def migration_cost_s(model: ModelSpec, context_tokens: float, gpus: int, peak_flops: float, *,
                     prefill_mfu: float = 0.45, capabilities: EngineCapabilities | None = None,
                     link_bytes_per_s: float = 0.0) -> float:
    """Seconds to rebuild ``context_tokens`` of KV on the target: recomputation at ``prefill_mfu``, or the
    KV transfer over ``link_bytes_per_s`` where ``capabilities.kv_transfer`` says the engine can ship it.

    >>> from orchestrl.compute_sched.hardware import load_model
    >>> round(migration_cost_s(load_model("Qwen3-4B"), 8000, 1, 989e12), 4)  # 2 N FLOPs a token
    0.1438
    """
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, numbers.Real) or \
            not math.isfinite(context_tokens) or context_tokens < 0:
        raise ConfigError("migration", "context_tokens", f"{context_tokens!r}", "tokens of context >= 0")
    if capabilities is not None and capabilities.kv_transfer and link_bytes_per_s > 0:
        return context_tokens * model.kv_bytes_per_token / link_bytes_per_s
    if not 0 < prefill_mfu <= 1:
        raise ConfigError("migration", "prefill_mfu", f"{prefill_mfu}", "a fraction in (0, 1]")
    if isinstance(gpus, bool) or not isinstance(gpus, numbers.Integral) or gpus < 1:
        raise ConfigError("migration", "gpus", f"{gpus!r}", "the target's GPUs, an integer >= 1")
    if not (isinstance(peak_flops, numbers.Real) and math.isfinite(peak_flops) and peak_flops > 0):
        raise ConfigError("migration", "peak_flops", f"{peak_flops!r}", "the GPU's peak FLOP/s, > 0 (989e12 on an H100)")
    return 2.0 * model.params_total * context_tokens / (gpus * peak_flops * prefill_mfu)


def merge_gain(tails: Sequence[Tail], target: int, aggregated_s: float, migration: Callable[[Tail], float],
               s_after: Callable[[str, str], float] = lambda k, x: 1.0) -> MergeDecision:
    """§4.3: ``T_origin`` (every tail stays, each next to its co-runner) against ``T_migr`` (tails moved to
    ``target``, whose aggregated tail ``X`` takes ``aggregated_s`` alone).

    ``T_origin = max_i s(k_i,k'_i) T(k_i) + max_i s(k'_i,k_i) T(k'_i)``;
    ``T_migr = T(X) + sum_{i != t} M(k_i) + max(s(k'_t, X) T(k'_t), max_{i != t} T(k'_i))``
    (``s_after(corunner kind, "decode_small")`` gives ``s(k'_t, X)``; the other workers' co-runners
    run alone once the tails have left).

    >>> ts = [Tail(0, 10.0, 4000, 2, "train", 10.0, 1.1, 1.3), Tail(1, 9.0, 4000, 2, "train", 10.0, 1.1, 1.3)]
    >>> d = merge_gain(ts, 0, aggregated_s=10.5, migration=lambda t: 0.2, s_after=lambda k, x: 1.3)
    >>> round(d.t_origin_s, 2), round(d.t_migr_s, 2), d.delta_s > 0
    (24.0, 23.7, True)
    """
    by = {t.replica: t for t in tails}
    if target not in by:
        raise ConfigError("merge", "target", f"replica {target} has no tail", f"one of {sorted(by)}")
    t_origin = max(t.s_tail * t.work_s for t in tails) + max(t.s_corunner * t.corunner_work_s for t in tails)
    moved = [t for t in tails if t.replica != target]
    m = sum(migration(t) for t in moved)
    tt = by[target]
    s_t = s_after(tt.corunner, "decode_small") if tt.corunner else 1.0
    t_migr = aggregated_s + m + max(s_t * tt.corunner_work_s, max((t.corunner_work_s for t in moved), default=0.0))
    return MergeDecision(target, t_origin, t_migr, m)


def balanced_shares(n: int, carrier: int, slowdown: float,
                    time_of: Callable[[float], float] | None = None) -> list[float]:
    """Shares of a pipeline's work over ``n`` DP workers when worker ``carrier`` runs it at ``slowdown``.

    ``time_of(share)`` is the exclusive time of a share (default: proportional, ``T(bs) ~ bs``); the
    shares solve ``slowdown * T(bs_t) = T(bs_i)`` for every other worker ``i`` (§4.3), by bisection on
    the common finish time.

    >>> [round(x, 3) for x in balanced_shares(4, 0, 1.5)]
    [0.182, 0.273, 0.273, 0.273]
    """
    if n < 1 or not 0 <= carrier < n or not slowdown >= 1.0:
        raise ConfigError("balance", "slowdown", f"n={n}, carrier={carrier}, slowdown={slowdown}",
                          "n >= 1, 0 <= carrier < n, slowdown >= 1")
    if n == 1:
        return [1.0]
    time_of = time_of or (lambda x: x)

    def inverse(target_s: float) -> float:  # largest share whose exclusive time is target_s
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if time_of(mid) <= target_s else (lo, mid)
        return lo

    lo, hi = 0.0, time_of(1.0) * slowdown
    for _ in range(60):  # the common finish time at which the shares add up to one
        mid = (lo + hi) / 2
        total = inverse(mid / slowdown) + (n - 1) * inverse(mid)
        lo, hi = (mid, hi) if total < 1.0 else (lo, mid)
    t = hi
    shares = [inverse(t) for _ in range(n)]
    shares[carrier] = inverse(t / slowdown)
    z = sum(shares)
    return [x / z for x in shares]


def overlap_balanced_shares(work_s: float, slowdowns: Sequence[float], overlap_s: Sequence[float],
                            fixed_s: Sequence[float] | None = None) -> list[float]:
    """Shares of ``work_s`` (exclusive seconds) over DP workers so that all finish together (§4.3, generalised).

    Worker ``i`` runs at ``slowdowns[i]`` for the first ``overlap_s[i]`` seconds (while the other
    pipeline's sub-stage it carries still runs there), alone after that; ``inf``: it waits those seconds
    (:func:`co_runner_overlap`: where sharing is slower than taking turns). With every overlap long
    enough this is the paper's ``T(bs_t)/T(bs_i) = 1/s``; a co-runner about to finish costs its worker
    almost nothing. ``fixed_s[i]`` (default 0) is work worker ``i`` does first whatever its share (a
    per-step fixed cost every member of the group pays); only ``work_s`` is divided, in proportion to
    what each worker gets done after its fixed part. Bisection on the common finish time, O(n) per
    iteration.

    >>> [round(x, 3) for x in overlap_balanced_shares(8.0, [1.5, 1.0, 1.0, 1.0], [100.0, 0, 0, 0])]
    [0.182, 0.273, 0.273, 0.273]
    >>> [round(x, 3) for x in overlap_balanced_shares(8.0, [1.5, 1.0], [0.3, 0])]
    [0.494, 0.506]
    >>> [round(x, 3) for x in overlap_balanced_shares(4.0, [2.0, 1.0], [100.0, 0], [1.0, 1.0])]
    [0.25, 0.75]
    >>> [round(x, 3) for x in overlap_balanced_shares(6.0, [math.inf, 1.0], [2.0, 0])]  # waits 2 s, then alone
    [0.333, 0.667]
    """
    n = len(slowdowns)
    fixed = [0.0] * n if fixed_s is None else list(fixed_s)
    if not 0 <= work_s < math.inf:
        raise ConfigError("balance", "work_s", f"{work_s!r}", "the work to divide, in exclusive seconds: finite, >= 0")
    checks = (("slowdowns", n >= 1 and all(1.0 <= x <= math.inf for x in slowdowns),
               "a slowdown >= 1 per worker (inf: it waits through its overlap)"),
              ("overlap_s", len(overlap_s) == n and all(o >= 0 for o in overlap_s)
               and any(s < math.inf or o < math.inf for s, o in zip(slowdowns, overlap_s)),
               "one overlap >= 0 (inf: throughout) per worker, some worker not waiting for ever"),
              ("fixed_s", len(fixed) == n and all(0 <= f < math.inf for f in fixed), "one finite fixed part >= 0 per worker"))
    for fld, ok, fix in checks:
        if not ok:
            raise ConfigError("balance", fld, f"slowdowns={list(slowdowns)}, overlap_s={list(overlap_s)}, "
                              f"fixed_s={fixed}", fix)
    if work_s == 0:
        return [1.0 / n] * n

    def done_by(t: float) -> list[float]:  # exclusive seconds of the divided work each worker finishes by time t
        return [max(0.0, (t / s if t <= o else o / s + (t - o)) - f) for s, o, f in zip(slowdowns, overlap_s, fixed)]

    # by ``hi`` every worker that ever progresses could have done all of it alone (a waiting one after its wait)
    waits = [o for s, o in zip(slowdowns, overlap_s) if s == math.inf and o < math.inf]
    lo = 0.0
    hi = (work_s + max(fixed) + max(waits, default=0.0)) * max([s for s in slowdowns if s < math.inf], default=1.0)
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(done_by(mid)) < work_s else (lo, mid)
    got = done_by(hi)
    total = sum(got)
    return [g / total for g in got]


def co_runner_overlap(s_self: float, s_other: float, left_s: float) -> tuple[float, float]:
    """How a share of work runs beside a co-runner that has ``left_s`` alone-seconds left on the worker, for
    :func:`overlap_balanced_shares`: ``(slowdown, overlap_s)``.

    Where the pair shares the GPU at least as well as taking turns (``1/s_self + 1/s_other >= 1``), both run at
    once: the share at ``s_self`` while the co-runner takes ``left_s * s_other`` to end. Where sharing is slower
    than taking turns -- or the pair does not fit in memory, whose slowdowns are the grid's cap (1000), not a
    speed -- the share waits (``inf``) while the co-runner finishes alone, ``left_s``. (Until 2026-11-29 the
    runner took the capped slowdowns as speeds: a worker beside a rollout that training cannot share memory with
    waited ``1000 * left_s`` in the balance's eyes and got none of the work, so the others got it all.)

    >>> co_runner_overlap(1.4, 1.6, 10.0)
    (1.4, 16.0)
    >>> co_runner_overlap(1000.0, 1000.0, 10.0)  # does not fit beside it: wait 10 s, not 10,000
    (inf, 10.0)
    """
    for fld, v in (("s_self", s_self), ("s_other", s_other)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 1.0 <= v < math.inf:
            raise ConfigError("balance", fld, f"{v!r}", "a finite slowdown >= 1 (the grid's, at the split used)")
    if isinstance(left_s, bool) or not isinstance(left_s, numbers.Real) or not 0 <= left_s < math.inf:
        raise ConfigError("balance", "left_s", f"{left_s!r}", "the co-runner's alone-seconds left: finite, >= 0")
    if 1.0 / s_self + 1.0 / s_other < 1.0:
        return math.inf, float(left_s)
    return float(s_self), float(left_s) * s_other
