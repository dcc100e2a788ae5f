"""The PostgreSQL back end (psycopg 3): for a deployment, where several collector processes on several hosts
write to one database.

``pip install 'spool_reporter[collector]'`` brings psycopg (and gunicorn). ``--db`` (or
``SPOOL_REPORTER_COLLECTOR_DB``) is then a libpq connection URL, e.g. ``postgresql://collector@db.internal/
spool`` (a password is best kept in ``~/.pgpass`` or ``PGPASSWORD``, never on a command line).

**Counting once across processes.** ``event_id`` is the primary key and every insert is ``INSERT ... ON
CONFLICT DO NOTHING``, so a batch re-delivered to any process, even at the same moment, counts once.
Each batch is one transaction that first locks its clients' ``client_weeks`` rows (in one fixed order, so
two transactions never deadlock): two batches of one client id are serialised, which makes "which ids are
new" and the per-client weekly cap exact, while batches of different clients run side by side.

**Durability.** A batch is answered ``2xx`` after its ``COMMIT`` returns, i.e. once PostgreSQL has flushed
it to its WAL (``synchronous_commit`` ``on``, the default: do not turn it off for this database).

**Schema.** Created and migrated by the collector itself, under a transaction-scoped advisory lock so that
many processes starting at once migrate once; the version is the one row of ``spool_reporter_schema``.
Event and client ids are ``uuid`` columns (16 bytes, not 36 characters of text).

**Connections.** A small pool per process, created lazily and discarded across a ``fork``. A connection
that fails is closed, and the request is answered ``503`` with ``Retry-After`` (the flusher keeps the batch
and comes back), never with a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from . import _store
from ._store import (
    COLUMNS,
    LATE,
    OVER_CAP,
    SCHEMA_VERSION,
    CollectorError,
    Inserted,
    Limits,
    Reader,
    Store,
    Unavailable,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any, Final, TypeVar

    import psycopg

    from ._store import Release, RollupCells, RollupTotals, Row

    _T = TypeVar("_T")

POOL_SIZE: Final = 8
"""Idle connections kept per process (a gunicorn worker with 4 threads uses at most 4)."""

CONNECT_TIMEOUT_S: Final = 5
"""libpq's ``connect_timeout``: a database that does not answer is an error line, not a hang."""

LOCK_TIMEOUT_MS: Final = 10_000
"""How long a batch waits for another batch of the same client (a few ms each), as SQLite's busy timeout."""

ADVISORY_LOCK: Final = 0x5350_4F4F_4C52  # "SPOOLR"
"""The advisory lock key that serialises schema migrations between processes."""

CLOSING_LOCK: Final = ADVISORY_LOCK + 1
"""Taken shared by every insert and exclusively by :meth:`PostgresStore.close_weeks`: closing a week waits for
the inserts in flight, and every insert after it sees the week closed."""

ROLLUP_LOCK: Final = ADVISORY_LOCK + 2
"""Held (a session lock) by the one process rolling up; the others skip (:meth:`PostgresStore.rollup_lock`)."""

_TYPES: Final = {"event_id": "uuid", "client_id": "uuid"}
"""Column types other than ``text``."""

