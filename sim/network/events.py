"""The event loop: flows start, share the network max-min fairly, finish; capacities change in time.

Design note
-----------
Between two events every active flow keeps a constant rate, so the loop jumps from event to event:
the next flow start, the next flow end (remaining bits / rate), or the next change of fabric state
(a reconfiguration step, a failure). Rates are re-solved only at those events. Flows whose ends
fall within a relative 1e-9 of each other end in one event, so a collective of equal flows costs one
solve, not one per flow. A flow's completion time is the moment its last bit leaves plus its path
latency (propagation, one MTU of serialisation per store-and-forward hop, switch processing).

Flows may depend on others (``FlowSet.deps``): a dependent starts once every prerequisite has
finished (or, for a *start* dependency, started), plus a delay -- waves of a weight-sync schedule wait
for the previous wave; a pipelined tree edge starts with the edge that feeds it.

A state change re-routes every flow still running (ECMP over the new graph) and keeps what it has
sent. A flow with no path in the current state waits (rate 0) until a later state gives it one;
if none does, it never finishes (``finish_s`` is inf).
"""

from __future__ import annotations

import hashlib
import heapq
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import scipy.sparse as sp

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.maxmin import MaxMinProblem
from orchestrl.sim.network.state import Incidence, NetState

__all__ = ["FlowSet", "FlowResult", "simulate", "SimulationInvariantError"]

_END_TIE = 1e-9  # relative: flows ending this close together end in one event


@dataclass(frozen=True)
class FlowSet:
    """Flows as parallel arrays: source and destination GPU, size in bytes, earliest start time.

    ``deps`` optionally holds dependencies as ``(prerequisite, dependent, on_start, delay_s)``
    arrays: the dependent may start only ``delay_s`` after the prerequisite finished (or started, where
    ``on_start``), and never before its own ``start_s``.
    """

    src: np.ndarray
    dst: np.ndarray
    size_bytes: np.ndarray
    start_s: np.ndarray
    deps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def __post_init__(self) -> None:
        src = np.asarray(self.src, dtype=np.int64).ravel()
        dst = np.asarray(self.dst, dtype=np.int64).ravel()
        size = np.asarray(self.size_bytes, dtype=np.float64).ravel()
        if size.size == 1 and len(src) != 1:  # one size for every flow
            size = np.full(len(src), size[0] if size.size else 0.0)
        start = np.broadcast_to(np.asarray(self.start_s, dtype=np.float64), src.shape).copy()
        if not (len(src) == len(dst) == len(size)):
            raise ConfigError("flows", "flows", f"src/dst/bytes have lengths {len(src)}/{len(dst)}/{len(size)}",
                              "one entry per flow in each")
        if len(src) and (np.any(~np.isfinite(size)) or size.min() < 0):
            raise ConfigError("flows", "bytes", "a flow has negative or non-finite bytes", "a finite number >= 0")
        if len(src) and (np.any(~np.isfinite(start)) or start.min() < 0):
            raise ConfigError("flows", "start_s", "a flow starts at a negative or non-finite time", ">= 0 seconds")
        if len(src) and np.any(src == dst):
            i = int(np.flatnonzero(src == dst)[0])
            raise ConfigError("flows", f"flows[{i}].dst", f"equals src ({int(src[i])})", "a different GPU")
        for name, v in (("src", src), ("dst", dst), ("size_bytes", size), ("start_s", start)):
            v.setflags(write=False)
            object.__setattr__(self, name, v)
        if self.deps is not None:
            pre, dep, on_start, delay = (np.asarray(x) for x in self.deps)
            pre, dep = pre.astype(np.int64).ravel(), dep.astype(np.int64).ravel()
            on_start = np.broadcast_to(on_start.astype(bool), pre.shape).copy()
            delay = np.broadcast_to(delay.astype(np.float64), pre.shape).copy()
            if len(pre) and (min(pre.min(), dep.min()) < 0 or max(pre.max(), dep.max()) >= len(src)):
                raise ConfigError("flows", "deps", "a dependency names a flow that does not exist",
                                  f"flow indices 0..{len(src) - 1}")
            object.__setattr__(self, "deps", (pre, dep, on_start, delay))

    def __len__(self) -> int:
        return len(self.src)

    @property
    def signature(self) -> str:
        """A digest of the flows (order matters), for timing caches."""
        h = hashlib.sha256()
        for a in (self.src, self.dst, self.size_bytes, self.start_s) + (self.deps or ()):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:20]


