"""``disable``'s forget (``spool_reporter/_withdraw.py``): left to a detached run, never waited for, retried with a
back-off for at most 30 days, recorded in ``sent``; the id kept only until the collector confirms. Real
``django-spool`` processes, real detached runs, a real collector (in-process server) or scripted servers on
loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter import App, _flush, _spawn, _withdraw
from spool_reporter._hook import FORGET_PENDING_NAME, record_event
from spool_reporter.collector import serve

from support.commands import cli, flusher_idle
from support.polling import wait_for
from support.servers import RefusedPort, Server, fill, serving, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(120)

SLOW: dict[str, str] = {"SPOOL_REPORTER_FLUSH_DEADLINE": "10", "SPOOL_REPORTER_CONNECT_TIMEOUT": "2"}
"""Room for a detached run's interpreter to start on a busy machine; the hung cases shorten it again."""


def client_id(sandbox: Sandbox, app: App) -> str | None:
    found = re.findall(r"^client_id=(.*)$", sandbox.user_file(app).read_text(), re.MULTILINE)
    return found[-1] if found else None


def pending(sandbox: Sandbox, app: App) -> Path:
    return sandbox.state_dir(app) / FORGET_PENDING_NAME


def delivered(sandbox: Sandbox, app: App) -> None:
    """Wait (bounded) until the detached run has settled: no record, no flusher."""
    wait_for(lambda: not pending(sandbox, app).exists() and flusher_idle(sandbox, app), timeout=60, what="the forget")


def settled_after_failure(sandbox: Sandbox, app: App) -> dict[str, object]:
    """Wait (bounded) until the detached run gave up this try: the record's back-off ahead, no flusher."""
    path = pending(sandbox, app)
    wait_for(
        lambda: flusher_idle(sandbox, app) and json.loads(path.read_text()).get("attempts", 0) >= 1,
        timeout=60,
        what="the failed try",
    )
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


@contextlib.contextmanager
def forget_waiting(sandbox: Sandbox, app: App) -> Iterator[tuple[RefusedPort, dict[str, str], str, dict[str, object]]]:
    """A user with a client id ran ``disable`` while the collector refused connections: the forget's first try
    failed and waits. Yields the port (``serve`` it to answer), the environment, the id and the record; closes the
    port at the end."""
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url(), **SLOW)
        fill(app, env, 1)
        old = client_id(sandbox, app)
        assert old is not None
        assert cli(sandbox, "disable", env=env).returncode == 0
        yield port, env, old, settled_after_failure(sandbox, app)
    finally:
        port.close()


def sent_events(sandbox: Sandbox, app: App, env: dict[str, str], count: int = 3) -> str:
    fill(app, env, count)
    result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True)
    assert (result.outcome, result.sent) == ("delivered", count), result.message
    cid = client_id(sandbox, app)
    assert cid is not None
    return cid


def test_disable_forgets_at_the_collector_through_a_detached_run(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    with serve(str(tmp_path / "c.sqlite3")) as collector:
        env = with_destination(sandbox.env, collector.url, **SLOW)
        old = sent_events(sandbox, app, env)
        fill(app, env, 2)  # queued, never sent
        done = cli(sandbox, "disable", env=env)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        url = collector.url.replace("/batch", "/forget")
        assert done.stdout.splitlines()[1:] == [
            "Deleted 2 queued events and the record of what was sent.",
            f"Asking {url} to forget client id {old[:8]}...: a background process sends that one request now, and "
            "tries again for up to 30 days if it fails; the id is deleted from this machine once the collector "
            "confirms. See it with 'django-spool status'.",
        ]
        delivered(sandbox, app)
        assert collector.app.store.count() == (0, 0)
    assert client_id(sandbox, app) is None  # kept only until the collector confirmed
    assert "disable=1" in sandbox.user_file(app).read_text()
    # Recorded in `sent`, with only the id's first characters: the record outlives the id.
    shown = json.loads(cli(sandbox, "sent", "--json", env=env).stdout)["requests"]
    assert [(r["method"], r["destination"], r["status"], r["events"]) for r in shown] == [("POST", url, 200, 0)]
    assert json.loads(shown[0]["body"]) == {"client_id": f"{old[:8]}..."}
    assert all(old not in p.read_text(errors="replace") for p in sandbox.home.rglob("*") if p.is_file())
    status = cli(sandbox, "status", env=env).stdout
    assert "forget:" not in status


def test_the_only_request_after_disable_is_the_forget(sandbox: Sandbox, app: App) -> None:
    """What "disabled: nothing leaves the machine" still means: after `disable`, one request leaves, the forget,
    once; commands recorded afterwards send nothing (they find nothing to send and no forget to retry)."""
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), **SLOW)
        old = sent_events(sandbox, app, env, 2)
        before = len(server.received)
        assert cli(sandbox, "disable", env=env).returncode == 0
        delivered(sandbox, app)
        for _ in range(5):
            assert not record_event("startproject", app=app, environ=env)
        assert flusher_idle(sandbox, app)
        after = server.received[before:]
        assert [(r.method, r.target) for r in after] == [("POST", "/v1/forget")]
        assert after[0].json() == {"client_id": old}
        assert not pending(sandbox, app).exists()
        assert sandbox.spool_lines(app) == []


