"""Circuit allocation on OCS-eligible endpoint pairs (OrchestrRL Appendix D).

One abstraction serves both OCS tiers: for OCS-Core the endpoints are PoDs, for OCS-Agg they
are one PoD's ToRs plus its boundary-uplink endpoints.  Given a sparse directed byte demand
``D[u->v]`` and ``deg(v)`` allocatable ports per endpoint, we choose integer multiplicities
``c_uv = c_vu`` of full-duplex circuits (line rate ``link_bps`` each way) under the port budget
``sum_u c_uv <= deg(v)`` (Eq. 6), only on eligible pairs.

Design note
-----------
A pair's completion-time proxy (Eq. 7) is ``max(D_uv, D_vu) / (c_uv * B)``, infinite while a
demanded pair has no circuit.  Four allocators share that score and one result type:

- ``greedy``  - Algorithm 3 as written: add one circuit at a time to the pair with the largest
  proxy.  A pair's score only changes when *it* gets a circuit, so a heap with lazy deletion of
  pairs whose endpoint ran out of ports reproduces the paper's ``argmax`` exactly in
  O((P + K) log P) instead of O(K * P).
- ``greedy+ls`` - Algorithm 3 with a local-search repair of which pairs get a first circuit
  under port starvation (:mod:`fabric.allocation_ls`); greedy's result whenever greedy serves
  every pair.
- ``uniform`` - the Appendix I baseline that ignores volumes and spreads ports round-robin.
- ``optimal`` - a CP-SAT reference that is lexicographically optimal (most pairs served, then
  the smallest worst pair time).  The worst time is always one of the finitely many values
  ``maxdir / (k * B)``, so the model minimises the *rank* of that value; this keeps the model
  linear and exact, with no time quantisation and no big-domain products.

Everything here is pure: dataclasses in, dataclasses out.  ``greedy+ls`` lives in
:mod:`fabric.allocation_ls`, the CP-SAT reference in :mod:`fabric.allocator_exact`, the JSON
contract in :mod:`fabric.allocator_json`, and :mod:`fabric.allocator` is the one import site
that puts them together (no module here imports it back).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrl.fabric.errors import ConfigError, OrchestrlError

__all__ = ["METHODS", "AllocationProblem", "Allocation", "AllocationSolverError", "pair_time_s",
           "allocate_greedy", "allocate_uniform"]

METHODS = ("greedy", "greedy+ls", "uniform", "optimal")

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

    method: str  # "greedy" | "greedy+ls" | "uniform" | "optimal": who produced it
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
        Line rate of one circuit in each direction, in bits per second (demands are bytes).

    Returns
    -------
    float
        ``8 * max(demand_uv, demand_vu) / (circuits * link_bps)`` (bytes over bits/s); ``inf``
        for a demanded pair with no circuit; ``0.0`` for an idle pair.

    Raises
    ------
    ValueError
        If ``circuits`` is negative or ``link_bps`` is not positive.

    Notes
    -----
    O(1).  Full-duplex circuits carry both directions at once, so only the larger one counts.

    Examples
    --------
    >>> pair_time_s(8e9, 2e9, 2, 1e9)  # 64 Gbit over 2 x 1 Gbps
    32.0
    >>> pair_time_s(1.0, 0.0, 0, 1e9)
    inf
    """
    if circuits < 0 or link_bps <= 0:
        raise ValueError(f"need circuits >= 0 and link_bps > 0, got {circuits}, {link_bps}")
    if demand_uv + demand_vu <= 0:
        return 0.0
    if circuits == 0:
        return math.inf
    return 8.0 * max(demand_uv, demand_vu) / (circuits * link_bps)


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
    bytes_per_s: float  # one circuit's line rate in bytes/s (link_bps / 8): demands are bytes


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
        bytes_per_s=float(problem.link_bps) / 8.0,
    )


def _result(method: str, pairs: _Pairs, count: list[int]) -> Allocation:
    """Package per-pair circuit counts as an :class:`Allocation` with Eq. 7 times."""
    times = {
        k: pair_time_s(pairs.d_ab[i], pairs.d_ba[i], count[i], pairs.bytes_per_s * 8.0)
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
    bps = pairs.bytes_per_s
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
    greedy serves the heaviest pairs first, not the most pairs: ``greedy+ls``
    (:mod:`fabric.allocation_ls`) repairs that choice.

    Examples
    --------
    >>> p = AllocationProblem(8e9, {"a": 3, "b": 3, "c": 1},
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
    >>> p = AllocationProblem(8e9, {"a": 3, "b": 3, "c": 1},
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
