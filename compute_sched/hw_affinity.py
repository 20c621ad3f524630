"""RollArt §3.1's cost-equivalent hardware check: agentic rollouts on 2 H800s against 6 H20s.

RollArt ran Qwen3-8B (32K context, prefix caching, TP=1) on a prefill-heavy task (FrozenLake, many
short turns) and a decode-heavy one (GEM-math, few turns of long reasoning) on two cost-equivalent
clusters (Table 2: an H800 costs 2.85 H20s): 2 H800s finished FrozenLake's rollout in as little as
0.53x the time of 6 H20s, and 6 H20s finished GEM-math's in 0.49-0.79x the time of 2 H800s. Our
H800 and H20 step times are carried from H100 measurements by datasheet ratios (an assumption,
:mod:`compute_sched.step_measured`); this module replays both tasks through a step model so the
derived GPUs can be checked against those measurements.

The paper gives neither token counts per turn nor the batch, so :func:`rollout_rows` sweeps them
(:data:`FROZENLAKE`, :data:`GEM_MATH`) and reports the range. A rollout here is GPU time only: each
instance runs its share of trajectories turn by turn in lock step (prefix caching: a turn prefills
only its new observation tokens over the cached context, then decodes its action), as many at once
as its KV cache holds at their final context, in waves; environment time is the same on both
clusters and left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import Calibration, PerfModel

__all__ = ["AgenticTask", "FROZENLAKE", "GEM_MATH", "rollout_s", "rollout_rows", "PAPER"]

#: RollArt §3.1 (Figure 4): H800 / H20 rollout time for FrozenLake, H20 / H800 for GEM-math.
PAPER = {"frozenlake_h800_over_h20": 0.53, "gem_math_h20_over_h800": (0.49, 0.79)}


@dataclass(frozen=True)
class AgenticTask:
    """One shape of agentic trajectory: tokens of the first prompt, and per turn of observation and action."""

    name: str
    turns: int
    prompt_tokens: int
    obs_tokens: int  # environment feedback prefilled at the start of every later turn
    act_tokens: int  # generated per turn

    @property
    def final_context(self) -> int:
        return self.prompt_tokens + self.turns * self.act_tokens + (self.turns - 1) * self.obs_tokens


def _grid(name: str, turns, prompts, obs, acts) -> tuple[AgenticTask, ...]:
    return tuple(AgenticTask(name, t, p, o, a) for t, p, o, a in product(turns, prompts, obs, acts)
                 if p + t * a + (t - 1) * o <= 32768)


#: FrozenLake: Table 1's 20-100 turns; a text grid (150-400 tokens) or an image (~1,500) per turn and a short
#: action (not stated: swept; shapes past the 32K context are dropped).
FROZENLAKE = _grid("FrozenLake", (20, 50, 100), (600,), (150, 400, 1500), (20, 120))
#: GEM-math: up to five turns of long reasoning with a short tool result between (not stated: swept).
GEM_MATH = _grid("GEM-math", (1, 3, 5), (300,), (100,), (1500, 4000))


def rollout_s(perf: PerfModel, task: AgenticTask, trajectories: int, *, chunk: int = 32) -> float:
    """GPU seconds for one TP=1 instance to roll out ``trajectories`` trajectories of ``task``.

    Decode steps are charged ``chunk`` at a time at their mid-point context (the step time is
    close to linear in context over a chunk).
    """
    cfg = InstanceConfig("tp", tp=1)
    cap = perf.kv_capacity_tokens(cfg)
    at_once = max(1, min(trajectories, cap // max(1, task.final_context)))
    total, left = 0.0, trajectories
    while left > 0:
        b = min(at_once, left)
        left -= b
        t = perf.prefill_s(cfg, b * task.prompt_tokens, task.prompt_tokens / 2.0)
        ctx = task.prompt_tokens
        for turn in range(task.turns):
            if turn:
                t += perf.prefill_s(cfg, b * task.obs_tokens, ctx + task.obs_tokens / 2.0)
                ctx += task.obs_tokens
            done = 0
            while done < task.act_tokens:
                k = min(chunk, task.act_tokens - done)
                t += k * perf.decode_step_s(cfg, b, b * (ctx + done + k / 2.0))
                done += k
            ctx += task.act_tokens
        total += t
    return total


def _cluster_s(perf: PerfModel, task: AgenticTask, trajectories: int, instances: int) -> float:
    return rollout_s(perf, task, math.ceil(trajectories / instances))  # the busiest instance ends the rollout


def rollout_rows(step_model: str = "measured", batches: tuple[int, ...] = (64, 256),
                 calibration: Calibration | None = None) -> list[dict]:
    """H800/H20 rollout-time ratios of every swept task shape and batch under ``step_model``.

    Both clusters use the same host constants (``calibration``, default :class:`Calibration`):
    the host is not what differs between them.
    """
    from orchestrl.compute_sched.calibration import step_model_class  # avoid an import cycle

    cls = step_model_class(step_model)
    model = load_model("Qwen3-8B")
    cal = calibration or Calibration()
    h800, h20 = cls(model, load_gpu("H800"), cal), cls(model, load_gpu("H20"), cal)
    rows = []
    for task in FROZENLAKE + GEM_MATH:
        for n in batches:
            a, b = _cluster_s(h800, task, n, 2), _cluster_s(h20, task, n, 6)
            rows.append({"task": task.name, "turns": task.turns, "obs_tokens": task.obs_tokens,
                         "act_tokens": task.act_tokens, "trajectories": n, "h800x2_s": a, "h20x6_s": b,
                         "h800_over_h20": a / b})
    return rows
