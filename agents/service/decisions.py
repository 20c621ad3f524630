"""The contract of the control service's answers: one :class:`PeriodDecision` per plan outcome.

Every field is what the HTTP API returns for a decision and what the decision log keeps, so a
trainer, an operator and a dashboard read the same record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["PeriodDecision", "GATE_FAMILY", "scope_of"]

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
    queued_s: float = 0.0  # wall time the request waited for other jobs' decisions; the gate counts it in the window

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "devices": list(self.devices)}
