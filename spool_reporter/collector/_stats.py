"""The numbers DEP 8 asked for: distinct developers (client ids) per ISO week, by Django, Python and OS.

A *developer* is a distinct ``client_id`` (one per user account per machine: a random uuid4 in the user's
config file). The breakdowns count distinct client ids too, so a developer who used Django 5.2 and 6.0 in
the same week appears under both and the breakdown may sum to more than :attr:`Week.developers`.
``events`` counts events, and ``by_event`` counts events per command.

**Where the numbers come from.** The weeks rolled up already (:mod:`._rollup`) are read from the roll-up
tables, the later ones from the raw events (through the index on ``week``), all in one snapshot: a report's
cost grows with the weeks it shows and the events of the open weeks, not with every event ever stored.
``rollups=False`` reads everything from the raw events still kept (the same numbers as long as none was
deleted: the tests hold the two equal). The all-time :attr:`Stats.developers` is the sum of the developers
seen for the first time in each rolled-up week, plus those first seen later (``client_apps``): a developer
who comes back after more than the retention is counted again.
"""

from __future__ import annotations

import dataclasses

from ._common import DEFAULT_APP
from ._open import open_store
from ._store import BREAKDOWN_SQL, EVENT_BREAKDOWN, Reader, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os


@dataclasses.dataclass(frozen=True)
class Week:
    """One ISO week of one application."""

    week: str
    """``"2026-W49"`` (ISO 8601 week-numbering year and week)."""
    developers: int
    """Distinct client ids with at least one event that week."""
    events: int
    """Events that week."""
    by_django: dict[str, int]
    """Application version (``"5.2"``) -> distinct client ids; named for DEP 8, it holds any app's versions."""
    by_python: dict[str, int]
    """``"CPython 3.11"`` -> distinct client ids."""
    by_os: dict[str, int]
    """OS family (``"Linux"``, ``"macOS"``, ``"Windows"``) -> distinct client ids."""
    by_event: dict[str, int]
    """Command (``"startproject"``) -> events."""

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Everything :func:`compute` reports for one application."""

    app: str
    developers: int
    """Distinct client ids over all weeks (one who comes back after more than the retention counts again)."""
    events: int
    weeks: list[Week]
    """Oldest first; only weeks with at least one event."""
    refused: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Events the collector refused, of every application: week received -> reason -> events (see
    :data:`spool_reporter._event.REASONS`, and ``over_cap``). For the operator; no client id behind it."""

    def as_dict(self) -> dict[str, object]:
        """The ``collector stats --json`` document: ``{"app", "developers", "events", "weeks": [...], "refused"}``."""
        return {
            "app": self.app,
            "developers": self.developers,
            "events": self.events,
            "weeks": [week.as_dict() for week in self.weeks],
            "refused": self.refused,
        }


def _sorted_counts(pairs: list[tuple[str, int]]) -> dict[str, int]:
    # Most developers first, then by name: the order a reader scans in.
    return dict(sorted(pairs, key=lambda kv: (-kv[1], kv[0])))


def _int(value: object) -> int:
    """A count from a query (an ``int``, or PostgreSQL's ``Decimal`` for a ``SUM``)."""
    return int(value)  # type: ignore[call-overload,no-any-return]


_Parts = dict[str, dict[str, list[tuple[str, int]]]]
"""Breakdown name -> week -> (value, count) pairs."""


def _raw_weeks(reader: Reader, app: str, after: str) -> tuple[list[tuple[str, int, int]], _Parts]:
    """The weeks after ``after`` (``""``: all), from the raw events: [(week, developers, events)], breakdowns."""
    weekly = [
        (str(week), int(d), int(n))  # type: ignore[call-overload]
        for week, d, n in reader.query(
            "SELECT week, COUNT(DISTINCT client_id), COUNT(*) FROM events WHERE app = ? AND week > ? GROUP BY week",
            (app, after),
        )
    ]
    parts: _Parts = {}
    measures = [(name, expr, "COUNT(DISTINCT client_id)") for name, expr in BREAKDOWN_SQL.items()]
    measures.append((*EVENT_BREAKDOWN, "COUNT(*)"))
    for name, expr, measure in measures:
        query = f"SELECT week, {expr}, {measure} FROM events WHERE app = ? AND week > ? GROUP BY 1, 2"  # noqa: S608
        out = parts.setdefault(name, {})
        for week, key, count in reader.query(query, (app, after)):
            out.setdefault(str(week), []).append((str(key), int(count)))  # type: ignore[call-overload]
    return weekly, parts


