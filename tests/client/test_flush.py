"""The flusher in-process (``run(foreground=True)``, as ``django-spool flush`` calls it) against real
loopback servers that misbehave: every case ends within the deadline with the right spool outcome."""

from __future__ import annotations

import email.utils
import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import filelock
import pytest

from spool_reporter import App, _flush, _http, _plan, _round, _settings, _state
from spool_reporter._hook import iso_time

from support.polling import wait_for
from support.sandbox import Sandbox
from support.servers import Proxy, RefusedPort, Server, fill, serving, with_destination

DEADLINE = 2.0  # with_destination() sets SPOOL_REPORTER_FLUSH_DEADLINE=2
SLACK = 1.0  # thread start, file work, a loaded CI machine


def queued_ids(sandbox: Sandbox, app: App) -> list[str]:
    """Ids of the valid events queued, oldest first."""
    ids = []
    for line in sandbox.spool_lines(app):
        try:
            event_id = json.loads(line).get("event_id", "")
        except ValueError:
            continue
        if len(event_id) == 36:
            ids.append(event_id)
    return ids


def counters(sandbox: Sandbox, app: App) -> dict[str, int]:
    path = sandbox.state_dir(app) / "counters"
    if not path.exists():
        return {}
    return {k: int(v) for k, _, v in (line.partition("=") for line in path.read_text().split())}


def timed_run(app: App, env: dict[str, str], **kw: object) -> tuple[_flush.FlushResult, float]:
    start = time.monotonic()
    result = _flush.run(app, foreground=True, environ=env, **kw)  # type: ignore[arg-type]
    return result, time.monotonic() - start


# --- server behaviours ---------------------------------------------------------------------------------

KEPT = "kept"
GONE = "gone"

BEHAVIOURS = [
    pytest.param({"behaviour": "healthy"}, "delivered", GONE, id="healthy"),
    pytest.param({"behaviour": "silent"}, "failed", KEPT, id="accepts-never-answers"),
    pytest.param({"behaviour": "slow", "delay": 5.0}, "failed", KEPT, id="slow"),
    pytest.param({"behaviour": "trickle", "interval": 0.05}, "failed", KEPT, id="trickle"),
    pytest.param({"behaviour": "status", "status": 500}, "failed", KEPT, id="500"),
    pytest.param({"behaviour": "status", "status": 503, "retry_after": "1"}, "failed", KEPT, id="503"),
    pytest.param({"behaviour": "status", "status": 429, "retry_after": "1"}, "failed", KEPT, id="429"),
    pytest.param({"behaviour": "status", "status": 408}, "failed", KEPT, id="408"),
    pytest.param({"behaviour": "status", "status": 400}, "delivered", GONE, id="400-dropped"),
    pytest.param({"behaviour": "status", "status": 413}, "delivered", GONE, id="413-dropped"),
    pytest.param({"behaviour": "redirect"}, "failed", KEPT, id="redirect-not-followed"),
    pytest.param({"behaviour": "huge"}, "delivered", GONE, id="huge-body"),
]


@pytest.mark.serial
@pytest.mark.parametrize("tls", [pytest.param(False, id="http"), pytest.param(True, id="https")])
@pytest.mark.parametrize(("server_kw", "outcome", "spool"), BEHAVIOURS)
def test_server_behaviour(
    sandbox: Sandbox,
    app: App,
    tls: bool,
    server_kw: dict[str, object],
    outcome: str,
    spool: str,
    request: pytest.FixtureRequest,
) -> None:
    ca = request.getfixturevalue("ca") if tls else None
    fill(app, sandbox.env, 3)
    ids = queued_ids(sandbox, app)
    with serving(tls=ca, **server_kw) as server:  # type: ignore[arg-type]
        env = with_destination(
            sandbox.env, server.url(), **({"SSL_CERT_FILE": str(ca_file(ca, sandbox))} if ca else {})
        )
        result, took = timed_run(app, env)
        assert server.received, "the request reached the server"
    assert took < DEADLINE + SLACK
    assert result.outcome == outcome, result
    if spool == KEPT:
        assert sorted(queued_ids(sandbox, app)) == sorted(ids)
        assert result.remaining == 3
        state = _state.read_state(app, environ=env)
        assert state.consecutive_failures == 1
        assert state.next_retry is not None
        assert state.last_error
    else:
        assert queued_ids(sandbox, app) == []
    if server_kw.get("status") in (400, 413):
        assert result.rejected == 3
        assert counters(sandbox, app).get("rejected") == 3


