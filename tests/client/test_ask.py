"""Ask mode's rules, its count and its words (spool_reporter._ask); the question on a real terminal for an
integrator's App; ``status`` in ask mode. Real Django on a terminal: tests/integration/test_django_ask.py."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from spool_reporter import App, decide
from spool_reporter._ask import (
    _answer_or_none,
    ask_settings,
    count_run,
    question,
    read_runs,
    runs_path,
    status_facts,
    status_text,
)
from spool_reporter._hook import MAX_ASK_AFTER, Decision, django_app
from spool_reporter._hook import decide as pure_decide

from support.commands import cli
from support.sandbox import Sandbox
from support.terminal import on_terminal

DEST = {"DJANGO_ANALYTICS_ENDPOINT": "https://collector.example/v1/batch"}
ASK = "ask"
DJANGO = django_app()
ASKING_APP = App(name="MyTool", version="1.0", default="ask", endpoint="https://c.example/v1/batch")


def d(enabled: bool, reason: str, mode: str = ASK) -> Decision:
    return Decision(enabled=enabled, reason=reason, mode=mode)


@pytest.mark.parametrize(
    ("env", "user", "policy", "expected"),
    [
        pytest.param(DEST, None, {"default": "ask"}, d(False, "policy:ask"), id="unanswered"),
        pytest.param(DEST, {"disable": "0"}, {"default": "ask"}, d(True, "user:enable"), id="answered-yes"),
        pytest.param(DEST, {"disable": "1"}, {"default": "ask"}, d(False, "user:disable"), id="answered-no"),
        pytest.param({}, None, {"default": "ask"}, d(False, "destination:none"), id="nowhere-to-send"),
        pytest.param({**DEST, "CI": "1"}, None, {"default": "ask"}, d(False, "ci:CI"), id="ci-first"),
        pytest.param(DEST, {"mode": "local"}, {"default": "ask"}, Decision(
            enabled=True, reason="user:local", mode=ASK, local=True), id="local-needs-no-question"),
        pytest.param(DEST, None, {"default": "ask", "disable": "1"}, d(False, "policy:disable"), id="policy-off"),
        pytest.param(
            DEST, {"retired": "https://collector.example/v1/batch"}, {"default": "ask"},
            d(False, "destination:retired"), id="retired-destination",
        ),
    ],
)  # fmt: skip
def test_the_ask_rule_in_the_order(
    env: dict[str, str], user: dict[str, str] | None, policy: dict[str, str] | None, expected: Decision
) -> None:
    assert pure_decide(DJANGO, env, user, policy) == expected


def test_an_apps_default_stands_in_for_a_policy_that_names_none() -> None:
    assert pure_decide(ASKING_APP, {}, None, None) == d(False, "app:ask")
    assert pure_decide(ASKING_APP, {}, None, {"default": "opt-out"}) == d(True, "default", "opt-out")
    assert pure_decide(ASKING_APP, {}, None, {"disable": "0"}) == d(False, "app:ask")  # no default= in it
    opt_in = App(name="MyTool", version="1", default="opt-in", endpoint="https://c.example/v1/batch")
    assert pure_decide(opt_in, {}, None, None) == d(False, "app:opt-in", "opt-in")
    local = App(name="MyTool", version="1", default="local")
    assert pure_decide(local, {}, None, None) == Decision(enabled=True, reason="app:local", mode="local", local=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default": "maybe"}, "default must be"),
        ({"ask_default": "Y"}, "ask_default must be"),
        ({"ask_after": 0}, "ask_after must be"),
        ({"ask_after": MAX_ASK_AFTER + 1}, "ask_after must be"),
        ({"ask_after": True}, "ask_after must be"),
    ],
)
def test_an_app_refuses_a_choice_it_does_not_know(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        App(name="MyTool", version="1", **kwargs)  # type: ignore[arg-type]


def test_the_policy_names_enter_and_the_run_that_asks() -> None:
    assert ask_settings(DJANGO, None) == ("yes", 1)
    assert ask_settings(DJANGO, {"ask_default": " No ", "ask_after": "3"}) == ("no", 3)
    assert ask_settings(DJANGO, {"ask_default": "perhaps", "ask_after": "x"}) == ("yes", 1)
    assert ask_settings(DJANGO, {"ask_after": "0"}) == ("yes", 1)
    assert ask_settings(DJANGO, {"ask_after": "100000"}) == ("yes", MAX_ASK_AFTER)
    app = App(name="MyTool", version="1", default="ask", ask_default="no", ask_after=4)
    assert ask_settings(app, None) == ("no", 4)
    assert ask_settings(app, {"ask_after": "2"}) == ("no", 2)


def test_the_count_is_one_number_beside_the_user_file(sandbox: Sandbox) -> None:
    env = sandbox.env
    path = Path(runs_path(DJANGO, env))
    assert path == Path(str(sandbox.user_file(DJANGO)) + ".runs")
    assert count_run(DJANGO, env, 1) is True
    assert not path.exists()  # ask_after=1 counts nothing
    assert [count_run(DJANGO, env, 3) for _ in range(2)] == [False, False]
    assert path.read_text() == "2\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert count_run(DJANGO, env, 3) is True
    assert read_runs(str(path)) == 2  # the asking run is not written: unanswered, it asks again
    path.write_text("rubbish")
    assert read_runs(str(path)) == 0


def test_the_question_says_what_is_sent_and_how_to_change_it() -> None:
    text = question(DJANGO, "https://user:secret@collector.example:8443/v1/batch?key=s3cret", "yes")
    lines = text.strip("\n").split("\n")
    assert len(lines) == 4
    assert "secret" not in text
    assert "s3cret" not in text
    assert "startproject, startapp and runserver" in lines[0]
    assert lines[0].endswith(" to collector.example:8443,")
    assert "never paths, names or arguments" in lines[1]
    assert "django-spool enable" in lines[2]
    assert "django-spool disable" in lines[2]
    assert lines[3] == "Send usage events? [Y/n] "
    assert question(DJANGO, "https://c.example/v1/batch", "no").endswith("[y/N] ")


def test_status_names_the_rule_and_the_answer(sandbox: Sandbox) -> None:
    sandbox.write_policy(DJANGO, "default=ask\nask_after=3\n")
    out = cli(sandbox, "status")
    assert out.returncode == 0, out.stderr
    assert "[policy:ask]" in out.stdout
    assert "ask: not answered yet; asked after terminal run 3 of a reported command (0 counted so far)" in out.stdout
    facts = status_facts(DJANGO, sandbox.env, {"disable": "0"}, {"default": "ask"})
    assert status_text(facts) == "ask: answered yes (disable=0 in your config file)"
    sandbox.write_user(DJANGO, "disable=1\n")
    out = cli(sandbox, "status", "--json")
    assert '"answered": "no"' in out.stdout
    assert "[user:disable]" in cli(sandbox, "status").stdout


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals")
def test_an_integrators_app_asks_at_a_terminal_and_records_after_a_yes(sandbox: Sandbox) -> None:
    code = (
        "import sys, spool_reporter; "
        "app = spool_reporter.App(name='MyTool', version='1.0', default='ask', ask_default='no', "
        "endpoint='http://mytool.invalid/v1/batch'); "
        "print('recorded now:', spool_reporter.record('build', app=app)); sys.exit(3)"
    )
    run = on_terminal([sys.executable, "-c", code], env=sandbox.env, cwd=sandbox.root, answer=b"y\r", timeout=60)
    assert run.asked, run.output
    assert run.output.index(b"recorded now: False") < run.output.index(b"Send usage events? [y/N]")
    assert b"each reported command" in run.output
    assert run.returncode == 3  # the program's own exit status
    app = App(name="MyTool", version="1.0")
    assert [line for line in sandbox.spool_lines(app) if b'"event":"build"' in line]
    asking = App(name="MyTool", version="1.0", default="ask", endpoint="http://mytool.invalid/v1/batch")
    assert decide(asking, sandbox.env).reason == "user:enable"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals")
def test_ctrl_c_at_the_question_is_no_answer_even_where_sigint_would_kill(sandbox: Sandbox) -> None:
    """The program set SIGINT to its default action (death by signal 2); Ctrl-C typed once the question shows is
    still no answer: said, nothing written, and the program's own exit status."""
    code = (
        "import signal, sys, spool_reporter; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "app = spool_reporter.App(name='MyTool', version='1.0', default='ask', "
        "endpoint='http://mytool.invalid/v1/batch'); spool_reporter.record('build', app=app); sys.exit(3)"
    )
    run = on_terminal([sys.executable, "-c", code], env=sandbox.env, cwd=sandbox.root, answer=b"\x03", timeout=60)
    assert run.asked, run.output
    assert b"MyTool will ask again next time" in run.output
    assert run.returncode == 3
    assert not sandbox.config_dir.exists()


def test_ctrl_c_is_caught_before_the_question_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C typed the moment the question appears must meet the question's own SIGINT handler: it is in place
    when the text is written, and the program's is back afterwards (no wait: a bound of 0 s)."""
    handlers: list[object] = []

    class Stderr:
        def write(self, text: str) -> int:
            handlers.append(signal.getsignal(signal.SIGINT))
            return len(text)

        def flush(self) -> None:
            pass

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(sys, "stderr", Stderr())
    assert _answer_or_none("Send usage events? [Y/n] ", "yes", 0.0) is None
    assert handlers
    assert handlers[0] not in (before, signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_docs_quote_the_question_word_for_word() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "consent.md").read_text()
    block = docs.split("For a destination at `https://collector.example/v1/batch` it reads, word for word:")[1]
    quoted = block.split("```text\n")[1].split("```")[0]
    assert quoted == question(DJANGO, "https://collector.example/v1/batch", "yes").lstrip("\n").rstrip(" ") + "\n"
