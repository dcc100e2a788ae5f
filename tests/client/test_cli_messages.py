"""What ``django-spool`` says in the first hour (issue 22): secrets in an endpoint, an invalid destination, a home
that cannot be written, the age of the oldest event under daylight saving time, and counted words. Real
commands as subprocesses, real loopback servers."""

from __future__ import annotations

import calendar
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter._files import folder_problem, record_problem
from spool_reporter._redact import redact_url

from support.commands import cli, spool_command
from support.sandbox import Sandbox
from support.servers import fill, serving, with_destination
from support.users import AS_NOBODY, ROOT_WITH_SETPRIV

PASSWORD = "pw-Zq81sXk"
"""A password no output and no file but the user's own config file may hold."""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("https://user:pw@host/v1/batch", "https://REDACTED@host/v1/batch", id="user-and-password"),
        pytest.param("https://tok3n@host:8443/v1", "https://REDACTED@host:8443/v1", id="a-token-as-user-name"),
        pytest.param("user:pw@host/v1/batch", "REDACTED@host/v1/batch", id="no-scheme"),
        pytest.param(
            "https://h/mp/collect?measurement_id=G-1&api_secret=abc",
            "https://h/mp/collect?measurement_id=G-1&api_secret=REDACTED",
            id="ga4-query",
        ),
        pytest.param("https://h/p?a=1#access_token=x", "https://h/p?a=1#access_token=REDACTED", id="fragment"),
        pytest.param("https://[::1]:8443/v1/batch?x=1", "https://[::1]:8443/v1/batch?x=1", id="nothing-secret"),
        pytest.param("not a url at all", "not a url at all", id="not-a-url"),
        pytest.param("https://host.example/a@b", "https://host.example/a@b", id="at-in-the-path"),
        pytest.param("ftp://a:b@c@host.example", "ftp://REDACTED@host.example", id="last-at-ends-it"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def _no_password_under(root: Path, *, but: Path) -> list[str]:
    """The files under ``root`` (except ``but``) that hold :data:`PASSWORD`."""
    return [str(p) for p in root.rglob("*") if p.is_file() and p != but and PASSWORD.encode() in p.read_bytes()]


@pytest.mark.parametrize("userinfo", [f"user:{PASSWORD}", PASSWORD], ids=["user-and-password", "token"])
def test_credentials_in_the_endpoint_are_shown_nowhere(sandbox: Sandbox, app: App, userinfo: str) -> None:
    """An endpoint with a user name and password is refused (never sent to); every command that quotes it, the
    detached flusher's log and the spool folder's files show ``REDACTED@`` instead."""
    fill(app, sandbox.env, 2)
    with serving() as server:
        endpoint = server.url().replace("://", f"://{userinfo}@")
        config = sandbox.write_user(app, sandbox.user_file(app).read_text() + f"endpoint={endpoint}\n")
        # The flusher's test timing, and the user file's endpoint (the environment's would beat it).
        env = {k: v for k, v in with_destination(sandbox.env, "").items() if k != "DJANGO_ANALYTICS_ENDPOINT"}
        outputs = {}
        for args in (
            ["status"],
            ["status", "--json"],
            ["flush"],
            ["flush", "--dry-run"],
            ["flush", "--dry-run", "--json"],
            ["sent"],
            ["sent", "--json"],
        ):
            result = cli(sandbox, *args, env=env)
            outputs[" ".join(args)] = result.stdout + result.stderr
        # The detached flusher the hook would start: it finds the endpoint invalid and logs why.
        detached = subprocess.run(
            [sys.executable, "-m", "spool_reporter._detached", "--app", "django"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (detached.returncode, detached.stdout, detached.stderr) == (0, "", "")
        assert server.received == []
    for command, text in outputs.items():
        assert PASSWORD not in text, (command, text)
    shown = f"'{endpoint.replace(userinfo, 'REDACTED')}' carries a user name or password; it must not"
    assert shown in outputs["status"]
    assert shown in json.loads(outputs["status --json"])["destination_text"]
    assert outputs["flush"].startswith("invalid-endpoint: sent 0, rejected 0, failed 0, still queued 2\n")
    assert f"The destination is invalid: the endpoint {shown}" in outputs["flush"]
    assert shown in outputs["flush --dry-run"]
    log = (sandbox.state_dir(app) / "flush.log").read_text()
    assert f"invalid-endpoint: the endpoint {shown}" in log
    assert _no_password_under(sandbox.home, but=config) == []
    assert PASSWORD in config.read_text()  # the user's own file is theirs


# --- a home that cannot be written (issue 22, item 5) --------------------------------------------------


def _read_only(home: Path) -> list[str] | None:
    """A command prefix that runs with ``home`` mounted read-only (root with unshare), else ``None``."""
    if not (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("unshare")):
        return None
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", 'mount --bind -r "$1" "$1" && shift && exec "$@"', "sh", str(home)]


@pytest.mark.parametrize("queued", [False, True], ids=["nothing recorded yet", "a queue from before"])
def test_a_read_only_home_is_reported_by_status_and_flush(sandbox: Sandbox, app: App, queued: bool) -> None:
    prefix = _read_only(sandbox.home)
    if prefix is None:
        pytest.skip("needs root and unshare for a read-only bind mount")
    if queued:
        fill(app, sandbox.env, 1)
    folder = sandbox.state_dir(app)
    where = f"{folder} cannot be written" if queued else f"{folder} cannot be created: {sandbox.home} cannot be written"
    why = f"the spool folder {where} (Read-only file system)"
    with serving() as server:

        def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*prefix, *spool_command(), *args],
                env=with_destination(sandbox.env, server.url(), **extra),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        status = run("status")
        doc = run("status", "--json")
        off = run("status", DJANGO_NO_ANALYTICS="1")
        flush = run("flush")
        assert server.received == []
    assert status.returncode == 1, status
    assert f"recording:     impossible, every event is lost: {why}\n" in status.stdout
    assert status.stderr == f"django-spool: events cannot be recorded: {why}\n"
    assert doc.returncode == 1
    assert json.loads(doc.stdout)["record_problem"] == f"events cannot be recorded: {why}"
    assert (off.returncode, off.stderr) == (0, "")  # nothing is lost while reporting is off; still said
    assert f"recording:     impossible, even once reporting is on: {why}\n" in off.stdout
    if queued:
        assert (flush.returncode, flush.stdout) == (1, "")
        assert flush.stderr == f"django-spool: cannot use the spool folder {folder}: Read-only file system\n"
    else:
        assert flush.returncode == 0, flush  # nothing is queued, truly


@pytest.mark.skipif(not ROOT_WITH_SETPRIV, reason="needs root, setpriv and a Python the unprivileged user can run")
def test_a_home_the_user_may_not_write_is_reported_by_status(nobody_sandbox: Sandbox, app: App) -> None:
    sb = nobody_sandbox
    subprocess.run(["chown", "-R", "nobody:nogroup", str(sb.home)], check=True, timeout=30)
    sb.home.chmod(0o555)
    status = subprocess.run(
        [*AS_NOBODY, *spool_command(), "status"], env=sb.env, capture_output=True, text=True, timeout=60, check=False
    )
    why = f"the spool folder {sb.state_dir(app)} cannot be created: {sb.home} cannot be written (Permission denied)"
    assert status.returncode == 1, status
    assert f"recording:     impossible, every event is lost: {why}\n" in status.stdout
    assert status.stderr == f"django-spool: events cannot be recorded: {why}\n"


# --- the age of the oldest event under daylight saving time (item 6) ----------------------------------


def test_the_oldest_events_age_is_right_under_summer_time(sandbox: Sandbox, app: App) -> None:
    """An event recorded on a summer day in Berlin, aged N days and 23 h 30 min: ``N d`` (the age in whole days).
    Reading its UTC time as local summer time made it an hour older: ``N+1 d``."""
    now = time.time()
    year = time.gmtime(now).tm_year - (0 if time.gmtime(now).tm_yday > 200 else 1)
    july = calendar.timegm((year, 7, 15, 12, 0, 0, 0, 0, 0))
    days = int((now - july) // 86400)
    fill(app, sandbox.env, 1, now=now - days * 86400 - 23.5 * 3600)  # a July day, at 30 min of a day boundary
    result = cli(sandbox, "status", env={**sandbox.env, "TZ": "Europe/Berlin"})
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("queued:")]
    assert line.startswith(f"queued:        1 event, oldest {days} d old ({year}-07-1")


# --- counted words and lines that say nothing (item 7) -------------------------------------------------


def test_one_event_kept_in_local_mode_stays(sandbox: Sandbox, app: App) -> None:
    policy = sandbox.write_policy(app, "default=local\n")
    fill(app, sandbox.env, 1)
    assert len(sandbox.local_lines(app)) == 1
    local = cli(sandbox, "flush")
    assert local.returncode == 0, local.stderr
    assert local.stdout.startswith("local: nothing is sent in local mode; 1 event stays on this machine. ")
    policy.unlink()  # sending again, without `enable`: the event stays where it is
    with serving() as server:
        flushed = cli(sandbox, "flush", env=with_destination(sandbox.env, server.url()))
    assert flushed.returncode == 0, flushed.stderr
    assert flushed.stdout.endswith(
        "1 event recorded in local mode stays on this machine; 'django-spool enable' sends them.\n"
    )
    dry = cli(sandbox, "flush", "--dry-run")
    assert "1 event recorded in local mode is kept on this machine;" in dry.stdout


def test_status_says_nothing_of_refusals_that_did_not_happen(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    result = cli(sandbox, "status")
    assert result.returncode == 0, result.stderr
    assert "refused:" not in result.stdout
    assert json.loads(cli(sandbox, "status", "--json").stdout)["refused_by_destination"] == {}  # the field stays
    # A notice never shown is not shown "again".
    (notice,) = [line for line in result.stdout.splitlines() if line.startswith("notice:")]
    assert notice == "notice:        never shown, current 1 (the send wording is shown with the next recorded event)"


# --- the words for a folder that cannot be used (spool_reporter/_files.py), on real paths --------------------


def test_a_spool_path_through_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("a file where a folder should be")
    path = str(tmp_path / "home" / "state" / "spool_reporter" / "django")
    assert folder_problem(path, NotADirectoryError(errno.ENOTDIR, "Not a directory")) == (
        f"the spool folder {path} cannot be made: {tmp_path / 'home'} is not a folder"
    )
    assert record_problem(path) is None  # stat() cannot walk through the file: folder_problem is the one to say
    spool = tmp_path / "state" / "spool_reporter" / "django"
    spool.parent.mkdir(parents=True)
    spool.write_text("a file where the spool folder should be")
    assert record_problem(str(spool)) == f"events cannot be recorded: the spool folder {spool} is not a folder"


def test_a_spool_path_that_vanished_is_still_one_sentence(tmp_path: Path) -> None:
    path = str(tmp_path / "gone" / "spool_reporter" / "django")  # nothing there to blame: lstat fails at "gone"
    assert folder_problem(path, OSError(errno.ELOOP, "Too many levels of symbolic links")) == (
        f"the spool folder {path} is not a folder (or a file stands in its path)"
    )
    assert folder_problem(path, OSError(errno.EIO, "Input/output error")) == (
        f"cannot use the spool folder {path}: Input/output error"
    )
    assert record_problem(path) is None  # tmp_path exists and this user may write it


def test_a_link_on_the_way_is_followed_only_when_trusted(tmp_path: Path) -> None:
    """A link of this user (or root) above the last two levels is followed, as the spool code does; one at the
    last two levels is the blocker the message names."""
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")  # ours, far above the spool folder: trusted
    (tmp_path / "real" / "state").mkdir()
    (tmp_path / "real" / "state" / "spool_reporter").symlink_to(tmp_path)  # at the last two levels: refused
    path = str(tmp_path / "via" / "state" / "spool_reporter" / "django")
    assert folder_problem(path, OSError(errno.ELOOP, "Too many levels of symbolic links")) == (
        f"the spool folder {path} is reached through the symbolic link {tmp_path / 'via' / 'state' / 'spool_reporter'}"
        "; refusing to follow it"
    )
