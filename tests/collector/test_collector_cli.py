"""The collector's command line as the user types it, both ways: ``django-spool collector ...`` and
``python -m spool_reporter.collector ...``, as real subprocesses. It reads like the client's (issue 22, item 8):
the same ``--help`` footer, "commands:", errors that start with the command typed, the same exit statuses; and
``stats --help`` names every key of the JSON documents ``stats --json`` prints."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter._cli_common import DOCS_URL, EXIT_STATUS, docs_page
from spool_reporter.collector import Limits, Retention, open_store
from spool_reporter.collector._common import DEFAULT_APP, DEFAULT_MAX_AGE_DAYS, EPSILON, LICENCE, MIN_COUNT, VARIABLES
from spool_reporter.collector._weeks import this_week

from support.commands import spool_command
from support.events import DAY, row
from support.sandbox import REPO, Sandbox

COMMANDS = ("serve", "stats", "migrate", "rollup")
"""The collector's commands, in ``--help`` order."""


@pytest.fixture(params=["django-spool collector", "python -m spool_reporter.collector"])
def prog(request: pytest.FixtureRequest) -> str:
    """The program the user typed; :func:`collector` runs it."""
    return str(request.param)


def collector(sandbox: Sandbox, prog: str, *args: str, **options: object) -> subprocess.CompletedProcess[str]:
    """Run ``prog`` (one of :func:`prog`'s) with ``args``; ``options`` for :func:`subprocess.run` replace the
    captured output."""
    if prog.startswith("django-spool"):
        command = [*spool_command(), "collector"]
    else:
        command = [sys.executable, "-m", prog.removeprefix("python -m ")]
    options = options or {"capture_output": True}
    return subprocess.run([*command, *args], env=sandbox.env, text=True, timeout=60, check=False, **options)


DEFAULTS: dict[str, str] = {
    "--max-age-days": f"{DEFAULT_MAX_AGE_DAYS:g}",
    "--retain-days": f"{Retention().retain_days:g}",
    "--rollup-every": f"{Retention().rollup_every:g}",
    "--max-per-client-week": f"{Limits().per_client_week}; 0: no cap",
    "--min-count": str(MIN_COUNT),
    "--epsilon": f"{EPSILON:g}",
    "--data-license": LICENCE,
    "--app": DEFAULT_APP,
}
"""Each option's default as ``--help`` must state it, from the constant the collector uses."""

SHOWN: dict[str, set[str]] = {
    "serve": {
        "--max-age-days",
        "--retain-days",
        "--rollup-every",
        "--max-per-client-week",
        "--min-count",
        "--epsilon",
        "--data-license",
    },
    "stats": {"--min-count", "--epsilon", "--data-license", "--app"},
    "rollup": {"--max-age-days", "--retain-days", "--epsilon"},
}


def _option_defaults(help_text: str) -> dict[str, str]:
    """``--flag`` -> the text of its ``(default: ...)``, from an argparse help (entries joined across wrapping)."""
    entries: list[str] = []
    for line in help_text.splitlines():
        if re.match(r"  -", line):
            entries.append(line)
        elif entries and line.startswith("   "):
            entries[-1] += " " + line.strip()
        else:
            entries.append("")
    found = {}
    for entry in entries:
        flag, default = re.search(r"--[\w-]+", entry), re.search(r"\(default: ([^()]*)\)\s*$", entry)
        if flag and default:
            found[flag.group(0)] = " ".join(default.group(1).split())
    return found


