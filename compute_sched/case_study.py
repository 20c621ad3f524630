"""The §2.1 case study of OrchestrRL replayed on the simulated engine: early phase vs tail phase.

Design note
-----------
The paper measures Qwen2.5-14B on 8 H800s (TP x DP = 8, a batch of 512) at two snapshots of one
generation step: the early phase completes fastest with TP=2 (79.2 s vs 96.3 s / 138.7 s for
TP=4 / TP=8) and the tail phase with TP=8 (165.1 s vs 188.3 s / 208.4 s for TP=4 / TP=2). It does
not say where the snapshots sit, what the length cap was, or how a snapshot was re-launched, so
:class:`CaseStudySetup` makes each of these an explicit assumption that the calibration sweeps
(:mod:`compute_sched.calibration` records the sweep and the choice):

* the step is a Figure 3-shaped trace (:func:`compute_sched.traces.heavy_tailed_trace`, 64 GRPO
  groups of 8 = 512 responses, median ~2.5K tokens, 7-11% over 7.5K, cap ``max_tokens``, the §6
  15K by default), averaged over four draws so that no single draw's luck decides the fit;
* **where the tail snapshot sits** (``snapshot``):

  - ``"requests"``: the state of the running step once only ``tail_fraction`` of the batch is left
    (the step run on TP=2 instances with veRL's contiguous split, as veRL-TO ran it on the testbed,
    §6.2.2). The **tail phase** is those requests from their progress at
    that moment to completion; the **early phase** is the work before it (every other request to
    completion, the remaining ones up to that progress). The tail's requests thus carry the
    progress they really had, which differs with their start and their instance;
  - ``"tokens"``: a token window ``window_tokens`` = W: the early phase is every response's first
    W tokens, the tail phase the responses longer than W, all resumed at W;
  - ``"own-run"``: each configuration runs the whole step (veRL's contiguous split) and is cut in
    its own run at the moment only ``tail_fraction`` of the batch is left: the early phase is the
    time to that moment, the tail phase the rest of the step. Nothing is re-launched, and each
    configuration's tail is what its own split and speed left (the requests in it differ between
    configurations);

* **how a phase is launched** on the configuration under test: the early phase the way veRL splits
  a batch (contiguous chunks of the request list per instance, a GRPO group stays together); the
  tail either ``"in-place"`` (each request on the instance the step's contiguous split of the whole
  batch gave it, as a snapshot of a running step is) or ``"resplit"`` (its requests split anew).
  Resuming the tail pays a prefill of prompt + progress, as re-launching under another TP must.

With ``"requests"`` and ``"tokens"`` the boundaries are the same for every configuration, so the six
times measure the same work and their ratios isolate the step-time model; with ``"own-run"`` each
configuration's two times add up to its whole step, so their ratios also carry how its split
spreads the long requests (the imbalance §2.1 reports beside the snapshots).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.replay import launch_contiguous, trace_requests
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import Trace, heavy_tailed_trace
from orchestrl.fabric.errors import ConfigError

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
    """The assumptions that place the two §2.1 snapshots; see the module note."""

    prompts: int = 64  # GRPO groups; x responses_per_prompt = the paper's batch of 512
    responses_per_prompt: int = 8
    max_tokens: int = 15360  # the §6 15K cap (the §2.1 cap is not stated)
    seeds: tuple[int, ...] = (0, 1, 2, 3)  # the times are means over these draws of the trace
    snapshot: str = "requests"  # "requests": tail = the last tail_fraction of the batch; "tokens": window W;
    # "own-run": every configuration's own whole-step run, cut where tail_fraction of the batch is left
    tail_fraction: float = 0.25  # snapshot "requests": share of the batch still running at the tail snapshot
    reference_tp: int = 2  # snapshot "requests": the TP of the run the snapshot is taken from (veRL-TO's)
    window_tokens: int = 4096  # snapshot "tokens": W, the early phase is every response's first W tokens
    gpus: int = 8
    max_num_seqs: int | None = None  # vLLM batch limit per instance; None: the calibration's (perf.cal)
    tail_placement: str = "in-place"  # "in-place": where the step's contiguous split put each request;
    # "resplit": the tail's requests split anew in contiguous chunks

    def __post_init__(self) -> None:
        if self.snapshot not in ("requests", "tokens", "own-run"):
            raise ConfigError("CaseStudySetup", "snapshot", f"{self.snapshot!r}", "'requests', 'tokens' or 'own-run'")
        if self.tail_placement not in ("in-place", "resplit"):
            raise ConfigError("CaseStudySetup", "tail_placement", f"{self.tail_placement!r}",
                              "'in-place' or 'resplit'")
        if not 0.0 < self.tail_fraction < 1.0:
            raise ConfigError("CaseStudySetup", "tail_fraction", f"{self.tail_fraction}", "a share in (0, 1)")

    def traces(self) -> list[Trace]:
        return [heavy_tailed_trace(self.prompts, self.responses_per_prompt, self.max_tokens, seed=s)
                for s in self.seeds]

    def describe(self) -> str:
        """One line naming the assumptions, e.g. ``"tail = last 25% of requests (TP=2 run), in-place, 15K"``."""
        if self.snapshot == "requests":
            where = f"last {self.tail_fraction:.0%} of requests (TP={self.reference_tp} run)"
        elif self.snapshot == "own-run":
            return f"each TP's own run cut where {self.tail_fraction:.0%} of requests are left, cap {self.max_tokens}"
        else:
            where = f"responses past {self.window_tokens} tokens"
        return f"tail = {where}, {self.tail_placement}, cap {self.max_tokens}"


def _engine(perf: PerfModel, setup: CaseStudySetup, tp: int, lengths: dict[str, int]) -> SimEngine:
    return SimEngine(perf, homogeneous(InstanceConfig("tp", tp=tp), setup.gpus), lengths,
                     max_num_seqs=setup.max_num_seqs)


def _makespan(perf: PerfModel, setup: CaseStudySetup, tp: int, requests: list[GenerationRequest],
              lengths: dict[str, int], batch_index: dict[str, int] | None = None) -> float:
    engine = _engine(perf, setup, tp, lengths)
    if batch_index is None:
        launch_contiguous(engine, requests)
    else:  # where the step's contiguous split of its whole batch put each request
        chunk = -(-setup.prompts * setup.responses_per_prompt // len(engine.layout.instances))
        for q in requests:
            engine.add_requests([q], batch_index[q.request_id] // chunk)
    last = 0.0
    while not engine.idle():
        done = engine.advance(10.0)
        last = done[-1].finish_time_s if done else last
    return last


def _whole_step(perf: PerfModel, setup: CaseStudySetup, tp: int, trace: Trace) -> tuple[SimEngine, int]:
    """The whole batch launched on TP=``tp`` with veRL's split, and how many requests the tail snapshot leaves."""
    engine = _engine(perf, setup, tp, {q.request_id: q.output_tokens for q in trace.requests})
    launch_contiguous(engine, trace_requests(trace))
    return engine, max(1, round(setup.tail_fraction * len(trace.requests)))


