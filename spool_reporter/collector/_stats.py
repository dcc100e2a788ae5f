"""The numbers DEP 8 asked for: distinct developers (client ids) per ISO week, by Django, Python and OS.

A *developer* is a distinct ``client_id`` (one per user account per machine: a random uuid4 in the user's
config file). The breakdowns count distinct client ids too, so a developer who used Django 5.2 and 6.0 in
the same week appears under both and the breakdown may sum to more than :attr:`Week.developers`.
``events`` counts events, and ``by_event`` counts events per command.
"""

from __future__ import annotations

import dataclasses

from ._store import Reader, Store, open_store

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os
    from typing import Final

DEFAULT_APP: Final = "Django"
"""The application whose weeks are reported unless another is asked for (DEP 8 is about Django)."""

_BREAKDOWNS: Final = {
    "by_django": "app_version",
    "by_python": "python || ' ' || python_version",
    "by_os": "os",
}
"""Breakdown name -> SQL expression over a stored row (fixed strings, never user input)."""


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
    """Distinct client ids over all weeks."""
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


def plural(count: int, word: str) -> str:
    """``word`` for one, ``word + "s"`` for any other count (the collector's words all take an ``s``)."""
    return word if count == 1 else f"{word}s"


def _sorted_counts(pairs: list[tuple[str, int]]) -> dict[str, int]:
    # Most developers first, then by name: the order a reader scans in.
    return dict(sorted(pairs, key=lambda kv: (-kv[1], kv[0])))


def _breakdown(reader: Reader, app: str, expr: str, distinct: bool) -> dict[str, dict[str, int]]:
    measure = "COUNT(DISTINCT client_id)" if distinct else "COUNT(*)"
    query = f"SELECT week, {expr}, {measure} FROM events WHERE app = ? GROUP BY 1, 2"  # noqa: S608 - fixed expr
    out: dict[str, list[tuple[str, int]]] = {}
    for week, key, count in reader.query(query, (app,)):
        out.setdefault(str(week), []).append((str(key), int(count)))  # type: ignore[call-overload]
    return {week: _sorted_counts(pairs) for week, pairs in out.items()}


_Rows = list[tuple[str, int, int]]


def _query(
    store: Store, app: str
) -> tuple[tuple[int, int], _Rows, dict[str, dict[str, dict[str, int]]], dict[str, dict[str, int]]]:
    with store.reading() as reader:  # one snapshot for every query below
        ((devs, events),) = reader.query("SELECT COUNT(DISTINCT client_id), COUNT(*) FROM events WHERE app = ?", (app,))
        weekly = [
            (str(week), int(d), int(n))  # type: ignore[call-overload]
            for week, d, n in reader.query(
                "SELECT week, COUNT(DISTINCT client_id), COUNT(*) FROM events WHERE app = ? "
                "GROUP BY week ORDER BY week",
                (app,),
            )
        ]
        parts = {name: _breakdown(reader, app, expr, True) for name, expr in _BREAKDOWNS.items()}
        by_event = _breakdown(reader, app, "event", False)
    return (int(devs), int(events)), weekly, parts, by_event  # type: ignore[call-overload]


def compute(db: str | os.PathLike[str] | Store, *, app: str = DEFAULT_APP) -> Stats:
    """The weekly statistics of ``app`` in the collector database ``db`` (a path, a URL or an open store).

    Raises :class:`~spool_reporter.collector.CollectorError` if the database does not exist (it is never
    created) or is not a collector database.
    """
    store = db if isinstance(db, Store) else open_store(db, create=False)
    try:
        (developers, events), weekly, parts, by_event = _query(store, app)
        refused = store.refusals()
    finally:
        if store is not db:
            store.close()
    weeks = [
        Week(
            week=week,
            developers=devs,
            events=count,
            by_django=parts["by_django"].get(week, {}),
            by_python=parts["by_python"].get(week, {}),
            by_os=parts["by_os"].get(week, {}),
            by_event=by_event.get(week, {}),
        )
        for week, devs, count in weekly
    ]
    return Stats(app=app, developers=developers, events=events, weeks=weeks, refused=refused)


def apps(db: str | os.PathLike[str] | Store) -> dict[str, int]:
    """Application name -> events stored, for every application in the database."""
    store = db if isinstance(db, Store) else open_store(db, create=False)
    try:
        with store.reading() as reader:
            rows = reader.query("SELECT app, COUNT(*) FROM events GROUP BY app ORDER BY app")
    finally:
        if store is not db:
            store.close()
    return {str(name): int(count) for name, count in rows}  # type: ignore[call-overload]
