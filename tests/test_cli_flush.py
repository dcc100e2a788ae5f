"""``django-spool flush`` and ``flush --dry-run`` as real subprocesses against real loopback servers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from servers import fill, serving, with_destination
from test_cli import cli

from spool_reporter import App

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conftest import Sandbox


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its mode and content hash: "changes nothing" made checkable."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = f"{oct(st.st_mode)} {st.st_size} {st.st_mtime_ns} {digest}"
    return out


def test_flush_delivers_everything(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 30)
    with serving() as server:
        result = cli(sandbox, "flush", env=with_destination(sandbox.env, server.url()))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("delivered: sent 30, rejected 0, failed 0, still queued 0")
        assert len(set(server.event_ids())) == 30
    assert sandbox.spool_lines(app) == []


def test_flush_without_endpoint_fails_and_keeps_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    result = cli(sandbox, "flush")
    assert result.returncode == 1
    assert result.stdout.startswith("no-endpoint:")
    assert "no endpoint is configured" in result.stderr
    assert len(sandbox.spool_lines(app)) == 2


def test_flush_to_a_dead_destination_fails_and_keeps_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 3)
    with serving("status", status=503, retry_after="120") as server:
        result = cli(
            sandbox, "flush", env=with_destination(sandbox.env, server.url(), DJANGO_ANALYTICS_TRANSPORT="json")
        )
    assert result.returncode == 1
    assert result.stdout.startswith("failed:")
    assert len(sandbox.spool_lines(app)) == 3
    status = json.loads(cli(sandbox, "status", "--json").stdout)
    assert status["last_result"] == "failed"
    assert status["next_retry"] is not None  # the back-off (Retry-After: 120) is on disk for status


def test_flush_with_reporting_off_purges_and_succeeds(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 4)
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), DO_NOT_TRACK="1")
        result = cli(sandbox, "flush", env=env)
        assert server.received == []
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("disabled:")
    assert sandbox.spool_lines(app) == []


@pytest.mark.parametrize(
    ("transport", "extra"),
    [
        ("json", {}),
        ("ga4", {"measurement_id": "G-TEST123", "api_secret": "s3cr3t-value"}),
        ("ua", {"tracking_id": "UA-12345-6"}),
    ],
)
def test_dry_run_prints_requests_and_changes_nothing(
    sandbox: Sandbox, app: App, transport: str, extra: dict[str, str]
) -> None:
    fill(app, sandbox.env, 3)  # first, so that no flusher is started by these records
    keys = "".join(f"{k}={v}\n" for k, v in extra.items())
    with sandbox.user_file(app).open("a") as f:
        f.write(f"transport={transport}\nendpoint=https://collector.invalid/v1/batch\n{keys}")
    before = snapshot(sandbox.home)
    result = cli(sandbox, "flush", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [e["event"] for e in doc["events"]] == ["startproject"] * 3
    assert doc["requests"], doc
    for request in doc["requests"]:
        assert request["method"] == "POST"
        assert request["url"].startswith("https://collector.invalid/")
    assert "s3cr3t-value" not in result.stdout  # secrets are redacted
    text = cli(sandbox, "flush", "--dry-run")
    assert text.returncode == 0
    assert "--- request 1 of" in text.stdout
    assert "s3cr3t-value" not in text.stdout
    assert snapshot(sandbox.home) == before  # spool, state, config: byte-identical, same mtimes


def test_dry_run_without_endpoint_lists_events_and_the_reason(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    doc = json.loads(cli(sandbox, "flush", "--dry-run", "--json").stdout)
    assert len(doc["events"]) == 2
    assert doc["requests"] == []
    assert "no endpoint" in doc["reason"]


def test_dry_run_opens_no_socket(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with sandbox.user_file(app).open("a") as f:
        f.write("endpoint=http://127.0.0.1:9/v1/batch\n")
    code = textwrap.dedent(
        """
        import sys
        calls = []
        sys.addaudithook(lambda event, args: calls.append(event) if event.startswith("socket.") else None)
        from spool_reporter.cli import main
        status = main(["flush", "--dry-run"])
        sys.stderr.write(repr(calls))
        sys.exit(status)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert result.stderr == "[]"


def test_dry_run_with_nothing_queued(sandbox: Sandbox) -> None:
    result = cli(sandbox, "flush", "--dry-run")
    assert result.returncode == 0
    assert result.stdout.startswith("0 queued events; nothing is sent by --dry-run.")
    assert not (sandbox.home / "state").exists()


def test_flush_json_without_dry_run_is_an_error(sandbox: Sandbox) -> None:
    result = cli(sandbox, "flush", "--json")
    assert result.returncode == 1
    assert "--json goes with --dry-run" in result.stderr
