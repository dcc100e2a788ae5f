"""Real flushers (``django-spool flush`` subprocesses) delivering to the real collector subprocess: the
whole self-hosted path, including at-least-once re-delivery and concurrent flushers -- with the ``json``
transport at ``/v1/batch``, and with the ``ga4`` transport pointed at the collector's ``/mp/collect``."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter.collector import stats

from support.collector_server import start_server
from support.commands import spool_command
from support.events import assert_private, db_bytes
from support.servers import fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)


def _env(sandbox: Sandbox, url: str, transport: str = "json") -> dict[str, str]:
    # Generous timings: this is about delivery, not about the flusher's deadline (tested elsewhere).
    return with_destination(
        sandbox.env,
        url,
        DJANGO_ANALYTICS_TRANSPORT=transport,
        SPOOL_REPORTER_FLUSH_DEADLINE="30",
        SPOOL_REPORTER_CONNECT_TIMEOUT="5",
        SPOOL_REPORTER_READ_TIMEOUT="10",
    )


def _flush(sandbox: Sandbox, url: str, transport: str = "json") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*spool_command(), "flush"],
        env=_env(sandbox, url, transport),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, (out, err)
    return out


def _stats_json(sandbox: Sandbox, db: Path) -> dict[str, object]:
    """``django-spool collector stats --json``, the main command line's view of the database."""
    done = subprocess.run(
        [*spool_command(), "collector", "stats", "--db", str(db), "--json"],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def test_flushers_deliver_to_the_collector(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path, "--max-per-client-week", "0")  # 1200 from one developer
    developers = []
    for k in range(4):
        (tmp_path / f"dev{k}").mkdir()
        developers.append(type(sandbox)(tmp_path / f"dev{k}"))  # four users, four client ids
    try:
        counts = [700, 300, 1, 1200]  # 700 and 1200 need several 500-event batches
        for dev, n in zip(developers, counts, strict=True):
            fill(app, dev.env, n)
        # A flusher that was killed after the 2xx but before deleting sends the same events again:
        # keep a copy of one developer's spool and put it back after the first delivery.
        saved = tmp_path / "saved-spool"
        shutil.copytree(developers[0].state_dir(app), saved)
        procs = [_flush(dev, server.url) for dev in developers]  # four flushers at once
        outs = [_finish(p) for p in procs]
        for out, n in zip(outs, counts, strict=True):
            assert out.startswith(f"delivered: sent {n}, rejected 0, failed 0, still queued 0"), out
        shutil.rmtree(developers[0].state_dir(app))
        shutil.copytree(saved, developers[0].state_dir(app))
        again = _finish(_flush(developers[0], server.url))
        assert again.startswith("delivered: sent 700,"), again
    finally:
        summary = server.stop()
    assert server.proc.returncode == 0
    total = sum(counts)
    assert (
        summary
        == f"stopped after {summary.split()[2]} requests: {total} events stored, 700 duplicates, 0 requests refused, "
        "0 events refused\n"
    )
    result = stats(db)
    assert (result.developers, result.events) == (4, total)
    assert server.stderr.read_bytes() == b""
    # The same numbers through the main command line (``django-spool collector stats``).
    assert _stats_json(sandbox, db) == json.loads(json.dumps(result.as_dict()))


MEASUREMENT_ID = "G-E2EPROBE9"
API_SECRET = "e2e-secret-4f81a0c6d2"  # a probe: must reach neither the collector's database nor any log


def test_ga4_flushers_deliver_to_the_collectors_mp_collect(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path)
    ga4_url = server.url.replace("/v1/batch", "/mp/collect")
    developers = []
    for k in range(3):
        (tmp_path / f"dev{k}").mkdir()
        developers.append(type(sandbox)(tmp_path / f"dev{k}"))
    # GA4 takes events at most 72 hours old, and the collector keys a GA4 event by its content and its day (it
    # keeps the day of an event, never the second): each developer's events of one day are one stored event.
    start = time.time() - 3600
    counts = [30, 2, 60]  # 30 and 60 need several 25-event requests
    days: set[tuple[int, str]] = set()
    for k, (dev, n) in enumerate(zip(developers, counts, strict=True)):
        for i in range(n):
            fill(app, dev.env, 1, now=start + i)
            days.add((k, time.strftime("%Y-%m-%d", time.gmtime(start + i))))  # two, if run just after midnight
        # transport=ga4 requires both; the collector ignores them.
        dev.write_user(
            app, dev.user_file(app).read_text() + f"measurement_id={MEASUREMENT_ID}\napi_secret={API_SECRET}\n"
        )
    # Two identical events from one developer in the same second: one id, stored once (docs/collector.md).
    fill(app, developers[1].env, 1, now=start)
    counts[1] += 1
    sent = sum(counts)
    stored = len(days)
    client_ids = {json.loads(d.spool_lines(app)[0])["client_id"] for d in developers}
    saved = tmp_path / "saved-spool"
    shutil.copytree(developers[0].state_dir(app), saved)
    try:
        procs = [_flush(dev, ga4_url, "ga4") for dev in developers]
        outs = [_finish(p) for p in procs]
        for out, n in zip(outs, counts, strict=True):
            assert out.startswith(f"delivered: sent {n}, rejected 0, failed 0, still queued 0"), out
        # A flusher killed after the 2xx but before deleting: the same requests again, stored once.
        shutil.rmtree(developers[0].state_dir(app))
        shutil.copytree(saved, developers[0].state_dir(app))
        again = _finish(_flush(developers[0], ga4_url, "ga4"))
        assert again.startswith("delivered: sent 30,"), again
        outs.append(again)
    finally:
        summary = server.stop()
    assert server.proc.returncode == 0
    requests = 2 * 2 + 1 + 3  # ceil(30/25) twice, ceil(3/25), ceil(60/25)
    duplicates = (sent - stored) + 30  # the same day's twins, then the killed flusher's 30 again
    assert summary == (
        f"stopped after {requests} requests: {stored} events stored, {duplicates} duplicates, 0 requests refused, "
        "0 events refused\n"
    )
    doc = _stats_json(sandbox, db)
    assert (doc["developers"], doc["events"]) == (3, stored)
    weeks = doc["weeks"]  # one week, or two if the test ran across Monday 00:00 UTC
    assert sum(w["events"] for w in weeks) == stored  # type: ignore[attr-defined]
    assert all(set(w["by_django"]) == {"5.2"} for w in weeks)  # type: ignore[attr-defined]
    with sqlite3.connect(db) as conn:
        assert {r[0] for r in conn.execute("SELECT client_id FROM events")} == client_ids
    conn.close()
    # No address, and nothing of the query string, in the database or the collector's output; the
    # flushers' own output and logs show the endpoint with the secret redacted.
    data = db_bytes(db)
    assert_private(data)
    for probe in (MEASUREMENT_ID, API_SECRET):
        assert probe.encode() not in data
        assert probe not in summary
    assert server.stderr.read_bytes() == b""
    client_side = "".join(outs) + "".join(
        p.read_text(errors="replace") for d in developers for p in d.state_dir(app).glob("flush.log*")
    )
    assert client_side.count("/mp/collect?measurement_id=G-E2EPROBE9&api_secret=REDACTED") == 2 * len(outs) - 1
    assert API_SECRET not in client_side
