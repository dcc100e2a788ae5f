"""Real flushers (``django-spool flush`` subprocesses) delivering to the real collector subprocess: the
whole self-hosted path, including at-least-once re-delivery and concurrent flushers."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from servers import fill, with_destination
from test_cli import spool_command
from test_collector_processes import start_server

from spool_reporter import App
from spool_reporter.collector import stats

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conftest import Sandbox

pytestmark = pytest.mark.timeout(180)


def _env(sandbox: Sandbox, url: str) -> dict[str, str]:
    # Generous timings: this is about delivery, not about the flusher's deadline (tested elsewhere).
    return with_destination(
        sandbox.env,
        url,
        DJANGO_ANALYTICS_TRANSPORT="json",
        SPOOL_REPORTER_FLUSH_DEADLINE="30",
        SPOOL_REPORTER_CONNECT_TIMEOUT="5",
        SPOOL_REPORTER_READ_TIMEOUT="10",
    )


def _flush(sandbox: Sandbox, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*spool_command(), "flush"],
        env=_env(sandbox, url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, (out, err)
    return out


def test_flushers_deliver_to_the_collector(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path)
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
        == f"stopped after {summary.split()[2]} requests: {total} events stored, 700 duplicates, 0 requests refused\n"
    )
    result = stats(db)
    assert (result.developers, result.events) == (4, total)
    assert server.stderr.read_bytes() == b""
    # The same numbers through the main command line (``django-spool collector stats``).
    done = subprocess.run(
        [*spool_command(), "collector", "stats", "--db", str(db), "--json"],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(result.as_dict()))
