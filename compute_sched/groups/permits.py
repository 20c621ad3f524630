"""Run permits for the phases of one co-execution group: the intra-group schedule, enforced at run time.

Design note
-----------
This is the state machine behind ``agents/phase.py`` (RollMux §5.1); it is pure (the caller passes
the clock) so the HTTP server around it stays thin. Each resource (a rollout node, the training
pool) keeps the group's round-robin order over the jobs pinned to it, and a phase gets its permit
when it is that job's turn on *every* resource it needs and each is free, exactly the recurrence
:func:`compute_sched.groups.intra.round_robin` plans with. Releasing a permit passes each turn on.

Nothing waits forever: a permit expires ``permit_timeout_s`` after it was granted, and its job is
then marked failed (crashed or hung) and leaves every order, so the others go on; a job whose turn
it is on a free resource but that neither runs a phase nor asks within ``turn_timeout_s`` while
another job waits is failed the same way (it died between phases). A rollout that reports
``tail_threshold`` of its work done while the next job waits is told to consolidate its tail
(long-tail migration, §4.3): its resources count as free for the next phase while the tail finishes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from orchestrl.fabric.errors import ConfigError, OrchestrlError

__all__ = ["Permit", "PermitTable", "PermitRevoked", "phase_resources"]


class PermitRevoked(OrchestrlError):
    """The permit (or the job) is no longer valid: it timed out, failed, or was released already."""


def phase_resources(placement: Mapping[str, Sequence[int]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """Map ``(job, phase)`` to the resources the phase holds: its rollout nodes, or the training pool."""
    out = {}
    for job, nodes in placement.items():
        out[(job, "rollout")] = tuple(f"rollout:{n}" for n in nodes)
        out[(job, "train")] = ("train",)
    return out


@dataclass
class Permit:
    """A granted run permit."""

    permit_id: str
    job_id: str
    phase: str
    resources: tuple[str, ...]
    granted_s: float
    expires_s: float
    tail: bool = False  # the holder consolidated its tail; the resources are free for the next phase


@dataclass
class _Resource:
    order: list[str]  # round-robin order of the jobs pinned here
    turn: int = 0  # index into order of the job whose phase runs next
    holders: list[str] = field(default_factory=list)  # permit ids holding it (>1 only during a tail)
    free_since_s: float = 0.0


class PermitTable:
    """Round-robin permits for one group.

    Examples
    --------
    >>> t = PermitTable(["a", "b"], {"a": [0], "b": [0]}, permit_timeout_s=60)
    >>> t.request("b", "rollout", now=0.0) is None  # it is a's turn on rollout node 0
    True
    >>> pa = t.request("a", "rollout", now=0.0)
    >>> t.release(pa.permit_id, now=5.0)
    >>> t.request("b", "rollout", now=5.0).job_id
    'b'
    """

    def __init__(self, order: Sequence[str], placement: Mapping[str, Sequence[int]], *, permit_timeout_s: float,
                 turn_timeout_s: float | None = None, tail_threshold: float = 0.8, now: float = 0.0) -> None:
        missing = [j for j in order if j not in placement]
        if missing or len(set(order)) != len(order):
            raise ConfigError("phase group", "order", f"jobs {missing or order} lack a placement or repeat",
                              "each job once, every job with its rollout nodes")
        if permit_timeout_s <= 0:
            raise ConfigError("phase group", "permit_timeout_s", f"{permit_timeout_s}", "> 0 seconds")
        self.permit_timeout_s = permit_timeout_s
        self.turn_timeout_s = permit_timeout_s if turn_timeout_s is None else turn_timeout_s
        self.tail_threshold = tail_threshold
        self.needs = phase_resources({j: placement[j] for j in order})
        self.resources: dict[str, _Resource] = {}
        for job in order:
            for phase in ("rollout", "train"):
                for res in self.needs[(job, phase)]:
                    self.resources.setdefault(res, _Resource([], free_since_s=now)).order.append(job)
        self.permits: dict[str, Permit] = {}
        self.waiting: dict[tuple[str, str], float] = {}  # (job, phase) -> since when it asks
        self.failed: dict[str, str] = {}  # job -> why
        self.finished: set[str] = set()
        self.grants: list[tuple[str, str]] = []  # (job, phase) in grant order, for audits and tests
        self._ids = itertools.count(1)

    # -- requests from jobs ----------------------------------------------------------------------------
    def request(self, job: str, phase: str, now: float) -> Permit | None:
        """Ask for a permit; returns it when granted now, else None (ask again, e.g. after a wait)."""
        self._check_job(job)
        if (job, phase) not in self.needs:
            raise ConfigError("phase request", "phase", f"unknown phase {phase!r}", "rollout, train")
        for p in self.permits.values():
            if p.job_id == job and p.phase == phase:
                return p
        self.waiting.setdefault((job, phase), now)
        self.tick(now)
        return next((p for p in self.permits.values() if p.job_id == job and p.phase == phase), None)

    def release(self, permit_id: str, now: float) -> None:
        """End a phase: free its resources and pass each turn on."""
        permit = self._permit(permit_id)
        del self.permits[permit_id]
        for res in permit.resources:
            r = self.resources[res]
            r.holders.remove(permit_id)
            if not r.holders:
                r.free_since_s = now
        self.tick(now)

    def progress(self, permit_id: str, fraction: float, now: float) -> bool:
        """Record a rollout's progress; True tells it to consolidate its tail so the next phase can start."""
        permit = self._permit(permit_id)
        if permit.phase != "rollout" or permit.tail or fraction < self.tail_threshold:
            return False
        nxt = {self._turn_of(res) for res in permit.resources}
        if not any((j, "rollout") in self.waiting for j in nxt if j is not None and j != permit.job_id):
            return False  # nobody would use the freed GPUs; keep the batch together
        permit.tail = True
        self.tick(now)
        return True

    def finish(self, job: str, now: float) -> None:
        """A job completed its last iteration: it leaves every order."""
        self._remove(job, now)
        self.finished.add(job)

    def fail(self, job: str, reason: str, now: float) -> None:
        """Mark a job failed (crashed or hung); its permits are revoked and the others go on."""
        if job in self.failed or job in self.finished:
            return
        self._remove(job, now)
        self.failed[job] = reason

    # -- the scheduler's clock -------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Expire permits, fail jobs absent on their turn, and grant every permit that is due."""
        for p in [p for p in self.permits.values() if p.expires_s <= now]:
            self.fail(p.job_id, f"{p.phase} permit expired after {self.permit_timeout_s:g} s (crashed or hung)", now)
        progressed = True
        while progressed:
            progressed = False
            for (job, phase) in sorted(self.waiting, key=self.waiting.get):
                if self._grantable(job, phase):
                    self._grant(job, phase, now)
                    progressed = True
                    break
            if not progressed:
                progressed = self._fail_absent(now)

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do on its own (a permit expiry or an absent turn)."""
        times = [p.expires_s for p in self.permits.values()]
        if self.waiting:
            times += [r.free_since_s + self.turn_timeout_s for r in self.resources.values()
                      if r.order and not r.holders]
        return min(times, default=None)

    # -- internals ---------------------------------------------------------------------------------------
    def _grantable(self, job: str, phase: str) -> bool:
        for res in self.needs[(job, phase)]:
            r = self.resources[res]
            if not r.order or r.order[r.turn % len(r.order)] != job:
                return False
            if any(not self.permits[h].tail for h in r.holders):
                return False
        return True

    def _grant(self, job: str, phase: str, now: float) -> None:
        pid = f"p{next(self._ids)}"
        res = self.needs[(job, phase)]
        self.permits[pid] = Permit(pid, job, phase, res, now, now + self.permit_timeout_s)
        del self.waiting[(job, phase)]
        for name in res:
            r = self.resources[name]
            r.holders.append(pid)
            r.turn = (r.turn + 1) % len(r.order)
        self.grants.append((job, phase))

    def _fail_absent(self, now: float) -> bool:
        """Fail a job whose turn it is on a free resource but that neither runs nor asks for ``turn_timeout_s``.

        Such a job died or hung between phases; without this the jobs queued behind it would wait forever.
        """
        for name, r in self.resources.items():
            if not r.order or r.holders or now - r.free_since_s < self.turn_timeout_s:
                continue
            owner = r.order[r.turn % len(r.order)]
            busy = any(p.job_id == owner for p in self.permits.values()) or any(j == owner for j, _ in self.waiting)
            others = any(j != owner and name in self.needs[(j, ph)] for j, ph in self.waiting)
            if not busy and others:
                self.fail(owner, f"did not ask for its turn on {name} within {self.turn_timeout_s:g} s "
                                 "(crashed or hung between phases)", now)
                return True
        return False

    def _turn_of(self, res: str) -> str | None:
        r = self.resources[res]
        return r.order[r.turn % len(r.order)] if r.order else None

    def _remove(self, job: str, now: float) -> None:
        for pid in [pid for pid, p in self.permits.items() if p.job_id == job]:
            self.release(pid, now)
        for key in [k for k in self.waiting if k[0] == job]:
            del self.waiting[key]
        for r in self.resources.values():
            if job in r.order:
                i = r.order.index(job)
                r.order.remove(job)
                if i < r.turn:
                    r.turn -= 1
                r.turn = r.turn % len(r.order) if r.order else 0
        self.tick(now)

    def _check_job(self, job: str) -> None:
        if job in self.failed:
            raise PermitRevoked(f"job {job!r} was failed: {self.failed[job]}")
        if job in self.finished:
            raise PermitRevoked(f"job {job!r} already finished")
        if (job, "train") not in self.needs:
            known = ", ".join(sorted({j for j, _ in self.needs}))
            raise ConfigError("phase request", "job", f"unknown job {job!r}", known)

    def _permit(self, permit_id: str) -> Permit:
        try:
            return self.permits[permit_id]
        except KeyError:
            raise PermitRevoked(f"permit {permit_id!r} is not held (expired, revoked or released)") from None
