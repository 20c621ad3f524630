"""The contract between an RL stage model and the iteration loop.

Every stage (training, generation, weight sync) returns a :class:`StageResult`: how long it took,
where the time went, and what it did to the fabric. The loop composes results into iterations
(synchronous or one-step asynchronous) and never looks inside a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["StageResult", "UnservedTraffic"]


@dataclass(frozen=True)
class StageResult:
    """One stage of one RL iteration, simulated."""

    stage: str  # "train", "gen" or "weight-sync"
    time_s: float  # wall-clock seconds of the stage
    breakdown_s: Mapping[str, float] = field(default_factory=dict)  # where the time went (compute, each collective
    # kind, bubble, reconfiguration, migration, ...); parts may overlap, so they need not sum to time_s
    tokens: float = 0.0  # tokens the stage processed (trained on, or generated)
    samples: int = 0  # RL samples (responses) the stage processed
    intents: int = 0  # intents announced to the fabric controller (RFabric only)
    reconfigurations: int = 0  # circuit plan changes committed during the stage (RFabric only)
    detail: Mapping[str, Any] = field(default_factory=dict)  # stage-specific, JSON-serialisable

    def __post_init__(self) -> None:
        if not self.time_s >= 0.0:
            raise ValueError(f"StageResult {self.stage!r}: time_s must be >= 0, got {self.time_s!r}")

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "time_s": self.time_s, "breakdown_s": dict(self.breakdown_s),
                "tokens": self.tokens, "samples": self.samples, "intents": self.intents,
                "reconfigurations": self.reconfigurations, "detail": dict(self.detail)}


class UnservedTraffic(OrchestrlError, RuntimeError):
    """A stage's traffic has flows with no path on the fabric as it stands, so the stage cannot finish.

    Raised instead of returning an infinite (or NaN) stage time; the message names the period, the
    collectives, some GPU pairs without a path and how the period's circuits were chosen.
    """
