"""The collector's store: one interface, two back ends (SQLite for a laptop, PostgreSQL for a deployment).

**What a row holds.** The allowlisted fields of :data:`spool_reporter._event.FIELDS` except ``schema`` (the
wire format's version, not a fact) and ``user_agent`` (it is derived from ``app``, ``app_version``,
``python``, ``python_version``, ``os`` and ``arch`` -- the validator checks exactly that -- so keeping it
would add nothing but a free-text column), plus ``week``, the ISO week of the event's own ``time``
(``"2026-W49"``), computed on insert so that the statistics are plain ``GROUP BY`` queries. Of the event's
``time`` only the **day** is stored (``"2026-12-03"``; schema 4 cut the older rows to the day too): the
numbers need no finer time, and a second is a linkage risk. Nothing about the request is stored: no
address, no header, not even the time the request arrived (which, joined with a proxy's access log, would
point back to an address).

**The tables** (schema version :data:`~._schema.SCHEMA_VERSION`, created and migrated by the collector itself):

- ``events``: one row per event id (the primary key: a re-delivery to any collector process counts once),
  indexed by ``week`` (the statistics read the open weeks only, a forget searches a client's weeks);
- ``client_weeks``: events stored per (client id, week), which enforces :attr:`Limits.per_client_week`
  (counted, never silently dropped) inside the same transaction as the insert, and tells a forget which
  weeks to search;
- ``client_apps``: per (client id, application) the first and the last week with an event: the developers
  seen for the first time in a week, and the all-time count, without searching the events;
- ``refusals``: events refused per (week they were received in, reason from
  :data:`spool_reporter._event.REASONS`, ``over_cap`` or ``forgotten``), and refused forget requests
  (``forget``): what the operator watches, with no client id;
- ``forgotten``: a keyed hash (HMAC-SHA-256 under ``forget_key``, a random key made with the table and never
  leaving the database) of each client id forgotten, until the last event recorded before the forget would be
  refused as too old anyway: an insert refuses that id's events (``forgotten``), so that a batch in flight
  during the forget, or a spool that still held the old id's events, cannot bring them back
  (:meth:`Store.forget`). The hash names an id only to someone who already holds both the id and the key;
- ``rollup_weeks`` and ``rollup_cells``: the closed weeks' numbers, holding **no client id**
  (:mod:`._rollup`): per (application, week) the distinct developers, the events and the developers seen
  for the first time; per (application, week, breakdown, value) the distinct developers (the events, for
  ``by_event``);
- ``releases``: the public numbers, each made once by the differentially private mechanism of
  :mod:`._release` and never changed (per application, period and kind, with its ε and the released numbers
  as JSON); ``release_state``: one row, ``first_week``, the first ISO week released (the week the database
  was created, unless the operator set another: never chosen from the data);
- ``rollup_state``: one row: ``closed_through`` (the newest week that no longer takes events: an insert
  refuses a row of a week up to it as ``too_old``, in the same transaction), ``rolled_through`` (the newest
  week whose numbers are in the roll-up tables) and, for SQLite, the roll-up's lease.

**Durability.** :meth:`Store.insert` returns only once the transaction is durable (SQLite
``synchronous=FULL`` in WAL mode; PostgreSQL's commit), so a 2xx is never answered for a batch a power cut
could lose after the client deleted it.

Back ends: :mod:`._sqlite` and :mod:`._postgres`; :func:`._open.open_store` picks one from the ``--db`` value.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import weakref
from collections.abc import Sequence

from ._common import Limits, Release, Row
from ._intake import forget_digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any, Final, NamedTuple, Protocol, TypeVar

    _T = TypeVar("_T")

    class _Cursor(Protocol):
        @property
        def rowcount(self) -> int: ...

        def fetchall(self) -> list[Any]: ...

    class _Executes(Protocol):
        """What a back end's write transaction runs statements on (a :class:`sqlite3.Connection`, a psycopg cursor)."""

        def execute(self, sql: str, params: Sequence[object], /) -> _Cursor: ...

        def executemany(self, sql: str, params: Iterable[Sequence[object]], /) -> object: ...

    class _Closable(Protocol):
        def close(self) -> object: ...
