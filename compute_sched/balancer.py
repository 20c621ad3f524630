"""Reactive balancer (OrchestrRL Algorithm 1 event 2, Eq. 5): migrate requests off congested workers.

``LoadIndex_w = (|Q_run| + |Q_wait|) / B_cap(M_free) * 1 / R_w`` ranks workers by congestion:
queue depth relative to the concurrency the KV allocator can still admit, over the observed decode
rate. When the spread ``max - min`` exceeds ``theta``, waiting requests (then running ones) move
short-context-first from the most to the least congested worker, but only if the destination can
hold the request's KV without shrinking its stable batch: its free KV after the move must still
cover one growth reserve per sequence it runs. Loads are updated after each move; the procedure
stops when the spread is within ``theta`` or no move is feasible.
"""

from __future__ import annotations

from dataclasses import dataclass

from compute_sched.engine import ClusterSnapshot, Migration, WorkerState
from compute_sched.workload import RequestState

__all__ = ["BalancerConfig", "load_index", "plan_migrations"]


@dataclass(frozen=True)
class BalancerConfig:
    """Knobs of the reactive balancer."""

    theta: float | None = None  # absolute threshold on max - min LoadIndex; None: theta_relative * mean
    theta_relative: float = 0.5
    growth_reserve_tokens: int = 256  # KV each running sequence keeps free to grow (one histogram bin)
    max_moves: int = 256  # per tick
    move_running: bool = False  # also move running requests once the waiting queue is exhausted (off:
    # on the simulated workloads moving running requests cost more than it saved)
    same_config_only: bool = True  # balance among instances of one configuration: the planner chose
    # deliberately which requests go to which configuration of a mixed layout


@dataclass
class _Load:
    worker: WorkerState
    running: int
    waiting: list[RequestState]
    running_reqs: list[RequestState]
    free_tokens: float

    def b_cap(self, reserve: int) -> float:
        """Concurrency the KV allocator allows: what runs now plus what the free KV can admit."""
        ctx = [r.context_tokens for r in self.running_reqs] or [reserve]
        per_seq = sum(ctx) / len(ctx) + reserve
        return max(1.0, self.running + self.free_tokens / per_seq)

    def index(self, reserve: int, fallback_rate: float) -> float:
        rate = self.worker.decode_rate_tps if self.worker.decode_rate_tps > 0 else fallback_rate
        return (self.running + len(self.waiting)) / self.b_cap(reserve) / max(rate, 1e-9)


def load_index(worker: WorkerState, growth_reserve_tokens: int = 256, fallback_rate_tps: float = 1.0) -> float:
    """Return Eq. 5's LoadIndex of one worker (higher = more congested).

    >>> from compute_sched.layout import InstanceConfig
    >>> r = RequestState("a", 100, 50, 1000)
    >>> w = WorkerState(0, InstanceConfig(), (r,), (r,), 150, 10_000, 100.0)
    >>> round(load_index(w), 5)  # 2 requests / (1 running + 9850 free / 406 per seq) / 100 tok/s
    0.00079
    """
    ld = _Load(worker, len(worker.running), list(worker.waiting), list(worker.running), worker.kv_free_tokens)
    return ld.index(growth_reserve_tokens, fallback_rate_tps)


def plan_migrations(snap: ClusterSnapshot, cfg: BalancerConfig | None = None) -> list[Migration]:
    """Return the migrations one monitoring tick should perform (possibly none).

    Notes
    -----
    O(M (W + Q log Q)) for M moves, W workers and Q requests on the source worker.
    """
    cfg = cfg or BalancerConfig()
    workers = [w for w in snap.workers if w.available]
    if not cfg.same_config_only:
        return _balance(workers, cfg)
    groups: dict[object, list[WorkerState]] = {}
    for w in workers:
        groups.setdefault(w.config, []).append(w)
    return [m for g in groups.values() for m in _balance(g, cfg)]


def _balance(workers: list[WorkerState], cfg: BalancerConfig) -> list[Migration]:
    loads = [_Load(w, len(w.running), sorted(w.waiting, key=lambda r: r.context_tokens),
                   sorted(w.running, key=lambda r: r.context_tokens), float(w.kv_free_tokens))
             for w in workers]
    if len(loads) < 2:
        return []
    rates = [ld.worker.decode_rate_tps for ld in loads if ld.worker.decode_rate_tps > 0]
    fallback = min(rates) if rates else 1.0
    reserve = cfg.growth_reserve_tokens
    moves: list[Migration] = []
    while len(moves) < cfg.max_moves:
        idx = [ld.index(reserve, fallback) for ld in loads]
        hi, lo = max(range(len(idx)), key=idx.__getitem__), min(range(len(idx)), key=idx.__getitem__)
        spread = idx[hi] - idx[lo]
        theta = cfg.theta if cfg.theta is not None else cfg.theta_relative * (sum(idx) / len(idx))
        if spread <= theta or hi == lo:
            break
        src, dst = loads[hi], loads[lo]
        pick = _first_fitting(src.waiting, dst, reserve)
        from_running = False
        if pick is None and cfg.move_running and src.running > 1:
            pick = _first_fitting(src.running_reqs, dst, reserve)
            from_running = pick is not None
        if pick is None:
            break
        # Apply the move to the bookkeeping so the next LoadIndex reflects it.
        if from_running:
            src.running_reqs.remove(pick)
            src.running -= 1
            src.free_tokens += pick.context_tokens
        else:
            src.waiting.remove(pick)
        dst.waiting.append(pick)
        dst.free_tokens -= pick.context_tokens
        new_idx = [ld.index(reserve, fallback) for ld in loads]
        if max(new_idx) - min(new_idx) >= spread:  # the move did not help: undo and stop
            dst.waiting.remove(pick)
            dst.free_tokens += pick.context_tokens
            if from_running:
                src.running_reqs.append(pick)
                src.running += 1
                src.free_tokens -= pick.context_tokens
            else:
                src.waiting.append(pick)
            break
        moves.append(Migration(pick.request_id, src.worker.instance, dst.worker.instance))
    return moves


def _first_fitting(candidates: list[RequestState], dst: _Load, reserve: int) -> RequestState | None:
    """Shortest-context request whose KV fits ``dst`` while keeping a growth reserve per sequence."""
    keep = (dst.running + len(dst.waiting) + 1) * reserve
    for r in candidates:  # sorted short-context-first
        if dst.free_tokens - r.context_tokens >= keep:
            return r
    return None
