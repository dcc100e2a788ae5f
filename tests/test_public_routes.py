"""``GET /`` and ``GET /v1/stats`` of a real collector on a loopback port (in a thread, and as a real
``serve`` process), filled through its real ingest endpoint; ``serve --min-count``, ``stats --min-count``
and the WSGI module's ``SPOOL_REPORTER_COLLECTOR_MIN_COUNT``."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pg
import pytest
import urllib3
from pg import pg_server  # noqa: F401 - the session's PostgreSQL, a fixture
from test_collector import batch, event, post
from test_collector_processes import _cli, start_server
from test_collector_stores import BACKENDS

from spool_reporter.collector import MIN_COUNT, CollectorError, CollectorServer, make_app, publish, serve, stats
from spool_reporter.collector._cli import register
from spool_reporter.collector._report import CSP_HEADER

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conftest import Sandbox

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=20))


def recent_week_times(weeks: int) -> list[str]:
    """One event time in each of the last ``weeks`` ISO weeks, oldest first, the newest a few minutes ago.

    Relative to now, so that a collector that refuses events far in the past keeps accepting them."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(minutes=5)
    return [(now - datetime.timedelta(weeks=back)).strftime("%Y-%m-%dT%H:%M:%SZ") for back in range(weeks - 1, -1, -1)]


def fill(url: str, times: list[str]) -> list[dict[str, object]]:
    """Post a known population: in every week 30 developers on Linux and 12 on macOS, 3 on FreeBSD, and on
    Django 5.2 (25), 4.2 (18) or 3.2 (2); in the second week only 6 developers in all."""
    events = []
    for w, when in enumerate(times):
        people = 6 if w == 1 else 45
        for i in range(people):
            os_name = "Linux" if i < 30 else "macOS" if i < 42 else "FreeBSD"
            version = "5.2" if i % 45 < 25 else "4.2" if i % 45 < 43 else "3.2"
            events.append(event(client=("dev", w, i), when=when, app_version=version, os_name=os_name))
    for start in range(0, len(events), 500):
        assert post(url, batch(events[start : start + 500]))[0] == 200
    return events


@pytest.fixture(params=BACKENDS)
def public(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[CollectorServer, Path | str]]:
    """A real embedded collector on loopback and its database (SQLite, and PostgreSQL where it can run), filled
    by :func:`fill` over three weeks."""
    if request.param == "sqlite":
        db: Path | str = tmp_path / "collector.sqlite3"
    else:
        server: pg.Server = request.getfixturevalue("pg_server")
        db = server.url()
    with serve(db) as srv:
        fill(srv.url, recent_week_times(3))
        yield srv, db


def _base(server: CollectorServer) -> str:
    return server.url.removesuffix("/v1/batch")


def test_v1_stats_is_the_public_document(public: tuple[CollectorServer, Path | str]) -> None:
    server, db = public
    response = HTTP.request("GET", _base(server) + "/v1/stats")
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    doc = json.loads(response.data)
    assert doc == json.loads(json.dumps(publish(stats(db)).as_dict()))
    assert doc["min_count"] == 10
    assert doc["developers"] is None
    assert len(doc["weeks"]) == 2  # the week of 6 developers is not published
    for week in doc["weeks"]:
        assert week["developers"] == 45
        assert week["by_os"] == {"Linux": 30, "other": 15}  # FreeBSD (3) is small; macOS (12) joins it
        assert week["by_django"] == {"5.2": 25, "other": 20}  # 3.2 (2) is small; 4.2 (18) joins it
        assert week["by_event"] == {}
    assert b"FreeBSD" not in response.data
    # The operator's numbers still have everything.
    full = stats(db).as_dict()
    assert [w["developers"] for w in full["weeks"]] == [45, 6, 45]  # type: ignore[index]


def test_page_is_served_with_its_policy(public: tuple[CollectorServer, Path | str]) -> None:
    server, _ = public
    response = HTTP.request("GET", _base(server) + "/")
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert response.headers["Content-Security-Policy"] == CSP_HEADER
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    page = response.data.decode("utf-8")
    assert "<h1>Django developers per week</h1>" in page
    assert "FreeBSD" not in page
    assert "3.2" not in page


def test_public_paths_take_get_only(public: tuple[CollectorServer, Path | str]) -> None:
    server, _ = public
    for path in ("/", "/v1/stats"):
        response = HTTP.request("POST", _base(server) + path, body=b"{}", headers={"Content-Type": "application/json"})
        assert response.status == 405
        assert response.headers["Allow"] == "GET"
    assert HTTP.request("GET", _base(server) + "/v1/stats/").status == 404


