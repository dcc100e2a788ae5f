"""Retention and roll-ups: closed weeks become per-week numbers that hold no client id; old events are deleted.

**When a week closes.** The collector refuses an event older than its maximum age (``--max-age-days``, 30 by
default: ``spool_reporter/_event.py``'s time window), so once the *end* of a week is that far in the past,
no event of it can arrive any more: a laptop that was offline for three weeks still lands in an open week.
:func:`closing_week` names the newest closed week. Closing is recorded in the database
(``rollup_state.closed_through``) and every insert checks it in its own transaction, so a week stays closed
even for a collector process started with a longer maximum age (its late events are refused as ``too_old``
and counted): the numbers of a closed week are final.

**What a roll-up holds** -- exactly what the operator's statistics (:mod:`._stats`) report, per application
and ISO week, and no client id:

- ``rollup_weeks``: distinct developers, events, and the developers seen that week for the first time (from
  ``client_apps``; the operator's all-time count is their sum, plus the open weeks' new developers);
- ``rollup_cells``: for each breakdown of :data:`~._store.BREAKDOWN_SQL` and each value, the distinct developers
  with that value; for ``by_event``, the events per command.

The public numbers are not read from the roll-ups: they are releases (:mod:`._release`), made from the raw
events by this same roll-up, before the retention deletes anything, and stored.

**Retention.** Raw events older than the retention (``--retain-days``, 430 by default) are deleted once their
week is rolled up, in short transactions (:data:`DELETE_CHUNK` rows each), and with them the client ids kept
beside the events: the ``client_weeks`` rows of the weeks wholly before the cutoff, and the ``client_apps``
rows of the developers last seen before it (one who comes back later is counted as new again).

**Who runs it.** :func:`rollup` is idempotent and safe from several processes: one holds the store's roll-up
lock (a PostgreSQL advisory lock, a lease in the SQLite file) and the others skip. It runs from
``collector rollup`` and, at most once per :attr:`~._common.Retention.rollup_every` in each collector process,
in a background thread started by ingest (:class:`~._wsgi.Collector`), so no request ever waits for it.
"""

from __future__ import annotations

import math

from spool_reporter._event import MAX_AGE_SECONDS, iso_time

from . import _common, _release
from ._common import CollectorError, Retention
from ._store import BREAKDOWN_SQL, EVENT_BREAKDOWN
from ._weeks import this_week, week_before

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final, NamedTuple

    from ._common import Release
    from ._store import Reader, Store
else:
    from typing import NamedTuple

DELETE_CHUNK: Final = 20_000
"""Events deleted per transaction: SQLite's writers (the batches) wait for each, so each stays short."""

MAX_DELETE_ROUNDS: Final = 100_000
"""A bound on the delete loop (2 billion events), so that it can never spin."""

WEEK_SECONDS: Final = 7 * 86400


class Done(NamedTuple):
    """What one :func:`rollup` did."""

    ran: bool
    """``False`` when another process held the roll-up lock (nothing was done here)."""
    closed_through: str
    """The newest closed week after it (``""``: none yet)."""
    rolled: tuple[str, ...]
    """The weeks rolled up by this run, oldest first."""
    deleted: int
    """Raw events deleted for being older than the retention."""
    released: tuple[Release, ...] = ()
    """The public releases made by this run (:mod:`._release`)."""
    release_error: str = ""
    """Why no release could be made (OpenDP missing, the database), or ``""``."""

    def released_publicly(self) -> str:
        """What this run released, as the operator reads it: ``released publicly: 2026-W49 provisional, 2026-11
        final`` (``""`` when it released nothing). ``collector rollup`` prints it; the server logs it."""
        if not self.released:
            return ""
        return "released publicly: " + ", ".join(f"{r.period} {r.kind}" for r in self.released)


def closing_week(now: float, max_age: float) -> str:
    """The newest ISO week that ended at least ``max_age`` seconds before ``now``: no event of it is accepted."""
    return week_before(this_week(now - max_age))


