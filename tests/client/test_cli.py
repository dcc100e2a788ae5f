"""``django-spool`` run as a real subprocess: the installed console script under nox, else ``-m``."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spool_reporter import App, __version__, _hook, record
from spool_reporter._counters import read_counters
from spool_reporter._hook import Folder, django_app
from spool_reporter.cli import fill_words, help_words

from support.commands import cli, spool_command, unnamed
from support.polling import wait_for
from support.sandbox import Sandbox
from support.servers import serving
from support.users import AS_NOBODY, ROOT_WITH_SETPRIV


def queue(sandbox: Sandbox, app: App, n: int) -> None:
    for _ in range(n):
        assert record("startproject", app=app, environ=sandbox.env)


def test_version(sandbox: Sandbox) -> None:
    result = cli(sandbox, "--version")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"django-spool (spool_reporter) {__version__}\n"


@pytest.mark.parametrize(
    "command", [[], ["status"], ["enable"], ["disable"], ["flush"], ["purge"], ["reset-id"], ["forget"]]
)
def test_help_for_every_command(sandbox: Sandbox, command: list[str]) -> None:
    result = cli(sandbox, *command, "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: django-spool")
    assert "exit status: 0 success, 1 failure, 2 usage error (141: the output pipe closed early)." in result.stdout


def test_a_help_text_shows_its_braces_as_written(sandbox: Sandbox) -> None:
    """Only the help words are filled in: a brace in a command's docstring (sent's JSON shape) is shown as it is
    written, where ``str.format`` would have needed it doubled, or failed on it."""
    words = help_words(django_app(), "django-spool")
    assert fill_words('{prog} {name}: {"a": [1]} {unknown} {', words) == 'django-spool Django: {"a": [1]} {unknown} {'
    result = cli(sandbox, "sent", "--help")
    assert result.returncode == 0
    assert 'With --json, one object {"requests": [...], "damaged": n} with' in result.stdout


@pytest.mark.parametrize("args", [[], ["frobnicate"], ["status", "--bogus"], ["flush", "--dry-run", "extra"]], ids=str)
def test_bad_usage_exits_2_on_stderr(sandbox: Sandbox, args: list[str]) -> None:
    result = cli(sandbox, *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: django-spool" in result.stderr


def test_status_default_opt_out(sandbox: Sandbox, app: App) -> None:
    env = unnamed(sandbox, DJANGO_ANALYTICS_ENDPOINT="https://collector.example/v1/batch")
    result = cli(sandbox, "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["enabled"] is True
    assert data["reason"] == "default"
    assert data["mode"] == "opt-out"
    assert data["queued"] == 0
    assert data["endpoint"] == "https://collector.example/v1/batch"
    assert {"dropped", "last_flush", "next_retry"} <= set(data)
    text = cli(sandbox, "status", env=env)
    assert text.returncode == 0
    assert text.stdout.startswith("reporting:     on - on by default (opt-out)")
    # status writes nothing: no config, no spool folder
    assert not sandbox.config_dir.exists()
    assert not (sandbox.home / "state").exists()


def test_status_without_a_destination_says_nothing_is_recorded(sandbox: Sandbox, app: App) -> None:
    result = cli(sandbox, "status", env=unnamed(sandbox))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "reporting:     off - no destination configured: nothing is recorded until an endpoint is set "
        "[destination:none]"
    )
    assert lines[2] == (
        f"destination:   none configured: nothing is recorded until one is set (endpoint= in "
        f"{sandbox.user_file(app)}, or DJANGO_ANALYTICS_ENDPOINT)"
    )
    data = json.loads(cli(sandbox, "status", "--json", env=unnamed(sandbox)).stdout)
    assert (data["enabled"], data["reason"], data["endpoint"]) == (False, "destination:none", None)
    enable = cli(sandbox, "enable", env=unnamed(sandbox))
    assert enable.returncode == 1
    assert "Reporting stays off: no destination configured" in enable.stdout
    assert f"endpoint= in {sandbox.user_file(app)}" in enable.stdout


@pytest.mark.parametrize(
    ("setting", "env", "line", "text"),
    [
        pytest.param("disable=maybe\n", {}, 0,
                     "reporting:     off - you turned it off (disable=maybe in your config file; any value but "
                     "empty or 0 means off) [user:disable]", id="disable=maybe"),
        pytest.param("", {"DJANGO_ANALYTICS_ENDPOINT": "not a url"}, 2,
                     "destination:   the endpoint 'not a url' is not a URL: it contains a space "
                     "(from DJANGO_ANALYTICS_ENDPOINT)", id="not-a-url"),
        pytest.param("", {"DJANGO_ANALYTICS_ENDPOINT": "collector.example/v1/batch"}, 2,
                     "destination:   the endpoint 'collector.example/v1/batch' is not a URL: it must start with "
                     "https:// (from DJANGO_ANALYTICS_ENDPOINT)", id="no-scheme"),
        pytest.param("endpoint=ftp://collector.example/\n", {}, 2,
                     "destination:   the endpoint 'ftp://collector.example/' uses ftp://; it must be an https:// "
                     "URL (from the user config file)", id="ftp"),
        pytest.param("", {"DO_NOT_TRACK": "yes"}, 0,
                     "reporting:     off - the environment variable DO_NOT_TRACK is set (DO_NOT_TRACK=yes; any "
                     "value but empty or 0 means off) [env:DO_NOT_TRACK]", id="dnt=yes"),
    ],
)  # fmt: skip
def test_status_says_what_the_value_is_and_why_it_was_refused(
    sandbox: Sandbox, app: App, setting: str, env: dict[str, str], line: int, text: str
) -> None:
    if setting:
        sandbox.write_user(app, setting)
    result = cli(sandbox, "status", env=unnamed(sandbox, **env))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[line] == text


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        pytest.param(["status"], ("urllib3", "spool_reporter._flush", "spool_reporter._http"), id="status"),
        pytest.param(
            ["flush", "--dry-run"], ("urllib3", "spool_reporter._flush", "spool_reporter._http"), id="dry-run"
        ),
    ],
)
def test_reading_commands_import_neither_the_sender_nor_the_collector_server(
    sandbox: Sandbox, app: App, args: list[str], absent: tuple[str, ...]
) -> None:
    # `status` reads one JSON file and counts a folder: the flusher, urllib3 and the collector's server (whose
    # commands the parser lists) stay unimported.
    queue(sandbox, app, 2)
    code = f"import json, sys\nfrom spool_reporter.cli import main\nmain({args!r})\n"
    code += "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    server = {"spool_reporter.collector._server", "spool_reporter.collector._wsgi", "http.server"}
    assert not loaded & {*absent, *server}, sorted(loaded & {*absent, *server})


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a folder away needs root")
def test_a_spool_folder_of_another_user_is_named_and_refused(sandbox: Sandbox, app: App) -> None:
    folder = sandbox.state_dir(app)
    folder.mkdir(parents=True)
    os.chown(folder.parent, pwd.getpwnam("nobody").pw_uid, -1)  # spool_reporter/: a level that must be ours
    result = cli(sandbox, "status")
    assert result.returncode == 1
    assert result.stderr == f"django-spool: the spool folder {folder} belongs to another user; refusing to use it\n"
    assert "queued:        unknown (the spool folder cannot be read)" in result.stdout


def test_status_counts_queue_and_drops(sandbox: Sandbox, app: App) -> None:
    queue(sandbox, app, 3)
    with Folder(str(sandbox.state_dir(app)), create=False) as folder:
        from spool_reporter._counters import add_counter

        add_counter(folder, "corrupt", 2)
    data = json.loads(cli(sandbox, "status", "--json").stdout)
    assert data["queued"] == 3
    assert data["dropped"] == 2
    assert data["oldest"].endswith("Z")
    text = cli(sandbox, "status").stdout
    assert "queued:        3 events, oldest" in text
    assert "dropped:       2 (corrupt 2)" in text


@pytest.mark.parametrize(
    ("env", "reason"),
    [({"DJANGO_NO_ANALYTICS": "1"}, "env:DJANGO_NO_ANALYTICS"), ({"CI": "true"}, "ci:CI")],
)
def test_status_names_the_rule(sandbox: Sandbox, env: dict[str, str], reason: str) -> None:
    data = json.loads(cli(sandbox, "status", "--json", env={**sandbox.env, **env}).stdout)
    assert (data["enabled"], data["reason"]) == (False, reason)


def test_enable_is_an_explicit_yes_even_in_ci_and_opt_in(sandbox: Sandbox, app: App) -> None:
    sandbox.write_policy(app, "default=off\n")
    ci = {**sandbox.env, "CI": "true"}
    assert json.loads(cli(sandbox, "status", "--json", env=ci).stdout)["enabled"] is False
    result = cli(sandbox, "enable", env=ci)
    assert result.returncode == 0, result.stderr
    assert "Reporting is on" in result.stdout
    data = json.loads(cli(sandbox, "status", "--json", env=ci).stdout)
    assert (data["enabled"], data["reason"], data["mode"]) == (True, "user:enable", "opt-in")


def test_enable_fails_when_something_stronger_says_no(sandbox: Sandbox, app: App) -> None:
    sandbox.write_policy(app, "disable=1\n")
    result = cli(sandbox, "enable")
    assert result.returncode == 1
    assert "Reporting stays off: the system policy turns reporting off" in result.stdout


# --- enable --endpoint: the destination written to the file this platform reads ---------------------------


@pytest.mark.parametrize(
    "config_home",
    [
        pytest.param(None, id="platform-default"),  # Linux: ~/.config, which a fresh account does not have yet
        pytest.param("deep/er/config", id="xdg-config-home-missing"),  # an absolute XDG_CONFIG_HOME not made yet
    ],
)
def test_enable_endpoint_on_a_fresh_account_writes_the_file_the_hook_reads(
    sandbox: Sandbox, app: App, config_home: str | None
) -> None:
    env = {k: v for k, v in unnamed(sandbox).items() if k != "XDG_CONFIG_HOME"}
    if config_home is not None:
        env["XDG_CONFIG_HOME"] = str(sandbox.home / config_home)
    expected = Path(_hook.user_config_path(app, env))
    if config_home is None and sys.platform.startswith("linux"):
        assert expected == sandbox.home / ".config" / "djangoanalytics"
    assert not expected.parent.exists()
    with serving() as server:
        url = server.url()
        result = cli(sandbox, "enable", "--endpoint", url, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[:2] == [
            f"Wrote disable=0, endpoint={url} to {expected}.",
            f"Destination: json to {url} (from the user config file).",
        ]
        assert expected.read_text() == f"disable=0\nendpoint={url}\n"
        assert stat.S_IMODE(expected.stat().st_mode) == 0o600
        assert stat.S_IMODE(expected.parent.stat().st_mode) == 0o700
        data = json.loads(cli(sandbox, "status", "--json", env=env).stdout)
        assert (data["config_file"], data["endpoint"], data["enabled"]) == (str(expected), url, True)
        # The hook reads the same file: an event is recorded for that endpoint and a flush delivers it there.
        assert record("startproject", app=app, environ=env)
        (line,) = sandbox.spool_lines(app)
        event_id = json.loads(line)["event_id"]
        cli(sandbox, "flush", env=env)
        wait_for(lambda: event_id in server.event_ids(), what="the event at the endpoint enable wrote")


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("ftp://collector.example/v1/batch", id="ftp"),
        pytest.param("http://collector.example/v1/batch", id="plain-http-remote"),
        pytest.param("https://user:s3cret@collector.example/v1/batch", id="credentials"),
        pytest.param("collector.example/v1/batch", id="no-scheme"),
    ],
)
def test_enable_refuses_an_endpoint_that_status_refuses_and_writes_nothing(
    sandbox: Sandbox, app: App, url: str
) -> None:
    env = unnamed(sandbox)
    refused = cli(sandbox, "enable", "--endpoint", url, env=env)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert "usage: django-spool enable" in refused.stderr
    reason = refused.stderr.splitlines()[-1].removeprefix("django-spool enable: error: ")
    assert reason.startswith("the endpoint ")
    assert not sandbox.config_dir.exists()  # nothing written, not even the folder
    # The same words status gives for that value in the file; a password is shown in neither.
    sandbox.write_user(app, f"endpoint={url}\n")
    status = cli(sandbox, "status", env=env)
    assert f"destination:   {reason} (from the user config file)" in status.stdout.splitlines()
    assert "s3cret" not in refused.stderr + status.stdout


def test_enable_endpoint_replaces_the_older_one_and_keeps_the_rest(sandbox: Sandbox, app: App) -> None:
    env = unnamed(sandbox)
    cid = "5d1c0a4e-8b1f-4c3a-9e2d-7f6a5b4c3d2e"
    sandbox.write_user(
        app, f"# mine\nEndpoint = https://old.example/a\nclient_id={cid}\nendpoint=https://older.example/b\n"
    )
    result = cli(sandbox, "enable", "--endpoint", "https://new.example/v1/batch", env=env)
    assert result.returncode == 0, result.stderr
    text = sandbox.user_file(app).read_text()
    assert text == f"# mine\nclient_id={cid}\nendpoint=https://new.example/v1/batch\ndisable=0\n"
    assert json.loads(cli(sandbox, "status", "--json", env=env).stdout)["endpoint"] == "https://new.example/v1/batch"


def test_enable_local_with_an_endpoint_records_it_and_keeps_events_here(sandbox: Sandbox, app: App) -> None:
    env = unnamed(sandbox)
    url = "https://collector.example/v1/batch"
    result = cli(sandbox, "enable", "--local", "--endpoint", url, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:3] == [
        f"Wrote disable=0, mode=local, endpoint={url} to {sandbox.user_file(app)}.",
        f"Destination: json to {url} (from the user config file); not used in local mode.",
        "Local mode: events are recorded on this machine and never sent. See them with: django-spool flush --dry-run",
    ]
    assert record("startproject", app=app, environ=env)
    assert (len(sandbox.local_lines(app)), sandbox.spool_lines(app)) == (1, [])
    data = json.loads(cli(sandbox, "status", "--json", env=env).stdout)
    assert (data["local"], data["endpoint"]) == (True, url)
    sending = cli(sandbox, "enable", env=env)  # the way to send them, to the endpoint written before
    assert f"1 queued event will be sent to {url} by the next flusher" in sending.stdout


def test_enable_endpoint_says_when_the_environment_wins(sandbox: Sandbox, app: App) -> None:
    env = unnamed(sandbox, DJANGO_ANALYTICS_ENDPOINT="https://env.example/v1/batch")
    result = cli(sandbox, "enable", "--endpoint", "https://mine.example/v1/batch", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == (
        "Destination: json to https://env.example/v1/batch (from DJANGO_ANALYTICS_ENDPOINT). DJANGO_ANALYTICS_ENDPOINT "
        f"is set and wins over the endpoint in {sandbox.user_file(app)}: unset it to use that one."
    )
    assert "endpoint=https://mine.example/v1/batch" in sandbox.user_file(app).read_text()
    mine = {k: v for k, v in env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}
    assert json.loads(cli(sandbox, "status", "--json", env=mine).stdout)["endpoint"] == "https://mine.example/v1/batch"


def test_disable_keeps_other_keys_and_deletes_the_queue(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "# my settings\nendpoint=http://127.0.0.1:9/v1/batch\ndisable=0\n")
    queue(sandbox, app, 4)
    before = sandbox.user_file(app).read_text()
    client_id = next(line for line in before.splitlines() if line.startswith("client_id="))
    result = cli(sandbox, "disable")
    assert result.returncode == 0, result.stderr
    # The sandbox's destination is refused (plain http to a remote host): nobody to ask to forget the id.
    assert result.stdout.endswith(
        "Reporting is off.\nDeleted 4 queued events.\nNo valid destination is configured (the endpoint "
        "'http://sandbox.invalid/v1/batch' is plain http:// to sandbox.invalid, which is only allowed to a loopback "
        "host (127.0.0.1, ::1, localhost); use https:// (from DJANGO_ANALYTICS_ENDPOINT)): there is no collector to "
        "ask; your client id is kept, so that 'django-spool forget' can ask once there is one.\n"
    )
    after = sandbox.user_file(app).read_text()
    # record() without notice=True created the id and noted that no notice was shown (notice_version=0).
    assert after == f"# my settings\nendpoint=http://127.0.0.1:9/v1/batch\ndisable=1\n{client_id}\nnotice_version=0\n"
    assert sandbox.spool_lines(app) == []
    assert not record("startproject", app=app, environ=sandbox.env)
    assert cli(sandbox, "enable").returncode == 0
    assert "disable=0" in sandbox.user_file(app).read_text()


def test_purge_reports_the_count(sandbox: Sandbox, app: App) -> None:
    queue(sandbox, app, 5)
    result = cli(sandbox, "purge")
    assert (result.returncode, result.stdout) == (0, "Deleted 5 queued events.\n")
    assert cli(sandbox, "purge").stdout == "Deleted 0 queued events.\n"


def test_reset_id(sandbox: Sandbox, app: App) -> None:
    queue(sandbox, app, 1)
    old = sandbox.user_file(app).read_text()
    result = cli(sandbox, "reset-id")
    assert result.returncode == 0, result.stderr
    new = sandbox.user_file(app).read_text()
    assert new != old
    assert new.count("client_id=") == 1
    queue(sandbox, app, 1)
    ids = [json.loads(line)["client_id"] for line in sandbox.spool_lines(app)]
    assert ids[0] != ids[1]
    assert f"client_id={ids[1]}" in new


def test_unreadable_config_file(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "this line has no equals sign\n")
    data = json.loads(cli(sandbox, "status", "--json").stdout)
    assert (data["enabled"], data["reason"]) == (False, "user:unreadable")
    result = cli(sandbox, "enable")
    assert result.returncode == 1
    assert "cannot be read safely" in result.stderr
    assert sandbox.user_file(app).read_text() == "this line has no equals sign\n"  # never clobbered
    result = cli(sandbox, "disable")
    assert result.returncode == 1
    assert "Deleted 0 queued events." in result.stdout


def test_symlinked_config_is_not_written_through(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    target = tmp_path / "dotfile"
    target.write_text("disable=0\n")
    sandbox.config_dir.mkdir(parents=True)
    sandbox.user_file(app).symlink_to(target)
    result = cli(sandbox, "disable")
    assert result.returncode == 1
    assert "symbolic link" in result.stderr
    assert target.read_text() == "disable=0\n"


def test_a_spool_locked_by_another_process(sandbox: Sandbox, app: App) -> None:
    queue(sandbox, app, 2)
    lock = sandbox.state_dir(app) / "spool.lock"
    code = textwrap.dedent(
        f"""
        import fcntl, os, sys
        fd = os.open({str(lock)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.read()
        """
    )
    env = {**sandbox.env}
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        # status only reads: it does not wait for the lock
        assert json.loads(cli(sandbox, "status", "--json", env=env).stdout)["queued"] == 2
        purge = subprocess.Popen(
            [*spool_command(), "purge"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        holder.communicate(input="", timeout=30)  # release: purge proceeds
        out, err = purge.communicate(timeout=60)
    assert (purge.returncode, out) == (0, "Deleted 2 queued events.\n"), err
    with Folder(str(sandbox.state_dir(app)), create=False) as folder:
        assert read_counters(folder) == {}


# --- a closed pipe (issue 16, item 1) ------------------------------------------------------------------


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--json"], ["flush", "--dry-run"], ["flush", "--dry-run", "--json"], ["--help"], ["purge"]],
    ids=" ".join,
)
def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status(
    sandbox: Sandbox, app: App, args: list[str], buffered: bool
) -> None:
    """The reader is gone before the first byte (a `| head -1` that already exited): no message, no traceback,
    and the status a shell reports for a command ended by SIGPIPE, whatever the output path."""
    queue(sandbox, app, 20)
    env = {k: v for k, v in sandbox.env.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [*spool_command(), *args], stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60, check=False
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, b"")


def test_head_of_a_pipeline(sandbox: Sandbox, app: App) -> None:
    """`django-spool flush --dry-run | head -2` as a user types it: two lines, nothing on stderr."""
    queue(sandbox, app, 200)
    command = f"{' '.join(spool_command())} flush --dry-run | head -2"
    result = subprocess.run(
        ["sh", "-c", command], env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert result.stdout.startswith("200 queued events; nothing is sent by --dry-run.\n")
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == ""


# --- an unreadable spool folder, as an unprivileged user (issue 16, item 2) ----------------------------


@pytest.mark.skipif(not ROOT_WITH_SETPRIV, reason="needs root, setpriv and a Python the unprivileged user can run")
@pytest.mark.parametrize("locked", ["spool folder", "its parent"])
def test_an_unreadable_spool_folder_says_why_and_fails(nobody_sandbox: Sandbox, app: App, locked: str) -> None:
    sb = nobody_sandbox
    queue(sb, app, 2)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(sb.home)], check=True, timeout=30)
    folder = sb.state_dir(app)
    blocked = folder if locked == "spool folder" else folder.parent
    blocked.chmod(0)
    cause = f"cannot read the spool folder {folder}: permission denied"
    if blocked != folder:
        cause += f" ({blocked} cannot be entered)"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*AS_NOBODY, *spool_command(), *args], env=sb.env, capture_output=True, text=True, timeout=60, check=False
        )

    status = run("status")
    assert status.returncode == 1
    assert "queued:        unknown (the spool folder cannot be read)" in status.stdout
    assert "last flush:    unknown" in status.stdout
    assert status.stderr == f"django-spool: {cause}\n"
    data = run("status", "--json")
    assert data.returncode == 1
    doc = json.loads(data.stdout)
    assert (doc["queued"], doc["dropped"], doc["last_result"], doc["problem"]) == (None, None, None, cause)
    for args in (["purge"], ["flush"], ["flush", "--dry-run"], ["flush", "--dry-run", "--json"], ["disable"]):
        result = run(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.endswith(f"django-spool: {cause}\n"), (args, result.stderr)
        assert result.stderr.count(str(folder)) == 1, (args, result.stderr)  # the path, once
        assert "sent 0" not in result.stdout, args  # no made-up answer
        assert '"events": []' not in result.stdout, args
