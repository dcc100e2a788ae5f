"""Local mode keeps its promise: what is recorded under "never sent" is never sent, whatever changes later.

Real processes throughout: the hook runs in a fresh interpreter (``spool_reporter.record`` with the notice, as
Django's hook calls it), ``django-spool`` runs as a subprocess, and a loopback server stands for the collector.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from spool_reporter._firstrun import notice_text
from spool_reporter._hook import django_app, parse

from support.commands import cli
from support.sandbox import run_py
from support.servers import serving, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

APP = django_app()


def record(sandbox: Sandbox, env: dict[str, str], count: int = 1) -> str:
    """Record ``count`` events in one fresh interpreter, as Django's hook does (with the notice); its stderr."""
    code = f"""
        from spool_reporter import record
        from spool_reporter._hook import django_app
        for _ in range({count}):
            assert record("startproject", app=django_app("5.2"), notice=True)
    """
    proc = run_py(textwrap.dedent(code), env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def user_values(sandbox: Sandbox) -> dict[str, str]:
    values = parse(sandbox.user_file(APP).read_bytes())
    assert values is not None
    return values


def ids(lines: list[bytes]) -> list[str]:
    return [json.loads(line)["event_id"] for line in lines]


def test_events_recorded_in_local_mode_are_never_sent_when_the_policy_goes(sandbox: Sandbox) -> None:
    """The reviewer's case: a distributor's default=local, 20 events under the local notice, then the policy file
    is gone. The next command shows the sending notice first; the 20 stay here until `enable`, which says how
    many leave."""
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_SPAWN_INTERVAL="0")
        policy = sandbox.write_policy(APP, "default=local\n")
        assert record(sandbox, env, 20) == notice_text(APP, local=True)
        assert user_values(sandbox)["notice_mode"] == "local"
        kept = ids(sandbox.local_lines(APP))
        assert len(kept) == 20
        assert sandbox.spool_lines(APP) == []
        assert cli(sandbox, "flush", env=env).stdout.startswith("local: nothing is sent in local mode; 20 events")

        policy.unlink()
        assert record(sandbox, env) == notice_text(APP, after_local=True)  # before anything could leave
        assert user_values(sandbox)["notice_mode"] == "send"
        assert record(sandbox, env) == ""  # shown once
        flushed = cli(sandbox, "flush", env=env)
        assert flushed.returncode == 0, flushed.stderr
        assert "20 events recorded in local mode stay on this machine" in flushed.stdout
        assert not set(kept) & set(server.event_ids())
        assert ids(sandbox.local_lines(APP)) == kept
        status = cli(sandbox, "status", env=env).stdout
        assert "kept local:    20 events recorded in local mode, never sent unless you run 'django-spool enable'" in (
            status
        )
        dry = json.loads(cli(sandbox, "flush", "--dry-run", "--json", env=env).stdout)
        assert [e["event_id"] for e in dry["local_events"]] == kept
        assert not set(kept) & {e["event_id"] for r in dry["requests"] for e in r["body"]["events"]}

        enabled = cli(sandbox, "enable", env=env)
        assert enabled.returncode == 0, enabled.stderr
        joined = f"20 events recorded in local mode joined the queue: 20 queued events will be sent to {server.url()}"
        assert joined in enabled.stdout
        assert cli(sandbox, "flush", env=env).stdout.startswith("delivered: sent 20")
        assert set(kept) <= set(server.event_ids())
        assert not sandbox.local_lines(APP)


def test_a_user_file_from_before_the_wording_was_recorded(sandbox: Sandbox) -> None:
    """notice_version=1 without notice_mode=: only the sending wording could have been shown outside local mode,
    so a user in local mode sees the local wording once."""
    sandbox.write_user(APP, "client_id=6b1d2f9e-2c7a-4d55-9a3e-1f2b3c4d5e6f\nnotice_version=1\n")
    env = dict(sandbox.env)
    assert record(sandbox, env) == ""
    sandbox.write_policy(APP, "default=local\n")
    assert record(sandbox, env) == notice_text(APP, local=True)
    assert record(sandbox, env) == ""
    assert len(sandbox.local_lines(APP)) == 2
    assert len(sandbox.spool_lines(APP)) == 1


def test_enable_local_keeps_them_local_and_sending_again_shows_the_notice(sandbox: Sandbox) -> None:
    env = dict(sandbox.env)
    assert cli(sandbox, "enable", "--local", env=env).returncode == 0
    assert record(sandbox, env, 3) == notice_text(APP, local=True)
    enabled = cli(sandbox, "enable", "--local", env=env)
    assert "Local mode: events are recorded on this machine and never sent (3 events so far)" in enabled.stdout
    # The user turns sending on by editing the file, not with enable: the notice says what changed, and the
    # three stay where they are.
    path = sandbox.user_file(APP)
    path.write_text(re.sub(r"^mode=local\n", "", path.read_text(), flags=re.MULTILINE))
    assert record(sandbox, env) == notice_text(APP, after_local=True)
    assert len(sandbox.local_lines(APP)) == 3
    assert len(sandbox.spool_lines(APP)) == 1


def test_disable_purge_and_a_hook_that_finds_reporting_off_delete_the_local_folder(sandbox: Sandbox) -> None:
    env = dict(sandbox.env)
    local: Path = sandbox.local_dir(APP)
    sandbox.write_policy(APP, "default=local\n")
    record(sandbox, env, 2)
    purged = cli(sandbox, "purge", env=env)
    assert purged.stdout == "Deleted 2 queued events.\n"
    assert not local.exists()

    record(sandbox, env, 3)
    disabled = cli(sandbox, "disable", env=env)
    assert "Deleted 3 queued events." in disabled.stdout
    assert not local.exists()

    assert cli(sandbox, "enable", "--local", env=env).returncode == 0
    record(sandbox, env, 1)
    assert local.exists()
    off = run_py(
        """
        from spool_reporter import record
        from spool_reporter._hook import django_app
        assert not record("startproject", app=django_app("5.2"), notice=True)
        """,
        {**env, "DJANGO_NO_ANALYTICS": "1"},
    )
    assert off.returncode == 0, off.stderr
    assert off.stderr == ""
    assert not local.exists()


def test_a_move_from_sending_to_local_keeps_the_queue_unsent(sandbox: Sandbox) -> None:
    """Events queued under the sending wording, then a distributor's default=local: the local wording is shown
    before the next event is recorded, and nothing is sent while local mode lasts, the queue included."""
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        env[APP.env_endpoint] = "http://sandbox.invalid/v1/batch"  # named but refused: no flusher starts
        assert record(sandbox, env, 2) == notice_text(APP)
        sandbox.write_policy(APP, "default=local\n")
        assert record(sandbox, env) == notice_text(APP, local=True)
        assert (len(sandbox.spool_lines(APP)), len(sandbox.local_lines(APP))) == (2, 1)
        sending = with_destination(sandbox.env, server.url())
        flushed = cli(sandbox, "flush", env=sending)
        assert flushed.stdout.startswith("local: nothing is sent in local mode; 3 events stay on this machine")
        status = cli(sandbox, "status", env=sending).stdout
        assert "queued:        2 events" in status
        assert "kept local:    1 event recorded in local mode" in status
        assert not server.received
