"""Events a destination refuses inside a 2xx are counted as refused, by reason, never as sent: real
``django-spool flush`` and ``status`` subprocesses against the real collector subprocess (its time window, its
weekly cap, a forgotten client id), and against a loopback server whose answer is hostile.

The client keeps no time window of its own for the collector: a collector run with a longer ``--max-age-days``
takes month-old events, and one with the default refuses them and says so (``too_old``)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from spool_reporter import App

from support.collector_server import start_server
from support.commands import spool_command
from support.servers import Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)

DAY = 86400


def _env(sandbox: Sandbox, url: str) -> dict[str, str]:
    # Generous timings: this is about counting, not about the flusher's deadline (tested elsewhere).
    return with_destination(
        sandbox.env,
        url,
        SPOOL_REPORTER_FLUSH_DEADLINE="30",
        SPOOL_REPORTER_CONNECT_TIMEOUT="5",
        SPOOL_REPORTER_READ_TIMEOUT="10",
    )


def _spool(sandbox: Sandbox, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*spool_command(), *args], env=_env(sandbox, url), capture_output=True, text=True, timeout=90, check=False
    )


def _flush(sandbox: Sandbox, url: str) -> tuple[str, str]:
    """``django-spool flush``: (the summary line, the message)."""
    done = _spool(sandbox, url, "flush")
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    return lines[0], lines[1]


def _status(sandbox: Sandbox, url: str) -> tuple[str, dict[str, object]]:
    """``django-spool status``'s ``refused:`` line and ``status --json``."""
    text = _spool(sandbox, url, "status")
    assert text.returncode == 0, text.stderr
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("refused:")]
    data = _spool(sandbox, url, "status", "--json")
    assert data.returncode == 0, data.stderr
    doc = json.loads(data.stdout)
    assert isinstance(doc, dict)
    return line, doc


def _stored(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM events").fetchone()
    conn.close()
    return int(n)


def _flush_log(sandbox: Sandbox, app: App) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(sandbox.state_dir(app).glob("flush.log*")))


def _counters(sandbox: Sandbox, app: App) -> list[str]:
    path = sandbox.state_dir(app) / "counters"
    return path.read_text().splitlines() if path.exists() else []


def test_a_collector_with_a_longer_max_age_recovers_month_old_events(
    tmp_path: Path, sandbox: Sandbox, app: App
) -> None:
    # docs/threat-model.md: a collector for long-offline laptops runs with --max-age-days 60.
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path, "--max-age-days", "60")
    try:
        fill(app, sandbox.env, 20, now=time.time() - 35 * DAY)
        fill(app, sandbox.env, 10)
        summary, message = _flush(sandbox, server.url)
    finally:
        out = server.stop()
    assert summary == "delivered: sent 30, rejected 0, failed 0, still queued 0"
    assert message == f"Sent 30 events to {server.url}."
    assert _stored(db) == 30
    assert out.endswith(": 30 events stored, 0 duplicates, 0 requests refused, 0 events refused\n"), out


def test_too_old_and_over_cap_events_are_counted_as_refused_by_reason(
    tmp_path: Path, sandbox: Sandbox, app: App
) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path, "--max-per-client-week", "5")  # the default maximum age
    when = time.time()
    try:
        fill(app, sandbox.env, 20, now=when - 35 * DAY)  # older than the collector's 30 days
        fill(app, sandbox.env, 12, now=when)  # one week of one client id: 5 fit under the cap
        summary, message = _flush(sandbox, server.url)
        assert summary == "delivered: sent 5, refused 27 (over_cap 7, too_old 20), rejected 0, failed 0, still queued 0"
        assert message == f"Sent 5 events to {server.url}; the destination refused 27 events (over_cap 7, too_old 20)."
        assert _stored(db) == 5
        # The totals run on: one more over the cap.
        fill(app, sandbox.env, 1, now=when)
        summary, message = _flush(sandbox, server.url)
        assert summary == "delivered: sent 0, refused 1 (over_cap 1), rejected 0, failed 0, still queued 0"
        assert message.endswith("; the destination refused 1 event (over_cap 1).")
        line, doc = _status(sandbox, server.url)
    finally:
        out = server.stop()
    assert _stored(db) == 5
    assert out.endswith(": 5 events stored, 0 duplicates, 0 requests refused, 28 events refused\n"), out
    assert line == "refused:       28 events (over_cap 8, too_old 20) by the destination"
    assert doc["refused_by_destination"] == {"over_cap": 8, "too_old": 20}
    assert (doc["dropped"], doc["dropped_by_reason"]) == (0, {})  # refused by the destination is not dropped here
    log = _flush_log(sandbox, app)
    assert "batch of 32: the destination refused 27 (over_cap 7, too_old 20)" in log  # per batch
    assert "; the destination refused 27 events (over_cap 7, too_old 20)" in log  # per run
    assert "batch of 1: the destination refused 1 (over_cap 1)" in log
    state = json.loads((sandbox.state_dir(app) / "state.json").read_text())
    assert (state["last_sent"], state["last_refused"]) == (0, {"over_cap": 1})


