"""RL iterations composed from the three stages: synchronous or one-step asynchronous (Figure 1).

Design note
-----------
The loop never looks inside a stage: a generation stage turns a step's trace into a
:class:`~sim.stages.base.StageResult`, a training stage does the same with the batch the step
produced, and a weight-sync stage moves the new weights. The loop decides only *when* each stage
starts, from the dependencies of the RL algorithm:

**Synchronous** (Figure 1(b)): ``Gen(k) -> Train(k) -> Sync(k) -> Gen(k+1)``. Gen of step k uses the
weights Train(k-1) produced.

**One-step asynchronous** (Figure 1(c)): Gen(k+1) runs with the weights of Train(k-1) -- one step
stale -- while Train(k) trains on Gen(k)'s samples; the weight sync after Train(k) waits until the
generators finish their step (engines load weights only between steps) and occupies both clusters::

    gen_start(k)   = max(gen_end(k-1), sync_end(k-2))      # needs weights v(k-1)
    train_start(k) = max(gen_end(k), sync_end(k-1))        # its samples, and the trainer free again
    sync_start(k)  = max(train_end(k), gen_end(k+1))       # new weights, generators between steps

so the steady period is ``max(T_gen, T_train) + T_sync`` instead of their sum. With the same stage
times, every start of the asynchronous schedule is no later than its synchronous counterpart; the
run's last sync starts at ``max(train_end, gen_end)`` of the last step (no further step is
simulated). Stages are called in order of their start times, which is what the fabric controller
and its safe-window gates need (events of a job arrive in time order).

**Throughput.** The paper reports samples per second averaged over a run (§6.1). The first iteration
of an asynchronous run has no overlap yet, so the headline rate is measured between the end of
Train(0) and the end of the last Train (the steady state; the whole-run rate is reported too). Tokens
per second count the prompt and response tokens of the trained samples.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from orchestrl.compute_sched.traces import Trace
from orchestrl.fabric.errors import OrchestrlError
from orchestrl.sim.pricing import ClusterCost
from orchestrl.sim.stages.base import StageResult
from orchestrl.sim.workload import StepWork, trace_work

__all__ = ["MODES", "StageNeverFinishes", "long_lived_frozen", "GenStage", "TrainStage", "SyncStage", "Stages", "Iteration", "Throughput", "LoopResult",
           "run_iterations", "throughput"]

MODES = ("sync", "async")


class StageNeverFinishes(OrchestrlError):
    """A stage reported an infinite time (e.g. flows with no path on the circuits in force)."""


def _finite(res: StageResult, k: int) -> StageResult:
    """Return ``res``, or raise naming the stage and its infinite parts: a later stage must not start at inf."""
    if math.isfinite(res.time_s):
        return res
    parts = ", ".join(f"{p}={v}" for p, v in res.breakdown_s.items() if not math.isfinite(v)) or "no part named"
    raise StageNeverFinishes(f"iteration {k}: the {res.stage} stage never finishes (time {res.time_s}; {parts}); "
                             "see the stage's detail, e.g. a fabric state that gives some flows no path")


class GenStage(Protocol):
    def run(self, trace: Trace, now_s: float = 0.0) -> StageResult: ...


class TrainStage(Protocol):
    def run(self, batch: Any, now_s: float = 0.0) -> StageResult: ...


class SyncStage(Protocol):
    def run(self, now_s: float = 0.0) -> StageResult: ...


@dataclass
class Stages:
    """The three stage models of one run and how a finished generation step becomes a training batch."""

    gen: GenStage
    train: TrainStage
    sync: SyncStage
    batch_of: Callable[[Trace, StageResult], Any]  # what the trainer receives from a generation step


@dataclass(frozen=True)
class Iteration:
    """One RL iteration: its three stages, when each started, and what was trained."""

    index: int
    gen: StageResult
    train: StageResult
    sync: StageResult
    gen_start_s: float
    train_start_s: float
    sync_start_s: float
    work: StepWork
    wall_s: float  # seconds the simulator spent on this iteration's stages

    @property
    def gen_end_s(self) -> float:
        return self.gen_start_s + self.gen.time_s

    @property
    def train_end_s(self) -> float:
        return self.train_start_s + self.train.time_s

    @property
    def sync_end_s(self) -> float:
        return self.sync_start_s + self.sync.time_s

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "samples": self.work.samples, "tokens": self.work.tokens,
                "response_tokens": self.work.response_tokens,
                "gen_start_s": self.gen_start_s, "gen_end_s": self.gen_end_s,
                "train_start_s": self.train_start_s, "train_end_s": self.train_end_s,
                "sync_start_s": self.sync_start_s, "sync_end_s": self.sync_end_s, "wall_s": self.wall_s,
                "stages": {"gen": self.gen.to_json(), "train": self.train.to_json(), "weight-sync": self.sync.to_json()}}


@dataclass(frozen=True)
class Throughput:
    """Samples and tokens trained per second over a window of the run."""

    samples_per_s: float
    tokens_per_s: float
    response_tokens_per_s: float
    window_s: float
    window: str  # "steady" (end of Train(0) to end of the last Train) or "run" (start to last sync)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class LoopResult:
    """A finished run: its iterations, throughput, and (with a cost) throughput per dollar."""

    mode: str
    iterations: tuple[Iteration, ...]
    throughput: Throughput  # the headline: steady state when there are >= 2 iterations
    whole_run: Throughput
    cost: ClusterCost | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        return max(it.sync_end_s for it in self.iterations)

    @property
    def samples_per_usd(self) -> float | None:
        return self.cost.per_usd(self.throughput.samples_per_s) if self.cost else None

    @property
    def tokens_per_usd(self) -> float | None:
        return self.cost.per_usd(self.throughput.tokens_per_s) if self.cost else None

    def stage_means_s(self) -> dict[str, float]:
        """Mean time of each stage over the iterations (the per-stage view of Figure 14)."""
        n = len(self.iterations)
        return {"gen": sum(i.gen.time_s for i in self.iterations) / n,
                "train": sum(i.train.time_s for i in self.iterations) / n,
                "weight-sync": sum(i.sync.time_s for i in self.iterations) / n}

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "makespan_s": self.makespan_s, "throughput": self.throughput.to_json(),
                "whole_run": self.whole_run.to_json(), "stage_mean_s": self.stage_means_s(),
                "cost": self.cost.to_json() if self.cost else None, "samples_per_usd": self.samples_per_usd,
                "tokens_per_usd": self.tokens_per_usd, "detail": dict(self.detail),
                "iterations": [it.to_json() for it in self.iterations]}


_FULL_EVERY = 40  # settle() calls between full collections: the loop settles 4 times an iteration


@contextlib.contextmanager
def long_lived_frozen() -> Any:
    """Keep the cyclic garbage collector off what a run holds for good; yield ``settle()`` to call between parts.

    A 2,048-GPU simulation holds over a million Python objects (traces, request states, plan and
    routing caches) that live for the whole run and are never garbage: every full collection walked
    all of them (1.0 s of a 16 s iteration; 6.4 s of a cold one, measured 2026-11-28), and none ever
    found a cycle to free. ``settle()`` collects the young generations (short-lived cycles go as
    usual) and moves every survivor to the permanent generation (``gc.freeze``), so later collections
    walk only what was made since. Garbage cycles that had already reached the oldest generation are
    frozen with the rest, so every ``_FULL_EVERY`` calls the objects are unfrozen, fully collected and
    frozen again (memory stays bounded over a long run; about 1 s per call at 2,048 GPUs). On exit
    the objects are unfrozen, so what the run leaves behind is collected normally afterwards. A
    caller that froze objects itself keeps its own policy: then ``settle()`` does nothing.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield lambda: None
        return
    calls = [0]

    def settle() -> None:
        calls[0] += 1
        if calls[0] % _FULL_EVERY == 0:
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()

    try:
        yield settle
    finally:
        gc.unfreeze()


