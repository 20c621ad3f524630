"""The systems JigsawRL is compared with, on the same simulated steps (§5.1).

* veRL: rollout then training on the same GPUs. Two pipelines either take turns on all GPUs
  (``serial``) or each keeps half the GPUs (``split``); :func:`verl` reports the better, as a user
  would configure it.
* RollMux: a rollout pool and a training pool, the two pipelines' phases interleaved round-robin
  with long-tail migration -- this project's RollMux (:func:`compute_sched.groups.intra.round_robin`)
  at its best configuration per case (pool size, tail threshold, replicas a consolidated tail keeps,
  or no migration; or each job in a group of its own on half the GPUs), timed over the long run (:data:`PASSES` passes over the steps, the first pass's
  ramp excluded, where JigsawRL is charged its makespan over as many passes). A consolidated tail decodes at the merged batch
  (:func:`consolidated_tail_end`, the engine model JigsawRL's merges are charged by); the next job's
  rollout is charged nothing for the replicas the tail holds (generous to RollMux).
* StreamRL: one-step off-policy; per pipeline a quarter of the GPUs roll out while another quarter
  trains on the previous step's samples (the step is the longer of the two).
* AReaL: fully asynchronous; rollout workers never drain (new prompts refill the batch), so a step
  costs its decode tokens at the full batch's rate, overlapped with training as in StreamRL.
* JigsawRL asynchronous (Fig. 15): each half of the GPUs hosts one pipeline's rollout and the other's
  training, multiplexed by the look-ahead scheduler; no barrier couples the two (one step apart).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import itertools
from typing import Mapping, Sequence

import numpy as np

from orchestrl.fabric.errors import ConfigError
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.multiplex.catalog import model_for
from orchestrl.compute_sched.multiplex.lookahead import Scheduler, Task, WorkerState
from orchestrl.compute_sched.multiplex.substage import rollout_chain
from orchestrl.compute_sched.multiplex.ops import migration_cost_s
from orchestrl.sim.multiplex.rollout import perf_model, post_times, steps_after
from orchestrl.sim.multiplex.runner import PipelineSteps, mem_floor_pct

__all__ = ["Baseline", "verl", "rollmux", "consolidated_tail_end", "tail_point", "longrun_pass_s", "repeat_steps", "steady_passes", "repeat_each", "steady_tps", "steady_rates", "verl_steady", "vs_split", "STEADY_CAP",
           "streamrl", "areal", "jigsaw_async"]


@dataclass(frozen=True)
class Baseline:
    name: str
    total_s: float  # time for every pipeline's steps
    tokens: int
    detail: dict

    @property
    def throughput_tps(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else 0.0


def verl(full: list[PipelineSteps], half: list[PipelineSteps]) -> Baseline:
    """veRL at its better configuration: pipelines in turn on all GPUs, or side by side on half each."""
    serial = sum(r.step_alone_s(k) for r in full for k in range(r.steps))
    split = max(sum(r.step_alone_s(k) for k in range(r.steps)) for r in half)
    tokens = sum(sum(r.tokens) for r in full)
    best = "serial" if serial <= split else "split"
    return Baseline("veRL", min(serial, split), tokens, {"serial_s": serial, "split_s": split, "config": best})


#: RollMux's settings searched for its best configuration per case (a user would tune them): the tail
#: threshold (the share of a step's responses done when the tail is consolidated) ...
TAIL_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
#: ... and the rollout pool's size in replicas around half the group's (the training pool gets the rest); a
#: review found pools of 2, 6 or 7 of 8 replicas never better on Fig. 12.
POOL_OFFSETS = (-1, 0, 1)
PASSES = 4  # long-run time per pass = (end of PASSES passes - end of the first) / (PASSES - 1)


def tail_point(run: PipelineSteps, k: int, threshold: float = 0.8) -> float:
    """When every replica of step ``k`` has finished ``threshold`` of its responses (RollMux's tail point)."""
    if not 0.0 < threshold <= 1.0:
        raise ConfigError("RollMux baseline", "tail_threshold", f"{threshold}", "a fraction in (0, 1]")
    return max(t.done_at_s(threshold) for t in run.traces[k])


def consolidated_tail_end(run: PipelineSteps, k: int, keep: int, threshold: float = 0.8) -> tuple[float, float]:
    """RollMux's long-tail migration on step ``k``: (tail point, rollout end) when the responses still
    decoding at the tail point (:func:`tail_point`) move onto ``keep`` whole replicas.

    Each moved response keeps its remaining engine steps (counted on its replica's engine after the tail
    point; a multi-turn response's tool gaps count as steps, which errs against RollMux by about 2% on
    GSM8K multi-turn) and is rebuilt on its new replica by recomputing its context
    (:func:`migration_cost_s`, what JigsawRL's merges are charged, here spread over the kept replicas);
    the kept replicas then decode their share at the merged batch (:meth:`PerfModel.decode_step_s`, the
    batch shrinking as responses finish, where JigsawRL's merge is charged the merged batch throughout).
    The kept replicas are the first ``keep``, not those with the largest tails, and the merged KV is not
    checked against the pool (JigsawRL's merges are); the end is never before the unmigrated rollout's.
    """
    traces = run.traces[k]
    if not 1 <= keep <= len(traces):
        raise ConfigError("RollMux baseline", "keep", f"{keep}", f"1..{len(traces)} replicas")
    t80 = tail_point(run, k, threshold)
    end = max(t.end_s for t in traces)
    perf = perf_model(run.spec, run.gpu)
    cfg = InstanceConfig("tp", tp=run.spec.tp)
    left: list[tuple[int, float]] = []  # (decode steps left, context at the tail point)
    rebuild = 0.0
    for w, t in enumerate(traces):
        f = steps_after(t.records, t80)
        for fin, ctx in t.finish_s:
            if fin > t80:
                n = f(fin)
                now = max(1.0, ctx - n)
                left.append((n, now))
                if w >= keep:  # replicas 0..keep-1 stay; the others' responses move
                    rebuild += migration_cost_s(perf.model, now, run.spec.tp, perf.gpu.bf16_flops)
    shares: list[list[tuple[int, float]]] = [[] for _ in range(keep)]
    for n, ctx in sorted(left, reverse=True):  # longest first onto the least loaded kept replica
        min(shares, key=lambda sh: sum(x for x, _ in sh)).append((n, ctx))
    decode = 0.0
    for sh in shares:
        t_s, done = 0.0, 0
        active = sorted(sh)
        while active:
            step = active[0][0] - done
            b = len(active)
            ctx = sum(c + done for _, c in active) + b * step / 2.0
            t_s += step * perf.decode_step_s(cfg, b, ctx)
            done = active[0][0]
            active = [a for a in active if a[0] > done]
        decode = max(decode, t_s)
    return t80, max(end, t80 + rebuild / keep + decode)


def _rollmux_draws(pool: list[PipelineSteps], train_gpus: int, keep: int | None,
                   threshold: float) -> tuple[list[GroupJob], np.ndarray]:
    """The round robin's jobs and per-step draws (rollout end, tail point, training; fractions of the
    worst) with the tail on ``keep`` replicas at ``threshold`` (``keep=None``: no migration)."""
    jobs, draws = [], []
    steps = min(r.steps for r in pool)
    for r in pool:
        roll, tail, train = [], [], []
        seen: dict[int, tuple[float, float]] = {}  # repeated steps (repeat_steps) share their traces: one tail each
        for k in range(steps):
            if keep is None:
                end = max(t.end_s for t in r.traces[k])
                roll.append(end)
                tail.append(end)
            else:
                key = id(r.traces[k])
                if key not in seen:
                    seen[key] = consolidated_tail_end(r, k, keep, threshold)
                at, end = seen[key]
                roll.append(end)
                tail.append(min(at, end))
            ref, tr = post_times(r.spec, r.tokens[k], r.gpu, train_gpus)  # the step's tokens on the training pool
            train.append(ref + tr)
        rmax, tmax = max(roll), max(train)
        jobs.append(GroupJob(r.spec.name, (0,), rmax, tmax))
        draws.append([(roll[k] / rmax, tail[k] / rmax, train[k] / tmax) for k in range(steps)])
    return jobs, np.array(draws).transpose(1, 0, 2)  # (iterations, jobs, 3)


def _tail_rates(pool: list[PipelineSteps], fewer: list[PipelineSteps]) -> np.ndarray:
    """Per step and job: how fast a rollout runs on ``fewer`` replicas than on ``pool``'s, from the engine
    model (the same step's samples simulated on each; its unmigrated end on the pool over its end on
    fewer), as :func:`round_robin`'s ``tail_rate``."""
    steps = min(r.steps for r in pool)
    return np.array([[min(1.0, max(t.end_s for t in r.traces[k]) / max(t.end_s for t in f.traces[k]))
                      for r, f in zip(pool, fewer)] for k in range(steps)])


def _rollmux_ends(jobs: list[GroupJob], draws: np.ndarray, cfg: GroupConfig, rates: np.ndarray | None = None,
                  passes: int = 1) -> list[list[float]]:
    """Each job's step (training) end times, in ``jobs``' order, of the round robin over ``draws`` repeated
    ``passes`` times, from a cold start at 0."""
    sched = round_robin(jobs, 1, cfg, draws=np.tile(draws, (passes, 1, 1)), record=True,
                        tail_rate=None if rates is None else np.tile(rates, (passes, 1)))
    ends: dict[str, list[float]] = {j.job_id: [] for j in jobs}
    for sg in sorted(sched.segments, key=lambda x: x.iteration):
        if sg.pool == "train":
            ends[sg.job_id].append(sg.end_s)
    return [ends[j.job_id] for j in jobs]


def _rollmux_pass(jobs: list[GroupJob], draws: np.ndarray, cfg: GroupConfig,
                  rates: np.ndarray | None = None) -> tuple[float, float]:
    """(long-run time per pass, first pass from a cold start) of the round robin over :data:`PASSES` passes."""
    steps = draws.shape[0]
    ends = _rollmux_ends(jobs, draws, cfg, rates, PASSES)
    first = max(e[steps - 1] for e in ends)
    last = max(e[-1] for e in ends)
    return longrun_pass_s(first, last, PASSES), first


def rollmux(pools: Sequence[list[PipelineSteps]] | list[PipelineSteps], total_replicas: int | None = None,
            config: GroupConfig | None = None, fewer: Mapping[int, list[PipelineSteps]] | None = None,
            steady: bool = False, isolated: bool = True) -> Baseline:
    """RollMux: a rollout pool and a training pool, the jobs' phases round-robin (this project's scheduler),
    at its best configuration for the case.

    ``pools``: the pipelines' steps simulated on each candidate rollout pool (a list of pipelines, or a
    list of such lists, one per pool size); ``total_replicas`` (default: twice the first pool's) is the
    group's size, the training pool gets the rest. ``total_s`` is the long-run time of one pass over the
    steps (:data:`PASSES` passes, the first one's ramp excluded, :func:`longrun_pass_s`);
    ``detail["first_pass_s"]`` is the pass from a cold start. Searched: the pool size, the tail
    threshold (:data:`TAIL_THRESHOLDS`), the replicas the consolidated tail keeps (at the merged batch,
    :func:`consolidated_tail_end`), and no migration. While a tail holds its replicas the next job's
    rollout is charged nothing for them (it runs as on the whole pool): generous to RollMux.
    ``detail["proportional_s"]`` is the same search with it slowed by the share of replicas the tail
    holds instead (as :func:`round_robin` assumes; harsh: the engine model says a step on half the
    replicas takes 1.05-1.6x, not 2x, as long); on the steps measured the two bracket RollMux.
    ``fewer`` (the same steps simulated on fewer replicas, by replica count: every count from 1 to the
    largest pool's less one that ``pools`` does not already hold) adds ``detail["engine_s"]``: the same
    search with the next rollout, while a tail holds ``keep`` of its ``d`` replicas, running as fast as
    the engine model runs that step on ``d - keep`` replicas (its samples dispatched on the freed
    replicas, RollMux's "starts the next job's rollout on the newly freed GPUs"), at full speed once the
    tail is done (generous: it assumes the running rollout spreads back onto the tail's replicas). Neither
    ``proportional_s`` nor ``engine_s`` is reported below ``total_s`` (the long-run measure, first pass
    excluded, can rank a slowed search a hair faster; see the code).

    ``isolated`` (default): also each job in a group of its own on half the replicas (:func:`_rollmux_isolated`,
    what RollMux's inter-group scheduler provisions where co-grouping would break a member's SLO), at the pool
    sizes that serve the pair best; chosen where faster (its ``config`` says so). Alone a job has no tail to move,
    so its one time is a candidate for the slowed estimates too.

    ``steady``: the steady-state measure's RollMux, for pipelines whose steps were repeated to different counts
    (:func:`steady_passes`). RollMux's round robin is a meta-iteration in which every job of the group runs one
    rollout and one training (its §4.3; its Theorem 1 proves repeating a job within one inefficient), so both
    jobs run as many iterations as the one with fewest steps, the shorter one at the longer one's cadence, from a
    cold start; each configuration is scored by :func:`steady_tps` on the round robin's step ends, as the other
    systems are, and ``total_s`` is ``tokens`` over that rate (``throughput_tps`` is the steady rate);
    ``detail["steady_rates"]`` holds each job's tokens/s at the best configuration and ``detail["makespan_s"]``
    its round robin's end (in place of the long-run fields). ``detail["steps_run"]``: the steps each job runs
    (per pass where timed over the long run); in groups of their own each job runs all of its steps.
    ``detail["rollout_replicas"]``: the rollout pool's size, or in groups of their own a tuple, one per job.
    """
    if pools and isinstance(pools[0], PipelineSteps):
        pools = [pools]  # type: ignore[list-item]
    cfg = config or GroupConfig()
    total = total_replicas or 2 * pools[0][0].replicas
    steps = min(r.steps for pool in pools for r in pool)
    tokens = sum(sum(r.tokens[:steps]) for r in pools[0])
    by_size = {p[0].replicas: p for p in pools}
    names = [r.spec.name for r in pools[0]]
    counts = [r.steps for r in pools[0]]
    if steady and any([r.steps for r in p] != counts for p in pools):
        raise ConfigError("RollMux baseline", "pools", "pools whose pipelines run different step counts",
                          f"the same steps on every pool under the steady measure ({counts})")
    if fewer is not None:
        for n, p in fewer.items():
            if [r.spec.name for r in p] != names or any(r.replicas != n or r.steps < steps for r in p) or \
                    (steady and [r.steps for r in p] != counts):
                raise ConfigError("RollMux baseline", "fewer", f"the steps given for {n} replicas",
                                  f"the pools' pipelines ({', '.join(names)}), in that order, each simulated on {n} "
                                  f"replicas for " + (f"{counts} steps, as the pools" if steady
                                                      else f"at least {steps} steps"))
        by_size = {**{n: list(p) for n, p in fewer.items()}, **by_size}
    # (time, first pass or end, per-job steady rates, config text, rollout replicas, tail replicas, tail threshold)
    best = harsh = engine = None
    for pool in pools:
        d, tp = pool[0].replicas, pool[0].spec.tp
        if not 1 <= d < total:
            raise ConfigError("RollMux baseline", "pools", f"a rollout pool of {d} of {total} replicas",
                              "leave at least one replica for training")
        train_gpus = (total - d) * tp
        options: list[tuple[int | None, float]] = [(None, 1.0)]
        if cfg.long_tail_migration and d > 1:
            options += [(keep, thr) for thr in TAIL_THRESHOLDS for keep in range(1, d)]
        toks = [r.tokens[:steps] for r in pool]
        for keep, thr in options:
            jobs, draws = _rollmux_draws(pool, train_gpus, keep, thr)
            if keep is None:
                free = prop = _rollmux_timed(jobs, draws, replace(cfg, long_tail_migration=False), steady, toks, tokens)
                eng = free if fewer is not None else None
            else:
                free = _rollmux_timed(jobs, draws, replace(cfg, tail_capacity_fraction=1e-9), steady, toks, tokens)
                prop = _rollmux_timed(jobs, draws, replace(cfg, tail_capacity_fraction=keep / d), steady, toks, tokens)
                eng = None
                if fewer is not None:
                    if d - keep not in by_size:
                        raise ConfigError("RollMux baseline", "fewer", f"no steps on {d - keep} replicas",
                                          f"the steps simulated on every replica count from 1 to {d - 1}")
                    eng = _rollmux_timed(jobs, draws, cfg, steady, toks, tokens, _tail_rates(pool, by_size[d - keep]))
            cfg_of = (_describe(d, total, keep, thr), d, keep or 0, thr if keep else None)
            if best is None or free[0] < best[0]:
                best = (*free, *cfg_of)
            if harsh is None or prop[0] < harsh[0]:
                harsh = (*prop, *cfg_of)
            if eng is not None and (engine is None or eng[0] < engine[0]):
                engine = (*eng, *cfg_of)
    steps_run = [steps] * len(names)  # in one group, per pass: every job in step
    iso = _rollmux_isolated(by_size, total, cfg, steps, steady, tokens) if isolated else None
    if iso is not None:
        # each job alone has no tail to move (it would free replicas for no other job): its one time is a candidate
        # for every estimate, the slowed ones included
        sizes = iso[3]
        alone = (*iso[:3], "isolated groups, each job alone on its half: rollout on "
                 + ", ".join(f"{k} of {total // 2}" for k in sizes), sizes, 0, None)
        if alone[0] < best[0]:
            best = alone
            if steady:  # alone, each job runs all of its own steps
                steps_run = counts
        if alone[0] < harsh[0]:
            harsh = alone
        if engine is not None and alone[0] < engine[0]:
            engine = alone
    long_s, first, per = best[:3]
    # Per configuration, slowing the next rollout cannot make RollMux faster; the long-run measure (the first pass
    # excluded) can still put a slowed search a hair below the generous one when the slowing lengthens the first
    # pass instead (Qwen3-0.6B/MATH: 59.60 s against 59.72 s, its first pass 2.7 s longer). Neither slowed
    # estimate is reported below the generous end.
    harsh = (max(harsh[0], long_s), *harsh[1:])
    if engine is not None:
        engine = (max(engine[0], long_s), *engine[1:])
    return Baseline("RollMux", long_s, tokens,
                    {**({"longrun_pass_s": long_s, "first_pass_s": first} if not steady else
                        {"steady_rates": per, "makespan_s": first}),
                     "config": best[3], "rollout_replicas": best[4], "tail_replicas": best[5],
                     "tail_threshold": best[6], "steps_run": steps_run,
                     "proportional_s": harsh[0], "proportional_config": harsh[3],
                     **({} if engine is None else {"engine_s": engine[0], "engine_config": engine[3]})})


def _per_token_s(tokens: int, rates: Sequence[float]) -> float:
    """``tokens`` over summed steady rates: the steady measure as a time (lower is better, like a pass's)."""
    return tokens / sum(rates) if sum(rates) > 0 else float("inf")


def _rollmux_timed(jobs: list[GroupJob], draws: np.ndarray, cfg: GroupConfig, steady: bool,
                   toks: Sequence[Sequence[int]], tokens: int,
                   rates: np.ndarray | None = None) -> tuple[float, float, list[float] | None]:
    """One configuration's (time, first pass or end, steady rates): the long-run time per pass
    (:func:`_rollmux_pass`), or (``steady``) ``tokens`` over the rates :func:`steady_rates` gives the round
    robin's step ends from a cold start."""
    if not steady:
        return (*_rollmux_pass(jobs, draws, cfg, rates), None)
    ends = _rollmux_ends(jobs, draws, cfg, rates)
    per = steady_rates(ends, toks)
    return _per_token_s(tokens, per), max(e[-1] for e in ends), per


def _rollmux_isolated(by_size: Mapping[int, list[PipelineSteps]], total: int, cfg: GroupConfig, steps: int,
                      steady: bool, tokens: int) -> tuple[float, float, list[float] | None, tuple[int, ...]] | None:
    """RollMux with each of two jobs in a group of its own (what its inter-group scheduler provisions where
    co-grouping would break a member's SLO, §4.2): each job on its half of ``total`` replicas, a rollout pool of
    ``k`` replicas (the sizes ``by_size`` holds below the half) and a training pool of the rest, no migration (a
    consolidated tail would free replicas for no other job). The two pool sizes are chosen together by the
    measure the co-execution group is scored by, in the same units (:func:`_rollmux_timed`): the long-run time per
    pass of both jobs' ends, or ``tokens`` over the summed steady rates. Returns (that time, the first pass's end
    or the run's end, the steady rates or None, the pool sizes), or None for an odd ``total``, other than two jobs,
    or no pool size below the half."""
    half = total // 2
    sizes = sorted(n for n in by_size if 1 <= n < half)
    if total % 2 or not sizes or len(by_size[sizes[0]]) != 2:
        return None
    runs: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
    for k in sizes:
        for j, run in enumerate(by_size[k]):
            n = run.steps if steady else steps
            run = replace(run, traces=run.traces[:n], post=run.post[:n], tokens=run.tokens[:n])
            jb, dr = _rollmux_draws([run], (half - k) * run.spec.tp, None, 1.0)
            e = _rollmux_ends(jb, dr, replace(cfg, long_tail_migration=False), passes=1 if steady else PASSES)[0]
            runs[j, k] = e, list(run.tokens)
    best, key = None, None
    for ka, kb in itertools.product(sizes, sizes):
        (ea, ta), (eb, tb) = runs[0, ka], runs[1, kb]
        if steady:
            per: list[float] | None = steady_rates([ea, eb], [ta, tb])
            got, tie = (_per_token_s(tokens, per), max(ea[-1], eb[-1]), per, (ka, kb)), 0.0
        else:
            first = max(ea[steps - 1], eb[steps - 1])
            got = (longrun_pass_s(first, max(ea[-1], eb[-1]), PASSES), first, None, (ka, kb))
            # the slower job sets the pair's time; among equal ones, each job on the pool that serves it best
            tie = sum(longrun_pass_s(e[steps - 1], e[-1], PASSES) for e in (ea, eb))
        if key is None or (got[0], tie) < key:
            best, key = got, (got[0], tie)
    return best


def _describe(d: int, total: int, keep: int | None, thr: float) -> str:
    return f"rollout on {d} of {total} replicas, " + (f"tail at {thr:.0%} on {keep}" if keep else "no migration")


def longrun_pass_s(first_pass_s: float, passes_s: float, passes: int = PASSES) -> float:
    """Long-run time of one pass over a case's steps, from one run of ``passes`` passes: (its end -
    the end of its first pass, ``first_pass_s``) / (``passes`` - 1), so the first pass's ramp is not
    charged (the last pass's drain still is)."""
    if passes < 2:
        raise ConfigError("long-run timing", "passes", f"{passes}", "at least 2")
    return (passes_s - first_pass_s) / (passes - 1)


def repeat_steps(run: PipelineSteps, passes: int = PASSES) -> PipelineSteps:
    """``run``'s steps ``passes`` times over (the same draws), for long-run timing."""
    return replace(run, traces=run.traces * passes, post=run.post * passes, tokens=run.tokens * passes)


#: the most passes :func:`steady_passes` gives the shortest pipeline, as a multiple of the longest's (bounds the cost)
STEADY_CAP = 16


def steady_passes(half: Sequence[PipelineSteps], base: int = PASSES, cap: int = STEADY_CAP) -> tuple[int, ...]:
    """How many passes over its steps each pipeline runs for the steady-state measure: the pipeline whose pass
    is longest on its half of the workers (veRL split) runs ``base`` passes, each other as many as fit in that
    time on its half (at most ``cap`` times ``base``), so that each pipeline keeps running while the other
    does, as two jobs sharing a cluster would, and veRL split's halves finish together."""
    for fld, v in (("passes", base), ("cap", cap)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError("steady measure", fld, f"{v!r}", "an integer >= 1")
    t = [sum(h.step_alone_s(k) for k in range(h.steps)) for h in half]
    return tuple(max(1, min(cap * base, round(base * max(t) / x))) if x > 0 else base for x in t)


def steady_tps(step_ends: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]]) -> float:
    """Aggregated tokens/s while every pipeline is still running (the steady-state measure's throughput).

    Up to the moment the first pipeline ends its last step, each pipeline is credited its finished steps'
    tokens plus the elapsed share (by wall time) of the step it is in; what a pipeline does after the other
    has stopped is not counted, since a deployment would give the other more steps. ``step_ends[p]`` are
    pipeline ``p``'s step end times (its first step starting at 0), ``tokens[p]`` its steps' tokens.
    """
    return sum(steady_rates(step_ends, tokens))


