"""The collector's SQLite store: one row per event id, written by many threads and processes at once.

**What a row holds.** The allowlisted fields of :data:`spool_reporter._event.FIELDS` except ``user_agent``
(it is derived from ``app``, ``app_version``, ``python``, ``python_version``, ``os`` and ``arch``, so keeping it
would add nothing but a free-text column), plus ``week``, the ISO week of the event's own ``time``
(``"2026-W49"``), computed on insert so that the statistics are plain ``GROUP BY`` queries. Nothing about
the request is stored: no address, no header, not even the time the request arrived (which, joined with
a proxy's access log, would point back to an address).

**Concurrency.** The database runs in WAL mode (readers never block the writer). Each batch is one short
``BEGIN IMMEDIATE`` transaction: taking the write lock up front means a writer never has to upgrade a
read lock, which is the case SQLite's busy handler cannot resolve. ``busy_timeout`` makes a writer wait
for another (thread or process) instead of failing. De-duplication is the primary key on ``event_id``
with ``INSERT OR IGNORE``: a flusher that was killed after a 2xx sends the same events again and they
count once.

**Connections.** Each process writes through one connection, behind a lock: SQLite runs one write
transaction at a time anyway, and a connection's page cache is thrown away whenever *another* connection
has written, so several writing connections in one process would each start every batch with a cold
cache. Readers (the statistics) borrow connections from a small pool. No connection crosses a ``fork`` (a
pre-forking WSGI server imports the application before forking its workers): they are created lazily and
discarded when the process id changes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sqlite3
import threading

from spool_reporter import SpoolReporterError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Final

COLUMNS: Final = (
    "event_id",
    "event",
    "app",
    "app_version",
    "python",
    "python_version",
    "os",
    "os_release",
    "arch",
    "client_id",
    "time",
    "week",
)
"""The stored columns: the allowlist minus ``user_agent`` (derivable), plus the ISO ``week`` of ``time``."""

SCHEMA_USER_VERSION: Final = 1
"""``PRAGMA user_version`` of the layout below; bumped with a migration if the columns change."""

BUSY_TIMEOUT_MS: Final = 10_000
"""How long a writer waits for another writer's transaction (ours last milliseconds)."""

POOL_SIZE: Final = 8
"""Idle reading connections kept per process; more are opened when needed and closed when returned."""

WRITER_CACHE_KIB: Final = 16 * 1024
"""Page cache of the one writing connection: holds the event-id index of ~1M events (benchmarked)."""

_DDL: Final = (
    # A rowid table with a UNIQUE index on event_id, not a WITHOUT ROWID table keyed by it: rows then
    # append in arrival order and only the small index takes random (uuid) inserts, which keeps the pages a
    # batch dirties, and so the WAL written per batch, several times smaller (benchmarks/bench_collector.py).
    # No index for the statistics: they scan the table, which costs a report a second per ~million events
    # and costs every insert nothing.
    "CREATE TABLE IF NOT EXISTS events ("
    " event_id TEXT NOT NULL UNIQUE,"
    " event TEXT NOT NULL, app TEXT NOT NULL, app_version TEXT NOT NULL,"
    " python TEXT NOT NULL, python_version TEXT NOT NULL,"
    " os TEXT NOT NULL, os_release TEXT NOT NULL, arch TEXT NOT NULL,"
    " client_id TEXT NOT NULL, time TEXT NOT NULL, week TEXT NOT NULL"
    ")",
)
_INSERT: Final = (
    f"INSERT OR IGNORE INTO events ({', '.join(COLUMNS)}) "  # noqa: S608 - fixed column names
    f"VALUES ({', '.join('?' * len(COLUMNS))})"
)


class CollectorError(SpoolReporterError):
    """The collector cannot do what was asked (a missing database, an unusable configuration)."""


Row = tuple[str, str, str, str, str, str, str, str, str, str, str, str]
"""One event as stored, in :data:`COLUMNS` order."""


def iso_week(time_text: str) -> str | None:
    """``"2026-12-03T08:15:48Z"`` -> ``"2026-W49"``; ``None`` unless it is a real UTC time in that exact form.

    Hand-parsed: :func:`time.strptime` costs ~7 us, and every event of every batch passes here.
    """
    if len(time_text) != 20 or not time_text.isascii():
        return None
    t = time_text
    if t[4] != "-" or t[7] != "-" or t[10] != "T" or t[13] != ":" or t[16] != ":" or t[19] != "Z":
        return None
    digits = t[0:4] + t[5:7] + t[8:10] + t[11:13] + t[14:16] + t[17:19]
    if not digits.isdigit():
        return None
    hour, minute, second = int(t[11:13]), int(t[14:16]), int(t[17:19])
    if hour > 23 or minute > 59 or second > 60:  # 60: a leap second is a real time
        return None
    try:
        year, week, _ = datetime.date(int(t[0:4]), int(t[5:7]), int(t[8:10])).isocalendar()
    except ValueError:
        return None
    return f"{year:04d}-W{week:02d}"