else:
    from typing import NamedTuple

REQUEST_WAIT_S: Final = 4.0
"""The longest a request waits on the database before it is answered ``503`` with ``Retry-After``
(:class:`Unavailable`): a batch, a forget step, a public answer's read. The client's read timeout is 10 s
(:data:`spool_reporter._settings.READ_TIMEOUT`); each back end keeps well inside this (SQLite: the write lock
and the busy timeout; PostgreSQL: ``lock_timeout``, ``statement_timeout``, and a watchdog for a server that
does not answer at all). The roll-up, ``collector stats`` and a migration are not bounded by it."""

LOCK_WAIT_S: Final = 2.0
"""How long a request waits for a lock another writer holds (SQLite's write lock, PostgreSQL's row and advisory
locks): ours are held for milliseconds, so a longer wait means a stuck writer."""

FORGET_CHUNK: Final = 500
"""Events a forget examines (SQLite) or deletes (PostgreSQL) per transaction: each holds up ingest for a few
milliseconds at most (``benchmarks/bench_forget.py``)."""

BREAKDOWN_SQL: Final = {
    "by_django": "app_version",
    "by_python": "python || ' ' || python_version",
    "by_os": "os",
}
"""Breakdown name -> SQL expression over a stored row (fixed strings, never user input): distinct developers."""

EVENT_BREAKDOWN: Final = ("by_event", "event")
"""The one breakdown that counts events, not developers: its name and expression."""

RollupTotals = Sequence[tuple[str, int, int, int]]
"""A closed week's totals per application: (app, developers, events, new developers)."""

RollupCells = Sequence[tuple[str, str, str, int]]
"""A closed week's breakdowns: (app, breakdown, value, developers)."""


class Inserted(NamedTuple):
    """What :meth:`Store.insert` did with a batch's rows."""

    added: int
    """Rows stored for the first time."""
    new: list[Row]
    """Those rows (only when asked for with ``want_new``)."""
    refused: Mapping[str, int] = {}  # never mutated: each insert builds its own
    """Rows refused by the store, by reason: :data:`OVER_CAP` (over :attr:`Limits.per_client_week`),
    :data:`TOO_OLD` (of a closed week) and :data:`FORGOTTEN` (of a forgotten client id), each also counted in
    ``refusals``; a reason with no row is absent."""

    @property
    def limited(self) -> int:
        """Rows refused by the store, whatever the reason."""
        return sum(self.refused.values())


class RollupState(NamedTuple):
    """The roll-up's progress (``""`` for "no week yet": it sorts before every ISO week)."""

    closed_through: str
    """The newest closed week: no event of a week up to it is stored any more."""
    rolled_through: str
    """The newest week whose numbers are in the roll-up tables (never after :attr:`closed_through`)."""


class Reader:
    """One consistent snapshot of the store for the statistics (from :meth:`Store.reading`).

    ``query`` takes SQL with ``?`` placeholders (translated for the back end) and returns all rows.
    """

    def __init__(self, run: Callable[[str, Sequence[object]], list[tuple[object, ...]]]) -> None:
        self._run = run

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        return self._run(sql, params)


class Writer:
    """One write transaction of a back end (from :meth:`Store._write`), for the statements both back ends share.

    Its SQL takes ``?`` placeholders, as :class:`Reader`'s (translated for PostgreSQL); what else differs between
    the two dialects is in :class:`Dialect`.
    """

    def __init__(self, raw: _Executes, *, pyformat: bool = False) -> None:
        self._raw = raw
        self._pyformat = pyformat

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pyformat else sql

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run ``sql``; return the rows it changed."""
        return int(self._raw.execute(self._sql(sql), params).rowcount)

    def executemany(self, sql: str, params: Iterable[Sequence[object]]) -> None:
        """Run ``sql`` once for each of ``params``."""
        self._raw.executemany(self._sql(sql), params)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql``; return its rows."""
        return [tuple(row) for row in self._raw.execute(self._sql(sql), params).fetchall()]