def steady_rates(step_ends: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]]) -> list[float]:
    """Each pipeline's tokens/s in :func:`steady_tps`'s window (their sum is it). Against each pipeline's rate
    under veRL split this shows what one job gains or pays, which the sum hides when a system shifts capacity
    from one pipeline to the other."""
    until = min(e[-1] for e in step_ends)
    if not until > 0:
        return [0.0 for _ in step_ends]
    rates = []
    for ends, tok in zip(step_ends, tokens, strict=True):
        credit, start = 0.0, 0.0
        for end, n in zip(ends, tok, strict=True):
            if end > until:
                credit += n * (until - start) / (end - start)
                break
            credit += n
            start = end
        rates.append(credit / until)
    return rates


def vs_split(rates: Sequence[float], split_rates: Sequence[float]) -> list[float]:
    """Each pipeline's steady tokens/s (:func:`steady_rates`) against its own under veRL split (the third value
    :func:`verl_steady` returns): what one job gains or pays, which a summed throughput can hide."""
    return [a / b for a, b in zip(rates, split_rates, strict=True)]


def verl_steady(full: Sequence[PipelineSteps], half: Sequence[PipelineSteps]) -> tuple[float, str, list[float]]:
    """veRL at its better configuration under the steady-state measure: (tokens/s, ``"split"`` or ``"serial"``,
    each pipeline's tokens/s under split). Split is measured as :func:`steady_tps` measures the others (its
    steps back to back on its half); the pipelines in turn, which never overlap, at whole-run tokens over time."""
    v = verl(list(full), list(half))
    ends = [list(itertools.accumulate(h.step_alone_s(k) for k in range(h.steps))) for h in half]
    rates = steady_rates(ends, [h.tokens for h in half])
    tps, config = max((sum(rates), "split"), (v.tokens / v.detail["serial_s"], "serial"))
    return tps, config, rates