def connect(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (we write ``BEGIN``/``COMMIT`` ourselves) with our pragmas."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # NORMAL is durable against a killed process in WAL mode; only a power cut can lose the last commits,
        # and the clients keep their spool until they get a 2xx, so they would send those again.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()  # e.g. "file is not a database": never leave the connection to the garbage collector
        raise
    return conn


class Store:
    """The events database at ``path``.

    :param path: the SQLite file (created with its tables if ``create`` is true).
    :param create: create the file and tables if missing; otherwise a missing file raises
        :class:`CollectorError` (``stats`` never creates an empty database by mistake).
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = os.fspath(path)
        if not create and not os.path.isfile(self.path):
            msg = f"no collector database at {self.path}"
            raise CollectorError(msg)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._pool: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        if create:
            conn = connect(self.path)
            try:
                # journal_mode is persistent in the file: set once, every later connection gets WAL.
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("BEGIN IMMEDIATE")
                for statement in _DDL:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_USER_VERSION}")
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.close()
                msg = f"cannot open the collector database {self.path}: {exc}"
                raise CollectorError(msg) from exc
            self._put(conn)

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection for the duration of a ``with`` block."""
        conn = self._get()
        try:
            yield conn
        except BaseException:
            # The connection may be inside a failed transaction: do not hand it to the next request.
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        self._put(conn)

    def _get(self) -> sqlite3.Connection:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's connections are not ours to use
                self._pool = []
                self._writer = None
                self._pid = os.getpid()
            if self._pool:
                return self._pool.pop()
        return connect(self.path)

    def _put(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._pool) < POOL_SIZE:
                self._pool.append(conn)
                return
        conn.close()

    def insert(self, rows: Sequence[Row], *, want_new: bool = False) -> tuple[int, list[Row]]:
        """Store ``rows`` in one transaction; return (how many were new, the new rows if ``want_new``).

        A row whose ``event_id`` is already stored, or repeated within ``rows``, is a duplicate.
        """
        if not rows:
            return 0, []
        with self._write_lock:
            conn = self._writing_connection()
            try:
                return self._insert(conn, rows, want_new)
            except BaseException:
                self._writer = None  # possibly inside a failed transaction: start afresh next time
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                raise

    def _writing_connection(self) -> sqlite3.Connection:
        with self._lock:
            if self._pid != os.getpid():
                self._pool, self._writer, self._pid = [], None, os.getpid()
            if self._writer is None:
                self._writer = connect(self.path)
                self._writer.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            return self._writer

    @staticmethod
    def _insert(conn: sqlite3.Connection, rows: Sequence[Row], want_new: bool) -> tuple[int, list[Row]]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            new: list[Row] = []
            if want_new:
                # Inside the write transaction, so no other writer can add one of these meanwhile.
                ids = list({row[0] for row in rows})
                known: set[str] = set()
                for start in range(0, len(ids), 500):  # SQLite's variable limit is >= 999
                    chunk = ids[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    query = f"SELECT event_id FROM events WHERE event_id IN ({marks})"  # noqa: S608 - only ?s
                    known.update(r[0] for r in conn.execute(query, chunk))
                for row in rows:
                    if row[0] not in known:
                        known.add(row[0])
                        new.append(row)
            before = conn.total_changes
            conn.executemany(_INSERT, rows)
            added = conn.total_changes - before
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return added, new

    def count(self) -> tuple[int, int]:
        """(events stored, distinct client ids)."""
        with self.connection() as conn:
            row = conn.execute("SELECT COUNT(*), COUNT(DISTINCT client_id) FROM events").fetchone()
        return int(row[0]), int(row[1])

    def close(self) -> None:
        """Close the idle connections (borrowed ones close when returned after this)."""
        with self._write_lock, self._lock:
            pool, self._pool = self._pool, []
            if self._writer is not None:
                pool.append(self._writer)
                self._writer = None
            self._pid = -1  # connections returned later are closed, not pooled
        for conn in pool:
            conn.close()