class Dialect(NamedTuple):
    """The pieces of SQL in which the back ends' shared statements differ (:attr:`Store.dialect`)."""

    insert_new: str
    """``INSERT`` that skips a row whose key is stored already, up to the columns (SQLite's ``INSERT OR IGNORE``)."""
    on_conflict_skip: str
    """What follows that ``INSERT``'s values (PostgreSQL's ``ON CONFLICT DO NOTHING``)."""
    row_key: str
    """A column that names one event row (SQLite's ``rowid``, PostgreSQL's primary key)."""
    client_id: str
    """A client id parameter, cast to the column's type (PostgreSQL's ``uuid``)."""
    later_until: str
    """The later of a ``forgotten`` row's ``until`` and the one being inserted, in an upsert."""
    for_update: str
    """What locks the rows a ``SELECT`` read until the transaction ends (nothing where the transaction holds the
    whole database)."""


class Store(abc.ABC):
    """The interface both back ends implement. Every method is safe from many threads at once, and across a
    ``fork``: a pre-forking server (gunicorn with ``--preload``, a test's ``os.fork``) may fork while a thread
    holds one of the store's locks or a connection; the child then starts with fresh locks and none of the
    parent's connections (:meth:`_after_fork`)."""

    kind: str = "?"
    """``"sqlite"`` or ``"postgresql"``."""
    display: str = "?"
    """The database as messages name it (a path, or a URL without its password)."""
    limits: Limits = Limits()

    def insert(
        self,
        rows: Sequence[Row],
        *,
        want_new: bool = False,
        refused: Mapping[str, int] | None = None,
        now: float | None = None,
    ) -> Inserted:
        """Store ``rows`` in one durable transaction, within the limits, and count the refused events.

        A row whose ``event_id`` is already stored, or repeated within ``rows``, is a duplicate. Rows over
        :attr:`Limits.per_client_week` are not stored and are counted as :data:`OVER_CAP`. ``refused``
        (reason -> events, refused before they got here) is added to the ``refusals`` of the week of ``now``
        (default: the clock) in the same transaction: no client id, no text of theirs.
        """
        if not rows and not refused:
            return Inserted(0, [], {})
        # A caller may hand plain tuples in COLUMNS order (the public API said so before rows had names).
        rows = [row if type(row) is Row else Row._make(row) for row in rows]
        return self._insert_batch(rows, want_new, dict(refused or {}), now)

    def _watch_forks(self) -> None:
        """Have :meth:`_after_fork` called in every child this process forks (each back end's ``__init__``)."""
        _STORES.add(self)

    @abc.abstractmethod
    def _after_fork(self) -> None:
        """In a forked child, before anything else runs there: new locks (a parent's thread may have held one at
        the fork, and no thread of the child would ever release it), no batch of the parent's threads waiting,
        and no connection of the parent's (its server session is the parent's to use)."""

    @abc.abstractmethod
    def _insert_batch(
        self, rows: Sequence[Row], want_new: bool, refused: dict[str, int], now: float | None
    ) -> Inserted:
        """:meth:`insert` of a non-empty request, ``rows`` as :class:`Row`."""

    def refusals(self) -> dict[str, dict[str, int]]:
        """Week (when refused) -> reason -> events refused (nothing for a database of schema 1)."""
        if self.schema_version() < 2:
            return {}
        with self.reading() as reader:
            rows = reader.query("SELECT week, reason, n FROM refusals ORDER BY week, reason")
        out: dict[str, dict[str, int]] = {}
        for week, reason, n in rows:
            out.setdefault(str(week), {})[str(reason)] = int(n)  # type: ignore[call-overload]
        return out

    @abc.abstractmethod
    def reading(self, *, quick: bool = False) -> contextlib.AbstractContextManager[Reader]:
        """A :class:`Reader` over one snapshot, for a ``with`` block.

        :param quick: a request waits for it: bounded by :data:`REQUEST_WAIT_S` (:class:`Unavailable` beyond).
            Otherwise (the roll-up, the statistics) a query may take as long as it needs.
        """

    def count(self) -> tuple[int, int]:
        """(events stored, distinct client ids)."""
        with self.reading() as reader:
            (row,) = reader.query("SELECT COUNT(*), COUNT(DISTINCT client_id) FROM events")
        return int(row[0]), int(row[1])  # type: ignore[call-overload]

    def rollup_state(self, reader: Reader | None = None) -> RollupState:
        """The roll-up's progress, read in ``reader``'s snapshot if given (nothing rolled up before schema 3)."""
        if self.schema_version() < 3:
            return RollupState("", "")
        if reader is None:
            with self.reading() as own:
                return self.rollup_state(own)
        (row,) = reader.query("SELECT closed_through, rolled_through FROM rollup_state")
        return RollupState(str(row[0]), str(row[1]))

    # -- releases (see ._release) -------------------------------------------------------------------------------

    def releases(self, app: str, reader: Reader | None = None) -> list[Release]:
        """Every release of ``app``, by period and kind (none before schema 4)."""
        if self.schema_version() < 4:
            return []
        if reader is None:
            with self.reading(quick=True) as own:  # the public answers wait for it
                return self.releases(app, own)
        rows = reader.query(
            "SELECT app, period, kind, made, epsilon, body FROM releases WHERE app = ? ORDER BY period, kind", (app,)
        )
        return [Release(str(a), str(p), str(k), str(m), float(e), str(b)) for a, p, k, m, e, b in rows]  # type: ignore[arg-type]

    def release_mark(self, app: str, reader: Reader | None = None) -> tuple[int, str]:
        """(releases of ``app``, the newest ``made``): changes whenever a release is added, costs one index read
        (one query: the store must be of schema 4, as the collector's own is once it has migrated it)."""
        if reader is None:
            with self.reading(quick=True) as own:  # the public answers wait for it
                return self.release_mark(app, own)
        ((n, made),) = reader.query("SELECT COUNT(*), COALESCE(MAX(made), '') FROM releases WHERE app = ?", (app,))
        return int(n), str(made)  # type: ignore[call-overload]

    def first_week(self, reader: Reader | None = None) -> str:
        """The first ISO week whose numbers are released (``release_state.first_week``)."""
        if reader is None:
            with self.reading() as own:
                return self.first_week(own)
        ((week,),) = reader.query("SELECT first_week FROM release_state")
        return str(week)

    # -- writing: what each back end supplies -----------------------------------------------------------------

    dialect: Dialect
    """Where this back end's SQL differs in the statements written once below."""

    _key: str = ""
    """``forget_key``, read once (:meth:`_forget_key`)."""

    @abc.abstractmethod
    def _write(self, work: Callable[[Writer], _T], *, quick: bool = True) -> _T:
        """``work(writer)`` in one write transaction; its failures as the back end reports them (a database busy
        or unreachable: :class:`Unavailable`).

        :param quick: a request waits for it (bounded as :meth:`reading`'s); otherwise (the retention's deletions)
            a statement may take as long as it needs.
        """

    @abc.abstractmethod
    def _exclude_inserts(self, w: Writer) -> None:
        """Inside :meth:`_write`, before its first statement: wait for the inserts in flight, and hold every later
        one back until this transaction ends (so that each of them sees what it wrote)."""

    @abc.abstractmethod
    def _forget_step(self, w: Writer, *, client_id: str, week: str, after: int) -> tuple[int, int]:
        """Delete ``client_id``'s events among at most :data:`FORGET_CHUNK` events of ``week`` (the step before
        ended at ``after``; the first starts at 0); return (where the next step starts, or -1 once the week is
        done; the events deleted). Each step is a transaction of its own (:meth:`forget`)."""

    def _forget_key(self, w: Writer) -> str:
        if not self._key:
            ((key,),) = w.query("SELECT key FROM forget_key")
            self._key = str(key)
        return self._key

    # -- releases, retention and forget (see ._release and ._rollup) ------------------------------------------

    def save_release(self, release: Release) -> bool:
        """Store ``release`` unless one of its application, period and kind is stored already (then ``False``,
        nothing written: a release is never replaced)."""
        d = self.dialect
        sql = (
            f"{d.insert_new} releases (app, period, kind, made, epsilon, body) VALUES (?, ?, ?, ?, ?, ?)"
            f"{d.on_conflict_skip}"
        )
        return bool(self._write(lambda w: w.execute(sql, tuple(release))))

    def set_first_week(self, week: str) -> None:
        """Set the first ISO week released (the operator's choice; releases made already stay as they are)."""
        self._write(lambda w: w.execute("UPDATE release_state SET first_week = ?", (week,)))

    def close_weeks(self, week: str) -> str:
        """Close every week up to ``week``: from the moment this returns, no insert stores a row of one (those
        in flight finished first). Returns the newest closed week (never moves back)."""

        def work(w: Writer) -> str:
            self._exclude_inserts(w)
            w.execute("UPDATE rollup_state SET closed_through = ? WHERE closed_through < ?", (week, week))
            ((closed,),) = w.query("SELECT closed_through FROM rollup_state")
            return str(closed)

        return self._write(work)

    def save_rollup(self, week: str, totals: RollupTotals, cells: RollupCells) -> bool:
        """Store the numbers of the closed ``week`` -- ``totals``: (app, developers, events, new developers);
        ``cells``: (app, breakdown, value, count) -- and mark it rolled up, in one transaction. ``False`` (and
        nothing written) if it was rolled up already, e.g. by another process."""
        d = self.dialect

        def work(w: Writer) -> bool:
            state = f"SELECT closed_through, rolled_through FROM rollup_state{d.for_update}"  # noqa: S608 - fixed text
            ((closed, rolled),) = w.query(state)
            if week <= rolled or week > closed:
                return False
            w.executemany(
                f"{d.insert_new} rollup_weeks (app, week, developers, events, new_developers) "
                f"VALUES (?, ?, ?, ?, ?){d.on_conflict_skip}",
                [(app, week, devs, n, first) for app, devs, n, first in totals],
            )
            w.executemany(
                f"{d.insert_new} rollup_cells (app, week, breakdown, value, n) VALUES (?, ?, ?, ?, ?)"
                f"{d.on_conflict_skip}",
                [(app, week, name, value, n) for app, name, value, n in cells],
            )
            w.execute("UPDATE rollup_state SET rolled_through = ?", (week,))
            return True

        return self._write(work)

    def mark_rolled(self, week: str) -> None:
        """Record that every closed week up to ``week`` is rolled up (the weeks without events have no rows)."""
        self._write(
            lambda w: w.execute(
                "UPDATE rollup_state SET rolled_through = ? WHERE rolled_through < ? AND closed_through >= ?",
                (week, week, week),
            )
        )

    def delete_expired(self, *, through_week: str, before: str, limit: int) -> int:
        """Delete at most ``limit`` events of weeks up to ``through_week`` (rolled up already) whose ``time`` is
        before ``before`` (an event ``time``); return how many (a short transaction each call)."""
        key = self.dialect.row_key
        # Only weeks rolled up already: the condition is checked in the deleting transaction itself.
        sql = (
            f"DELETE FROM events WHERE {key} IN (SELECT {key} FROM events WHERE week <= ? AND time < ? "  # noqa: S608
            "AND week <= (SELECT rolled_through FROM rollup_state) LIMIT ?)"
        )
        return self._write(lambda w: w.execute(sql, (through_week, before, limit)), quick=False)

    def expire_ids(self, before_week: str) -> None:
        """Delete the ``client_weeks`` rows of rolled-up weeks before ``before_week``, and the ``client_apps``
        rows whose last week is one of them: the retention of client ids, once their events are gone."""

        def work(w: Writer) -> None:
            rolled = "(SELECT rolled_through FROM rollup_state)"
            w.execute(f"DELETE FROM client_weeks WHERE week < ? AND week <= {rolled}", (before_week,))  # noqa: S608
            w.execute(f"DELETE FROM client_apps WHERE last_week < ? AND last_week <= {rolled}", (before_week,))  # noqa: S608

        self._write(work, quick=False)

    def forget(self, client_id: str, *, until: float) -> int:
        """Delete every event, ``client_weeks`` and ``client_apps`` row of ``client_id``; return how many events.
        The roll-ups hold no client id and are not touched.

        First, in one short transaction that no insert overlaps, ``client_id``'s keyed hash is added to
        ``forgotten`` until the epoch time ``until`` (:func:`~._intake.forget_until`): from then on every insert
        refuses its events (counted as :data:`FORGOTTEN`), so the events found next are all there will ever be. Then
        they are deleted in transactions of at most :data:`FORGET_CHUNK` events each, so that ingest waits
        milliseconds, not for the whole deletion."""
        d = self.dialect

        def mark(w: Writer) -> list[str]:
            # The batches before this are stored and will be found below; the batches after it see the mark and
            # refuse this client's events.
            self._exclude_inserts(w)
            w.execute(
                "INSERT INTO forgotten (digest, until) VALUES (?, ?) "  # noqa: S608 - the dialect's fixed text
                f"ON CONFLICT (digest) DO UPDATE SET until = {d.later_until}",
                (forget_digest(self._forget_key(w), client_id), until),
            )
            weeks = w.query(f"SELECT week FROM client_weeks WHERE client_id = {d.client_id}", (client_id,))  # noqa: S608
            return [str(week) for (week,) in weeks]

        deleted = 0
        for week in sorted(self._write(mark)):
            after = 0
            while after >= 0:  # bounded: each step passes FORGET_CHUNK of the week's rows, or ends the week
                after, n = self._write(
                    functools.partial(self._forget_step, client_id=client_id, week=week, after=after)
                )
                deleted += n

        def rest(w: Writer) -> None:
            w.execute(f"DELETE FROM client_weeks WHERE client_id = {d.client_id}", (client_id,))  # noqa: S608
            w.execute(f"DELETE FROM client_apps WHERE client_id = {d.client_id}", (client_id,))  # noqa: S608

        self._write(rest)
        return deleted

    def expire_forgotten(self, now: float) -> int:
        """Delete the ``forgotten`` hashes whose time is past at ``now``; return how many (the roll-up does)."""
        return self._write(lambda w: w.execute("DELETE FROM forgotten WHERE until < ?", (now,)))

    @abc.abstractmethod
    def rollup_lock(self) -> contextlib.AbstractContextManager[bool]:
        """Held (``True``) by one roll-up at a time across every process on this database; ``False`` if another
        holds it (the caller then leaves the work to that one)."""

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The schema version recorded in the database."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the idle connections (borrowed ones close when returned after this)."""


_STORES: Final[weakref.WeakSet[Store]] = weakref.WeakSet()
"""The stores open in this process, for :func:`_after_fork_in_child` (a closed or dropped one leaves by itself)."""


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def closed_on_failure(conn: _Closable) -> Iterator[None]:
    """Close ``conn`` if the block raises anything (a connection being set up is never left to the garbage
    collector), and let the exception go on."""
    try:
        yield
    except BaseException:
        conn.close()
        raise
