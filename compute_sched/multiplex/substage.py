"""Sub-stage graphs (JigsawRL §4.1): engine step records -> rollout sub-stages -> one chain per DP worker.

Design note
-----------
An engine reports what each forward step processed (:class:`StepRecord`: prefill tokens plus one
token per decoding sequence; the simulated engine and the vLLM adapter both keep a ``step_log`` once it is set to a list).
The tokens per step fall in one of three buckets -- [0, 128) ``decode_small``, [128, 1024)
``decode_large``, [1024, inf) ``prefill`` -- and :class:`SubStageTracker` changes the current
sub-stage only after ``L = 10`` consecutive steps in a new bucket, placing the boundary where that run
began, so a lone prefill burst does not split a decode sub-stage. A gap between steps longer than
``idle_gap_s`` (a tool call, an environment) is an ``idle`` sub-stage: the GPU waits.

Rollout behaviour is consistent across adjacent steps (§4.1, Fig. 6), so the graph of the next
step is built from the last step's records (:func:`rollout_chain`); :class:`SubStageGraph` holds one
rollout chain per DP worker, the synchronous barrier, and the reference and training sub-stages
that follow on every worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from orchestrl.compute_sched.multiplex.grid import IDLE
from orchestrl.fabric.errors import ConfigError

__all__ = ["BUCKET_EDGES", "HYSTERESIS_STEPS", "StepRecord", "Segment", "bucket_kind", "SubStageTracker",
           "SubStage", "SubStageGraph", "rollout_chain"]

BUCKET_EDGES = (128, 1024)  # §4.1: [0, 128), [128, 1024), [1024, inf) tokens per forward step
HYSTERESIS_STEPS = 10  # §4.1: L = 10


@dataclass(frozen=True)
class StepRecord:
    """One forward step of one engine instance, or a run of ``steps`` identical ones."""

    instance: int
    start_s: float
    duration_s: float  # of the whole run
    tokens: int  # tokens per forward step: prefill tokens + decoding sequences
    steps: int = 1


@dataclass(frozen=True)
class Segment:
    """A sub-stage found in step records: its kind, when it ran, and how many steps and tokens it had."""

    kind: str
    start_s: float
    end_s: float
    steps: int = 0
    tokens: float = 0.0  # tokens processed (sum over its steps)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def bucket_kind(tokens: int) -> str:
    """Return the sub-stage kind of a forward step that processed ``tokens`` tokens.

    >>> bucket_kind(8), bucket_kind(300), bucket_kind(4096)
    ('decode_small', 'decode_large', 'prefill')
    """
    if tokens < BUCKET_EDGES[0]:
        return "decode_small"
    return "decode_large" if tokens < BUCKET_EDGES[1] else "prefill"


class SubStageTracker:
    """Turn one DP worker's step records into sub-stages, with the §4.1 hysteresis.

    >>> t = SubStageTracker(hysteresis=3)
    >>> for i in range(5):
    ...     t.observe(StepRecord(0, i * 0.01, 0.01, 300))
    >>> t.observe(StepRecord(0, 0.05, 0.01, 2000))  # one burst: no change
    >>> t.observe(StepRecord(0, 0.06, 0.04, 40, steps=4))  # four small steps: a new sub-stage
    >>> [(s.kind, round(s.duration_s, 2)) for s in t.close()]
    [('decode_large', 0.06), ('decode_small', 0.04)]
    """

    def __init__(self, hysteresis: int = HYSTERESIS_STEPS, idle_gap_s: float = 0.5) -> None:
        if hysteresis < 1:
            raise ConfigError("SubStageTracker", "hysteresis", f"{hysteresis}", "an integer >= 1 (L)")
        self.hysteresis, self.idle_gap_s = hysteresis, idle_gap_s
        self.segments: list[Segment] = []
        self._cur: Segment | None = None
        self._pending: list[StepRecord] = []  # steps in another bucket, not yet L of them
        self._last_end = None

    def _extend(self, seg: Segment, rec: StepRecord) -> Segment:
        return replace(seg, end_s=rec.start_s + rec.duration_s, steps=seg.steps + rec.steps,
                       tokens=seg.tokens + rec.tokens * rec.steps)

    def observe(self, rec: StepRecord) -> None:
        """Account one record (records must come in time order)."""
        if self._last_end is not None and rec.start_s - self._last_end > self.idle_gap_s:
            self._flush_pending()
            if self._cur is not None:
                self.segments.append(self._cur)
            self.segments.append(Segment(IDLE, self._last_end, rec.start_s))
            self._cur = None
        self._last_end = rec.start_s + rec.duration_s
        kind = bucket_kind(rec.tokens)
        if self._cur is None:
            self._cur = Segment(kind, rec.start_s, rec.start_s)
        if kind == self._cur.kind:
            self._flush_pending()
            self._cur = self._extend(self._cur, rec)
            return
        if self._pending and bucket_kind(self._pending[0].tokens) != kind:
            self._flush_pending()
        self._pending.append(rec)
        if sum(r.steps for r in self._pending) >= self.hysteresis:  # a persistent shift: new sub-stage
            self.segments.append(self._cur)
            first = self._pending[0]
            new = Segment(kind, first.start_s, first.start_s)
            for r in self._pending:
                new = self._extend(new, r)
            self._cur, self._pending = new, []

    def _flush_pending(self) -> None:
        """A shift shorter than L steps: its steps belong to the current sub-stage."""
        for r in self._pending:
            self._cur = self._extend(self._cur, r)
        self._pending = []

    def close(self) -> list[Segment]:
        """Return every sub-stage found (the current one included) in time order."""
        if self._cur is not None:
            self._flush_pending()
            self.segments.append(self._cur)
            self._cur = None
        return list(self.segments)


@dataclass(frozen=True)
class SubStage:
    """A node of the sub-stage graph: one sub-stage of one pipeline on one DP worker."""

    pipeline: str
    replica: int  # DP worker
    kind: str  # train, reference, prefill, decode_large, decode_small, idle
    work_s: float  # its time alone on the worker's whole GPU(s) at 80% memory
    mem_min_pct: float = 20.0  # the lowest memory level it can run at (weights + the least KV or micro-batch)
    stage: str = "rollout"  # rollout, reference, train
    tokens: float = 0.0  # tokens it processes (rollout: the context it carries, for migration cost)
    index: int = 0  # position in its chain


@dataclass(frozen=True)
class SubStageGraph:
    """One pipeline step: a rollout chain per DP worker, a barrier, then reference and training per worker."""

    pipeline: str
    rollout: tuple[tuple[SubStage, ...], ...]  # per replica
    post: tuple[tuple[SubStage, ...], ...] = ()  # per replica: reference, train (after every rollout ends)
    meta: dict = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return len(self.rollout)

    def chain(self, replica: int) -> tuple[SubStage, ...]:
        """The replica's sub-stages in order (the barrier sits between its rollout and its post part)."""
        return self.rollout[replica] + (self.post[replica] if self.post else ())

    def critical_path_s(self) -> float:
        """The step's length alone: the slowest rollout replica, then the slowest post part."""
        roll = max((sum(s.work_s for s in c) for c in self.rollout), default=0.0)
        post = max((sum(s.work_s for s in c) for c in self.post), default=0.0)
        return roll + post


def rollout_chain(pipeline: str, replica: int, segments: Iterable[Segment], mem_min_pct: float = 20.0,
                  min_s: float = 0.0) -> tuple[SubStage, ...]:
    """Return the rollout sub-stages of one replica from its tracked segments (merging ones under ``min_s``
    into their predecessor, so a graph is not cluttered with slivers)."""
    out: list[SubStage] = []
    for seg in segments:
        if out and (seg.duration_s < min_s or seg.kind == out[-1].kind):
            last = out[-1]
            out[-1] = replace(last, work_s=last.work_s + seg.duration_s, tokens=last.tokens + seg.tokens)
            continue
        out.append(SubStage(pipeline, replica, seg.kind, seg.duration_s, 0.0 if seg.kind == IDLE else mem_min_pct,
                            "rollout", seg.tokens, len(out)))
    return tuple(out)


def chains_of(graphs: Sequence[SubStageGraph]) -> dict[tuple[str, int], tuple[SubStage, ...]]:
    """Return ``{(pipeline, replica): chain}`` for every replica of every graph."""
    return {(g.pipeline, r): g.chain(r) for g in graphs for r in range(g.replicas)}
