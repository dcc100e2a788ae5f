"""The SQLite back end: the embedded default for a laptop, the demo and the tests (one file, no server).

**Concurrency.** The database runs in WAL mode (readers never block the writer). Each batch is one short
``BEGIN IMMEDIATE`` transaction: taking the write lock up front means a writer never has to upgrade a
read lock, which is the case SQLite's busy handler cannot resolve, and it makes the reads inside the
transaction (which ids are new, how many events each client already has this week) exact. ``busy_timeout``
makes a writer wait for another (thread or process) instead of failing, for at most
:data:`~._store.LOCK_WAIT_S`; a database that stays locked is :class:`~._common.Unavailable` (``503`` with
``Retry-After``). So is every operational failure of the file: a full disk, an I/O error, a read-only or
vanished file (:func:`operational`): the client keeps its batch and comes back, and the operator reads the
reason in the collector's log.

**Durability.** ``synchronous=FULL``: in WAL mode every commit is fsynced before :meth:`SQLiteStore.insert`
returns, so the ``2xx`` that follows means the batch survives a power cut (``NORMAL`` would survive a killed
process only, and the client deletes what was answered ``2xx``).

**File safety.** The file is created ``0600`` before SQLite opens it, whatever the umask; SQLite gives its
``-wal`` and ``-shm`` files the database file's mode (``os_unix.c``, ``findCreateFileMode``), and the tests
check all three under ``umask 000`` as an unprivileged user. Client ids are not for other local users.

**Group commit.** Batches that arrive while another is being written wait for the writer, and the next
transaction takes them all: one fsync for several batches, each answered once that commit returned.

**Connections.** Each process writes through one connection, behind a lock: SQLite runs one write
transaction at a time anyway, and a connection's page cache is thrown away whenever *another* connection
has written, so several writing connections in one process would each start every batch with a cold
cache. Readers (the statistics) borrow connections from a small pool. No connection crosses a ``fork`` (a
pre-forking WSGI server imports the application before forking its workers): they are created lazily and
discarded in a forked child, which also starts with new locks, whatever a thread of the parent held at the fork
(:meth:`~._store.Store._after_fork`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import threading
import time

from . import _common, _intake, _schema, _store, _weeks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Final, TypeVar

    from ._common import Row

    _T = TypeVar("_T")

BUSY_TIMEOUT_MS: Final = int(_store.LOCK_WAIT_S * 1000)
"""How long a writer waits for another process's write transaction (ours last milliseconds), and a thread for
this process's writer: beyond it the request is answered ``503``."""

_POLL_S: Final = 0.001
"""How often a batch waiting for the writer looks whether another writer committed it meanwhile."""

POOL_SIZE: Final = 8
"""Idle reading connections kept per process; more are opened when needed and closed when returned."""

WRITER_CACHE_KIB: Final = 16 * 1024
"""Page cache of the one writing connection: holds the event-id index of ~1M events (benchmarked)."""

FILE_MODE: Final = 0o600
"""The database file (and so its ``-wal`` and ``-shm``): the owner only."""

_INSERT: Final = (
    f"INSERT OR IGNORE INTO events ({', '.join(_common.COLUMNS)}) "  # noqa: S608 - fixed column names
    f"VALUES ({', '.join('substr(?, 1, 10)' if c == 'time' else '?' for c in _common.COLUMNS)})"  # the day only
)
_ADD_CLIENT_WEEK: Final = (
    "INSERT INTO client_weeks (client_id, week, n) VALUES (?, ?, ?) "
    "ON CONFLICT (client_id, week) DO UPDATE SET n = n + excluded.n"
)
_ADD_CLIENT_APP: Final = (
    "INSERT INTO client_apps (client_id, app, first_week, last_week) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (client_id, app) DO UPDATE SET first_week = min(first_week, excluded.first_week), "
    "last_week = max(last_week, excluded.last_week) "
    "WHERE excluded.first_week < first_week OR excluded.last_week > last_week"
)
_ADD_REFUSAL: Final = (
    "INSERT INTO refusals (week, reason, n) VALUES (?, ?, ?) "  # a line for ruff format to keep
    "ON CONFLICT (week, reason) DO UPDATE SET n = n + excluded.n"
)
_CHUNK: Final = 400
"""Variables per ``IN (...)`` query: below SQLite's historical limit of 999."""

