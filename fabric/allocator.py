"""Circuit allocation on OCS-eligible endpoint pairs (OrchestrRL Appendix D).

One abstraction serves both OCS tiers: for OCS-Core the endpoints are PoDs, for OCS-Agg they
are one PoD's ToRs plus its boundary-uplink endpoints.  Given a sparse directed byte demand
``D[u->v]`` and ``deg(v)`` allocatable ports per endpoint, we choose integer multiplicities
``c_uv = c_vu`` of full-duplex circuits (line rate ``link_bps`` each way) under the port budget
``sum_u c_uv <= deg(v)`` (Eq. 6), only on eligible pairs.

Design note
-----------
A pair's completion-time proxy (Eq. 7) is ``max(D_uv, D_vu) / (c_uv * B)``, infinite while a
demanded pair has no circuit.  Three allocators share that score and one result type:

- ``greedy``  - Algorithm 3 as written: add one circuit at a time to the pair with the largest
  proxy.  A pair's score only changes when *it* gets a circuit, so a heap with lazy deletion of
  pairs whose endpoint ran out of ports reproduces the paper's ``argmax`` exactly in
  O((P + K) log P) instead of O(K * P).
- ``uniform`` - the Appendix I baseline that ignores volumes and spreads ports round-robin.
- ``optimal`` - a CP-SAT reference that is lexicographically optimal (most pairs served, then
  the smallest worst pair time).  The worst time is always one of the finitely many values
  ``maxdir / (k * B)``, so the model minimises the *rank* of that value; this keeps the model
  linear and exact, with no time quantisation and no big-domain products.

Everything here is pure: dataclasses in, dataclasses out; the JSON helpers are the CLI contract.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fabric.errors import ConfigError, OrchestrlError

__all__ = [
    "METHODS",
    "AllocationProblem",
    "Allocation",
    "AllocationSolverError",
    "pair_time_s",
    "allocate_greedy",
    "allocate_uniform",
    "allocate_optimal",
    "allocate",
    "problem_from_json",
    "allocation_to_json",
]

METHODS = ("greedy", "uniform", "optimal")

_PROBLEM_SOURCE = "AllocationProblem"


class AllocationSolverError(OrchestrlError, RuntimeError):
    """The CP-SAT reference found no allocation within its time limit (or the solver failed)."""


@dataclass(frozen=True)
class AllocationProblem:
    """One period's allocation input for one OCS tier (D.1).

    Mappings are copied on construction, so later edits by the caller cannot change a problem;
    invalid values raise :class:`~fabric.errors.ConfigError` naming the field.  An endpoint that
    appears in ``demand`` but not in ``ports`` has no allocatable port (deg 0): callers may pass
    a scope's whole demand and offer ports only where they exist.  (The JSON reader is stricter
    and refuses such names, since there they are almost always typos.)
    """

    link_bps: float  # line rate of one circuit in each direction (full duplex)
    ports: Mapping[str, int]  # endpoint -> deg(v), ports left after reservations; absent: 0
    demand: Mapping[tuple[str, str], float]  # directed bytes (src, dst); absent means 0
    eligible: frozenset[frozenset[str]] | None = None  # template scope; None: demanded pairs
    bipartite_tiebreak: bool = False  # App. D.2 utilisation-aware tie-breaker for greedy

    def __post_init__(self) -> None:
        src = _PROBLEM_SOURCE
        if isinstance(self.link_bps, bool) or not isinstance(self.link_bps, (int, float)) or not (
            math.isfinite(self.link_bps) and self.link_bps > 0
        ):
            raise ConfigError(src, "link_bps", f"got {self.link_bps!r}", "a finite number > 0")
        ports = dict(self.ports)
        for name, deg in ports.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(src, "ports", f"endpoint name {name!r}", "non-empty strings")
            if isinstance(deg, bool) or not isinstance(deg, int) or deg < 0:
                raise ConfigError(src, f"ports.{name}", f"got {deg!r}", "an integer >= 0")
        demand = dict(self.demand)
        for key, nbytes in demand.items():
            field = f"demand[{key!r}]"
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ConfigError(src, field, "key is not a (src, dst) tuple", "(src, dst)")
            if key[0] == key[1]:
                raise ConfigError(src, field, "src equals dst", "two distinct endpoints")
            if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not (
                math.isfinite(nbytes) and nbytes >= 0
            ):
                raise ConfigError(src, field, f"bytes {nbytes!r}", "a finite number >= 0")
        eligible = self.eligible
        if eligible is not None:
            eligible = frozenset(frozenset(pair) for pair in eligible)
            for pair in eligible:
                if len(pair) != 2:
                    raise ConfigError(
                        src, "eligible", f"entry {sorted(pair)!r}", "2 distinct endpoints"
                    )
        object.__setattr__(self, "ports", ports)
        object.__setattr__(self, "demand", demand)
        object.__setattr__(self, "eligible", eligible)
        object.__setattr__(self, "bipartite_tiebreak", bool(self.bipartite_tiebreak))


@dataclass(frozen=True)
class Allocation:
    """Circuit multiplicities chosen for a problem, with the Eq. 7 pair times they give."""

    method: str  # "greedy" | "uniform" | "optimal": who produced it
    circuits: Mapping[tuple[str, str], int]  # (a, b) with a < b -> count > 0; the plan input
    pair_time_s: Mapping[tuple[str, str], float]  # every demanded eligible pair; inf if unserved
    max_pair_time_s: float  # worst served pair: the period's communication bottleneck
    unserved: tuple[tuple[str, str], ...]  # demanded eligible pairs left without a circuit

    def ports_used(self) -> dict[str, int]:
        """Return ports consumed per endpoint (endpoints with no circuit are absent).

        Notes
        -----
        O(C) for C circuit entries.

        Examples
        --------
        >>> Allocation("greedy", {("a", "b"): 2}, {("a", "b"): 1.0}, 1.0, ()).ports_used()
        {'a': 2, 'b': 2}
        """
        used: dict[str, int] = {}
        for (a, b), count in self.circuits.items():
            used[a] = used.get(a, 0) + count
            used[b] = used.get(b, 0) + count
        return used


def pair_time_s(demand_uv: float, demand_vu: float, circuits: int, link_bps: float) -> float:
    """Return the Eq. 7 completion-time proxy of one endpoint pair, in seconds.

    Parameters
    ----------
    demand_uv, demand_vu : float
        Bytes in each direction of the pair.
    circuits : int
        Parallel full-duplex circuits on the pair.
    link_bps : float
        Line rate of one circuit in each direction.

    Returns
    -------
    float
        ``max(demand_uv, demand_vu) / (circuits * link_bps)``; ``inf`` for a demanded pair with
        no circuit; ``0.0`` for an idle pair.

    Raises
    ------
    ValueError
        If ``circuits`` is negative or ``link_bps`` is not positive.

    Notes
    -----
    O(1).  Full-duplex circuits carry both directions at once, so only the larger one counts.

    Examples
    --------
    >>> pair_time_s(8e9, 2e9, 2, 1e9)
    4.0
    >>> pair_time_s(1.0, 0.0, 0, 1e9)
    inf
    """
    if circuits < 0 or link_bps <= 0:
        raise ValueError(f"need circuits >= 0 and link_bps > 0, got {circuits}, {link_bps}")
    if demand_uv + demand_vu <= 0:
        return 0.0
    if circuits == 0:
        return math.inf
    return max(demand_uv, demand_vu) / (circuits * link_bps)


@dataclass(frozen=True)
class _Pairs:
    """Demanded eligible pairs compiled to integer indices, sorted by (a, b) string order."""

    names: list[str]  # endpoint index -> name
    deg: list[int]  # endpoint index -> allocatable ports
    keys: list[tuple[str, str]]  # pair index -> (a, b) with a < b
    a: list[int]  # pair index -> endpoint index of a
    b: list[int]  # pair index -> endpoint index of b
    d_ab: list[float]  # bytes a -> b
    d_ba: list[float]  # bytes b -> a
    maxdir: list[float]  # MAXDIRDEMAND, > 0 for every pair here
    link_bps: float


def _compile(problem: AllocationProblem) -> _Pairs:
    """Build the candidate pair set from the sparse demand (never enumerating |V|^2 pairs)."""
    both: dict[tuple[str, str], list[float]] = {}
    for (u, v), nbytes in problem.demand.items():
        if nbytes <= 0:
            continue
        key, slot = ((u, v), 0) if u < v else ((v, u), 1)
        both.setdefault(key, [0.0, 0.0])[slot] += float(nbytes)
    if problem.eligible is not None:
        both = {k: d for k, d in both.items() if frozenset(k) in problem.eligible}
    keys = sorted(both)
    names = sorted(set(problem.ports).union(*keys))  # demand may name port-less endpoints
    index = {n: i for i, n in enumerate(names)}
    d_ab = [both[k][0] for k in keys]
    d_ba = [both[k][1] for k in keys]
    return _Pairs(
        names=names,
        deg=[problem.ports.get(n, 0) for n in names],
        keys=keys,
        a=[index[k[0]] for k in keys],
        b=[index[k[1]] for k in keys],
        d_ab=d_ab,
        d_ba=d_ba,
        maxdir=[max(x, y) for x, y in zip(d_ab, d_ba)],
        link_bps=float(problem.link_bps),
    )


def _result(method: str, pairs: _Pairs, count: list[int]) -> Allocation:
    """Package per-pair circuit counts as an :class:`Allocation` with Eq. 7 times."""
    times = {
        k: pair_time_s(pairs.d_ab[i], pairs.d_ba[i], count[i], pairs.link_bps)
        for i, k in enumerate(pairs.keys)
    }
    served = [t for t in times.values() if math.isfinite(t)]
    return Allocation(
        method=method,
        circuits={k: count[i] for i, k in enumerate(pairs.keys) if count[i] > 0},
        pair_time_s=times,
        max_pair_time_s=max(served, default=0.0),
        unserved=tuple(k for i, k in enumerate(pairs.keys) if count[i] == 0),
    )


def _greedy_fill(pairs: _Pairs, count: list[int], free: list[int], tiebreak: bool) -> None:
    """Run Algorithm 3 from the state (count, free), updating both in place."""
    bps = pairs.link_bps
    pa, pb, maxdir = pairs.a, pairs.b, pairs.maxdir
    # Min-heap on (-PAIRTIME, -MAXDIRDEMAND, pair index): the index is the (a, b) string order,
    # so equal keys resolve deterministically.  Each pair has exactly one live entry.
    heap = [
        (-(maxdir[i] / (count[i] * bps)) if count[i] else -math.inf, -maxdir[i], i)
        for i in range(len(pairs.keys))
    ]
    heapq.heapify(heap)
    while heap:
        neg_t, neg_m, i = heapq.heappop(heap)
        if not (free[pa[i]] and free[pb[i]]):
            continue  # ports never come back, so this pair is out for good
        if tiebreak:
            i = _pick_least_monopolising(heap, neg_t, neg_m, i, pairs, free)
        count[i] += 1
        free[pa[i]] -= 1
        free[pb[i]] -= 1
        heapq.heappush(heap, (-(maxdir[i] / (count[i] * bps)), neg_m, i))


def _pick_least_monopolising(
    heap: list, neg_t: float, neg_m: float, first: int, pairs: _Pairs, free: list[int]
) -> int:
    """Among pairs tied on (PAIRTIME, MAXDIRDEMAND), pick the one with most free ports left.

    Free ports change without touching heap keys, so the tie group is re-read from the heap
    each time; the losers go back unchanged.  Exhausted pairs met here are dropped for good.
    """
    group = [first]
    while heap and heap[0][0] == neg_t and heap[0][1] == neg_m:
        j = heapq.heappop(heap)[2]
        if free[pairs.a[j]] and free[pairs.b[j]]:
            group.append(j)
    best = max(group, key=lambda j: (min(free[pairs.a[j]], free[pairs.b[j]]), -j))
    for j in group:
        if j != best:
            heapq.heappush(heap, (neg_t, neg_m, j))
    return best


def allocate_greedy(problem: AllocationProblem) -> Allocation:
    """Return the Algorithm 3 (pair-bottleneck greedy) allocation.

    Repeatedly adds one circuit to the demanded eligible pair with the largest Eq. 7 pair time
    among pairs with a free port at both ends; ties go to the larger directional demand, then
    to the smaller ``(a, b)`` in string order.  With ``problem.bipartite_tiebreak`` a remaining
    tie on (pair time, directional demand) goes first to the pair whose endpoints have the most
    free ports (larger ``min(free[a], free[b])``): the App. D.2 "utilisation-aware
    tie-breaker" that keeps hot endpoints from monopolising ports in bipartite templates.

    Parameters
    ----------
    problem : AllocationProblem

    Returns
    -------
    Allocation
        Maximal: afterwards no demanded eligible pair has a free port at both endpoints.

    Notes
    -----
    O(D log D + (P + K) log P) for D demand entries, P demanded eligible pairs and
    K <= sum(deg) / 2 circuits: each heap pop either allocates a circuit (and re-pushes the
    pair with its new key) or discards a pair for good.  With the tie-breaker each step also
    scans its tie group G, giving O((P + K * G) log P); G is large for equal-volume collectives.

    When every endpoint has at least as many ports as demanded pairs, the result minimises the
    worst pair time exactly: all pairs get their first circuit, every later circuit goes to a
    pair at the current maximum, so when the worst pair is blocked at a full endpoint, each
    pair there already holds circuits it needs for any smaller time.  Under port starvation
    greedy serves the heaviest pairs first, not the most pairs.

    Examples
    --------
    >>> p = AllocationProblem(1e9, {"a": 3, "b": 3, "c": 1},
    ...                       {("a", "b"): 4e9, ("b", "a"): 1e9, ("a", "c"): 1e9})
    >>> alloc = allocate_greedy(p)
    >>> alloc.circuits
    {('a', 'b'): 2, ('a', 'c'): 1}
    >>> alloc.max_pair_time_s
    2.0
    """
    pairs = _compile(problem)
    count = [0] * len(pairs.keys)
    _greedy_fill(pairs, count, list(pairs.deg), problem.bipartite_tiebreak)
    return _result("greedy", pairs, count)


def allocate_uniform(problem: AllocationProblem) -> Allocation:
    """Return the volume-oblivious uniform-splitting baseline (Appendix I).

    In rounds, every demanded eligible pair that still has a free port at both ends gets one
    circuit, visiting pairs in ``(a, b)`` string order, until a round allocates nothing.  Pair
    times use the same Eq. 7 as the other methods, so results compare directly.

    Parameters
    ----------
    problem : AllocationProblem

    Returns
    -------
    Allocation

    Notes
    -----
    O(D log D + P + K): a pair visited in a round either gets a circuit or leaves for good.
    When ports run out mid-round, pairs earlier in string order get the extra circuit.

    Examples
    --------
    >>> p = AllocationProblem(1e9, {"a": 3, "b": 3, "c": 1},
    ...                       {("a", "b"): 4e9, ("b", "a"): 1e9, ("a", "c"): 1e9})
    >>> allocate_uniform(p).circuits
    {('a', 'b'): 2, ('a', 'c'): 1}
    """
    pairs = _compile(problem)
    count = [0] * len(pairs.keys)
    free = list(pairs.deg)
    live = list(range(len(pairs.keys)))
    while live:
        still = []
        for i in live:
            a, b = pairs.a[i], pairs.b[i]
            if free[a] and free[b]:
                count[i] += 1
                free[a] -= 1
                free[b] -= 1
                still.append(i)
        live = still
    return _result("uniform", pairs, count)


def _circuit_caps(pairs: _Pairs) -> list[int]:
    """Most circuits each pair could ever use: both endpoints' whole budgets bound it."""
    return [min(pairs.deg[a], pairs.deg[b]) for a, b in zip(pairs.a, pairs.b)]


