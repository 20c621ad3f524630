"""Durable controller state: the commit journal, template cache, masked ports and decision log.

Design note
-----------
The journal is write-ahead at the level of plans: a commit row with the *desired* plan is written
(state ``intent``) before any device is touched; the row is closed as ``committed``,
``failed`` or ``aborted``, together with what each device confirmed, only after the devices hold
the outcome. So after a crash at any point, ``last_committed_plan`` is the plan the fabric is
known to have reached, and ``in_flight`` names the commit that may have left devices
half-changed; :mod:`fabric.runtime.reconcile` reads the devices and restores the former.

Each journal write is one transaction of the store file (:class:`fabric.runtime.store_file.StoreFile`):
one interrupted by a crash is absent as a whole. A *durable* transaction (``synchronous=FULL``) is
on disk when it returns, at the price of an fsync, the dominant cost of a commit; so a commit makes
exactly one durable write, its last: :meth:`FabricStore.finish_commit`, with what the devices
confirmed and the outcome. The earlier records of the same commit (the desired plan,
:meth:`FabricStore.begin_commit`; closing one ordered step and journalling the next step's intent,
:meth:`FabricStore.advance_commit`; the confirmations of a failed step,
:meth:`FabricStore.record_steps`) are written with ``synchronous=NORMAL``, the file's default:
S + 1 transactions for S steps, one fsync. Why that keeps the guarantee:

* The frames of a ``NORMAL`` transaction are in the WAL file, i.e. in the OS page cache, when the
  call returns, before any device is touched. A crash of the *process* (what the crash/restart
  tests exercise) loses none of them: the journal still names the commit in flight and its
  committed predecessor, and reconciliation restores the latter.
* A power cut (or an OS crash) may lose the unsynced tail of the WAL. WAL frames are checksummed in
  a chain, so what survives is a prefix of the transactions, at least up to the last durable one:
  at worst the in-flight commit's intent and step records are gone, and the journal says the scope
  is at its last committed plan while the devices may hold part of the change. That is still
  consistent, because restart reconciliation (:func:`fabric.runtime.reconcile.reconcile`, which every
  controller runs at start-up: ``ControlService.recover``, ``JournaledCommitter.recover``) does not
  take the in-flight records' word for what the devices hold: it reads every device's
  cross-connect table and drives it back to the last committed (durable) plans, removing anything
  else. Nothing half-applied survives.
* A commit is acknowledged only after its final, durable write has returned, and that fsync
  covers every earlier frame of the WAL: an acknowledged commit is always on disk, with its steps.

The decision log is an audit trail that no recovery reads: its rows are written with
``synchronous=NORMAL`` too and become durable with the next durable write; a crash of the process
loses none of them, a power cut at most the rows since the last commit. :attr:`FabricStore.durable_writes`
counts the durable transactions, so a test can hold a commit to its one fsync.

A commit row's plan is its canonical JSON compressed with zlib (schema version 2; version 1 rows
hold the JSON text and are still read). A cluster-wide plan is ~200 kB of JSON and a change in S
steps journals S + 1 plans, so the bytes each fsync must push, and the WAL checkpoints they cause,
shrink about tenfold; each plan object is encoded once, since a job's plans recur, and so is each
step's list of pairs.

What a commit costs in statements: one read of the scope's head (:meth:`FabricStore.head`: its last
committed record and any unfinished one), then per transaction only its inserts and updates. A
commit id's scope never changes, so closing a commit this store opened needs no read of it (its
state is checked by the ``UPDATE`` itself), and a committed close knows it is the scope's newest
committed record when it prunes.

This module owns what the rows mean. Opening the file (schema, version, refusals that name the
fix), the lock, durable and non-durable transactions and the online backup are
:mod:`fabric.runtime.store_file`'s; the WAL is copied back into the database file by a background
thread (:mod:`fabric.runtime.store_checkpoint`), not inside whichever commit fills it; the row
dataclasses, the schema and the errors are :mod:`fabric.runtime.store_records`'. What callers use
of them (the records, the errors, :func:`store_write_error`, :func:`backup_state_file`) is
importable from here too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from typing import Any, Iterable, Mapping, Sequence

from orchestrl.fabric.plan import CircuitPlan, plan_from_json, plan_to_json
from orchestrl.fabric.runtime.store_file import StoreFile, backup_state_file, store_write_error
from orchestrl.fabric.runtime.store_records import (_COMMIT_KINDS, _FINAL_STATES, COMMIT_STATES, SCHEMA_VERSION, CommitRecord,
                                          DecisionRecord, DeviceStep, MaskedPort, ScopeHead, SimplexPairs, StepRecord,
                                          StoreCorruptError, StoreError, StoreVersionError, StoreWriteError,
                                          default_store_path)
from orchestrl.fabric.templates.cache import CacheEntry, TemplateCache

# The newest committed id of scope ?1: one seek per kind of the index commits_by_scope (scope, kind, state,
# id), where "scope = ? AND state = 'committed' ORDER BY id DESC" would read and sort all of the scope's rows.
_LAST_COMMITTED_ID = "SELECT max(m) FROM (" + " UNION ALL ".join(
    f"SELECT max(id) AS m FROM commits WHERE scope = ?1 AND kind = '{kind}' AND state = 'committed'"
    for kind in _COMMIT_KINDS) + ")"  # every kind the schema allows

__all__ = [
    "SCHEMA_VERSION", "COMMIT_STATES", "StoreError", "StoreVersionError", "StoreCorruptError", "StoreWriteError",
    "CommitRecord", "ScopeHead", "StepRecord", "DeviceStep", "MaskedPort", "DecisionRecord", "FabricStore",
    "default_store_path", "backup_state_file", "store_write_error",
]


class FabricStore(StoreFile):
    """SQLite-backed durable state of the fabric controller (thread-safe, one file per controller).

    Parameters
    ----------
    path : str or Path, optional
        Database file; ``":memory:"`` for a throw-away store. Default :func:`default_store_path`.
    commit_retention : int
        Finished commits kept per scope; older ones are pruned, but never the last committed
        record of a scope nor an unfinished one.
    decision_retention : int
        Decision-log rows kept in total (oldest pruned first).

    Examples
    --------
    >>> from orchestrl.fabric.plan import CircuitPlan
    >>> with FabricStore(":memory:") as store:
    ...     cid = store.begin_commit("f", CircuitPlan("f", "train", "sig", 1e9, ()))
    ...     store.finish_commit(cid, "committed")
    ...     store.last_committed("f").id == cid, store.in_flight()
    (True, [])
    """

    def __init__(self, path: str | os.PathLike | None = None, *, commit_retention: int = 200,
                 decision_retention: int = 10_000) -> None:
        if commit_retention < 1 or decision_retention < 1:
            raise ValueError("commit_retention and decision_retention must be at least 1")
        self.commit_retention = commit_retention
        self.decision_retention = decision_retention
        self._plans: dict[int, CircuitPlan] = {}  # commit id -> plan: hot paths skip re-parsing JSON
        self._docs: dict[int, tuple[CircuitPlan, bytes]] = {}  # id(plan) -> (plan, its journal document)
        self._pair_docs: dict[int, tuple[SimplexPairs, str]] = {}  # id(pairs) -> (pairs, JSON): steps recur too
        self._scopes: dict[int, str] = {}  # commit id -> scope, for commits this store opened (never changes)
        super().__init__(path)  # opens the file, and reads it through _check_readable

    def _check_readable(self, conn: sqlite3.Connection) -> None:
        """Read every scope's newest committed plan once: a garbled one is refused at start-up, not mid-commit."""
        rows = conn.execute("SELECT c.id, c.scope, c.plan_json FROM commits c JOIN (SELECT scope, max(id) AS id FROM "
                            "commits WHERE state = 'committed' GROUP BY scope) last ON c.id = last.id").fetchall()
        rows += conn.execute("SELECT id, scope, plan_json FROM commits WHERE state = 'intent'").fetchall()
        for cid, scope, doc in rows:
            self._decode(cid, scope, doc)

    def begin_commit(self, scope: str, plan: CircuitPlan, *, kind: str = "apply", base_id: int | None = None) -> int:
        """Journal ``plan`` as the desired state of ``scope`` (state ``intent``); return the commit id.

        Call this before touching any device: after a crash the record tells reconciliation that
        devices may hold a mix of the base plan and this one. Written without an fsync: it becomes
        durable with the commit's final write (see the module's design note).
        """
        with self._tx(durable=False) as c:
            cid = self._insert_intent(c, scope, plan, kind, base_id)
        self._remember(cid, plan, scope)
        return cid

    def _insert_intent(self, c: sqlite3.Connection, scope: str, plan: CircuitPlan, kind: str,
                       base_id: int | None) -> int:
        doc = self._plan_json(plan)
        cur = c.execute("INSERT INTO commits (scope, kind, state, plan_json, base_id, started_at) "
                        "VALUES (?, ?, 'intent', ?, ?, ?)", (scope, kind, doc, base_id, time.time()))
        return int(cur.lastrowid)

    def _plan_json(self, plan: CircuitPlan) -> bytes:
        """The journal's document of ``plan`` (zlib-compressed JSON), made once per plan object (a job's plans recur)."""
        with self._lock:
            got = self._docs.get(id(plan))
            if got is not None and got[0] is plan:
                return got[1]
            text = json.dumps(plan_to_json(plan, derived=False), separators=(",", ":"), allow_nan=False)
            doc = zlib.compress(text.encode("utf-8"), 1)  # level 1: ~1 ms for 200 kB, most of the gain
            _put_bounded(self._docs, id(plan), (plan, doc), 64)  # holding the plan keeps its id from being reused
            return doc

    def _remember(self, commit_id: int, plan: CircuitPlan, scope: str | None = None) -> CircuitPlan:
        with self._lock:  # ids are never reused (AUTOINCREMENT) and plans are frozen, so this never goes stale
            _put_bounded(self._plans, commit_id, plan, 256)
            if scope is not None:
                _put_bounded(self._scopes, commit_id, scope, 256)
        return plan

    def record_step(self, commit_id: int, device: str, action: str, requested: SimplexPairs,
                    confirmed: SimplexPairs, status: str, detail: str = "") -> None:
        """Append what ``device`` confirmed after one bulk ``action`` ("remove" or "add") of a commit.

        Written without an fsync, like every record of an open commit (see the module's design note).
        """
        with self._tx(durable=False) as c:
            self._require_open(c, commit_id)
            self._insert_steps(c, commit_id, [DeviceStep(device, action, tuple(requested), tuple(confirmed), status,
                                                         detail)])

    def record_steps(self, commit_id: int, steps: Iterable[DeviceStep]) -> None:
        """Append several device confirmations of one open commit in one transaction (without an fsync)."""
        with self._tx(durable=False) as c:
            self._require_open(c, commit_id)
            self._insert_steps(c, commit_id, steps)

    def _insert_steps(self, c: sqlite3.Connection, commit_id: int, steps: Iterable[DeviceStep]) -> None:
        now = time.time()
        rows = []
        for s in steps:
            requested = self._pairs_json(s.requested)  # pairs as [ingress, egress] lists
            confirmed = requested if s.confirmed is s.requested or s.confirmed == s.requested else \
                self._pairs_json(s.confirmed)
            rows.append((commit_id, s.device, s.action, requested, confirmed, s.status, s.detail, now))
        if rows:
            c.executemany("INSERT INTO commit_steps (commit_id, device, action, requested_json, confirmed_json, "
                          "status, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def _pairs_json(self, pairs: SimplexPairs) -> str:
        """The JSON of a step's pairs, made once per tuple object (a recurring step passes the same one)."""
        got = self._pair_docs.get(id(pairs))
        if got is not None and got[0] is pairs:
            return got[1]
        doc = json.dumps(pairs)
        if isinstance(pairs, tuple):  # immutable: safe to keep by identity (held, so its id is not reused)
            _put_bounded(self._pair_docs, id(pairs), (pairs, doc), 256)
        return doc

    def finish_commit(self, commit_id: int, state: str, note: str = "", steps: Iterable[DeviceStep] = ()) -> None:
        """Close an open commit as ``committed``, ``failed`` or ``aborted`` and prune old records.

        ``steps`` (what the devices confirmed) are journalled in the same transaction, the commit's
        one durable write: when this returns, the commit and all its records are on disk.
        """
        if state not in _FINAL_STATES:
            raise ValueError(f"finish_commit: state {state!r} is not one of {', '.join(_FINAL_STATES)}")
        with self._tx() as c:
            self._close(c, commit_id, state, note, steps)

    def advance_commit(self, commit_id: int, steps: Iterable[DeviceStep], plan: CircuitPlan, *,
                       kind: str = "apply") -> int:
        """Close ``commit_id`` as committed and journal ``plan`` as the next intent of its scope, atomically.

        One transaction, without an fsync (durable with the chain's final :meth:`finish_commit`):
        after a crash of the process either the step is still in flight (devices are reconciled to
        the commit before it) or it is committed and the next one is in flight; after a power cut
        the chain may be lost back to its last durable commit, to which the devices are reconciled.
        Returns the id of the new commit, whose base is ``commit_id``.
        """
        with self._tx(durable=False) as c:
            scope = self._close(c, commit_id, "committed", "", steps, prune=False)  # the chain's finish prunes
            cid = self._insert_intent(c, scope, plan, kind, commit_id)
        self._remember(cid, plan, scope)
        return cid

    def _close(self, c: sqlite3.Connection, commit_id: int, state: str, note: str, steps: Iterable[DeviceStep],
               prune: bool = True) -> str:
        """Close an open commit with its steps; return its scope (read only if this store did not open it)."""
        if c.execute("UPDATE commits SET state = ?, finished_at = ?, note = ? WHERE id = ? AND state = 'intent'",
                     (state, time.time(), note, commit_id)).rowcount != 1:
            self._require_open(c, commit_id)  # raises: no such commit, or finished already
        scope = self._scopes.get(commit_id)
        if scope is None:
            scope = c.execute("SELECT scope FROM commits WHERE id = ?", (commit_id,)).fetchone()[0]
        self._insert_steps(c, commit_id, steps)
        if prune:
            self._prune_commits(c, scope, commit_id if state == "committed" else None)
        return scope

    def _require_open(self, c: sqlite3.Connection, commit_id: int) -> str:
        row = c.execute("SELECT scope, state FROM commits WHERE id = ?", (commit_id,)).fetchone()
        if row is None:
            raise KeyError(f"fabric store {self.path}: no commit with id {commit_id}")
        if row[1] != "intent":
            raise ValueError(f"fabric store {self.path}: commit {commit_id} is already {row[1]}; "
                             "start a new commit instead")
        return row[0]

    def _prune_commits(self, c: sqlite3.Connection, scope: str, keep_last: int | None = None) -> None:
        """Delete the scope's finished commits past the newest ``commit_retention``, never its last committed one.

        ``keep_last``: that record when the caller knows it (it just committed it), else it is read.
        """
        if keep_last is None:
            keep_last = c.execute(_LAST_COMMITTED_ID, (scope,)).fetchone()[0]
        c.execute("DELETE FROM commits WHERE scope = ? AND state != 'intent' AND id IS NOT ? AND id NOT IN "
                  "(SELECT id FROM commits WHERE scope = ? AND state != 'intent' ORDER BY id DESC LIMIT ?)",
                  (scope, keep_last, scope, self.commit_retention))

    _COMMIT_COLS = "id, scope, kind, state, plan_json, base_id, started_at, finished_at, note"

    def _decode(self, commit_id: int, scope: str, doc: bytes | str) -> CircuitPlan:
        """The plan of a commit row; a garbled one is refused naming the row, never guessed at."""
        try:
            return _load_plan(doc)
        except (zlib.error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
            raise StoreCorruptError(self.path, f"commit {commit_id} of scope {scope!r} holds an unreadable plan "
                                    f"({type(e).__name__}: {e})",
                                    "restore the file from a backup (orchestrl proxy backup), or move it aside and "
                                    "start with --adopt to take the devices' circuits as they are") from None

    def _commit_row(self, row: tuple) -> CommitRecord:
        plan = self._plans.get(row[0]) or self._remember(row[0], self._decode(row[0], row[1], row[4]))
        return CommitRecord(row[0], row[1], row[2], row[3], plan, row[5], row[6], row[7], row[8])

    def _records(self, where: str, args: Sequence[Any]) -> list[CommitRecord]:
        """Commit records matching ``where``; a plan already in memory is not read back from the file."""
        with self._lock:
            out = []
            for row in self._conn.execute("SELECT id, scope, kind, state, base_id, started_at, finished_at, note "
                                          f"FROM commits {where}", args).fetchall():
                plan = self._plans.get(row[0])
                if plan is None:
                    text = self._conn.execute("SELECT plan_json FROM commits WHERE id = ?", (row[0],)).fetchone()[0]
                    plan = self._remember(row[0], self._decode(row[0], row[1], text))
                out.append(CommitRecord(row[0], row[1], row[2], row[3], plan, *row[4:]))
            return out

    def commit(self, commit_id: int) -> CommitRecord:
        """Return one commit record by id (``KeyError`` if it does not exist or was pruned)."""
        rows = self._query(f"SELECT {self._COMMIT_COLS} FROM commits WHERE id = ?", (commit_id,))
        if not rows:
            raise KeyError(f"fabric store {self.path}: no commit with id {commit_id}")
        return self._commit_row(rows[0])

    def last_committed(self, scope: str) -> CommitRecord | None:
        """Return the newest committed record of ``scope``: the plan the devices are known to hold.

        That is a plan change (kind ``apply``) or, after a restart, the outcome of reconciliation
        (kind ``reconcile``: the plan before it minus circuits on ports that had failed).
        """
        rows = self._records(f"WHERE id = ({_LAST_COMMITTED_ID})", (scope,))
        return rows[0] if rows else None

    def head(self, scope: str) -> ScopeHead:
        """Return the last committed record of ``scope`` and its unfinished commits, in one read.

        What a commit needs to know before it starts: the plan the devices hold, and whether an
        earlier commit was interrupted (:func:`fabric.runtime.commit.apply_plan_steps`).
        """
        rows = self._records(f"WHERE scope = ?1 AND (state = 'intent' OR id = ({_LAST_COMMITTED_ID})) ORDER BY id",
                             (scope,))
        return ScopeHead(next((r for r in rows if r.state != "intent"), None),
                         tuple(r for r in rows if r.state == "intent"))

    def last_committed_plan(self, scope: str) -> CircuitPlan | None:
        """Return the plan of :meth:`last_committed` (``None``: nothing committed, an empty fabric)."""
        rec = self.last_committed(scope)
        return rec.plan if rec else None

    def in_flight(self, scope: str | None = None) -> list[CommitRecord]:
        """Return commits that were started but never finished (oldest first)."""
        where, args = (" AND scope = ?", (scope,)) if scope is not None else ("", ())
        return self._records(f"WHERE state = 'intent'{where} ORDER BY id", args)

    def history(self, scope: str | None = None, limit: int = 50) -> list[CommitRecord]:
        """Return the newest ``limit`` commit records (of one scope, or all), newest first."""
        where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        return [self._commit_row(r) for r in self._query(
            f"SELECT {self._COMMIT_COLS} FROM commits {where} ORDER BY id DESC LIMIT ?", (*args, limit))]

    def scopes(self) -> list[str]:
        """Return every scope with a committed record."""
        return [r[0] for r in self._query(
            "SELECT DISTINCT scope FROM commits WHERE state = 'committed' ORDER BY scope")]

    def steps(self, commit_id: int) -> list[StepRecord]:
        """Return the device confirmations journalled for one commit, in order."""
        rows = self._query("SELECT commit_id, device, action, requested_json, confirmed_json, status, detail, at "
                           "FROM commit_steps WHERE commit_id = ? ORDER BY id", (commit_id,))
        return [StepRecord(r[0], r[1], r[2], tuple(tuple(p) for p in json.loads(r[3])),
                           tuple(tuple(p) for p in json.loads(r[4])), r[5], r[6], r[7]) for r in rows]

    def save_template_cache(self, cache: TemplateCache | Iterable[CacheEntry]) -> None:
        """Persist every entry of ``cache`` (upsert by signature) in one transaction."""
        entries = cache.entries() if isinstance(cache, TemplateCache) else list(cache)
        now = time.time()
        with self._tx() as c:
            c.executemany("INSERT INTO template_cache (signature, entry_json, updated_at) VALUES (?, ?, ?) "
                          "ON CONFLICT (signature) DO UPDATE SET entry_json = excluded.entry_json, "
                          "updated_at = excluded.updated_at",
                          [(e.signature, json.dumps(e.to_json(), sort_keys=True), now) for e in entries])

    def load_template_cache(self) -> TemplateCache:
        """Return a :class:`TemplateCache` holding every persisted entry (counters start at zero)."""
        rows = self._query("SELECT entry_json FROM template_cache ORDER BY signature")
        return TemplateCache(CacheEntry.from_json(json.loads(r[0])) for r in rows)

    def mask_ports(self, ports: Iterable[tuple[str, int, str]]) -> list[MaskedPort]:
        """Mask duplex ports ``(device, port, reason)``; return the ones that were not masked before.

        A port masked again keeps its first ``masked_at`` and takes the new reason.
        """
        now = time.time()
        fresh: list[MaskedPort] = []
        with self._tx() as c:
            for device, port, reason in ports:
                known = c.execute("SELECT 1 FROM masked_ports WHERE device = ? AND port = ?", (device, port)).fetchone()
                c.execute("INSERT INTO masked_ports (device, port, reason, masked_at) VALUES (?, ?, ?, ?) "
                          "ON CONFLICT (device, port) DO UPDATE SET reason = excluded.reason",
                          (device, int(port), reason, now))
                if known is None:
                    fresh.append(MaskedPort(device, int(port), reason, now))
        return fresh

    def unmask_port(self, device: str, port: int) -> bool:
        """Return the port to planning (e.g. after repair); ``False`` if it was not masked."""
        with self._tx() as c:
            return c.execute("DELETE FROM masked_ports WHERE device = ? AND port = ?", (device, port)).rowcount > 0

    def masked_ports(self) -> list[MaskedPort]:
        """Return every masked port, ordered by device and port."""
        return [MaskedPort(*r) for r in self._query(
            "SELECT device, port, reason, masked_at FROM masked_ports ORDER BY device, port")]

    def log_decision(self, scope: str, outcome: str, detail: Mapping[str, Any]) -> int:
        """Append one safe-window decision; the log keeps the newest ``decision_retention`` rows.

        Written without an fsync of its own (see the module's design note).
        """
        doc = json.dumps(dict(detail), sort_keys=True, default=str)
        with self._tx(durable=False) as c:  # an audit trail: durable with the next journal write
            rid = int(c.execute("INSERT INTO decisions (at, scope, outcome, detail_json) VALUES (?, ?, ?, ?)",
                                (time.time(), scope, outcome, doc)).lastrowid)
            c.execute("DELETE FROM decisions WHERE id <= ?", (rid - self.decision_retention,))
            return rid

    def decisions(self, scope: str | None = None, limit: int = 100) -> list[DecisionRecord]:
        """Return the newest ``limit`` decisions (of one scope, or all), newest first."""
        where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        rows = self._query(f"SELECT id, at, scope, outcome, detail_json FROM decisions {where} "
                           "ORDER BY id DESC LIMIT ?", (*args, limit))
        return [DecisionRecord(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]


def _put_bounded(cache: dict, key: Any, value: Any, limit: int) -> None:
    """Insert into a cache of at most ``limit`` entries, dropping the oldest first."""
    while len(cache) >= limit:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _load_plan(doc: bytes | str) -> CircuitPlan:
    """Return the plan of a commit row: zlib-compressed JSON (schema 2) or JSON text (schema 1 rows)."""
    return plan_from_json(json.loads(zlib.decompress(doc) if isinstance(doc, bytes) else doc))