LEASE_S: Final = 3600.0
"""How long a roll-up holds the lease between renewals (one week rolled up renews it): a process killed while
rolling up blocks the others for at most this long."""


def _forgotten(conn: sqlite3.Connection, digests: list[str]) -> set[str]:
    """Which of ``digests`` are in ``forgotten`` (a batch has one client id, or a few)."""
    found: set[str] = set()
    for start in range(0, len(digests), _CHUNK):
        chunk = digests[start : start + _CHUNK]
        query = f"SELECT digest FROM forgotten WHERE digest IN ({','.join('?' * len(chunk))})"  # noqa: S608 - ?s
        found.update(str(d) for (d,) in conn.execute(query, chunk))
    return found


def _create_private(path: str) -> None:
    """Create ``path`` empty and ``0600`` unless it exists (never through a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away; it cannot have added any
    finally:
        os.close(fd)


def connect(path: str) -> sqlite3.Connection:
    """A connection in autocommit mode (we write ``BEGIN``/``COMMIT`` ourselves) with our pragmas."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    with _store.closed_on_failure(conn):  # e.g. "file is not a database"
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # FULL: every commit is on disk before the 2xx (see the module docstring).
        conn.execute("PRAGMA synchronous = FULL")
    return conn


_OPERATIONAL_CODES: Final = frozenset({5, 6, 7, 8, 10, 11, 13, 14, 15, 26})
"""SQLite's primary result codes of a file that cannot take a write now: BUSY, LOCKED, NOMEM, READONLY, IOERR,
CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB."""

_OPERATIONAL_TEXT: Final = (
    "locked", "busy", "disk is full", "disk i/o error", "readonly", "unable to open", "malformed", "out of memory",
    "not a database",
)  # fmt: skip
"""The same conditions by their message, for Python 3.10's ``sqlite3`` (no ``sqlite_errorcode`` before 3.11)."""


