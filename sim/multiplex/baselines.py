"""The systems JigsawRL is compared with, on the same simulated steps (§5.1).

* veRL: rollout then training on the same GPUs. Two pipelines either take turns on all GPUs
  (``serial``) or each keeps half the GPUs (``split``); :func:`verl` reports the better, as a user
  would configure it.
* RollMux: disaggregated rollout and training pools (half the GPUs each), the two pipelines'
  phases interleaved round-robin with long-tail migration -- this project's RollMux
  (:func:`compute_sched.groups.intra.round_robin`). Its time is the steady-state cycle over the
  steps (the schedule's phases stagger the two jobs, so a run's first pass is a ramp a long run does
  not pay again). A consolidated tail keeps whole replicas and decodes there at the merged batch
  (:func:`consolidated_tail_end`, the engine model JigsawRL's merges are charged by); the number of
  replicas kept is RollMux's best for the case, or no migration where that is better.
* StreamRL: one-step off-policy; per pipeline a quarter of the GPUs roll out while another quarter
  trains on the previous step's samples (the step is the longer of the two).
* AReaL: fully asynchronous; rollout workers never drain (new prompts refill the batch), so a step
  costs its decode tokens at the full batch's rate, overlapped with training as in StreamRL.
* JigsawRL asynchronous (Fig. 15): each half of the GPUs hosts one pipeline's rollout and the other's
  training, multiplexed by the look-ahead scheduler; no barrier couples the two (one step apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from orchestrl.fabric.errors import ConfigError
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.multiplex.catalog import model_for
from orchestrl.compute_sched.multiplex.lookahead import Scheduler, Task, WorkerState
from orchestrl.compute_sched.multiplex.substage import rollout_chain
from orchestrl.compute_sched.multiplex.ops import migration_cost_s
from orchestrl.sim.multiplex.rollout import perf_model, steps_after
from orchestrl.sim.multiplex.runner import PipelineSteps, mem_floor_pct

__all__ = ["Baseline", "verl", "rollmux", "consolidated_tail_end", "streamrl", "areal", "jigsaw_async"]


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


def consolidated_tail_end(run: PipelineSteps, k: int, keep: int) -> tuple[float, float]:
    """RollMux's long-tail migration on step ``k``: (tail point, rollout end) when the responses still
    decoding at the tail point (the last replica's 80%, ``GroupConfig.tail_threshold``) move onto
    ``keep`` whole replicas.

    Each moved response keeps its remaining decode steps (counted on its replica's engine after the
    tail point) and is rebuilt on its new replica by recomputing its context (:func:`migration_cost_s`,
    what JigsawRL's merges are charged); the kept replicas then decode their share at the merged batch
    (:meth:`PerfModel.decode_step_s`, the batch shrinking as responses finish). Tool gaps inside the tail
    are not replayed, and the end is never before the unmigrated rollout's end (a moved response does
    not decode faster at a larger batch), so the estimate errs towards RollMux.
    """
    traces = run.traces[k]
    if not 1 <= keep <= len(traces):
        raise ConfigError("RollMux baseline", "keep", f"{keep}", f"1..{len(traces)} replicas")
    t80 = max(t.at80_s for t in traces)
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


def _rollmux_cycle(half: list[PipelineSteps], cfg: GroupConfig, keep: int | None) -> tuple[float, float]:
    """(steady-state cycle, first pass) of the round robin over the steps, ``keep`` replicas per tail."""
    jobs, draws = [], []
    steps = min(r.steps for r in half)
    for r in half:
        roll, tail = [], []
        for k in range(steps):
            if keep is None:
                end = max(t.end_s for t in r.traces[k])
                roll.append(end)
                tail.append(end)
            else:
                at, end = consolidated_tail_end(r, k, keep)
                roll.append(end)
                tail.append(min(at, end))
        train = [max(a + b for a, b in r.post[k]) for k in range(steps)]
        rmax, tmax = max(roll), max(train)
        jobs.append(GroupJob(r.spec.name, (0,), rmax, tmax))
        draws.append([(roll[k] / rmax, tail[k] / rmax, train[k] / tmax) for k in range(steps)])
    one = np.array(draws).transpose(1, 0, 2)  # (iterations, jobs, 3)
    prev = None
    for passes in range(2, _MAX_PASSES + 1):
        sched = round_robin(jobs, 1, cfg, draws=np.tile(one, (passes, 1, 1)), record=True)
        ends: dict[str, list[float]] = {}
        for sg in sorted(sched.segments, key=lambda x: x.iteration):
            if sg.pool == "train":
                ends.setdefault(sg.job_id, []).append(sg.end_s)
        first = max(e[steps - 1] for e in ends.values())
        cycle = max(e[-1] - e[-1 - steps] for e in ends.values())
        if prev is not None and abs(cycle - prev) <= 1e-3 * cycle:
            break
        prev = cycle
    return cycle, first


_MAX_PASSES = 12  # the round robin repeats its cycle after a pass or two; this only caps a drifting one


def rollmux(half: list[PipelineSteps], config: GroupConfig | None = None) -> Baseline:
    """RollMux: rollout on one half, training on the other, phases round-robin (this project's scheduler).

    ``total_s`` is the steady-state time of one pass over the steps, times one (each step once per
    pipeline): the round robin staggers the jobs, so its first pass (``detail["first_pass_s"]``) is a
    ramp. The tail consolidation keeps whole replicas (at least one; ``tail_capacity_fraction`` rounded
    up to replicas) and is charged the merged batch (:func:`consolidated_tail_end`); RollMux at its best
    configuration: every count of kept replicas from that one up, and no migration, the fastest reported.
    """
    cfg = config or GroupConfig()
    d = min(r.replicas for r in half)
    options: list[int | None] = [None]
    if cfg.long_tail_migration and d > 1:
        lo = max(1, math.ceil(cfg.tail_capacity_fraction * d - 1e-9))
        options = list(range(lo, d)) + [None]
    best = None
    for keep in options:
        c = replace(cfg, tail_capacity_fraction=keep / d) if keep else replace(cfg, long_tail_migration=False)
        cycle, first = _rollmux_cycle(half, c, keep)
        if best is None or cycle < best[0]:
            best = (cycle, first, keep)
    cycle, first, keep = best
    steps = min(r.steps for r in half)
    return Baseline("RollMux", cycle, sum(sum(r.tokens[:steps]) for r in half),
                    {"cycle_s": cycle, "first_pass_s": first, "tail_replicas": keep or 0,
                     "config": f"tail on {keep} of {d} replicas" if keep else "no migration"})


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
    sch = Scheduler(model_for(a.gpu, a.spec.model, grid, scale))
    halves = []
    for roll, post in ((a, b), (b, a)):
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
