"""``greedy+ls``: Algorithm 3 with a repair of *which* pairs get circuits under port starvation.

Design note
-----------
Algorithm 3 gives every demanded pair its first circuit before any pair gets a second one (an
unserved pair's time is +inf), heaviest pair first.  That order decides everything:

- Given the set S of served pairs, the multiplicity phase is exact: when the worst pair W stops
  at a full endpoint v, every other pair at v holds either its one circuit or extra circuits it
  got while it was at least as slow as W ends up, so no allocation serving S beats W's time.
- When every endpoint has at least as many ports as demanded pairs, S is every pair, hence
  greedy is optimal there.  Under port starvation S is a heaviest-first *maximal* b-matching,
  which can serve far fewer pairs than possible (a greedy b-matching only guarantees half).

So all of greedy's distance to the lexicographic optimum (most pairs served, then the smallest
worst pair time) lies in the choice of S.  ``greedy+ls`` keeps Algorithm 3 for everything else
and repairs S with two local moves on alternating trails (unserved pair in, served pair out,
...), each checked against the port budget before it is applied:

1. *augment*: a trail that starts and ends at endpoints with a free port serves one pair more.
   Rounds of DFS from every such endpoint, marks kept for the whole round (as Hopcroft-Karp
   does), each trail dropping the lightest served pairs it can; then a few slower BFS searches
   that mark fewer endpoints and find trails the rounds' marks hid.  On a bipartite demand
   graph (ToR-uplink access, Core-Agg lift/drop) a round that finds nothing has searched the
   whole residual flow network, so the count is then the maximum; on general graphs an odd
   cycle (a blossom) can still hide a trail, and fixed budgets bound the work on very large
   starved instances.
2. *relieve*: while the worst served pair W is blocked at a full endpoint, a count-neutral trail
   drops a lighter single-circuit pair there and serves another pair elsewhere; the move is kept
   only if Algorithm 3's multiplicity phase then gives a strictly smaller worst time.  It never
   drops W, a pair at least as slow as W, or a pair holding extra circuits.

The CP-SAT reference may reach a smaller worst *served* time by leaving the heaviest pairs
unserved (they then do not count); ``relieve`` deliberately does not do that.  When greedy
serves every pair the result is greedy's, relabelled: it is already optimal.
"""

from __future__ import annotations

from collections import deque

from orchestrl.fabric.allocation import Allocation, AllocationProblem, _compile, _greedy_fill, _Pairs, _result

__all__ = ["allocate_greedy_ls"]

_Incidence = list[list[tuple[int, int]]]  # endpoint -> [(pair index, other endpoint)]

_MAX_AUGMENT_ROUNDS = 64  # DFS rounds, each O(V + P): bounds the time on very large starved instances
_MAX_THOROUGH_SEARCHES = 16  # BFS searches after the rounds, each O(sum of (pairs at an endpoint)^2)
_MAX_RELIEF_TRIES = 32  # relief searches, each one BFS (plus a multiplicity phase per trial)


def _incidence(pairs: _Pairs) -> _Incidence:
    """(pair, other endpoint) at each endpoint, lightest pair first: trails strand light pairs."""
    inc: _Incidence = [[] for _ in pairs.names]
    for i in sorted(range(len(pairs.keys)), key=lambda i: (pairs.maxdir[i], i)):
        inc[pairs.a[i]].append((i, pairs.b[i]))
        inc[pairs.b[i]].append((i, pairs.a[i]))
    return inc


def _feasible(pairs: _Pairs, served: list[bool], free: list[int], trail: list[int]) -> dict[int, int] | None:
    """Port changes per endpoint if toggling ``trail`` keeps every budget, else None."""
    if len(set(trail)) != len(trail):
        return None
    delta: dict[int, int] = {}
    for i in trail:
        step = 1 if served[i] else -1  # dropping frees a port at both ends, adding takes one
        for v in (pairs.a[i], pairs.b[i]):
            delta[v] = delta.get(v, 0) + step
    return None if any(free[v] + d < 0 for v, d in delta.items()) else delta


def _flip(pairs: _Pairs, served: list[bool], free: list[int], trail: list[int]) -> bool:
    """Toggle the pairs of ``trail`` in place if that keeps every port budget; say whether it did."""
    delta = _feasible(pairs, served, free, trail)
    if delta is None:
        return False
    for i in trail:
        served[i] = not served[i]
    for v, d in delta.items():
        free[v] += d
    return True


