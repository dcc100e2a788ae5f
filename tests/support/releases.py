"""The public releases as the tests make them: a population of developers (:func:`population`), a SQLite store
holding them and the releases the real roll-up makes (:func:`released`), the same releases tampered with hostile
values (:func:`hostile_releases`), and :func:`week_counts`' answer as one vector (:func:`flat`)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from spool_reporter.collector import Publishing, open_store
from spool_reporter.collector._common import Release, Row
from spool_reporter.collector._release import BREAKDOWNS
from spool_reporter.collector._rollup import rollup
from spool_reporter.collector._store import Store

from .events import DAY, row

PAGE_START = datetime.datetime(2026, 10, 1, 12, tzinfo=datetime.timezone.utc).timestamp()
"""The first day of events (a Thursday of 2026-W40)."""

PAGE_NOW = datetime.datetime(2026, 12, 4, 12, tzinfo=datetime.timezone.utc).timestamp()
"""When the roll-up runs: 2026-W40 to W44 are closed (final), W45 to W48 have ended (provisional), 2026-10 too."""

SECTIONS = {"by_django": "versions", "by_python": "python", "by_os": "os"}
"""Breakdown -> the id of its section on the public page."""

HOSTILE = [
    '<script>alert("x")</script>',
    '"><img src=x onerror=alert(1)>',
    "</style><script>alert(2)</script>",
    "' onmouseover='alert(3)",
    "]]><!-- &amp; -->",
    "</title></svg><iframe src=//example.org>",
]
"""Values a client or a tampered database could hold (the validation upstream refuses them; the page must not
rely on that)."""


def population(developers: int = 3000, *, days: int = 60) -> list[Row]:
    """``developers`` developers, each with one event on one of ``days`` days from :data:`PAGE_START`, on three Django
    versions, two Pythons and Linux (the example of the brief)."""
    return [
        row(c, PAGE_START + (c % days) * DAY, version=["5.2", "4.2", "6.0"][c % 3], python=["3.12", "3.10"][c % 2])
        for c in range(developers)
    ]


OPENED: list[Store] = []
"""The stores :func:`released` opened: :func:`close_released` closes those of each test (Python 3.13 warns of a
SQLite connection left open, and the warnings are errors here)."""


def released(path: Path, rows: list[Row], *, publishing: Publishing | None = None, now: float = PAGE_NOW) -> Store:
    """A SQLite store holding ``rows`` and the releases the real roll-up makes at ``now`` (from 2026-W40); closed
    at the end of the test that made it (the fixture :func:`close_released`, ``tests/collector/conftest.py``)."""
    store = open_store(str(path))
    OPENED.append(store)
    store.set_first_week("2026-W40")
    if rows:
        store.insert(rows)
    done = rollup(store, now=now, publishing=publishing)
    assert done.release_error == ""
    return store


def hostile_releases(store: Store) -> list[Release]:
    """The store's releases, a tampered week (hostile values as cells and as its name) and a tampered month."""
    releases = store.releases("Django")
    latest = max((r for r in releases if "-W" in r.period), key=lambda r: r.period)
    body = json.loads(latest.body)
    body["period"] = HOSTILE[5]
    body["made"] = HOSTILE[2]
    for i, name in enumerate(SECTIONS):
        body[name] = {**body[name], HOSTILE[i]: 400, HOSTILE[i + 3]: 3}
    tampered = latest._replace(period="2026-W49", made="2026-12-07T00:00:00Z", body=json.dumps(body))
    month = next(r for r in releases if r.period == "2026-10")
    body = {**json.loads(month.body), "period": HOSTILE[1], "made": HOSTILE[0]}
    return [*(r for r in releases if r is not month), month._replace(body=json.dumps(body)), tampered]


def flat(counts: tuple[int, dict[str, dict[str, int]]]) -> dict[tuple[str, str], int]:
    """:func:`week_counts`' answer as one vector: ("developers", "") and (breakdown, value) -> count."""
    total, cells = counts
    out = {("developers", ""): total}
    for name in BREAKDOWNS:
        for value, n in cells[name].items():
            out[name, value] = n
    return out