def test_a_hung_destination_never_holds_disable_up(sandbox: Sandbox, app: App) -> None:
    with serving("silent") as server:
        env = with_destination(
            sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="3", SPOOL_REPORTER_BACKOFF_BASE="60"
        )
        fill(app, env, 1)
        old = client_id(sandbox, app)
        assert old is not None
        started = time.monotonic()
        done = cli(sandbox, "disable", env=env)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert took < 3, took  # the forget's deadline is 3 s: `disable` did not wait for any of it
        doc = settled_after_failure(sandbox, app)
        assert server.received, "the detached run sent the forget"
    assert doc["attempts"] == 1
    assert [e["client_id"] for e in doc["entries"]] == [old]
    assert pending(sandbox, app).stat().st_mtime > time.time()  # the back-off, the hook's gate
    assert client_id(sandbox, app) == old  # kept until delivered
    status = cli(sandbox, "status", env=env).stdout
    (line,) = [s for s in status.splitlines() if s.startswith("forget:") and "pending since" in s]
    assert f"forget of {old[:8]}... pending since " in line
    assert ", next try 20" in line
    doc = json.loads(cli(sandbox, "status", "--json", env=env).stdout)
    assert doc["forget_pending"][0]["client_id"] == f"{old[:8]}..."
    assert doc["forget_pending"][0]["attempts"] == 1
    # The hook, with reporting off, does not start another run while the back-off holds.
    assert not _spawn.start_forget_if_due(app, env)


def test_keep_remote_asks_nothing_and_keeps_the_id(sandbox: Sandbox, app: App) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        done = cli(sandbox, "disable", "--keep-remote", env=env)
        assert done.returncode == 0
        assert done.stdout.endswith(
            "The collector was not asked to forget your client id (--keep-remote); the id is kept.\n"
        )
        assert not pending(sandbox, app).exists()
        assert flusher_idle(sandbox, app)
        assert server.received == []
    assert client_id(sandbox, app) == old


@pytest.mark.parametrize(
    ("settings", "starts"),
    [
        pytest.param(
            "endpoint=https://www.google-analytics.com/mp/collect\ntransport=ga4\nmeasurement_id=G-T\n"
            "api_secret=sEcReT9\n",
            "GA4 cannot delete events through the Measurement Protocol",
            id="ga4",
        ),
        pytest.param(
            "endpoint=https://www.google-analytics.com/batch\ntransport=ua\ntracking_id=UA-1-1\n",
            "Universal Analytics (retired by Google in July 2023) cannot delete events",
            id="ua",
        ),
    ],
)
def test_google_cannot_forget_and_the_id_goes_at_once(sandbox: Sandbox, app: App, settings: str, starts: str) -> None:
    env = {k: v for k, v in sandbox.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}
    sandbox.write_user(app, settings)
    fill(app, sandbox.env, 1)
    old = client_id(sandbox, app)
    done = cli(sandbox, "disable", env=env)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith(starts)
    assert "User Deletion API" in last
    assert last.endswith(f"Your old client id {old} is deleted from this machine.")  # for the property's owner
    assert "sEcReT9" not in done.stdout
    assert client_id(sandbox, app) is None
    assert not pending(sandbox, app).exists()
    assert flusher_idle(sandbox, app)  # nothing started: nothing is sent to Google


