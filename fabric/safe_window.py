"""Safe windows: when a circuit plan may be committed without stalling a collective (§2.2, §5.2, §5.3).

Design note
-----------
A *safe window* is an interval in which no collective of a job is in flight on any of its
communicators; the slack of §2.2 is its length, ``t_start(next) - t_end(previous)``. The gate sees
only collective boundary events, so it cannot know how long the current window will last; it
predicts it from the windows that followed the same kind of boundary before. Slack is bimodal
(§2.2: back-to-back TP collectives vs. long compute or weight-sync pauses), so history is keyed by
the *transition* ``(stage, previous primitive) -> next primitive`` and each key keeps a low quantile
and an EWMA of its recent windows; the prediction is the smallest of these over every successor
seen, which errs on the short side. Too little history is *unknown*, and unknown is never safe.

Where a commit may happen depends on the stage of the plan (§5.2): Train plans (``train``,
``train-dp``) at any collective-free boundary; Gen plans only at an announced deployment boundary
(a ``deployment-boundary`` event), never mid-decoding; weight-sync plans only between a
``weight-sync-begin`` event and the broadcast it announces. A plan is committed only when the
predicted remainder of the window covers the device's switching time plus a guard; otherwise the
current plan stays and the submitted one is retried at the next window of its granularity, until
``max_defer`` deferrals have been spent.

One gate serves one job: the communicators whose traffic crosses the circuits being changed. Train
and Gen run on disjoint PoDs with disjoint circuits (§2.2), so each gets its own gate; otherwise
Gen's back-to-back decoding collectives would close every Train window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Mapping

from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.intent import STAGES

__all__ = [
    "EVENT_KINDS", "TRAIN_STAGES", "EventOrderError", "CollectiveEvent", "GateConfig", "CommitDecision",
    "PendingPlan", "WindowForecast", "SlackSummary", "SafeWindowGate", "format_duration",
]

#: Boundary events the gate understands; the last two are stage markers without a communicator.
EVENT_KINDS = ("start", "end", "deployment-boundary", "weight-sync-begin")
#: Stages that may reconfigure at any collective-free boundary within an iteration (§5.2).
TRAIN_STAGES = ("train", "train-dp")
_MARKER_STAGE = {"deployment-boundary": "gen", "weight-sync-begin": "weight-sync"}
_STAGE_MARKER = {v: k for k, v in _MARKER_STAGE.items()}


class EventOrderError(OrchestrlError, ValueError):
    """An event or a query cannot be placed in the job's timeline (bad field, wrong order)."""


def format_duration(seconds: float) -> str:
    """Return ``seconds`` in the unit a person reads at a glance (``"3.1 ms"``, ``"1.5 s"``).

    >>> format_duration(0.0031), format_duration(0.0009999999), format_duration(1.5), format_duration(2e-5)
    ('3.1 ms', '1 ms', '1.5 s', '20 us')
    """
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        value = seconds / scale
        text = f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        if abs(float(text)) >= 1:  # decide on the rounded text: 0.99999 ms is "1 ms"
            return f"{text} {unit}"
    return f"{seconds * 1e6:.3g} us"


@dataclass(frozen=True)
class CollectiveEvent:
    """One boundary event of a job, as the collective instrumentation reports it.

    ``start``/``end`` need ``communicator``, ``stage`` and ``primitive``; an ``end`` closes the oldest
    open ``start`` of the same communicator and primitive. The markers imply their stage.
    """

    kind: str  # one of EVENT_KINDS
    t_s: float  # job clock, non-decreasing across the events of one gate
    stage: str = ""  # RL stage of the collective (fabric.intent.STAGES); implied for markers
    primitive: str = ""  # e.g. "all-reduce", "all-to-all", "p2p", "broadcast"
    communicator: str = ""  # communicator (process group) id; slack is taken over all of them
    window_hint_s: float | None = None  # markers: pause length the runtime announces, if it knows

    def __post_init__(self) -> None:
        where = f"event {self.kind!r} at t_s={self.t_s}"
        if self.kind not in EVENT_KINDS:
            raise EventOrderError(f"{where}: field 'kind' is unknown (allowed: {', '.join(EVENT_KINDS)})")
        if self.kind in _MARKER_STAGE:
            implied = _MARKER_STAGE[self.kind]
            if self.stage not in ("", implied):
                raise EventOrderError(f"{where}: field 'stage' is {self.stage!r}, but this marker belongs to "
                                      f"stage {implied!r} (leave it empty)")
            object.__setattr__(self, "stage", implied)
        elif self.stage not in STAGES:
            raise EventOrderError(f"{where}: field 'stage' is {self.stage!r} (allowed: {', '.join(STAGES)})")
        elif not self.primitive or not self.communicator:
            raise EventOrderError(f"{where}: fields 'primitive' and 'communicator' are required for start/end "
                                  f"events")
        if self.window_hint_s is not None and not self.window_hint_s >= 0:
            raise EventOrderError(f"{where}: field 'window_hint_s' must be >= 0, got {self.window_hint_s}")