MIGRATIONS: Final = {
    1: (
        "CREATE TABLE IF NOT EXISTS events ("
        + ", ".join(f"{c} {_TYPES.get(c, 'text')} NOT NULL" for c in COLUMNS)
        + ", PRIMARY KEY (event_id))",
    ),
    2: (
        "CREATE TABLE IF NOT EXISTS client_weeks ("
        " client_id uuid NOT NULL, week text NOT NULL, n integer NOT NULL, PRIMARY KEY (client_id, week))",
        "CREATE TABLE IF NOT EXISTS refusals ("
        " week text NOT NULL, reason text NOT NULL, n bigint NOT NULL, PRIMARY KEY (week, reason))",
        "INSERT INTO client_weeks (client_id, week, n) SELECT client_id, week, COUNT(*) FROM events GROUP BY 1, 2 "
        "ON CONFLICT DO NOTHING",
    ),
    3: (
        # Weeks compare as in Python and SQLite, byte by byte, whatever the database's locale ("2026-W53" <
        # "2027-W01"): the "C" collation on every week column, so that comparisons and the indexes agree.
        'ALTER TABLE events ALTER COLUMN week TYPE text COLLATE "C"',
        'ALTER TABLE client_weeks ALTER COLUMN week TYPE text COLLATE "C"',
        "CREATE INDEX IF NOT EXISTS events_week ON events (week)",
        "CREATE TABLE IF NOT EXISTS client_apps ("
        ' client_id uuid NOT NULL, app text NOT NULL, first_week text COLLATE "C" NOT NULL,'
        ' last_week text COLLATE "C" NOT NULL, PRIMARY KEY (client_id, app))',
        "CREATE INDEX IF NOT EXISTS client_apps_first ON client_apps (app, first_week)",
        "INSERT INTO client_apps (client_id, app, first_week, last_week) "
        "SELECT client_id, app, MIN(week), MAX(week) FROM events GROUP BY 1, 2 ON CONFLICT DO NOTHING",
        "CREATE TABLE IF NOT EXISTS rollup_weeks ("
        ' app text NOT NULL, week text COLLATE "C" NOT NULL, developers bigint NOT NULL, events bigint NOT NULL,'
        " new_developers bigint NOT NULL, PRIMARY KEY (app, week))",
        "CREATE TABLE IF NOT EXISTS rollup_cells ("
        ' app text NOT NULL, week text COLLATE "C" NOT NULL, breakdown text NOT NULL, value text NOT NULL,'
        " n bigint NOT NULL, PRIMARY KEY (app, week, breakdown, value))",
        "CREATE TABLE IF NOT EXISTS rollup_state ("
        ' id integer PRIMARY KEY CHECK (id = 1), closed_through text COLLATE "C" NOT NULL,'
        ' rolled_through text COLLATE "C" NOT NULL)',
        "INSERT INTO rollup_state (id, closed_through, rolled_through) VALUES (1, '', '') ON CONFLICT DO NOTHING",
    ),
    4: (
        # The day of an event, never its second (._store); new rows are cut by the insert itself.
        "UPDATE events SET time = left(time, 10) WHERE length(time) > 10",
        "CREATE TABLE IF NOT EXISTS releases ("
        ' app text NOT NULL, period text COLLATE "C" NOT NULL, kind text NOT NULL, made text NOT NULL,'
        " epsilon double precision NOT NULL, body text NOT NULL, PRIMARY KEY (app, period, kind))",
        "CREATE TABLE IF NOT EXISTS release_state ("
        ' id integer PRIMARY KEY CHECK (id = 1), first_week text COLLATE "C" NOT NULL)',
        # '' is replaced by the week of the migration, in the same transaction.
        "INSERT INTO release_state (id, first_week) VALUES (1, '') ON CONFLICT DO NOTHING",
    ),
}
"""Schema version -> the statements that reach it from the one before."""
assert max(MIGRATIONS) == SCHEMA_VERSION