def test_no_valid_destination_keeps_the_id_for_forget(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)  # the sandbox's destination is plain http to a remote host: refused
    old = client_id(sandbox, app)
    done = cli(sandbox, "disable")
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1].startswith("No valid destination is configured (")
    assert done.stdout.endswith("your client id is kept, so that 'django-spool forget' can ask once there is one.\n")
    assert client_id(sandbox, app) == old
    assert not pending(sandbox, app).exists()


@pytest.mark.parametrize("switch", ["DJANGO_NO_ANALYTICS", "DO_NOT_TRACK"])
def test_the_local_switches_hold_the_forget_and_never_schedule_one(sandbox: Sandbox, app: App, switch: str) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), **SLOW)
        old = sent_events(sandbox, app, env, 1)
        before = len(server.received)
        # Setting the variable is no withdrawal: a command under it deletes the queue, asks nothing.
        fill(app, env, 1)
        assert not record_event("startproject", app=app, environ={**env, switch: "1"})
        assert not pending(sandbox, app).exists()
        # `disable` run under it schedules the forget, but its detached run (same environment) sends nothing.
        done = cli(sandbox, "disable", env={**env, switch: "1"})
        assert done.returncode == 0
        wait_for(lambda: flusher_idle(sandbox, app), timeout=30, what="the held run")
        assert pending(sandbox, app).exists()
        assert len(server.received) == before
        # Nor does a command under the variable retry it.
        assert not record_event("startproject", app=app, environ={**env, switch: "1"})
        assert flusher_idle(sandbox, app)
        assert len(server.received) == before
        # The next command without it starts the run that sends it.
        assert not record_event("startproject", app=app, environ=env)
        delivered(sandbox, app)
        assert [r.target for r in server.received[before:]] == ["/v1/forget"]
    assert client_id(sandbox, app) is None
    assert old


def test_enable_before_delivery_takes_a_new_id_and_keeps_forgetting_the_old(sandbox: Sandbox, app: App) -> None:
    with forget_waiting(sandbox, app) as (port, env, old, _):
        enabled = cli(sandbox, "enable", env=env)
        assert enabled.returncode == 0, enabled.stderr
        assert f"Your old client id {old[:8]}... is still being forgotten" in enabled.stdout
        new = client_id(sandbox, app)
        assert new is not None
        assert new != old
        # A second disable now: both ids wait, each once.
        assert cli(sandbox, "disable", env=env).returncode == 0
        wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the failed run")
        held = _withdraw.read(app, env)
        assert held is not None
        assert [e.client_id for e in held.entries] == [old, new]
        server = port.serve("healthy")
        try:
            forgot = cli(sandbox, "forget", env=env)  # sends what is pending, now, in the foreground
            assert forgot.returncode == 0, (forgot.stdout, forgot.stderr)
            assert sorted(r.json()["client_id"] for r in server.received) == sorted([old, new])
        finally:
            server.close()
    assert forgot.stdout.count("Forgotten at the collector: client id ") == 2
    assert client_id(sandbox, app) is None
    assert _withdraw.read(app, env) is None


def test_disable_twice_keeps_one_record_and_tries_again(sandbox: Sandbox, app: App) -> None:
    with forget_waiting(sandbox, app) as (_, env, old, first):
        again = cli(sandbox, "disable", env=env)
        assert again.returncode == 0
        assert f"The forget of client id {old[:8]}..., pending since " in again.stdout
        assert again.stdout.endswith(", is tried again now.\n")
        wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the second run")
        doc = json.loads(pending(sandbox, app).read_text())
    assert doc["entries"] == first["entries"]  # the same id, the same first try: the 30 days still count from it
    assert client_id(sandbox, app) == old


def test_reset_id_keeps_forgetting_the_old_one(sandbox: Sandbox, app: App) -> None:
    with forget_waiting(sandbox, app) as (port, env, old, _):
        reset = cli(sandbox, "reset-id", env=env)
        assert reset.returncode == 0
        assert reset.stdout.endswith(
            f"The forget of the old id {str(old)[:8]}... that 'disable' asked for stays pending.\n"
        )
        new = client_id(sandbox, app)
        assert new not in (None, old)
        server = port.serve("healthy")
        try:
            os.utime(pending(sandbox, app), (time.time() - 1, time.time() - 1))  # the back-off is over
            assert not record_event("startproject", app=app, environ=env)  # the hook's retry
            delivered(sandbox, app)
            assert [r.json() for r in server.received] == [{"client_id": old}]
        finally:
            server.close()
    assert client_id(sandbox, app) == new  # only the forgotten id is deleted