def _candidate_times(pairs: _Pairs, caps: list[int]) -> list[float]:
    """Every pair time some allocation can produce, ascending; the optimum is one of them."""
    bps = pairs.link_bps
    return sorted({m / (k * bps) for m, cap in zip(pairs.maxdir, caps) for k in range(1, cap + 1)})


def _exact_min_max_time(problem: AllocationProblem) -> float | None:
    """Return the optimal worst pair time when every demanded eligible pair can be served.

    With every pair served, pairs interact only through endpoint budgets, so time ``T`` is
    feasible iff each endpoint has ports for ``need(pair, T)`` = fewest circuits bringing the
    pair to ``<= T``.  ``T*`` is one of the values ``maxdir / (k * B)``; binary search over
    them.  Returns None when some endpoint has more demanded pairs than ports, 0.0 when no pair
    is demanded.  Pure Python; the independent check of the CP-SAT reference.

    Notes
    -----
    O(M log M + (V + P) log M) for M <= sum over pairs of min(deg a, deg b) candidate times.
    """
    pairs = _compile(problem)
    if not pairs.keys:
        return 0.0
    load = [0] * len(pairs.names)
    for a, b in zip(pairs.a, pairs.b):
        load[a] += 1
        load[b] += 1
    if any(n > d for n, d in zip(load, pairs.deg)):
        return None
    bps = pairs.link_bps
    caps = _circuit_caps(pairs)
    cands = _candidate_times(pairs, caps)

    def feasible(t: float) -> bool:
        used = [0] * len(pairs.names)
        for m, a, b in zip(pairs.maxdir, pairs.a, pairs.b):
            # Start from the real-number answer, then settle it with the exact float test that
            # pair_time_s applies, so candidates equal to T count as reaching T.
            k = max(1, math.ceil(m / (t * bps)))
            while k > 1 and m / ((k - 1) * bps) <= t:
                k -= 1
            while m / (k * bps) > t:
                k += 1
            used[a] += k
            used[b] += k
        return all(u <= d for u, d in zip(used, pairs.deg))

    lo, hi = 0, len(cands) - 1  # cands[hi] (one circuit each) is feasible: load <= deg
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    return cands[lo]


