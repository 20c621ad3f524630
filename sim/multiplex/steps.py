"""One pipeline's simulated steps on its DP workers (RLSim for JigsawRL): what :mod:`sim.multiplex.runner` schedules.

Each step's samples are drawn (:mod:`sim.multiplex.workload`), split over the replicas and run on the engine model
(:mod:`sim.multiplex.rollout`): per replica a rollout trace and the reference and training seconds of its tokens.
:func:`mem_floor_pct` is the memory floor of each sub-stage the runner builds from them. Split out of the runner
(2026-11-29), which keeps the group's event loop; the runner re-exports all three names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.multiplex.grid import IDLE, MEM_LEVELS_PCT
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex import rollout as _rollout
from orchestrl.sim.multiplex.rollout import RolloutTrace, post_times, simulate_replica
from orchestrl.sim.multiplex.workload import PipelineSpec, draw_samples, per_replica

__all__ = ["PipelineSteps", "simulate_steps", "mem_floor_pct"]


@dataclass
class PipelineSteps:
    """One pipeline's simulated steps on ``replicas`` DP workers: rollout traces and post work per replica."""

    spec: PipelineSpec
    gpu: str
    replicas: int
    traces: list[list[RolloutTrace]]  # [step][replica]
    post: list[list[tuple[float, float]]]  # [step][replica] -> (reference s, training s)
    tokens: list[int]  # per step
    #: the part of each replica's (reference, training) seconds that does not scale with its tokens (the
    #: post model's fixed cost per worker and step): balancing moves only the rest between workers
    post_fixed_s: tuple[float, float] = field(default_factory=lambda: (_rollout.REF_FIXED_S, _rollout.TRAIN_FIXED_S))

    @property
    def steps(self) -> int:
        return len(self.traces)

    def step_alone_s(self, k: int) -> float:
        """The step alone on its workers (veRL): slowest rollout, then the slowest reference + training."""
        return max(t.end_s for t in self.traces[k]) + max(r + t for r, t in self.post[k])

    def useful_flops(self, k: int) -> float:
        n = load_model(self.spec.model).active_params
        return sum(t.flops for t in self.traces[k]) + 8.0 * n * self.tokens[k]


def simulate_steps(spec: PipelineSpec, gpu: str, replicas: int, steps: int) -> PipelineSteps:
    """Simulate ``steps`` steps of ``spec`` split over ``replicas`` DP workers (each of ``spec.tp`` GPUs)."""
    for fld, v in (("replicas", replicas), ("steps", steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"pipeline {spec.name}", fld, f"{v!r}", "an integer >= 1")
    traces, post, tokens = [], [], []
    for k in range(steps):
        reps = per_replica(draw_samples(spec, k), replicas)
        trs = [simulate_replica(spec, r, gpu) for r in reps]
        traces.append(trs)
        post.append([post_times(spec, t.tokens, gpu) for t in trs])
        tokens.append(sum(t.tokens for t in trs))
    return PipelineSteps(spec, gpu, replicas, traces, post, tokens)


def mem_floor_pct(kind: str, spec: PipelineSpec, gpu: str, replicas: int, seqs: int = 0, ctx: float = 0.0) -> float:
    """Lowest memory level (of the 20-80% grid) a sub-stage of ``spec`` can run at on one worker.

    Rollout: its weights plus the KV of the sequences it holds; reference: its weights; training:
    FSDP-sharded state over the pipeline's GPUs (16 bytes a parameter) plus one micro-batch's
    activations. A floor above 80% means the stage cannot share the GPU at all (it still runs alone,
    at 80%, with what it cannot hold offloaded -- Fig. 9's CPU offload; its speed is not modelled).
    """
    m, g = load_model(spec.model), load_gpu(gpu)
    budget = g.hbm_bytes * 0.9
    if kind == IDLE:
        need = 0.0
    elif kind == "train":
        need = 16.0 * m.params_total / (replicas * spec.tp) + 34.0 * m.d_model * 1024 * m.layers / spec.tp
    elif kind == "reference":
        need = m.weight_bytes / spec.tp + 8.0 * m.d_model * 4096 * m.layers / spec.tp
    else:
        need = m.weight_bytes / spec.tp + seqs * max(ctx / max(seqs, 1), 1024) * m.kv_bytes_per_token / spec.tp
    pct = 100.0 * need / budget
    for lvl in MEM_LEVELS_PCT:
        if pct <= lvl + 1e-9:
            return float(lvl)
    return float(MEM_LEVELS_PCT[-1])
