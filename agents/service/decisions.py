"""The contract of the control service's answers: one :class:`PeriodDecision` per plan outcome.

Every field is what the HTTP API returns for a decision and what the decision log keeps, so a
trainer, an operator and a dashboard read the same record.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["PeriodDecision", "GATE_FAMILY", "scope_of", "CommitTimes"]

#: Stages that share one safe-window gate: train and train-dp run on the same communicators (§5.2).
GATE_FAMILY = {"train": "train", "train-dp": "train", "gen": "gen", "weight-sync": "weight-sync"}


def scope_of(job: str) -> str:
    """Return the journal scope of a job's circuits."""
    return f"job/{job}"


@dataclass(frozen=True)
class PeriodDecision:
    """What the service did with one plan for one communication period, as the API reports it."""

    plan_id: str  # "<job>#<n>": the n-th plan of the job
    job: str
    stage: str
    period: str
    template: str
    cache_hit: bool  # template found in the cache (Phase 2) or filled now (Phase 1)
    decision: str  # commit | defer | reject | refused (invalid plan) | failed (devices) | unchanged | starved
    reason: str  # why, in words
    circuits: int  # circuits of the plan
    window_s: float | None  # predicted safe window left when decided; None when unknown
    switch_delay_s: float  # switching time the window had to cover: per add step, its slowest device
    plan_s: float  # materialisation: aggregate, allocate, place, validate
    device_s: float  # journalled commit: journal writes + driver round trips + device switching
    removed: int = 0  # full-duplex circuits torn down
    added: int = 0  # full-duplex circuits made
    devices: tuple[str, ...] = ()  # devices touched by the commit
    commit_id: int | None = None  # journal record of the commit (of its last step)
    steps: int = 0  # bulk add/remove steps of the non-blocking order (each one journalled commit)
    attempt: int = 1  # 1 on announcement; counts retries of a deferred plan
    t_s: float = 0.0  # job clock of the decision
    at: float = field(default_factory=time.time)  # unix time of the decision
    core_asked: int | None = None  # OCS-Core circuits the intent's demand asked for (None: no tenant shares its PoDs)
    core_granted: int | None = None  # OCS-Core circuits the plan got
    queued_s: float = 0.0  # wall time from the request's arrival to its decision; the gate counts it in the window
    commit_estimate_s: float = 0.0  # the commit's own time the window had to cover too (CommitTimes.estimate)
    late_s: float | None = None  # realised: how long after the predicted window's end the switches finished (0: inside)

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "devices": list(self.devices)}


class CommitTimes:
    """How long this proxy's recent commits took beyond the switches' switching time (journal writes, planning
    checks, driver round trips).

    A safe window must hold the commit itself, not only the switching: the gate is asked for
    ``switching + estimate()``, where the estimate is the ``quantile`` of the commits of the last
    ``horizon_s`` seconds (0 with fewer than ``min_samples`` of them, so an idle proxy, or one whose
    commits all deferred for a while, tries again and measures afresh).

    >>> t = CommitTimes()
    >>> t.estimate()
    0.0
    >>> for s in (0.010, 0.012, 0.011, 0.030, 0.013): t.add(s)
    >>> t.estimate()
    0.03
    """

    def __init__(self, horizon_s: float = 60.0, min_samples: int = 5, keep: int = 64, quantile: float = 0.95) -> None:
        self.horizon_s, self.min_samples, self.quantile = horizon_s, min_samples, quantile
        self._took: deque[tuple[float, float]] = deque(maxlen=keep)

    def add(self, took_s: float) -> None:
        self._took.append((time.monotonic(), took_s))

    def estimate(self) -> float:
        now = time.monotonic()
        recent = sorted(t for at, t in self._took if now - at <= self.horizon_s)
        return recent[round(self.quantile * (len(recent) - 1))] if len(recent) >= self.min_samples else 0.0
