"""The systems JigsawRL is compared with, on the same simulated steps (§5.1).

* veRL: rollout then training on the same GPUs. Two pipelines either take turns on all GPUs
  (``serial``) or each keeps half the GPUs (``split``); :func:`verl` reports the better, as a user
  would configure it.
* RollMux: disaggregated rollout and training pools (half the GPUs each), the two pipelines'
  phases interleaved round-robin with long-tail migration -- this project's RollMux
  (:func:`compute_sched.groups.intra.round_robin`, default :class:`GroupConfig`).
* StreamRL: one-step off-policy; per pipeline a quarter of the GPUs roll out while another quarter
  trains on the previous step's samples (the step is the longer of the two).
* AReaL: fully asynchronous; rollout workers never drain (new prompts refill the batch), so a step
  costs its decode tokens at the full batch's rate, overlapped with training as in StreamRL.
* JigsawRL asynchronous (Fig. 15): each half of the GPUs hosts one pipeline's rollout and the other's
  training, multiplexed by the look-ahead scheduler; no barrier couples the two (one step apart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.multiplex.catalog import model_for
from orchestrl.compute_sched.multiplex.lookahead import Scheduler, Task, WorkerState
from orchestrl.compute_sched.multiplex.substage import rollout_chain
from orchestrl.sim.multiplex.rollout import perf_model
from orchestrl.sim.multiplex.runner import PipelineSteps, mem_floor_pct

__all__ = ["Baseline", "verl", "rollmux", "streamrl", "areal", "jigsaw_async"]


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


def rollmux(half: list[PipelineSteps], config: GroupConfig | None = None) -> Baseline:
    """RollMux: rollout on one half, training on the other, phases round-robin (this project's scheduler)."""
    cfg = config or GroupConfig()
    jobs, draws = [], []
    steps = min(r.steps for r in half)
    for r in half:
        roll = [max(t.end_s for t in r.traces[k]) for k in range(steps)]
        at80 = [max(t.at80_s for t in r.traces[k]) for k in range(steps)]
        train = [max(a + b for a, b in r.post[k]) for k in range(steps)]
        rmax, tmax = max(roll), max(train)
        jobs.append(GroupJob(r.spec.name, (0,), rmax, tmax))
        draws.append([(roll[k] / rmax, min(at80[k], roll[k]) / rmax, train[k] / tmax) for k in range(steps)])
    arr = np.array(draws).transpose(1, 0, 2)  # (iterations, jobs, 3)
    sched = round_robin(jobs, 1, cfg, draws=arr)
    total = sched.meta_iteration_s * steps
    return Baseline("RollMux", total, sum(sum(r.tokens[:steps]) for r in half),
                    {"meta_iteration_s": sched.meta_iteration_s, "rollout_util": sched.rollout_util,
                     "train_util": sched.train_util})


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
