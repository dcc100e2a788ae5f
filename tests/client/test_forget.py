"""The client's forget (``spool_reporter/_forget.py``) against a real collector on loopback, both stores: the
collector deletes the id's events, the id is replaced, the queue is emptied; and every way it cannot."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter import App, _flush
from spool_reporter._forget import forget, forget_url
from spool_reporter._settings import Destination
from spool_reporter.collector import CollectorServer, serve, stats

from support.commands import cli
from support.servers import RefusedPort, Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(120)

UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture
def collector(db_url: str) -> Iterator[CollectorServer]:
    with serve(db_url) as srv:
        yield srv


def client_id(sandbox: Sandbox, app: App) -> str | None:
    found = re.findall(r"^client_id=(.*)$", sandbox.user_file(app).read_text(), re.MULTILINE)
    return found[-1] if found else None


def sent_and_queued(sandbox: Sandbox, app: App, env: dict[str, str], *, sent: int, queued: int) -> str:
    """``sent`` events delivered by a real flusher run, then ``queued`` more left in the spool; the client id."""
    fill(app, env, sent)
    result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True)
    assert (result.outcome, result.sent) == ("delivered", sent), result.message
    fill(app, env, queued)
    assert len(sandbox.spool_lines(app)) == queued
    cid = client_id(sandbox, app)
    assert cid is not None
    return cid


def test_forget_at_the_collector(sandbox: Sandbox, app: App, collector: CollectorServer) -> None:
    env = with_destination(sandbox.env, collector.url)
    old = sent_and_queued(sandbox, app, env, sent=7, queued=3)
    other = collector.app.store
    assert other.count() == (7, 1)
    result = forget(app, environ=env)
    assert result.outcome == "forgotten", result.message
    assert (result.deleted, result.purged, result.old_id) == (7, 3, old)
    assert result.new_id is not None
    assert UUID4.fullmatch(result.new_id)
    assert result.new_id != old
    assert client_id(sandbox, app) == result.new_id  # what the hook uses from now on
    assert sandbox.spool_lines(app) == []
    assert other.count() == (0, 0)
    assert stats(other).weeks == []
    # The new id starts afresh; forgetting it again deletes nothing more.
    fill(app, env, 1)
    assert str(result.new_id) in sandbox.spool_lines(app)[0].decode()
    again = forget(app, environ=env)
    assert (again.outcome, again.deleted, again.purged) == ("forgotten", 0, 1)


def test_a_failed_request_keeps_the_id(sandbox: Sandbox, app: App) -> None:
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        fill(app, env, 2)
        old = client_id(sandbox, app)
        started = time.monotonic()
        result = forget(app, environ=env)
        assert time.monotonic() - started < 10
    finally:
        port.close()
    assert result.outcome == "failed"
    assert "your client id is kept" in result.message
    assert (result.purged, result.new_id) == (2, None)
    assert client_id(sandbox, app) == old
    assert sandbox.spool_lines(app) == []  # nothing queued under that id will leave


@pytest.mark.serial
def test_a_silent_collector_costs_the_deadline_only(sandbox: Sandbox, app: App) -> None:
    with Server("silent") as silent:
        # The flusher's deadline (2 s here) ends it, whatever the per-read timeout would allow.
        env = with_destination(sandbox.env, silent.url(), SPOOL_REPORTER_READ_TIMEOUT="10")
        fill(app, env, 1)
        started = time.monotonic()
        result = forget(app, environ=env)
        took = time.monotonic() - started
    assert result.outcome == "failed"
    assert "deadline" in result.message
    assert took < 6


@pytest.mark.parametrize("status", [400, 404, 503])
def test_a_refusal_is_a_failure(sandbox: Sandbox, app: App, status: int) -> None:
    with Server("status", status=status, body=b"no") as refusing:
        env = with_destination(sandbox.env, refusing.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        result = forget(app, environ=env)
        (request,) = refusing.received
    assert (result.outcome, client_id(sandbox, app)) == ("failed", old)
    assert f"HTTP {status}" in result.message
    assert (request.method, request.target) == ("POST", "/v1/forget")
    assert request.body == f'{{"client_id": "{old}"}}'.encode()


def test_nothing_leaves_while_reporting_is_off(sandbox: Sandbox, app: App, collector: CollectorServer) -> None:
    env = with_destination(sandbox.env, collector.url)
    old = sent_and_queued(sandbox, app, env, sent=2, queued=0)
    off = {**env, "DO_NOT_TRACK": "1"}
    requests = collector.app.counters.requests
    result = forget(app, environ=off)
    assert result.outcome == "off"
    assert "--send-while-off" in result.message
    assert collector.app.counters.requests == requests  # not one request
    assert client_id(sandbox, app) == old
    asked = forget(app, environ=off, send_while_off=True)
    assert (asked.outcome, asked.deleted) == ("forgotten", 2)


def test_no_client_id_nothing_to_forget(sandbox: Sandbox, app: App) -> None:
    with Server("healthy") as server:
        result = forget(app, environ=with_destination(sandbox.env, server.url()))
        assert server.received == []
    assert result.outcome == "no-id"


def test_ga4_cannot_delete_and_says_so(sandbox: Sandbox, app: App) -> None:
    # Google's endpoint comes from the config file alone (not the sandbox's), and nothing is ever sent to it.
    env = {k: v for k, v in sandbox.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}
    env["DJANGO_ANALYTICS_TRANSPORT"] = "ga4"
    sandbox.write_user(
        app, "endpoint=https://www.google-analytics.com/mp/collect\nmeasurement_id=G-TEST\napi_secret=s3cret\n"
    )
    fill(app, sandbox.env, 2)  # queued (for the sandbox's destination, never reached)
    old = client_id(sandbox, app)
    result = forget(app, environ=env)  # no request is made to Google at all
    assert result.outcome == "cannot"
    assert "User Deletion API" in result.message
    assert "analytics.user.deletion" in result.message
    assert str(old) in result.message  # for the property's owner
    assert "s3cret" not in result.message
    assert result.purged == 2
    assert client_id(sandbox, app) == result.new_id != old


def test_ga4_pointed_at_the_collector_forgets_there(sandbox: Sandbox, app: App, collector: CollectorServer) -> None:
    env = with_destination(
        sandbox.env, collector.ga4_url, DJANGO_ANALYTICS_TRANSPORT="ga4", SPOOL_REPORTER_FLUSH_DEADLINE="10"
    )
    sandbox.write_user(app, "measurement_id=G-TEST\napi_secret=s3cret\n")
    for k in range(3):  # on three days: a GA4 payload has no event id, so one day's twins count once
        fill(app, env, 1, now=time.time() - k * 86400)
    assert _flush.run(app, foreground=True, environ=env, ignore_backoff=True).sent == 3
    result = forget(app, environ=env)
    assert (result.outcome, result.deleted) == ("forgotten", 3), result.message
    assert collector.app.store.count() == (0, 0)


@pytest.mark.parametrize(
    ("transport", "endpoint", "expected"),
    [
        ("json", "https://collector.example/v1/batch", "https://collector.example/v1/forget"),
        ("json", "https://collector.example/spool/v1/batch/", "https://collector.example/spool/v1/forget"),
        ("json", "http://127.0.0.1:8765/v1/batch", "http://127.0.0.1:8765/v1/forget"),
        ("json", "https://collector.example/ingest", None),
        ("ga4", "https://www.google-analytics.com/mp/collect", None),
        ("ga4", "https://region1.google-analytics.com/mp/collect", None),
        ("ga4", "https://collector.example/mp/collect", "https://collector.example/v1/forget"),
        ("ua", "https://www.google-analytics.com/batch", None),
    ],
)
def test_where_forget_goes(transport: str, endpoint: str, expected: str | None) -> None:
    destination = Destination(transport=transport, endpoint=endpoint, source="user")
    assert forget_url(destination) == expected


# --- `django-spool forget`, as a real process ---------------------------------------------------------------


def test_the_command_forgets_at_the_collector(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    with serve(str(tmp_path / "c.sqlite3")) as collector:
        env = with_destination(sandbox.env, collector.url)
        old = sent_and_queued(sandbox, app, env, sent=4, queued=2)
        done = cli(sandbox, "forget", env=env)
        assert collector.app.store.count() == (0, 0)
    new = client_id(sandbox, app)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"Forgotten: the collector at {collector.url.replace('/batch', '/forget')} deleted 4 events of your client "
        "id; it keeps only numbers of closed weeks, which hold no client id.\n"
        f"Deleted 2 queued events and the record of what was sent.\nNew client id {new}.\n"
    )
    assert new != old
    assert sandbox.spool_lines(app) == []


def test_the_command_says_why_it_failed_in_one_line(sandbox: Sandbox, app: App) -> None:
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        failed = cli(sandbox, "forget", env=env)
    finally:
        port.close()
    assert failed.returncode == 1
    assert failed.stdout == "Deleted 1 queued event.\n"
    (line,) = failed.stderr.splitlines()
    assert line.startswith("django-spool: forget: the collector at ")
    assert line.endswith("; your client id is kept, so that forget can be run again.")
    assert client_id(sandbox, app) == old


def test_a_link_planted_at_the_flusher_lock_is_not_followed(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    """Forget waits for the flusher's lock as the flusher takes it, through the folder's descriptor: a symlink
    planted at ``flusher.lock`` is set aside, and the file it points at is not touched. (filelock 4.3 refuses to
    follow it too; older versions opened the target with ``O_TRUNC``.)"""
    from spool_reporter._hook import FLUSHER_LOCK_NAME

    with Server("healthy") as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, env, 1)
        victim = tmp_path / "victim.txt"
        victim.write_text("keep me\n")
        lock = sandbox.state_dir(app) / FLUSHER_LOCK_NAME
        lock.unlink(missing_ok=True)
        lock.symlink_to(victim)
        result = forget(app, environ=env)
    assert result.outcome == "forgotten", result.message
    assert victim.read_text() == "keep me\n"
    assert not lock.is_symlink()  # replaced by a lock file of ours
    assert lock.is_file()