def operational(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the file cannot be used now (busy, full disk, I/O error, ...), not that our SQL is
    wrong: answered ``503`` with ``Retry-After``, never ``500``."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _OPERATIONAL_CODES
    text = str(exc).lower()
    return any(part in text for part in _OPERATIONAL_TEXT)


def _busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's BUSY or LOCKED: another connection has the file for now."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode, which is persistent in the file: set once, every later connection gets it.

    Changing the journal mode needs the file to itself, and SQLite answers BUSY at once there instead of calling
    the busy handler: two processes opening the same new file (two gunicorn workers starting) made one of them
    fail about one time in three. So the change is retried here, for at most :data:`BUSY_TIMEOUT_MS`, as any
    other write waits.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.001
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _unavailable(exc: sqlite3.Error, path: str) -> _common.Unavailable:
    return _common.Unavailable(f"the collector database {path} is unavailable: {exc}")


class _Job:
    """One caller's batch in a group commit."""

    __slots__ = ("done", "error", "finished", "now", "refused", "result", "rows", "want_new")

    def __init__(self, rows: Sequence[Row], want_new: bool, refused: dict[str, int], now: float | None) -> None:
        self.rows, self.want_new, self.refused, self.now = rows, want_new, refused, now
        self.done = False
        self.finished = threading.Event()
        self.result: _store.Inserted | None = None
        self.error: BaseException | None = None


class SQLiteStore(_store.Store):
    """The events database in the SQLite file ``path``.

    :param path: the SQLite file (created ``0600``, with its tables, if ``create`` is true).
    :param create: create the file and tables if missing, and migrate an older schema; otherwise a missing
        file raises :class:`CollectorError` (``stats`` never creates an empty database by mistake).
    :param limits: what is kept (:class:`~._common.Limits`).
    """

    kind = "sqlite"

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, limits: _common.Limits | None = None
    ) -> None:
        self.path = os.fspath(path)
        self.display = self.path
        self.limits = limits or _common.Limits()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            msg = f"cannot open the collector database {self.path}: {exc.strerror or exc}"
            raise _common.CollectorError(msg) from exc
        if st is not None and not stat.S_ISREG(st.st_mode):
            msg = f"cannot open the collector database {self.path}: not a regular file"
            raise _common.CollectorError(msg)
        if st is None and not create:
            msg = f"no collector database at {self.path}"
            raise _common.NotACollectorDatabase(msg)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._pending: list[_Job] = []
        self._pool: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        self._watch_forks()
        try:
            if create:
                _create_private(self.path)
            conn = connect(self.path)
        except (OSError, sqlite3.Error) as exc:
            msg = f"cannot open the collector database {self.path}: {getattr(exc, 'strerror', None) or exc}"
            raise _common.CollectorError(msg) from exc
        with _store.closed_on_failure(conn):
            try:
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if version > _schema.SCHEMA_VERSION:
                    raise _schema.newer_schema(self.path, version)
                if create:
                    self._migrate(conn)
                elif version == 0 and not self._has_events(conn):
                    msg = f"{self.path} is not a collector database"
                    raise _common.NotACollectorDatabase(msg)
            except sqlite3.Error as exc:
                msg = f"cannot open the collector database {self.path}: {exc}"
                raise _common.CollectorError(msg) from exc
        self._put(conn)

    @staticmethod
    def _has_events(conn: sqlite3.Connection) -> bool:
        return (
            conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'").fetchone() is not None
        )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        _wal(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version == 0 and self._has_events(conn):
                version = 1  # written before versions were recorded: the same table
            for target in range(version + 1, _schema.SCHEMA_VERSION + 1):
                for statement in _schema.SQLITE_MIGRATIONS[target]:
                    conn.execute(statement)
            conn.execute(
                "UPDATE release_state SET first_week = ? WHERE first_week = ''", (_weeks.this_week(time.time()),)
            )
            conn.execute("UPDATE forget_key SET key = ? WHERE key = ''", (secrets.token_hex(32),))
            conn.execute(f"PRAGMA user_version = {_schema.SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        with self._connection() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    # -- connections ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = self._get()
        try:
            yield conn
        except BaseException:
            # The connection may be inside a failed transaction: do not hand it to the next request.
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        self._put(conn)

    def connection(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """Borrow a raw connection for a ``with`` block (tests, and the operator's own queries)."""
        return self._connection()

    def _forked(self) -> None:
        if self._closed:  # e.g. a roll-up thread still running when the application shut down
            msg = f"the collector database {self.path} is closed"
            raise _common.StoreClosed(msg)
        if self._pid != os.getpid():  # forked: the parent's connections are not ours to use
            self._pool, self._writer, self._pid = [], None, os.getpid()

    def _after_fork(self) -> None:
        # The parent's connections are never used here (SQLite: "do not carry an open database connection across
        # a fork"): dropped, and each process opens its own.
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending = []  # the parent's threads' batches: theirs to commit, and no thread here waits for them
        self._pool, self._writer, self._pid = [], None, os.getpid()

    def _get(self) -> sqlite3.Connection:
        with self._lock:
            self._forked()
            if self._pool:
                return self._pool.pop()
        return connect(self.path)

    def _put(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._pool) < POOL_SIZE:
                self._pool.append(conn)
                return
        conn.close()

    def _writing_connection(self) -> sqlite3.Connection:
        with self._lock:
            self._forked()
            if self._writer is None:
                self._writer = connect(self.path)
                self._writer.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            return self._writer

    # -- writing --------------------------------------------------------------------------------------------

    def _insert_batch(
        self, rows: Sequence[Row], want_new: bool, refused: dict[str, int], now: float | None
    ) -> _store.Inserted:
        # Group commit: every batch waiting for the writer when it frees up goes into the next transaction,
        # so that one fsync (synchronous=FULL) covers them all; each caller returns once that COMMIT did.
        job = _Job(rows, want_new, refused, now)
        with self._lock:
            self._pending.append(job)
        deadline = time.monotonic() + _store.LOCK_WAIT_S
        while True:  # bounded by the deadline
            # Short waits: another writer (a forget's chunks, a roll-up) may commit this job for us, then take the
            # lock again at once (a lock is not fair): the job is done, and waiting on for the lock would be wrong.
            if self._write_lock.acquire(timeout=_POLL_S):
                try:
                    if not job.done:
                        self._commit_pending()
                finally:
                    self._write_lock.release()
                break
            if job.done:
                break
            if time.monotonic() >= deadline:
                with self._lock:
                    waiting = any(pending is job for pending in self._pending)
                    if waiting:  # no writer took it: withdraw it, nothing was written
                        self._pending = [pending for pending in self._pending if pending is not job]
                if waiting:
                    raise self._busy()
                job.finished.wait()  # the writer at work has it: its transaction is bounded (busy_timeout)
                break
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _busy(self) -> _common.Unavailable:
        return _common.Unavailable(f"the collector database {self.path} is unavailable: its writer stayed busy")

    def _commit_pending(self) -> None:
        """Under the write lock: commit every batch waiting for it, in one transaction (a group commit)."""
        with self._lock:
            jobs, self._pending = self._pending, []
        if jobs:
            self._commit_group(jobs)

    def _commit_group(self, jobs: list[_Job]) -> None:
        """Under the write lock: run ``jobs`` in one transaction; each gets its result or the exception."""
        error: BaseException | None = None
        results: list[_store.Inserted] = []
        try:
            results = self._in_transaction(lambda conn: [self._insert(conn, job) for job in jobs])
        except BaseException as exc:  # handed to every caller of the group, re-raised there
            error = exc
        for k, job in enumerate(jobs):
            if error is None:
                job.result = results[k]
            else:
                job.error = error
            job.done = True
            job.finished.set()

    def _in_transaction(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Under the write lock: ``work(conn)`` in one write transaction on the writing connection; a database that
        is locked or cannot be reached raises :class:`Unavailable`."""
        try:
            conn = self._writing_connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            except BaseException:
                self._drop_writer(conn)
                raise
        except sqlite3.Error as exc:
            if operational(exc):
                raise _unavailable(exc, self.path) from exc
            raise
        return result

    def _drop_writer(self, conn: sqlite3.Connection) -> None:
        self._writer = None  # possibly inside a failed transaction: start afresh next time
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    def _insert(self, conn: sqlite3.Connection, job: _Job) -> _store.Inserted:
        """One batch, inside the group's write transaction (so no other writer can add rows meanwhile)."""
        cap = self.limits.per_client_week
        rows, refused = job.rows, job.refused
        digests = _intake.client_digests(rows, self._forget_key(_store.Writer(conn)))
        rows, gone = _intake.without_clients(rows, {digests[d] for d in _forgotten(conn, sorted(digests))})
        ids = list({row.event_id for row in rows})
        known: set[str] = set()
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            query = f"SELECT event_id FROM events WHERE event_id IN ({','.join('?' * len(chunk))})"  # noqa: S608
            known.update(r[0] for r in conn.execute(query, chunk))
        new, groups = _intake.group_new(rows, known)
        # The write transaction excludes close_weeks(): the closed weeks read here stay closed until COMMIT.
        (closed,) = conn.execute("SELECT closed_through FROM rollup_state").fetchone()
        new, groups, late = _intake.drop_closed(new, groups, closed)
        used: dict[tuple[str, str], int] = {}
        if cap > 0 and groups:
            clients = list({client for client, _ in groups})
            for start in range(0, len(clients), _CHUNK):
                chunk = clients[start : start + _CHUNK]
                query = (
                    "SELECT client_id, week, n FROM client_weeks "  # noqa: S608 - only ?s
                    f"WHERE client_id IN ({','.join('?' * len(chunk))})"
                )
                for client, week, n in conn.execute(query, chunk):
                    if (client, week) in groups:
                        used[(client, week)] = int(n)
        kept, taken, limited = _intake.apply_cap(new, groups, used, cap)
        conn.executemany(_INSERT, kept)
        conn.executemany(_ADD_CLIENT_WEEK, [(client, week, n) for (client, week), n in taken.items()])
        conn.executemany(_ADD_CLIENT_APP, _intake.client_apps(kept))
        mine = _intake.refused_here(forgotten=gone, late=late, over_cap=limited)
        counted = _intake.merge_counts(refused, mine)
        if counted:
            week = _weeks.this_week(time.time() if job.now is None else job.now)
            conn.executemany(_ADD_REFUSAL, sorted((week, reason, n) for reason, n in counted.items()))
        return _store.Inserted(len(kept), kept if job.want_new else [], mine)

    # -- retention and forget: the statements are the base class's --------------------------------------------

    dialect = _store.Dialect(
        insert_new="INSERT OR IGNORE INTO",
        on_conflict_skip="",
        row_key="rowid",
        client_id="?",
        later_until="max(until, excluded.until)",
        for_update="",  # the write transaction holds the whole file
    )

    def _write(self, work: Callable[[_store.Writer], _T], *, quick: bool = True) -> _T:
        """``work(writer)`` in one write transaction on the writing connection (batches wait meanwhile). ``quick``
        changes nothing: every write waits for the write lock at most :data:`~._store.LOCK_WAIT_S`, and a
        statement then runs as long as it needs."""
        if not self._write_lock.acquire(timeout=_store.LOCK_WAIT_S):
            raise self._busy()
        try:
            # The batches that waited for the lock go first, in their own transaction: a batch waits for one other
            # transaction at most, even behind a forget or a roll-up that takes the lock again at once (a lock is
            # not fair: without this, a forget's chunks in a row starved ingest for 150 ms at p99).
            self._commit_pending()
            return self._in_transaction(lambda conn: work(_store.Writer(conn)))
        finally:
            self._write_lock.release()

    def _exclude_inserts(self, w: _store.Writer) -> None:
        pass  # every insert runs under the write lock, in a write transaction (BEGIN IMMEDIATE) as this one

    def _forget_step(self, w: _store.Writer, *, client_id: str, week: str, after: int) -> tuple[int, int]:
        """Delete ``client_id``'s events among the next :data:`~._store.FORGET_CHUNK` rows of ``week`` after rowid
        ``after`` (through the index on week, in rowid order); return (the last rowid examined, or -1 once the week
        is done; the events deleted). There is no index by client id: it would cost every insert ~19 %
        (``benchmarks/bench_collector.py``), and a forget is rare."""
        ((last, hits),) = w.query(
            "SELECT max(rowid), group_concat(CASE WHEN client_id = ? THEN rowid END) FROM ("
            " SELECT rowid, client_id FROM events INDEXED BY events_week WHERE week = ? AND rowid > ?"
            " ORDER BY rowid LIMIT ?)",
            (client_id, week, after, _store.FORGET_CHUNK),
        )
        if last is None:
            return -1, 0
        n = 0
        if hits:
            ids = [int(x) for x in str(hits).split(",")]
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                query = f"DELETE FROM events WHERE rowid IN ({','.join('?' * len(chunk))})"  # noqa: S608 - only ?s
                n += w.execute(query, chunk)
        return int(last), n

    @contextlib.contextmanager
    def _lease(self) -> Iterator[bool]:
        # Across processes on one file: a lease in the database, which a killed holder gives up by expiring.
        def take(w: _store.Writer) -> bool:
            now = time.time()
            return bool(
                w.execute("UPDATE rollup_state SET lease_until = ? WHERE lease_until < ?", (now + LEASE_S, now))
            )

        held = self._write(take)
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(_common.CollectorError, sqlite3.Error):
                    self._write(lambda w: w.execute("UPDATE rollup_state SET lease_until = 0"))

    def rollup_lock(self) -> contextlib.AbstractContextManager[bool]:
        return self._lease()

    # -- reading --------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_store.Reader]:
        # A reader never waits for a writer in WAL mode: `quick` needs nothing more here.
        try:
            with self._connection() as conn:
                conn.execute("BEGIN")  # one snapshot for every query of the block
                try:
                    yield _store.Reader(lambda sql, params: list(conn.execute(sql, tuple(params))))
                finally:
                    conn.execute("COMMIT")
        except sqlite3.Error as exc:
            msg = f"cannot read the collector database {self.path}: {exc}"
            if operational(exc):
                raise _common.Unavailable(msg) from exc
            raise _common.CollectorError(msg) from exc

    def reading(self, *, quick: bool = False) -> contextlib.AbstractContextManager[_store.Reader]:
        return self._reading()

    def close(self) -> None:
        with self._write_lock, self._lock:
            pool, self._pool = self._pool, []
            if self._writer is not None:
                pool.append(self._writer)
                self._writer = None
            self._pid = -1  # connections returned later are closed, not pooled
            self._closed = True  # and none is opened any more
        for conn in pool:
            conn.close()
