"""JigsawRL's workloads (§3.1, §5.1, Table 1): pipelines, their tasks' length, turn and tool distributions.

The paper gives the shapes, not the parameters, so each task below is an assumption made to match
what §3.1 says, written where a reader can change it:

* GSM8K: short, heavily skewed responses (the GPU spends over half the decode at a small batch);
* MATH: longer and more uniform; AIME: long (most near the cap), multi-turn;
* multi-turn: "most samples complete within 1-2 turns, a small fraction may extend to 4-5";
* Search-R1 (tool): blocked retrieval calls over FAISS IVF4096 (1-3 s on CPU), retrieved documents
  whose lengths vary by over 50%.

§5.1: GRPO, a global batch of 64 prompts, group size 4, responses capped at 8,192 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import zlib

import numpy as np

from orchestrl.fabric.errors import ConfigError

__all__ = ["Task", "TASKS", "PipelineSpec", "Sample", "draw_samples", "per_replica", "TABLE1"]


@dataclass(frozen=True)
class Task:
    """A dataset and interaction style: lognormal response length per turn, turns, observations, tool latency."""

    name: str
    prompt_tokens: int
    median_tokens: float  # median response tokens of one turn
    sigma: float  # lognormal shape: larger is more skewed
    turn_probs: tuple[float, ...] = (1.0,)  # P(1 turn), P(2 turns), ...
    obs_tokens: tuple[int, int] = (0, 0)  # tokens an environment or tool returns per turn (uniform range)
    tool_s: tuple[float, float] = (0.0, 0.0)  # tool latency per call (uniform range), blocked per batch
    blocked_tools: bool = False  # every sample waits for the whole batch's tool calls (§3.1)


_MULTI = (0.45, 0.30, 0.12, 0.08, 0.05)
TASKS = {
    "gsm8k": Task("gsm8k", 150, 330.0, 0.95),
    "math": Task("math", 200, 1100.0, 0.65),
    "aime": Task("aime", 250, 2400.0, 0.55, _MULTI, (60, 200), (0.05, 0.2)),
    "gsm8k-mt": Task("gsm8k-mt", 150, 300.0, 0.9, _MULTI, (60, 200), (0.05, 0.2)),
    "search-r1": Task("search-r1", 180, 260.0, 0.7, (0.25, 0.35, 0.25, 0.15), (300, 650), (1.0, 3.0), True),
}

#: JigsawRL Table 1: stage shares under veRL (model, task, GPUs) -> (rollout, reference, training, tool).
TABLE1 = {
    ("Qwen3-0.6B", "gsm8k", 4): (0.661, 0.142, 0.197, 0.0),
    ("Qwen3-4B", "gsm8k", 4): (0.522, 0.187, 0.291, 0.0),
    ("Qwen3-4B", "aime", 4): (0.809, 0.069, 0.122, 0.0),
    ("Qwen3-4B", "gsm8k", 64): (0.674, 0.158, 0.168, 0.0),
    ("Qwen3-4B", "search-r1", 4): (0.391, 0.166, 0.246, 0.197),
}


@dataclass(frozen=True)
class PipelineSpec:
    """One RL pipeline: its model, task, GPUs per DP worker (TP) and GRPO batch."""

    name: str
    model: str
    task: str
    tp: int = 1
    prompts: int = 64
    group: int = 4
    max_response: int = 8192
    seed: int = 0
    length_scale: float = 1.0  # an instruct-tuned variant answers shorter (Fig. 12's Instruct pipelines)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"pipeline {self.name!r}", "task", f"unknown task {self.task!r}", ", ".join(TASKS))
        for f in ("tp", "prompts", "group", "max_response"):
            if getattr(self, f) < 1:
                raise ConfigError(f"pipeline {self.name!r}", f, f"{getattr(self, f)}", ">= 1")

    @property
    def samples(self) -> int:
        return self.prompts * self.group

    def with_seed(self, seed: int) -> "PipelineSpec":
        return replace(self, seed=seed)


@dataclass(frozen=True)
class Sample:
    """One response to generate: its prompt and, per turn, decode tokens, observation tokens, tool latency."""

    sample_id: str
    prompt_tokens: int
    turns: tuple[tuple[int, int, float], ...]  # (decode tokens, observation tokens after it, tool seconds)

    @property
    def response_tokens(self) -> int:
        return sum(d + o for d, o, _ in self.turns)


def draw_samples(spec: PipelineSpec, step: int) -> list[Sample]:
    """Return the step's ``prompts x group`` samples (deterministic in ``spec.seed`` and ``step``)."""
    task = TASKS[spec.task]
    rng = np.random.default_rng([spec.seed, step, zlib.crc32(f"{spec.model}|{spec.task}".encode())])
    out = []
    probs = np.array(task.turn_probs) / sum(task.turn_probs)
    for p in range(spec.prompts):
        # a prompt's difficulty is shared by its group (GRPO samples one prompt `group` times)
        difficulty = rng.lognormal(0.0, task.sigma * 0.5)
        for g in range(spec.group):
            n_turns = int(rng.choice(len(probs), p=probs)) + 1
            budget = spec.max_response
            turns = []
            for t in range(n_turns):
                d = task.median_tokens * spec.length_scale * difficulty * rng.lognormal(0.0, task.sigma * 0.85)
                d = int(max(8, min(d, budget)))
                budget -= d
                last = t == n_turns - 1 or budget <= 64
                obs = 0 if last else int(rng.integers(task.obs_tokens[0], task.obs_tokens[1] + 1))
                tool = 0.0 if last else float(rng.uniform(*task.tool_s))
                budget -= obs
                turns.append((d, obs, tool))
                if last:
                    break
            out.append(Sample(f"{spec.name}-s{step}-p{p}-g{g}", task.prompt_tokens, tuple(turns)))
    return out


def per_replica(samples: Sequence[Sample], replicas: int) -> list[list[Sample]]:
    """Split samples round-robin over DP replicas (veRL's uniform data parallelism)."""
    return [list(samples[r::replicas]) for r in range(replicas)]
