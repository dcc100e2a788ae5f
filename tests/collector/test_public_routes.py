"""``GET /``, ``GET /v1/stats`` and the downloads of a real collector on a loopback port, on both back ends: they
serve the stored releases and nothing else -- nothing before the first release, exactly :func:`document` of the
stored releases after one, and the same bytes whatever happens to the events (a forget, late events, the
retention) until the next release is made.

The collector's clock is the test's (``Policy(clock=...)``), and its roll-ups are run by the test
(``Collector.rollup()``), so that the releases fall due when the test says. The page's content is tested
elsewhere (``test_public_page.py``); here only its status and headers.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from spool_reporter._hook import iso_time
from spool_reporter.collector import CollectorServer, Policy, Publishing, Retention, open_store, public
from spool_reporter.collector._html import CSP_HEADER
from spool_reporter.collector._public import document, releases_csv, releases_json
from spool_reporter.collector._release import FINAL, PROVISIONAL
from spool_reporter.collector._sqlite import SQLiteStore
from spool_reporter.collector._store import Reader
from spool_reporter.collector._wsgi import Collector

from support.events import at, batch, det_uuid4, event, monday, week_after

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=20))

WEEK = "2027-W05"
"""The week the test's developers are active in (Monday 2027-02-01 to Sunday 2027-02-07)."""

DAY = 86400.0
MAX_AGE_DAYS = 3
RETAIN_DAYS = MAX_AGE_DAYS + 7 + 1
"""As short as the collector allows (a week longer than the maximum age), so the test sees events deleted."""

PUBLISHING = Publishing(min_count=3, licence="CC-BY-4.0")
PATHS = ("/", "/v1/stats", "/v1/releases.json", "/v1/releases.csv")


