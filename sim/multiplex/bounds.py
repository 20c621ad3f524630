"""A lower bound on the makespan of any schedule of synchronous pipelines' steps in RLSim's JigsawRL model.

Why it exists: Fig. 12's target compares JigsawRL with veRL at its best configuration; when the target
is missed, the question is whether *any* schedule could meet it on these simulated steps. This bound
answers that: a ratio ``veRL / bound`` below the target proves the target unreachable in the model;
above it, the gap is the scheduler's (docs/jigsaw.md reports both).

The bound, per pipeline, is the sum over its steps of

* the rollout's critical sample: its turns decoded at batch size 1 from the context it starts each turn
  with, plus its own (non-blocked) tool calls -- a sample's tokens are sequential, and in the model no
  co-runner, merge or batch makes a decode step faster than ``PerfModel.decode_step_s`` at batch 1
  (slowdowns are >= 1; merged tails are priced at their combined batch);
* the step's reference and training work spread perfectly over all DP workers (the mean of the
  replicas' exclusive times): balancing moves work between workers but conserves it, co-location only
  slows it;

and synchronous GRPO chains them (a step's training waits for its rollout, the next rollout for the
training). The makespan of any schedule is at least the largest pipeline's sum. Prefill and
observation tokens are left out (zero is a lower bound on them). O(samples x turns) per step.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.sim.multiplex.rollout import perf_model
from orchestrl.sim.multiplex.runner import PipelineSteps
from orchestrl.sim.multiplex.workload import TASKS, draw_samples

__all__ = ["critical_sample_s", "pipeline_chain_s", "chain_bound_s"]


def critical_sample_s(run: PipelineSteps, step: int) -> float:
    """Seconds the slowest sample of ``run``'s step needs even alone on a GPU (batch 1, no co-runner)."""
    spec = run.spec
    perf = perf_model(spec, run.gpu)
    cfg = InstanceConfig("tp", tp=spec.tp)
    blocked = TASKS[spec.task].blocked_tools
    worst = 0.0
    for s in draw_samples(spec, step):
        ctx, t = s.prompt_tokens, 0.0
        for decode, obs, tool in s.turns:
            t += decode * perf.decode_step_s(cfg, 1, ctx) + (0.0 if blocked else tool)
            ctx += decode + obs
        worst = max(worst, t)
    return worst


def pipeline_chain_s(run: PipelineSteps) -> float:
    """A lower bound on the time any schedule needs for ``run``'s synchronous steps at its TP degree: each step's
    slowest sample decoded alone, then its reference and training spread perfectly over the workers."""
    return sum(critical_sample_s(run, k) + statistics.fmean(a + b for a, b in run.post[k]) for k in range(run.steps))


def chain_bound_s(runs: Sequence[PipelineSteps]) -> float:
    """A lower bound on the makespan of any schedule of ``runs`` (synchronous steps) on their DP workers."""
    return max(pipeline_chain_s(r) for r in runs)
