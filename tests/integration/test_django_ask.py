"""Ask mode with real Django commands on a real pseudo-terminal (issue 31's question; docs/consent.md).

The system policy says ``default=ask``. ``django-admin``/``manage.py`` run on a pty (``support.terminal``) and the
answer is typed at it: y, n, Enter under both ``ask_default`` values, nothing within the bound, Ctrl-C and Ctrl-D.
The same commands without a terminal must neither ask, nor wait, nor write anything.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from spool_reporter._ask import RUNS_SUFFIX

from ._django_user import APP, NOTICE, User
from support.terminal import CTRL_C, CTRL_D, on_terminal

pytestmark = [
    pytest.mark.django,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals"),
]

SHORT_BOUND = "1.5"
"""SPOOL_REPORTER_ASK_SECONDS for the tests that let the question go unanswered (the real bound is 30 s)."""


def _ask_policy(u: User, extra: str = "") -> None:
    u.sandbox.write_policy(APP, "default=ask\n" + extra)


def _user_values(u: User) -> dict[str, str]:
    path = u.sandbox.user_file(APP)
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _startproject(u: User, name: str, answer: bytes | None, **env: str) -> tuple[int, bytes, bool, object]:
    """``django-admin startproject name`` on a terminal; the question's moment records whether the command's work
    (the project's manage.py) was done by then."""
    argv = [u.venv.python, u.venv.django_admin, "startproject", name]
    environ = {**u.env, **env}
    run = on_terminal(argv, env=environ, cwd=u.work, answer=answer, at_question=(u.work / name / "manage.py").exists)
    return run.returncode, run.output, run.asked, run.seen_at_question


@pytest.mark.parametrize(
    ("ask_default", "typed", "answered"),
    [
        pytest.param("", b"y\r", "yes", id="y"),
        pytest.param("", b"yes\r", "yes", id="yes"),
        pytest.param("", b"n\r", "no", id="n"),
        pytest.param("", b"\r", "yes", id="enter-default-yes"),
        pytest.param("ask_default=no\n", b"\r", "no", id="enter-default-no"),
        pytest.param("ask_default=no\n", b"Y\r", "yes", id="y-default-no"),
    ],
)
def test_one_question_after_the_command_then_the_answer_holds(
    user: User, ask_default: str, typed: bytes, answered: str
) -> None:
    _ask_policy(user, ask_default)
    code, output, asked, work_done = _startproject(user, "first", typed)
    assert code == 0, output
    assert asked, output
    assert work_done, "the question came before the command's own work"
    assert (b"[y/N]" if ask_default else b"[Y/n]") in output
    values = _user_values(user)
    assert values["disable"] == ("0" if answered == "yes" else "1")
    assert values["notice_version"] == str(APP.notice_version)
    assert NOTICE not in output.replace(b"\r\n", b"\n")  # the question said it: no notice besides
    assert user.names() == (["startproject"] if answered == "yes" else [])
    # Asked once: the next command at a terminal asks nothing, and records (or not) as answered.
    code, output, asked, _ = _startproject(user, "second", None)
    assert code == 0, output
    assert not asked, output
    assert user.names() == (["startproject", "startproject"] if answered == "yes" else [])


@pytest.mark.parametrize(
    ("typed", "bound"),
    [
        pytest.param(None, SHORT_BOUND, id="no-answer-in-time"),
        pytest.param(CTRL_C, "30", id="ctrl-c"),
        pytest.param(CTRL_D, "30", id="eof"),
    ],
)
def test_no_answer_records_nothing_keeps_the_exit_status_and_asks_again(
    user: User, typed: bytes | None, bound: str
) -> None:
    _ask_policy(user)
    started = time.monotonic()
    code, output, asked, _ = _startproject(user, "first", typed, SPOOL_REPORTER_ASK_SECONDS=bound)
    assert asked, output
    assert code == 0, output
    assert b"will ask again next time" in output
    if typed is not None:
        assert time.monotonic() - started < 25, "the keystroke did not end the question"
    assert not user.sandbox.user_file(APP).exists()
    assert user.names() == []
    # A failing command (the folder exists): its exit status is Django's, with Ctrl-C at the question too.
    code, output, asked, _ = _startproject(user, "first", CTRL_C)
    assert asked, output
    assert code == 1, output
    assert b"already exists" in output
    assert user.names() == []
    code, output, asked, _ = _startproject(user, "third", b"y\r")
    assert asked, output
    assert code == 0, output
    assert user.names() == ["startproject"]


@pytest.mark.parametrize(
    "extra_env",
    [
        pytest.param({}, id="no-terminal"),
        pytest.param({"DJANGO_ANALYTICS_DEBUG": "1"}, id="debug"),
    ],
)
def test_without_a_terminal_nothing_is_asked_waited_for_or_written(user: User, extra_env: dict[str, str]) -> None:
    _ask_policy(user, "ask_after=1\n")
    env = {**user.env, **extra_env}
    started = time.monotonic()
    proc = user.run("django-admin", "startproject", "piped", env=env)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert b"Send usage events?" not in proc.stdout + proc.stderr
    assert took < 20  # far from the 30 s the question would wait
    assert not user.sandbox.config_dir.exists()  # no user file, no count
    assert not user.sandbox.state_dir(APP).exists()
    if extra_env:  # at a terminal, the debug switch still asks nothing and writes nothing
        code, output, asked, _ = _startproject(user, "debug", None, **extra_env)
        assert code == 0, output
        assert not asked, output
        assert not user.sandbox.config_dir.exists()


def test_ci_at_a_terminal_is_not_asked(user: User) -> None:
    _ask_policy(user)
    code, output, asked, _ = _startproject(user, "ci", None, CI="true")
    assert code == 0, output
    assert not asked, output
    assert not user.sandbox.config_dir.exists()


def test_ask_after_three_asks_on_the_third_terminal_run(user: User) -> None:
    _ask_policy(user, "ask_after=3\n")
    runs = Path(str(user.sandbox.user_file(APP)) + RUNS_SUFFIX)
    for n, name in enumerate(("one", "two"), start=1):
        code, output, asked, _ = _startproject(user, name, None)
        assert code == 0, output
        assert not asked, output
        assert runs.read_text().strip() == str(n)
        assert user.names() == []
    proc = user.run("django-admin", "startproject", "piped")  # not at a terminal: not counted
    assert proc.returncode == 0
    assert b"Send usage" not in proc.stderr
    assert runs.read_text().strip() == "2"
    code, output, asked, _ = _startproject(user, "three", b"y\r")
    assert code == 0, output
    assert asked, output
    assert not runs.exists()  # answered: the count is gone
    assert user.names() == ["startproject"]
    assert sorted(p.name for p in user.sandbox.config_dir.iterdir()) == [APP.config_name]


def test_runserver_asks_after_it_is_stopped(user: User) -> None:
    project = user.new_project()
    _ask_policy(user)
    from support.ports import free_port

    port = free_port()
    run = on_terminal(
        [user.venv.python, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        env=user.env,
        cwd=project,
        before=[(b"Quit the server with", CTRL_C)],
        answer=b"y\r",
    )
    assert run.asked, run.output
    assert run.output.index(b"Quit the server with") < run.output.index(b"Send usage events?")
    assert run.returncode in (0, -signal.SIGINT), run.output
    assert user.names() == ["runserver"]
    assert json.loads(user.sandbox.spool_lines(APP)[0])["event"] == "runserver"