def test_a_forget_is_given_up_after_30_days(sandbox: Sandbox, app: App) -> None:
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        assert old is not None
        _withdraw.schedule(app, env, old, port.url("/v1/forget"))
        result = _withdraw.run(app, env, deadline=time.monotonic() + 2)
        assert (result.outcome, result.kept) == ("failed", (old,))
        path = pending(sandbox, app)
        doc = json.loads(path.read_text())
        doc["entries"][0]["since"] = time.time() - _withdraw.GIVE_UP_AFTER - 60
        path.write_text(json.dumps(doc))
        os.utime(path, (time.time() - 1, time.time() - 1))
        result = _withdraw.run(app, env, deadline=time.monotonic() + 2)
    finally:
        port.close()
    assert (result.outcome, result.given_up) == ("delivered", (old,))
    assert not path.exists()
    assert client_id(sandbox, app) is None
    assert "gave up the forget of" in (sandbox.state_dir(app) / "flush.log").read_text()


@pytest.mark.parametrize(("status", "kept"), [(503, True), (400, True), (410, False)])
def test_what_each_answer_does(sandbox: Sandbox, app: App, status: int, kept: bool) -> None:
    """A refusal is retried (within the 30 days); ``410 Gone``, a destination that retired itself, ends it."""
    with Server("status", status=status, body=b"no") as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        assert old is not None
        _withdraw.schedule(app, env, old, server.url("/v1/forget"))
        result = _withdraw.run(app, env, deadline=time.monotonic() + 2)
    assert pending(sandbox, app).exists() is kept
    assert (client_id(sandbox, app) == old) is kept
    assert result.outcome == ("failed" if kept else "delivered")


def test_a_damaged_or_planted_record_sends_nothing(sandbox: Sandbox, app: App) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, env, 1)
        path = pending(sandbox, app)
        cid = client_id(sandbox, app)
        for text in (
            "not json",
            json.dumps({"entries": [{"client_id": cid, "url": "http://evil.example/", "since": 1}]}),
        ):
            path.write_text(text)
            assert _withdraw.run(app, env, deadline=time.monotonic() + 2).outcome == "nothing"
            assert not path.exists()
        # A symbolic link planted at the name, to a valid record elsewhere: never followed, never sent to.
        elsewhere = sandbox.root / "elsewhere.json"
        record = {"entries": [{"client_id": cid, "url": server.url("/v1/forget"), "since": time.time()}]}
        elsewhere.write_text(json.dumps(record))
        path.symlink_to(elsewhere)
        assert not _spawn.start_forget_if_due(app, env)  # the gate is a regular file's mtime only
        assert _withdraw.read(app, env) is None
        assert _withdraw.run(app, env, deadline=time.monotonic() + 2).outcome == "nothing"
        assert not path.is_symlink()
        assert elsewhere.exists()
        assert server.received == []


def test_forget_under_a_local_switch_says_the_pending_one_waits(sandbox: Sandbox, app: App) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, env, 1)
        old = client_id(sandbox, app)
        assert old is not None
        _withdraw.schedule(app, env, old, server.url("/v1/forget"))
        done = cli(sandbox, "forget", env={**env, "DO_NOT_TRACK": "1"})
        assert done.returncode == 1
        assert done.stdout.startswith("The pending forget was not sent (")
        assert "DO_NOT_TRACK" in done.stdout
        assert server.received == []
        # A system policy's "no" holds it too, and a hook under it starts no run.
        sandbox.write_policy(app, "disable=1\n")
        assert not record_event("startproject", app=app, environ=env)
        assert flusher_idle(sandbox, app)
        assert server.received == []
    assert pending(sandbox, app).exists()
    assert client_id(sandbox, app) == old


def test_the_forget_run_is_the_flushers_command_line_with_one_flag(app: App) -> None:
    plain = _spawn.flusher_args(app, "/usr/bin/python3", safe_path=True)
    forget = _spawn.flusher_args(app, "/usr/bin/python3", safe_path=True, forget=True)
    assert forget == [*plain, "--forget"]
    spec = _spawn.spawn_spec(app, executable="python", environ={}, cwd=None, windows=False, forget=True)
    assert spec.args[-1] == "--forget"
