"""The rows of the durable store as dataclasses, its SQLite schema and its errors.

:mod:`fabric.runtime.store` reads and writes these and :mod:`fabric.runtime.store_file` creates the
schema; they are plain frozen dataclasses so that callers (reconciliation, the control service,
reports) never see SQL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.plan import CircuitPlan

__all__ = [
    "SCHEMA_VERSION", "COMMIT_STATES", "StoreError", "StoreVersionError", "StoreCorruptError", "StoreWriteError",
    "CommitRecord", "ScopeHead", "StepRecord", "DeviceStep", "MaskedPort", "DecisionRecord", "default_store_path",
]

SCHEMA_VERSION = 2  # 2: commits.plan_json holds zlib-compressed JSON (1: JSON text, still read)
COMMIT_STATES = ("intent", "committed", "failed", "aborted")  # intent = started, not finished
_FINAL_STATES = COMMIT_STATES[1:]
_COMMIT_KINDS = ("apply", "reconcile")  # "apply": a plan change; "reconcile": devices restored

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS commits (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    scope       TEXT NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ({', '.join(repr(k) for k in _COMMIT_KINDS)})),
    state       TEXT NOT NULL CHECK (state IN ('intent', 'committed', 'failed', 'aborted')),
    plan_json   BLOB NOT NULL,  -- zlib-compressed plan JSON (JSON text in rows of schema 1)
    base_id     INTEGER,
    started_at  REAL NOT NULL,
    finished_at REAL,
    note        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS commits_by_scope ON commits (scope, kind, state, id);
CREATE TABLE IF NOT EXISTS commit_steps (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    commit_id      INTEGER NOT NULL REFERENCES commits (id) ON DELETE CASCADE,
    device         TEXT NOT NULL,
    action         TEXT NOT NULL CHECK (action IN ('remove', 'add')),
    requested_json TEXT NOT NULL,
    confirmed_json TEXT NOT NULL,
    status         TEXT NOT NULL,
    detail         TEXT NOT NULL DEFAULT '',
    at             REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_by_commit ON commit_steps (commit_id, id);
CREATE TABLE IF NOT EXISTS template_cache (
    signature  TEXT PRIMARY KEY,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS masked_ports (
    device    TEXT NOT NULL,
    port      INTEGER NOT NULL,
    reason    TEXT NOT NULL,
    masked_at REAL NOT NULL,
    PRIMARY KEY (device, port)
);
CREATE TABLE IF NOT EXISTS decisions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          REAL NOT NULL,
    scope       TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    detail_json TEXT NOT NULL
);
"""

_TABLES = ("commits", "commit_steps", "template_cache", "masked_ports", "decisions")  # every table _SCHEMA makes

SimplexPairs = Sequence[tuple[int, int]]  # (ingress, egress) cross-connects in device numbering


def default_store_path() -> Path:
    """Return ``$XDG_STATE_HOME/orchestrl/fabric.db`` (``~/.local/state/orchestrl/fabric.db``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "orchestrl" / "fabric.db"


class StoreError(OrchestrlError):
    """The durable store could not be opened or used; the message names the file and the fix."""

    def __init__(self, path: str, problem: str, fix: str = "") -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"fabric store {path}: {problem}" + (f"; fix: {fix}" if fix else ""))


class StoreWriteError(StoreError):
    """A write was refused by the file system or SQLite (``kind``: full, read-only, io, locked, other).

    Nothing of the refused transaction is in the file; the caller decides what the devices must hold.
    """

    def __init__(self, path: str, problem: str, fix: str = "", *, kind: str = "other") -> None:
        self.kind = kind
        super().__init__(path, problem, fix)


class StoreVersionError(StoreError):
    """The file was written by a newer orchestrl (higher schema version) than this one."""


class StoreCorruptError(StoreError):
    """The file is not a readable SQLite database, or fails SQLite's integrity check."""


@dataclass(frozen=True)
class CommitRecord:
    """One journalled commit: the desired plan of a scope and how far applying it got."""

    id: int
    scope: str  # what the plan covers, e.g. the fabric name; reconcile targets per scope
    kind: str  # "apply": a plan change; "reconcile": devices restored to the plan after a restart
    state: str  # one of COMMIT_STATES
    plan: CircuitPlan
    base_id: int | None  # committed record the change started from (None: empty fabric)
    started_at: float  # unix time the intent was journalled
    finished_at: float | None
    note: str  # why it failed or was aborted, in words


@dataclass(frozen=True)
class ScopeHead:
    """Where a scope's journal stands: what a commit reads before it starts (one query)."""

    committed: CommitRecord | None  # the newest committed record: the plan the devices hold (None: nothing)
    in_flight: tuple[CommitRecord, ...]  # commits started and never finished, oldest first (empty: none)


@dataclass(frozen=True)
class StepRecord:
    """What one device confirmed after one bulk step of a commit."""

    commit_id: int
    device: str
    action: str  # "remove" | "add"
    requested: tuple[tuple[int, int], ...]  # simplex (ingress, egress) pairs asked for
    confirmed: tuple[tuple[int, int], ...]  # the pairs the device reported done
    status: str  # "ok" | "partial" | "failed" | "error"
    detail: str
    at: float


@dataclass(frozen=True)
class MaskedPort:
    """A duplex port kept out of planning (failed, force-blocked, or masked by an operator)."""

    device: str
    port: int
    reason: str
    masked_at: float


@dataclass(frozen=True)
class DecisionRecord:
    """One safe-window decision (committed, deferred and why), as :mod:`fabric.safe_window` reports it."""

    id: int
    at: float
    scope: str
    outcome: str
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class DeviceStep:
    """What one device confirmed after one bulk command, ready to journal (:class:`StepRecord` less ids).

    A commit's confirmations are journalled together, in one transaction with the commit's outcome
    (:meth:`fabric.runtime.store.FabricStore.finish_commit`, :meth:`~fabric.runtime.store.FabricStore.advance_commit`):
    reconciliation reads the devices, not these rows, so they need not be durable before the next
    command (see :mod:`fabric.runtime.store` on why only a commit's final write is fsync'd).
    """

    device: str
    action: str  # "remove" | "add"
    requested: tuple[tuple[int, int], ...]  # simplex (ingress, egress) pairs asked for
    confirmed: tuple[tuple[int, int], ...]  # the pairs the device reported done
    status: str  # "ok" | "partial" | "failed"
    detail: str = ""  # the device's errors, in words
