"""A destination that retires itself: any ``410 Gone`` stops the flusher for good (issue 31).

Real loopback destinations answer 410 to each transport (``json``, ``ga4``, ``ua``): the real detached flusher that
the hook starts deletes the queue, records the endpoint in the user file's ``retired=``, and from then on nothing
is recorded and no flusher starts while it stays the destination; ``status`` and ``flush`` say so. Another
destination (the environment, ``enable --endpoint``, the user file) starts afresh and shows the notice again. The
collector's side (``serve --retired``) is ``tests/collector/test_collector_retired.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

import pytest

from spool_reporter import App, _flush, _hook, _state
from spool_reporter._redact import redact_url

from support.commands import cli, count_starts, flusher_idle, unnamed
from support.polling import wait_for
from support.sandbox import Sandbox, run_py
from support.servers import fill, serving, with_destination

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process semantics (flock, the detached flusher)")

GONE_BODY = b'{"retired": true, "message": "send nothing more"}'
API_SECRET = "hush-410-probe"  # GA4's secret: never in the log, the state or a message

TRANSPORTS = [
    pytest.param("json", "/v1/batch", "", id="json"),
    pytest.param("ga4", "/mp/collect", f"measurement_id=G-RETIRE410\napi_secret={API_SECRET}\n", id="ga4"),
    pytest.param("ua", "/batch", "tracking_id=UA-12345-6\n", id="ua"),
]
"""Each transport, the path its requests go to, and the user file's credentials it needs."""

NOTICE_HEAD = "usage reporting is on"
"""A piece of the first-run notice (``_firstrun.notice_text``)."""


def user_values(sandbox: Sandbox, app: App) -> dict[str, str]:
    values = _hook.parse(sandbox.user_file(app).read_bytes())
    assert values is not None
    return values


def utc_days(before: float) -> set[str]:
    """The UTC dates between ``before`` and now (two when the test ran across midnight)."""
    return {time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (before, time.time())}


def reporting_line(sandbox: Sandbox, env: dict[str, str]) -> str:
    done = cli(sandbox, "status", env=env)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("reporting:")]
    return line


