"""Collectives as flows: rank pairs from :mod:`fabric.traffic`, timing in NCCL-tests terms.

Design note
-----------
A collective becomes one flow per directed GPU pair it uses, with the bytes
:func:`fabric.traffic.collective_pair_arrays` gives (the same pairs the fabric controller plans
circuits for), all starting together. The flow-level run gives the bandwidth term; the latency term
of a multi-step algorithm is added on top as ``(steps - 1) * alpha``, where ``alpha`` is the largest
path latency of the collective's flows (the classic alpha-beta model: a ring all-reduce takes
``2 (n - 1)`` dependent steps, a double binary tree ``2 log2 n``, an all-to-all one).

Bus bandwidth follows nccl-tests (``doc/PERFORMANCE.md``): ``algbw = S / t`` with ``S`` the
collective's ``bytes_per_rank`` and ``busbw = algbw * factor`` with factor ``2 (n - 1) / n`` for
all-reduce, ``(n - 1) / n`` for all-gather, reduce-scatter and all-to-all, and 1 otherwise.

A weight-sync :class:`collectives.schedule.Schedule` replays as flows with dependencies: Phase A
waves run one after another, and every tree edge out of a non-origin rank starts one chunk after
the edge feeding it (the schedule's pipelining) and cannot finish before that edge has delivered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import GROUPED_PRIMITIVES, Collective, Intent
from orchestrl.fabric.topology import Topology
from orchestrl.fabric.traffic import collective_pair_arrays, intent_pair_arrays, tree_all_reduce_pair_arrays
from orchestrl.sim.network.events import FlowSet

__all__ = ["ALGORITHMS", "CollectiveTiming", "collective_flows", "intent_flows", "collective_steps",
           "bus_factor", "groups_of", "schedule_flows", "schedule_completion_s"]

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class CollectiveTiming:
    """Completion of one collective on one fabric state, in NCCL-tests terms."""

    primitive: str
    group_size: int
    bytes_per_rank: float
    time_s: float  # completion: bandwidth term from the flow run plus the latency term
    transfer_s: float  # the flow-level makespan (includes one path latency)
    latency_term_s: float  # (steps - 1) * alpha
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    flows: int
    events: int

    def to_json(self) -> dict[str, object]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


def groups_of(gpus: Sequence[int] | int, group_size: int, stride: int = 1) -> tuple[tuple[int, ...], ...]:
    """Return groups of ``group_size`` GPUs: consecutive, or members ``stride`` apart.

    ``stride=1`` gives ``(0..G-1), (G..2G-1), ...``; ``stride=s`` puts GPU ``g`` with ``g + s``,
    ``g + 2s``, ... (e.g. one GPU per server with ``s = 8``, as a DP group under TP=8).

    Raises
    ------
    ConfigError
        If the GPUs cannot be cut into whole groups.

    Examples
    --------
    >>> groups_of(8, 4)
    ((0, 1, 2, 3), (4, 5, 6, 7))
    >>> groups_of(8, 4, stride=2)
    ((0, 2, 4, 6), (1, 3, 5, 7))
    """
    gpus = list(range(gpus)) if isinstance(gpus, int) else list(gpus)
    n = len(gpus)
    if group_size < 1 or n % group_size:
        raise ConfigError("collective", "group_size", f"{group_size} does not divide {n} GPUs", f"a divisor of {n}")
    if stride < 1 or n % (group_size * stride) and stride != 1:
        raise ConfigError("collective", "stride", f"{stride} x group size {group_size} does not tile {n} GPUs",
                          f"a stride with group_size * stride dividing {n}")
    arr = np.asarray(gpus).reshape(-1, group_size, stride).transpose(0, 2, 1).reshape(-1, group_size)
    return tuple(tuple(int(x) for x in row) for row in arr)


def collective_steps(primitive: str, n: int, algorithm: str = "ring") -> int:
    """Return the dependent steps of a collective over ``n`` ranks (its latency multiplier).

    Examples
    --------
    >>> collective_steps("all-reduce", 8), collective_steps("all-reduce", 8, "tree"), collective_steps("all-to-all", 8)
    (14, 6, 1)
    """
    if n <= 1:
        return 0
    if primitive == "all-reduce":
        return 2 * math.ceil(math.log2(n)) if algorithm == "tree" else 2 * (n - 1)
    if primitive in ("all-gather", "reduce-scatter"):
        return n - 1
    return 1


def bus_factor(primitive: str, n: int) -> float:
    """Return nccl-tests' bus-bandwidth factor for a primitive over ``n`` ranks."""
    if n <= 1:
        return 1.0
    if primitive == "all-reduce":
        return 2 * (n - 1) / n
    if primitive in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def collective_flows(collective: Collective, topology: Topology | None = None, algorithm: str = "ring") -> FlowSet:
    """Return the flows of one collective (one per directed GPU pair, all starting at 0).

    ``algorithm="tree"`` replaces the ring of an all-reduce by NCCL's double binary tree.

    Notes
    -----
    O(P log P) for P pairs (:func:`fabric.traffic.collective_pair_arrays`).
    """
    if algorithm not in ALGORITHMS:
        raise ConfigError("collective", "algorithm", f"unknown algorithm {algorithm!r}", ", ".join(ALGORITHMS))
    if algorithm == "tree" and collective.primitive == "all-reduce":
        src, dst, vol = tree_all_reduce_pair_arrays(collective.groups, collective.bytes_per_rank)
    else:
        src, dst, vol = collective_pair_arrays(collective, topology)
    return FlowSet(src, dst, vol, np.zeros(len(src)))


