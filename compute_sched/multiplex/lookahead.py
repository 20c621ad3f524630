"""Look-ahead scheduling of co-located sub-stages (JigsawRL §4.4): window search, greedy and exhaustive.

Design note
-----------
A worker (one DP rank's GPUs) hosts the chains of two pipelines (:class:`Task` lists, from the
sub-stage graph). At each scheduling point the frontier is the chains' ready heads; an
:class:`Action` runs one head alone, or both under an SM split ``sigma`` (25/50/75%) and a memory
split (levels 20-80%, the other gets the rest), until the first running head ends or a waiting head
becomes ready. Slowdowns come from the :class:`~compute_sched.multiplex.grid.SlowdownModel`.

Memory is a hard constraint, never a cost: a rollout's KV pool is sized when its first sub-stage
starts and held -- running or waiting, through its tool calls -- until its last sub-stage ends
(``sticky`` groups; §4.2 reconfigures the pool only every ~30 steps); training and reference change
their micro-batch, so their level is chosen per action. An action is offered only if every running
task gets at least its ``mem_min_pct`` and the levels held add up to at most 100% of the budget.

Policies (:class:`Scheduler`):

* ``greedy`` (W = 1): the action with the smallest cost (below) after it;
* ``lookahead`` (W = 3, the paper's default): sequences of W actions, the first action of the best;
  the cost of a window is its critical path -- the latest finish over the chains, counting what the
  window did not schedule at its alone time (a lower bound) -- plus :data:`PROGRESS_WEIGHT` times
  the chains' summed finish times (the paper's cost is the critical path alone; without the sum a
  chain off this worker's critical path is deferred for free even where it holds a barrier every
  other worker waits on). Below the first action only the
  ``beam`` (default 4) most promising actions are expanded (``beam=None``: every sequence), which
  keeps a decision near a millisecond;
* :meth:`Scheduler.schedule` compares the look-ahead plan (and a wider and a deeper one) with the
  greedy plan of the same instance and keeps the shortest ("fortified" rollout, Bertsekas 1997), so
  it is never worse than greedy;
* :meth:`Scheduler.optimum`: exhaustive search with memoisation, the quality reference on small
  instances.

Complexity: ``decide`` applies ``A + beam A + beam^2 A`` actions (``A`` <= 3 x 4 + 4; every ``A^W``
sequence with ``beam=None``), memoised on the state; a plan makes one decision per event, about twice
the tasks.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence

from orchestrl.compute_sched.multiplex.grid import IDLE, KINDS, MEM_LEVELS_PCT, MEMORY_BUDGET_PCT, SlowdownModel
from orchestrl.fabric.errors import ConfigError

__all__ = ["Task", "Action", "Step", "Plan", "WorkerState", "Scheduler", "SM_SPLITS", "MEMORY_BUDGET_PCT",
           "PROGRESS_WEIGHT"]

SM_SPLITS = (0.25, 0.5, 0.75)  # sigma of the first chain when two run (§4.2's budgets)
#: weight of the chains' summed finish times (each chain's rest at its alone time) in a window's cost, beside its
#: critical path: a worker's window sees only its own chains, so a chain off this worker's critical path looks free
#: to defer even where its replica holds the pipeline's cross-worker barrier (every other worker then waits on it;
#: a two-step Qwen3-4B/AIME + Qwen3-0.6B/GSM8K run left the short pipeline unrun on one worker for 160 s). Set on
#: trace seeds 3-5 of Fig. 12 and Fig. 16's pair (0, 0.25, 0.5, 1; 0.5 within 0.02% of the best mean for both
#: layouts that share workers and the best worst case, 0.4% below none; 0.25's was 2.1% below) and checked on seeds 0-2; docs/jigsaw.md ("Scheduling") gives the numbers.
PROGRESS_WEIGHT = 0.5
_EPS = 1e-9


@dataclass(frozen=True)
class Task:
    """One sub-stage in a worker's chain: its kind, alone time, memory floor and memory group."""

    kind: str
    work_s: float
    mem_min_pct: float = 20.0
    sticky: str | None = None  # memory group held from its first task to its last (a rollout's KV pool)
    ready_s: float = 0.0  # earliest start (a barrier: every replica's rollout done)
    label: str = ""

    def __post_init__(self) -> None:
        what = f"task {self.label or self.kind!r}"
        if self.kind not in KINDS and self.kind != IDLE:
            raise ConfigError("lookahead", f"{what}: kind", f"{self.kind!r} is not a sub-stage kind",
                              ", ".join(KINDS + (IDLE,)))
        for fld, v, lo, hi in (("work_s", self.work_s, 0.0, math.inf), ("mem_min_pct", self.mem_min_pct, 0.0, 100.0),
                               ("ready_s", self.ready_s, 0.0, math.inf)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not lo <= v <= hi:
                raise ConfigError("lookahead", f"{what}: {fld}", f"{v!r}",
                                  f"a finite number in [{lo:g}, {hi:g}]" if math.isfinite(hi) else "a finite number >= 0")


@dataclass(frozen=True)
class Action:
    """What runs on the worker until the next event: ``run[c]`` for chain ``c``, chain 0's SM share and memory."""

    run: tuple[bool, ...]
    sm0: float = 1.0
    mem: tuple[float, ...] = ()  # memory level of each chain (held or running)


@dataclass(frozen=True)
class Step:
    action: Action
    start_s: float
    end_s: float
    kinds: tuple[str | None, ...]  # head kind of each chain while it ran (None: not running)
    slowdowns: tuple[float, ...]


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    finish_s: tuple[float, ...] = ()  # each chain's finish time
    policy: str = ""

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s, default=0.0)

    @property
    def total_s(self) -> float:
        return sum(self.finish_s)


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker's chains and how far each has come (the state the search moves through)."""

    chains: tuple[tuple[Task, ...], ...]
    t: float = 0.0
    idx: tuple[int, ...] = ()  # head index of each chain
    rem: tuple[float, ...] = ()  # head's remaining alone work
    held: tuple[float, ...] = ()  # memory level held by each chain's sticky group (0: none)
    finish: tuple[float, ...] = ()

    @staticmethod
    def start(chains: Sequence[Sequence[Task]], t: float = 0.0) -> "WorkerState":
        if not 1 <= len(chains) <= 2:
            raise ConfigError("lookahead", "chains", f"{len(chains)} chains on one worker", "1 or 2 pipelines")
        cs = tuple(tuple(c) for c in chains)
        return WorkerState(cs, t, tuple(0 for _ in cs), tuple(c[0].work_s if c else 0.0 for c in cs),
                           tuple(0.0 for _ in cs), tuple(t if not c else math.inf for c in cs))

    def head(self, c: int) -> Task | None:
        i = self.idx[c]
        return self.chains[c][i] if i < len(self.chains[c]) else None

    @property
    def done(self) -> bool:
        return all(self.head(c) is None for c in range(len(self.chains)))

    def key(self) -> tuple:
        return (round(self.t, 6), self.idx, tuple(round(r, 6) for r in self.rem), self.held,
                tuple(round(f, 6) if math.isfinite(f) else f for f in self.finish))


