"""Reactive balancer (OrchestrRL Algorithm 1 event 2, Eq. 5): migrate requests off congested workers.

``LoadIndex_w = (|Q_run| + |Q_wait|) / B_cap(M_free) * 1 / R_w`` ranks workers by congestion:
queue depth relative to the concurrency the KV allocator (and the batch limit) can admit, over the
decode rate. When the spread ``max - min`` exceeds ``theta``, waiting requests, then running ones,
move short-context-first from the most to the least congested worker, but only if the destination
can hold the request without shrinking its stable batch: the batch limit still has a slot for it and
its free KV after the move still covers one growth reserve per sequence. Loads are updated after
each move; the procedure stops when the spread is within ``theta`` or no move is feasible.

Design note: ``R_w`` is read per sequence (tokens/s one request gets, 1/TPOT). Read as the
worker's aggregate throughput, it grows with the batch exactly as the queue depth does, so with an
empty waiting queue the index reduces to ``1 / (B_cap * per-sequence rate)`` and no longer sees how
many requests a worker holds: on a contiguous veRL split the straggler worker (most requests, most
KV, slowest steps) then never stood out and the balancer never fired (``rate_basis="aggregate"``
keeps that reading). Waiting requests move first (no KV to ship); running ones pay ``C^mig``
(transfer or recompute, the engine picks the cheaper), which short-context-first keeps small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from orchestrl.compute_sched.engine import ClusterSnapshot, Migration, WorkerState
from orchestrl.compute_sched.workload import RequestState
from orchestrl.fabric.errors import ConfigError

__all__ = ["BalancerConfig", "WorkerLoad", "load_index", "plan_migrations", "would_migrate"]


@dataclass(frozen=True)
class BalancerConfig:
    """Knobs of the reactive balancer."""

    theta: float | None = None  # absolute threshold on max - min LoadIndex; None: theta_relative * mean
    theta_relative: float = 0.5
    growth_reserve_tokens: int = 256  # KV each running sequence keeps free to grow (one histogram bin)
    max_moves: int = 256  # per tick
    move_running: bool = True  # also move running requests once the source's waiting queue is exhausted
    # (Sec. 4.2 only prioritises the waiting queue; the imbalance of a veRL split sits in running requests)
    rate_basis: str = "sequence"  # R_w of Eq. 5: "sequence" (per-request decode rate) or "aggregate"
    same_config_only: bool = True  # balance among instances of one configuration: the planner chose
    # deliberately which requests go to which configuration of a mixed layout
    moved_cooldown_s: float = 300.0  # a request placed (by the planner or a move) this recently stays
    # put, in practice once per step: with recompute-only migration (what vLLM offers) each move re-prefills the
    # whole context; without it a per-tick index read on noisy rates moved the same tail requests back and forth
    # up to 122 times in one step, and undid the planner's placement right after a switch


@dataclass
class _Load:
    worker: WorkerState
    running: int
    waiting: list[RequestState]
    running_reqs: list[RequestState]
    free_tokens: float
    # context tokens of running_reqs, kept with the list (integers, so the sum is exact): b_cap is read
    # for every worker on every move, and summing the list each time made a tick O(moves x requests)
    running_ctx: int = field(init=False)

    def __post_init__(self) -> None:
        self.running_ctx = sum(r.context_tokens for r in self.running_reqs)

    def b_cap(self, reserve: int) -> float:
        """Concurrency allowed: what runs now plus what the free KV can admit, within the batch limit."""
        per_seq = (self.running_ctx / len(self.running_reqs) if self.running_reqs else reserve) + reserve
        kv = self.running + self.free_tokens / per_seq
        limit = self.worker.max_batch
        return max(1.0, min(kv, limit) if limit is not None else kv)

    def batch_room(self) -> bool:
        """Whether one more request still runs in the current batch instead of queueing behind it."""
        limit = self.worker.max_batch
        return limit is None or self.running + len(self.waiting) < limit

    def index(self, reserve: int, fallback_rate: float, basis: str) -> float:
        """Eq. 5 on the current bookkeeping; ``fallback_rate`` stands in for a worker with no observed rate."""
        rate = _observed_rate(self.worker, basis) or fallback_rate
        return (self.running + len(self.waiting)) / self.b_cap(reserve) / max(rate, 1e-9)


@dataclass(frozen=True)
class WorkerLoad:
    """What Eq. 5 reads of one worker, without its requests (an engine reports it without a snapshot)."""

    config: object  # the instance configuration (workers are balanced among equal ones)
    running: int  # |Q_run|
    waiting: int  # |Q_wait|
    running_ctx: int  # context tokens of the running requests
    kv_free_tokens: float
    decode_rate_tps: float
    available: bool = True
    max_batch: int | None = None


def would_migrate(loads: list[WorkerLoad], cfg: BalancerConfig | None = None) -> bool:
    """Whether :func:`plan_migrations` could move anything: some group's LoadIndex spread exceeds theta.

    False means ``plan_migrations`` returns no move, whatever the requests are (its first check is this
    spread, computed here the same way from the counts), so an engine that reports ``WorkerLoad``
    spares the snapshot on such ticks -- most ticks: 353 of 383 in the 2,048-GPU benchmark.
    """
    cfg = cfg or BalancerConfig()
    basis = _rate_basis(cfg.rate_basis)
    groups: dict[object, list[WorkerLoad]] = {}
    for w in loads:
        if w.available:
            groups.setdefault(w.config if cfg.same_config_only else None, []).append(w)
    reserve = cfg.growth_reserve_tokens
    for ws in groups.values():
        if len(ws) < 2:
            continue
        rates = [_rate_of(w.decode_rate_tps, w.running, basis) for w in ws]
        seen = [r for r in rates if r > 0]
        fallback = 1.0 if not seen else (min(seen) if basis == "aggregate" else max(seen))
        idx = []
        for w, rate in zip(ws, rates):
            per_seq = (w.running_ctx / w.running if w.running else reserve) + reserve
            kv = w.running + w.kv_free_tokens / per_seq
            b_cap = max(1.0, min(kv, w.max_batch) if w.max_batch is not None else kv)
            idx.append((w.running + w.waiting) / b_cap / max(rate or fallback, 1e-9))
        hi, lo = max(range(len(idx)), key=idx.__getitem__), min(range(len(idx)), key=idx.__getitem__)
        theta = cfg.theta if cfg.theta is not None else cfg.theta_relative * (sum(idx) / len(idx))
        if not (idx[hi] - idx[lo] <= theta or hi == lo):
            return True
    return False


def _rate_of(decode_rate_tps: float, running: int, basis: str) -> float:
    """:func:`_observed_rate` from the counts."""
    if not decode_rate_tps > 0:
        return 0.0
    if basis == "aggregate":
        return decode_rate_tps
    return decode_rate_tps / running if running else 0.0


def _observed_rate(w: WorkerState, basis: str) -> float:
    """R_w of Eq. 5 as the snapshot observed it, or 0.0 when it observed none.

    Per sequence, the snapshot's running set produced the observed rate, not the bookkeeping's.
    """
    if not w.decode_rate_tps > 0:
        return 0.0
    if basis == "aggregate":
        return w.decode_rate_tps
    return w.decode_rate_tps / len(w.running) if w.running else 0.0


def _rate_basis(basis: str) -> str:
    if basis not in ("sequence", "aggregate"):
        raise ConfigError("BalancerConfig", "rate_basis", f"unknown rate basis {basis!r}", "'sequence' or 'aggregate'")
    return basis


def _fallback_rate(workers: list[WorkerState], basis: str) -> float:
    """Rate assumed for a worker with none observed: the best per-sequence / the worst aggregate one."""
    rates = [r for r in (_observed_rate(w, basis) for w in workers) if r > 0]
    if not rates:
        return 1.0
    return min(rates) if basis == "aggregate" else max(rates)  # an idle instance decodes a lone request fastest


def load_index(worker: WorkerState, growth_reserve_tokens: int = 256, fallback_rate_tps: float = 1.0,
               rate_basis: str = "sequence") -> float:
    """Return Eq. 5's LoadIndex of one worker (higher = more congested).

    >>> from orchestrl.compute_sched.layout import InstanceConfig
    >>> r = RequestState("a", 100, 50, 1000)
    >>> w = WorkerState(0, InstanceConfig(), (r,), (r,), 150, 10_000, 100.0)
    >>> round(load_index(w), 5)  # 2 requests / (1 running + 9850 free / 406 per seq) / (100 tok/s / 1 running)
    0.00079
    """
    ld = _Load(worker, len(worker.running), list(worker.waiting), list(worker.running), worker.kv_free_tokens)
    return ld.index(growth_reserve_tokens, fallback_rate_tps, _rate_basis(rate_basis))


def plan_migrations(snap: ClusterSnapshot, cfg: BalancerConfig | None = None,
                    last_moved_s: Mapping[str, float] | None = None) -> list[Migration]:
    """Return the migrations one monitoring tick should perform (possibly none).

    ``last_moved_s`` maps request ids to when they were last placed (by the planner or a move);
    requests placed within ``cfg.moved_cooldown_s`` of ``snap.time_s`` are not moved again,
    waiting ones included: a request the planner re-homes arrives in its new instance's waiting
    queue, and moving it on (free, as it holds no KV) undid the planner's placement -- on
    Qwen2.5-72B with 32 TP8 instances that made Algorithm 1 with both events 4% slower than the
    planner alone, and 9% in the next step.

    Notes
    -----
    O(M (W + Q log Q)) for M moves, W workers and Q requests on the source worker.
    """
    cfg = cfg or BalancerConfig()
    workers = [w for w in snap.workers if w.available]
    recent = _Recent(last_moved_s or {}, snap.time_s, cfg.moved_cooldown_s)
    if not cfg.same_config_only:
        return _balance(workers, cfg, recent)
    groups: dict[object, list[WorkerState]] = {}
    for w in workers:
        groups.setdefault(w.config, []).append(w)
    return [m for g in groups.values() for m in _balance(g, cfg, recent)]


class _Recent:
    """Requests placed within the cooldown, answered per request (building the set each tick cost O(moved))."""

    def __init__(self, last_moved_s: Mapping[str, float], now_s: float, cooldown_s: float) -> None:
        self.last, self.now, self.cooldown = last_moved_s, now_s, cooldown_s

    def __contains__(self, rid: str) -> bool:
        t = self.last.get(rid)
        return t is not None and self.now - t < self.cooldown


def _by_context(reqs: list[RequestState], n0: int) -> list[RequestState]:
    """The first ``n0`` requests (the snapshot's) sorted short-context-first, later arrivals after them."""
    return sorted(reqs[:n0], key=lambda r: r.context_tokens) + reqs[n0:]


def _balance(workers: list[WorkerState], cfg: BalancerConfig, recent=frozenset()) -> list[Migration]:
    # the queues are sorted only on a worker's first turn as a source: most ticks move nothing, and sorting
    # every queue of every tick was most of the balancer's time (requests a worker received meanwhile stay
    # behind its own, as they did when every queue was sorted up front)
    loads = [_Load(w, len(w.running), list(w.waiting), list(w.running), float(w.kv_free_tokens)) for w in workers]
    unsorted = set(range(len(loads)))
    if len(loads) < 2:
        return []
    basis = _rate_basis(cfg.rate_basis)
    fallback = _fallback_rate(workers, basis)
    reserve = cfg.growth_reserve_tokens
    moves: list[Migration] = []
    idx = [ld.index(reserve, fallback, basis) for ld in loads]  # a move changes only its two workers' entries
    while len(moves) < cfg.max_moves:
        hi, lo = max(range(len(idx)), key=idx.__getitem__), min(range(len(idx)), key=idx.__getitem__)
        spread = idx[hi] - idx[lo]
        theta = cfg.theta if cfg.theta is not None else cfg.theta_relative * (sum(idx) / len(idx))
        if spread <= theta or hi == lo:
            break
        src, dst = loads[hi], loads[lo]
        if hi in unsorted:
            unsorted.discard(hi)
            w = src.worker
            src.waiting, src.running_reqs = _by_context(src.waiting, len(w.waiting)), _by_context(src.running_reqs,
                                                                                                 len(w.running))
        pick = _first_fitting([r for r in src.waiting if r.request_id not in recent], dst, reserve)
        from_running = False
        if pick is None and cfg.move_running and src.running > 1:
            pick = _first_fitting([r for r in src.running_reqs if r.request_id not in recent], dst, reserve)
            from_running = pick is not None
        if pick is None:
            break
        # Apply the move to the bookkeeping so the next LoadIndex reflects it.
        if from_running:
            src.running_reqs.remove(pick)
            src.running -= 1
            src.running_ctx -= pick.context_tokens
            src.free_tokens += pick.context_tokens
        else:
            src.waiting.remove(pick)
        dst.waiting.append(pick)
        dst.free_tokens -= pick.context_tokens
        new_idx = list(idx)
        new_idx[hi], new_idx[lo] = src.index(reserve, fallback, basis), dst.index(reserve, fallback, basis)
        if max(new_idx) - min(new_idx) >= spread:  # the move did not help: undo and stop
            dst.waiting.remove(pick)
            dst.free_tokens += pick.context_tokens
            if from_running:
                src.running_reqs.append(pick)
                src.running += 1
                src.running_ctx += pick.context_tokens
                src.free_tokens -= pick.context_tokens
            else:
                src.waiting.append(pick)
            break
        idx = new_idx
        moves.append(Migration(pick.request_id, src.worker.instance, dst.worker.instance))
    return moves


def _first_fitting(candidates: list[RequestState], dst: _Load, reserve: int) -> RequestState | None:
    """Shortest-context request that joins ``dst``'s batch and whose KV fits with a growth reserve per sequence."""
    if not dst.batch_room():
        return None
    keep = (dst.running + len(dst.waiting) + 1) * reserve
    for r in candidates:  # sorted short-context-first
        if dst.free_tokens - r.context_tokens >= keep:
            return r
    return None
