"""Exact reference allocators for Appendix D: CP-SAT and a pure-Python min-max check.

Kept apart from :mod:`fabric.allocation` (and re-exported by :mod:`fabric.allocator`) because it is the
only part that needs OR-Tools and is meant for small and medium instances only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from orchestrl.fabric.allocation import (Allocation, AllocationProblem, AllocationSolverError, _compile, _greedy_fill,
                               _Pairs, _result)
from orchestrl.fabric.errors import ConfigError

__all__ = ["allocate_optimal", "solve_optimal", "OptimalSolve", "exact_min_max_time_s"]


@dataclass(frozen=True)
class OptimalSolve:
    """A CP-SAT reference allocation and whether the solver proved it optimal."""

    allocation: Allocation
    proven: bool  # False: the time limit expired first, so it is only an upper bound
    solve_s: float  # wall time of the CP-SAT solve alone (model building excluded)


def _circuit_caps(pairs: _Pairs) -> list[int]:
    """Most circuits each pair could ever use: both endpoints' whole budgets bound it."""
    return [min(pairs.deg[a], pairs.deg[b]) for a, b in zip(pairs.a, pairs.b)]


def _candidate_times(pairs: _Pairs, caps: list[int]) -> list[float]:
    """Every pair time some allocation can produce, ascending; the optimum is one of them."""
    bps = pairs.bytes_per_s
    return sorted({m / (k * bps) for m, cap in zip(pairs.maxdir, caps) for k in range(1, cap + 1)})


def exact_min_max_time_s(problem: AllocationProblem) -> float | None:
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
    bps = pairs.bytes_per_s
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
    >>> p = AllocationProblem(8e9, {"a": 3, "b": 3, "c": 1},
    ...                       {("a", "b"): 4e9, ("b", "a"): 1e9, ("a", "c"): 1e9})
    >>> allocate_optimal(p).max_pair_time_s
    2.0
    """
    return solve_optimal(problem, time_limit_s=time_limit_s).allocation


def solve_optimal(problem: AllocationProblem, *, time_limit_s: float = 30.0) -> OptimalSolve:
    """Return :func:`allocate_optimal`'s allocation with the solver's proof status and time.

    Benchmarks need to know which references are proven optimal (and leave out the rest);
    parameters, errors and model are those of :func:`allocate_optimal`.

    Notes
    -----
    As :func:`allocate_optimal`.

    Examples
    --------
    >>> p = AllocationProblem(8e9, {"a": 1, "b": 1}, {("a", "b"): 1e9})
    >>> solve_optimal(p).proven
    True
    """
    from ortools.sat.python import cp_model  # heavy import, only for the reference solver

    if isinstance(time_limit_s, bool) or not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
        raise ConfigError("allocate_optimal", "time_limit_s", f"got {time_limit_s!r}", "> 0")
    pairs = _compile(problem)
    caps = _circuit_caps(pairs)
    greedy = [0] * len(pairs.keys)
    _greedy_fill(pairs, greedy, list(pairs.deg), problem.bipartite_tiebreak)
    bps = pairs.bytes_per_s
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
    solve_s = time.perf_counter() - started
    count = [sum(solver.boolean_value(bit) for bit in y) for y in bits]
    _greedy_fill(pairs, count, _free_after(pairs, count), problem.bipartite_tiebreak)
    return OptimalSolve(_result("optimal", pairs, count), status == cp_model.OPTIMAL, solve_s)


def _free_after(pairs: _Pairs, count: list[int]) -> list[int]:
    """Ports still free at each endpoint once ``count`` circuits are placed."""
    free = list(pairs.deg)
    for i, c in enumerate(count):
        free[pairs.a[i]] -= c
        free[pairs.b[i]] -= c
    return free
