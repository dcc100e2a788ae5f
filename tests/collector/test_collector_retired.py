"""A retired collector: ``serve --retired``, and ``SPOOL_REPORTER_COLLECTOR_RETIRED=1`` for the WSGI application,
answer every batch ``410 Gone`` (``/v1/batch`` and ``/mp/collect``), so that each client that receives it retires
the destination (``tests/client/test_retire.py``); forgetting, the health check and the public numbers keep
working."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from spool_reporter import App, _hook
from spool_reporter.collector import CollectorError, CollectorServer, stats, wsgi
from spool_reporter.collector._common import VARIABLES
from spool_reporter.collector._wsgi import RETIRED_BODY

from support.collector_server import HTTP, call_wsgi, post, start_server
from support.commands import spool_command
from support.events import batch, event
from support.servers import fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)

GA4_CREDENTIALS = "measurement_id=G-RETIRED1\napi_secret=retired-probe-secret\n"


def _flush(sandbox: Sandbox, url: str, transport: str = "json") -> subprocess.CompletedProcess[str]:
    """``django-spool flush`` to ``url`` (generous timings: this is about the answer, not the deadline)."""
    env = with_destination(
        sandbox.env,
        url,
        DJANGO_ANALYTICS_TRANSPORT=transport,
        SPOOL_REPORTER_FLUSH_DEADLINE="30",
        SPOOL_REPORTER_CONNECT_TIMEOUT="5",
        SPOOL_REPORTER_READ_TIMEOUT="10",
    )
    return subprocess.run([*spool_command(), "flush"], env=env, capture_output=True, text=True, timeout=90, check=False)


def _user(sandbox: Sandbox, app: App) -> dict[str, str]:
    values = _hook.parse(sandbox.user_file(app).read_bytes())
    assert values is not None
    return values


@pytest.mark.parametrize(("transport", "path"), [("json", "/v1/batch"), ("ga4", "/mp/collect")])
def test_serve_retired_retires_its_clients_and_still_forgets(
    tmp_path: Path, sandbox: Sandbox, app: App, transport: str, path: str
) -> None:
    """A collector that took a developer's events is restarted with ``--retired``: the developer's next flush is
    answered 410 and retires it (queue deleted, ``retired=`` written, nothing stored); ``forget`` still deletes what
    the collector holds of that developer, and the health check and the public numbers still answer."""
    db = tmp_path / "collector.sqlite3"
    if transport == "ga4":
        sandbox.write_user(app, GA4_CREDENTIALS)
    server = start_server(db, sandbox.env, tmp_path)
    try:
        fill(app, sandbox.env, 3)
        first = _flush(sandbox, server.url.replace("/v1/batch", path), transport)
        assert first.returncode == 0, first.stdout + first.stderr
    finally:
        server.stop()
    stored = stats(db).events
    assert stored >= 1  # ga4 events of one day from one developer are one stored event

    retired = start_server(db, sandbox.env, tmp_path, "--retired")
    base = retired.url.removesuffix("/v1/batch")
    try:
        fill(app, sandbox.env, 5)
        url = base + path
        done = _flush(sandbox, url, transport)
        assert done.stdout.splitlines()[0] == "retired: sent 0, rejected 0, failed 0, still queued 0, deleted 5"
        assert done.returncode == 0, done.stderr  # nothing is left to send
        assert f"The destination {url}" in done.stdout  # a GA4 URL adds its redacted query
        assert "retired itself (HTTP 410 Gone)" in done.stdout
        assert _user(sandbox, app)["retired"] == url
        assert sandbox.spool_lines(app) == []
        # Both intake routes answer 410 with the short JSON body, whatever is sent.
        for route in ("/v1/batch", "/mp/collect"):
            status, body = post(base + route, b"{}")
            assert (status, json.loads(body)) == (410, json.loads(RETIRED_BODY)), route
        # What keeps working: forgetting (it deletes what was stored), the health check, the public numbers.
        client_id = _user(sandbox, app)["client_id"]
        status, body = post(base + "/v1/forget", json.dumps({"client_id": client_id}).encode())
        assert (status, json.loads(body)) == (200, {"deleted": stored})
        for route in ("/v1/health", "/v1/stats", "/"):
            assert HTTP.request("GET", base + route).status == 200, route
    finally:
        summary = retired.stop()
    assert retired.proc.returncode == 0
    assert stats(db).events == 0  # forgotten; and nothing of the 410'd batches was stored
    assert summary.startswith("stopped after ")
    assert "0 events stored" in summary
    err = retired.stderr.read_text()
    assert err.startswith("python -m spool_reporter.collector serve: retired: every batch is answered 410 Gone")
    assert err.count("\n") == 1


def test_serve_help_names_the_switch_and_its_variable() -> None:
    done = subprocess.run(
        [*spool_command(), "collector", "serve", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--retired retire this collector: answer every batch (POST /v1/batch, POST /mp/collect) 410 Gone" in text
    assert f"{VARIABLES.retired}=1" in text


def _wsgi_app(db: Path, value: str) -> object:
    return wsgi.from_environ({wsgi.DB_VARIABLE: str(db), VARIABLES.retired: value})


def _post_batch(app: object, path: str) -> tuple[str, bytes]:
    body = batch([event()])
    return call_wsgi(app, "POST", path, body, {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))})


@pytest.mark.parametrize("value", ["1", "true", " Yes ", "on"])
def test_the_wsgi_setting_answers_every_batch_410(tmp_path: Path, value: str) -> None:
    db = tmp_path / "c.sqlite3"
    app = _wsgi_app(db, value)
    try:
        for path in ("/v1/batch", "/mp/collect"):
            assert _post_batch(app, path) == ("410 Gone", RETIRED_BODY), path
        assert call_wsgi(app, "GET", "/v1/batch", b"", {})[0].startswith("405")  # the method is still checked
        forget = json.dumps({"client_id": "00000000-0000-4000-8000-000000000000"}).encode()
        headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(forget))}
        assert call_wsgi(app, "POST", "/v1/forget", forget, headers) == ("200 OK", b'{"deleted": 0}')
        for path in ("/v1/health", "/v1/stats", "/"):
            assert call_wsgi(app, "GET", path, b"", {})[0] == "200 OK", path
    finally:
        app.store.close()  # type: ignore[attr-defined]
    assert stats(db).events == 0


@pytest.mark.parametrize("value", ["", "0", "false", "Off", "no"])
def test_the_wsgi_setting_off_takes_batches(tmp_path: Path, value: str) -> None:
    app = _wsgi_app(tmp_path / "c.sqlite3", value)
    try:
        status, body = _post_batch(app, "/v1/batch")
        assert status == "200 OK"
        assert set(json.loads(body)) == {"accepted", "duplicates", "rejected", "refused"}
    finally:
        app.store.close()  # type: ignore[attr-defined]


def test_the_wsgi_setting_refuses_a_value_it_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match=f"{VARIABLES.retired} must be 1 \\(yes\\) or 0 \\(no\\), got 'maybe'"):
        _wsgi_app(tmp_path / "c.sqlite3", "maybe")


def test_the_wsgi_application_retires_a_real_client(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    """The application ``wsgi.py`` builds from the environment, served on loopback: a real flush is retired."""
    collector = _wsgi_app(tmp_path / "c.sqlite3", "1")
    with CollectorServer(collector, host="127.0.0.1", port=0) as server:  # type: ignore[arg-type]
        fill(app, sandbox.env, 2)
        done = _flush(sandbox, server.url)
    assert done.stdout.splitlines()[0] == "retired: sent 0, rejected 0, failed 0, still queued 0, deleted 2"
    assert _user(sandbox, app)["retired"] == server.url
