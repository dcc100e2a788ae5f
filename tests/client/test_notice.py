"""The notice follows what is collected (a version, shown again once when it changes), and the local mode
(recorded, never sent): through record() in real processes and the real ``django-spool``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spool_reporter import App, _flush, _settings
from spool_reporter._firstrun import notice_text
from spool_reporter._hook import NOTICE_VERSION, Decision
from spool_reporter._hook import decide as pure_decide

from support.commands import cli, record_together, unnamed
from support.polling import wait_for
from support.sandbox import Sandbox
from support.servers import fill, serving, with_destination

CID = "43325579-4ce9-4a2d-a152-0e993a4bb245"
RECORD = """
import sys
from spool_reporter import App, record
from spool_reporter._hook import django_app
if sys.argv[1] == "django":
    app = django_app("5.2")
else:
    app = App(name="MyTool", version="1.0", notice_revision=int(sys.argv[1]), endpoint="http://mytool.invalid/v1/batch")
print(record("startproject", app=app, notice=sys.argv[2] == "notice"))
"""


def run(
    sandbox: Sandbox, app_arg: str = "django", notice: bool = True, env: dict[str, str] | None = None
) -> tuple[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", RECORD, app_arg, "notice" if notice else "quiet"],
        env=env or sandbox.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout, result.stderr


# --- the notice's version ------------------------------------------------------------------------------


def test_the_first_run_records_the_version_it_showed(sandbox: Sandbox, app: App) -> None:
    assert NOTICE_VERSION == app.notice_version == 1
    out, err = run(sandbox)
    assert (out, err) == ("True\n", notice_text(app))
    text = sandbox.user_file(app).read_text()
    assert text.startswith("client_id=")
    assert text.endswith(f"\nnotice_version={NOTICE_VERSION}\nnotice_mode=send\n")  # which wording was shown
    assert run(sandbox) == ("True\n", "")


@pytest.mark.parametrize(
    ("config", "shown"),
    [
        pytest.param(f"client_id={CID}\nnotice_version=0\n", True, id="older-version"),
        pytest.param(f"client_id={CID}\nnotice_version=1\n", False, id="current-version"),
        pytest.param(f"client_id={CID}\nnotice_version=7\n", False, id="newer-version"),
        pytest.param(f"client_id={CID}\n", False, id="before-versions"),  # creating the id printed version 1
        pytest.param(f"client_id={CID}\nnotice_version=junk\n", True, id="unreadable-version"),
    ],
)
def test_an_older_notice_version_sees_the_notice_again_once(
    sandbox: Sandbox, app: App, config: str, shown: bool
) -> None:
    sandbox.write_user(app, config)
    assert run(sandbox) == ("True\n", notice_text(app) if shown else "")
    assert run(sandbox) == ("True\n", "")  # once
    text = sandbox.user_file(app).read_text()
    assert text.startswith(config)  # appended under the lock; the last occurrence of a key wins
    assert text.endswith("notice_version=1\nnotice_mode=send\n" if shown else config[-20:])
    assert [json.loads(line)["client_id"] for line in sandbox.spool_lines(app)] == [CID, CID]


def test_an_app_that_sends_somewhere_new_shows_its_notice_again(sandbox: Sandbox) -> None:
    """An integrator raises notice_revision when the tool starts sending somewhere new."""
    env = unnamed(sandbox)
    _, first_err = run(sandbox, "0", env=env)
    assert first_err.count("usage reporting is on") == 1
    assert "(version 1)" in first_err
    assert run(sandbox, "0", env=env) == ("True\n", "")
    out, err = run(sandbox, "1", env=env)  # the next release: version 2
    assert out == "True\n"
    assert "(version 2)" in err
    assert run(sandbox, "1", env=env) == ("True\n", "")


def test_a_caller_that_prints_no_notice_marks_none_as_seen(sandbox: Sandbox, app: App) -> None:
    assert run(sandbox, notice=False) == ("True\n", "")
    assert sandbox.user_file(app).read_text().endswith("\nnotice_version=0\n")
    assert run(sandbox) == ("True\n", notice_text(app))  # the first caller that shows it does


def test_a_new_notice_is_shown_once_when_commands_start_together(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, f"client_id={CID}\nnotice_version=0\n")
    results = record_together(sandbox)
    assert [out for out, _ in results] == ["True\n"] * 6
    assert sum(err == notice_text(app) for _, err in results) == 1
    assert sum(err == "" for _, err in results) == 5
    assert sandbox.user_file(app).read_text().count("notice_version=1") == 1


def test_status_shows_the_version_seen_and_the_current_one(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, f"client_id={CID}\nnotice_version=0\n")
    text = cli(sandbox, "status").stdout
    assert "notice:        never shown, current 1 (the send wording is shown with the next recorded event)\n" in text
    data = json.loads(cli(sandbox, "status", "--json").stdout)
    assert (data["notice_version_seen"], data["notice_mode_seen"], data["notice_version"]) == (0, None, 1)
    run(sandbox)
    assert "notice:        version 1 seen (send wording), current 1\n" in cli(sandbox, "status").stdout


# --- local mode ---------------------------------------------------------------------------------------


def d(enabled: bool, reason: str, mode: str = "opt-out", *, local: bool = False) -> Decision:
    return Decision(enabled=enabled, reason=reason, mode=mode, local=local)


DEST = {"DJANGO_ANALYTICS_ENDPOINT": "https://collector.example/v1/batch"}
LOCAL_CASES = [
    pytest.param({}, {"mode": "local"}, None, d(True, "user:local", local=True), id="user-local-needs-no-destination"),
    pytest.param({}, {"mode": "LOCAL"}, None, d(True, "user:local", local=True), id="any-case"),
    pytest.param({}, {"mode": "send"}, None, d(False, "destination:none"), id="another-mode-is-not-local"),
    pytest.param({}, {"mode": "local", "disable": "0"}, None, d(True, "user:local", local=True), id="enable-local"),
    pytest.param({"CI": "1"}, {"mode": "local"}, None, d(False, "ci:CI"), id="ci-without-an-explicit-yes"),
    pytest.param({"CI": "1"}, {"mode": "local", "disable": "0"}, None, d(True, "user:local", local=True), id="ci-yes"),
    pytest.param({}, {"mode": "local", "disable": "1"}, None, d(False, "user:disable"), id="disable-wins"),
    pytest.param({"DO_NOT_TRACK": "1"}, {"mode": "local"}, None, d(False, "env:DO_NOT_TRACK"), id="dnt-wins"),
    pytest.param({}, None, {"default": "local"}, d(True, "policy:local", "local", local=True), id="policy-local"),
    pytest.param(DEST, {"disable": "0"}, {"default": "local"}, d(True, "user:enable", "local"),
                 id="policy-local-enable"),
    pytest.param({}, {"disable": "0"}, {"default": "local"}, d(False, "destination:none", "local"),
                 id="policy-local-enable-needs-a-destination"),
    pytest.param({}, {"mode": "local"}, {"default": "off"}, d(False, "policy:opt-in", "opt-in"), id="opt-in-first"),
    pytest.param({}, {"mode": "local", "disable": "0"}, {"default": "off"}, d(True, "user:local", "opt-in", local=True),
                 id="opt-in-enable-local"),
    pytest.param({}, None, {"default": "local", "disable": "1"}, d(False, "policy:disable", "local"), id="policy-off"),
]  # fmt: skip


@pytest.mark.parametrize(("environ", "user", "policy", "expected"), LOCAL_CASES)
def test_local_mode_rules(
    app: App,
    environ: dict[str, str],
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
    expected: Decision,
) -> None:
    assert pure_decide(app, environ, user, policy) == expected


def test_local_mode_has_nothing_to_send_to(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "mode=local\nendpoint=https://collector.example/v1/batch\n")
    env = unnamed(sandbox)
    resolved = _settings.resolve(app, env)
    assert resolved.destination is None
    assert resolved.reason.startswith("local mode (you chose it): events stay on this machine and are never sent")
    shown = _settings.resolve(app, env, sending=False).destination
    assert shown is not None
    assert shown.endpoint == "https://collector.example/v1/batch"


def test_local_mode_records_and_never_sends(sandbox: Sandbox, app: App) -> None:
    """A real destination is configured and healthy; in local mode the hook records, starts no flusher, and
    neither a foreground nor a background flusher run sends anything."""
    with serving() as server:
        env = with_destination(unnamed(sandbox), server.url())
        assert cli(sandbox, "enable", "--local", env=env).returncode == 0
        runs = [run(sandbox, env=env) for _ in range(3)]
        assert runs == [("True\n", notice_text(app, local=True)), ("True\n", ""), ("True\n", "")]
        assert "Events stay in a file on this machine and are never sent" in runs[0][1]
        assert len(sandbox.local_lines(app)) == 3
        assert sandbox.spool_lines(app) == []  # kept apart from the queue
        assert not (sandbox.state_dir(app) / "flush.spawned").exists()  # no flusher was started
        for foreground in (True, False):
            result = _flush.run(app, foreground=foreground, environ=env, ignore_backoff=True)
            assert result.sent == 0
        flush = cli(sandbox, "flush", env=env)
        assert (flush.returncode, flush.stderr) == (0, "")
        assert flush.stdout.startswith("local: nothing is sent in local mode; 3 events stay on this machine.")
        dry = json.loads(cli(sandbox, "flush", "--dry-run", "--json", env=env).stdout)
        assert dry["local"] is True
        assert (len(dry["events"]), len(dry["local_events"])) == (0, 3)
        assert [r["url"] for r in dry["requests"]] == [server.url()]  # what would leave with sending on
        text = cli(sandbox, "flush", "--dry-run", env=env).stdout
        assert "Local mode: nothing leaves this machine. With sending on ('django-spool enable'), these would:" in text
        status = cli(sandbox, "status", env=env).stdout.splitlines()
        assert status[0].startswith("reporting:     on - you chose local mode (mode=local in your config file)")
        assert status[0].endswith("[user:local]")
        assert status[1] == "mode:          local: events are recorded on this machine and never sent"
        assert status[2].endswith("; not used in local mode")
        assert not server.received
        # Moving to sending says how many events recorded in local mode leave, then the next flush sends them.
        enable = cli(sandbox, "enable", env=env)
        assert enable.returncode == 0, enable.stderr
        assert (
            f"3 events recorded in local mode joined the queue: 3 queued events will be sent to {server.url()} "
            "by the next flusher" in enable.stdout
        )
        assert "\nmode=" not in sandbox.user_file(app).read_text()
        assert cli(sandbox, "flush", env=env).stdout.startswith("delivered: sent 3")
        wait_for(lambda: len(server.event_ids()) == 3, what="the delivery")


def test_a_distributors_local_default(sandbox: Sandbox, app: App) -> None:
    """default=local in the policy: recorded here without any destination; 'enable' sends (with one)."""
    sandbox.write_policy(app, "default=local\n")
    env = unnamed(sandbox)
    fill(app, env, 1)
    status = cli(sandbox, "status", env=env).stdout.splitlines()
    assert status[0].endswith("[policy:local]")
    assert status[1] == (
        "mode:          local: events are recorded on this machine and never sent (the system policy's default)"
    )
    with serving() as server:
        env = with_destination(env, server.url())
        assert cli(sandbox, "enable", env=env).returncode == 0
        assert json.loads(cli(sandbox, "status", "--json", env=env).stdout)["reason"] == "user:enable"
        assert cli(sandbox, "flush", env=env).stdout.startswith("delivered: sent 1")
