"""Tenants of the control service: jobs, their placements and tokens, and who may do what.

Design note
-----------
A job's *placement* is its GPU set; through the topology it owns the EPS ToRs and PoDs those GPUs
hang off. ToRs are owned exclusively: two jobs on one ToR would compete for its uplinks, so a
registration that touches another job's ToR is refused. A job's bearer token may only announce
intents whose GPUs lie inside its placement, which keeps every circuit it can cause on its own
ToRs' uplinks and its PoDs' boundary fibres (the service checks the plan once more before
committing). Operators hold separate tokens (from a tokens file or the environment).

Only SHA-256 digests of tokens are kept, in memory and in the ``service_jobs`` table the registry
adds to the controller's SQLite state file, so jobs and their tokens survive a restart of the
proxy; comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from orchestrl.fabric.config import load_document
from orchestrl.fabric.errors import ConfigError, OrchestrlError
from orchestrl.fabric.runtime.store import store_write_error
from orchestrl.fabric.runtime.store_checkpoint import guard_wal
from orchestrl.fabric.runtime.store_records import StoreCorruptError
from orchestrl.fabric.topology import Topology

__all__ = ["Placement", "Job", "Principal", "JobConflict", "JobRegistry", "placement_of", "load_operator_tokens",
           "JOB_ID_PATTERN", "token_digest"]

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # a job id is one URL path segment
_JOB_ID = re.compile(JOB_ID_PATTERN)
OPERATOR_TOKEN_ENV = "ORCHESTRL_OPERATOR_TOKEN"
_MIN_TOKEN_CHARS = 16

_SCHEMA = """CREATE TABLE IF NOT EXISTS service_jobs (
    job TEXT PRIMARY KEY, gpus_json TEXT NOT NULL, token_sha256 TEXT NOT NULL, registered_at REAL NOT NULL,
    intent_json TEXT)"""
# Jobs the operator removed whose circuits are not freed yet (DELETE /v1/jobs/{job} waits for the job's safe
# window). Kept in the state file, so a restart neither gives the revoked token back its rights nor forgets to
# free the circuits. A table of its own: state files written before it existed need no migration.
_SCHEMA_REMOVALS = """CREATE TABLE IF NOT EXISTS service_job_removals (
    job TEXT PRIMARY KEY, revoked_at REAL NOT NULL)"""


def _gpus_of(value: Any, topology: Topology) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(g, int) and 0 <= g < topology.gpu_count for g in value):
        raise ValueError(f"GPU list {str(value)[:60]!r} is not GPU indices of fabric {topology.name!r}")
    return value


class JobConflict(OrchestrlError):
    """A registration clashes with an existing job (placement changed, or a ToR already owned)."""


def token_digest(token: str) -> str:
    """Return the hex SHA-256 of a bearer token (what the registry stores instead of the token)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Placement:
    """The GPUs of a job and the ToRs and PoDs they hang off."""

    gpus: frozenset[int]
    tors: frozenset[str]
    pods: frozenset[int]


def placement_of(topology: Topology, gpus: Iterable[int]) -> Placement:
    """Return the placement of ``gpus`` on ``topology``.

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, pods=2, servers_per_pod=2, boundary_ports_per_pod=4))
    >>> p = placement_of(topo, [0, 1, 16])
    >>> sorted(p.tors), sorted(p.pods)
    (['pod0/tor0', 'pod0/tor1', 'pod1/tor0'], [0, 1])
    """
    gpus = frozenset(gpus)
    return Placement(gpus, frozenset(topology.tor_of_gpu(g) for g in gpus),
                     frozenset(topology.pod_of_gpu(g) for g in gpus))


