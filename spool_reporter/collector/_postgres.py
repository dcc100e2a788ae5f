"""The PostgreSQL back end (psycopg 3): for a deployment, where several collector processes on several hosts
write to one database.

``pip install 'spool_reporter[collector]'`` brings psycopg and psycopg_pool (and gunicorn). ``--db`` (or
``SPOOL_REPORTER_COLLECTOR_DB``) is then a libpq connection URL, e.g. ``postgresql://collector@db.internal/
spool`` (a password is best kept in ``~/.pgpass`` or ``PGPASSWORD``, never on a command line).

**Counting once across processes.** ``event_id`` is the primary key and every insert is ``INSERT ... ON
CONFLICT DO NOTHING``, so a batch re-delivered to any process, even at the same moment, counts once.
Each batch is one transaction that first locks its clients' ``client_weeks`` rows (in one fixed order, so
two transactions never deadlock): two batches of one client id are serialised, which makes "which ids are
new" and the per-client weekly cap exact, while batches of different clients run side by side.

**Durability.** A batch is answered ``2xx`` after its ``COMMIT`` returns, i.e. once PostgreSQL has flushed
it to its WAL (``synchronous_commit`` ``on``, the default: do not turn it off for this database).

**Schema.** Created and migrated by the collector itself (:data:`~._schema.POSTGRES_MIGRATIONS`), under a
transaction-scoped advisory lock so that many processes starting at once migrate once; the version is the one row
of ``spool_reporter_schema``.
Event and client ids are ``uuid`` columns (16 bytes, not 36 characters of text).

**Connections.** A :class:`psycopg_pool.ConnectionPool` per process (:data:`POOL_MIN_SIZE` to
:data:`POOL_MAX_SIZE` connections), opened by the first request of that process: a pre-forking server that opens
the store before it forks (gunicorn's ``--preload``) gives each worker a pool of its own, and a child forked
while the parent's pool ran never touches it (its threads are gone, its connections are the parent's). A broken
connection is discarded by the pool and replaced, and the request is answered ``503`` with ``Retry-After`` (the
flusher keeps the batch and comes back), never with a traceback; so is a request that finds no connection
within :data:`CONNECT_TIMEOUT_S`.

**Bounded waits.** A request never waits on the database for more than :data:`~._store.REQUEST_WAIT_S`:
each connection runs with ``lock_timeout`` (:data:`LOCK_TIMEOUT_MS`) and ``statement_timeout``
(:data:`STATEMENT_TIMEOUT_MS`), which the server enforces; a server that does not answer at all (frozen,
or cut off by the network) cannot enforce them, so a watchdog thread shuts the socket of a request's
connection once its time is up (:class:`_Watchdog`), and libpq's ``connect_timeout`` bounds a new
connection. Each ends in :class:`~._common.Unavailable`: ``503`` with ``Retry-After``. The roll-up, the
statistics and a migration lift the statement timeout for their own transactions (``SET LOCAL``): they may
take as long as the data needs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import socket
import threading
import time

from spool_reporter._redact import redact_url

from . import _common, _intake, _schema, _store, _weeks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any, Final, TypeVar

    import psycopg
    from psycopg_pool import ConnectionPool

    from ._common import Row

    _T = TypeVar("_T")

POOL_MIN_SIZE: Final = 1
"""Connections a process's pool keeps open when idle (more are closed after ten idle minutes, psycopg_pool's
``max_idle``)."""

POOL_MAX_SIZE: Final = 16
"""Connections a process's pool opens at most: more than the threads that use the store at once (the embedded
server's 8 workers, gunicorn's 4 threads, a roll-up, a forget); beyond, a request waits for one to come back."""

CONNECT_TIMEOUT_S: Final = 3
"""libpq's ``connect_timeout`` (its minimum is 2): a database that does not answer is an error line, not a hang;
and the longest a request waits for a connection from the pool (then ``503``)."""

RECONNECT_TIMEOUT_S: Final = 10.0
"""How long the pool retries (backing off from 1 s) to replace a connection before it gives up until the next
request asks: bounds how long a database that came back waits for the pool to notice."""

LOCK_TIMEOUT_MS: Final = int(_store.LOCK_WAIT_S * 1000)
"""``lock_timeout``: how long a statement waits for a lock (a batch for another batch of the same client, a
few ms each), as SQLite's busy timeout."""