def _augment(pairs: _Pairs, inc: _Incidence, served: list[bool], free: list[int]) -> int:
    """Serve more pairs along augmenting trails (one round); return how many were added.

    From every unserved pair (s, t) with a free port at s, DFS over alternating steps: a *needy*
    endpoint x (t first) drops a served pair (x, w), then w takes an unserved pair (w, y); the
    trail ends at a y with a free port.  Marks last the whole round (each endpoint is expanded
    at most once as needy and once as w), so a round is O(V + P) however many trails it finds;
    each trail is checked against the port budget before it is applied.  A round that finds
    nothing has searched every alternating trail reachable without revisiting an endpoint in
    the same role, which on a bipartite demand graph means the served count is the maximum.
    """
    needy: set[int] = set()
    grown: set[int] = set()

    def steps(x: int, in_trail: set[int]):
        for dropped, w in inc[x]:
            if not served[dropped] or dropped in in_trail or w in grown:
                continue
            grown.add(w)
            for added, y in inc[w]:
                if not served[added] and added not in in_trail and y not in needy:
                    yield dropped, added, y

    gained = 0
    for s in range(len(pairs.names)):
        for first, t in inc[s]:
            if free[s] == 0:
                break
            if served[first] or t in needy:
                continue
            trail, in_trail = [first], {first}
            if free[t] > 0 and _flip(pairs, served, free, trail):
                gained += 1
                continue
            needy.add(t)
            stack = [steps(t, in_trail)]
            while stack:
                step = next(stack[-1], None)
                if step is None:  # dead end: back up one step
                    stack.pop()
                    if stack:
                        in_trail.difference_update(trail[-2:])
                        del trail[-2:]
                    continue
                trail.extend(step[:2])
                in_trail.update(step[:2])
                y = step[2]
                needy.add(y)
                if free[y] > 0 and _flip(pairs, served, free, trail):
                    gained += 1
                    break
                stack.append(steps(y, in_trail))
    return gained


def _path(parent: dict[int, tuple[int | None, int | None, int]], y: int) -> list[int]:
    """Pairs of the BFS trail that reached ``y``: each step added one pair and maybe dropped one."""
    out: list[int] = []
    node: int | None = y
    while node is not None:
        node, dropped, added = parent[node]
        out.append(added)
        if dropped is not None:
            out.append(dropped)
    return out


def _augmenting_trail(pairs: _Pairs, inc: _Incidence, served: list[bool], free: list[int]) -> list[int] | None:
    """Return one augmenting trail found by a thorough BFS, or None.

    The same steps as :func:`_augment`, but only needy endpoints are marked, so an endpoint
    can be reached again as the far end of another dropped pair, with another trail behind it:
    slower, O(sum over endpoints of (pairs there)^2), and it finds the trails that a round's
    marks hide on non-bipartite graphs.
    """
    parent: dict[int, tuple[int | None, int | None, int]] = {}
    queue: deque[int] = deque()
    for s in range(len(pairs.names)):
        for first, t in inc[s]:
            if free[s] == 0 or served[first] or t in parent:
                continue
            parent[t] = (None, None, first)
            if free[t] > 0 and _feasible(pairs, served, free, [first]) is not None:
                return [first]
            queue.append(t)
    while queue:
        x = queue.popleft()
        used = set(_path(parent, x))
        for dropped, w in inc[x]:
            if not served[dropped] or dropped in used:
                continue
            for added, y in inc[w]:
                if served[added] or added in used or y in parent:
                    continue
                parent[y] = (x, dropped, added)
                if free[y] > 0 and _feasible(pairs, served, free, trail := _path(parent, y)) is not None:
                    return trail
                queue.append(y)
    return None


def _relief_trail(pairs: _Pairs, inc: _Incidence, served: list[bool], free: list[int], starts: list[int],
                  v: int, keep: set[int], droppable: list[bool]) -> list[int] | None:
    """Return a count-neutral trail that drops one of ``starts`` (pairs at ``v``), freeing a port at v.

    From w, the other end of the dropped pair, which gains a port, BFS alternates: serve an
    unserved pair (w, y); if y has a free port and is not in ``keep`` the trail closes, else drop
    a droppable pair (y, z) and go on from z.  None if no trail is found.  O(V + P) per call.
    """
    frontier: deque[tuple[int, list[int]]] = deque()
    seen = {v}
    for first in starts:
        w = pairs.b[first] if pairs.a[first] == v else pairs.a[first]
        if served[first] and w not in seen:
            seen.add(w)
            frontier.append((w, [first]))
    needy_done: set[int] = set()
    while frontier:
        w, trail = frontier.popleft()
        for added, y in inc[w]:
            if served[added] or added in trail or y == v:
                continue
            if free[y] > 0 and y not in keep:
                candidate = trail + [added]
                if _feasible(pairs, served, free, candidate) is not None:
                    return candidate
                continue
            if y in needy_done:
                continue
            needy_done.add(y)
            for dropped, z in inc[y]:
                if droppable[dropped] and served[dropped] and dropped not in trail and z not in seen:
                    seen.add(z)
                    frontier.append((z, trail + [added, dropped]))
    return None


def _fill(pairs: _Pairs, served: list[bool], free: list[int], tiebreak: bool) -> tuple[list[int], list[int]]:
    """Algorithm 3's multiplicity phase from the served set: (circuits per pair, free ports)."""
    count = [1 if s else 0 for s in served]
    left = list(free)
    _greedy_fill(pairs, count, left, tiebreak)
    return count, left