@dataclass(frozen=True)
class GateConfig:
    """How conservative the gate is; every default errs toward keeping the current plan."""

    quantile: float = 0.1  # low quantile of recent slack taken as the window a transition gives
    ewma_alpha: float = 0.3  # weight of the newest slack in the EWMA that catches a downward drift
    min_observations: int = 5  # fewer windows after a boundary kind than this: unknown, not safe
    history_len: int = 64  # recent windows kept per transition (bounds memory and adapts to drift)
    min_guard_s: float = 1e-3  # guard margin on top of the switching time, at least this ...
    guard_fraction: float = 0.1  # ... or this fraction of the switching time, whichever is larger
    max_defer: int = 8  # deferrals a submitted plan may take before it is rejected
    log_len: int = 1024  # decisions kept in the log (oldest dropped first)

    def __post_init__(self) -> None:
        checks = {"quantile": 0 <= self.quantile <= 1, "ewma_alpha": 0 < self.ewma_alpha <= 1,
                  "min_observations": self.min_observations >= 1, "history_len": self.history_len >= 1,
                  "min_guard_s": self.min_guard_s >= 0, "guard_fraction": self.guard_fraction >= 0,
                  "max_defer": self.max_defer >= 0, "log_len": self.log_len >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"GateConfig: field '{name}' has an invalid value {getattr(self, name)!r}")

    def guard_s(self, switch_delay_s: float) -> float:
        """Return the guard margin for a device that switches in ``switch_delay_s``."""
        return max(self.min_guard_s, self.guard_fraction * switch_delay_s)


@dataclass(frozen=True)
class CommitDecision:
    """What the gate decided for one plan at one moment, and why, in words."""

    action: str  # "commit": apply now | "defer": keep the current plan, retry later | "reject": give up
    reason: str  # human-readable, e.g. "predicted slack 3.1 ms < switch 10 ms + guard 1 ms"
    stage: str  # stage of the plan; sets the granularity (§5.2)
    window_s: float | None  # predicted window left at at_s; None when unknown or not at a boundary
    switch_delay_s: float  # switching time the window had to cover (device technology)
    at_s: float  # job time of the decision
    attempt: int  # 1 for a first try; counts retries of a pending plan
    scope: str = ""  # plan scope (e.g. "pod0/agg") for submitted plans; "" for a one-off check
    plan_id: str = ""  # caller's id of the plan, echoed back


@dataclass(frozen=True)
class PendingPlan:
    """A deferred plan waiting for the next window of its stage's granularity."""

    scope: str
    stage: str
    switch_delay_s: float
    plan_id: str
    submitted_s: float
    attempts: int  # decisions taken so far (all of them defers)


@dataclass(frozen=True)
class WindowForecast:
    """The gate's view of the current or next safe window for a stage."""

    start_s: float | None  # when the window opened (or is expected to open); None: unknown
    length_s: float | None  # predicted total slack of the window; None: unknown
    basis: str  # the boundary the prediction is keyed on, in words
    observations: int  # windows seen after that boundary kind

    def remaining_s(self, now_s: float) -> float | None:
        """Return the predicted window left at ``now_s`` (None when unknown)."""
        if self.start_s is None or self.length_s is None:
            return None
        return self.length_s - max(0.0, now_s - self.start_s)


@dataclass(frozen=True)
class SlackSummary:
    """Slack statistics of one transition ``(stage, previous) -> next`` (a row for reports)."""

    stage: str
    previous: str  # primitive (or marker) that opened the window
    next: str  # primitive whose start closed it
    count: int
    quantile_s: float
    ewma_s: float
    median_s: float