STATEMENT_TIMEOUT_MS: Final = 3000
"""``statement_timeout`` of a request's statements (they take milliseconds); lifted by the long work."""

ADVISORY_LOCK: Final = 0x5350_4F4F_4C52  # "SPOOLR"
"""The advisory lock key that serialises schema migrations between processes."""

CLOSING_LOCK: Final = ADVISORY_LOCK + 1
"""Taken shared by every insert and exclusively by :meth:`PostgresStore.close_weeks`: closing a week waits for
the inserts in flight, and every insert after it sees the week closed."""

ROLLUP_LOCK: Final = ADVISORY_LOCK + 2
"""Held (a session lock) by the one process rolling up; the others skip (:meth:`PostgresStore.rollup_lock`)."""

_CONNECT_KWARGS: Final[dict[str, Any]] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT_S,
    "application_name": "spool_reporter",
}
"""How every connection is made (:func:`psycopg.connect`'s arguments besides the URL)."""

# Parameters travel as one text value each -- a comma-separated list (uuids and ISO weeks hold no comma), or
# the batch as JSON -- not as arrays: psycopg quotes every element of a text array in Python, which cost
# more than the rest of the insert together (benchmarks/bench_collector.py).
_PAIRS: Final = "unnest(string_to_array(%s, ','), string_to_array(%s, ','))"
_INSERT: Final = (
    f"INSERT INTO events ({', '.join(_common.COLUMNS)}) "  # noqa: S608 - fixed names
    f"SELECT {', '.join('left(time, 10)' if c == 'time' else c for c in _common.COLUMNS)} "  # the day only
    "FROM json_populate_recordset(NULL::events, %s::json) "
    "ON CONFLICT (event_id) DO NOTHING"
)
_ENSURE_CLIENT_WEEKS: Final = (
    f"INSERT INTO client_weeks (client_id, week, n) SELECT c::uuid, w, 0 FROM {_PAIRS} AS u(c, w) "  # noqa: S608
    "ON CONFLICT DO NOTHING"
)
_LOCK_CLIENT_WEEKS: Final = (
    "SELECT client_id::text, week, n FROM client_weeks "  # noqa: S608 - fixed text
    f"WHERE (client_id, week) IN (SELECT c::uuid, w FROM {_PAIRS} AS u(c, w)) "
    'ORDER BY client_id, week COLLATE "C" FOR UPDATE'
)
_KNOWN: Final = "SELECT event_id::text FROM events WHERE event_id = ANY(string_to_array(%s, ',')::uuid[])"
_ADD_CLIENT_WEEKS: Final = (
    "UPDATE client_weeks AS c SET n = c.n + u.n::integer "
    "FROM unnest(string_to_array(%s, ','), string_to_array(%s, ','), string_to_array(%s, ',')) AS u(c, w, n) "
    "WHERE c.client_id = u.c::uuid AND c.week = u.w"
)
_ADD_CLIENT_APPS: Final = (
    "INSERT INTO client_apps (client_id, app, first_week, last_week) SELECT c::uuid, a, f, l "
    "FROM unnest(string_to_array(%s, ','), string_to_array(%s, ','), string_to_array(%s, ','), "
    "string_to_array(%s, ',')) AS u(c, a, f, l) "
    "ON CONFLICT (client_id, app) DO UPDATE SET first_week = LEAST(client_apps.first_week, excluded.first_week), "
    "last_week = GREATEST(client_apps.last_week, excluded.last_week) "
    "WHERE excluded.first_week < client_apps.first_week OR excluded.last_week > client_apps.last_week"
)
_BATCH_STATE: Final = (
    "SELECT closed_through, ARRAY(SELECT digest FROM forgotten WHERE digest = ANY(string_to_array(%s, ','))) "
    "FROM rollup_state"
)
_ADD_REFUSAL: Final = (
    "INSERT INTO refusals (week, reason, n) VALUES (%s, %s, %s) "
    "ON CONFLICT (week, reason) DO UPDATE SET n = refusals.n + excluded.n"
)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        msg = "a postgresql:// database needs psycopg 3: pip install 'spool_reporter[collector]'"
        raise _common.CollectorError(msg) from exc
    return psycopg


