"""Generation-step traces: the JSON file format, synthetic heavy-tailed steps and sequences of steps.

Trace file (JSON)::

    {"name": "qwen14b-15k", "max_tokens": 15360,
     "requests": [{"prompt_tokens": 412, "output_tokens": 3100, "group": "p17"}, ...]}

``output_tokens`` is the response length the replay reveals only when the request finishes (the
scheduler never reads it; the clairvoyant schedules do). ``generated_tokens`` (optional, default 0)
carries progress from an earlier step, as partial rollout leaves it.

The synthetic shape follows OrchestrRL Figure 3: most responses under 7.5K tokens, a long tail up
to the cap. Responses to one prompt (a GRPO group) share the prompt's difficulty.
:func:`step_sequence` strings such steps together under step-to-step regimes taken from the seed
papers (growth then plateau, random walk, task-mix jumps, ...) for evaluating forecasts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError

__all__ = ["TraceRequest", "Trace", "load_trace", "save_trace", "heavy_tailed_trace", "drifting_steps", "REGIMES",
           "step_sequence"]


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int  # hidden from the scheduler until the request finishes
    group_id: str = ""
    generated_tokens: int = 0  # progress carried in from a previous step


@dataclass(frozen=True)
class Trace:
    name: str
    max_tokens: int
    requests: tuple[TraceRequest, ...]


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Return the trace stored in a JSON (or YAML) file; errors name the file and the field."""
    r: Reader = load_document(path)
    r.reject_unknown({"name", "max_tokens", "requests"})
    cap = r.int("max_tokens", minimum=1)
    reqs = []
    for i, q in enumerate(r.sections("requests")):
        q.reject_unknown({"id", "prompt_tokens", "output_tokens", "group", "generated_tokens"})
        out = q.int("output_tokens", minimum=1, maximum=cap)
        gen = q.int("generated_tokens", default=0, minimum=0, maximum=out - 1)
        reqs.append(TraceRequest(str(q.raw("id", f"r{i}")), q.int("prompt_tokens", minimum=1), out,
                                 str(q.raw("group", "")), gen))
    if not reqs:
        raise r.error("requests", "is empty", "one or more requests")
    return Trace(r.str("name", default=os.path.basename(os.fspath(path))), cap, tuple(reqs))


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    doc = {"name": trace.name, "max_tokens": trace.max_tokens,
           "requests": [{"id": q.request_id, "prompt_tokens": q.prompt_tokens, "output_tokens": q.output_tokens,
                         "group": q.group_id, **({"generated_tokens": q.generated_tokens}
                                                 if q.generated_tokens else {})} for q in trace.requests]}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


def _lengths(rng: np.random.Generator, prompts: int, k: int, max_tokens: int, scale: float | np.ndarray, *,
             hard_share: float = 0.12, easy_scale: float = 1.0) -> np.ndarray:
    """Output lengths (prompts x k): a prompt's difficulty sets its median; ~12% of prompts are hard.

    ``scale`` multiplies every median (a number, or one per prompt); ``easy_scale`` only the easy
    prompts' (the hard ones keep the tail).
    """
    hard = rng.random(prompts) < hard_share
    median = np.where(hard, 7000.0, 2400.0 * easy_scale) * scale * rng.lognormal(0.0, 0.35, prompts)
    out = median[:, None] * rng.lognormal(0.0, 0.55, (prompts, k))
    return np.clip(np.rint(out), 16, max_tokens).astype(int)


def heavy_tailed_trace(prompts: int, k: int, max_tokens: int, *, seed: int = 0, scale: float = 1.0,
                       name: str | None = None) -> Trace:
    """Return a trace of ``prompts`` GRPO groups of ``k`` responses shaped like OrchestrRL Figure 3.

    >>> t = heavy_tailed_trace(64, 8, 15360, seed=1)
    >>> lengths = sorted(q.output_tokens for q in t.requests)
    >>> len(lengths), lengths[len(lengths) // 2] < 7500, lengths[-1] == 15360
    (512, True, True)
    """
    rng = np.random.default_rng(seed)
    out = _lengths(rng, prompts, k, max_tokens, scale)
    prompt_len = np.clip(rng.lognormal(np.log(400), 0.5, prompts), 32, 4096).astype(int)
    reqs = tuple(TraceRequest(f"p{p}-r{j}", int(prompt_len[p]), int(out[p, j]), f"p{p}")
                 for p in range(prompts) for j in range(k))
    return Trace(name or f"heavy-tailed-{prompts}x{k}-{max_tokens}", max_tokens, reqs)