@dataclass(frozen=True)
class Job:
    """A registered tenant."""

    id: str
    placement: Placement
    token_sha256: str
    registered_at: float  # unix time
    intent_doc: Mapping[str, Any] | None = None  # last announced intent, re-planned after port failures


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the operator, or one job."""

    role: str  # "operator" | "job"
    job: str | None = None
    events_only: bool = False  # a removed job's token: it may only report events until its circuits are freed


def load_operator_tokens(path: str | None) -> list[str]:
    """Return the operator tokens from a tokens file (``operator_tokens: [...]``) or the environment.

    Raises
    ------
    ConfigError
        If the file is malformed or a token is shorter than 16 characters.
    """
    if path is None:
        token = os.environ.get(OPERATOR_TOKEN_ENV, "")
        if token and len(token) < _MIN_TOKEN_CHARS:
            raise ConfigError(f"${OPERATOR_TOKEN_ENV}", "<value>", f"is {len(token)} characters long",
                              f"a token of at least {_MIN_TOKEN_CHARS} characters")
        return [token] if token else []
    r = load_document(path)
    r.reject_unknown({"operator_tokens"})
    out = []
    for field, value in r.items("operator_tokens"):
        if not isinstance(value, str) or len(value) < _MIN_TOKEN_CHARS:
            raise ConfigError(path, field, "is not a string of at least 16 characters",
                              "a random token, e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`")
        out.append(value)
    if not out:
        raise ConfigError(path, "operator_tokens", "is empty", "at least one operator token")
    return out


class JobRegistry:
    """Jobs, operator tokens and authentication, persisted next to the fabric store.

    Parameters
    ----------
    topology : Topology
        Resolves GPU sets to ToRs and PoDs.
    operator_tokens : iterable of str
        Tokens that carry the operator role.
    path : str, optional
        SQLite file to persist jobs in (the controller's state file); ``None`` or ``":memory:"``
        keeps them in memory only.
    """

    def __init__(self, topology: Topology, operator_tokens: Iterable[str], path: str | None = None) -> None:
        self.topology = topology
        self._operator = [token_digest(t) for t in operator_tokens]
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._removing: set[str] = set()  # jobs removed by the operator whose circuits are not freed yet
        self._conn: sqlite3.Connection | None = None
        self.path = path or ":memory:"
        if path not in (None, ":memory:"):
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
            try:
                self._conn.execute(_SCHEMA)
                self._conn.execute(_SCHEMA_REMOVALS)
            except sqlite3.OperationalError as exc:
                self._conn.close()
                raise store_write_error(path, exc) from exc
            self._conn.execute("PRAGMA synchronous=NORMAL")  # a durable write raises it to FULL for itself (_write)
            guard_wal(self._conn)  # the fabric store checkpoints this file in the background
            try:
                for job, gpus, digest, at, intent in self._conn.execute(
                        "SELECT job, gpus_json, token_sha256, registered_at, intent_json FROM service_jobs"):
                    placement = placement_of(topology, _gpus_of(json.loads(gpus), topology))
                    self._jobs[job] = Job(job, placement, digest, at, json.loads(intent) if intent else None)
                self._removing = {job for (job,) in self._conn.execute("SELECT job FROM service_job_removals")
                                  if job in self._jobs}
            except (ValueError, TypeError, KeyError, sqlite3.DatabaseError) as exc:
                self._conn.close()
                raise StoreCorruptError(path, f"table service_jobs holds an unreadable job ({type(exc).__name__}: "
                                        f"{exc})", "restore the file from a backup (orchestrl proxy backup)") from None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    # -- queries -----------------------------------------------------------------------------
    def get(self, job: str) -> Job | None:
        return self._jobs.get(job)

    def jobs(self) -> list[Job]:
        return sorted(self._jobs.values(), key=lambda j: j.id)

    def owner_of_tor(self, tor: str) -> str | None:
        """Return the job that owns ``tor`` (None when free)."""
        return next((j.id for j in self._jobs.values() if tor in j.placement.tors), None)

    def authenticate(self, token: str) -> Principal | None:
        """Return who holds ``token`` (None when nobody does)."""
        digest = token_digest(token)
        if any(hmac.compare_digest(digest, d) for d in self._operator):
            return Principal("operator")
        for job in list(self._jobs.values()):
            if hmac.compare_digest(digest, job.token_sha256):
                return Principal("job", job.id, events_only=job.id in self._removing)
        return None

    def revoke(self, job_id: str) -> None:
        """Revoke ``job_id``'s token for everything but reporting events (the job is being removed), durably.

        Raises
        ------
        StoreWriteError
            If the state file refuses the write (the token is then not revoked).
        """
        with self._lock:
            if job_id not in self._jobs or job_id in self._removing:
                return
            if self._conn is not None:
                self._conn.execute("PRAGMA synchronous=FULL")
                try:
                    self._execute("INSERT OR REPLACE INTO service_job_removals (job, revoked_at) VALUES (?, ?)",
                                  (job_id, time.time()))
                finally:
                    self._conn.execute("PRAGMA synchronous=NORMAL")
            self._removing.add(job_id)

    def is_removing(self, job_id: str) -> bool:
        """Whether ``job_id`` was removed by the operator and waits for its circuits to be freed."""
        return job_id in self._removing

    # -- changes -----------------------------------------------------------------------------
    def register(self, job_id: str, gpus: Iterable[int]) -> tuple[Job, str]:
        """Register ``job_id`` on ``gpus`` (or rotate its token); return the job and its new token.

        Raises
        ------
        ConfigError
            If the job id is not a valid path segment.
        JobConflict
            If the job exists with another placement, or a ToR belongs to another job.
        """
        if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
            raise ConfigError("request body", "job", f"{job_id!r} is not a valid job id",
                              "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        placement = placement_of(self.topology, gpus)
        token = secrets.token_urlsafe(24)
        with self._lock:
            old = self._jobs.get(job_id)
            if old is not None and old.placement.gpus != placement.gpus:
                raise JobConflict(f"job {job_id!r} is already registered on {len(old.placement.gpus)} other GPUs; "
                                  "a placement cannot change in place: register the new placement under a new job id")
            for tor in sorted(placement.tors):
                owner = self.owner_of_tor(tor)
                if owner is not None and owner != job_id:
                    raise JobConflict(f"ToR {tor} (PoD {self.topology.tors[tor].pod}) already belongs to job "
                                      f"{owner!r}; jobs own whole ToRs: choose GPUs on other ToRs")
            job = Job(job_id, placement, token_digest(token), old.registered_at if old else time.time(),
                      old.intent_doc if old else None)
            self._jobs[job_id] = job
            self._write(job)
        return job, token

    def remove(self, job_id: str) -> None:
        """Forget ``job_id`` and its token (durably); its circuits must be freed first."""
        with self._lock:
            if self._conn is not None:
                self._conn.execute("PRAGMA synchronous=FULL")
                try:
                    self._execute("DELETE FROM service_jobs WHERE job = ?", (job_id,))
                    self._execute("DELETE FROM service_job_removals WHERE job = ?", (job_id,))
                finally:
                    self._conn.execute("PRAGMA synchronous=NORMAL")
            self._jobs.pop(job_id, None)
            self._removing.discard(job_id)

    def _execute(self, sql: str, args: tuple = ()) -> None:
        """One statement on the state file; a refused write raises StoreWriteError (disk full, read-only, I/O)."""
        assert self._conn is not None
        try:
            self._conn.execute(sql, args)
        except sqlite3.OperationalError as exc:
            raise store_write_error(self.path, exc) from exc

    def remember_intent(self, job_id: str, doc: Mapping[str, Any]) -> None:
        """Keep ``doc`` as the job's last intent (re-planned after port failures and restarts)."""
        with self._lock:
            job = self._jobs[job_id]
            if job.intent_doc == doc:
                return  # an RL job re-announces the same few intents every iteration
            self._jobs[job_id] = Job(job.id, job.placement, job.token_sha256, job.registered_at, dict(doc))
            if self._conn is not None:  # the row exists (written at registration): only its intent changes
                # no fsync of its own: durable with the fabric journal's next write to the same file (WAL)
                self._execute("UPDATE service_jobs SET intent_json = ? WHERE job = ?", (json.dumps(doc), job_id))

    def _write(self, job: Job) -> None:
        if self._conn is None:
            return
        self._conn.execute("PRAGMA synchronous=FULL")  # a registration is durable when it returns
        try:
            self._upsert(job)
        finally:
            self._conn.execute("PRAGMA synchronous=NORMAL")

    def _upsert(self, job: Job) -> None:
        self._execute(
            "INSERT INTO service_jobs (job, gpus_json, token_sha256, registered_at, intent_json) VALUES (?,?,?,?,?) "
            "ON CONFLICT (job) DO UPDATE SET gpus_json=excluded.gpus_json, token_sha256=excluded.token_sha256, "
            "intent_json=excluded.intent_json",
            (job.id, json.dumps(sorted(job.placement.gpus)), job.token_sha256, job.registered_at,
             json.dumps(job.intent_doc) if job.intent_doc is not None else None))
