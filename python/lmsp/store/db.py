"""The one place that opens SQLite connections, sets pragmas and runs transactions.

Every connection is in autocommit mode (``isolation_level=None``); a write is
one explicit ``BEGIN IMMEDIATE`` ... ``COMMIT`` through :meth:`Database.write`,
a consistent multi-statement read one ``BEGIN`` ... ``COMMIT`` through
:meth:`Database.read`. Connections are pooled: any thread (or greenlet) takes
an idle one, uses it for one transaction and puts it back, so a connection is
never used by two threads at once and no lock is needed around the pool
(``list.pop``/``list.append`` are atomic).

Durability levels (``PRAGMA synchronous`` in WAL mode):

``full`` (the default)
    The write-ahead log is synced to disk at every commit. A task that was
    answered with ``202 Accepted`` survives a process crash, an OS crash and a
    power cut. Each commit costs one fsync.
``normal``
    The log is synced only at checkpoints (every WAL_CHECKPOINT_PAGES pages of
    log). A process crash loses nothing; a power cut or OS crash may lose the
    commits since the last checkpoint (tasks already answered with 202 can
    vanish), but the database is never corrupted.
``off``
    SQLite never syncs. A process crash loses nothing; a power cut or OS crash
    may lose recent commits and may corrupt the database file. For
    throwaway data only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import Unavailable


def _os_lock():
    """A lock of the operating system's threads, also under gevent's patching."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        import _thread

        return _thread.allocate_lock()
    return monkey.get_original("_thread", "allocate_lock")()


SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "off": "OFF"}

#: what each durability level risks, in one line each (for the CLI and docs)
DURABILITY_RISKS = {
    "full": "every commit is synced: an accepted (202) task survives a crash and a power cut",
    "normal": "synced at checkpoints: a power cut may lose the last commits, never corrupts",
    "off": "never synced: a power cut may lose recent commits and corrupt the database",
}
MAX_IDLE = 8  # idle connections kept per process; more are closed when released
# Pages of a new database file (an existing one keeps its own). An engine step
# dirties one leaf of task_events per running task, and every dirty page goes
# to the write-ahead log and through its fsync at each commit: with 1 KB pages
# a 64-task step writes 64 KB instead of 256 KB (bench/README.md, "Store").
PAGE_SIZE = 1024
# A checkpoint once the log holds this many pages: 16 MB at 1 KB pages. A
# checkpoint costs two fsyncs (the database file, then the log) however few
# pages it copies, and an engine step rewrites mostly the same leaves: four
# times SQLite's default log size (1000 pages of 4 KB) makes them four times
# rarer, 7-8% more durable events/s with 64 running tasks (bench/README.md,
# "Store"), for 12 MB more on disk.
WAL_CHECKPOINT_PAGES = 16000

# Error codes that mean "the store cannot take this write now" rather than a
# programming error: the lock, the disk, the file system.
_UNAVAILABLE_PREFIXES = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_FULL",
    "SQLITE_READONLY",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_PROTOCOL",
    "SQLITE_NOLFS",
)
_UNAVAILABLE_TEXT = ("locked", "busy", "disk is full", "readonly", "read-only", "disk i/o", "unable to open")


class StoreError(RuntimeError):
    """The database cannot be used at all (wrong file, newer schema)."""


