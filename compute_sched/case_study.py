"""The §2.1 case study of OrchestrRL replayed on the simulated engine: early phase vs tail phase.

Design note
-----------
The paper measures Qwen2.5-14B on 8 H800s (TP x DP = 8, a batch of 512) at two snapshots of one
generation step: the early phase completes fastest with TP=2 (79.2 s vs 96.3 s / 138.7 s for
TP=4 / TP=8) and the tail phase with TP=8 (165.1 s vs 188.3 s / 208.4 s for TP=4 / TP=2). It does
not say where the snapshots sit, so :class:`CaseStudySetup` fixes them once, before any fit:

* the step is a Figure 3-shaped trace (:func:`compute_sched.traces.heavy_tailed_trace`, 64 GRPO
  groups of 8 = 512 responses, median ~2.5K tokens, 7-11% over 7.5K, the §6 15K cap), averaged
  over four draws so that no single draw's luck decides the fit;
* the two snapshots split that step at a token window ``W`` = 4,096 tokens, where the bulk of the
  batch (71-77% of it) has finished: the **early phase** is every response's first ``W`` tokens
  (all 512 start together, prefill included), the **tail phase** the responses longer than ``W``,
  resumed at ``W`` and run to completion;
* each phase is launched on the configuration under test the way veRL splits a batch: contiguous
  chunks of the request list per instance (a GRPO group stays together). Resuming the tail pays a
  prefill of prompt + ``W`` tokens, as re-launching a snapshot under another TP degree must.

The split is the same token boundary for every configuration, so the six times measure the same
work and their ratios isolate the step-time model. ``W`` and the cap are choices the paper does not
pin down; the design note of :mod:`compute_sched.calibration` gives the fit's sensitivity to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from compute_sched.engine import GenerationRequest
from compute_sched.layout import InstanceConfig, homogeneous
from compute_sched.perf import PerfModel
from compute_sched.replay import launch_contiguous
from compute_sched.sim_engine import SimEngine
from compute_sched.traces import Trace, heavy_tailed_trace

__all__ = ["PaperPoint", "PAPER_POINTS", "CaseStudySetup", "case_study_times"]


@dataclass(frozen=True)
class PaperPoint:
    """One measured time of OrchestrRL §2.1 (Qwen2.5-14B, 8 H800s, batch 512)."""

    phase: str  # "early" or "tail"
    tp: int  # TP degree; DP = 8 / tp instances
    seconds: float


PAPER_POINTS = (PaperPoint("early", 2, 79.2), PaperPoint("early", 4, 96.3), PaperPoint("early", 8, 138.7),
                PaperPoint("tail", 2, 208.4), PaperPoint("tail", 4, 188.3), PaperPoint("tail", 8, 165.1))


@dataclass(frozen=True)
class CaseStudySetup:
    """Where the two §2.1 snapshots sit; see the module note for why these values."""

    prompts: int = 64  # GRPO groups; x responses_per_prompt = the paper's batch of 512
    responses_per_prompt: int = 8
    max_tokens: int = 15360  # the §6 15K cap (the §2.1 cap is not stated)
    seeds: tuple[int, ...] = (0, 1, 2, 3)  # the times are means over these draws of the trace
    window_tokens: int = 4096  # W: the early phase is every response's first W tokens
    gpus: int = 8
    max_num_seqs: int | None = None  # vLLM batch limit per instance; None: the calibration's (perf.cal)

    def traces(self) -> list[Trace]:
        return [heavy_tailed_trace(self.prompts, self.responses_per_prompt, self.max_tokens, seed=s)
                for s in self.seeds]


def _makespan(perf: PerfModel, setup: CaseStudySetup, tp: int, requests: list[GenerationRequest],
              lengths: dict[str, int]) -> float:
    engine = SimEngine(perf, homogeneous(InstanceConfig("tp", tp=tp), setup.gpus), lengths,
                       max_num_seqs=setup.max_num_seqs)
    launch_contiguous(engine, requests)
    last = 0.0
    while not engine.idle():
        done = engine.advance(10.0)
        last = done[-1].finish_time_s if done else last
    return last


def case_study_times(perf: PerfModel, setup: CaseStudySetup | None = None,
                     tps: tuple[int, ...] = (2, 4, 8)) -> dict[tuple[str, int], float]:
    """Return the simulated seconds of each (phase, TP) of the §2.1 case study under ``perf``.

    Notes
    -----
    12 short simulations (a few hundred jumps each); about 0.1 s on one core.

    Examples
    --------
    >>> from compute_sched.hardware import load_gpu, load_model
    >>> t = case_study_times(PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800")))
    >>> sorted(t) == [("early", 2), ("early", 4), ("early", 8), ("tail", 2), ("tail", 4), ("tail", 8)]
    True
    """
    setup = setup or CaseStudySetup()
    runs = [_one_trace(perf, setup, trace, tps) for trace in setup.traces()]
    return {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}


def _one_trace(perf: PerfModel, setup: CaseStudySetup, trace: Trace,
               tps: tuple[int, ...]) -> dict[tuple[str, int], float]:
    w = setup.window_tokens
    longer = [q for q in trace.requests if q.output_tokens > w]
    early = [GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id) for q in trace.requests]
    tail = [GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id, generated_tokens=w)
            for q in longer]
    early_lengths = {q.request_id: min(q.output_tokens, w) for q in trace.requests}
    tail_lengths = {q.request_id: q.output_tokens for q in longer}
    out: dict[tuple[str, int], float] = {}
    for tp in tps:
        out["early", tp] = _makespan(perf, setup, tp, early, early_lengths)
        out["tail", tp] = _makespan(perf, setup, tp, tail, tail_lengths)
    return out