@pytest.mark.parametrize(("transport", "path", "credentials"), TRANSPORTS)
def test_a_410_retires_the_destination_for_every_transport(
    sandbox: Sandbox,
    app: App,
    transport: str,
    path: str,
    credentials: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The hook starts the real flusher; the destination answers its first request 410. The run stops there (30
    events are two requests for ga4 and ua, one for json: only one is made), deletes every queued event, records
    the endpoint as retired, and from then on a reported command records nothing and starts no flusher."""
    starts = count_starts(monkeypatch)
    before = time.time()
    sandbox.write_user(app, credentials)
    fill(app, sandbox.env, 29)  # queued under another (refused) endpoint: no flusher yet
    with serving("status", status=410, body=GONE_BODY) as server:
        url = server.url(path)
        env = with_destination(sandbox.env, url, DJANGO_ANALYTICS_TRANSPORT=transport)
        assert _hook.record_event("startproject", app=app, environ=env, notice=True)
        assert NOTICE_HEAD in capsys.readouterr().err  # the first notice, seen once
        assert len(starts) == 1
        wait_for(
            lambda: _state.read_state(app, environ=env).last_result == "retired", timeout=20, what="the 410 to land"
        )
        wait_for(lambda: flusher_idle(sandbox, app), timeout=15, what="the flusher to exit")
        assert len(server.received) == 1  # stopped at the first 410
        assert sandbox.spool_lines(app) == []  # every queued event deleted
        values = user_values(sandbox, app)
        assert values["retired"] == url  # the endpoint as named: ga4's query (its secret) is not part of it
        assert values["retired_on"] in utc_days(before)
        assert values["notice_version"] == "0"  # another destination shows the notice again
        log = "\n".join(_state.read_state(app, environ=env).log_tail)
        assert f"retired: the destination {redact_url(server.url(path))}" in log
        assert "retired itself (HTTP 410 Gone); deleted 30 queued events;" in log
        for name in ("flush.log", "state.json"):
            assert API_SECRET not in (sandbox.state_dir(app) / name).read_text()

        status = cli(sandbox, "status", env=env).stdout
        assert "next retry:    none (the destination retired itself: nothing is sent to it)\n" in status
        line = reporting_line(sandbox, env)
        assert line == (
            f"reporting:     off - {url} retired itself on {values['retired_on']} (HTTP 410) [destination:retired]"
        )

        # The next reported command, in this process (its spawn counted) and in a real one: nothing recorded, no
        # notice, no flusher, no request.
        assert not _hook.record_event("startproject", app=app, environ=env, notice=True)
        code = "from spool_reporter import record\nfrom spool_reporter._hook import django_app\n"
        code += 'print(record("startproject", app=django_app("5.2"), notice=True))\n'
        done = run_py(code, env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "False\n", "")
        assert capsys.readouterr().err == ""
        assert len(starts) == 1
        assert sandbox.spool_lines(app) == []
        assert len(server.received) == 1
        assert flusher_idle(sandbox, app)


def test_flush_in_the_foreground_says_it_and_keeps_what_was_sent_before(sandbox: Sandbox, app: App) -> None:
    """``django-spool flush``: the first batch of 500 is taken (2xx), the second answered 410; the summary and the
    sentence say what happened, and a second ``flush`` says reporting is off and why."""
    fill(app, sandbox.env, 600)
    with serving("script", script=[200, 410]) as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="10")
        done = cli(sandbox, "flush", env=env)
        assert len(server.received) == 2
    assert done.returncode == 0, done.stderr  # nothing is left to send
    assert done.stdout == (
        "retired: sent 500, rejected 0, failed 0, still queued 0, deleted 100\n"
        f"The destination {server.url()} retired itself (HTTP 410 Gone); sent 500 events before it; deleted 100 "
        f"queued events; nothing more is recorded or sent while it stays the destination (retired= in "
        f"{sandbox.user_file(app)}); configuring another destination starts afresh.\n"
    )
    assert [len(r.json()["events"]) for r in server.received] == [500, 100]
    assert sandbox.spool_lines(app) == []
    again = cli(sandbox, "flush", env=env)
    assert f"Reporting is off: {server.url()} retired itself on " in again.stdout
    dry = cli(sandbox, "flush", "--dry-run", env=env)
    assert f"{server.url()} retired itself on " in dry.stdout
    assert "queued events would be deleted" in dry.stdout


@pytest.mark.parametrize("how", ["environment", "enable --endpoint", "user file"])
def test_another_destination_starts_afresh_and_shows_the_notice_again(
    sandbox: Sandbox, app: App, how: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    starts = count_starts(monkeypatch)
    # The first command shows the notice (the sandbox's destination is refused: no flusher starts).
    assert _hook.record_event("startproject", app=app, environ=sandbox.env, notice=True)
    assert NOTICE_HEAD in capsys.readouterr().err
    assert _hook.record_event("startproject", app=app, environ=sandbox.env, notice=True)
    assert capsys.readouterr().err == ""  # once
    fill(app, sandbox.env, 3)
    with serving("status", status=410, body=GONE_BODY) as gone:
        old = with_destination(sandbox.env, gone.url())
        assert _flush.run(app, foreground=True, environ=old).outcome == "retired"
    assert not _hook.record_event("startproject", app=app, environ=old, notice=True)
    with serving() as server:
        tuning = {k: v for k, v in with_destination(sandbox.env, server.url()).items() if k.startswith("SPOOL_")}
        if how == "environment":
            env = with_destination(sandbox.env, server.url())
        else:
            env = unnamed(sandbox, **tuning)
            if how == "enable --endpoint":
                done = cli(sandbox, "enable", "--endpoint", server.url(), env=env)
                assert done.returncode == 0, done.stdout + done.stderr
            else:
                path = sandbox.user_file(app)
                path.write_text(path.read_text() + f"endpoint={server.url()}\n")
        assert reporting_line(sandbox, env).startswith("reporting:     on - ")
        assert _hook.record_event("startproject", app=app, environ=env, notice=True)
        assert NOTICE_HEAD in capsys.readouterr().err  # shown again: where events go changed
        assert len(starts) == 1
        wait_for(lambda: len(server.event_ids()) == 1, timeout=20, what="the new destination to receive the event")
        wait_for(lambda: flusher_idle(sandbox, app), timeout=15, what="the flusher to exit")
    values = user_values(sandbox, app)
    assert values["retired"] == gone.url()  # the old one stays retired
    assert reporting_line(sandbox, old).endswith("(HTTP 410) [destination:retired]")


def test_a_user_file_that_cannot_be_changed_still_stops_and_deletes(sandbox: Sandbox, app: App) -> None:
    """Another process holds the config file's lock for longer than ``update`` waits: the queue goes anyway, the
    message says the destination could not be recorded as retired, and the next background flusher waits."""
    fill(app, sandbox.env, 4)
    fd = os.open(sandbox.user_file(app), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with serving("status", status=410, body=GONE_BODY) as server:
            env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="10")
            done = cli(sandbox, "flush", env=env)
    finally:
        os.close(fd)
    assert done.stdout.splitlines()[0] == "retired: sent 0, rejected 0, failed 0, still queued 0, deleted 4"
    assert "retired itself (HTTP 410 Gone); deleted 4 queued events; but it could not be recorded" in done.stdout
    assert "is locked by another process" in done.stdout
    assert sandbox.spool_lines(app) == []
    assert "retired" not in user_values(sandbox, app)
    gate = (sandbox.state_dir(app) / _hook.GATE_NAME).stat().st_mtime
    assert gate > time.time() + 60  # no flusher for a while: it would be answered 410 again


def test_retired_keeps_the_last_destinations_once_each() -> None:
    user = {"retired": " ".join(f"https://c{i}.example/v1/batch" for i in range(8))}
    out = _flush.retired_list(user, "https://c3.example/v1/batch").split()
    assert out[-1] == "https://c3.example/v1/batch"
    assert len(out) == 8
    assert out.count("https://c3.example/v1/batch") == 1
    new = _flush.retired_list(user, "https://new.example/v1/batch").split()
    assert new == [*user["retired"].split()[1:], "https://new.example/v1/batch"]
    long = "https://x.example/" + "a" * 2040
    assert _flush.retired_list({"retired": f"{long}1 {long}2 {long}3"}, "https://y.example/").split() == [
        f"{long}3",
        "https://y.example/",
    ]
    assert json.dumps(_flush.retired_list(None, "https://z.example/")) == '"https://z.example/"'