def repeat_each(runs: Sequence[PipelineSteps], passes: Sequence[int]) -> list[PipelineSteps]:
    """Each pipeline's steps repeated its own number of ``passes`` (:func:`steady_passes`)."""
    return [repeat_steps(r, n) for r, n in zip(runs, passes, strict=True)]


def streamrl(quarter: list[PipelineSteps]) -> Baseline:
    """StreamRL: per pipeline, rollout on a quarter of the GPUs overlapped with training on another quarter."""
    totals = []
    for r in quarter:
        totals.append(sum(max(max(t.end_s for t in r.traces[k]), max(a + b for a, b in r.post[k]))
                          for k in range(r.steps)))
    return Baseline("StreamRL", max(totals), sum(sum(r.tokens) for r in quarter), {"per_pipeline_s": totals})


def areal(quarter: list[PipelineSteps]) -> Baseline:
    """AReaL: no rollout tail (the batch is refilled), overlapped with training as StreamRL."""
    totals = []
    for r in quarter:
        perf = perf_model(r.spec, r.gpu)
        cfg = InstanceConfig("tp", tp=r.spec.tp)
        tot = 0.0
        for k in range(r.steps):
            per_rep = []
            for t in r.traces[k]:
                batch = max(1, r.spec.samples // r.replicas)
                decode = sum(rec.tokens * rec.steps for rec in t.records if rec.tokens < 1024)
                ctx = batch * 1500.0
                per_rep.append(decode * perf.decode_step_s(cfg, batch, ctx) / batch)
            tot += max(max(per_rep), max(a + b for a, b in r.post[k]))
        totals.append(tot)
    return Baseline("AReaL", max(totals), sum(sum(r.tokens) for r in quarter), {"per_pipeline_s": totals})


def jigsaw_async(half: list[PipelineSteps], grid: str = "default", scale: float = 1.0) -> Baseline:
    """JigsawRL one step off-policy: on each half, one pipeline's rollout next to the other's training.

    The critical replica (the longest rollout) of each step stands for its half; the two chains are
    planned by the look-ahead scheduler (:meth:`Scheduler.schedule`: never worse than greedy).
    """
    a, b = half
    models = {r.spec.name: model_for(r.gpu, r.spec.model, grid, scale, tp=r.spec.tp) for r in (a, b)}
    halves = []
    for roll, post in ((a, b), (b, a)):
        sch = Scheduler((models[roll.spec.name], models[post.spec.name]))  # the chains' own models
        rchain, pchain = [], []
        for k in range(min(roll.steps, post.steps)):
            crit = max(range(roll.replicas), key=lambda w: roll.traces[k][w].end_s)
            floor = mem_floor_pct("decode_large", roll.spec, roll.gpu, roll.replicas * 2)
            for s in rollout_chain(roll.spec.name, crit, roll.traces[k][crit].segments, floor, 0.05):
                rchain.append(Task(s.kind, s.work_s, s.mem_min_pct, f"r{k}"))
            ref, train = max(post.post[k], key=lambda x: x[0] + x[1])
            pchain.append(Task("reference", ref, mem_floor_pct("reference", post.spec, post.gpu, post.replicas * 2)))
            pchain.append(Task("train", train, mem_floor_pct("train", post.spec, post.gpu, post.replicas * 2)))
        halves.append(sch.schedule(WorkerState.start([rchain, pchain])).makespan_s)
    tokens = sum(sum(r.tokens) for r in half)
    return Baseline("JigsawRL-async", max(halves), tokens, {"halves_s": halves})
