"""The public numbers: :class:`~spool_reporter.collector._stats.Stats` with small groups taken out.

The operator's ``collector stats`` prints every count. What the collector *publishes* (``GET /``,
``GET /v1/stats``, and ``collector stats --min-count N``) is :func:`publish`'s document, built by one rule:

    Every published number counts at least ``min_count`` (k) distinct developers, and no number that can
    be worked out from one week's published numbers by adding and subtracting them counts between 1 and
    k - 1 developers.

Applied to one ISO week with T distinct developers:

1. **A week with T < k is not published** (not even as a zero: it is simply absent, like a week without
   events).
2. **A breakdown** (``by_django``, ``by_python``, ``by_os``: value -> distinct developers) is published
   cell by cell. A cell is published under its own name only if its count c is at least k **and** the
   developers outside it, T - c, are none or at least k: otherwise "everyone but c" would be a small
   group found by subtraction. Every other cell is merged into ``"other"`` (a value a client sent as
   ``"other"`` starts there too).
3. **"other" must hold at least k developers too, and must not give away what it hides.** While the
   fewest developers "other" can hold -- the larger of its largest cell and T minus the published
   cells (every developer has a value, so whoever is in no published cell is in "other") -- is below
   k, or "other" is a single cell that could not stand alone under rule 2, the smallest published cell
   is merged into it as well (complementary suppression). A single merged cell would be published all
   the same, as "other": its count, and T minus its count, would be read off the page. So "other"
   always holds at least two cells, or one (a value sent as "other") that passes rule 2 by itself.
4. **Overlaps.** A developer who used two values in one week (upgraded from 5.2 to 6.0) counts under
   both, so the cells add up to T + E, where E (the *excess*) is the number of such extra memberships.
   Merging never changes the sum, so E is always derivable from the published numbers -- and with two
   values, E *is* the number of developers who used both. A breakdown whose E is between 1 and k - 1 is
   therefore **withheld** for that week (published as ``{}``; a published week's breakdown is never
   empty otherwise, since each of its T >= k developers has a value).
5. **``by_event`` is never published** (always ``{}``): it counts events, not developers, and one
   developer's ``runserver`` loop makes hundreds, so no threshold on an event count protects anyone.
   Publishing commands safely needs distinct developers per command, which the statistics do not count.
6. **The week's ``events``** is an aggregate over its T >= k developers and is published; the
   document's ``events`` is the sum over the *published* weeks, so the events of the weeks that are not
   published cannot be found by subtraction.
7. **The all-time ``developers`` is not published** (``null``): with the weekly totals it would give the
   number of developers seen only in unpublished weeks (the all-time count minus T, when one week is
   published), or seen in both of two weeks (T1 + T2 minus the all-time count).

What the rule does not cover: the *differences between two copies* of the document taken at different
times while a week is still open (a late event from an offline laptop, or a forget request, changes it by
one developer). A closed week -- older than the maximum event age, rolled up (:mod:`._rollup`) -- never
changes again, not even by a forget, so only the last few weeks can be compared that way. Different
breakdowns of one week are
never combined into a cross table, so they only bound each other (e.g. "at least 90 developers used
both Django 5.2 and Linux") and never give an exact small count.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from ._stats import DEFAULT_APP, Week, weeks_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

    from ._stats import Stats
    from ._store import Store

MIN_COUNT: Final = 10
"""The default k: published numbers count at least this many distinct developers (the project's policy)."""

MIN_COUNT_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_MIN_COUNT"
"""Where ``spool_reporter.collector.wsgi`` reads k (``serve`` takes ``--min-count``)."""

OTHER: Final = "other"
"""The value that merged cells are published under."""

PAGE_PATH: Final = "/"
"""``GET /``: the public page (:func:`~spool_reporter.collector._report.render_html` of :func:`publish`)."""

STATS_PATH: Final = "/v1/stats"
"""``GET /v1/stats``: :func:`publish`'s document as JSON."""

PATHS: Final = (PAGE_PATH, STATS_PATH)

CACHE_SECONDS: Final = 300.0
"""How old the public numbers may be: a process recomputes them at most this often (:class:`WeeksCache`)."""

BREAKDOWNS: Final = ("by_django", "by_python", "by_os")
"""The breakdowns that count distinct developers, hence the ones the threshold can protect and publish."""

WITHHELD: Final = ("by_event",)
"""The breakdowns that count events: never published."""


def parse_min_count(text: str) -> int:
    """``text`` as a k: a whole number of at least 1 (1 publishes every cell). Raises :exc:`ValueError`."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) < 1:
        msg = f"the minimum count must be a whole number of at least 1, got {text!r}"
        raise ValueError(msg)
    return int(value)


def check_min_count(min_count: int) -> int:
    """``min_count`` if it is a valid k (at least 1); raises :exc:`ValueError` otherwise."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        msg = f"min_count must be a whole number of at least 1, got {min_count!r}"
        raise ValueError(msg)
    return min_count


def _order(cells: dict[str, int]) -> dict[str, int]:
    # Most developers first, then by name, "other" last: the order a reader scans in.
    named = sorted(((v, c) for v, c in cells.items() if v != OTHER), key=lambda vc: (-vc[1], vc[0]))
    if OTHER in cells:
        named.append((OTHER, cells[OTHER]))
    return dict(named)


def merge_small(cells: dict[str, int], total: int, min_count: int) -> dict[str, int]:
    """One breakdown of a week of ``total`` developers, as published: see rules 2-4 of this module.

    ``cells`` maps a value to its distinct developers (each of the ``total`` developers has at least one
    value, so the counts add up to ``total`` or more). Returns the published cells, merged ones under
    :data:`OTHER`, or ``{}`` when the breakdown is withheld.
    """
    k = min_count
    excess = sum(cells.values()) - total
    if excess < 0 or 0 < excess < k or total < k:
        # excess < 0 cannot come from the store (every developer has a value): publish nothing rather
        # than numbers whose meaning is unknown.
        return {}

    def stands_alone(count: int) -> bool:
        # Rule 2: the cell and the developers outside it are each none or at least k.
        return count >= k and not 0 < total - count < k

    published: dict[str, int] = {}
    merged: list[int] = []
    for value, count in cells.items():
        if value != OTHER and stands_alone(count):
            published[value] = count
        else:
            merged.append(count)

    def other_leaks() -> bool:
        # Rule 3: "other" holds fewer than k for certain, or it is one cell that could not stand alone
        # (its value, and the week's total minus it, would be published all the same).
        fewest = max(*merged, total - sum(published.values()))
        return fewest < k or (len(merged) == 1 and not stands_alone(merged[0]))

    while merged and published and other_leaks():
        # Merge the smallest published cell too. With no cell left, "other" holds every developer (total >= k).
        smallest = min(published, key=lambda v: (published[v], v))
        merged.append(published.pop(smallest))
    if merged:
        published[OTHER] = sum(merged)
    return _order(published)


@dataclasses.dataclass(frozen=True)
class Published:
    """The public document: :func:`publish`'s result. ``as_dict()`` is what ``GET /v1/stats`` answers."""

    app: str
    min_count: int
    """The k it was built with."""
    events: int
    """Events of the published weeks."""
    weeks: list[Week]
    """The published weeks, oldest first; their breakdowns thresholded, ``by_event`` empty."""

    developers: None = None
    """The all-time distinct developers are not published (rule 7): always ``None``."""

    def as_dict(self) -> dict[str, object]:
        """``collector stats --json``'s document with the threshold applied, and the ``min_count`` it used."""
        return {
            "app": self.app,
            "min_count": self.min_count,
            "developers": self.developers,
            "events": self.events,
            "weeks": [week.as_dict() for week in self.weeks],
        }


_WEEK_FIELDS: Final = frozenset({"week", "developers", "events", *BREAKDOWNS, *WITHHELD})
"""The fields of :class:`Week` this module knows how to publish; any other field fails closed."""


def publish_week(week: Week, min_count: int) -> Week | None:
    """``week`` as published, or ``None`` when it has fewer than ``min_count`` developers."""
    fields = {f.name for f in dataclasses.fields(week)}
    if fields != _WEEK_FIELDS:  # a new field is unpublished until someone decides how to publish it
        msg = f"the public document does not know how to publish {sorted(fields ^ _WEEK_FIELDS)}"
        raise RuntimeError(msg)
    if week.developers < min_count:
        return None
    changes: dict[str, dict[str, int]] = {
        name: merge_small(getattr(week, name), week.developers, min_count) for name in BREAKDOWNS
    }
    changes.update({name: {} for name in WITHHELD})
    return dataclasses.replace(week, **changes)  # type: ignore[arg-type]  # mypy cannot check ** here


def publish(stats: Stats, *, min_count: int = MIN_COUNT) -> Published:
    """The public document of ``stats``: every number counts at least ``min_count`` developers."""
    return publish_weeks(stats.app, stats.weeks, min_count=min_count)


def publish_weeks(app: str, weeks: Sequence[Week], *, min_count: int = MIN_COUNT) -> Published:
    """:func:`publish` of the weeks alone (all it reads of a :class:`Stats`: not the all-time count, rule 7)."""
    check_min_count(min_count)
    shown = [w for w in (publish_week(week, min_count) for week in weeks) if w is not None]
    return Published(app=app, min_count=min_count, events=sum(w.events for w in shown), weeks=shown)


_JSON_CSP: Final = "default-src 'none'; frame-ancestors 'none'"


class WeeksCache:
    """The weeks behind the public numbers, computed at most once per ``ttl`` seconds in this process.

    The rolled-up weeks cost next to nothing to read, but the open ones (the last ``--max-age-days``) are read
    from the raw events: ~0.6 s on PostgreSQL and ~1.7 s on SQLite per open week of 100,000 developers
    (``benchmarks/bench_stats.py``). So a request finds the weeks here; when they are older than ``ttl``, one
    request recomputes them while the others answer with the copy they replace (there is no copy only at
    the start: then they wait for the first). Published numbers are thus at most ``ttl`` seconds old.
    """

    def __init__(self, store: Store, *, app: str = DEFAULT_APP, ttl: float = CACHE_SECONDS) -> None:
        self.store = store
        self.app = app
        self.ttl = ttl
        self._computing = threading.Lock()
        self._copy: tuple[float, list[Week]] | None = None  # (monotonic time computed, weeks)

    def _fresh(self) -> list[Week] | None:
        copy = self._copy
        if copy is not None and time.monotonic() - copy[0] < self.ttl:
            return copy[1]
        return None

    def weeks(self) -> list[Week]:
        fresh = self._fresh()
        if fresh is not None:
            return fresh
        copy = self._copy
        if copy is not None and not self._computing.acquire(blocking=False):
            return copy[1]  # another request is recomputing them
        if copy is None:
            self._computing.acquire()
        try:
            fresh = self._fresh()
            if fresh is not None:
                return fresh
            # The weeks only: the all-time count is not published (rule 7), and it is the one number whose cost
            # grows with the history behind the open weeks.
            with self.store.reading() as reader:
                weeks = weeks_of(reader, self.store, self.app)
            self._copy = (time.monotonic(), weeks)
            return weeks
        finally:
            self._computing.release()


def answer(path: str, weeks: WeeksCache, *, min_count: int) -> tuple[int, bytes, str, list[tuple[str, str]]]:
    """The WSGI answer to ``GET path`` for one of :data:`PATHS`: (status, body, content type, extra headers)."""
    from ._report import CSP_HEADER, render_html  # the page's module imports this one

    doc = publish_weeks(weeks.app, weeks.weeks(), min_count=min_count)
    if path == STATS_PATH:
        body = json.dumps(doc.as_dict(), ensure_ascii=True).encode("ascii")
        return (
            200,
            body,
            "application/json",
            [("Content-Security-Policy", _JSON_CSP), ("X-Content-Type-Options", "nosniff")],
        )
    headers = [
        ("Content-Security-Policy", CSP_HEADER),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
    ]
    return 200, render_html(doc).encode("utf-8"), "text/html; charset=utf-8", headers