def allocate_optimal(problem: AllocationProblem, *, time_limit_s: float = 30.0) -> Allocation:
    """Return a lexicographically optimal allocation from OR-Tools CP-SAT (a reference).

    Objective: first serve as many demanded eligible pairs as possible, then minimise the worst
    Eq. 7 time over served pairs.  Ports the optimum leaves free are then filled by the greedy
    rule (extra circuits never raise a pair time), so the result is also maximal: Pareto-optimal.
    Meant for small and medium instances (tens of endpoints) to grade the greedy allocator,
    not for the control loop.

    Parameters
    ----------
    problem : AllocationProblem
    time_limit_s : float, default 30.0
        Wall-clock budget of the solve.  If it expires with a feasible but unproven solution,
        that solution is returned; it is then only an upper bound on the optimum.

    Returns
    -------
    Allocation
        ``method == "optimal"``; pair times are exact floats from the chosen circuit counts.
        Which of several equally good allocations is returned may vary between runs.

    Raises
    ------
    ConfigError
        If ``time_limit_s`` is not a positive finite number.
    AllocationSolverError
        If the solver returns neither OPTIMAL nor FEASIBLE within ``time_limit_s``.

    Notes
    -----
    Model: unary bits ``y[i, k] = [c_i >= k]`` for ``k <= min(deg a, deg b)`` (so port budgets
    are linear), pair ``i`` served iff ``y[i, 1]``.  The worst time is one of the M values
    ``maxdir_i / (k * B)``; an integer ``r`` in ``[0, M)`` is the rank of the worst one, and
    ``r >= rank(maxdir_i / (c_i * B))`` is linear in the ``y`` bits.  Maximising
    ``M * served - r`` is therefore exactly lexicographic.  Size O(M) variables; solve time is
    exponential in the worst case.  CP-SAT runs with 2 workers.

    Examples
    --------
    >>> p = AllocationProblem(1e9, {"a": 3, "b": 3, "c": 1},
    ...                       {("a", "b"): 4e9, ("b", "a"): 1e9, ("a", "c"): 1e9})
    >>> allocate_optimal(p).max_pair_time_s
    2.0
    """
    from ortools.sat.python import cp_model  # heavy import, only for the reference solver

    if not (_is_number(time_limit_s) and time_limit_s > 0):
        raise ConfigError("allocate_optimal", "time_limit_s", f"got {time_limit_s!r}", "> 0")
    pairs = _compile(problem)
    caps = _circuit_caps(pairs)
    greedy = [0] * len(pairs.keys)
    _greedy_fill(pairs, greedy, list(pairs.deg), problem.bipartite_tiebreak)
    bps = pairs.link_bps
    cands = _candidate_times(pairs, caps)
    rank = {t: r for r, t in enumerate(cands)}

    model = cp_model.CpModel()
    worst = model.new_int_var(0, max(len(cands) - 1, 0), "worst_rank")
    bits: list[list[Any]] = []
    at_endpoint: list[list[Any]] = [[] for _ in pairs.names]
    served = []
    for i, cap in enumerate(caps):
        y = [model.new_bool_var(f"y{i}_{k}") for k in range(1, cap + 1)]
        bits.append(y)
        for lo_bit, hi_bit in zip(y, y[1:]):
            model.add_implication(hi_bit, lo_bit)  # unary: c >= k+1 implies c >= k
        at_endpoint[pairs.a[i]].extend(y)
        at_endpoint[pairs.b[i]].extend(y)
        if not y:
            continue
        served.append(y[0])
        w = [rank[pairs.maxdir[i] / (k * bps)] for k in range(1, cap + 1)]
        # Telescoping sum equals w[c-1] when exactly the first c bits are set, 0 when none.
        model.add(worst >= w[0] * y[0] - sum((w[k - 1] - w[k]) * y[k] for k in range(1, cap)))
        for k, bit in enumerate(y, start=1):
            model.add_hint(bit, greedy[i] >= k)
    for v, ys in enumerate(at_endpoint):
        if ys:
            model.add(sum(ys) <= pairs.deg[v])
    model.maximize(len(cands) * sum(served) - worst)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = 2
    started = time.perf_counter()
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise AllocationSolverError(
            f"CP-SAT returned {solver.status_name(status)} after "
            f"{time.perf_counter() - started:.1f} s on {len(pairs.keys)} pairs "
            f"(time_limit_s={time_limit_s}); raise time_limit_s or use method 'greedy'"
        )
    count = [sum(solver.boolean_value(bit) for bit in y) for y in bits]
    _greedy_fill(pairs, count, _free_after(pairs, count), problem.bipartite_tiebreak)
    return _result("optimal", pairs, count)