# Parameters travel as one text value each -- a comma-separated list (uuids and ISO weeks hold no comma), or
# the batch as JSON -- not as arrays: psycopg quotes every element of a text array in Python, which cost
# more than the rest of the insert together (benchmarks/bench_collector.py).
_PAIRS: Final = "unnest(string_to_array(%s, ','), string_to_array(%s, ','))"
_INSERT: Final = (
    f"INSERT INTO events ({', '.join(COLUMNS)}) "  # noqa: S608 - fixed names
    f"SELECT {', '.join('left(time, 10)' if c == 'time' else c for c in COLUMNS)} "  # the day only
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
_ADD_REFUSAL: Final = (
    "INSERT INTO refusals (week, reason, n) VALUES (%s, %s, %s) "
    "ON CONFLICT (week, reason) DO UPDATE SET n = refusals.n + excluded.n"
)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        msg = "a postgresql:// database needs psycopg 3: pip install 'spool_reporter[collector]'"
        raise CollectorError(msg) from exc
    return psycopg


def _one(cur: psycopg.Cursor[Any], sql: str, params: tuple[object, ...] = ()) -> tuple[Any, ...]:
    """The one row ``sql`` returns (every query given here returns exactly one)."""
    row = cur.execute(sql, params).fetchone()
    if row is None:  # pragma: no cover - rollup_state has its one row from the migration on
        msg = f"no row from {sql.split(maxsplit=1)[0]}"
        raise CollectorError(msg)
    return tuple(row)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class PostgresStore(Store):
    """The events database at the PostgreSQL URL ``url``.

    :param url: a libpq connection URL (``postgresql://user@host:port/dbname``, ``?host=/run/postgresql``).
    :param create: create the tables and migrate an older schema (the database itself must exist);
        otherwise a database without the collector's tables raises :class:`CollectorError`.
    :param limits: what is kept (:class:`~._store.Limits`).
    """

    kind = "postgresql"

    def __init__(self, url: str, *, create: bool = True, limits: Limits | None = None) -> None:
        self.url = url
        self.display = _store.redact(url)
        self.limits = limits or Limits()
        self._pg: Any = _psycopg()
        self._lock = threading.Lock()
        self._pool: list[psycopg.Connection[Any]] = []
        self._pid = os.getpid()
        self._closed = False
        conn = self._connect()
        try:
            with conn.transaction():
                if create:
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
                version = self._version(conn)
                if version > SCHEMA_VERSION:
                    msg = (
                        f"the collector database {self.display} has schema {version}, newer than this collector's "
                        f"{SCHEMA_VERSION}: upgrade spool_reporter"
                    )
                    raise CollectorError(msg)
                if create:
                    self._migrate(conn, version)
                elif version == 0:
                    msg = f"{self.display} has no collector tables (run `collector migrate --db ...` or serve once)"
                    raise CollectorError(msg)
        except self._pg.Error as exc:
            conn.close()
            msg = f"cannot open the collector database {self.display}: {_first_line(exc)}"
            raise CollectorError(msg) from exc
        except BaseException:
            conn.close()
            raise
        self._put(conn)

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            conn: psycopg.Connection[Any] = self._pg.connect(
                self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name="spool_reporter"
            )
        except self._pg.Error as exc:  # OperationalError, ProgrammingError (a malformed URL)
            msg = f"cannot connect to the collector database {self.display}: {_first_line(exc)}"
            raise Unavailable(msg) from exc
        try:
            conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        except BaseException:
            conn.close()
            raise
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
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                conn.execute(statement)
        conn.execute("UPDATE release_state SET first_week = %s WHERE first_week = ''", (_store.this_week(time.time()),))
        conn.execute("CREATE TABLE IF NOT EXISTS spool_reporter_schema (version integer NOT NULL)")
        conn.execute("DELETE FROM spool_reporter_schema")
        conn.execute("INSERT INTO spool_reporter_schema (version) VALUES (%s)", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        return self._run(self._version)

    # -- connections ----------------------------------------------------------------------------------------

    def _get(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._closed:  # e.g. a roll-up thread still running when the application shut down
                msg = f"the collector database {self.display} is closed"
                raise CollectorError(msg)
            if self._pid != os.getpid():  # forked: the parent's connections are not ours to use
                self._pool, self._pid = [], os.getpid()
            if self._pool:
                return self._pool.pop()
        return self._connect()

    def _put(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._pool) < POOL_SIZE and not conn.closed:
                self._pool.append(conn)
                return
        conn.close()

    def _run(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """``work(conn)`` on a pooled connection; a failed connection is closed, never pooled again."""
        conn = self._get()
        try:
            result = work(conn)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.close()
            transient = (
                self._pg.OperationalError,
                self._pg.errors.DeadlockDetected,
                self._pg.errors.SerializationFailure,
            )
            if isinstance(exc, transient):
                msg = f"the collector database {self.display} is unavailable: {_first_line(exc)}"
                raise Unavailable(msg) from exc
            raise
        self._put(conn)
        return result

    # -- writing --------------------------------------------------------------------------------------------

    def _insert_batch(
        self, rows: Sequence[Row], want_new: bool, refused: dict[str, int], now: float | None
    ) -> Inserted:
        return self._run(lambda conn: self._insert(conn, rows, want_new, refused, now))

    def _insert(
        self,
        conn: psycopg.Connection[Any],
        rows: Sequence[Row],
        want_new: bool,
        refused: dict[str, int],
        now: float | None,
    ) -> Inserted:
        cap = self.limits.per_client_week
        kept: list[Row] = []
        added = limited = late = 0
        with conn.transaction(), conn.cursor() as cur:
            if rows:
                # Shared with every other insert, exclusive for close_weeks(): a week closed after this point
                # waits for this transaction; one closed before it is seen closed by the query below.
                cur.execute("SELECT pg_advisory_xact_lock_shared(%s)", (CLOSING_LOCK,))
                (closed,) = _one(cur, "SELECT closed_through FROM rollup_state")
                if closed and any(row[11] <= closed for row in rows):
                    old = [row for row in rows if row[11] <= closed]
                    rows = [row for row in rows if row[11] > closed]
                    ids = {row[0] for row in old}
                    seen = {r[0] for r in cur.execute(_KNOWN, (",".join(ids),))}
                    late = len(ids - seen)  # the others are duplicates, as they would be in an open week
            keys = sorted({(row[9], row[11]) for row in rows})
            clients, weeks = ",".join(k[0] for k in keys), ",".join(k[1] for k in keys)
            if rows:
                # Lock this batch's (client, week) rows, creating missing ones, in one order (see the docstring).
                cur.execute(_ENSURE_CLIENT_WEEKS, (clients, weeks))
                used = {(c, w): int(n) for c, w, n in cur.execute(_LOCK_CLIENT_WEEKS, (clients, weeks))}
                known = {r[0] for r in cur.execute(_KNOWN, (",".join({row[0] for row in rows}),))}
                new, groups = _store.group_new(rows, known)
                kept, taken, limited = _store.apply_cap(new, groups, used, cap)
                if kept:
                    batch = json.dumps([dict(zip(COLUMNS, row, strict=True)) for row in kept], separators=(",", ":"))
                    added = cur.execute(_INSERT, (batch,)).rowcount
                    items = sorted(taken.items())
                    columns = (",".join(k[0] for k, _ in items), ",".join(k[1] for k, _ in items))
                    cur.execute(_ADD_CLIENT_WEEKS, (*columns, ",".join(str(n) for _, n in items)))
                    spans = _store.client_apps(kept)  # in key order: two batches lock shared rows in one order
                    cur.execute(_ADD_CLIENT_APPS, tuple(",".join(span[i] for span in spans) for i in range(4)))
            if limited:
                refused[OVER_CAP] = refused.get(OVER_CAP, 0) + limited
            if late:
                refused[LATE] = refused.get(LATE, 0) + late
            if refused:
                week = _store.this_week(time.time() if now is None else now)
                cur.executemany(_ADD_REFUSAL, [(week, reason, n) for reason, n in sorted(refused.items()) if n])
        return Inserted(added, kept if want_new else [], limited + late)

    # -- retention and forget -------------------------------------------------------------------------------

    def _transaction(self, work: Callable[[psycopg.Cursor[Any]], _T]) -> _T:
        def run(conn: psycopg.Connection[Any]) -> _T:
            with conn.transaction(), conn.cursor() as cur:
                return work(cur)

        return self._run(run)

    def close_weeks(self, week: str) -> str:
        def work(cur: psycopg.Cursor[Any]) -> str:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (CLOSING_LOCK,))  # waits for the inserts in flight
            cur.execute("UPDATE rollup_state SET closed_through = %s WHERE closed_through < %s", (week, week))
            return str(_one(cur, "SELECT closed_through FROM rollup_state")[0])

        return self._transaction(work)

    def save_rollup(self, week: str, totals: RollupTotals, cells: RollupCells) -> bool:
        def work(cur: psycopg.Cursor[Any]) -> bool:
            closed, rolled = _one(cur, "SELECT closed_through, rolled_through FROM rollup_state FOR UPDATE")
            if week <= rolled or week > closed:
                return False
            cur.executemany(
                "INSERT INTO rollup_weeks (app, week, developers, events, new_developers) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(app, week, devs, n, first) for app, devs, n, first in totals],
            )
            cur.executemany(
                "INSERT INTO rollup_cells (app, week, breakdown, value, n) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                [(app, week, name, value, n) for app, name, value, n in cells],
            )
            cur.execute("UPDATE rollup_state SET rolled_through = %s", (week,))
            return True

        return self._transaction(work)

    def mark_rolled(self, week: str) -> None:
        def work(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                "UPDATE rollup_state SET rolled_through = %s WHERE rolled_through < %s AND closed_through >= %s",
                (week, week, week),
            )

        self._transaction(work)

    def delete_expired(self, *, through_week: str, before: str, limit: int) -> int:
        def work(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(
                "DELETE FROM events WHERE event_id IN (SELECT event_id FROM events WHERE week <= %s AND time < %s "
                "AND week <= (SELECT rolled_through FROM rollup_state) LIMIT %s)",
                (through_week, before, limit),
            )
            return int(cur.rowcount)

        return self._transaction(work)

    def expire_ids(self, before_week: str) -> None:
        def work(cur: psycopg.Cursor[Any]) -> None:
            rolled = "(SELECT rolled_through FROM rollup_state)"
            cur.execute(f"DELETE FROM client_weeks WHERE week < %s AND week <= {rolled}", (before_week,))  # noqa: S608
            cur.execute(f"DELETE FROM client_apps WHERE last_week < %s AND last_week <= {rolled}", (before_week,))  # noqa: S608

        self._transaction(work)

    def forget(self, client_id: str) -> int:
        def work(cur: psycopg.Cursor[Any]) -> int:
            # The client's weeks (client_weeks), locked, then its events week by week through the index on week.
            weeks = [
                str(w)
                for (w,) in cur.execute(
                    "SELECT week FROM client_weeks WHERE client_id = %s::uuid FOR UPDATE", (client_id,)
                )
            ]
            deleted = cur.execute(
                "DELETE FROM events WHERE week = ANY(string_to_array(%s, ',')) AND client_id = %s::uuid",
                (",".join(weeks), client_id),
            ).rowcount
            cur.execute("DELETE FROM client_weeks WHERE client_id = %s::uuid", (client_id,))
            cur.execute("DELETE FROM client_apps WHERE client_id = %s::uuid", (client_id,))
            return int(deleted)

        return self._transaction(work)

    def save_release(self, release: Release) -> bool:
        def work(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(
                "INSERT INTO releases (app, period, kind, made, epsilon, body) VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                tuple(release),
            )
            return bool(cur.rowcount)

        return self._transaction(work)

    def set_first_week(self, week: str) -> None:
        self._transaction(lambda cur: cur.execute("UPDATE release_state SET first_week = %s", (week,)))

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
    def _reading(self) -> Iterator[Reader]:
        conn = self._get()
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # one snapshot

                def run(sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
                    return list(conn.execute(sql.replace("?", "%s"), tuple(params)))

                yield Reader(run)
        except self._pg.Error as exc:
            with contextlib.suppress(Exception):
                conn.close()
            msg = f"cannot read the collector database {self.display}: {_first_line(exc)}"
            raise CollectorError(msg) from exc
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            raise
        self._put(conn)

    def reading(self) -> contextlib.AbstractContextManager[Reader]:
        return self._reading()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, []
            self._pid = -1  # connections returned later are closed, not pooled
            self._closed = True  # and none is opened any more
        for conn in pool:
            with contextlib.suppress(Exception):
                conn.close()