def _worst(pairs: _Pairs, count: list[int]) -> tuple[float, int]:
    """(worst served Eq. 7 time in bytes / (bytes/s) units, its pair index); (0, -1) if none."""
    best = (0.0, -1)
    for i, c in enumerate(count):
        if c and pairs.maxdir[i] / c > best[0]:
            best = (pairs.maxdir[i] / c, i)
    return best


def allocate_greedy_ls(problem: AllocationProblem) -> Allocation:
    """Return Algorithm 3's allocation with its served-pair set repaired by local search.

    Parameters
    ----------
    problem : AllocationProblem

    Returns
    -------
    Allocation
        ``method == "greedy+ls"``.  The same circuits as
        :func:`~fabric.allocation.allocate_greedy` whenever greedy serves every demanded pair;
        otherwise at least as many served pairs as greedy (the maximum on bipartite demand
        graphs, unless the round limit stops it first) and circuits spread over them by
        Algorithm 3.  Maximal, like greedy: no demanded pair keeps a free port at both ends.

    Notes
    -----
    One greedy run, O((P + K) log P) for P demanded pairs and K circuits, is all it costs when
    greedy serves every pair.  Otherwise: at most 64 augmenting rounds, O(V + P) each; at most
    16 thorough searches, O(sum over endpoints of (pairs there)^2) each; at most 32 relief
    searches, O(V + P) each, each followed by one multiplicity phase, O((P + K) log P).  See the
    module's design note for why only the served set is searched.

    Examples
    --------
    A path a-b-c-d with one port everywhere: greedy serves the heavy middle pair only; the
    repair swaps it for the two outer pairs.

    >>> from orchestrl.fabric.allocation import allocate_greedy
    >>> p = AllocationProblem(8e9, {"a": 1, "b": 1, "c": 1, "d": 1},
    ...                       {("a", "b"): 1e9, ("b", "c"): 9e9, ("c", "d"): 1e9})
    >>> allocate_greedy(p).circuits
    {('b', 'c'): 1}
    >>> allocate_greedy_ls(p).circuits
    {('a', 'b'): 1, ('c', 'd'): 1}
    """
    pairs = _compile(problem)
    tiebreak = problem.bipartite_tiebreak
    greedy = [0] * len(pairs.keys)
    _greedy_fill(pairs, greedy, list(pairs.deg), tiebreak)
    served = [c > 0 for c in greedy]
    if all(served):
        return _result("greedy+ls", pairs, greedy)  # every pair served: greedy is optimal
    free = list(pairs.deg)
    for i, is_served in enumerate(served):
        if is_served:
            free[pairs.a[i]] -= 1
            free[pairs.b[i]] -= 1
    inc = _incidence(pairs)
    for _ in range(_MAX_AUGMENT_ROUNDS):  # cheap rounds do the bulk of the work
        if not _augment(pairs, inc, served, free):
            break
    for _ in range(_MAX_THOROUGH_SEARCHES):  # then the trails their marks hid, one at a time
        trail = _augmenting_trail(pairs, inc, served, free)
        if trail is None:
            break
        _flip(pairs, served, free, trail)
    return _result("greedy+ls", pairs, _relieve_bottleneck(pairs, inc, served, free, tiebreak))


def _relieve_bottleneck(pairs: _Pairs, inc: _Incidence, served: list[bool], free: list[int],
                        tiebreak: bool) -> list[int]:
    """Fill the served set with Algorithm 3, then try relief moves at the worst pair; return counts."""
    count, left = _fill(pairs, served, free, tiebreak)
    budget = _MAX_RELIEF_TRIES
    while budget > 0:
        worst_t, w = _worst(pairs, count)
        if w < 0:
            break
        ends = (pairs.a[w], pairs.b[w])
        if all(f == 0 or v in ends for v, f in enumerate(free)):
            break  # a relief trail must end at a free port away from W: there is none
        droppable = [c == 1 and i != w and pairs.maxdir[i] < worst_t for i, c in enumerate(count)]
        blocked = [v for v in ends if left[v] == 0]  # Algorithm 3 stops: at least one
        improved = False
        for first in [i for i, _ in inc[blocked[0]] if droppable[i]]:
            if budget <= 0:
                break
            trial_served, trial_free = list(served), list(free)
            for k, v in enumerate(blocked):  # free a port at each blocked end of W
                budget -= 1
                starts = [first] if k == 0 else [i for i, _ in inc[v] if droppable[i]]
                trail = _relief_trail(pairs, inc, trial_served, trial_free, starts, v, set(ends), droppable)
                if trail is None or not _flip(pairs, trial_served, trial_free, trail):
                    break
            else:
                trial_count, trial_left = _fill(pairs, trial_served, trial_free, tiebreak)
                if _worst(pairs, trial_count)[0] < worst_t:
                    served, free, count, left = trial_served, trial_free, trial_count, trial_left
                    improved = True
                    break
        if not improved:
            break
    return count
