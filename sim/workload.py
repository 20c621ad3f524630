"""RL steps as length traces: deepmath-style heavy tails, GRPO groups, seeded, scaled to the GPU count.

Design note
-----------
OrchestrRL §7 replays "input- and output-length traces collected on our testbed with deepmath-103k
[...] scaled to match the simulated GPU count". Lacking that trace, a step is drawn from the shape
:func:`compute_sched.traces.heavy_tailed_trace` reproduces (Figure 3: most responses under 7.5K
tokens, ~12% hard prompts whose groups run long, a tail up to the cap), GRPO groups of
``responses_per_prompt`` responses sharing a prompt's difficulty. A recorded trace file can replace
the synthetic shape; its whole GRPO groups are then resampled.

**Scaling to the GPU count.** A step holds ``responses_per_gen_gpu x generation GPUs`` responses
(App. F sizes its steps at 16 requests per GPU), rounded to whole GRPO groups, unless the run fixes
``prompts_per_step``. So a cluster twice the size runs steps twice the size: per-GPU load, and with
it the shape of a generation step, stays the same across the scales of Figure 13.

**Seeds.** Step ``k`` of a run with seed ``s`` uses seed ``s * 1_000_003 + k``: every step differs, and
the same (seed, step) gives the same trace in any process, so sweeps and the sync/async comparison
see identical work. Lengths may drift upward by ``drift_per_step`` per step (response lengths grow
as RL proceeds; ``compute_sched.traces.drifting_steps`` uses the same geometric growth).

**Train/Gen split** (the rule the simulator uses, after StreamRL [67], which OrchestrRL §7.2 follows:
"we allocate the number of GPUs to Train and Gen following [67]"). StreamRL balances the two stages'
execution times with a profiler. :func:`split_candidates` gives the splits worth profiling -- the
training GPUs a multiple of the training layout's model-parallel unit and of whole PoDs (RFabric
gives Train and Gen their own PoDs) -- and ``sim.run`` profiles each with the real Train and Gen
stages on step 0 and keeps the one with the smallest ``max(T_train, T_gen)``, the step period of a
one-step-asynchronous pipeline (``T_train + T_gen`` for a synchronous run). A run can also fix
``cluster.train_gpus``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrl.compute_sched.traces import Trace, TraceRequest, heavy_tailed_trace, load_trace
from orchestrl.fabric.errors import ConfigError

__all__ = ["StepWork", "step_trace", "step_size", "trace_work", "split_candidates", "load_source_trace",
           "STEP_SEED_STRIDE"]

STEP_SEED_STRIDE = 1_000_003  # a prime, so (seed, step) pairs never share a seed for < 1e6 steps


@dataclass(frozen=True)
class StepWork:
    """What one RL step trains on: samples and tokens (prompt plus response)."""

    samples: int
    prompt_tokens: int
    response_tokens: int
    max_sequence_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.response_tokens


def step_size(responses_per_prompt: int, responses_per_gen_gpu: int, gen_gpus: int,
              prompts_per_step: int | None = None) -> int:
    """Return the prompts of one step: fixed, or ``responses_per_gen_gpu x gen_gpus`` in whole groups.

    Examples
    --------
    >>> step_size(8, 16, 40), step_size(8, 16, 1024), step_size(8, 16, 40, prompts_per_step=64)
    (80, 2048, 64)
    """
    if prompts_per_step is not None:
        return prompts_per_step
    return max(1, math.ceil(responses_per_gen_gpu * gen_gpus / responses_per_prompt))


def step_trace(step: int, prompts: int, responses_per_prompt: int, max_tokens: int, *, seed: int = 0,
               length_scale: float = 1.0, drift_per_step: float = 0.0, source: Trace | None = None) -> Trace:
    """Return the length trace of RL step ``step``.

    Parameters
    ----------
    step : int
        Step index (0-based); lengths grow by ``(1 + drift_per_step) ** step``.
    prompts, responses_per_prompt : int
        GRPO groups of the step and their size.
    max_tokens : int
        Generation cap.
    seed : int
        Run seed; the step's own seed is ``seed * STEP_SEED_STRIDE + step``.
    length_scale, drift_per_step : float
    source : Trace, optional
        A recorded trace: its GRPO groups are resampled (with replacement, seeded) instead of drawing
        synthetic lengths; lengths are scaled and re-capped at ``max_tokens``.

    Examples
    --------
    >>> t = step_trace(0, prompts=4, responses_per_prompt=8, max_tokens=15360, seed=1)
    >>> len(t.requests), t.requests[0].group_id == t.requests[7].group_id
    (32, True)
    >>> step_trace(0, 4, 8, 15360, seed=1) == t
    True
    """
    if step < 0 or prompts < 1 or responses_per_prompt < 1:
        raise ConfigError("workload", "step", f"step {step}, {prompts} prompts of {responses_per_prompt}",
                          "step >= 0 and at least one prompt and response")
    step_seed = seed * STEP_SEED_STRIDE + step
    scale = length_scale * (1.0 + drift_per_step) ** step
    name = f"step{step}-seed{seed}"
    if source is None:
        return heavy_tailed_trace(prompts, responses_per_prompt, max_tokens, seed=step_seed, scale=scale, name=name)
    groups: dict[str, list[TraceRequest]] = {}
    for q in source.requests:
        groups.setdefault(q.group_id or q.request_id, []).append(q)
    keys = sorted(groups)
    rng = np.random.default_rng(step_seed)
    reqs = []
    for p, g in enumerate(rng.choice(len(keys), size=prompts, replace=True).tolist()):
        members = groups[keys[g]]
        for j in range(responses_per_prompt):
            q = members[j % len(members)]
            out = int(min(max_tokens, max(1, round(q.output_tokens * scale))))
            reqs.append(TraceRequest(f"p{p}-r{j}", q.prompt_tokens, out, f"p{p}"))
    return Trace(name, max_tokens, tuple(reqs))


def load_source_trace(path: str) -> Trace:
    """Return a recorded trace (errors name the file and field)."""
    return load_trace(path)


def trace_work(trace: Trace) -> StepWork:
    """Return the samples and tokens a step's trace gives the trainer.

    Examples
    --------
    >>> w = trace_work(step_trace(0, 2, 4, 15360, seed=3))
    >>> w.samples, w.tokens == w.prompt_tokens + w.response_tokens
    (8, True)
    """
    prompt = sum(q.prompt_tokens for q in trace.requests)
    resp = sum(q.output_tokens for q in trace.requests)
    longest = max((q.prompt_tokens + q.output_tokens for q in trace.requests), default=0)
    return StepWork(len(trace.requests), prompt, resp, longest)


def split_candidates(gpus: int, unit: int, pod_gpus: int = 8, *, fractions=(0.25, 0.375, 0.5, 0.625, 0.75)
                     ) -> list[int]:
    """Return training-GPU counts worth profiling for a balanced split, smallest first.

    Each is a multiple of the training layout's model-parallel unit and of ``pod_gpus`` (whole PoDs
    on RFabric; whole servers elsewhere), nearest to each fraction of the cluster, and leaves at least
    one PoD to generation.

    Examples
    --------
    >>> split_candidates(64, 8)
    [16, 24, 32, 40, 48]
    >>> split_candidates(2048, 48, 256)
    [768, 1536]
    """
    step = math.lcm(unit, pod_gpus, 8)
    out = set()
    for f in fractions:
        k = max(1, round(gpus * f / step))
        if 0 < k * step <= gpus - pod_gpus:
            out.add(k * step)
    return sorted(out)