def is_unavailable(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", None) or ""
    if name.startswith(_UNAVAILABLE_PREFIXES):
        return True
    text = str(exc).lower()
    return any(t in text for t in _UNAVAILABLE_TEXT)


def translate(exc: sqlite3.Error) -> Exception:
    """The client-visible error for a SQLite failure (the original is chained)."""
    err: Exception
    if is_unavailable(exc):
        err = Unavailable(f"the store is unavailable: {exc}", retry_after=1)
    else:
        err = StoreError(f"store failure: {exc}")
    err.__cause__ = exc
    return err


_no_wait = threading.local()


@contextmanager
def no_wait() -> Iterator[None]:
    """Within this block (this thread), a read that meets a lock fails at once with
    :class:`lmsp.errors.Unavailable` instead of waiting up to the busy timeout, and
    a write is refused (see :mod:`lmsp.serving.hubsafe`)."""
    _no_wait.on = True
    try:
        yield
    finally:
        _no_wait.on = False


class Database:
    """A pool of connections to one SQLite file with the service's pragmas."""

    def __init__(self, path: str | os.PathLike, *, durability: str = "full", busy_timeout: float = 5.0) -> None:
        if durability not in SYNCHRONOUS:
            raise ValueError(f"durability must be one of {', '.join(SYNCHRONOUS)}, not {durability!r}")
        if busy_timeout < 0:
            raise ValueError("busy_timeout must not be negative")
        self.path = Path(path)
        self.durability = durability
        self.busy_timeout = float(busy_timeout)
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._closed = False
        self._pid = os.getpid()
        self._close_lock = threading.Lock()
        # The writers of this process take turns here before BEGIN IMMEDIATE:
        # a finished transaction hands the turn straight to the next one,
        # where SQLite's busy handler would sleep in steps of up to 100 ms.
        # Other processes still meet in SQLite's lock and its busy timeout.
        self._writer = _os_lock()

    # -- connections ---------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        """A new connection with every pragma set; the only place that opens one."""
        try:
            conn = sqlite3.connect(
                str(self.path),
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise translate(exc) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before the file is first written
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: could not switch the database to WAL mode (got {mode})")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.durability]}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.row_factory = sqlite3.Row
        except sqlite3.DatabaseError as exc:
            conn.close()
            if is_unavailable(exc):
                raise translate(exc) from exc
            raise StoreError(f"{self.path} is not a usable SQLite database: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:
            # A forked child must not touch the parent's connections, nor wait
            # on a writer lock that a thread of the parent may have held: fresh ones.
            self._idle, self._all, self._pid = [], [], os.getpid()
            self._writer = _os_lock()

    def _acquire(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("the store is closed")
        self._check_fork()
        try:
            return self._idle.pop()
        except IndexError:
            if getattr(_no_wait, "on", False):
                # opening one sets WAL mode, which waits out a lock: not without waiting
                raise Unavailable("no idle connection to read without waiting", retry_after=1) from None
            conn = self.connect()
            self._all.append(conn)
            return conn

    def _release(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:  # never hand out a connection mid-transaction
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                conn.close()
                self._forget(conn)
                return
        if self._closed or os.getpid() != self._pid or len(self._idle) >= MAX_IDLE:
            conn.close()
            self._forget(conn)
        else:
            self._idle.append(conn)

    def _forget(self, conn: sqlite3.Connection) -> None:
        try:
            self._all.remove(conn)
        except ValueError:
            pass

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            self._forget(conn)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- transactions --------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: commits on success, rolls back on any error.

        A lock held by others past the busy timeout, a full disk or a read-only
        file raise :class:`lmsp.errors.Unavailable`; nothing is half-written.
        """
        if getattr(_no_wait, "on", False):
            raise RuntimeError("a write inside no_wait(): only reads may run without waiting")
        self._check_fork()
        lock = self._writer
        turn = lock.acquire(timeout=self.busy_timeout) if self.busy_timeout > 0 else lock.acquire(False)
        if not turn:
            raise Unavailable(f"the store is busy: no write turn within {self.busy_timeout:g} s", retry_after=1)
        try:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                yield conn
        finally:
            lock.release()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot (a deferred transaction)."""
        with self._transaction("BEGIN") as conn:
            yield conn

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """``begin`` ... COMMIT on one pooled connection; any error rolls back."""
        conn = self._acquire()
        hurried = getattr(_no_wait, "on", False)
        try:
            try:
                if hurried:
                    conn.execute("PRAGMA busy_timeout = 0")
                conn.execute(begin)
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback(conn)
                raise translate(exc) from exc
            except BaseException:
                self._rollback(conn)
                raise
            finally:
                if hurried:
                    conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        finally:
            self._release(conn)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def delete_in_batches(db: Database, sql: str, args: tuple, batch: int) -> int:
    """Run ``sql`` (a DELETE whose last parameter is its LIMIT, ``batch``) in one
    transaction after another until a run deletes fewer than ``batch`` rows, so the
    write lock is never held long; returns how many rows went."""
    total = 0
    while True:
        with db.write() as conn:
            n = conn.execute(sql, (*args, batch)).rowcount
        total += n
        if n < batch:
            return total