def drifting_steps(steps: int, responses: int, max_tokens: int, *, seed: int = 0, drift_per_step: float = 0.03,
                   wobble: float = 0.05) -> list[np.ndarray]:
    """Return the output lengths of ``steps`` consecutive RL steps whose lengths drift upward.

    Response lengths grow as RL training proceeds; ``drift_per_step`` is the relative growth of the
    median per step and ``wobble`` a slow oscillation around the trend.
    """
    rng = np.random.default_rng(seed)
    k = 8
    out = []
    for s in range(steps):
        scale = (1.0 + drift_per_step) ** s * (1.0 + wobble * np.sin(s / 3.0))
        out.append(_lengths(rng, responses // k, k, max_tokens, scale).ravel())
    return out


REGIMES = ("stationary", "growth-plateau", "random-walk", "shorter-skewed", "task-mix", "curriculum-shift", "drift")


def _regime_scales(regime: str, steps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-step (median scale, easy-prompt scale, share of long-task prompts) of ``regime``."""
    s = np.arange(steps, dtype=float)
    scale, easy, long_share = np.ones(steps), np.ones(steps), np.zeros(steps)
    if regime == "growth-plateau":
        scale = 0.6 + 0.9 / (1.0 + np.exp(-(s - 0.3 * steps) / max(1.0, 0.07 * steps)))
    elif regime == "random-walk":
        lo, hi = np.log(0.5), np.log(2.0)
        log_scale = 0.0
        for i in range(steps):
            scale[i] = np.exp(log_scale)
            log_scale += rng.normal(0.0, 0.05)
            log_scale = lo + abs(log_scale - lo) if log_scale < lo else hi - abs(log_scale - hi) if log_scale > hi \
                else log_scale  # reflected: the walk stays between half and twice the start
    elif regime == "shorter-skewed":
        easy = 1.0 - 0.5 * s / max(1, steps - 1)
    elif regime == "task-mix":
        long_share = rng.beta(6.0, 14.0, steps)
    elif regime == "curriculum-shift":
        scale = np.where(s >= rng.integers(steps // 3, max(steps // 3 + 1, 2 * steps // 3)), 1.6, 1.0)
    elif regime == "drift":
        scale = 1.03 ** s * (1.0 + 0.05 * np.sin(s / 3.0))
    return scale, easy, long_share


def step_sequence(regime: str, steps: int, responses: int, max_tokens: int, *, seed: int = 0,
                  k: int = 8) -> list[np.ndarray]:
    """Return the output lengths of ``steps`` consecutive RL steps whose distribution evolves as ``regime``.

    Each step draws ``responses // k`` fresh prompts (GRPO groups of ``k`` responses; a step's array
    is prompt-major, ``k`` consecutive entries per prompt) from the heavy-tailed Figure 3 shape of
    :func:`heavy_tailed_trace`, with per-step parameters set by the regime.

    Parameters
    ----------
    regime : str
        One of :data:`REGIMES` (below).
    steps, responses, max_tokens : int
        Steps in the sequence, responses per step, generation cap.
    seed : int
        Seeds both the regime's own randomness (walk, shift step, task shares) and the sampling.
    k : int
        Responses per prompt (GRPO group size; RolloutPipe §5.1 uses K = 8).

    Returns
    -------
    list of numpy.ndarray
        One int array of ``(responses // k) * k`` lengths per step, each in ``[16, max_tokens]``.

    Raises
    ------
    ConfigError
        For an unknown regime or sizes out of range.

    Notes
    -----
    What each feature rests on (seed papers in ``shared/seeds/``), and what is assumed:

    * *Heavy tail, every regime.* OrchestrRL §2 (Figure 3a): "most responses are of moderate length
      (under 7.5K tokens), but a small fraction of stragglers require substantially more decoding
      steps"; RollMux §7.2 (Figure 11): "a pronounced heavy-tailed distribution across all model
      sizes"; RollMux §2 C2: "a few straggler requests frequently reaching the maximum token
      limit" (lengths are clipped at the cap, which keeps a point mass there).
    * *Per-step sampling noise, every regime.* Each step samples new prompts; nothing carries over.
      The noise size is an assumption (the Figure 3 shape at 512 responses gives ~5% step-to-step
      spread of the mean length).
    * *GRPO groups.* RolloutPipe §2: "For K responses under the same prompt ..."; the ``k``
      responses of a prompt share its difficulty (its median), so a step's noise is that of
      ``responses // k`` prompts, not of ``responses`` lengths. The 12% hard prompts are assumed.
    * ``stationary``: RolloutPipe §5.3, "response lengths stay in the same 3.3k–3.6k token range"
      across its rounds (the Figure 3 shape has a mean of ~3.5K tokens): sampling noise only.
    * ``growth-plateau``: OrchestrRL §1, "across steps, response length distributions can drift as
      training progresses", and RollMux §2 C2 (lengths drift, stragglers reach the cap). The
      logistic shape (scale 0.6 -> 1.5, midpoint at 30% of the steps, then flat) is assumed: the
      papers say lengths drift, not how; growth that saturates at the cap is the common pattern.
    * ``random-walk``: RollMux §2 C2, "the workload is non-stationary: the distribution of response
      lengths drifts across iterations as the model updates" (no direction stated). Assumed: the
      log-median takes N(0, 0.05) steps, reflected to stay within 0.5x-2x of the start.
    * ``shorter-skewed``: JigsawRL §3.1, "easier tasks or stronger models tend to produce shorter
      responses on average, but also more skewed length distributions". Assumed: the easy prompts'
      median falls linearly to half while the hard prompts (the tail) stay, so the body shrinks and
      the tail does not: the quantiles move in different directions.
    * ``task-mix``: RollArt §6, training "on a diverse mixture of agentic tasks" (turns per task from
      1 to 48), and RollMux §2 C1 (response lengths 4k-32k across jobs). Assumed: each step's share
      of a long task (medians 2x) is drawn from Beta(6, 14) (mean 30%, sd 10%), independently per
      step: the mix jumps around a fixed mean, with no trend.
    * ``curriculum-shift``: assumed, no seed statement beyond "drifts as the model updates": the
      extreme of drift, a one-off jump of the median by 1.6x at a step drawn from the middle third
      (a harder data stage).
    * ``drift``: the monotone upward drift of :func:`drifting_steps` (3% per step, 5% wobble), kept
      for comparison with the earlier evaluation.

    Examples
    --------
    >>> seq = step_sequence("growth-plateau", 20, 512, 15360, seed=1)
    >>> len(seq), seq[0].shape, bool(np.mean(seq[-1]) > 1.8 * np.mean(seq[0]))
    (20, (512,), True)
    """
    if regime not in REGIMES:
        raise ConfigError("step_sequence", "regime", f"unknown regime {regime!r}", ", ".join(REGIMES))
    if steps < 1 or k < 1 or responses < k or max_tokens < 16:
        raise ConfigError("step_sequence", "steps/responses/k/max_tokens",
                          f"steps={steps}, responses={responses}, k={k}, max_tokens={max_tokens}",
                          "steps >= 1, responses >= k >= 1, max_tokens >= 16")
    regime_rng, sample_rng = (np.random.default_rng(s) for s in np.random.SeedSequence([seed, REGIMES.index(regime)])
                              .spawn(2))
    scale, easy, long_share = _regime_scales(regime, steps, regime_rng)
    prompts = responses // k
    out = []
    for i in range(steps):
        per_prompt = scale[i] * np.where(sample_rng.random(prompts) < long_share[i], 2.0, 1.0)
        out.append(_lengths(sample_rng, prompts, k, max_tokens, per_prompt, easy_scale=easy[i]).ravel())
    return out