def run_iterations(stages: Stages, trace_of: Callable[[int], Trace], iterations: int, mode: str = "async", *,
                   on_iteration: Callable[[Iteration], None] | None = None,
                   on_stage: Callable[[int, str], None] | None = None) -> list[Iteration]:
    """Run ``iterations`` RL iterations and return them (see the module note for the schedule).

    Parameters
    ----------
    stages : Stages
    trace_of : callable
        ``trace_of(k)`` is the length trace of step ``k`` (deterministic, so modes see the same work).
    iterations : int
    mode : {"sync", "async"}
    on_iteration : callable, optional
        Called with each finished :class:`Iteration` (progress reporting).
    on_stage : callable, optional
        Called as ``on_stage(step, part)`` as each part of a step starts, ``part`` one of ``"trace"``
        (building the step's length trace), ``"gen"``, ``"train"``, ``"weight-sync"``: progress
        inside an iteration, whose stages can each take minutes on a big step.

    Raises
    ------
    StageNeverFinishes
        If a stage reports an infinite time (the next stage would start at infinity).

    Notes
    -----
    Calls each stage once per iteration: O(iterations) stage runs.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    traces: dict[int, Trace] = {}
    gens: dict[int, tuple[float, StageResult, float]] = {}  # step -> (start, result, wall)

    def starting(k: int, part: str) -> None:
        settle()
        if on_stage is not None:
            on_stage(k, part)

    def gen(k: int, start: float) -> tuple[float, StageResult, float]:
        if k not in gens:
            starting(k, "trace")
            traces[k] = trace_of(k)
            starting(k, "gen")
            t0 = time.perf_counter()
            gens[k] = (start, _finite(stages.gen.run(traces[k], start), k), time.perf_counter() - t0)
        return gens[k]

    with long_lived_frozen() as settle:
        out: list[Iteration] = []
        sync_end: dict[int, float] = {-1: 0.0, -2: 0.0}
        gen(0, 0.0)
        for k in range(iterations):
            g_start, g_res, g_wall = gens[k]
            g_end = g_start + g_res.time_s
            t_start = max(g_end, sync_end[k - 1])
            starting(k, "train")
            t0 = time.perf_counter()
            t_res = _finite(stages.train.run(stages.batch_of(traces[k], g_res), t_start), k)
            wall = g_wall + time.perf_counter() - t0
            t_end = t_start + t_res.time_s
            if mode == "sync":
                s_start = t_end
            elif k + 1 < iterations:  # Gen(k+1) runs on weights v(k-1) while Train(k) trains
                n_start, n_res, _ = gen(k + 1, max(g_end, sync_end[k - 1]))
                s_start = max(t_end, n_start + n_res.time_s)
            else:
                s_start = max(t_end, g_end)
            starting(k, "weight-sync")
            t0 = time.perf_counter()
            s_res = _finite(stages.sync.run(s_start), k)
            wall += time.perf_counter() - t0
            sync_end[k] = s_start + s_res.time_s
            if mode == "sync" and k + 1 < iterations:
                gen(k + 1, sync_end[k])
            it = Iteration(k, g_res, t_res, s_res, g_start, t_start, s_start, trace_work(traces[k]), wall)
            out.append(it)
            if on_iteration is not None:
                on_iteration(it)
        return out


def throughput(iterations: list[Iteration] | tuple[Iteration, ...]) -> tuple[Throughput, Throughput]:
    """Return (headline, whole-run) throughput; the headline is the steady state from 2 iterations on.

    Examples
    --------
    >>> from orchestrl.sim.workload import StepWork
    >>> r = lambda s, t: StageResult(s, t)
    >>> its = [Iteration(k, r("gen", 10), r("train", 6), r("weight-sync", 1), 17 * k, 17 * k + 10, 17 * k + 16,
    ...                  StepWork(100, 1000, 9000, 500), 0.0) for k in range(3)]
    >>> head, run = throughput(its)
    >>> head.window, head.samples_per_s, round(run.samples_per_s, 3)  # 2 x 100 samples over 34 s; 300 over 51 s
    ('steady', 5.882352941176471, 5.882)
    """
    its = list(iterations)
    if not its:
        raise ValueError("no iterations")

    def rate(selected: list[Iteration], window_s: float, name: str) -> Throughput:
        if not window_s > 0:
            return Throughput(0.0, 0.0, 0.0, window_s, name)
        return Throughput(sum(i.work.samples for i in selected) / window_s,
                          sum(i.work.tokens for i in selected) / window_s,
                          sum(i.work.response_tokens for i in selected) / window_s, window_s, name)

    whole = rate(its, max(i.sync_end_s for i in its), "run")
    if len(its) < 2:
        return whole, whole
    return rate(its[1:], its[-1].train_end_s - its[0].train_end_s, "steady"), whole