def test_a_forgotten_client_ids_events_are_counted_as_forgotten(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path)
    try:
        fill(app, sandbox.env, 3)
        assert _flush(sandbox, server.url)[0] == "delivered: sent 3, rejected 0, failed 0, still queued 0"
        fill(app, sandbox.env, 4)
        client_id = json.loads(sandbox.spool_lines(app)[0])["client_id"]
        request = urllib.request.Request(
            server.url.replace("/v1/batch", "/v1/forget"),
            data=json.dumps({"client_id": client_id}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read()) == {"deleted": 3}
        summary, message = _flush(sandbox, server.url)
        assert summary == "delivered: sent 0, refused 4 (forgotten 4), rejected 0, failed 0, still queued 0"
        assert message.endswith("; the destination refused 4 events (forgotten 4).")
        line, doc = _status(sandbox, server.url)
    finally:
        server.stop()
    assert _stored(db) == 0
    assert line == "refused:       4 events (forgotten 4) by the destination"
    assert doc["refused_by_destination"] == {"forgotten": 4}


def test_a_hostile_answer_cannot_inflate_or_corrupt_the_counts(sandbox: Sandbox, app: App) -> None:
    with Server("status", status=200, body=json.dumps({"refused": {"x\n": 10**9}}).encode()) as server:
        url = server.url()
        fill(app, sandbox.env, 7)
        # A reason that is not a short [a-z_] word is "other"; no count exceeds the batch.
        summary, _ = _flush(sandbox, url)
        assert summary == "delivered: sent 0, refused 7 (other 7), rejected 0, failed 0, still queued 0"
        # Counts that are not integers >= 0 are ignored; the total is capped at the batch.
        server.body = json.dumps(
            {"refused": {"a": -1, "b": True, "c": 1.5, "d": "9", "too_old": 10**12, "over_cap": 1}, "rejected": 10**9}
        ).encode()
        fill(app, sandbox.env, 5)
        summary, _ = _flush(sandbox, url)
        assert summary == "delivered: sent 0, refused 5 (over_cap 1, too_old 4), rejected 0, failed 0, still queued 0"
        # An older collector's answer: its rejected count, under the reason "rejected".
        server.body = b'{"accepted": 2, "duplicates": 0, "rejected": 3}'
        fill(app, sandbox.env, 5)
        summary, _ = _flush(sandbox, url)
        assert summary == "delivered: sent 2, refused 3 (rejected 3), rejected 0, failed 0, still queued 0"
        # A 2xx that says nothing of refusals: all sent.
        server.body = b"GIF89a"
        fill(app, sandbox.env, 2)
        summary, _ = _flush(sandbox, url)
        assert summary == "delivered: sent 2, rejected 0, failed 0, still queued 0"
        line, doc = _status(sandbox, url)
    assert doc["refused_by_destination"] == {"other": 7, "over_cap": 1, "rejected": 3, "too_old": 4}
    assert line == "refused:       15 events (other 7, over_cap 1, rejected 3, too_old 4) by the destination"
    assert (doc["dropped"], doc["dropped_by_reason"]) == (0, {})
    assert all(re.fullmatch(r"[a-z_]+=\d+", entry) for entry in _counters(sandbox, app)), _counters(sandbox, app)
    assert "x\n" not in _flush_log(sandbox, app)