@dataclass(frozen=True)
class FlowResult:
    """What the event loop found."""

    finish_s: np.ndarray  # (F,) completion time of each flow; inf if it never finished
    makespan_s: float  # last completion minus first start (inf if a flow never finished)
    events: int  # rate solves
    levels: int  # progressive-filling levels summed over solves
    solve_s: float  # wall time spent in the loop

    @property
    def unfinished(self) -> np.ndarray:
        return ~np.isfinite(self.finish_s)


def simulate(flows: FlowSet, timeline: NetState | Sequence[tuple[float, NetState]], *,
             progress: Callable[[float, int, int], None] | None = None) -> FlowResult:
    """Run the flows to completion on a fabric whose state may change over time.

    Parameters
    ----------
    flows : FlowSet
    timeline : NetState or sequence of (t_s, NetState)
        One state for the whole run, or states in time order (the first applies from time 0).
    progress : callable, optional
        Called as ``progress(t_s, finished, total)`` after each event.

    Returns
    -------
    FlowResult

    Notes
    -----
    O(E * (nnz + levels * L)) for E events: each event re-solves max-min rates over the running
    flows (:class:`sim.network.maxmin.MaxMinProblem`).

    Examples
    --------
    >>> from orchestrl.sim.network.build import build_fabric
    >>> st = build_fabric("ft", 16).state()
    >>> r = simulate(FlowSet([0], [8], [25e6], [0.0]), st)  # 25 MB at 200 Gb/s: 1 ms + 3.5 us latency
    >>> round(r.makespan_s * 1e3, 4)
    1.0035
    """
    started = time.perf_counter()
    if isinstance(timeline, NetState):
        timeline = [(0.0, timeline)]
    timeline = sorted(timeline, key=lambda x: x[0])
    n = len(flows)
    if n == 0:
        return FlowResult(np.full(n, np.inf), 0.0, 0, 0, time.perf_counter() - started)
    if n >= _SPLIT_MIN_FLOWS and len(timeline) <= _SPLIT_MAX_STATES:
        incs = [st.incidence(flows.src, flows.dst) for _, st in timeline]
        groups = _independent_groups(flows, incs)
        if len(groups) > 1:
            return _simulate_groups(flows, timeline, incs, groups, progress, started)
        return _run(flows, timeline, _Rates(timeline, flows, incs), progress, started)
    return _run(flows, timeline, _Rates(timeline, flows), progress, started)


def _run(flows: FlowSet, timeline: list[tuple[float, NetState]], rates: _Rates,
         progress: Callable[[float, int, int], None] | None, started: float) -> FlowResult:
    """The event loop of :func:`simulate`; ``rates`` routes the flows and solves their rates."""
    n = len(flows)
    finish = np.full(n, np.inf)
    bits = flows.size_bytes * 8.0
    left = bits.copy()
    sent = np.zeros(n)  # bits delivered, for the conservation check at the end
    deps = _Deps(flows)
    free = np.flatnonzero(deps.pending == 0)
    order = free[np.argsort(flows.start_s[free], kind="stable")]
    starts = flows.start_s[order]
    later: list[tuple[float, int]] = []  # (start time, flow) of flows released by dependencies
    active = np.zeros(n, bool)
    done = np.zeros(n, bool)
    k = 0  # next independent arrival in start order
    si = 0  # state in force
    t = float(min(starts[0] if len(starts) else np.inf, flows.start_s.min()))
    while si + 1 < len(timeline) and timeline[si + 1][0] <= t:  # the first state holds from time 0
        si += 1
    inc = rates.route(si)
    events = levels = 0
    rate = np.zeros(n)
    dirty = True
    while True:
        admitted = []
        while k < len(order) and starts[k] <= t:
            admitted.append(order[k])
            k += 1
        while later and later[0][0] <= t:
            admitted.append(heapq.heappop(later)[1])
        if admitted:
            idx = np.asarray(admitted, dtype=np.int64)
            active[idx] = True
            dirty = True
            for when, f in deps.release(idx, t, on_start=True, start_s=flows.start_s):
                heapq.heappush(later, (when, f))
        zero = active & (left <= 0)
        if zero.any():  # empty flows only pay the path latency
            idx = np.flatnonzero(zero)
            finish[idx] = t + inc.latency_s[idx]
            active[idx] = False
            done[idx] = True
            for when, f in deps.release(idx, finish[idx], on_start=False, start_s=flows.start_s):
                heapq.heappush(later, (when, f))
            if later and later[0][0] <= t:
                continue
        if dirty:
            rate, got = rates.solve(si, active & inc.routable, t)
            levels += got
            events += 1
            dirty = False
            if progress is not None:
                progress(t, int(done.sum()), n)
        moving = active & (rate > 0)
        dt_end = float(np.min(left[moving] / rate[moving])) if moving.any() else np.inf
        dt_arr = min(float(starts[k]) if k < len(order) else np.inf, later[0][0] if later else np.inf) - t
        dt_chg = float(timeline[si + 1][0] - t) if si + 1 < len(timeline) else np.inf
        dt = max(min(dt_end, dt_arr, dt_chg), 0.0)
        if not np.isfinite(dt):
            break  # nothing can move any more: remaining flows are stuck
        left[moving] -= rate[moving] * dt
        sent[moving] += rate[moving] * dt
        t += dt
        if dt_end <= dt * (1 + _END_TIE):
            tie = dt_end * _END_TIE + 1e-15
            ended = np.flatnonzero(moving & (left <= rate * tie + 1e-6))
            finish[ended] = t + inc.latency_s[ended]
            left[ended] = 0.0
            active[ended] = False
            done[ended] = True
            dirty = True
            for when, f in deps.release(ended, finish[ended], on_start=False, start_s=flows.start_s):
                heapq.heappush(later, (when, f))
        if si + 1 < len(timeline) and timeline[si + 1][0] <= t * (1 + 1e-15):
            while si + 1 < len(timeline) and timeline[si + 1][0] <= t * (1 + 1e-15):
                si += 1
            inc = rates.route(si)
            dirty = True
        if not active.any() and k >= len(order) and not later:
            break
    _check_conservation(bits, sent, done)
    first = float(flows.start_s.min())
    makespan = float(finish.max() - first) if np.all(np.isfinite(finish)) else np.inf
    return FlowResult(finish, makespan, events, levels, time.perf_counter() - started)


