"""``django-spool disable`` against a real collector process: the forget its detached run delivers leaves the
collector holding nothing of that developer (``collector stats``: 0 developers), and this machine holding nothing
of the id; another developer's numbers are untouched. Real ``django-spool`` processes, a real detached run, a real
``python -m spool_reporter.collector serve``, loopback only."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter._hook import FORGET_PENDING_NAME

from support.collector_server import start_server
from support.commands import flusher_idle, spool_command
from support.polling import wait_for
from support.servers import fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*spool_command(), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def _developers(env: dict[str, str], db: Path) -> int:
    """``django-spool collector stats --json``: the developers it counts, all weeks together."""
    done = _run(env, "collector", "stats", "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert isinstance(doc["developers"], int)
    return doc["developers"]


def _client_id(sandbox: Sandbox, app: App) -> str | None:
    found = re.findall(r"^client_id=(.*)$", sandbox.user_file(app).read_text(), re.MULTILINE)
    return found[-1] if found else None


def test_disable_leaves_the_collector_nothing_of_the_developer(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path)
    (tmp_path / "other").mkdir()
    other = type(sandbox)(tmp_path / "other")
    try:
        env = with_destination(sandbox.env, server.url, SPOOL_REPORTER_FLUSH_DEADLINE="20")
        other_env = with_destination(other.env, server.url, SPOOL_REPORTER_FLUSH_DEADLINE="20")
        for who, where in ((sandbox, env), (other, other_env)):
            fill(app, where, 5)
            sent = _run(where, "flush")
            assert sent.stdout.startswith("delivered: sent 5,"), (sent.stdout, sent.stderr)
            assert _client_id(who, app) is not None
        old = _client_id(sandbox, app)
        assert old is not None
        assert _developers(sandbox.env, db) == 2
        done = _run(env, "disable")
        assert done.returncode == 0, done.stderr
        assert f"to forget client id {old[:8]}...: a background process sends that one request now" in done.stdout
        # One flusher run: the detached process `disable` started, nothing else.
        pending = sandbox.state_dir(app) / FORGET_PENDING_NAME
        wait_for(lambda: not pending.exists() and flusher_idle(sandbox, app), timeout=60, what="the forget")
        assert _developers(sandbox.env, db) == 1  # the other developer alone
    finally:
        summary = server.stop()
    assert server.proc.returncode == 0, summary
    assert server.stderr.read_bytes() == b""
    assert _client_id(sandbox, app) is None
    assert _client_id(other, app) is not None
    leftovers = [p for p in sandbox.home.rglob("*") if p.is_file() and old in p.read_text(errors="replace")]
    assert leftovers == []  # the id is gone from this machine: config, spool, log and the record of what was sent
    status = json.loads(_run(env, "status", "--json").stdout)
    assert (status["enabled"], status["reason"], status["forget_pending"]) == (False, "user:disable", None)


def test_a_forgotten_developer_is_zero_in_collector_stats(tmp_path: Path, sandbox: Sandbox, app: App) -> None:
    """The issue's check as it reads: one developer, `disable`, then 0 developers."""
    db = tmp_path / "collector.sqlite3"
    server = start_server(db, sandbox.env, tmp_path)
    try:
        env = with_destination(sandbox.env, server.url, SPOOL_REPORTER_FLUSH_DEADLINE="20")
        fill(app, env, 3)
        assert _run(env, "flush").stdout.startswith("delivered: sent 3,")
        assert _developers(sandbox.env, db) == 1
        assert _run(env, "disable").returncode == 0
        pending = sandbox.state_dir(app) / FORGET_PENDING_NAME
        wait_for(lambda: not pending.exists() and flusher_idle(sandbox, app), timeout=60, what="the forget")
        assert _developers(sandbox.env, db) == 0
    finally:
        server.stop()
    assert server.proc.returncode == 0
    assert _client_id(sandbox, app) is None