@functools.cache
def _pool_class() -> type[ConnectionPool[Any]]:
    """:class:`psycopg_pool.ConnectionPool`, owned by the process that made it (imported on first use)."""
    try:
        import psycopg_pool
    except ImportError as exc:
        msg = "a postgresql:// database needs psycopg_pool: pip install 'spool_reporter[collector]'"
        raise _common.CollectorError(msg) from exc

    class Pool(psycopg_pool.ConnectionPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.pid = os.getpid()
            super().__init__(*args, **kwargs)

        def __del__(self) -> None:
            # In a forked child the parent's pool is a copy whose threads are gone (a lock one of them held stays
            # held) and whose connections are the parent's sessions: stopping it could hang, closing them would end
            # the parent's. Left alone, it is a little memory.
            if self.pid == os.getpid():
                super().__del__()

    return Pool


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Each new connection of the pool: the bounded waits (see the module docstring)."""
    conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}; SET statement_timeout = {STATEMENT_TIMEOUT_MS}")


def _one(cur: psycopg.Cursor[Any], sql: str, params: tuple[object, ...] = ()) -> tuple[Any, ...]:
    """The one row ``sql`` returns (every query given here returns exactly one)."""
    row = cur.execute(sql, params).fetchone()
    if row is None:  # pragma: no cover - rollup_state has its one row from the migration on
        msg = f"no row from {sql.split(maxsplit=1)[0]}"
        raise _common.CollectorError(msg)
    return tuple(row)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _Watchdog:
    """Shuts the socket of a connection whose request outlived its time: the one bound that holds when the server
    answers nothing at all (``statement_timeout`` is the server's to enforce). One thread per process, started
    with the first watch (and again in a forked child: threads do not survive a fork)."""

    def __init__(self) -> None:
        self._reset()
        self._next = 0
        if hasattr(os, "register_at_fork"):
            # A fork may happen while the parent's thread holds the condition's lock (a pre-forking server that
            # used the store before forking): the child starts with a fresh one, and no thread.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, int]] = {}  # token -> (monotonic deadline, socket fd)
        self._killed: set[int] = set()
        self._pid = 0

    def watch(self, fd: int, seconds: float) -> int:
        with self._cond:
            if self._pid != os.getpid():
                self._due, self._killed, self._pid = {}, set(), os.getpid()
                threading.Thread(target=self._loop, name="spool_reporter-pg-watchdog", daemon=True).start()
            self._next += 1
            self._due[self._next] = (time.monotonic() + seconds, fd)
            self._cond.notify()
            return self._next

    def done(self, token: int) -> bool:
        """Stop watching; ``True`` if the socket was shut meanwhile (the connection is then unusable)."""
        with self._cond:
            self._due.pop(token, None)
            if token in self._killed:
                self._killed.discard(token)
                return True
            return False

    def _loop(self) -> None:
        with self._cond:
            while True:  # a daemon thread: ends with the process
                now = time.monotonic()
                for token, (deadline, fd) in list(self._due.items()):
                    if deadline <= now:
                        del self._due[token]
                        self._killed.add(token)
                        _shut(fd)
                soonest = min((deadline for deadline, _ in self._due.values()), default=now + 60)
                self._cond.wait(max(0.05, soonest - now))


def _shut(fd: int) -> None:
    """Shut the socket ``fd`` down for both directions: a thread blocked on it wakes with an error."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


_WATCHDOG: Final = _Watchdog()


class PostgresStore(_store.Store):
    """The events database at the PostgreSQL URL ``url``.

    :param url: a libpq connection URL (``postgresql://user@host:port/dbname``, ``?host=/run/postgresql``).
    :param create: create the tables and migrate an older schema (the database itself must exist);
        otherwise a database without the collector's tables raises :class:`CollectorError`.
    :param limits: what is kept (:class:`~._common.Limits`).
    """

    kind = "postgresql"

    def __init__(self, url: str, *, create: bool = True, limits: _common.Limits | None = None) -> None:
        self.url = url
        self.display = redact_url(url)
        self.limits = limits or _common.Limits()
        self._pg: Any = _psycopg()
        self._pool_class = _pool_class()
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Any] | None = None  # this process's, opened by its first request
        self._closed = False
        self._watch_forks()
        conn = self._connect()
        try:
            with conn.transaction():
                # A migration takes what the table needs (an index on the events), and the processes that start
                # meanwhile wait for it at the advisory lock below.
                conn.execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
                if create:
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
                version = self._version(conn)
                if version > _schema.SCHEMA_VERSION:
                    raise _schema.newer_schema(self.display, version)
                if create:
                    self._migrate(conn, version)
                elif version == 0:
                    msg = f"{self.display} has no collector tables (run `collector migrate --db ...` or serve once)"
                    raise _common.NotACollectorDatabase(msg)
        except self._pg.Error as exc:
            msg = f"cannot open the collector database {self.display}: {_first_line(exc)}"
            raise _common.CollectorError(msg) from exc
        finally:
            conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool: the migration's, and the roll-up's session lock."""
        try:
            conn: psycopg.Connection[Any] = self._pg.connect(self.url, **_CONNECT_KWARGS)
        except self._pg.Error as exc:  # OperationalError, ProgrammingError (a malformed URL)
            msg = f"cannot connect to the collector database {self.display}: {_first_line(exc)}"
            raise _common.Unavailable(msg) from exc
        with _store.closed_on_failure(conn):
            try:
                _configure(conn)
            except self._pg.Error as exc:
                msg = f"cannot use the collector database {self.display}: {_first_line(exc)}"
                raise _common.Unavailable(msg) from exc
        return conn

    @staticmethod
    def _version(conn: psycopg.Connection[Any]) -> int:
        exists = conn.execute("SELECT to_regclass('spool_reporter_schema') IS NOT NULL").fetchone()
        if exists and exists[0]:
            row = conn.execute("SELECT version FROM spool_reporter_schema").fetchone()
            return int(row[0]) if row else 0
        events = conn.execute("SELECT to_regclass('events') IS NOT NULL").fetchone()
        return 1 if events and events[0] else 0

    @staticmethod
    def _migrate(conn: psycopg.Connection[Any], version: int) -> None:
        for target in range(version + 1, _schema.SCHEMA_VERSION + 1):
            for statement in _schema.POSTGRES_MIGRATIONS[target]:
                conn.execute(statement)
        conn.execute("UPDATE release_state SET first_week = %s WHERE first_week = ''", (_weeks.this_week(time.time()),))
        conn.execute("UPDATE forget_key SET key = %s WHERE key = ''", (secrets.token_hex(32),))
        conn.execute("CREATE TABLE IF NOT EXISTS spool_reporter_schema (version integer NOT NULL)")
        conn.execute("DELETE FROM spool_reporter_schema")
        conn.execute("INSERT INTO spool_reporter_schema (version) VALUES (%s)", (_schema.SCHEMA_VERSION,))

    def schema_version(self) -> int:
        return self._run(self._version)

    # -- connections ----------------------------------------------------------------------------------------

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pool = None  # the parent's: left alone (see _pool_class); this process opens its own when asked

    def _connections(self) -> ConnectionPool[Any]:
        """This process's pool, opened on first use."""
        with self._lock:
            if self._closed:  # e.g. a roll-up thread still running when the application shut down
                msg = f"the collector database {self.display} is closed"
                raise _common.StoreClosed(msg)
            pool = self._pool
            if pool is None or pool.pid != os.getpid():  # type: ignore[attr-defined]  # (a fork os.fork did not see)
                pool = self._pool = self._pool_class(
                    self.url,
                    kwargs=_CONNECT_KWARGS,
                    configure=_configure,
                    min_size=POOL_MIN_SIZE,
                    max_size=POOL_MAX_SIZE,
                    timeout=CONNECT_TIMEOUT_S,
                    reconnect_timeout=RECONNECT_TIMEOUT_S,
                    num_workers=1,
                    name="spool_reporter",
                    open=False,
                )
                pool.open(wait=False)
            return pool

    @contextlib.contextmanager
    def _borrow(self, quick: bool) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for a ``with`` block; discarded (and replaced by the pool) if it broke.

        :param quick: a request waits for it: the watchdog shuts the connection after
            :data:`~._store.REQUEST_WAIT_S` (a server that answers nothing), which raises :class:`Unavailable`;
            otherwise no watchdog.
        """
        import psycopg_pool

        pool = self._connections()
        try:
            conn = pool.getconn()
        except psycopg_pool.PoolClosed as exc:  # closed by close() since _connections() returned it
            msg = f"the collector database {self.display} is closed"
            raise _common.StoreClosed(msg) from exc
        except psycopg_pool.PoolTimeout as exc:
            msg = f"the collector database {self.display} is unavailable: no connection within {CONNECT_TIMEOUT_S} s"
            raise _common.Unavailable(msg) from exc
        token = _WATCHDOG.watch(conn.pgconn.socket, _store.REQUEST_WAIT_S) if quick else 0
        try:
            yield conn
        except BaseException as exc:
            killed = bool(token) and _WATCHDOG.done(token)
            if killed:
                with contextlib.suppress(Exception):
                    conn.close()  # its socket is shut: the pool discards it
            pool.putconn(conn)  # rolled back already (conn.transaction()); a broken one is discarded
            if killed:
                msg = f"the collector database {self.display} did not answer within {_store.REQUEST_WAIT_S:g} s"
                raise _common.Unavailable(msg) from exc
            raise
        if token and _WATCHDOG.done(token):  # shut just as the work ended: never pooled again
            with contextlib.suppress(Exception):
                conn.close()
        pool.putconn(conn)

    def _run(self, work: Callable[[psycopg.Connection[Any]], _T], *, quick: bool = True) -> _T:
        """``work(conn)`` on a pooled connection (:meth:`_borrow`); a transient failure is :class:`Unavailable`."""
        transient = (self._pg.OperationalError, self._pg.errors.DeadlockDetected, self._pg.errors.SerializationFailure)
        try:
            with self._borrow(quick) as conn:
                return work(conn)
        except transient as exc:
            msg = f"the collector database {self.display} is unavailable: {_first_line(exc)}"
            raise _common.Unavailable(msg) from exc

    # -- writing --------------------------------------------------------------------------------------------

    def _insert_batch(
        self, rows: Sequence[Row], want_new: bool, refused: dict[str, int], now: float | None
    ) -> _store.Inserted:
        return self._run(lambda conn: self._insert(conn, rows, want_new, refused, now))

    def _insert(
        self,
        conn: psycopg.Connection[Any],
        rows: Sequence[Row],
        want_new: bool,
        refused: dict[str, int],
        now: float | None,
    ) -> _store.Inserted:
        cap = self.limits.per_client_week
        kept: list[Row] = []
        added = limited = late = gone = 0
        with conn.transaction(), conn.cursor() as cur:
            if rows:
                # Shared with every other insert, exclusive for close_weeks(): a week closed after this point
                # waits for this transaction; one closed before it is seen closed by the query below.
                # The same lock keeps a forget's mark and this batch apart: a forget marked before this point is
                # seen below, and a forget marking after it waits for this transaction, then finds its rows.
                cur.execute("SELECT pg_advisory_xact_lock_shared(%s)", (CLOSING_LOCK,))
                digests = _intake.client_digests(rows, self._forget_key(_store.Writer(cur, pyformat=True)))
                closed, marked = _one(cur, _BATCH_STATE, (",".join(sorted(digests)),))
                rows, gone = _intake.without_clients(rows, {digests[d] for d in marked or ()})
                if closed and any(row.week <= closed for row in rows):
                    old = [row for row in rows if row.week <= closed]
                    rows = [row for row in rows if row.week > closed]
                    ids = {row.event_id for row in old}
                    seen = {r[0] for r in cur.execute(_KNOWN, (",".join(ids),))}
                    late = len(ids - seen)  # the others are duplicates, as they would be in an open week
            keys = sorted({(row.client_id, row.week) for row in rows})
            clients, weeks = ",".join(k[0] for k in keys), ",".join(k[1] for k in keys)
            if rows:
                # Lock this batch's (client, week) rows, creating missing ones, in one order (see the docstring).
                cur.execute(_ENSURE_CLIENT_WEEKS, (clients, weeks))
                used = {(c, w): int(n) for c, w, n in cur.execute(_LOCK_CLIENT_WEEKS, (clients, weeks))}
                known = {r[0] for r in cur.execute(_KNOWN, (",".join({row.event_id for row in rows}),))}
                new, groups = _intake.group_new(rows, known)
                kept, taken, limited = _intake.apply_cap(new, groups, used, cap)
                if kept:
                    batch = json.dumps(
                        [dict(zip(_common.COLUMNS, row, strict=True)) for row in kept], separators=(",", ":")
                    )
                    added = cur.execute(_INSERT, (batch,)).rowcount
                    items = sorted(taken.items())
                    columns = (",".join(k[0] for k, _ in items), ",".join(k[1] for k, _ in items))
                    cur.execute(_ADD_CLIENT_WEEKS, (*columns, ",".join(str(n) for _, n in items)))
                    spans = _intake.client_apps(kept)  # in key order: two batches lock shared rows in one order
                    cur.execute(_ADD_CLIENT_APPS, tuple(",".join(span[i] for span in spans) for i in range(4)))
            mine = _intake.refused_here(forgotten=gone, late=late, over_cap=limited)
            counted = _intake.merge_counts(refused, mine)
            if counted:
                week = _weeks.this_week(time.time() if now is None else now)
                cur.executemany(_ADD_REFUSAL, sorted((week, reason, n) for reason, n in counted.items()))
        return _store.Inserted(added, kept if want_new else [], mine)

    # -- retention and forget: the statements are the base class's --------------------------------------------

    dialect = _store.Dialect(
        insert_new="INSERT INTO",
        on_conflict_skip=" ON CONFLICT DO NOTHING",
        row_key="event_id",
        client_id="?::uuid",
        later_until="GREATEST(forgotten.until, excluded.until)",
        for_update=" FOR UPDATE",
    )

    def _write(self, work: Callable[[_store.Writer], _T], *, quick: bool = True) -> _T:
        """``work(writer)`` in one transaction; unless ``quick``, without a statement timeout or the watchdog."""

        def run(conn: psycopg.Connection[Any]) -> _T:
            with conn.transaction(), conn.cursor() as cur:
                if not quick:
                    cur.execute("SET LOCAL statement_timeout = 0")
                return work(_store.Writer(cur, pyformat=True))

        return self._run(run, quick=quick)

    def _exclude_inserts(self, w: _store.Writer) -> None:
        # Exclusive, where every insert takes it shared (see _insert); held for this short transaction only.
        w.execute("SELECT pg_advisory_xact_lock(?)", (CLOSING_LOCK,))

    def _forget_step(self, w: _store.Writer, *, client_id: str, week: str, after: int) -> tuple[int, int]:
        # Through the index on (week, client_id): each transaction finds its rows at once, and deletes them; the
        # next step starts from the beginning again, until one finds fewer than a chunk (`after` is unused).
        n = w.execute(
            "DELETE FROM events WHERE ctid = ANY(ARRAY("
            "SELECT ctid FROM events WHERE week = ? AND client_id = ?::uuid LIMIT ?))",
            (week, client_id, _store.FORGET_CHUNK),
        )
        return (-1 if n < _store.FORGET_CHUNK else 0), n

    @contextlib.contextmanager
    def _rollup_lock(self) -> Iterator[bool]:
        # A session lock on a connection of its own, held for the whole roll-up: PostgreSQL releases it if this
        # process dies, so a killed roll-up never blocks the next.
        conn = self._connect()
        held = False
        try:
            (held,) = _one(conn.cursor(), "SELECT pg_try_advisory_lock(%s)", (ROLLUP_LOCK,))
            yield bool(held)
        finally:
            with contextlib.suppress(Exception):
                if held:
                    # Unlocked before the connection goes: a closed connection's backend lets the lock go a
                    # moment later, and a roll-up started in that moment would find it still held.
                    conn.execute("SELECT pg_advisory_unlock(%s)", (ROLLUP_LOCK,))
            with contextlib.suppress(Exception):
                conn.close()

    def rollup_lock(self) -> contextlib.AbstractContextManager[bool]:
        return self._rollup_lock()

    # -- reading --------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self, quick: bool) -> Iterator[_store.Reader]:
        try:
            with self._borrow(quick) as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # one snapshot
                if not quick:
                    conn.execute("SET LOCAL statement_timeout = 0")  # the roll-up, the statistics: what it takes

                def run(sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
                    return list(conn.execute(sql.replace("?", "%s"), tuple(params)))

                yield _store.Reader(run)
        except self._pg.Error as exc:
            msg = f"cannot read the collector database {self.display}: {_first_line(exc)}"
            if isinstance(exc, self._pg.OperationalError):
                raise _common.Unavailable(msg) from exc
            raise _common.CollectorError(msg) from exc

    def reading(self, *, quick: bool = False) -> contextlib.AbstractContextManager[_store.Reader]:
        return self._reading(quick)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._closed = True  # and no pool is opened any more
        if pool is not None and pool.pid == os.getpid():  # type: ignore[attr-defined]
            pool.close()  # the idle connections now; a borrowed one when it comes back