@pytest.fixture
def ca() -> object:
    import trustme

    return trustme.CA()


def ca_file(ca: object, sandbox: Sandbox) -> Path:
    path = sandbox.root / "ca.pem"
    if not path.exists():
        ca.cert_pem.write_to_path(str(path))  # type: ignore[attr-defined]
    return path


@pytest.mark.serial
def test_refused(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    port = RefusedPort()
    try:
        result, took = timed_run(app, with_destination(sandbox.env, port.url()))
    finally:
        port.close()
    assert result.outcome == "failed"
    assert "refused" in result.message.lower() or "connection" in result.message.lower()
    assert took < 1.0
    assert len(queued_ids(sandbox, app)) == 2


def test_bad_certificate_is_never_accepted(sandbox: Sandbox, app: App, ca: object) -> None:
    fill(app, sandbox.env, 2)
    with serving(tls=ca, untrusted=True) as server:
        env = with_destination(sandbox.env, server.url(), SSL_CERT_FILE=str(ca_file(ca, sandbox)))
        result, _took = timed_run(app, env)
        assert not server.received  # the TLS handshake failed: no request was ever sent
    assert result.outcome == "failed"
    assert "certificate" in result.message.lower() or "ssl" in result.message.lower()
    assert len(queued_ids(sandbox, app)) == 2


def test_https_without_the_test_ca_fails(sandbox: Sandbox, app: App, ca: object) -> None:
    fill(app, sandbox.env, 1)
    with serving(tls=ca) as server:
        result, _ = timed_run(app, with_destination(sandbox.env, server.url()))
    assert result.outcome == "failed"
    assert len(queued_ids(sandbox, app)) == 1


def test_https_through_a_connect_proxy(sandbox: Sandbox, app: App, ca: object) -> None:
    # collector.example is never resolved here: only the proxy is asked for it (and maps it to loopback).
    fill(app, sandbox.env, 4)
    with serving(tls=ca) as server:
        proxy = Proxy(("127.0.0.1", server.port))
        try:
            env = with_destination(
                sandbox.env,
                "https://collector.example/v1/batch",
                SSL_CERT_FILE=str(ca_file(ca, sandbox)),
                HTTPS_PROXY=proxy.url(),
            )
            result, _ = timed_run(app, env)
        finally:
            proxy.close()
        assert result.outcome == "delivered", result
        assert proxy.requests == ["CONNECT collector.example:443"]
        assert len(server.event_ids()) == 4


def test_plain_http_to_loopback_never_goes_through_a_forward_proxy(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with serving() as server:
        proxy = Proxy(("127.0.0.1", server.port))
        try:
            url = server.url(host="localhost")
            env = with_destination(sandbox.env, url, http_proxy=proxy.url(), HTTP_PROXY=proxy.url())
            result, _ = timed_run(app, env)
        finally:
            proxy.close()
        assert result.outcome == "delivered", result
        assert proxy.requests == []  # the events would have crossed the proxy in clear text
        assert len(server.event_ids()) == 2


def test_proxy_resolution_honours_no_proxy() -> None:
    env = {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "internal.example,.corp"}
    assert _http.proxy_for("https://collector.example/v1/batch", env) == "http://proxy.example:3128"
    assert _http.proxy_for("https://internal.example/v1/batch", env) is None
    assert _http.proxy_for("https://a.corp/v1/batch", env) is None
    assert _http.proxy_for("http://collector.example/", env) is None  # no HTTP_PROXY
    lower = {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"}
    assert _http.proxy_for("https://x.example/", lower) == "http://lower:1"
    cgi = {"HTTP_PROXY": "http://evil:1", "REQUEST_METHOD": "GET"}
    assert _http.proxy_for("http://x.example/", cgi) is None


# --- delivery semantics --------------------------------------------------------------------------------


def test_partial_success_keeps_exactly_the_unsent_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1100)  # two segments (the hook seals at 256 KiB); batches of at most 500
    ids = queued_ids(sandbox, app)
    with serving("script", script=[200, 500]) as server:
        env = with_destination(sandbox.env, server.url())
        result, _ = timed_run(app, env)
        first = server.event_ids()
    assert result.outcome == "failed"
    assert result.sent == 500
    assert 0 < result.failed <= 500
    assert first[:500] == ids[:500]
    left = queued_ids(sandbox, app)
    assert left == ids[500:]  # order kept, sent ones gone
    assert result.remaining == 600
    for segment in sandbox.state_dir(app).glob("seg-*.jsonl"):
        lines = segment.read_bytes().count(b"\n")
        assert segment.name.endswith(f"-{lines}.jsonl")  # the name still counts its lines
        assert oct(segment.stat().st_mode & 0o777) == "0o600"
    with serving() as server:
        result, _ = timed_run(app, with_destination(sandbox.env, server.url()), ignore_backoff=True)
        assert server.event_ids() == ids[500:]
    assert result.outcome == "delivered"
    assert queued_ids(sandbox, app) == []


def test_corrupt_lines_are_counted_never_sent(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    active = sandbox.state_dir(app) / "spool.jsonl"
    with active.open("ab") as f:
        f.write(b'{"not": "an event"}\n\xff\xfe garbage\n{"schema":1,"event_id":"x"}\n')
    fill(app, sandbox.env, 1)
    ids = queued_ids(sandbox, app)
    with serving() as server:
        result, _ = timed_run(app, with_destination(sandbox.env, server.url()))
        assert sorted(server.event_ids()) == sorted(ids)
    assert result.outcome == "delivered"
    assert result.sent == 3
    assert counters(sandbox, app)["corrupt"] == 3
    assert sandbox.spool_lines(app) == []


def test_corrupt_lines_are_counted_once_when_the_send_fails(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with (sandbox.state_dir(app) / "spool.jsonl").open("ab") as f:
        f.write(b"garbage\n")
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        for _ in range(3):
            timed_run(app, env, ignore_backoff=True)
    finally:
        port.close()
    assert counters(sandbox, app)["corrupt"] == 1
    assert len(queued_ids(sandbox, app)) == 2


def test_duplicate_ids_left_by_a_killed_flusher_are_sent_once_per_run(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 3)
    folder = sandbox.state_dir(app)
    data = (folder / "spool.jsonl").read_bytes()
    (folder / "seg-00000000000000000001-1-3.jsonl").write_bytes(data)  # an older copy of the same events
    os.chmod(folder / "seg-00000000000000000001-1-3.jsonl", 0o600)
    with serving() as server:
        result, _ = timed_run(app, with_destination(sandbox.env, server.url()))
        assert Counter(server.event_ids()).most_common(1)[0][1] == 1
        assert len(server.event_ids()) == 3
    assert result.sent == 3
    assert sandbox.spool_lines(app) == []


def test_events_recorded_during_a_run_leave_in_that_run_up_to_the_round_limit(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20")
        calls: list[tuple[int, int]] = []

        def progress(done: int, total: int) -> None:
            calls.append((done, total))
            fill(app, sandbox.env, 1)  # a command recorded while the flusher sends, in every round

        result, _ = timed_run(app, env, progress=progress)
        rounds = _flush.DRAIN_ROUNDS
        assert (result.outcome, result.sent, result.remaining) == ("delivered", 2 + rounds - 1, 1)
        assert calls == [(2, 2)] + [(1, 1)] * (rounds - 1)
        assert result.message == f"sent {2 + rounds - 1} events to {server.url()} in {rounds} rounds"
        assert len(queued_ids(sandbox, app)) == 1  # recorded during the last round: waits for the next run
        result, _ = timed_run(app, env)
        assert (result.sent, result.message) == (1, f"sent 1 event to {server.url()}")


def test_progress_reports_each_batch(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1001)
    calls: list[tuple[int, int]] = []
    with serving() as server:
        _flush.run(
            app,
            foreground=True,
            environ=with_destination(sandbox.env, server.url()),
            progress=lambda d, t: calls.append((d, t)),
        )
    assert calls[-1] == (1001, 1001)
    assert len(calls) == len(server.received)
    assert [t for _, t in calls] == [1001] * len(calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_ga4_old_events_are_rejected_and_counted(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2, now=time.time() - 4 * 86400)
    fill(app, sandbox.env, 1)
    with serving() as server:
        env = with_destination(sandbox.env, server.url("/mp/collect"), DJANGO_ANALYTICS_TRANSPORT="ga4")
        sandbox.write_user(app, sandbox.user_file(app).read_text() + "measurement_id=G-TEST\napi_secret=hush\n")
        result, _ = timed_run(app, env)
        (request,) = server.received
    assert request.target.endswith("/mp/collect?measurement_id=G-TEST&api_secret=hush")
    assert len(request.json()["events"]) == 1
    assert (result.outcome, result.sent, result.rejected) == ("delivered", 1, 2)
    assert counters(sandbox, app)["rejected"] == 2
    log = "\n".join(_state.read_state(app, environ=env).log_tail)
    assert "72-hour" in log
    assert "hush" not in log


def test_secret_never_reaches_the_log_or_state(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    sandbox.write_user(app, sandbox.user_file(app).read_text() + "measurement_id=G-TEST\napi_secret=hush\n")
    with serving("status", status=500, body=b"api_secret=hush echoed") as server:
        env = with_destination(sandbox.env, server.url("/mp/collect"), DJANGO_ANALYTICS_TRANSPORT="ga4")
        result, _ = timed_run(app, env)
    assert result.outcome == "failed"
    assert "hush" not in result.message
    for path in sandbox.state_dir(app).iterdir():
        if path.is_file():
            assert b"hush" not in path.read_bytes(), path.name


# --- back-off ------------------------------------------------------------------------------------------


def test_backoff_is_recorded_and_honoured(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with serving("status", status=500) as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_BACKOFF_BASE="30")
        before = time.time()
        result = _flush.run(app, foreground=False, environ=env)
        assert result.outcome == "failed"
        state = _state.read_state(app, environ=env)
        assert state.consecutive_failures == 1
        assert state.next_retry is not None
        assert before + 15 <= state.next_retry <= time.time() + 30
        gate = (sandbox.state_dir(app) / "flush.notbefore").stat().st_mtime
        assert abs(gate - state.next_retry) < 1
        # A background run during the back-off sends nothing at all.
        result = _flush.run(app, foreground=False, environ=env)
        assert result.outcome == "failed"
        assert "backing off" in result.message
        assert len(server.received) == 1
        # `flush` (ignore_backoff) sends anyway, and a second failure doubles the back-off.
        result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True)
        assert len(server.received) == 2
        state = _state.read_state(app, environ=env)
        assert state.consecutive_failures == 2
        assert state.next_retry is not None
        assert state.next_retry >= time.time() + 25
    with serving() as server:
        result = _flush.run(
            app, foreground=True, environ=with_destination(sandbox.env, server.url()), ignore_backoff=True
        )
    assert result.outcome == "delivered"
    state = _state.read_state(app, environ=env)
    assert (state.consecutive_failures, state.next_retry, state.last_result) == (0, None, "delivered")


def test_backoff_delay_doubles_with_jitter_and_caps() -> None:
    tune = _settings.Tuning(backoff_base=60, backoff_cap=86400)
    random.seed(1)
    for failures, top in [(1, 60), (2, 120), (3, 240), (11, 61440), (12, 86400), (500, 86400)]:
        for _ in range(20):
            delay = _state.backoff_delay(failures, None, tune)
            assert top / 2 <= delay <= top
    assert _state.backoff_delay(1, 7200, tune) == 7200  # Retry-After honoured beyond the back-off
    assert _state.backoff_delay(1, 10**9, tune) == 86400  # ... and clamped


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("120", 120.0, id="seconds"),
        pytest.param("0", 0.0, id="zero"),
        pytest.param(email.utils.formatdate(1_000_100, usegmt=True), 100.0, id="http-date"),
        pytest.param(email.utils.formatdate(999_000, usegmt=True), 0.0, id="past-date"),
        pytest.param("soon", None, id="garbage"),
        pytest.param("-5", None, id="negative"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert _http.parse_retry_after(value, 1_000_000.0) == expected


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "date"])
def test_retry_after_sets_the_next_retry(sandbox: Sandbox, app: App, status: int, form: str) -> None:
    fill(app, sandbox.env, 1)
    value = "40" if form == "seconds" else email.utils.formatdate(time.time() + 40, usegmt=True)
    with serving("status", status=status, retry_after=value) as server:
        env = with_destination(sandbox.env, server.url())  # back-off base 0.5 s: Retry-After dominates
        start = time.time()
        result, _ = timed_run(app, env)
    assert result.outcome == "failed"
    state = _state.read_state(app, environ=env)
    assert state.next_retry is not None
    assert start + 38 <= state.next_retry <= time.time() + 41


# --- consent, endpoint, busy ---------------------------------------------------------------------------


def test_hard_off_purges_and_sends_nothing(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 3)
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), DJANGO_NO_ANALYTICS="1")
        result = _flush.run(app, foreground=True, environ=env)
        assert not server.received
    assert (result.outcome, result.purged) == ("disabled", 3)
    assert sandbox.spool_lines(app) == []


def test_soft_off_keeps_events_and_sends_nothing(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 3)
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), CI="true")
        result = _flush.run(app, foreground=True, environ=env)
        assert not server.received
    assert (result.outcome, result.purged) == ("disabled", 0)
    assert len(sandbox.spool_lines(app)) == 3


def test_no_endpoint_keeps_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    result = _flush.run(app, foreground=True, environ=sandbox.env)
    assert result.outcome == "invalid-endpoint"
    assert result.remaining == 2
    assert result.message.startswith("the destination is invalid: the endpoint ")
    assert "DJANGO_ANALYTICS_ENDPOINT" in result.message
    bad = _flush.run(app, foreground=True, environ={**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "http://example.com/"})
    assert bad.outcome == "invalid-endpoint"
    assert "https" in bad.message


def test_unusable_endpoint_holds_background_flushers_back(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    env = {**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "http://example.com/v1/batch"}  # remote plain http
    assert _flush.run(app, foreground=True, environ=env).outcome == "invalid-endpoint"
    assert not (sandbox.state_dir(app) / "flush.notbefore").exists()
    assert not (sandbox.state_dir(app) / "flush.log").exists()  # `flush` prints it; nothing to log
    before = time.time()
    assert _flush.run(app, foreground=False, environ=env).outcome == "invalid-endpoint"
    gate = (sandbox.state_dir(app) / "flush.notbefore").stat().st_mtime
    assert before + 3500 < gate < time.time() + 3601
    # The background run says why in its log, once per hour it holds the next one back.
    (line,) = (sandbox.state_dir(app) / "flush.log").read_text().splitlines()
    assert " invalid-endpoint: the endpoint 'http://example.com/v1/batch' is plain http:// to example.com" in line
    assert line.endswith(f"(from DJANGO_ANALYTICS_ENDPOINT); kept 1; next try after {iso_time(gate)}")


def test_nothing_queued(sandbox: Sandbox, app: App) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        assert _flush.run(app, foreground=True, environ=env).outcome == "nothing"
        fill(app, sandbox.env, 1)
        assert _flush.run(app, foreground=True, environ=env).outcome == "delivered"
        assert _flush.run(app, foreground=True, environ=env).outcome == "nothing"
        assert len(server.received) == 1


def test_one_flusher_at_a_time(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    held = filelock.FileLock(str(sandbox.state_dir(app) / "flusher.lock"), thread_local=False)
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        with held:
            assert _flush.run(app, foreground=False, environ=env).outcome == "busy"
            assert not server.received
            # The foreground waits (bounded) for the running flusher instead.
            timer = threading.Timer(0.3, held.release)
            timer.start()
            result = _flush.run(app, foreground=True, environ=env)
            timer.join()
        assert result.outcome == "delivered"


@pytest.mark.serial
def test_spool_lock_held_forever_is_busy_not_a_hang(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        with filelock.FileLock(str(sandbox.state_dir(app) / "spool.lock")):
            result, took = timed_run(app, env)
        assert result.outcome == "busy"
        assert took < _round.SPOOL_LOCK_TIMEOUT + SLACK
        assert not server.received


# --- plan (dry run) and state --------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[int, float, bytes]]:
    return {p.name: (p.stat().st_mode, p.stat().st_mtime, p.read_bytes()) for p in sorted(folder.iterdir())}


def test_plan_changes_nothing_and_shows_the_requests(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 30)
    sandbox.write_user(app, sandbox.user_file(app).read_text() + "measurement_id=G-TEST\napi_secret=hush\n")
    env = with_destination(sandbox.env, "https://www.google-analytics.com/mp/collect", DJANGO_ANALYTICS_TRANSPORT="ga4")
    before = snapshot(sandbox.state_dir(app))
    got = _plan.plan(app, environ=env)
    assert snapshot(sandbox.state_dir(app)) == before
    assert not (sandbox.state_dir(app) / "flusher.lock").exists()
    assert got.reason is None
    assert len(got.events) == 30
    assert [len(r.event_ids) for r in got.requests] == [25, 5]
    first = got.requests[0]
    assert first.method == "POST"
    assert first.url_redacted.endswith("api_secret=REDACTED")
    assert b"hush" not in first.body
    assert json.loads(first.body)["client_id"] == got.events[0]["client_id"]


def test_plan_of_a_missing_spool_creates_nothing(sandbox: Sandbox, app: App) -> None:
    got = _plan.plan(app, environ=with_destination(sandbox.env, "http://127.0.0.1:9/v1/batch"))
    assert (got.events, got.requests, got.reason) == ([], [], None)
    assert not (sandbox.home / "state").exists()
    got = _plan.plan(app, environ=sandbox.env)
    assert got.reason is not None
    assert "DJANGO_ANALYTICS_ENDPOINT" in got.reason


def test_plan_when_disabled(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    got = _plan.plan(app, environ=with_destination(sandbox.env, "http://127.0.0.1:9/v1/batch", DO_NOT_TRACK="1"))
    assert len(got.events) == 2
    assert got.requests == []
    assert got.reason is not None
    assert "deleted" in got.reason
    assert len(sandbox.spool_lines(app)) == 2


def test_plan_matches_what_is_sent(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 700)
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        planned = _plan.plan(app, environ=env)
        _flush.run(app, foreground=True, environ=env)
        assert [r.body for r in planned.requests] == [r.body for r in server.received]


def test_read_state_of_nothing(sandbox: Sandbox, app: App) -> None:
    state = _state.read_state(app, environ=sandbox.env)
    assert state == _state.FlushState()
    assert not (sandbox.home / "state").exists()


def test_log_is_bounded(sandbox: Sandbox, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_state, "LOG_FILE_BYTES", 1000)
    fill(app, sandbox.env, 1)
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        for _ in range(30):
            _flush.run(app, foreground=True, environ=env, ignore_backoff=True)
    finally:
        port.close()
    folder = sandbox.state_dir(app)
    assert (folder / "flush.log").stat().st_size <= 1000
    assert (folder / "flush.log.1").stat().st_size <= 1000
    tail = _state.read_state(app, environ=env).log_tail
    assert 0 < len(tail) <= _state.LOG_TAIL_LINES
    assert all("failed" in line for line in tail)
    for name in ("flush.log", "flush.log.1", "state.json", "flush.notbefore", "flusher.lock"):
        assert oct((folder / name).stat().st_mode & 0o777) == "0o600", name


def test_state_files_are_never_followed_through_symlinks(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    fill(app, sandbox.env, 1)
    target = tmp_path / "victim"
    target.write_text("precious")
    folder = sandbox.state_dir(app)
    for name in ("flush.log", "flush.notbefore"):
        (folder / name).symlink_to(target)
    port = RefusedPort()
    try:
        _flush.run(app, foreground=True, environ=with_destination(sandbox.env, port.url()))
    finally:
        port.close()
    assert target.read_text() == "precious"


def test_wait_for_is_bounded() -> None:
    with pytest.raises(AssertionError):
        wait_for(lambda: False, timeout=0.05)


def test_server_helpers_only_bind_loopback() -> None:
    server = Server()
    try:
        assert server.sock.getsockname()[0] == "127.0.0.1"
    finally:
        server.close()


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX symlinks")
def test_unusable_spool_folder_is_an_outcome_not_an_exception(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    folder = sandbox.state_dir(app)
    elsewhere = folder.parent / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)  # planted: never followed
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        for foreground in (True, False):
            result = _flush.run(app, foreground=foreground, environ=env)
            assert result.outcome == "unusable-folder"
            assert result.message.startswith("cannot use the spool folder")
            assert result.message.count(str(folder)) == 1  # the path, once
        assert _plan.plan(app, environ=env).events == []
        assert not server.received
    kept = sorted(p.name for p in elsewhere.iterdir() if not p.name.startswith(".verified-"))  # made by fill()
    assert kept == ["spool.jsonl", "spool.lock"]
