"""Request and response bodies of the control proxy as pydantic models; the OpenAPI document is generated from them.

Design note
-----------
The models say what JSON Schema can say (types, enums, ranges, required and unknown fields); what
depends on the fabric or on other requests (a GPU outside the topology, a group that is not a
collective, a placement clash) stays in :mod:`agents.service`, which names the field the same way.
Numbers are strict: ``"1.5"`` is not a time and ``true`` is not a GPU, as before the models
existed. A refused body answers ``{"error", "reason", "field"}`` (:class:`Error`) with the field
as a path such as ``events[3].t_s``; :mod:`agents.http.app` turns pydantic's errors into that.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from orchestrl.agents.service.checks import MAX_EVENTS_PER_BATCH, MAX_JOB_ID_CHARS
from orchestrl.agents.service.jobs import JOB_ID_PATTERN
from orchestrl.fabric.intent import STAGES
from orchestrl.fabric.safe_window import EVENT_KINDS
from orchestrl.fabric.templates.stages import TEMPLATES

__all__ = ["Error", "JobRegistration", "Job", "JobToken", "JobList", "JobRemoval", "Intent", "Decision", "Event",
           "EventBatch", "EventResult", "PortRef", "MaskRequest", "MaskResult", "UnmaskRequest", "UnmaskResult",
           "JobPlan", "Plans", "Decisions", "LogRecord", "WhoAmI", "Health", "DeviceHealth", "ReconcileRequest",
           "ReconcileResult", "Topology", "FiniteNumber"]

# A JSON number that is a number: finite, not a boolean, not a string.
FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
Stage = Literal[tuple(STAGES)]  # type: ignore[valid-type]
JobId = Annotated[str, Field(strict=True, pattern=JOB_ID_PATTERN, min_length=1, max_length=MAX_JOB_ID_CHARS)]


class _Body(BaseModel):
    """A request body: unknown fields are refused, naming them."""

    model_config = ConfigDict(extra="forbid")


class _Answer(BaseModel):
    """A response body (extra fields the service adds are kept)."""

    model_config = ConfigDict(extra="allow")


class Error(BaseModel):
    """Every refusal: a short kind, what was wrong and how to fix it, and the offending field."""

    error: str = Field(description="Short kind: unauthorized, forbidden, unprocessable, device-unavailable, ...")
    reason: str = Field(description="What was wrong and how to fix it.")
    field: Optional[str] = Field(None, description="The offending field, when one is at fault.")


# ------------------------------------------------------------------ jobs
class JobRegistration(_Body):
    job: JobId
    gpus: Union[Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1)],
                Annotated[str, Field(strict=True, min_length=1, max_length=4096)],
                Annotated[int, Field(strict=True, ge=0)]] = Field(
        description='GPU indices, or a string like "0-31,64-95" (ranges are checked against the fabric before '
                    "they are expanded).")


class Job(_Answer):
    job: str
    gpus: int = Field(description="GPUs of the placement.")
    tors: list[str]
    pods: list[int]
    registered_at: float = Field(description="Unix time of the registration.")


class JobToken(Job):
    token: str = Field(description="The job's bearer token; shown once.")


class JobList(_Answer):
    jobs: list[Job]


class JobRemoval(_Answer):
    job: str
    removed: bool = Field(description="The job, its token and its gates are gone.")
    circuits_freed: int = Field(description="Circuits of the job torn down now (0 when deferred).")
    pending_removal: bool = Field(description="Its circuits are freed in the next safe window of a device drain.")
    reason: str


# ------------------------------------------------------------------ intents and decisions
class Intent(_Body):
    """An intent document (:mod:`fabric.intent`): stage, optional Megatron layout, collectives."""

    job: Optional[JobId] = None
    stage: Stage  # type: ignore[valid-type]
    period: Optional[Annotated[str, Field(strict=True, max_length=256)]] = None
    template: Optional[Literal[tuple(TEMPLATES)]] = None  # type: ignore[valid-type]
    layout: Optional[dict[str, Any]] = None
    collectives: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=4096)]
    t_s: Optional[FiniteNumber] = Field(None, description="Job clock of the announcement (default: last event).")


class Decision(_Answer):
    plan_id: str
    job: str
    stage: str
    period: str
    template: str
    cache_hit: bool
    decision: Literal["commit", "defer", "reject", "refused", "failed", "unchanged", "starved"]
    reason: str
    circuits: int
    window_s: Optional[float] = None
    switch_delay_s: float
    plan_s: float
    device_s: float
    removed: int = 0
    added: int = 0
    devices: list[str] = []
    commit_id: Optional[int] = None
    steps: int = 0
    attempt: int = 1
    t_s: float = 0.0
    at: float = 0.0
    core_asked: Optional[int] = Field(None, description="OCS-Core circuits the intent's demand asked for.")
    core_granted: Optional[int] = Field(None, description="OCS-Core circuits the plan got (its fair share at most).")
    queued_s: float = Field(0.0, description="Seconds from the request reaching the proxy's application to its decision "
                                             "(other jobs' decisions ahead of it included); the safe-window gate counts "
                                             "them as gone from the window.")
    commit_estimate_s: float = Field(0.0, description="Seconds this proxy's commits take beyond the switching time "
                                                      "(95th percentile of the last minute's; 0 with fewer than 5): the "
                                                      "window had to hold it on top of switch_delay_s.")
    late_s: Optional[float] = Field(None, description="Realised: seconds after the predicted window's end at which the "
                                                      "switches finished (0: inside it; null: no device change or no "
                                                      "window). Counted in orchestrl_commits_after_window_total.")


class Event(_Body):
    kind: Literal[tuple(EVENT_KINDS)]  # type: ignore[valid-type]
    t_s: FiniteNumber = Field(description="Job clock, seconds.")
    stage: Optional[Stage] = None  # type: ignore[valid-type]
    primitive: Optional[Annotated[str, Field(strict=True, min_length=1, max_length=256)]] = None
    communicator: Optional[Annotated[str, Field(strict=True, min_length=1, max_length=256)]] = None
    window_hint_s: Optional[NonNegative] = None
    seq: Optional[Annotated[int, Field(strict=True, ge=0)]] = Field(
        None, description="The sender's sequence number: events are ordered by it, so a job clock that steps back "
                          "is taken as a clock step rather than as events older than the previous.")
    source: Optional[Annotated[str, Field(strict=True, min_length=1, max_length=128)]] = Field(
        None, description="Which sender numbered the events (one per host agent); default: the job.")


class EventBatch(_Body):
    events: Annotated[list[Event], Field(max_length=MAX_EVENTS_PER_BATCH)]


class EventResult(_Answer):
    accepted: int
    rejected: list[dict[str, Any]]
    decisions: list[Decision]
    clock_steps: int = Field(0, description="Times the job clock stepped back within a sender's numbered events.")


# ------------------------------------------------------------------ ports
class PortRef(_Body):
    device: StrictStr
    port: Annotated[int, Field(strict=True, ge=1)]
    reason: Literal["failed", "reserved"] = "failed"


class MaskRequest(_Body):
    ports: Annotated[list[PortRef], Field(min_length=1, max_length=65536)]
    replan: StrictBool = Field(True, description="Re-plan jobs whose circuits use a masked port.")


class MaskResult(_Answer):
    masked: list[dict[str, Any]]
    newly_masked: int
    replanned: list[Decision]


class _PortOnly(_Body):
    device: StrictStr
    port: Annotated[int, Field(strict=True, ge=1)]


class UnmaskRequest(_Body):
    ports: Annotated[list[_PortOnly], Field(min_length=1, max_length=65536)]
    replan: StrictBool = Field(True, description="Re-plan every job with an intent, now that the ports are back.")


class UnmaskResult(_Answer):
    unmasked: list[dict[str, Any]]
    not_masked: list[dict[str, Any]]
    refused: list[dict[str, Any]] = Field(description="Ports the device still reports failed or blocked.")
    replanned: list[Decision]


# ------------------------------------------------------------------ reads
class JobPlan(_Answer):
    circuits: int
    pending: Optional[str] = None
    plan: Optional[dict[str, Any]] = None


class Plans(_Answer):
    fabric: str
    jobs: dict[str, JobPlan]


class LogRecord(_Answer):
    """A record of the decision log that is not a plan's: a device's audit outcome, the state file recovering."""

    kind: Literal["audit", "storage"]
    decision: str = Field(description="drift, repaired, unreachable, recovered, in-sync, reconciled, ...")
    reason: str
    at: float
    device: Optional[str] = None


class Decisions(_Answer):
    decisions: list[Union[Decision, LogRecord]]


class WhoAmI(_Answer):
    role: Literal["operator", "job"]
    job: Optional[str] = None


class DeviceHealth(_Answer):
    device: str
    state: Literal["ok", "unreachable", "drift", "repairing", "unknown"]
    reason: str = ""
    missing: int = Field(0, description="Simplex cross-connects the journal holds and the device lacks.")
    unexpected: int = Field(0, description="Simplex cross-connects on the device the journal does not hold.")
    audited_at: Optional[float] = Field(None, description="Unix time of the device's last read-back.")


class Health(_Answer):
    status: Literal["ok", "degraded"]
    reasons: list[str] = Field(description="Why not ok, one line per device or store problem (empty when ok).")
    fabric: str
    devices: int = Field(description="Devices the proxy drives.")
    device_health: list[DeviceHealth] = Field(description="Each device as its last audit found it.")
    storage: dict[str, Any]
    jobs: int
    uptime_s: float
    reconciled: bool
    audit_period_s: float
    drift_policy: Literal["repair", "alert"]


class ReconcileRequest(_Body):
    dry_run: StrictBool = Field(False, description="Only report what would change; touch nothing.")


class ReconcileResult(_Answer):
    dry_run: bool
    ok: bool
    changes: int
    devices: list[dict[str, Any]]


class ReleaseRequest(_Body):
    dry_run: StrictBool = Field(True, description="Only list the circuits that would be released (the default).")


class ReleaseResult(_Answer):
    dry_run: bool
    released: int = Field(description="Circuits removed from the devices and the journal (0 on a dry run).")
    circuits: list[dict[str, Any]] = Field(description="The adopted circuits no job explains: device, ports, ends.")


class Topology(_Answer):
    summary: dict[str, Any]
    devices: list[dict[str, Any]]
    masked_ports: list[dict[str, Any]]
    jobs: list[Job]