def _progress_at_tail(perf: PerfModel, setup: CaseStudySetup, trace: Trace) -> dict[str, int]:
    """Progress of every request still running once only ``tail_fraction`` of the batch is left."""
    engine, left = _whole_step(perf, setup, setup.reference_tp, trace)
    while True:
        pending = engine.snapshot().pending
        if len(pending) <= left or engine.idle():
            return {r.request_id: r.generated_tokens for r in pending}
        engine.advance(1.0)


def case_study_times(perf: PerfModel, setup: CaseStudySetup | None = None,
                     tps: tuple[int, ...] = (2, 4, 8)) -> dict[tuple[str, int], float]:
    """Return the simulated seconds of each (phase, TP) of the §2.1 case study under ``perf``.

    Notes
    -----
    Per trace seed, 2 simulations per TP degree (plus one reference run with snapshot
    ``"requests"``); a few hundredths of a second each on one core.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> t = case_study_times(PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800")))
    >>> sorted(t) == [("early", 2), ("early", 4), ("early", 8), ("tail", 2), ("tail", 4), ("tail", 8)]
    True
    """
    setup = setup or CaseStudySetup()
    runs = [_one_trace(perf, setup, trace, tps) for trace in setup.traces()]
    return {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}


def _own_run(perf: PerfModel, setup: CaseStudySetup, tp: int, trace: Trace) -> tuple[float, float]:
    """(early, tail) seconds of one whole-step run on TP=``tp``, cut where ``tail_fraction`` is left."""
    engine, left = _whole_step(perf, setup, tp, trace)
    finished, cut, last = 0, None, 0.0
    while not engine.idle():
        for done in engine.advance(10.0):
            finished += 1
            last = done.finish_time_s
            if cut is None and len(trace.requests) - finished <= left:
                cut = done.finish_time_s
    cut = last if cut is None else cut
    return cut, last - cut


def _one_trace(perf: PerfModel, setup: CaseStudySetup, trace: Trace,
               tps: tuple[int, ...]) -> dict[tuple[str, int], float]:
    if setup.snapshot == "own-run":
        out: dict[tuple[str, int], float] = {}
        for tp in tps:
            out["early", tp], out["tail", tp] = _own_run(perf, setup, tp, trace)
        return out
    if setup.snapshot == "requests":
        at_tail = _progress_at_tail(perf, setup, trace)
    else:
        at_tail = {q.request_id: setup.window_tokens for q in trace.requests if q.output_tokens > setup.window_tokens}
    early = trace_requests(trace)
    early_lengths = {q.request_id: max(1, at_tail.get(q.request_id, q.output_tokens)) for q in trace.requests}
    tail = [GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id,
                              generated_tokens=at_tail[q.request_id]) for q in trace.requests if q.request_id in at_tail]
    tail_lengths = {q.request_id: q.output_tokens for q in trace.requests if q.request_id in at_tail}
    index = {q.request_id: i for i, q in enumerate(trace.requests)} if setup.tail_placement == "in-place" else None
    out: dict[tuple[str, int], float] = {}
    for tp in tps:
        out["early", tp] = _makespan(perf, setup, tp, early, early_lengths)
        out["tail", tp] = _makespan(perf, setup, tp, tail, tail_lengths, index)
    return out