class Scheduler:
    """The §4.4 scheduler over one worker's chains (see the module note).

    Examples
    --------
    Fig. 11's lesson: a rollout's KV pool sized greedily blocks the co-runner's next sub-stage.

    >>> from orchestrl.compute_sched.multiplex.catalog import model_for
    >>> sch = Scheduler(model_for("H100", choice="modelled"))
    >>> a = [Task("decode_large", 4.0, 20, "A:rollout"), Task("decode_small", 4.0, 20, "A:rollout")]
    >>> b = [Task("train", 2.0, 40), Task("train", 4.0, 60)]
    >>> st = WorkerState.start([a, b])
    >>> sch.plan(st, "lookahead").makespan_s <= sch.plan(st, "greedy").makespan_s
    True
    """

    def __init__(self, model: SlowdownModel | Sequence[SlowdownModel], window: int = 3, splits: Sequence[float] = SM_SPLITS,
                 levels: Sequence[float] = MEM_LEVELS_PCT, beam: int | None = 4, small_tasks: int = 6,
                 progress_weight: float = PROGRESS_WEIGHT) -> None:
        if isinstance(progress_weight, bool) or not isinstance(progress_weight, numbers.Real) \
                or not 0 <= progress_weight < math.inf:
            raise ConfigError("lookahead", "progress_weight", f"{progress_weight!r}",
                              "a weight >= 0 on the chains' summed finish times (0: the critical path alone)")
        if window < 1:
            raise ConfigError("lookahead", "window", f"{window}", "an integer >= 1 (W)")
        if beam is not None and beam < 1:
            raise ConfigError("lookahead", "beam", f"{beam}", "None (every sequence) or an integer >= 1")
        if not splits or any(isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0 < x < 1 for x in splits):
            raise ConfigError("lookahead", "splits", f"{list(splits)!r}",
                              "the first chain's SM shares when two run, each in (0, 1), e.g. (0.25, 0.5, 0.75)")
        if not levels or any(isinstance(x, bool) or not isinstance(x, numbers.Real) or not 1 <= x <= MEMORY_BUDGET_PCT
                             for x in levels):
            raise ConfigError("lookahead", "levels", f"{list(levels)!r}",
                              "memory levels in percent of the budget, each in [1, 100], e.g. (20, 40, 60, 80), not 0.2")
        # one model for every chain, or one per chain (chain c's slowdowns from models[c]: pipelines of different
        # models, whose modelled grids differ in their memory axis and compute share)
        self.models = tuple(model) if isinstance(model, (tuple, list)) else None
        if self.models is not None and not self.models:
            raise ConfigError("lookahead", "model", "an empty sequence", "a SlowdownModel, or one per chain")
        self.model = self.models[0] if self.models else model
        self.window, self.beam = window, beam
        self.progress_weight = float(progress_weight)
        self.small_tasks = small_tasks  # instances up to this many sub-stages are planned with a full window
        self.splits, self.levels = tuple(splits), tuple(float(x) for x in levels)
        self._memo: dict = {}
        self._chain_bound: dict = {}  # (id(chain), index, remaining, time) -> (chain, its alone finish)
        self._suffix: dict = {}  # id(chain) -> (chain, work after each index)
        self.decisions = 0

    # -- the state machine ------------------------------------------------------------------------
    def _level_choices(self, st: WorkerState, c: int, cap: float) -> list[float]:
        """Memory levels chain ``c``'s head may run at alone, with ``cap`` left by the others.

        More memory never slows a sub-stage (the memory curves fall with the level), so a head whose
        level is free to change takes the most it can; only a rollout whose KV pool is being sized now
        (a sticky group's first task) has a real choice: the most, or the most that still leaves the
        other chain's next sub-stage its floor (Fig. 11's lesson).
        """
        task = st.head(c)
        if task.sticky is not None and st.held[c] > 0:
            return [st.held[c]] if st.held[c] <= cap + _EPS else []
        lo = task.mem_min_pct if task.kind != IDLE else 0.0
        ok = [x for x in self.levels if lo - _EPS <= x <= cap + _EPS]
        if not ok:
            return []
        if task.sticky is None:
            return [ok[-1]]
        out = {ok[-1]}
        other = 1 - c if len(st.chains) == 2 else None
        if other is not None:
            floors = [t.mem_min_pct for t in st.chains[other][st.idx[other]:st.idx[other] + 3]
                      if t.sticky is None or t.sticky != getattr(st.head(other), "sticky", None) or st.held[other] == 0]
            for f in floors:
                room = [x for x in ok if x + f <= MEMORY_BUDGET_PCT + _EPS]
                if room:
                    out.add(room[-1])
        return sorted(out)

    def _pair_levels(self, st: WorkerState) -> list[tuple[float, float]]:
        """Memory splits of two running heads: all of the budget between them, each at or above its floor.

        An idle head (a tool wait, a barrier's marker) holds only what its sticky group already holds (else
        nothing), and the other head gets the levels it would get alone: splitting the budget with a wait used to
        size a rollout's KV pool at 20% when the planner paired its first task with the other pipeline's marker
        (a prefill, which memory hardly slows, tied across splits), and the pool then stayed small for the whole
        rollout (2.05 s lost in one Llama-3.1-8B step of the `split` layout, which shares nothing)."""
        kinds = [st.head(c).kind for c in range(2)]
        if IDLE in kinds:
            holds = [st.held[c] if st.head(c).sticky is not None and st.held[c] > 0 else 0.0 for c in range(2)]
            if kinds[0] == kinds[1]:
                return [tuple(holds)]  # type: ignore[list-item]
            i = kinds.index(IDLE)
            o = 1 - i
            return [tuple(lvl if c == o else holds[i] for c in range(2))  # type: ignore[misc]
                    for lvl in self._level_choices(st, o, MEMORY_BUDGET_PCT - holds[i])]
        out = []
        for l0 in self.levels:
            l1 = MEMORY_BUDGET_PCT - l0
            ok = True
            for c, lvl in ((0, l0), (1, l1)):
                task = st.head(c)
                if task.sticky is not None and st.held[c] > 0:
                    ok = ok and abs(st.held[c] - lvl) < _EPS
                lo = task.mem_min_pct if task.kind != IDLE else 0.0
                ok = ok and lvl >= lo - _EPS and lvl <= max(self.levels) + _EPS
            if ok:
                out.append((l0, l1))
        if not out:  # both held pools fixed and below the budget: keep them as they are
            h0, h1 = st.held
            if h0 > 0 and h1 > 0 and h0 + h1 <= MEMORY_BUDGET_PCT + _EPS:
                out.append((h0, h1))
        return out

    def actions(self, st: WorkerState) -> list[Action]:
        """Every feasible action at ``st`` (memory never over-committed)."""
        n = len(st.chains)
        ready = [c for c in range(n) if st.head(c) is not None and st.head(c).ready_s <= st.t + _EPS]
        out: list[Action] = []
        for c in ready:  # one alone; the other keeps only what its sticky group holds
            others = sum(st.held[o] for o in range(n) if o != c)
            for lvl in self._level_choices(st, c, MEMORY_BUDGET_PCT - others):
                mem = tuple(lvl if k == c else st.held[k] for k in range(n))
                out.append(Action(tuple(k == c for k in range(n)), 1.0, mem))
        if len(ready) == 2:
            idle = st.head(0).kind == IDLE or st.head(1).kind == IDLE
            for l0, l1 in self._pair_levels(st):
                for s0 in ((0.5,) if idle else self.splits):  # next to an idle head the split is moot
                    out.append(Action((True, True), s0, (l0, l1)))
        return out

    def slowdowns(self, st: WorkerState, a: Action) -> tuple[float, ...]:
        kinds = [st.head(c).kind if a.run[c] else None for c in range(len(st.chains))]
        if all(a.run) and len(kinds) == 2:
            k0, k1 = kinds
            if k0 == IDLE or k1 == IDLE:  # an idle head leaves the GPU to the other
                return (self._m(0).s(k0, IDLE, 1.0, a.mem[0]), self._m(1).s(k1, IDLE, 1.0, a.mem[1]))
            return (self._m(0).s(k0, k1, a.sm0, a.mem[0]), self._m(1).s(k1, k0, 1.0 - a.sm0, a.mem[1]))
        return tuple(self._m(c).s(k, None, 1.0, a.mem[c]) if k is not None else 1.0 for c, k in enumerate(kinds))

    def _m(self, c: int) -> SlowdownModel:
        """Chain ``c``'s slowdown model."""
        if self.models is None:
            return self.model
        if c >= len(self.models):
            raise ConfigError("lookahead", "model", f"{len(self.models)} model(s) for chain {c}",
                              "one SlowdownModel per chain of the worker state")
        return self.models[c]

    def apply(self, st: WorkerState, a: Action, until: float | None = None) -> tuple[WorkerState, Step]:
        """Run ``a`` until its first running head ends (or a waiting head becomes ready, or ``until``)."""
        n = len(st.chains)
        s = self.slowdowns(st, a)
        dt = min((st.rem[c] * s[c] for c in range(n) if a.run[c]), default=math.inf)
        waiting = [st.head(c).ready_s - st.t for c in range(n) if not a.run[c] and st.head(c) is not None
                   and st.head(c).ready_s > st.t + _EPS]
        dt = min([dt] + waiting + ([max(0.0, until - st.t)] if until is not None else []))
        idx, rem, held, fin = list(st.idx), list(st.rem), list(st.held), list(st.finish)
        t = st.t + dt
        for c in range(n):
            task = st.head(c)
            if task is None:
                continue
            if a.run[c]:
                if task.sticky is not None:
                    held[c] = a.mem[c]
                rem[c] = max(0.0, rem[c] - dt / s[c])
                if rem[c] <= _EPS * max(1.0, task.work_s):
                    idx[c] += 1
                    nxt = st.chains[c][idx[c]] if idx[c] < len(st.chains[c]) else None
                    rem[c] = nxt.work_s if nxt is not None else 0.0
                    if nxt is None or nxt.sticky != task.sticky:
                        held[c] = 0.0
                    if nxt is None:
                        fin[c] = t
        nst = WorkerState(st.chains, t, tuple(idx), tuple(rem), tuple(held), tuple(fin))
        kinds = tuple(st.head(c).kind if a.run[c] else None for c in range(n))
        return nst, Step(a, st.t, t, kinds, s)

    def bound(self, st: WorkerState) -> float:
        """Critical path from ``st``: each chain's remaining tasks at their alone time, after their ready times."""
        worst = 0.0
        for c in range(len(st.chains)):
            if st.head(c) is None:
                worst = max(worst, st.finish[c])
                continue
            chain = st.chains[c]
            key = (id(chain), st.idx[c], st.rem[c], st.t)
            hit = self._chain_bound.get(key)
            if hit is not None and hit[0] is chain:  # the entry keeps its chain: a reused id is not a hit
                f = hit[1]
            else:
                f, i, rem = st.t, st.idx[c], st.rem[c]
                while i < len(chain):
                    f = max(f, chain[i].ready_s) + rem
                    i += 1
                    rem = chain[i].work_s if i < len(chain) else 0.0
                if len(self._chain_bound) > 500_000:
                    self._chain_bound.clear()
                self._chain_bound[key] = (chain, f)
            worst = max(worst, f)
        return worst

    # -- policies ---------------------------------------------------------------------------------
    def _spread(self, st: WorkerState) -> float:
        """The progress term (weighted into the cost) and the tie-breaker: each chain's finish if its remaining work ran alone from ``st.t`` with no barrier.

        Where the critical path is a barrier's (a worker that is not the slowest replica: every action
        ends its window behind the same predicted opening), it cannot tell an action that idles half the
        GPU from one that runs both heads; this sum can, and it prefers work done now.
        """
        total = 0.0
        for c in range(len(st.chains)):
            if st.head(c) is None:  # a finished chain counts at its finish, not as zero
                total += st.finish[c]
                continue
            chain = st.chains[c]
            suffix = self._suffix.get(id(chain))
            if suffix is None or suffix[0] is not chain:  # work after each index, once per chain object
                tail, acc = [0.0] * (len(chain) + 1), 0.0
                for i in range(len(chain) - 1, -1, -1):
                    tail[i] = acc
                    acc += chain[i].work_s
                if len(self._suffix) > 10_000:
                    self._suffix.clear()
                suffix = self._suffix[id(chain)] = (chain, tail)
            total += st.t + st.rem[c] + suffix[1][st.idx[c]]
        return total

    def _best(self, st: WorkerState, depth: int) -> tuple[float, Action | None, float]:
        """(cost: critical path + progress term, the first action, tie-breaker) of the best window of ``depth`` actions from ``st``."""
        if st.done or depth == 0:
            spread = self._spread(st)
            return self.bound(st) + self.progress_weight * spread, None, spread
        key = (st.key(), depth)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is st.chains:  # the key leaves the chains out: another instance is not a hit
            return hit[1]
        acts = self.actions(st)
        if not acts:  # nothing ready: wait for the first head to become ready
            wait = min(st.head(c).ready_s for c in range(len(st.chains)) if st.head(c) is not None)
            if not wait > st.t:  # a ready head that no memory level fits: no action ever runs it
                return math.inf, None, math.inf
            nst = WorkerState(st.chains, wait, st.idx, st.rem, st.held, st.finish)
            # the cost of waiting, but no action: what is best *then* must not run *now* (before its ready time)
            cost, _, spread = self._best(nst, depth)
            return cost, None, spread
        children = [(self.apply(st, a)[0], a) for a in acts]
        if depth > 1 and self.beam and len(children) > self.beam:  # expand only the most promising
            w = self.progress_weight
            children.sort(key=lambda ca: (self.bound(ca[0]) + w * self._spread(ca[0]), self._spread(ca[0])))
            children = children[:self.beam]
        best: tuple[float, Action | None, float] = (math.inf, None, math.inf)
        for nst, a in children:
            cost, _, spread = self._best(nst, depth - 1)
            tol = 1e-6 * max(1.0, abs(cost))  # the memo rounds times to 1e-6: closer than that is a tie
            if cost < best[0] - tol or (cost <= best[0] + tol and spread < best[2] - tol):
                best = (cost, a, spread)
        if len(self._memo) > 200_000:
            self._memo.clear()
        self._memo[key] = (st.chains, best)
        return best

    def decide(self, st: WorkerState, window: int | None = None) -> Action | None:
        """The first action of the best window of ``window`` actions (default: the scheduler's W)."""
        self.decisions += 1
        a = self._best(st, window or self.window)[1]
        if a is not None and any(a.run[c] and st.head(c) is not None and st.head(c).ready_s > st.t + _EPS
                                 for c in range(len(st.chains))):
            raise RuntimeError("look-ahead chose a sub-stage before its ready time")  # a bug, never an input
        return a

    def plan(self, st: WorkerState, policy: str = "lookahead") -> Plan:
        """Run ``policy`` (``lookahead`` or ``greedy``) from ``st`` to the end; return every step."""
        if policy not in ("lookahead", "greedy"):
            raise ConfigError("lookahead", "policy", f"{policy!r}", "lookahead, greedy")
        w = self.window if policy == "lookahead" else 1
        plan = Plan(policy=policy)
        guard = 0
        while not st.done:
            guard += 1
            if guard > 100_000:
                raise RuntimeError("lookahead plan does not terminate")  # a bug, never an input
            a = self.decide(st, w)
            if a is None:
                wait = min(st.head(c).ready_s for c in range(len(st.chains)) if st.head(c) is not None)
                if not wait > st.t:
                    raise self._stuck(st)
                st = WorkerState(st.chains, wait, st.idx, st.rem, st.held, st.finish)
                continue
            st, step = self.apply(st, a)
            plan.steps.append(step)
        plan.finish_s = st.finish
        return plan

    def _stuck(self, st: WorkerState) -> ConfigError:
        """The error for a ready head that no memory level the scheduler may give fits (nothing will ever run it)."""
        heads = [st.head(c) for c in range(len(st.chains)) if st.head(c) is not None and st.head(c).ready_s <= st.t]
        what = ", ".join(f"{t.label or t.kind} needs {t.mem_min_pct:g}%" for t in heads)
        return ConfigError("lookahead", "mem_min_pct", f"no memory level fits a ready task ({what}; levels "
                           f"{', '.join(f'{x:g}' for x in self.levels)}%; pools held now "
                           f"{', '.join(f'{h:g}' for h in st.held)}%)",
                           f"every task's floor at or below the highest level ({max(self.levels):g}%)")

    def schedule(self, st: WorkerState) -> Plan:
        """The best of the look-ahead plan, a wider and a deeper look-ahead, and the greedy plan.

        Keeping the greedy plan among the candidates makes the result never worse than greedy (a
        "fortified" rollout); the others cost a few more plans and buy quality on hard instances. An
        instance of at most ``small_tasks`` sub-stages also gets a window over all of them (every
        action sequence): the quality reference's own search, affordable at that size.
        """
        cands = [self.plan(st, "greedy"), self.plan(st, "lookahead")]
        saved = (self.window, self.beam, self.progress_weight)
        small = sum(len(c) for c in st.chains) <= self.small_tasks
        wider = [(self.window, None if self.beam is None else 2 * self.beam, self.progress_weight),
                 (self.window + 2, 2, self.progress_weight)]
        if small:  # a handful of sub-stages: a window over all of them is affordable, on the makespan alone (the
            # progress term steers a short window; a window over everything is the makespan's own exact search)
            wider.append((2 * sum(len(c) for c in st.chains), None, 0.0))
        try:
            for window, beam, weight in wider:
                self.window, self.beam, self.progress_weight = window, beam, weight
                self._memo.clear()
                cands.append(self.plan(st, "lookahead"))
        finally:
            self.window, self.beam, self.progress_weight = saved
            self._memo.clear()
        return min(cands, key=lambda p: (p.makespan_s, p.total_s))  # greedy first: it wins exact ties

    def optimum(self, st: WorkerState, limit: int = 2_000_000) -> float:
        """The shortest makespan over every action sequence (exhaustive, memoised); small instances only."""
        memo: dict = {}
        count = [0]

        def best(s: WorkerState) -> float:
            if s.done:
                return max(s.finish)
            k = s.key()
            if k in memo:
                return memo[k]
            count[0] += 1
            if count[0] > limit:
                raise ConfigError("lookahead", "instance", f"more than {limit} states", "a smaller instance")
            acts = self.actions(s)
            if not acts:
                wait = min(s.head(c).ready_s for c in range(len(s.chains)) if s.head(c) is not None)
                if not wait > s.t:
                    raise self._stuck(s)
                v = best(WorkerState(s.chains, wait, s.idx, s.rem, s.held, s.finish))
            else:
                v = min(best(self.apply(s, a)[0]) for a in acts)
            memo[k] = v
            return v

        return best(st)
