"""The store's SQLite file: opening and checking it, one lock, and transactions that are durable or not.

Design note
-----------
:class:`StoreFile` owns the file and its schema, not what the rows mean (that is
:mod:`fabric.runtime.store`'s journal). Opening creates the directory and the schema (one
transaction, so two controllers opening a new file at once is harmless), upgrades an older schema
in place, and refuses, naming the file and the fix, one that is locked by another process, fails
SQLite's quick check, is some other SQLite database, or was written by a newer orchestrl (the schema
version lives in ``PRAGMA user_version``; a newer one is refused rather than guessed at). A subclass
reads at open time what it must be able to decode later (:meth:`StoreFile._check_readable`), so a
garbled file is refused at start-up rather than in the middle of a commit. One re-entrant lock
serialises every use of the one connection: the store is thread-safe.

Every write is one transaction (:meth:`StoreFile._tx`): all of its body or none of it. A file on
disk is in WAL mode and the connection stays at ``synchronous=NORMAL``: when a transaction returns
its frames are in the WAL file (the OS page cache), atomic and safe from a crash of the process, but
not fsync'd. A *durable* transaction raises the connection to ``FULL`` for itself alone (so the
others cost no statement to switch): it is on disk when it returns, and its fsync covers every
earlier frame of the WAL; :attr:`StoreFile.durable_writes` counts them. Which writes must be
durable is the journal's decision (its design note says why one per commit suffices). A write the
file system or SQLite refuses raises :class:`~fabric.runtime.store_records.StoreWriteError`
(:func:`store_write_error`) and leaves nothing of the transaction in the file. Each durable write
wakes the thread that copies the WAL back into the database file
(:mod:`fabric.runtime.store_checkpoint`), so no commit pays for a checkpoint.

:func:`backup_state_file` copies a file that a proxy is writing, WAL included, with SQLite's online
backup.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

from orchestrl.fabric.runtime.store_checkpoint import WalCheckpointer, guard_wal
from orchestrl.fabric.runtime.store_records import (_SCHEMA, _TABLES, SCHEMA_VERSION, StoreCorruptError, StoreError,
                                          StoreVersionError, StoreWriteError, default_store_path)

__all__ = ["StoreFile", "store_write_error", "backup_state_file"]

_File = TypeVar("_File", bound="StoreFile")


class StoreFile:
    """One store file, opened and checked, with a lock and transactions that are durable or not.

    Parameters
    ----------
    path : str or Path, optional
        Database file; ``":memory:"`` for a throw-away store. Default :func:`default_store_path`.

    Raises
    ------
    StoreError
        If the file cannot be opened (its directory cannot be made, it is locked, it is some other
        SQLite database); :class:`~fabric.runtime.store_records.StoreVersionError` if a newer
        orchestrl wrote it; :class:`~fabric.runtime.store_records.StoreCorruptError` if it is not a
        readable store.

    Notes
    -----
    Callers use :class:`fabric.runtime.store.FabricStore`, which adds the journal and the other
    tables on top; this class is the file's plumbing, kept apart so each can be read alone.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = str(default_store_path() if path is None else path)
        self._lock = threading.RLock()
        self.durable_writes = 0  # transactions committed with an fsync (synchronous=FULL) by this instance
        self._conn = self._open()
        self._checkpointer = WalCheckpointer(self.path) if self.path != ":memory:" else None

    def _open(self) -> sqlite3.Connection:
        memory = self.path == ":memory:"
        if not memory:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(self.path, f"cannot create its directory ({e.strerror})",
                                 "choose a writable location for the store file") from e
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as e:
            raise StoreError(self.path, f"cannot open ({e})", "check that the path is a writable file") from e
        try:
            self._prepare(conn, memory)
            if not memory:
                self._check_readable(conn)
        except StoreError:
            conn.close()
            raise
        except sqlite3.DatabaseError as e:
            conn.close()
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise StoreError(self.path, f"database is locked ({e})",
                                 "stop the other controller process that holds this store") from e
            raise StoreCorruptError(
                self.path, f"not a readable orchestrl store ({e})",
                f"restore the file from a backup, or move it aside (mv {self.path} {self.path}.corrupt) to start "
                "an empty journal; note that reconciliation against an empty journal removes every cross-connect"
            ) from e
        return conn

    def _prepare(self, conn: sqlite3.Connection, memory: bool) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # first read: fails on a non-database
        if version > SCHEMA_VERSION:
            raise StoreVersionError(self.path, f"schema version {version} is newer than this orchestrl supports "
                                    f"({SCHEMA_VERSION})", "upgrade orchestrl, or point the controller at another store file")
        if (check := conn.execute("PRAGMA quick_check").fetchone()[0]) != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")
        if not memory:
            conn.execute("PRAGMA journal_mode=WAL")
            guard_wal(conn)  # the WalCheckpointer copies the WAL back; this connection only as a safety net
        conn.execute("PRAGMA synchronous=NORMAL")  # a durable transaction raises it to FULL for itself (_tx)
        conn.execute("PRAGMA foreign_keys=ON")
        if version == 0:
            tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            if tables:
                raise StoreError(self.path, "is an SQLite database but not an orchestrl store (no schema version)",
                                 "point the controller at another store file")
            try:  # one transaction; IF NOT EXISTS makes a concurrent first open harmless
                conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        else:
            have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            missing = [t for t in _TABLES if t not in have]
            if missing:
                raise StoreCorruptError(self.path, f"table {missing[0]} is missing (schema version {version})",
                                        "restore the file from a backup (orchestrl proxy backup), or move it aside "
                                        "and start with --adopt to take the devices' circuits as they are")
            if version < SCHEMA_VERSION:
                # 1 -> 2: plans are written compressed from now on; the JSON text of older rows is read as it is
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _check_readable(self, conn: sqlite3.Connection) -> None:
        """Read at open time what later calls must decode; raise ``StoreCorruptError`` if it cannot be.

        The file itself has nothing to decode; a subclass with encoded rows overrides this.
        """

    @contextmanager
    def _tx(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction: all of the body, or none of it; on disk when it returns if ``durable``.

        A durable transaction runs with ``synchronous=FULL`` (its commit fsyncs the WAL); the
        connection is otherwise at ``NORMAL``: a non-durable transaction skips its fsync (WAL keeps
        it atomic and consistent, and it survives a crash of the process) and becomes durable with
        the next durable one, whose fsync covers the WAL.
        """
        with self._lock:
            try:
                if durable:
                    self._conn.execute("PRAGMA synchronous=FULL")
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield self._conn
                    except BaseException:
                        if self._conn.in_transaction:
                            self._conn.execute("ROLLBACK")
                        raise
                    self._conn.execute("COMMIT")
                finally:
                    if durable:
                        self._conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.OperationalError as e:
                if self._conn.in_transaction:  # a failed COMMIT leaves the transaction open: nothing of it stays
                    with suppress(sqlite3.Error):  # the connection is broken too: the error below says why
                        self._conn.execute("ROLLBACK")
                raise store_write_error(self.path, e) from e
            if durable:
                self.durable_writes += 1
                if self._checkpointer is not None:
                    self._checkpointer.wrote()

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        """Stop the checkpoint thread (after its current pass) and close the file; a write in progress ends first."""
        with self._lock:  # the thread never takes this lock, so joining it here cannot deadlock
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            self._conn.close()

    def __enter__(self: _File) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def store_write_error(path: str, e: sqlite3.OperationalError) -> StoreError:
    """The store error for a refused write: a full disk, a read-only file, an I/O error, a lock held too long."""
    text = str(e)
    kind = ("full" if "full" in text else "read-only" if "readonly" in text else "locked" if "locked" in text
            else "io" if "I/O" in text else "other")
    fix = {"full": "free space on the state file's filesystem; the proxy retries by itself",
           "read-only": "make the state file and its directory writable",
           "locked": "another process holds the state file; stop it",
           "io": "check the disk holding the state file"}.get(kind, "check the state file")
    return StoreWriteError(path, f"a write was refused ({text})", fix, kind=kind)


def backup_state_file(state: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """Copy a state file to ``out`` with SQLite's online backup (safe while a proxy writes it); return a summary.

    Copying ``fabric.db`` with ``cp`` while the proxy runs misses what is still in its WAL (most
    recent commits, or all of them); the online backup reads the database as one consistent
    snapshot, WAL included, and writes a self-contained file (no ``-wal`` beside it).

    Raises
    ------
    StoreError
        If the state file cannot be read, or ``out`` exists or cannot be written.
    """
    state, out = os.fspath(state), os.fspath(out)
    if not os.path.exists(state) or os.path.getsize(state) == 0:
        raise StoreError(state, "does not exist or is empty", "give the --state file the proxy runs with")
    if os.path.exists(out):
        raise StoreError(out, "already exists", "choose a new file name for the backup")
    try:
        src = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error as e:
        raise StoreError(state, f"cannot be opened ({e})", "check the path") from e
    try:
        dst = sqlite3.connect(out)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            check = dst.execute("PRAGMA quick_check").fetchone()[0]
            commits = dst.execute("SELECT count(*) FROM commits WHERE state = 'committed'").fetchone()[0]
            scopes = dst.execute("SELECT count(DISTINCT scope) FROM commits WHERE state = 'committed'").fetchone()[0]
        finally:
            dst.close()
    except sqlite3.Error as e:
        if os.path.exists(out):
            os.unlink(out)
        raise StoreError(state, f"backup to {out} failed ({e})", "check both paths and free space") from e
    finally:
        src.close()
    return {"state": state, "backup": out, "integrity": check, "committed_records": commits, "scopes": scopes,
            "bytes": os.path.getsize(out)}

