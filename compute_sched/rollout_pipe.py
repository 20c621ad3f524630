"""Rollout-to-train pipeline on the simulated engine: Slime (serial) vs CGP vs CGP+FGD (RolloutPipe §5).

One on-policy round: ``R`` prompt groups of ``K`` responses generated with fixed weights; each group
materialises ``materialize_s`` after its last response (reward, verifier, statistics); the trainer
runs a logical update of ``U`` groups in ``U * train_s_per_group`` seconds once the handoff gives it
one. Reports the trainer waiting ratio (idle / (idle + compute) up to train end) and the
rollout-to-train-end time.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from orchestrl.compute_sched.admission import CompleteGroupHandoff, FifoAdmission, FrontierAdmission, SerialHandoff
from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.layout import Layout
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import Trace
from orchestrl.fabric.errors import ConfigError

__all__ = ["PipeResult", "run_pipeline"]

MODES = ("serial", "cgp", "cgp+fgd")


@dataclass(frozen=True)
class PipeResult:
    mode: str
    rollout_end_s: float
    first_dispatch_s: float  # when the first U-group batch reached the trainer
    train_end_s: float  # rollout-to-train-end time (the round starts at 0)
    trainer_compute_s: float
    waiting_ratio: float  # trainer idle / (idle + compute) until train end


def run_pipeline(trace: Trace, perf: PerfModel, layout: Layout, mode: str, *, k: int, u: int,
                 train_s_per_group: float, frontier_width: int | None = None, materialize_s: float = 1.0,
                 tick_s: float = 1.0, reward_of=lambda rid: float(zlib.crc32(rid.encode()) % 2)) -> PipeResult:
    """Run one round of ``trace`` (groups by ``group_id``) under ``mode`` (serial, cgp or cgp+fgd)."""
    if mode not in MODES:
        raise ConfigError("run_pipeline", "mode", f"unknown mode {mode!r}", ", ".join(MODES))
    groups: dict[str, list[GenerationRequest]] = {}
    for q in trace.requests:
        groups.setdefault(q.group_id, []).append(GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens,
                                                                   q.group_id))
    if any(len(v) != k for v in groups.values()):
        raise ConfigError("run_pipeline", "k", f"groups of sizes {sorted({len(v) for v in groups.values()})}",
                          f"every group with exactly K={k} responses")
    engine = SimEngine(perf, layout, {q.request_id: q.output_tokens for q in trace.requests})
    admit = FrontierAdmission(frontier_width or u) if mode == "cgp+fgd" else FifoAdmission()
    handoff = SerialHandoff(k, u) if mode == "serial" else CompleteGroupHandoff(k, u)
    for g, reqs in groups.items():
        admit.submit_group(g, reqs)
    engine.add_requests(admit.release())
    batches = []
    rollout_end = 0.0
    while not engine.idle():
        for f in engine.advance(tick_s):
            admit.on_finished(f.request_id)
            handoff.on_response(f.group_id, f.request_id, reward_of(f.request_id), f.finish_time_s + materialize_s)
            rollout_end = max(rollout_end, f.finish_time_s)
        engine.add_requests(admit.release())
        batches += handoff.ready_batches(rollout_done=engine.idle())
    last_ready = max((g.ready_s for b in batches for g in b), default=0.0)
    trainer_free, first, compute = 0.0, None, 0.0
    for batch in batches:  # the trainer consumes U-group batches in FIFO order
        ready = last_ready if mode == "serial" else max(g.ready_s for g in batch)
        start = max(trainer_free, ready)
        first = start if first is None else first
        dur = train_s_per_group * len(batch)
        trainer_free = start + dur
        compute += dur
    return PipeResult(mode, rollout_end, first or 0.0, trainer_free, compute,
                      (trainer_free - compute) / trainer_free if trainer_free > 0 else 0.0)