def test_min_count_is_the_servers_choice(tmp_path: Path) -> None:
    db = tmp_path / "collector.sqlite3"
    with serve(db, min_count=2) as server:
        fill(server.url, recent_week_times(3))
        doc = json.loads(HTTP.request("GET", _base(server) + "/v1/stats").data)
    assert doc["min_count"] == 2
    assert [w["developers"] for w in doc["weeks"]] == [45, 6, 45]
    with pytest.raises(ValueError, match="at least 1"):
        make_app(db, min_count=0)


def test_wsgi_module_reads_min_count(tmp_path: Path) -> None:
    db = tmp_path / "collector.sqlite3"
    from spool_reporter.collector import wsgi

    env = {wsgi.DB_VARIABLE: str(db)}
    for value, expected in ((None, 10), ("25", 25)):
        app = wsgi.from_environ(env if value is None else {**env, "SPOOL_REPORTER_COLLECTOR_MIN_COUNT": value})
        app.store.close()  # Python 3.13 warns about a connection left to the garbage collector
        assert app.min_count == expected
    for bad in ("0", "ten", "-1"):
        with pytest.raises(CollectorError, match=r"SPOOL_REPORTER_COLLECTOR_MIN_COUNT: .*at least 1"):
            wsgi.from_environ({**env, "SPOOL_REPORTER_COLLECTOR_MIN_COUNT": bad})


# -- the commands: serve --min-count, stats --min-count ----------------------------------------------------


def test_serve_min_count_and_stats_min_count_agree(tmp_path: Path, sandbox: Sandbox) -> None:
    db = tmp_path / "c.sqlite3"
    served = start_server(db, sandbox.env, tmp_path, "--min-count", "5")
    try:
        fill(served.url, recent_week_times(3))
        base = served.url.removesuffix("/v1/batch")
        served_doc = json.loads(HTTP.request("GET", base + "/v1/stats").data)
        page = HTTP.request("GET", base + "/").data.decode()
    finally:
        served.stop()
    assert served.proc.returncode == 0
    assert served_doc["min_count"] == 5
    assert [w["developers"] for w in served_doc["weeks"]] == [45, 6, 45]
    # The operator sees exactly what was published with --min-count, and everything without it.
    done = _cli(sandbox.env, "stats", "--db", str(db), "--json", "--min-count", "5")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == served_doc
    full = _cli(sandbox.env, "stats", "--db", str(db), "--json")
    assert json.loads(full.stdout) == json.loads(json.dumps(stats(db).as_dict()))
    text = _cli(sandbox.env, "stats", "--db", str(db), "--min-count", "10")
    assert text.stdout.splitlines()[0] == f"Django: 2 weeks published, no number under 10 developers ({db})"
    assert "FreeBSD" not in text.stdout
    assert "FreeBSD" in _cli(sandbox.env, "stats", "--db", str(db)).stdout
    # --html writes the page GET / serves (apart from the time it was made).
    report = tmp_path / "page.html"
    assert _cli(sandbox.env, "stats", "--db", str(db), "--min-count", "5", "--html", str(report)).returncode == 0
    assert _without_time(report.read_text(encoding="utf-8")) == _without_time(page)


def _without_time(page: str) -> str:
    return re.sub(r"Generated [0-9-]+ [0-9:]+ UTC", "Generated", page)


@pytest.mark.parametrize("command", ["serve", "stats"])
@pytest.mark.parametrize("value", ["0", "many"])
def test_min_count_usage_errors(tmp_path: Path, sandbox: Sandbox, command: str, value: str) -> None:
    done = _cli(sandbox.env, command, "--db", str(tmp_path / "c.sqlite3"), "--min-count", value)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        f"the minimum count must be a whole number of at least 1, got {value!r}"
    )
    assert "Traceback" not in done.stderr


def test_serve_default_is_the_public_default() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["collector", "serve", "--db", "x"])
    assert args.min_count == MIN_COUNT
    assert parser.parse_args(["collector", "stats", "--db", "x"]).min_count is None


def test_public_numbers_are_recomputed_at_most_once_per_ttl(tmp_path: Path) -> None:
    """The open weeks are read from the raw events, which costs seconds at scale: a process computes them at
    most once per ``ttl``, and a request that finds them stale while another recomputes gets the old copy."""
    from test_collector import POLICY, _call

    app = make_app(tmp_path / "c.sqlite3", policy=POLICY, min_count=1)
    try:

        def developers() -> list[int]:
            status, out = _call(app, "GET", "/v1/stats", b"", {})
            assert status == "200 OK"
            return [w["developers"] for w in json.loads(out)["weeks"]]

        def add(client: str) -> None:
            body = batch([event(client=client)])
            headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))}
            assert _call(app, "POST", "/v1/batch", body, headers)[0] == "200 OK"

        add("a")
        assert developers() == [1]
        add("b")
        assert developers() == [1]  # still the copy: younger than the ttl
        app.public.ttl = 0.0
        with app.public._computing:  # another request is recomputing: this one answers with the copy
            assert developers() == [1]
        assert developers() == [2]
    finally:
        app.store.close()
