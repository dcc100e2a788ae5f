"""The collector's database schema, both dialects side by side: the version this code writes, and for each back
end the statements that bring a database to it from each version before.

The layout is one fact written twice, once per dialect, so the two lists stand here together: a new version adds an
entry to :data:`SQLITE_MIGRATIONS` and to :data:`POSTGRES_MIGRATIONS` and raises :data:`SCHEMA_VERSION`, and a
reader compares them line by line (SQLite's ``WITHOUT ROWID`` tables and ``INSERT OR IGNORE``; PostgreSQL's
``uuid`` ids, ``"C"``-collated weeks and ``ON CONFLICT DO NOTHING``). Each back end runs its own list and records
the version its own way (:mod:`._sqlite`: ``PRAGMA user_version``; :mod:`._postgres`: the table
``spool_reporter_schema``); what the tables hold is in :mod:`._store`'s docstring. Statements only: nothing here
opens a database.
"""

from __future__ import annotations

from ._common import COLUMNS, CollectorError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

SCHEMA_VERSION: Final = 5
"""The layout this code writes: 1 had ``events`` only; 2 added ``client_weeks`` and ``refusals``; 3 added the
roll-ups (``rollup_weeks``, ``rollup_cells``, ``rollup_state``) and the indexes on ``events``; 4 added
``releases`` and ``release_state`` and keeps only the day of an event's ``time``; 5 added ``forgotten`` and
``forget_key`` (and, on PostgreSQL, indexes ``events`` by week and client id)."""

# -- SQLite ------------------------------------------------------------------------------------------------------------

_SQLITE_EVENTS_DDL: Final = (
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
    ")"
)
SQLITE_MIGRATIONS: Final = {
    1: (_SQLITE_EVENTS_DDL,),
    2: (
        "CREATE TABLE IF NOT EXISTS client_weeks ("
        " client_id TEXT NOT NULL, week TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (client_id, week)"
        ") WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS refusals ("
        " week TEXT NOT NULL, reason TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (week, reason)"
        ") WITHOUT ROWID",
        # The cap counts what is already stored, so a database from schema 1 starts with its history.
        "INSERT OR IGNORE INTO client_weeks (client_id, week, n) "
        "SELECT client_id, week, COUNT(*) FROM events GROUP BY 1, 2",
    ),
    3: (
        # A batch's rows take this index at one place or two (their weeks), so it costs an insert ~4 % of its
        # CPU; the statistics then read the open weeks, not the table. An index by client id cost 19 %
        # (benchmarks/bench_collector.py): client_apps and client_weeks answer those questions instead.
        "CREATE INDEX IF NOT EXISTS events_week ON events (week)",
        "CREATE TABLE IF NOT EXISTS client_apps ("
        " client_id TEXT NOT NULL, app TEXT NOT NULL, first_week TEXT NOT NULL, last_week TEXT NOT NULL,"
        " PRIMARY KEY (client_id, app)"
        ") WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS client_apps_first ON client_apps (app, first_week)",
        "INSERT OR IGNORE INTO client_apps (client_id, app, first_week, last_week) "
        "SELECT client_id, app, MIN(week), MAX(week) FROM events GROUP BY 1, 2",
        "CREATE TABLE IF NOT EXISTS rollup_weeks ("
        " app TEXT NOT NULL, week TEXT NOT NULL, developers INTEGER NOT NULL, events INTEGER NOT NULL,"
        " new_developers INTEGER NOT NULL, PRIMARY KEY (app, week)"
        ") WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS rollup_cells ("
        " app TEXT NOT NULL, week TEXT NOT NULL, breakdown TEXT NOT NULL, value TEXT NOT NULL, n INTEGER NOT NULL,"
        " PRIMARY KEY (app, week, breakdown, value)"
        ") WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS rollup_state ("
        " id INTEGER PRIMARY KEY CHECK (id = 1), closed_through TEXT NOT NULL, rolled_through TEXT NOT NULL,"
        " lease_until REAL NOT NULL"
        ")",
        "INSERT OR IGNORE INTO rollup_state (id, closed_through, rolled_through, lease_until) VALUES (1, '', '', 0)",
    ),
    4: (
        # The day of an event, never its second (._store); new rows are cut by the insert itself.
        "UPDATE events SET time = substr(time, 1, 10) WHERE length(time) > 10",
        "CREATE TABLE IF NOT EXISTS releases ("
        " app TEXT NOT NULL, period TEXT NOT NULL, kind TEXT NOT NULL, made TEXT NOT NULL, epsilon REAL NOT NULL,"
        " body TEXT NOT NULL, PRIMARY KEY (app, period, kind)"
        ") WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS release_state (id INTEGER PRIMARY KEY CHECK (id = 1), first_week TEXT NOT NULL)",
        # '' is replaced by the week of the migration (the store's migrate), in the same transaction.
        "INSERT OR IGNORE INTO release_state (id, first_week) VALUES (1, '')",
    ),
    5: (
        "CREATE TABLE IF NOT EXISTS forgotten (digest TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS forget_key (id INTEGER PRIMARY KEY CHECK (id = 1), key TEXT NOT NULL)",
        # '' is replaced by a random key (secrets.token_hex) in the same transaction.
        "INSERT OR IGNORE INTO forget_key (id, key) VALUES (1, '')",
    ),
}
"""Schema version -> the statements that reach it from the one before (``PRAGMA user_version`` records it)."""
assert max(SQLITE_MIGRATIONS) == SCHEMA_VERSION

# -- PostgreSQL --------------------------------------------------------------------------------------------------------

_POSTGRES_TYPES: Final = {"event_id": "uuid", "client_id": "uuid"}
"""Column types other than ``text``."""

POSTGRES_MIGRATIONS: Final = {
    1: (
        "CREATE TABLE IF NOT EXISTS events ("
        + ", ".join(f"{c} {_POSTGRES_TYPES.get(c, 'text')} NOT NULL" for c in COLUMNS)
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
    5: (
        'CREATE TABLE IF NOT EXISTS forgotten (digest text COLLATE "C" PRIMARY KEY, until double precision NOT NULL)',
        "CREATE TABLE IF NOT EXISTS forget_key (id integer PRIMARY KEY CHECK (id = 1), key text NOT NULL)",
        # '' is replaced by a random key (secrets.token_hex) in the same transaction.
        "INSERT INTO forget_key (id, key) VALUES (1, '') ON CONFLICT DO NOTHING",
        # A forget deletes a client's events week by week in short transactions: through this index each finds
        # them at once, where the index on week alone made it read the whole week (seconds, at scale). It takes
        # the place of that index: the statistics' reads of a week use its first column.
        "CREATE INDEX IF NOT EXISTS events_week_client ON events (week, client_id)",
        "DROP INDEX IF EXISTS events_week",
    ),
}
"""Schema version -> the statements that reach it from the one before."""
assert max(POSTGRES_MIGRATIONS) == SCHEMA_VERSION


def newer_schema(display: str, version: int) -> CollectorError:
    """The error of a database whose schema ``version`` is newer than this code's (:data:`SCHEMA_VERSION`)."""
    return CollectorError(
        f"the collector database {display} has schema {version}, newer than this collector's {SCHEMA_VERSION}: "
        "upgrade spool_reporter"
    )