class Clock:
    """The collector's clock, set by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Public:
    """A real collector on loopback (its public answers re-checked on every request), its clock and its store."""

    def __init__(self, db: str, *, rollup_every: float = 0) -> None:
        self.clock = Clock(at(monday(WEEK) + datetime.timedelta(days=2)))
        store = open_store(db)
        store.set_first_week(WEEK)
        self.app = Collector(
            store,
            policy=Policy(max_age=MAX_AGE_DAYS * DAY, clock=self.clock),
            publishing=PUBLISHING,
            retention=Retention(retain_days=RETAIN_DAYS, rollup_every=rollup_every),
            public_check=0.0,  # every request asks the database: what does not change the releases shows nothing
        )
        self.server = CollectorServer(self.app).start()
        self.base = self.server.url.removesuffix("/v1/batch")

    def get(self, path: str) -> urllib3.BaseHTTPResponse:
        response = HTTP.request("GET", self.base + path)
        assert response.status == 200, (path, response.status, response.data[:200])
        return response

    def served(self) -> dict[str, bytes]:
        """The JSON and the downloads as served now (the page's bytes are not compared: see the module doc)."""
        return {path: self.get(path).data for path in PATHS if path != "/"}

    def expected(self) -> dict[str, bytes]:
        """What the releases stored now must be served as."""
        releases = self.app.store.releases("Django")
        doc = document(releases, PUBLISHING, first_week=WEEK)
        assert public(self.app.store, publishing=PUBLISHING) == doc  # the public API reads the same
        return {
            "/v1/stats": json.dumps(doc, ensure_ascii=True).encode("ascii"),
            "/v1/releases.json": releases_json(releases, PUBLISHING),
            "/v1/releases.csv": releases_csv(releases, PUBLISHING),
        }

    def post_events(self, events: list[dict[str, object]]) -> dict[str, int]:
        response = HTTP.request(
            "POST", self.server.url, body=batch(events), headers={"Content-Type": "application/json"}
        )
        assert response.status == 200, response.data
        answer: dict[str, int] = json.loads(response.data)
        return answer

    def forget(self, client: object) -> int:
        body = json.dumps({"client_id": det_uuid4("client", client)}).encode()
        response = HTTP.request(
            "POST", self.base + "/v1/forget", body=body, headers={"Content-Type": "application/json"}
        )
        assert response.status == 200, response.data
        deleted: int = json.loads(response.data)["deleted"]
        return deleted

    def stop(self) -> None:
        self.server.stop()  # closes the store


@pytest.fixture
def served(db_url: str) -> Iterator[Public]:
    collector = Public(db_url)
    try:
        yield collector
    finally:
        collector.stop()


def developers(week: str, first: int, count: int, *, day: int = 1) -> list[dict[str, object]]:
    """``count`` developers (numbered from ``first``) with two events each on ``day`` of ``week``."""
    when = iso_time(at(monday(week) + datetime.timedelta(days=day), 9.0))
    out = []
    for i in range(first, first + count):
        version = ["5.2", "4.2", "6.0"][i % 3]
        os_name = ["Linux", "macOS", "Windows"][i % 3]
        for name in ("startproject", "runserver"):
            out.append(
                event(client=("dev", i), when=when, name=name, app_version=version, os_name=os_name, valid=False)
            )
    return out


def _set(collector: Public, day: datetime.date, hour: float) -> None:
    collector.clock.now = at(day, hour)


# -- nothing before a release --------------------------------------------------------------------------------------


def test_nothing_is_served_before_a_release(served: Public) -> None:
    assert served.post_events(developers(WEEK, 0, 30)) == {
        "accepted": 60,
        "duplicates": 0,
        "rejected": 0,
        "refused": {},
    }
    done = served.app.rollup()  # Wednesday of the week: nothing has ended, nothing is due
    assert (done.ran, done.released, done.release_error) == (True, (), "")
    answers = served.served()
    assert answers == served.expected()
    doc = json.loads(answers["/v1/stats"])
    assert doc["made"] is None
    assert (doc["weeks"], doc["months"], doc["quarters"], doc["years"]) == ([], [], [], [])
    assert json.loads(answers["/v1/releases.json"]) == {"app": "Django", "licence": "CC-BY-4.0", "releases": []}
    assert answers["/v1/releases.csv"].count(b"\r\n") == 1  # the header only
    assert b"5.2" not in answers["/v1/stats"]  # no number of the events stored


# -- the releases, and only they -----------------------------------------------------------------------------------


def test_routes_serve_the_stored_releases_and_nothing_else_changes_them(served: Public) -> None:
    week_monday = monday(WEEK)
    served.post_events(developers(WEEK, 0, 30))
    before = served.served()

    # The week has ended: its provisional release is made, and served exactly.
    _set(served, week_monday + datetime.timedelta(days=7), 1.0)
    done = served.app.rollup()
    assert [(r.period, r.kind) for r in done.released] == [(WEEK, PROVISIONAL)]
    first = served.served()
    assert first == served.expected()
    assert first["/v1/stats"] != before["/v1/stats"]
    doc = json.loads(first["/v1/stats"])
    assert [(w["week"], w["release"], w["week_epsilon"]) for w in doc["weeks"]] == [(WEEK, PROVISIONAL, 0.5)]
    assert doc["made"] == iso_time(served.clock.now)

    # A forget, late events of the released week, newcomers, and another roll-up with nothing due: the same bytes.
    assert served.forget(("dev", 0)) == 2
    late = developers(WEEK, 30, 12, day=5)  # Saturday of the week: inside the 3-day window, the week still open
    assert served.post_events(late)["accepted"] == 24
    assert served.post_events(developers(week_after(WEEK), 100, 5, day=0))["accepted"] == 10
    again = served.app.rollup()
    assert (again.ran, again.released, again.deleted) == (True, (), 0)
    assert served.served() == first

    # The week closes (its events are older than the maximum age): its final release is made; the provisional one
    # stays stored and downloadable byte for byte, and the page shows the final one.
    _set(served, week_monday + datetime.timedelta(days=10), 12.0)
    closing = served.app.rollup()
    assert closing.closed_through == WEEK
    assert [(r.period, r.kind) for r in closing.released] == [(WEEK, FINAL)]
    second = served.served()
    assert second == served.expected()
    (provisional,) = (r for r in served.app.store.releases("Django") if r.kind == PROVISIONAL)
    assert provisional.body.encode("ascii") in second["/v1/releases.json"]
    assert set(first["/v1/releases.csv"].split(b"\r\n")) <= set(second["/v1/releases.csv"].split(b"\r\n"))
    doc = json.loads(second["/v1/stats"])
    assert [(w["week"], w["release"], w["week_epsilon"]) for w in doc["weeks"]] == [(WEEK, FINAL, 1.0)]

    # Eleven days later the retention deletes the week's events. No release is due: the next week began a day
    # before the first day the retention keeps when this roll-up ran, and none after it has ended. Every answer
    # keeps its bytes.
    stored = served.app.store.releases("Django")
    _set(served, week_monday + datetime.timedelta(days=19), 12.0)
    late_rollup = served.app.rollup()
    assert late_rollup.deleted >= 60
    assert late_rollup.released == ()
    assert served.app.store.releases("Django") == stored
    assert served.served() == second


def test_a_request_starts_the_rollup_that_makes_a_due_release(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Releases fall due with time: a GET (not only a batch) starts the background roll-up, at the collector's
    own clock; the answers then serve what it made, and the operator's log says what was released and when the
    page shows it."""
    caplog.set_level(logging.INFO, logger="spool_reporter.collector")
    collector = Public(str(tmp_path / "c.sqlite3"), rollup_every=3600)
    try:
        collector.clock.now = at(monday(WEEK) + datetime.timedelta(days=8))
        collector.get("/v1/stats")  # answered at once, with or without the release: the roll-up runs beside it
        assert collector.app.wait_rollup(30)
        assert [(r.period, r.kind) for r in collector.app.store.releases("Django")] == [(WEEK, PROVISIONAL)]
        made = iso_time(collector.clock.now)
        assert [r.getMessage() for r in caplog.records if "released" in r.getMessage()] == [
            f"collector: released publicly: {WEEK} provisional (made {made}); GET / shows it within 0 s"
        ]
        assert collector.served() == collector.expected()
        assert json.loads(collector.get("/v1/stats").data)["weeks"][0]["week"] == WEEK
    finally:
        collector.stop()


# -- headers and methods -------------------------------------------------------------------------------------------


class CountingStore(SQLiteStore):
    """The real SQLite store, counting the snapshots it is asked for."""

    reads = 0

    def reading(self, *, quick: bool = False) -> contextlib.AbstractContextManager[Reader]:
        self.reads += 1
        return super().reading(quick=quick)


def test_each_check_of_the_public_answers_is_one_read(tmp_path: Path) -> None:
    """A request that checks the public answers (here every request: ``public_check=0``) reads the database once:
    one snapshot gives the releases' mark, the first week released and, when they changed, the releases."""
    store = CountingStore(tmp_path / "c.sqlite3")
    store.set_first_week(WEEK)
    clock = Clock(at(monday(WEEK) + datetime.timedelta(days=2)))
    app = Collector(
        store,
        policy=Policy(max_age=MAX_AGE_DAYS * DAY, clock=clock),
        publishing=PUBLISHING,
        retention=Retention(retain_days=RETAIN_DAYS, rollup_every=0),
        public_check=0.0,
    )
    server = CollectorServer(app).start()
    base = server.url.removesuffix("/v1/batch")

    def reads_of_get() -> tuple[int, bytes]:
        store.reads = 0
        response = HTTP.request("GET", base + "/v1/stats")
        assert response.status == 200, response.data[:200]
        return store.reads, response.data

    try:
        reads, before = reads_of_get()  # the first check: everything is read
        assert reads == 1
        assert reads_of_get() == (1, before)  # nothing changed: the mark says so
        clock.now = at(monday(WEEK) + datetime.timedelta(days=7), 1.0)
        assert [(r.period, r.kind) for r in app.rollup().released] == [(WEEK, PROVISIONAL)]
        reads, after = reads_of_get()  # a release was added: read in the same snapshot as the mark
        assert reads == 1
        assert [w["week"] for w in json.loads(after)["weeks"]] == [WEEK]
    finally:
        server.stop()


def test_headers(served: Public) -> None:
    served.post_events(developers(WEEK, 0, 3))
    _set(served, monday(WEEK) + datetime.timedelta(days=7), 1.0)
    assert served.app.rollup().released
    json_policy = "default-src 'none'; frame-ancestors 'none'"
    expected = {
        "/": ("text/html; charset=utf-8", CSP_HEADER, None),
        "/v1/stats": ("application/json", json_policy, None),
        "/v1/releases.json": ("application/json", json_policy, "attachment"),
        "/v1/releases.csv": ("text/csv; charset=utf-8", json_policy, "attachment"),
    }
    for path, (content_type, policy, disposition) in expected.items():
        response = served.get(path)
        headers = response.headers
        assert headers["Content-Type"] == content_type, path
        assert headers["Content-Security-Policy"] == policy, path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Cache-Control"] == "no-store", path
        assert headers.get("Content-Disposition") == disposition, path
        assert int(headers["Content-Length"]) == len(response.data), path
        assert "Set-Cookie" not in headers
    assert served.get("/").headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_public_paths_take_get_only(served: Public, method: str) -> None:
    for path in PATHS:
        response = HTTP.request(method, served.base + path, body=b"{}", headers={"Content-Type": "application/json"})
        assert response.status == 405, path
        assert response.headers["Allow"] == "GET"
    for path in ("/v1/stats/", "/v1/releases", "/v1/releases.xml"):
        assert HTTP.request("GET", served.base + path).status == 404