class _SlackStats:
    """Recent slack of one transition: a bounded history plus an EWMA. O(1) add, O(H log H) query."""

    def __init__(self, history_len: int) -> None:
        self.recent: deque[float] = deque(maxlen=history_len)
        self.count = 0
        self.ewma = 0.0

    def add(self, slack_s: float, alpha: float) -> None:
        self.ewma = slack_s if self.count == 0 else alpha * slack_s + (1 - alpha) * self.ewma
        self.recent.append(slack_s)
        self.count += 1

    def quantile(self, q: float) -> float:
        xs = sorted(self.recent)  # linear interpolation between order statistics, as numpy does
        pos = q * (len(xs) - 1)
        lo = int(pos)
        return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


class SafeWindowGate:
    """Track a job's collective boundaries and decide when a circuit plan may be committed.

    Parameters
    ----------
    config : GateConfig, optional
        Quantile, guard, history and retry settings.

    Notes
    -----
    ``observe`` is O(1) plus the pending retries it triggers; a prediction is O(K * H log H) for K
    successors of the current boundary and H kept windows each (K and H are small and bounded).

    Examples
    --------
    >>> gate = SafeWindowGate(GateConfig(min_observations=2))
    >>> for k in range(3):
    ...     t = k * 0.1
    ...     _ = gate.observe(CollectiveEvent("start", t, "train", "all-to-all", "ep0"))
    ...     _ = gate.observe(CollectiveEvent("end", t + 0.02, "train", "all-to-all", "ep0"))
    >>> gate.decide("train", switch_delay_s=0.025, now_s=0.22).action  # idle, ~80 ms predicted
    'commit'
    >>> d = gate.decide("train", switch_delay_s=0.1, now_s=0.22)
    >>> d.action, d.reason
    ('defer', 'predicted slack 80 ms < switch 100 ms + guard 10 ms')
    >>> gate.submit("pod0/agg", "gen", 0.025, now_s=0.22).reason[:46]
    'gen reconfigures only at a deployment boundary'
    >>> [d.action for d in gate.observe(CollectiveEvent("deployment-boundary", 0.3, window_hint_s=5.0))]
    ['commit']
    """

    def __init__(self, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()
        self._open: dict[tuple[str, str], deque[tuple[float, str]]] = {}  # (comm, prim) -> (start, stage)
        self._in_flight = 0
        self._idle_since: float | None = None  # when the job last became idle; None while busy
        self._opener: tuple[str, str] | None = None  # (stage, primitive) whose end made it idle
        self._armed: dict[str, tuple[float, float | None]] = {}  # stage -> (marker t, hint)
        self._slack: dict[tuple[str, str], dict[str, _SlackStats]] = {}
        self._last_t = float("-inf")
        self._pending: dict[str, PendingPlan] = {}
        self._log: deque[CommitDecision] = deque(maxlen=self.config.log_len)

    # ---------------------------------------------------------------- state the caller may read
    @property
    def pending(self) -> Mapping[str, PendingPlan]:
        """Deferred plans by scope (a copy)."""
        return dict(self._pending)

    @property
    def log(self) -> tuple[CommitDecision, ...]:
        """The most recent decisions, oldest first (at most ``config.log_len``)."""
        return tuple(self._log)

    @property
    def in_flight(self) -> int:
        """Collectives started and not yet ended, over all communicators."""
        return self._in_flight

    def slack_table(self) -> list[SlackSummary]:
        """Return slack statistics per ``(stage, previous) -> next`` transition, sorted."""
        q = self.config.quantile
        return [SlackSummary(stage, prev, nxt, s.count, s.quantile(q), s.ewma, s.quantile(0.5))
                for (stage, prev), succ in sorted(self._slack.items()) for nxt, s in sorted(succ.items())]

    # ---------------------------------------------------------------- events
    def observe(self, event: CollectiveEvent, lag_s: float = 0.0) -> list[CommitDecision]:
        """Record ``event``; return the decisions for pending plans retried at the window it opens.

        ``lag_s``: how long after the event the retries are decided (a controller that queued the event
        behind others' work); that much of the window is gone.

        Raises
        ------
        EventOrderError
            If the event is older than the last one, or an ``end`` has no open ``start``.
        """
        t = event.t_s
        if t < self._last_t:
            raise EventOrderError(f"event {event.kind!r} at t_s={t} is older than the previous event at "
                                  f"t_s={self._last_t}; feed events in time order")
        if event.kind == "end" and not self._open.get((event.communicator, event.primitive)):
            # refused before anything is recorded: a refused event must not move the gate's clock, or the
            # caller's next decision at its own (unmoved) clock reads as out of order
            self._on_end(event)
        self._last_t = t
        if event.kind == "start":
            self._on_start(event)
            return []
        if event.kind == "end":
            self._on_end(event)
            return self._retry(t + lag_s, set(TRAIN_STAGES) | set(self._armed)) if self._in_flight == 0 else []
        self._armed[event.stage] = (t, event.window_hint_s)
        return self._retry(t + lag_s, {event.stage}) if self._in_flight == 0 else []

    def _on_start(self, ev: CollectiveEvent) -> None:
        idle = self._in_flight == 0
        if idle and self._opener is not None and self._idle_since is not None:
            self._record(self._opener, ev.primitive, ev.t_s - self._idle_since)
        if ev.stage in self._armed:  # the marker's window closes with the stage's next collective
            t_mark, _ = self._armed.pop(ev.stage)
            opened = max(t_mark, self._idle_since) if idle and self._idle_since is not None else t_mark
            self._record((ev.stage, _STAGE_MARKER[ev.stage]), ev.primitive, ev.t_s - opened if idle else 0.0)
        self._open.setdefault((ev.communicator, ev.primitive), deque()).append((ev.t_s, ev.stage))
        self._in_flight += 1
        self._idle_since = None

    def _on_end(self, ev: CollectiveEvent) -> None:
        starts = self._open.get((ev.communicator, ev.primitive))
        if not starts:
            raise EventOrderError(f"end of {ev.primitive!r} on communicator {ev.communicator!r} at t_s={ev.t_s} "
                                  f"has no open start; report each start before its end")
        _, stage = starts.popleft()
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle_since = ev.t_s
            self._opener = (stage, ev.primitive)

    def _record(self, key: tuple[str, str], nxt: str, slack_s: float) -> None:
        stats = self._slack.setdefault(key, {}).setdefault(nxt, _SlackStats(self.config.history_len))
        stats.add(max(0.0, slack_s), self.config.ewma_alpha)

    # ---------------------------------------------------------------- prediction
    def _predict(self, key: tuple[str, str]) -> tuple[float | None, int]:
        """Return (conservative window length, observations) for the windows opened by ``key``."""
        succ = self._slack.get(key, {})
        n = sum(s.count for s in succ.values())
        if n < self.config.min_observations:
            return None, n
        q, k = self.config.quantile, self.config.min_observations
        # A rarely seen successor has no trustworthy quantile: its shortest window stands in for it.
        est = [min(s.quantile(q), s.ewma) if s.count >= k else min(s.recent) for s in succ.values()]
        return min(est), n

    def predict_window(self, stage: str) -> WindowForecast:
        """Return the current (or, while busy, the next) safe window as ``stage`` would use it.

        Train stages use the window after the last collective end; Gen and weight sync use the one
        after their stage marker, capped by the runtime's announced pause when one was given.
        """
        _check_stage(stage)
        if stage not in TRAIN_STAGES:
            marker = _STAGE_MARKER[stage]
            if stage not in self._armed:
                return WindowForecast(None, None, f"no {marker} announced", 0)
            t_mark, hint = self._armed[stage]
            length, n = self._predict((stage, marker))
            if hint is not None:
                length = hint if length is None else min(length, hint)
            start = t_mark if self._idle_since is None else max(t_mark, self._idle_since)
            return WindowForecast(start if self._in_flight == 0 else None, length, marker, n)
        if self._in_flight:  # the window opens when the last open collective ends
            ends = [(t, stage_, prim) for (_, prim), q in self._open.items() for t, stage_ in q]
            _, st, prim = max(ends)
            length, n = self._predict((st, prim))
            return WindowForecast(None, length, f"{st} {prim}", n)
        if self._opener is None:
            return WindowForecast(None, None, "no collective seen yet", 0)
        length, n = self._predict(self._opener)
        return WindowForecast(self._idle_since, length, f"{self._opener[0]} {self._opener[1]}", n)

    # ---------------------------------------------------------------- decisions
    def decide(self, stage: str, switch_delay_s: float, now_s: float) -> CommitDecision:
        """Return whether a ``stage`` plan on a device switching in ``switch_delay_s`` may commit now.

        The decision is logged; a deferred one-off check is not retried (use :meth:`submit`).

        Raises
        ------
        EventOrderError
            If ``stage`` is unknown, ``switch_delay_s`` is negative or ``now_s`` precedes the last event.
        """
        return self._decide(stage, switch_delay_s, now_s, attempt=1, scope="", plan_id="")

    def submit(self, scope: str, stage: str, switch_delay_s: float, now_s: float,
               plan_id: str = "") -> CommitDecision:
        """Offer a plan for ``scope``; commit now, or keep it pending and retry it at later windows.

        A plan already pending for ``scope`` is superseded: it is rejected (and logged) first.
        """
        old = self._pending.pop(scope, None)
        if old is not None:
            self._log.append(CommitDecision(
                "reject", f"superseded by a newer plan {plan_id or '(unnamed)'} for scope {scope!r}",
                old.stage, None, old.switch_delay_s, now_s, old.attempts, scope, old.plan_id))
        d = self._decide(stage, switch_delay_s, now_s, attempt=1, scope=scope, plan_id=plan_id)
        if d.action == "defer":
            self._pending[scope] = PendingPlan(scope, stage, switch_delay_s, plan_id, now_s, 1)
        return d

    def withdraw(self, scope: str) -> PendingPlan | None:
        """Drop the plan pending for ``scope`` (no decision logged); return it, or None."""
        return self._pending.pop(scope, None)

    def _retry(self, now_s: float, stages: set[str]) -> list[CommitDecision]:
        out = []
        for scope, p in list(self._pending.items()):
            if p.stage not in stages:
                continue  # not a window of this plan's granularity: no attempt is spent
            d = self._decide(p.stage, p.switch_delay_s, now_s, p.attempts + 1, scope, p.plan_id)
            if d.action == "defer":
                self._pending[scope] = replace(p, attempts=d.attempt)
            else:
                del self._pending[scope]
            out.append(d)
        return out

    def _decide(self, stage: str, switch_delay_s: float, now_s: float, attempt: int, scope: str,
                plan_id: str) -> CommitDecision:
        _check_stage(stage)
        if not switch_delay_s >= 0:
            raise EventOrderError(f"switch_delay_s must be >= 0 (the OCS technology's switching time), "
                                  f"got {switch_delay_s}")
        if now_s < self._last_t:
            raise EventOrderError(f"decision at now_s={now_s} precedes the last event at t_s={self._last_t}")
        action, reason, window = self._evaluate(stage, switch_delay_s, now_s)
        if action == "defer" and scope and attempt > self.config.max_defer:
            action, reason = "reject", (f"gave up after {attempt} attempts (max_defer={self.config.max_defer}); "
                                        f"last: {reason}")
        d = CommitDecision(action, reason, stage, window, switch_delay_s, now_s, attempt, scope, plan_id)
        self._log.append(d)
        return d

    def _evaluate(self, stage: str, switch_delay_s: float, now_s: float) -> tuple[str, str, float | None]:
        if self._in_flight:
            (comm, prim), q = next((k, q) for k, q in sorted(self._open.items()) if q)
            return "defer", (f"collective in flight: {prim} on communicator {comm!r} ({q[0][1]}) since "
                             f"t={q[0][0]:.6g} s; not a collective-free boundary"), None
        if stage not in TRAIN_STAGES and stage not in self._armed:
            when = "at a deployment boundary, never mid-decoding" if stage == "gen" else "right before the broadcast"
            return "defer", (f"{stage} reconfigures only {when}; no {_STAGE_MARKER[stage]} since its last "
                             "collective"), None
        fc = self.predict_window(stage)
        remaining = fc.remaining_s(now_s)
        if remaining is None:
            need = self.config.min_observations
            return "defer", (f"slack after {fc.basis} unknown ({fc.observations} windows observed, {need} "
                             f"needed); treated as not safe"), None
        guard = self.config.guard_s(switch_delay_s)
        elapsed = now_s - fc.start_s if fc.start_s is not None else 0.0
        said = f"predicted slack {format_duration(fc.length_s)}"
        if elapsed > 0:
            said += f" ({format_duration(remaining)} left after {format_duration(elapsed)})"
        need_s = f"switch {format_duration(switch_delay_s)} + guard {format_duration(guard)}"
        if remaining < switch_delay_s + guard:
            return "defer", f"{said} < {need_s}", remaining
        return "commit", f"{said} >= {need_s} after {fc.basis}", remaining


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise EventOrderError(f"stage {stage!r} is unknown (allowed: {', '.join(STAGES)})")