def intent_flows(intent: Intent, topology: Topology | None = None) -> FlowSet:
    """Return the flows of every collective of an intent, summed per GPU pair, all starting at 0."""
    src, dst, vol = intent_pair_arrays(intent, topology)
    return FlowSet(src, dst, vol, np.zeros(len(src)))


def timing_of(collective: Collective, result, latency_s: np.ndarray, algorithm: str = "ring") -> CollectiveTiming:
    """Return the :class:`CollectiveTiming` of a finished flow run of ``collective``."""
    n = max((len(g) for g in collective.groups), default=len(collective.src_gpus) + len(collective.dst_gpus))
    steps = collective_steps(collective.primitive, n, algorithm) if collective.primitive in GROUPED_PRIMITIVES else 1
    alpha = float(latency_s.max()) if len(latency_s) else 0.0
    term = max(steps - 1, 0) * alpha
    total = result.makespan_s + term
    size = collective.bytes_per_rank
    algbw = size / total if total > 0 and math.isfinite(total) else 0.0
    return CollectiveTiming(collective.primitive, n, size, total, result.makespan_s, term, algbw,
                            algbw * bus_factor(collective.primitive, n), len(latency_s), result.events)


# ------------------------------------------------------------------------------ weight sync


def schedule_flows(schedule, gpu_of_rank: Sequence[int], link_bps: float) -> tuple[FlowSet, np.ndarray]:
    """Return a weight-sync schedule as dependent flows, and per flow the flow that feeds it (-1: none).

    ``gpu_of_rank[r]`` is the GPU of schedule rank ``r`` (trainer ranks first, then generators).

    Notes
    -----
    O(E + sum over waves of |W_w-1| * |W_w|) for E edges.
    """
    edges = list(schedule.edges)
    gpu = np.asarray(gpu_of_rank, dtype=np.int64)
    if len(gpu) < schedule.world_size:
        raise ConfigError("weight sync", "gpu_of_rank", f"{len(gpu)} GPUs for {schedule.world_size} schedule ranks",
                          "one GPU per trainer and generator rank")
    nbytes = {b.id: b.nbytes for b in schedule.blocks}
    src = gpu[[e.src for e in edges]]
    dst = gpu[[e.dst for e in edges]]
    size = np.array([nbytes[e.block] for e in edges], dtype=np.float64)
    into = {(e.block, e.dst): i for i, e in enumerate(edges)}
    feeder = np.array([into.get((e.block, e.src), -1) for e in edges], dtype=np.int64)
    chunk_s = schedule.chunk_bytes * 8 / link_bps
    pre, dep, on_start, delay = [], [], [], []
    for i, f in enumerate(feeder.tolist()):
        if f >= 0:  # pipelined: start one chunk after the feeding edge starts
            pre.append(f), dep.append(i), on_start.append(True), delay.append(chunk_s)
    waves: dict[int, list[int]] = {}
    for i, e in enumerate(edges):
        if e.wave >= 0 and feeder[i] < 0:
            waves.setdefault(e.wave, []).append(i)
    keys = sorted(waves)
    for a, b in zip(keys, keys[1:]):  # Phase A waves respect the boundary budgets one after another
        for p in waves[a]:
            for d in waves[b]:
                pre.append(p), dep.append(d), on_start.append(False), delay.append(0.0)
    same = src == dst  # a block a rank already holds on its own GPU moves nowhere
    if same.any():
        raise ConfigError("weight sync", "gpu_of_rank", "two schedule ranks share a GPU", "distinct GPUs")
    deps = (np.array(pre, np.int64), np.array(dep, np.int64), np.array(on_start, bool), np.array(delay))
    return FlowSet(src, dst, size, np.zeros(len(edges)), deps), feeder


def schedule_completion_s(finish_s: np.ndarray, feeder: np.ndarray, chunk_s: float) -> float:
    """Return when the last block lands: a forwarded edge cannot end before its feeder delivered."""
    done = np.array(finish_s, dtype=np.float64)
    need = feeder >= 0
    for _ in range(len(done)):  # at most the depth of the deepest tree
        new = np.where(need, np.maximum(done, done[np.maximum(feeder, 0)] + chunk_s), done)
        if np.array_equal(new, done):
            break
        done = new
    return float(done.max()) if len(done) else 0.0
