"""``django-spool flush`` and ``flush --dry-run`` as real subprocesses against real loopback servers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from spool_reporter import App

from support.commands import cli, snapshot, unnamed
from support.servers import fill, serving, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox


def test_flush_delivers_everything(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 30)
    with serving() as server:
        result = cli(sandbox, "flush", env=with_destination(sandbox.env, server.url()))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("delivered: sent 30, rejected 0, failed 0, still queued 0")
        assert len(set(server.event_ids())) == 30
    assert sandbox.spool_lines(app) == []


def test_flush_to_a_refused_endpoint_fails_and_keeps_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    result = cli(sandbox, "flush")  # the sandbox's endpoint: plain http to a remote host
    assert result.returncode == 1
    assert result.stdout == "invalid-endpoint: sent 0, rejected 0, failed 0, still queued 2\n"
    # Invalid, and why: the reason status gives for the destination.
    reason = cli(sandbox, "status").stdout.splitlines()[2].removeprefix("destination:   ")
    assert reason.startswith("the endpoint 'http://sandbox.invalid/v1/batch' is plain http:// to sandbox.invalid")
    assert result.stderr == f"The destination is invalid: {reason}; 2 queued events kept until it is fixed, not sent.\n"
    assert len(sandbox.spool_lines(app)) == 2


def test_flush_without_a_destination_keeps_events_and_fails(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)  # recorded while a destination was named
    result = cli(sandbox, "flush", env=unnamed(sandbox))
    assert result.returncode == 1  # two events are left that cannot be sent
    assert result.stdout == "disabled: sent 0, rejected 0, failed 0, still queued 2\n"
    assert result.stderr == (
        "Reporting is off: no destination configured: nothing is recorded until an endpoint is set; "
        "2 queued events kept, not sent.\n"
    )
    assert len(sandbox.spool_lines(app)) == 2


@pytest.mark.parametrize("named", [False, True], ids=["no destination", "a refused endpoint"])
def test_flush_with_nothing_queued_succeeds(sandbox: Sandbox, named: bool) -> None:
    """Its help says 0 when nothing is left to send, with or without a usable endpoint."""
    result = cli(sandbox, "flush", env=sandbox.env if named else unnamed(sandbox))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(":")[0] == ("invalid-endpoint" if named else "disabled")
    assert "still queued 0" in result.stdout
    assert result.stderr == ""
    assert not (sandbox.home / "state").exists()


def test_flush_says_one_event_not_one_events(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    with serving() as server:
        result = cli(sandbox, "flush", env=with_destination(sandbox.env, server.url()))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"delivered: sent 1, rejected 0, failed 0, still queued 0\nSent 1 event to {server.url()}.\n"
    )
    dry = cli(sandbox, "flush", "--dry-run")
    assert dry.stdout.startswith("0 queued events;")
    fill(app, sandbox.env, 1)
    assert cli(sandbox, "flush", "--dry-run").stdout.startswith("1 queued event; nothing is sent")
    assert cli(sandbox, "purge").stdout == "Deleted 1 queued event and the record of what was sent.\n"


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
    env = unnamed(sandbox)  # the user file's endpoint, not the sandbox's (the environment beats the files)
    result = cli(sandbox, "flush", "--dry-run", "--json", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [e["event"] for e in doc["events"]] == ["startproject"] * 3
    assert doc["requests"], doc
    for request in doc["requests"]:
        assert request["method"] == "POST"
        assert request["url"].startswith("https://collector.invalid/")
    assert "s3cr3t-value" not in result.stdout  # secrets are redacted
    text = cli(sandbox, "flush", "--dry-run", env=env)
    assert text.returncode == 0
    assert "--- request 1 of" in text.stdout
    assert "s3cr3t-value" not in text.stdout
    assert snapshot(sandbox.home) == before  # spool, state, config: byte-identical, same mtimes


@pytest.mark.parametrize("named", [False, True], ids=["no destination", "a refused endpoint"])
def test_dry_run_without_a_usable_endpoint_lists_events_and_the_reason(sandbox: Sandbox, app: App, named: bool) -> None:
    fill(app, sandbox.env, 2)
    result = cli(sandbox, "flush", "--dry-run", "--json", env=sandbox.env if named else unnamed(sandbox))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["events"]) == 2
    assert doc["requests"] == []
    assert ("plain http://" if named else "no destination configured") in doc["reason"]


def test_dry_run_opens_no_socket(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with sandbox.user_file(app).open("a") as f:
        f.write("endpoint=http://127.0.0.1:9/v1/batch\n")
    env = unnamed(sandbox)
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
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert result.stderr == "[]"


def test_dry_run_with_nothing_queued(sandbox: Sandbox) -> None:
    result = cli(sandbox, "flush", "--dry-run")
    assert result.returncode == 0
    assert result.stdout.startswith("0 queued events; nothing is sent by --dry-run.")
    assert not (sandbox.home / "state").exists()


def test_flush_json_without_dry_run_is_a_usage_error(sandbox: Sandbox) -> None:
    result = cli(sandbox, "flush", "--json")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("usage: django-spool flush")
    assert "django-spool flush: error: --json goes with --dry-run" in result.stderr