def _free_after(pairs: _Pairs, count: list[int]) -> list[int]:
    """Ports still free at each endpoint once ``count`` circuits are placed."""
    free = list(pairs.deg)
    for i, c in enumerate(count):
        free[pairs.a[i]] -= c
        free[pairs.b[i]] -= c
    return free


def allocate(problem: AllocationProblem, method: str = "greedy", **kw: Any) -> Allocation:
    """Return the allocation of ``problem`` by the named method (``METHODS``).

    Parameters
    ----------
    problem : AllocationProblem
    method : {"greedy", "uniform", "optimal"}
    **kw
        Options of the method; only ``optimal`` takes one (``time_limit_s``).

    Raises
    ------
    ConfigError
        For an unknown method or an option the method does not take.

    Notes
    -----
    Dispatch only; the complexity is that of the chosen method.

    Examples
    --------
    >>> p = AllocationProblem(1e9, {"a": 1, "b": 1}, {("a", "b"): 1e9})
    >>> allocate(p, "uniform").circuits
    {('a', 'b'): 1}
    """
    funcs = {"greedy": allocate_greedy, "uniform": allocate_uniform, "optimal": allocate_optimal}
    if method not in funcs:
        raise ConfigError("allocate", "method", f"unknown method {method!r}", ", ".join(METHODS))
    accepted = {"optimal": {"time_limit_s"}}.get(method, set())
    for name in kw:
        if name not in accepted:
            allowed = ", ".join(sorted(accepted)) or "no options"
            raise ConfigError("allocate", name, f"not an option of method {method!r}", allowed)
    return funcs[method](problem, **kw)


