"""The management commands in another tool's command line: ``main(argv, app=...)``, ``add_commands`` in any
argparse program, the optional Click group, and the worked example (``examples/greet.py``) end to end against
the real self-hosted collector on loopback."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter import App, cli
from spool_reporter._firstrun import notice_text
from spool_reporter._hook import FLUSHER_LOCK_NAME

from support.commands import flusher_idle, unnamed
from support.polling import wait_for
from support.sandbox import REPO, Sandbox

TOOL = App(name="MyTool", version="1.4.2", cli_name="mytool analytics", endpoint="http://mytool.invalid/v1/batch")
GREET = REPO / "examples" / "greet.py"
GREET_CLICK = REPO / "examples" / "greet_click.py"
PATIENT = {
    "SPOOL_REPORTER_FLUSH_DEADLINE": "20",
    "SPOOL_REPORTER_CONNECT_TIMEOUT": "5",
    "SPOOL_REPORTER_READ_TIMEOUT": "10",
}


def py(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- main(argv, app=...) ------------------------------------------------------------------------------

MAIN = """
import json, sys
from spool_reporter import App
from spool_reporter.cli import main
tool = App(name="MyTool", version="1.4.2", cli_name="mytool-analytics", endpoint="http://mytool.invalid/v1/batch")
status = main(json.loads(sys.argv[1]), app=tool)
print(f"returned {status}")
"""


@pytest.mark.parametrize(
    ("argv", "status", "stdout_start"),
    [
        pytest.param(["status"], 0, "reporting:     on - on by default", id="status"),
        pytest.param(["--help"], 0, "usage: mytool-analytics [-h] [--version] COMMAND", id="help"),
        pytest.param(["--version"], 0, "mytool-analytics (spool_reporter) ", id="version"),
        pytest.param(["frobnicate"], 2, "returned 2", id="usage-error"),
        pytest.param(["flush", "--json"], 2, "returned 2", id="flags-error"),
        pytest.param(["collector", "stats"], 2, "returned 2", id="no-collector-for-a-tool"),
    ],
)
def test_main_runs_the_commands_for_any_app_and_returns_the_status(
    sandbox: Sandbox, argv: list[str], status: int, stdout_start: str
) -> None:
    result = py(MAIN, sandbox.env, json.dumps(argv))
    assert result.returncode == 0, result.stderr  # returned, never exited
    assert result.stdout.startswith(stdout_start)
    assert result.stdout.endswith(f"returned {status}\n")
    assert "Traceback" not in result.stderr


def test_the_help_names_the_tool_and_its_switches() -> None:
    text = cli.build_parser(TOOL).format_help()
    assert text.startswith("usage: mytool analytics [-h] [--version] COMMAND ...")
    assert "See and control MyTool usage reporting, implemented by spool_reporter." in text
    assert "MYTOOL_NO_ANALYTICS=1 or DO_NOT_TRACK=1 turn reporting off" in text
    assert "DJANGO" not in text
    listed = re.compile(r"^ {4}(\S+)", re.MULTILINE)  # the subcommands' lines of the help
    assert listed.findall(text) == [c.name for c in cli.COMMANDS]  # no `collector`
    django = cli.build_parser().format_help()
    assert "See and control Django usage reporting (DEP 8)" in django
    assert listed.findall(django) == [*(c.name for c in cli.COMMANDS), "collector"]


# --- add_commands in any argparse program ---------------------------------------------------------------


def tool_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mytool")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build")
    cli.add_commands(commands.add_parser("analytics", help="usage reporting"), TOOL)
    return parser


def test_add_commands_mounts_them_under_the_tools_own_name(capsys: pytest.CaptureFixture[str]) -> None:
    parser = tool_parser()
    assert cli.run_command(parser.parse_args(["build"])) is None  # not ours: the tool runs its own
    with pytest.raises(SystemExit):
        parser.parse_args(["analytics", "flush", "--help"])
    assert capsys.readouterr().out.startswith("usage: mytool analytics flush [-h] [--dry-run] [--json]")
    args = parser.parse_args(["analytics", "flush", "--json"])
    assert cli.run_command(args) == 2
    assert "mytool analytics flush: error: --json goes with --dry-run" in capsys.readouterr().err


def test_one_table_builds_every_front_end() -> None:
    """Adding a command (``sent`` was the last) is one row of COMMANDS and its function: argparse and Click
    read it."""
    names = [c.name for c in cli.COMMANDS]
    assert names == ["status", "enable", "disable", "flush", "sent", "purge", "reset-id", "forget"]
    parser = tool_parser()
    for command in cli.COMMANDS:
        flags = [f for o in command.options for f in o.flags]
        args = parser.parse_args(["analytics", command.name, *flags[:1]])
        assert args.spool_reporter_command is command


def test_add_commands_runs_them_for_the_tool(sandbox: Sandbox) -> None:
    code = f"""
    import sys
    sys.path.insert(0, {str(REPO / "tests")!r})
    from client.test_cli_embedding import tool_parser
    from spool_reporter.cli import run_command
    sys.exit(run_command(tool_parser().parse_args(sys.argv[1:])))
    """
    enable = py(code, unnamed(sandbox), "analytics", "enable", "--local")
    assert enable.returncode == 0, enable.stderr
    assert "See them with: mytool analytics flush --dry-run" in enable.stdout
    assert (sandbox.config_dir / "mytoolanalytics").read_text() == "disable=0\nmode=local\n"
    status = py(code, unnamed(sandbox), "analytics", "status")
    assert status.stdout.startswith("reporting:     on - you chose local mode")


# --- the Click group ---------------------------------------------------------------------------------


def test_the_click_group_is_built_on_the_same_code(sandbox: Sandbox) -> None:
    pytest.importorskip("click")
    env = unnamed(sandbox)
    help_ = subprocess.run(
        [sys.executable, str(GREET_CLICK), "analytics", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_.returncode == 0, help_.stderr
    for command in cli.COMMANDS:
        assert command.name in help_.stdout
    status = subprocess.run(
        [sys.executable, str(GREET_CLICK), "analytics", "status", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["endpoint"] == "http://127.0.0.1:8765/v1/batch"
    usage = subprocess.run(
        [sys.executable, str(GREET_CLICK), "analytics", "flush", "--json"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert usage.returncode == 2
    assert "--json goes with --dry-run" in usage.stderr
    hello = subprocess.run(
        [sys.executable, str(GREET_CLICK), "hello", "World"], env={**env, "GREET_ANALYTICS_ENDPOINT": "http://x.invalid/"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (hello.returncode, hello.stdout) == (0, "Hello, World!\n")
    assert "greet analytics flush --dry-run" in hello.stderr  # the notice names the tool's own command


@pytest.mark.parametrize(
    ("url", "status", "text", "error"),
    [
        pytest.param(
            "https://collector.example/v1/batch", 0, "disable=0\nendpoint=https://collector.example/v1/batch\n", "",
            id="valid",
        ),
        pytest.param(
            "http://collector.example/v1/batch", 2, None, "is plain http:// to collector.example", id="refused"
        ),
    ],
)  # fmt: skip
def test_an_option_with_a_value_is_the_same_in_click_and_argparse(
    tmp_path: Path, url: str, status: int, text: str | None, error: str
) -> None:
    """``enable --endpoint URL`` (an :class:`~spool_reporter.cli.Option` with a ``metavar``) in the Click group and
    in argparse: the same file written, the same words, the same refusal."""
    pytest.importorskip("click")
    seen = []
    for example in (GREET, GREET_CLICK):
        (tmp_path / example.stem).mkdir()
        box = Sandbox(tmp_path / example.stem)
        done = subprocess.run(
            [sys.executable, str(example), "analytics", "enable", "--endpoint", url],
            env=unnamed(box), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        written = box.config_dir / "greetanalytics"
        seen.append((
            done.returncode,
            done.stdout.replace(str(box.root), "ROOT"),
            written.read_text() if written.exists() else None,
            done.stderr.strip().splitlines()[-1:],
        ))  # fmt: skip
    assert seen[0][:3] == seen[1][:3] == (status, seen[0][1], text)
    for _, _, _, stderr in seen:  # argparse's and Click's usage error give the one reason
        assert error in (stderr or [""])[0], seen


def test_click_is_never_imported_by_the_package(sandbox: Sandbox) -> None:
    code = """
    import sys
    import spool_reporter, spool_reporter.cli, spool_reporter._flush, spool_reporter._detached, spool_reporter._spawn
    print("click" in sys.modules)
    """
    assert py(code, sandbox.env).stdout == "False\n"


# --- the worked example, end to end ----------------------------------------------------------------------


@contextlib.contextmanager
def collector(db: Path, env: dict[str, str]) -> Iterator[str]:
    """The real self-hosted collector on a free loopback port, accepting Greet's one command; yields its batch URL."""
    serve = ["serve", "--port", "0", "--db", str(db), "--commands", "Greet=hello"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spool_reporter.collector", *serve],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("listening on "), first
        yield first.removeprefix("listening on ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def stored(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            return conn.execute("SELECT app, event FROM events").fetchall()
        except sqlite3.OperationalError:
            return []


def greet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GREET), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_example_reports_its_commands_end_to_end(sandbox: Sandbox, tmp_path: Path) -> None:
    greet_app = App(name="Greet", version="1.0", cli_name="greet analytics")
    db = tmp_path / "collector.sqlite3"
    base = unnamed(sandbox)
    with collector(db, base) as url:
        env = {**base, "GREET_ANALYTICS_ENDPOINT": url, **PATIENT}
        first = greet(env, "hello", "secret-name-7d1")
        assert (first.returncode, first.stdout) == (0, "Hello, secret-name-7d1!\n")
        assert first.stderr == notice_text(greet_app)  # once, naming `greet analytics ...`
        assert "greet analytics disable" in first.stderr
        # The first run started the detached flusher, which delivers to the collector.
        wait_for(lambda: stored(db) == [("Greet", "hello")], timeout=60, what="the collector to store the event")
        # The collector stores the event before the flusher, reading its answer, takes it out of the spool: on a
        # loaded machine the status below could still count it (2 events, "last flush: never"), and a flusher still
        # running could take the second event too.
        assert (sandbox.state_dir(greet_app) / FLUSHER_LOCK_NAME).exists()  # the wait below waits for something
        wait_for(lambda: flusher_idle(sandbox, greet_app), timeout=60, what="the flusher to end")
        second = greet(env, "hello", "again")
        assert (second.stdout, second.stderr) == ("Hello, again!\n", "")
        status = greet(env, "analytics", "status")
        assert status.returncode == 0, status.stderr
        assert f"destination:   json to {url} (from GREET_ANALYTICS_ENDPOINT)" in status.stdout
        assert "queued:        1 event" in status.stdout  # the second waits for the next flusher
        dry = json.loads(greet(env, "analytics", "flush", "--dry-run", "--json").stdout)
        assert [e["event"] for e in dry["events"]] == ["hello"]
        assert "secret-name" not in json.dumps(dry)  # arguments are never recorded
        flush = greet(env, "analytics", "flush")
        assert flush.stdout.startswith("delivered: sent 1"), flush.stderr
        wait_for(lambda: len(stored(db)) == 2, timeout=30, what="the second event")
        off = greet(env, "analytics", "disable", "--keep-remote")  # the off path; disable's forget: test_disable_forget
        assert off.returncode == 0, off.stderr
        assert greet(env, "hello", "quiet").stderr == ""
        assert json.loads(greet(env, "analytics", "status", "--json").stdout)["queued"] == 0
    assert stored(db) == [("Greet", "hello"), ("Greet", "hello")]
    # Without the environment, the example's own default: the collector `django-spool collector serve` runs.
    status = json.loads(greet(base, "analytics", "status", "--json").stdout)
    assert (status["endpoint"], status["destination_text"]) == (
        "http://127.0.0.1:8765/v1/batch",
        "json to http://127.0.0.1:8765/v1/batch (from Greet's default destination)",
    )