def check_retention(retention: Retention, max_age: float) -> Retention:
    """``retention`` if its numbers make sense with the maximum event age ``max_age``; :class:`CollectorError`."""
    days, every = retention.retain_days, retention.rollup_every
    if math.isnan(days) or math.isnan(every) or days > 100 * 366 or every < 0:
        msg = f"retention of {days:g} days, roll-up every {every:g} s: not usable numbers"
        raise CollectorError(msg)
    if days * 86400 < max_age + WEEK_SECONDS:
        msg = (
            f"the retention ({days:g} days) must be at least a week longer than the maximum event age "
            f"({max_age / 86400:g} days): a week is rolled up only once it is closed"
        )
        raise CollectorError(msg)
    return retention


def _aggregate(reader: Reader, week: str) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, str, str, int]]]:
    """The roll-up rows of ``week`` (every application), from the raw events, in one snapshot."""
    first = {
        str(app): int(n)  # type: ignore[call-overload]
        for app, n in reader.query(
            # client_apps keeps each developer's first week of each application: final once that week closed.
            "SELECT app, COUNT(*) FROM client_apps WHERE first_week = ? GROUP BY app",
            (week,),
        )
    }
    totals = [
        (str(app), int(devs), int(n), first.get(str(app), 0))  # type: ignore[call-overload]
        for app, devs, n in reader.query(
            "SELECT app, COUNT(DISTINCT client_id), COUNT(*) FROM events WHERE week = ? GROUP BY app", (week,)
        )
    ]
    cells: list[tuple[str, str, str, int]] = []
    parts = [(name, expr, "COUNT(DISTINCT client_id)") for name, expr in BREAKDOWN_SQL.items()]
    parts.append((*EVENT_BREAKDOWN, "COUNT(*)"))
    for name, expr, measure in parts:
        query = f"SELECT app, {expr}, {measure} FROM events WHERE week = ? GROUP BY 1, 2"  # noqa: S608 - fixed
        cells += [(str(app), name, str(value), int(n)) for app, value, n in reader.query(query, (week,))]  # type: ignore[call-overload]
    return totals, cells


def rollup(
    store: Store,
    *,
    now: float,
    max_age: float = MAX_AGE_SECONDS,
    retention: Retention | None = None,
    publishing: _common.Publishing | None = None,
) -> Done:
    """Close the weeks that can take no more events, roll them up, make the public releases that are due
    (:mod:`._release`), and delete the events past the retention (after the releases that need them).

    :param now: the collector's clock (epoch seconds).
    :param max_age: the oldest event the collector accepts, in seconds (its ``--max-age-days``).
    :raises CollectorError: the retention does not fit ``max_age``, or the database cannot be used.
    """
    keep = check_retention(retention or Retention(), max_age)
    with store.rollup_lock() as held:
        if not held:
            return Done(False, store.rollup_state().closed_through, (), 0)
        closed = store.close_weeks(closing_week(now, max_age))
        rolled: list[str] = []
        state = store.rollup_state()
        if state.rolled_through < closed:
            with store.reading() as reader:
                weeks = [
                    str(week)
                    for (week,) in reader.query(
                        "SELECT DISTINCT week FROM events WHERE week > ? AND week <= ? ORDER BY week",
                        (state.rolled_through, closed),
                    )
                ]
            for week in weeks:
                # Each week in its own snapshot and transaction: an interrupted run resumes where it stopped.
                with store.reading() as reader:
                    totals, cells = _aggregate(reader, week)
                if store.save_rollup(week, totals, cells):
                    rolled.append(week)
            store.mark_rolled(closed)
        released: tuple[Release, ...] = ()
        error = ""
        publish = publishing or _common.Publishing()
        try:
            released = tuple(
                _release.make(store, app=publish.app, now=now, retain_days=keep.retain_days, epsilon=publish.epsilon)
            )
        except CollectorError as exc:  # the retention below still runs: the releases are retried next time
            error = str(exc)
        cutoff = now - keep.retain_days * 86400
        before = iso_time(cutoff)[:10]  # events keep their day only (._store)
        through = min(store.rollup_state().rolled_through, this_week(cutoff))
        deleted = 0
        if through:
            for _ in range(MAX_DELETE_ROUNDS):
                n = store.delete_expired(through_week=through, before=before, limit=DELETE_CHUNK)
                deleted += n
                if n < DELETE_CHUNK:
                    break
            store.expire_ids(this_week(cutoff))  # the weeks entirely before the cutoff have no event left
        store.expire_forgotten(now)  # hashes of ids forgotten whose events would all be refused as too old now
        return Done(True, closed, tuple(rolled), deleted, released, error)