# ----------------------------------------------------------------------------- JSON contract

_TOP_KEYS = ("link_bps", "endpoints", "demand", "eligible", "bipartite_tiebreak")
_DEMAND_KEYS = ("src", "dst", "bytes")


def _is_number(x: Any) -> bool:
    """True for a finite int or float; bools are refused although Python counts them as ints."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _endpoint_ref(x: Any, names: Mapping[str, int], source: str, field: str) -> str:
    """Check that ``x`` names a declared endpoint and return it."""
    if not isinstance(x, str) or x not in names:
        raise ConfigError(source, field, f"{x!r} is not a declared endpoint", "keys of endpoints")
    return x


def problem_from_json(doc: dict, source: str = "<input>") -> AllocationProblem:
    """Return the :class:`AllocationProblem` described by a parsed JSON document.

    Parameters
    ----------
    doc : dict
        ``{"link_bps": float, "endpoints": {name: ports}, "demand": [{"src", "dst", "bytes"}],
        "eligible": [[a, b], ...] (optional, default: every demanded pair),
        "bipartite_tiebreak": bool (optional)}``.
    source : str
        Name of the input used in error messages (the file path for the CLI).

    Raises
    ------
    ConfigError
        Naming ``source`` and the field path (``demand[3].bytes``, ``endpoints.tor7``) for a
        missing or unknown key, a non-numeric, negative or non-finite number, ``link_bps <= 0``,
        a demand with ``src == dst`` or an undeclared endpoint, a repeated ``(src, dst)`` demand,
        or an eligible entry that is not two distinct declared endpoints.

    Notes
    -----
    O(V + D + E) for the document's endpoints, demands and eligible entries.

    Examples
    --------
    >>> p = problem_from_json({"link_bps": 1e9, "endpoints": {"a": 1, "b": 2},
    ...                        "demand": [{"src": "a", "dst": "b", "bytes": 5e8}]})
    >>> p.demand
    {('a', 'b'): 500000000.0}
    """
    if not isinstance(doc, dict):
        raise ConfigError(source, "(document)", f"is a {type(doc).__name__}", "a JSON object")
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(source, str(key), "unknown key", ", ".join(_TOP_KEYS))
    for key in ("link_bps", "endpoints", "demand"):
        if key not in doc:
            raise ConfigError(source, key, "missing", "required key")
    link_bps = doc["link_bps"]
    if not _is_number(link_bps) or link_bps <= 0:
        raise ConfigError(source, "link_bps", f"got {link_bps!r}", "a finite number > 0")

    endpoints = doc["endpoints"]
    if not isinstance(endpoints, dict):
        raise ConfigError(source, "endpoints", "not an object", "{name: allocatable_ports}")
    for name, deg in endpoints.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(source, "endpoints", f"name {name!r}", "non-empty strings")
        if not isinstance(deg, int) or isinstance(deg, bool) or deg < 0:
            raise ConfigError(source, f"endpoints.{name}", f"got {deg!r}", "an integer >= 0")

    if not isinstance(doc["demand"], list):
        raise ConfigError(source, "demand", "not a list", '[{"src", "dst", "bytes"}, ...]')
    demand: dict[tuple[str, str], float] = {}
    first_seen: dict[tuple[str, str], int] = {}
    for n, entry in enumerate(doc["demand"]):
        at = f"demand[{n}]"
        if not isinstance(entry, dict):
            raise ConfigError(source, at, "not an object", '{"src", "dst", "bytes"}')
        for key in entry:
            if key not in _DEMAND_KEYS:
                raise ConfigError(source, f"{at}.{key}", "unknown key", ", ".join(_DEMAND_KEYS))
        for key in _DEMAND_KEYS:
            if key not in entry:
                raise ConfigError(source, f"{at}.{key}", "missing", "required key")
        src = _endpoint_ref(entry["src"], endpoints, source, f"{at}.src")
        dst = _endpoint_ref(entry["dst"], endpoints, source, f"{at}.dst")
        if src == dst:
            raise ConfigError(source, f"{at}.dst", f"equals src {src!r}", "a different endpoint")
        nbytes = entry["bytes"]
        if not _is_number(nbytes) or nbytes < 0:
            raise ConfigError(source, f"{at}.bytes", f"got {nbytes!r}", "a finite number >= 0")
        if (src, dst) in first_seen:
            raise ConfigError(
                source, at, f"repeats ({src!r} -> {dst!r}) of demand[{first_seen[(src, dst)]}]",
                "one entry per (src, dst); sum their bytes",
            )
        first_seen[(src, dst)] = n
        demand[(src, dst)] = float(nbytes)

    eligible = None
    if doc.get("eligible") is not None:
        if not isinstance(doc["eligible"], list):
            raise ConfigError(source, "eligible", "not a list", "[[a, b], ...] or omit the key")
        pairs = set()
        for n, entry in enumerate(doc["eligible"]):
            at = f"eligible[{n}]"
            if not isinstance(entry, list) or len(entry) != 2:
                raise ConfigError(source, at, f"got {entry!r}", "a list [a, b] of 2 endpoints")
            a = _endpoint_ref(entry[0], endpoints, source, f"{at}[0]")
            b = _endpoint_ref(entry[1], endpoints, source, f"{at}[1]")
            if a == b:
                raise ConfigError(source, at, f"names {a!r} twice", "two distinct endpoints")
            pairs.add(frozenset((a, b)))
        eligible = frozenset(pairs)

    tiebreak = doc.get("bipartite_tiebreak", False)
    if not isinstance(tiebreak, bool):
        raise ConfigError(source, "bipartite_tiebreak", f"got {tiebreak!r}", "true or false")
    return AllocationProblem(
        link_bps=float(link_bps),
        ports=dict(endpoints),
        demand=demand,
        eligible=eligible,
        bipartite_tiebreak=tiebreak,
    )


def allocation_to_json(alloc: Allocation) -> dict:
    """Return the JSON-ready document of an allocation (the CLI's output contract).

    Lists are sorted by ``(a, b)``.  An unserved pair's infinite time is written as ``null``
    (JSON has no infinity); those pairs are also listed under ``"unserved"``.

    Notes
    -----
    O(P log P) for P reported pairs.

    Examples
    --------
    >>> alloc = Allocation("greedy", {("a", "b"): 1}, {("a", "b"): 0.5, ("a", "c"): math.inf},
    ...                    0.5, (("a", "c"),))
    >>> allocation_to_json(alloc)["pair_time_s"]
    [{'a': 'a', 'b': 'b', 'time_s': 0.5}, {'a': 'a', 'b': 'c', 'time_s': None}]
    """
    return {
        "method": alloc.method,
        "circuits": [{"a": a, "b": b, "count": c} for (a, b), c in sorted(alloc.circuits.items())],
        "pair_time_s": [
            {"a": a, "b": b, "time_s": t if math.isfinite(t) else None}
            for (a, b), t in sorted(alloc.pair_time_s.items())
        ],
        "max_pair_time_s": alloc.max_pair_time_s,
        "unserved": [[a, b] for a, b in sorted(alloc.unserved)],
    }
