"""Checkpoint the journal's WAL in a background thread, so that no commit pays for one.

Design note
-----------
In WAL mode every transaction appends its pages to the ``-wal`` file, and a *checkpoint* copies
them back into the database file and fsyncs it. By default SQLite runs one inside whichever
transaction takes the WAL past 1,000 frames: every ~50th per-PoD commit (~18 frames each) then
spends 3-4 ms copying ~4 MB and fsyncing the database, which is most of the tail of the commit
latency. :class:`WalCheckpointer` moves that work off the commit path: the store tells it about
every durable write (:meth:`WalCheckpointer.wrote`, a counter and, every ``every`` writes, an event),
and its thread, on a connection of its own, runs ``PRAGMA wal_checkpoint(PASSIVE)``, which never
waits for and never blocks a writer. The next write after a complete checkpoint starts the WAL
over from its beginning, so the file stays small; a checkpoint that ran while commits kept writing
is complete only once a pass finds nothing new, so the thread repeats it (cheaply: only the new
frames) until one does.

Durability is untouched: a transaction is durable when its own commit has synced the WAL, whether
or not a checkpoint has copied it yet, and a checkpoint interrupted by a crash is finished by the
next one (SQLite's own recovery). Every writer of the file keeps an automatic checkpoint as a
safety net at :data:`SAFETY_FRAMES` (:func:`guard_wal`), reached only if this thread falls behind.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

__all__ = ["SAFETY_FRAMES", "WalCheckpointer", "guard_wal"]

SAFETY_FRAMES = 4000  # a writer's own automatic checkpoint: 4x SQLite's default, reached only if the thread lags

log = logging.getLogger(__name__)


def guard_wal(conn: sqlite3.Connection) -> None:
    """Leave ``conn``'s automatic checkpoint only as a safety net, past what :class:`WalCheckpointer` lets through."""
    conn.execute(f"PRAGMA wal_autocheckpoint={SAFETY_FRAMES}")


class WalCheckpointer:
    """A thread that checkpoints the WAL of the SQLite file ``path`` every ``every`` durable writes.

    Parameters
    ----------
    path : str
        The database file (in WAL mode).
    every : int
        Durable writes between two checkpoints (a per-PoD commit writes ~18 WAL frames of 4 kB in
        all; 16 commits keep the WAL near 300 frames, well below the safety net).
    passes : int
        Checkpoint passes at most per wake-up: a pass that finds frames written while the last
        one ran copies those too, until one finds none (a moment without writes, e.g. while the
        devices switch), after which the next write starts the WAL over; busy writers leave the
        rest to the next wake-up.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "f.db")
    >>> conn = sqlite3.connect(path, isolation_level=None)
    >>> conn.execute("PRAGMA journal_mode=WAL").fetchone()
    ('wal',)
    >>> guard_wal(conn)
    >>> cp = WalCheckpointer(path, every=1)
    >>> _ = conn.execute("CREATE TABLE t (x)")
    >>> cp.wrote(); cp.wait_idle(5.0)
    True
    >>> cp.checkpoints >= 1
    True
    >>> cp.close(); conn.close()
    """

    def __init__(self, path: str, *, every: int = 16, passes: int = 4) -> None:
        if every < 1 or passes < 1:
            raise ValueError(f"WalCheckpointer: every={every} and passes={passes} must be at least 1")
        self.path, self.every, self.passes = path, every, passes
        self.checkpoints = 0  # completed by the thread (for tests and diagnostics)
        self._writes = 0
        self._cond = threading.Condition()
        self._asked = self._answered = 0  # checkpoints asked for, and run (or failed) since
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"wal-checkpoint {path}", daemon=True)
        self._thread.start()

    def wrote(self) -> None:
        """Count one durable write; wake the thread every ``every`` of them (no I/O here).

        Called by one writer at a time (the store, under its lock), so the count itself needs no lock.
        """
        self._writes += 1
        if self._writes % self.every == 0:
            with self._cond:
                self._asked += 1
                self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every checkpoint asked for has run; return False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._answered == self._asked or self._stop, timeout_s)

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._asked != self._answered or self._stop)
                    if self._stop:
                        return
                    asked = self._asked
                try:
                    seen = -1
                    for _ in range(self.passes):  # until a pass finds nothing new: then the WAL can start over
                        _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        if frames == seen and copied >= frames:
                            break
                        seen = frames
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # the writer's safety net still bounds the WAL; say why it grows
                    log.warning("%s: background WAL checkpoint failed (%s); the writer checkpoints at %d frames",
                                self.path, exc, SAFETY_FRAMES)
                with self._cond:
                    self._answered = asked
                    self._cond.notify_all()
        finally:
            conn.close()