class _Deps:
    """Countdown of unreleased prerequisites per flow; releases dependents as events happen."""

    def __init__(self, flows: FlowSet) -> None:
        n = len(flows)
        self.pending = np.zeros(n, dtype=np.int64)
        self.ready = np.zeros(n)
        self.by_pre: dict[tuple[int, bool], list[tuple[int, float]]] = {}
        if flows.deps is not None:
            pre, dep, on_start, delay = flows.deps
            np.add.at(self.pending, dep, 1)
            for p, d, s, w in zip(pre.tolist(), dep.tolist(), on_start.tolist(), delay.tolist()):
                self.by_pre.setdefault((p, s), []).append((d, w))

    def release(self, flows: np.ndarray, t, on_start: bool, start_s: np.ndarray) -> list[tuple[float, int]]:
        """Note that ``flows`` started (or finished) at times ``t``; return (start time, flow) of freed dependents."""
        out = []
        if not self.by_pre:
            return out
        times = np.broadcast_to(np.asarray(t, dtype=np.float64), np.shape(flows)).tolist()
        for p, t in zip(flows.tolist(), times):
            for d, w in self.by_pre.get((p, on_start), ()):
                self.pending[d] -= 1
                self.ready[d] = max(self.ready[d], t + w)
                if self.pending[d] == 0:
                    out.append((max(self.ready[d], float(start_s[d])), d))
        return out


class SimulationInvariantError(RuntimeError):
    """A simulation broke a physical invariant (a bundle over capacity, bits created or lost): a bug, not input."""


_CAP_TOL = 1e-6  # relative: round-off of progressive filling


def _check_capacity(prob, rate: np.ndarray, state: NetState, t: float, cols: np.ndarray | None = None) -> None:
    """Fail loudly when the solved rates overload a bundle (NIC, link, NVLink port, circuit): one mat-vec.

    ``cols`` maps the problem's bundles to the state's where the problem holds only some of them.
    """
    cap = state.capacity_bps
    load = prob.load(rate)
    if cols is not None:
        full = np.zeros(len(cap))
        full[cols] = load
        load = full
    g, gps = state.fabric.gpus, state.fabric.gpus_per_server
    if state.n_base >= 2 * g:  # NVLink carries bytes between GPUs of a server: what leaves them enters them
        out = load[:g].reshape(-1, gps).sum(axis=1)
        into = load[g:2 * g].reshape(-1, gps).sum(axis=1)
        bad = np.abs(out - into) > _CAP_TOL * np.maximum(out, into) + 1.0
        if bad.any():
            s = int(np.flatnonzero(bad)[0])
            raise SimulationInvariantError(f"at t={t:.6g} s NVLink of server {s} sends {out[s]:.4g} bps but receives "
                                           f"{into[s]:.4g} bps: a relayed flow is charged at one end only")
    over = load > cap * (1 + _CAP_TOL) + 1.0
    if over.any():
        b = int(np.flatnonzero(over)[np.argmax((load / np.maximum(cap, 1.0))[over])])
        name = state.bundle_label(b)
        raise SimulationInvariantError(f"at t={t:.6g} s {name} carries {load[b]:.4g} bps against a capacity of "
                                       f"{cap[b]:.4g} bps ({load[b] / max(cap[b], 1.0):.3f}x)")


