"""The flusher as a real process: a DNS look-up that never returns, the watchdog, ``kill -9`` at the worst
moments, the offline laptop, and reporting switched off (no socket, no process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from spool_reporter import App, _detached, _flush, _hook, _state

from support.commands import count_starts, flusher_idle
from support.polling import wait_for
from support.sandbox import Sandbox
from support.servers import RefusedPort, fill, serving, with_destination

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process semantics (kill -9, /proc)")

FLUSHER = [sys.executable, "-m", "spool_reporter._detached", "--app", "django"]


def queued_ids(sandbox: Sandbox, app: App) -> list[str]:
    return [json.loads(line)["event_id"] for line in sandbox.spool_lines(app)]


def start_flusher(env: dict[str, str], prelude: str = "") -> subprocess.Popen[bytes]:
    """``python -m spool_reporter._detached --app django``, optionally after ``prelude`` (a patch)."""
    env = {**env, _hook.FLUSHER_ENV: "1"}
    if not prelude:
        return subprocess.Popen(FLUSHER, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    code = prelude + "\nimport runpy, sys\nsys.argv = ['_flush', '--app', 'django']\n"
    code += "runpy.run_module('spool_reporter._detached', run_name='__main__', alter_sys=True)\n"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    start = time.monotonic()
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, time.monotonic() - start


HANGING_DNS = textwrap.dedent(
    """
    import socket, threading
    _real = socket.getaddrinfo
    def getaddrinfo(host, *args, **kwargs):
        if host == "never-resolves.example":
            threading.Event().wait()  # a resolver that never answers
        return _real(host, *args, **kwargs)
    socket.getaddrinfo = getaddrinfo
    """
)


@pytest.mark.serial
def test_dns_that_never_returns_is_bounded_by_the_deadline(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 3)
    env = with_destination(sandbox.env, "https://never-resolves.example/v1/batch", SPOOL_REPORTER_FLUSH_DEADLINE="1")
    start = time.monotonic()
    code, _ = finish(start_flusher(env, HANGING_DNS), timeout=15)
    took = time.monotonic() - start
    assert code == 2  # a failed run, ended by the deadline (not by the watchdog)
    assert took < 1 + 1.5  # deadline + interpreter start
    assert len(queued_ids(sandbox, app)) == 3
    state = _state.read_state(app, environ=env)
    assert state.last_result == "failed"
    assert "deadline" in (state.last_error or "")
    assert state.consecutive_failures == 1


@pytest.mark.serial
def test_watchdog_ends_a_flusher_stuck_anywhere(sandbox: Sandbox, app: App) -> None:
    env = with_destination(sandbox.env, "http://127.0.0.1:9/v1/batch", SPOOL_REPORTER_FLUSH_DEADLINE="0.5")
    # Stuck reading the config (a hung network home folder, say), before any request timeout applies.
    stuck = "from spool_reporter import _hook\nimport threading\n"
    stuck += "_hook.read_inputs = lambda *a, **k: threading.Event().wait()\n"
    code, took = finish(start_flusher(env, stuck), timeout=15)
    assert code == _detached.EXIT_DEADLINE
    assert took < 0.5 + _flush.WATCHDOG_GRACE + 1.5


def test_kill_after_claim_resends_the_same_ids(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 5)
    ids = queued_ids(sandbox, app)
    with serving("silent") as server:
        env = with_destination(
            sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="15", SPOOL_REPORTER_READ_TIMEOUT="15"
        )
        proc = start_flusher(env)
        wait_for(lambda: len(server.received) == 1, what="the claimed batch to be sent")
        assert not (sandbox.state_dir(app) / "spool.jsonl").exists()  # claimed: sealed into a segment
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=10)
    assert queued_ids(sandbox, app) == ids
    with serving() as server:
        result = _flush.run(app, foreground=True, environ=with_destination(sandbox.env, server.url()))
        assert server.event_ids() == ids
    assert result.sent == 5


def test_kill_after_2xx_before_delete_resends_the_same_ids(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 5)
    ids = queued_ids(sandbox, app)
    with serving("ack-stall") as server:
        env = with_destination(
            sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="15", SPOOL_REPORTER_READ_TIMEOUT="15"
        )
        proc = start_flusher(env)
        wait_for(lambda: len(server.received) == 1, what="the batch to be acknowledged")
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=10)
        acked = set(server.seen_ids)
    assert acked == set(ids)  # the server stored them...
    assert queued_ids(sandbox, app) == ids  # ...but the flusher died before deleting: at least once
    with serving() as server:
        server.seen_ids.update(acked)  # the collector remembers what it stored
        _flush.run(app, foreground=True, environ=with_destination(sandbox.env, server.url()))
        assert server.event_ids() == ids  # the same ids again, which the collector de-duplicates
    assert queued_ids(sandbox, app) == []


def wait_idle(sandbox: Sandbox, app: App) -> None:
    wait_for(lambda: flusher_idle(sandbox, app), timeout=15, what="the flusher to exit")


@pytest.mark.serial
@pytest.mark.parametrize("recovery", ["background-after-backoff", "foreground-flush"])
def test_offline_laptop(sandbox: Sandbox, app: App, recovery: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """50 commands against a refusing destination keep 50 events, start one flusher (the interval holds
    the rest back), and are not slowed down; once the destination is back, the next flusher after the
    back-off -- or `django-spool flush` at any time -- delivers all 50, each exactly once."""
    starts = count_starts(monkeypatch)
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url(), SPOOL_REPORTER_BACKOFF_BASE="1")
        times = []
        for _ in range(50):
            t = time.perf_counter()
            assert _hook.record_event("startproject", app=app, environ=env)
            times.append(time.perf_counter() - t)
        wait_for(lambda: _state.read_state(app, environ=env).last_result == "failed", what="the failed flush")
        wait_idle(sandbox, app)
        assert len(starts) == 1
        assert len(queued_ids(sandbox, app)) == 50
        ids = queued_ids(sandbox, app)
        assert sorted(times)[25] < 0.005  # the median command pays microseconds, not the network
        state = _state.read_state(app, environ=env)
        assert state.consecutive_failures == 1
        assert state.next_retry is not None
        with port.serve() as server:
            if recovery == "foreground-flush":
                result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True)
                assert (result.outcome, result.sent) == ("delivered", 50)
            else:
                # The back-off must expire first (a command now starts nothing)...
                assert _hook.record_event("startproject", app=app, environ=env)
                assert len(starts) == 1
                wait_for(lambda: time.time() > (state.next_retry or 0), timeout=5, what="the back-off")
                # ...and the spawn interval: move the last spawn's stamp back instead of waiting 5 minutes.
                stamp = sandbox.state_dir(app) / _hook.STAMP_NAME
                os.utime(stamp, (time.time() - 3600, time.time() - 3600))
                assert _hook.record_event("startproject", app=app, environ=env)
                assert len(starts) == 2
                wait_for(lambda: len(set(server.event_ids())) == 52, what="delivery of everything")
                wait_idle(sandbox, app)
            received = Counter(server.event_ids())
        assert set(ids) <= set(received)
        assert all(received[i] == 1 for i in ids)  # each exactly once
        assert queued_ids(sandbox, app) == []
    finally:
        port.close()


AUDIT = textwrap.dedent(
    """
    import sys
    seen = []
    WATCH = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "subprocess.Popen",
             "os.posix_spawn", "os.fork", "os.exec")
    def hook(event, args):
        if event.startswith(WATCH):
            seen.append(event)
    sys.addaudithook(hook)
    from spool_reporter import _detached, _flush, _plan, record, _state
    from spool_reporter._hook import django_app
    app = django_app("5.2")
    for _ in range(3):
        record("startproject", app=app, long_lived=True)
    results = [_flush.run(app, foreground=True), _flush.run(app, foreground=False, ignore_backoff=True)]
    plan = _plan.plan(app)
    print(repr(seen))
    print(results[0].outcome, results[0].purged, len(plan.requests))
    """
)


@pytest.mark.parametrize("switch", [{"DJANGO_NO_ANALYTICS": "1"}, {"DO_NOT_TRACK": "1"}, {"CI": "true"}], ids=str)
def test_disabled_opens_no_socket_and_starts_no_process(sandbox: Sandbox, app: App, switch: dict[str, str]) -> None:
    fill(app, sandbox.env, 2)
    with serving() as server:
        env = {**with_destination(sandbox.env, server.url()), **switch}
        out = subprocess.run([sys.executable, "-c", AUDIT], env=env, capture_output=True, check=True, timeout=30)
        assert not server.received
    seen, summary = out.stdout.decode().splitlines()
    assert seen == "[]", seen
    outcome, _purged, requests = summary.split()
    assert (outcome, requests) == ("disabled", "0")
    hard = "CI" not in switch  # a "no" deletes the queue (the hook already did); CI merely keeps quiet
    assert len(sandbox.spool_lines(app)) == (0 if hard else 2)


def test_audit_hook_sees_sockets_when_enabled(sandbox: Sandbox, app: App) -> None:
    """The control for the test above: the same script with reporting on does connect and spawn."""
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        out = subprocess.run([sys.executable, "-c", AUDIT], env=env, capture_output=True, check=True, timeout=30)
        wait_for(lambda: len(set(server.event_ids())) == 3, what="delivery")
        wait_idle(sandbox, app)
    seen = out.stdout.decode().splitlines()[0]
    assert "os.posix_spawn" in seen or "subprocess.Popen" in seen  # the hook started the detached flusher
    # The detached flusher holds flusher.lock from birth, so here it sends and the in-process runs find
    # nothing. Sending in-process, with events queued where no flusher was started:
    fill(app, sandbox.env, 2)
    code = (
        "import sys\nseen = []\nsys.addaudithook(lambda e, a: seen.append(e) if e.startswith('socket.') else None)\n"
        "from spool_reporter import _flush\nfrom spool_reporter._hook import django_app\n"
        "print(_flush.run(django_app('5.2'), foreground=True).outcome, sorted(set(seen)))\n"
    )
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True, timeout=30)
    assert out.stdout.decode().startswith("delivered ")
    assert "socket.connect" in out.stdout.decode()


def test_an_event_recorded_while_the_flusher_sends_leaves_with_that_flusher(
    sandbox: Sandbox, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that records while the detached flusher waits for its first answer finds flusher.lock taken (and
    its spawn interval not passed): it starts no flusher. The flusher, once that round is done, releases the lock,
    finds the new event and sends it in a second round: one spawn, two requests, one pid in the log."""
    starts = count_starts(monkeypatch)
    with serving("slow", delay=3.0) as server:
        env = with_destination(
            sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20", SPOOL_REPORTER_READ_TIMEOUT="10"
        )
        assert _hook.record_event("startproject", app=app, environ=env)  # starts the flusher
        assert len(starts) == 1
        stamp = sandbox.state_dir(app) / _hook.STAMP_NAME
        spawned = stamp.stat().st_mtime_ns
        wait_for(lambda: len(server.received) == 1, what="the flusher's first request")
        assert _hook.record_event("startapp", app=app, environ=env)  # while the answer is 3 s away
        assert len(starts) == 1
        assert len(server.received) == 1  # still the first round...
        assert not flusher_idle(sandbox, app)  # ...whose flusher holds the lock
        later = [i for i in queued_ids(sandbox, app) if i not in server.event_ids()]
        assert len(later) == 1  # (the claimed segment, being sent, holds the other)
        # The bound: within the same flusher's run (its 20 s deadline); polled for longer so that a failure says
        # what did not happen rather than a timeout of the test.
        wait_for(lambda: later[0] in server.event_ids(), timeout=30, what="the event recorded mid-send")
        wait_idle(sandbox, app)
        batches = [[event["event"] for event in request.json()["events"]] for request in server.received]
    assert batches == [["startproject"], ["startapp"]]
    assert len(starts) == 1
    assert stamp.stat().st_mtime_ns == spawned  # no second spawn
    assert queued_ids(sandbox, app) == []
    log = (sandbox.state_dir(app) / _state.LOG_NAME).read_text().splitlines()
    delivered = [line for line in log if " delivered: " in line]
    assert len(delivered) == 2
    assert len({line.split(" pid=")[1].split()[0] for line in delivered}) == 1  # both rounds: one process
