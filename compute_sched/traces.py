"""Generation-step traces: the JSON file format, and synthetic heavy-tailed and drifting traces.

Trace file (JSON)::

    {"name": "qwen14b-15k", "max_tokens": 15360,
     "requests": [{"prompt_tokens": 412, "output_tokens": 3100, "group": "p17"}, ...]}

``output_tokens`` is the response length the replay reveals only when the request finishes (the
scheduler never reads it; the oracle baseline does). ``generated_tokens`` (optional, default 0)
carries progress from an earlier step, as partial rollout leaves it.

The synthetic shape follows OrchestrRL Figure 3: most responses under 7.5K tokens, a long tail up
to the cap. Responses to one prompt (a GRPO group) share the prompt's difficulty.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from fabric.config import Reader, load_document

__all__ = ["TraceRequest", "Trace", "load_trace", "save_trace", "heavy_tailed_trace", "drifting_steps"]


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


def _lengths(rng: np.random.Generator, prompts: int, k: int, max_tokens: int, scale: float) -> np.ndarray:
    """Output lengths (prompts x k): a prompt's difficulty sets its median; ~12% of prompts are hard."""
    hard = rng.random(prompts) < 0.12
    median = np.where(hard, 7000.0, 2400.0) * scale * rng.lognormal(0.0, 0.35, prompts)
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