def _check_conservation(bits: np.ndarray, sent: np.ndarray, done: np.ndarray) -> None:
    """Fail loudly unless every finished flow delivered its bits exactly once (none created, none lost)."""
    bad = done & (np.abs(sent - bits) > 1e-6 * np.maximum(bits, 1.0) + 1.0)
    if bad.any():
        f = int(np.flatnonzero(bad)[0])
        raise SimulationInvariantError(f"flow {f} finished after delivering {sent[f]:.6g} of its {bits[f]:.6g} bits")


# Independent groups (see simulate's Notes): worth finding from this many flows on; a timeline of
# more states than this is routed lazily instead (a state the flows never reach costs nothing then).
_SPLIT_MIN_FLOWS = 2048
_SPLIT_MAX_STATES = 8
_GROUP_FLOWS = 1024  # small components are packed together up to this many flows: fewer loops, same rates


def _independent_groups(flows: FlowSet, incs: Sequence[Incidence]) -> list[np.ndarray]:
    """Return groups of flow indices that share no bundle in any state and no dependency across groups.

    Max-min fair rates separate over the connected components of the flow-bundle graph (a flow's
    rate depends only on the flows it shares a bundle with, transitively), so each group runs its own
    event loop with the same rates, and a solve costs its group's size instead of every flow's.
    Components smaller than ``_GROUP_FLOWS`` are packed together. O(nnz) with SciPy's
    ``connected_components`` over flows, bundles and route classes of every state.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(flows)
    n_bundles = incs[0].own.shape[1]
    rows, cols = [], []
    offset = n + n_bundles  # route-class nodes of each state come after the flows and the bundles
    for inc in incs:
        own = inc.own.tocoo()
        rows.append(own.row.astype(np.int64))
        cols.append(n + own.col.astype(np.int64))
        has = np.flatnonzero(inc.cls >= 0)
        rows.append(has)
        cols.append(offset + inc.cls[has])
        prof = inc.prof.tocoo()
        rows.append(offset + prof.row.astype(np.int64))
        cols.append(n + prof.col.astype(np.int64))
        offset += inc.prof.shape[0]
    if flows.deps is not None:  # a dependent's start waits for its prerequisite: keep them together
        rows.append(flows.deps[0])
        cols.append(flows.deps[1])
    r, c = np.concatenate(rows), np.concatenate(cols)
    graph = coo_matrix((np.ones(len(r), np.int8), (r, c)), shape=(offset, offset))
    _, label = connected_components(graph, directed=False)
    label = label[:n]
    order = np.argsort(label, kind="stable")
    cuts = np.flatnonzero(np.diff(label[order])) + 1
    groups, cur, size = [], [], 0
    for comp in np.split(order, cuts):
        cur.append(comp)
        size += len(comp)
        if size >= _GROUP_FLOWS:
            groups.append(np.sort(np.concatenate(cur)))
            cur, size = [], 0
    if cur:
        groups.append(np.sort(np.concatenate(cur)))
    return groups


def _sub_incidence(inc: Incidence, rows: np.ndarray) -> tuple[Incidence, np.ndarray]:
    """The incidence of flows ``rows`` alone on the bundles they cross; return it and those bundles.

    A group's solve then costs its own bundles per filling level, not the whole fabric's.
    """
    cls = inc.cls[rows]
    used, local = np.unique(cls[cls >= 0], return_inverse=True)
    sub_cls = np.full(len(rows), -1, dtype=np.int64)
    sub_cls[cls >= 0] = local.ravel()
    own, prof = inc.own[rows], inc.prof[used]
    cols = np.unique(np.concatenate([own.indices, prof.indices]))
    remap = np.full(inc.own.shape[1], -1, dtype=np.int64)
    remap[cols] = np.arange(len(cols))
    own = sp.csr_matrix((own.data, remap[own.indices], own.indptr), shape=(len(rows), len(cols)))
    prof = sp.csr_matrix((prof.data, remap[prof.indices], prof.indptr), shape=(len(used), len(cols)))
    return Incidence(own, sub_cls, prof, inc.latency_s[rows], inc.routable[rows]), cols


def _simulate_groups(flows: FlowSet, timeline: list[tuple[float, NetState]], incs: Sequence[Incidence],
                     groups: list[np.ndarray], progress: Callable[[float, int, int], None] | None,
                     started: float) -> FlowResult:
    """Run each independent group's event loop once per distinct group and put the completions together.

    Two groups with the same flows (sizes, starts, dependencies) on the same bundles up to renaming
    (incidence, capacities and latencies equal entry for entry, in every state) finish at the same
    times: the cluster's symmetric layouts make most groups copies of a few (32 groups, 4 distinct,
    for a 2,048-GPU KV hand-over), so each distinct group is simulated once.
    """
    n = len(flows)
    finish = np.full(n, np.inf)
    events = levels = 0
    where = np.empty(n, dtype=np.int64)
    seen: dict[str, np.ndarray] = {}
    done = 0
    for g in groups:
        deps = None
        if flows.deps is not None:
            where[g] = np.arange(len(g))
            pre, dep, on_start, delay = flows.deps
            keep = np.isin(dep, g)  # a group holds both ends of each of its dependencies
            deps = (where[pre[keep]], where[dep[keep]], on_start[keep], delay[keep])
        sub = FlowSet(flows.src[g], flows.dst[g], flows.size_bytes[g], flows.start_s[g], deps)
        parts = [_sub_incidence(inc, g) for inc in incs]
        h = hashlib.sha256()
        for (inc, cols), (_, st) in zip(parts, timeline):
            for a in (inc.own.indptr, inc.own.indices, inc.own.data, inc.cls, inc.prof.indptr, inc.prof.indices,
                      inc.prof.data, inc.latency_s, inc.routable, st.capacity_bps[cols]):
                h.update(np.ascontiguousarray(a).tobytes())
        for a in (sub.size_bytes, sub.start_s) + (sub.deps or ()):
            h.update(np.ascontiguousarray(a).tobytes())
        key = h.hexdigest()
        if key not in seen:
            res = _run(sub, timeline, _Rates(timeline, sub, [p[0] for p in parts], [p[1] for p in parts]),
                       None, started)
            seen[key] = res.finish_s
            events += res.events
            levels += res.levels
        finish[g] = seen[key]
        done += len(g)
        if progress is not None:
            progress(float(finish[g][np.isfinite(finish[g])].max(initial=0.0)), done, n)
    first = float(flows.start_s.min())
    makespan = float(finish.max() - first) if np.all(np.isfinite(finish)) else np.inf
    return FlowResult(finish, makespan, events, levels, time.perf_counter() - started)


class _Rates:
    """Routes one set of flows on each state of a timeline and solves their max-min rates.

    ``incs`` (optional) are the flows' incidences per state, already computed; ``cols`` (optional)
    the state bundles each incidence's columns stand for, where it holds only some of them.
    """

    def __init__(self, timeline: list[tuple[float, NetState]], flows: FlowSet,
                 incs: Sequence[Incidence] | None = None, cols: Sequence[np.ndarray] | None = None) -> None:
        self.timeline, self.flows = timeline, flows
        self.incs = dict(enumerate(incs)) if incs is not None else {}
        self.cols = list(cols) if cols is not None else [None] * len(timeline)
        self.probs: dict[int, MaxMinProblem] = {}

    def route(self, si: int) -> Incidence:
        if si not in self.incs:
            self.incs[si] = self.timeline[si][1].incidence(self.flows.src, self.flows.dst)
        return self.incs[si]

    def solve(self, si: int, runnable: np.ndarray, t: float) -> tuple[np.ndarray, int]:
        """Return the max-min rates of the runnable flows on state ``si`` and the filling levels.

        Every solve is checked against the state's capacities (:func:`_check_capacity`).
        """
        if not runnable.any():
            return np.zeros(len(runnable)), 0
        if si not in self.probs:
            self.probs[si] = self.route(si).problem()
        state, cols = self.timeline[si][1], self.cols[si]
        cap = state.capacity_bps if cols is None else state.capacity_bps[cols]
        res = self.probs[si].solve(cap, runnable, bottleneck=False)
        _check_capacity(self.probs[si], res.rate_bps, state, t, cols)
        return res.rate_bps, res.levels