@pytest.mark.parametrize("command", sorted(SHOWN))
def test_help_states_the_defaults_the_collector_uses(sandbox: Sandbox, command: str) -> None:
    """The defaults in ``--help`` are the collector's constants, not copies: a change to ``_common.EPSILON``
    changes the help with the behaviour."""
    done = collector(sandbox, "python -m spool_reporter.collector", command, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    shown = _option_defaults(done.stdout)
    assert {flag: shown.get(flag) for flag in SHOWN[command]} == {flag: DEFAULTS[flag] for flag in SHOWN[command]}


@pytest.mark.parametrize("command", [(), *((c,) for c in COMMANDS)], ids=lambda c: " ".join(c) or "top")
def test_every_help_ends_with_the_footer(sandbox: Sandbox, prog: str, command: tuple[str, ...]) -> None:
    done = collector(sandbox, prog, *command, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: {' '.join((prog, *command))} [-h]"), done.stdout
    words = " ".join(done.stdout.split())  # as wrapped to the terminal's width (80 columns without one)
    tail = words[words.rindex(EXIT_STATUS) :]
    assert f"environment: {VARIABLES.db} stands for --db;" in tail
    assert tail.endswith(f"docs: {docs_page('collector')}")
    assert done.stdout.endswith(f"\ndocs: {docs_page('collector')}\n")


def test_the_top_help_lists_commands(sandbox: Sandbox, prog: str) -> None:
    done = collector(sandbox, prog, "--help")
    assert "\ncommands:\n  COMMAND\n" in done.stdout
    assert "positional arguments:" not in done.stdout
    section = done.stdout.split("\ncommands:\n  COMMAND\n")[1].split("\n\n")[0]
    assert re.findall(r"^    (\S+) ", section, re.MULTILINE) == list(COMMANDS)


def test_the_docs_link_is_the_projects(sandbox: Sandbox) -> None:
    """The footer's docs address is the one the client's footer and the package metadata give, and names a page
    that exists."""
    assert f'Documentation = "{DOCS_URL}"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert App(name="X", version="1").docs_url == DOCS_URL
    assert docs_page("collector") == f"{DOCS_URL}en/latest/collector.html"
    assert (REPO / "docs" / "collector.md").is_file()


@pytest.mark.parametrize("command", COMMANDS)
def test_without_a_database_each_command_says_so_under_its_name(sandbox: Sandbox, prog: str, command: str) -> None:
    done = collector(sandbox, prog, command)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"{prog} {command}: give --db or set ${VARIABLES.db}\n"


def test_usage_errors_name_the_command_typed(sandbox: Sandbox, prog: str) -> None:
    """argparse's errors, the collector's own usage errors and no command at all: exit status 2, and the line
    that says why starts with the command typed (after argparse's usage line)."""
    cases = [
        (("stats", "--bogus"), "stats: error: unrecognized arguments: --bogus"),
        (("serve", "--port", "x"), "serve: error: argument --port: invalid int value: 'x'"),
        (("rollup", "--db", "x.sqlite3", "--epsilon", "11"), "rollup: error: argument --epsilon: "),
        (("serve", "--db", "x.sqlite3", "--port", "70000"), "serve: port must be 0-65535, got 70000"),
        (("nonsense",), ": error: argument COMMAND: invalid choice: 'nonsense'"),
        ((), ": error: the following arguments are required: COMMAND"),
    ]
    for args, said in cases:
        done = collector(sandbox, prog, *args, cwd=sandbox.root, capture_output=True)
        assert (done.returncode, done.stdout) == (2, ""), (args, done.stderr)
        last = done.stderr.splitlines()[-1]
        assert last.startswith(f"{prog}{' ' if said[0] != ':' else ''}{said}"), (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_failures_name_the_command_typed(sandbox: Sandbox, prog: str, tmp_path: Path) -> None:
    """A database that is missing or not a database, a page that cannot be written: one line that starts with the
    command typed, exit status 1."""
    missing = tmp_path / "missing.sqlite3"
    real = tmp_path / "real.sqlite3"
    open_store(real).close()
    cases = [
        (("stats", "--db", str(missing)), f"{prog} stats: no collector database at {missing}"),
        (("migrate", "--db", str(tmp_path)), f"{prog} migrate: cannot open the collector database {tmp_path}: not a "),
        (("rollup", "--db", str(tmp_path)), f"{prog} rollup: cannot open the collector database {tmp_path}: not a "),
        (("stats", "--public", "--db", str(missing)), f"{prog} stats: no collector database at {missing}"),
        (("stats", "--db", str(real), "--html", str(tmp_path / "no" / "page.html")), f"{prog} stats: cannot write "),
    ]
    for args, said in cases:
        done = collector(sandbox, prog, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1, (args, done.stderr)
        assert done.stderr.startswith(said), (args, done.stderr)
    assert not missing.exists()


@pytest.mark.parametrize("args", [["--help"], ["stats", "--help"], ["stats", "--json"], ["migrate"]], ids=" ".join)
def test_a_closed_pipe_ends_quietly_with_the_sigpipe_status(
    sandbox: Sandbox, prog: str, tmp_path: Path, args: list[str]
) -> None:
    """The reader is gone before the first byte: no message, no traceback, status 141, as for the client."""
    db = tmp_path / "c.sqlite3"
    open_store(db).close()
    if "--help" not in args:
        args = [*args, "--db", str(db)]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = collector(sandbox, prog, *args, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


# --- stats --json: its help names the whole document ---------------------------------------------------------


@pytest.fixture
def released(tmp_path: Path) -> Path:
    """A SQLite collector database with eight weeks of events, rolled up: the exact numbers and public releases
    of weeks (and of a month when one has closed)."""
    db = tmp_path / "c.sqlite3"
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    store = open_store(db)
    try:
        store.insert([row(("dev", i), now - back * 7 * DAY) for i in range(5) for back in range(8)])
        store.set_first_week(this_week(now - 9 * 7 * DAY))
    finally:
        store.close()
    return db


DATA_MAPS = {"by_django": 1, "by_python": 1, "by_os": 1, "by_event": 1, "refused": 2}
"""The fields whose value maps data (a version, an OS, a command; a week, then a reason) to numbers, and how many
levels of keys are data there."""


def keys_of(doc: object, *, data: int = 0) -> set[str]:
    """Every key of a JSON document that names a field, at any depth: the keys of :data:`DATA_MAPS` are data,
    not fields (their values are still walked: a public breakdown maps a version to a number's fields)."""
    found: set[str] = set()
    if isinstance(doc, list):
        for item in doc:
            found |= keys_of(item, data=data)
    elif isinstance(doc, dict):
        for key, value in doc.items():
            if data:
                found |= keys_of(value, data=data - 1)
            else:
                found.add(key)
                found |= keys_of(value, data=DATA_MAPS.get(key, 0))
    return found


def test_stats_help_names_every_key_of_the_json(sandbox: Sandbox, released: Path) -> None:
    prog = "python -m spool_reporter.collector"
    made = collector(sandbox, prog, "rollup", "--db", str(released))
    assert made.returncode == 0, made.stderr
    assert "released publicly:" in made.stdout
    exact = json.loads(collector(sandbox, prog, "stats", "--db", str(released), "--json").stdout)
    public = json.loads(collector(sandbox, prog, "stats", "--db", str(released), "--public", "--json").stdout)
    assert exact["weeks"]
    assert public["weeks"]
    assert public["weeks"][0]["by_django"]  # a breakdown's numbers, whose keys are walked too
    help_text = collector(sandbox, prog, "stats", "--help").stdout
    exact_part, public_part = help_text.split("With --public")
    for doc, part in ((exact, exact_part), (public, public_part)):
        keys = keys_of(doc)
        assert {"app", "weeks"} <= keys
        missing = sorted(key for key in keys if f'"{key}"' not in part)
        assert not missing, f"stats --help does not name {missing}"
    assert "by_event" in keys_of(exact)
    assert {"week_epsilon", "estimate"} <= keys_of(public)
    assert not keys_of(exact) & {"5.2", "Linux", "runserver"}  # data, not fields