def _rolled_weeks(reader: Reader, app: str, through: str) -> tuple[list[tuple[str, int, int]], _Parts]:
    """The rolled-up weeks up to ``through``: the same shapes as :func:`_raw_weeks`, from the roll-up tables."""
    weekly = [
        (str(week), int(d), int(n))  # type: ignore[call-overload]
        for week, d, n in reader.query(
            "SELECT week, developers, events FROM rollup_weeks WHERE app = ? AND week <= ?", (app, through)
        )
    ]
    parts: _Parts = {name: {} for name in (*BREAKDOWN_SQL, EVENT_BREAKDOWN[0])}
    for week, name, value, n in reader.query(
        "SELECT week, breakdown, value, n FROM rollup_cells WHERE app = ? AND week <= ?", (app, through)
    ):
        parts.setdefault(str(name), {}).setdefault(str(week), []).append((str(value), int(n)))  # type: ignore[call-overload]
    return weekly, parts


def _developers(reader: Reader, app: str, through: str | None) -> int:
    """Distinct developers over all weeks: from the raw events (``through`` is ``None``), or from ``client_apps``
    and the roll-ups: those first seen in a week rolled up (up to ``through``), plus those first seen later.
    One who comes back after more than the retention counts again (their ``client_apps`` row expired)."""
    if through is None:
        ((n,),) = reader.query("SELECT COUNT(DISTINCT client_id) FROM events WHERE app = ?", (app,))
        return _int(n)
    ((first,),) = reader.query(
        "SELECT COALESCE(SUM(new_developers), 0) FROM rollup_weeks WHERE app = ? AND week <= ?", (app, through)
    )
    ((later,),) = reader.query("SELECT COUNT(*) FROM client_apps WHERE app = ? AND first_week > ?", (app, through))
    return _int(first) + _int(later)


def _assemble(weekly: list[tuple[str, int, int]], parts: _Parts) -> list[Week]:
    def cells(name: str, week: str) -> dict[str, int]:
        return _sorted_counts(parts.get(name, {}).get(week, []))

    return [
        Week(
            week=week,
            developers=devs,
            events=count,
            by_django=cells("by_django", week),
            by_python=cells("by_python", week),
            by_os=cells("by_os", week),
            by_event=cells("by_event", week),
        )
        for week, devs, count in sorted(weekly)
    ]


def weeks_of(reader: Reader, store: Store, app: str, *, rollups: bool = True) -> list[Week]:
    """The weeks of ``app`` in ``reader``'s snapshot, oldest first: the rolled-up ones from the roll-up tables
    (their cost does not grow with the events behind them), the later ones from the raw events."""
    through = store.rollup_state(reader).rolled_through if rollups else ""
    weekly, parts = _raw_weeks(reader, app, through)
    if through:
        old, old_parts = _rolled_weeks(reader, app, through)
        weekly += old
        for name, by_week in old_parts.items():
            parts.setdefault(name, {}).update(by_week)
    return _assemble(weekly, parts)


def compute(db: str | os.PathLike[str] | Store, *, app: str = DEFAULT_APP, rollups: bool = True) -> Stats:
    """The weekly statistics of ``app`` in the collector database ``db`` (a path, a URL or an open store).

    :param rollups: read the rolled-up weeks from the roll-up tables (``False``: everything from the raw
        events still kept -- the same numbers while none has been deleted; for tests and the benchmark).
    Raises :class:`~spool_reporter.collector.CollectorError` if the database does not exist (it is never
    created) or is not a collector database.
    """
    store = db if isinstance(db, Store) else open_store(db, create=False)
    try:
        with store.reading() as reader:  # one snapshot for every query below
            weeks = weeks_of(reader, store, app, rollups=rollups)
            through = store.rollup_state(reader).rolled_through if rollups and store.schema_version() >= 3 else None
            developers = _developers(reader, app, through)
        refused = store.refusals()
    finally:
        if store is not db:
            store.close()
    return Stats(app=app, developers=developers, events=sum(w.events for w in weeks), weeks=weeks, refused=refused)


def apps(db: str | os.PathLike[str] | Store) -> dict[str, int]:
    """Application name -> events stored, for every application in the database."""
    store = db if isinstance(db, Store) else open_store(db, create=False)
    out: dict[str, int] = {}
    try:
        with store.reading() as reader:
            through = store.rollup_state(reader).rolled_through
            rows = reader.query("SELECT app, COUNT(*) FROM events WHERE week > ? GROUP BY app", (through,))
            if through:
                rows += reader.query("SELECT app, SUM(events) FROM rollup_weeks GROUP BY app")
    finally:
        if store is not db:
            store.close()
    for name, count in rows:
        out[str(name)] = out.get(str(name), 0) + int(count)  # type: ignore[call-overload]
    return dict(sorted(out.items()))
