"""The public ``record()``: never raises, never prints (but the notice), stays light, respects consent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spool_reporter import App, record
from spool_reporter._firstrun import notice_text

from support.commands import record_together

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

FORBIDDEN_ON_HOOK_PATH = ("filelock", "urllib3", "platformdirs", "uuid", "platform", "json")


def py(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_hook_path_imports_none_of_the_heavy_modules(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "disable=0\n")
    result = py(
        f"""
        import sys
        before = set(sys.modules)
        from spool_reporter import record
        from spool_reporter._hook import django_app
        assert record("startproject", app=django_app("5.2"), notice=True)
        new = set(sys.modules) - before
        print(",".join(sorted(m for m in new if m.split(".")[0] in {FORBIDDEN_ON_HOOK_PATH!r})))
        """,
        sandbox.env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
    assert len(sandbox.spool_lines(app)) == 1


def test_the_hook_imports_upward_only_inside_functions() -> None:
    # docs/design-notes.md, "Imports run one way": importing the hook loads no other module of the package (the
    # doorway is imported already); `lint-imports` checks the layers, and this that the exceptions stay lazy.
    import spool_reporter

    code = "import sys, spool_reporter._hook; print(*sorted(m for m in sys.modules if m.startswith('spool_reporter')))"
    root = Path(spool_reporter.__file__).parents[1]
    # -S: no site-packages, so no .pth file arms or imports anything first.
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["spool_reporter", "spool_reporter._hook"]


def test_record_returns_true_and_spools_one_line(sandbox: Sandbox, app: App) -> None:
    assert record("startproject", app=app, environ=sandbox.env)
    (line,) = sandbox.spool_lines(app)
    event = json.loads(line)
    assert event["event"] == "startproject"
    config = sandbox.user_file(app).read_text()
    assert config == f"client_id={event['client_id']}\nnotice_version=0\n"  # no notice asked for, none shown


def test_client_id_is_kept_and_other_keys_survive(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "# mine\nendpoint=https://example.invalid/v1/batch")  # no final newline
    assert record("startproject", app=app, environ=sandbox.env)
    assert record("startapp", app=app, environ=sandbox.env)
    ids = {json.loads(line)["client_id"] for line in sandbox.spool_lines(app)}
    assert len(ids) == 1
    text = sandbox.user_file(app).read_text()
    assert text.startswith("# mine\nendpoint=https://example.invalid/v1/batch\nclient_id=")
    assert text.count("client_id=") == 1


def test_uuid1_client_id_is_replaced(sandbox: Sandbox, app: App) -> None:
    import uuid

    sandbox.write_user(app, f"client_id={uuid.uuid1()}\n")  # embeds a MAC address: never sent
    assert record("startproject", app=app, environ=sandbox.env)
    event = json.loads(sandbox.spool_lines(app)[0])
    assert uuid.UUID(event["client_id"]).version == 4


@pytest.mark.parametrize("name", ["", "bad name", "x" * 41, "9lives"])
def test_invalid_event_names_are_refused_quietly(sandbox: Sandbox, app: App, name: str) -> None:
    assert not record(name, app=app, environ=sandbox.env)
    assert sandbox.spool_lines(app) == []


@pytest.mark.parametrize(
    ("env", "user"),
    [
        pytest.param({"DJANGO_NO_ANALYTICS": "1"}, None, id="env"),
        pytest.param({"DO_NOT_TRACK": "1"}, None, id="dnt"),
        pytest.param({"CI": "true"}, None, id="ci"),
        pytest.param({}, "disable=1\n", id="user-file"),
    ],
)
def test_disabled_creates_nothing(sandbox: Sandbox, app: App, env: dict[str, str], user: str | None) -> None:
    if user is not None:
        sandbox.write_user(app, user)
    assert not record("startproject", app=app, environ={**sandbox.env, **env})
    assert not (sandbox.home / "state").exists()
    if user is None:
        assert not sandbox.config_dir.exists()


def test_disabling_deletes_what_was_queued(sandbox: Sandbox, app: App) -> None:
    for _ in range(3):
        assert record("startproject", app=app, environ=sandbox.env)
    assert len(sandbox.spool_lines(app)) == 3
    assert not record("startapp", app=app, environ={**sandbox.env, "DJANGO_NO_ANALYTICS": "1"})
    assert sandbox.spool_lines(app) == []


def test_ci_does_not_delete_the_developers_queue(sandbox: Sandbox, app: App) -> None:
    assert record("startproject", app=app, environ=sandbox.env)
    assert not record("startapp", app=app, environ={**sandbox.env, "CI": "1"})
    assert len(sandbox.spool_lines(app)) == 1


def test_debug_prints_the_event_instead_of_spooling(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "client_id=43325579-4ce9-4a2d-a152-0e993a4bb245\n")
    env = {**sandbox.env, "DJANGO_ANALYTICS_DEBUG": "1"}
    result = py(
        """
        from spool_reporter import record
        from spool_reporter._hook import django_app
        print(record("startproject", app=django_app("5.2")))
        """,
        env,
    )
    assert result.stdout == "True\n"
    prefix, _, payload = result.stderr.partition(" ")
    assert prefix == "[DJANGO_ANALYTICS_DEBUG]"
    assert json.loads(payload)["event"] == "startproject"
    assert sandbox.spool_lines(app) == []


def test_never_prints_and_never_raises_when_everything_is_broken(sandbox: Sandbox, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**sandbox.env, "XDG_STATE_HOME": str(blocker / "state"), "XDG_CONFIG_HOME": str(blocker / "cfg")}
    result = py(
        """
        import sys
        from spool_reporter import record, App
        from spool_reporter._hook import django_app
        print(record("startproject", app=django_app("5.2"), notice=True))
        print(record("startproject", app=App(name="MyTool", version="1"), notice=True))
        """,
        env,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "False\nFalse\n", "")


def test_notice_printed_once_on_stderr(sandbox: Sandbox, app: App) -> None:
    code = """
    from spool_reporter import record
    from spool_reporter._hook import django_app
    print(record("startproject", app=django_app("5.2"), notice=True))
    """
    first = py(code, sandbox.env)
    second = py(code, sandbox.env)
    assert first.stdout == second.stdout == "True\n"
    assert first.stderr == notice_text(app)
    assert second.stderr == ""


def test_notice_once_when_first_commands_start_together(sandbox: Sandbox, app: App) -> None:
    results = record_together(sandbox)
    assert [out for out, _ in results] == ["True\n"] * 6
    assert sum(err == notice_text(app) for _, err in results) == 1
    assert sum(err == "" for _, err in results) == 5
    assert sandbox.user_file(app).read_text().count("client_id=") == 1
    assert len({json.loads(line)["client_id"] for line in sandbox.spool_lines(app)}) == 1


def test_generic_app_has_its_own_switches_and_files(sandbox: Sandbox) -> None:
    tool = App(name="MyTool", version="1.4.2", endpoint="http://mytool.invalid/v1/batch")  # refused: no flusher
    assert record("build", app=tool, environ=sandbox.env)
    assert (sandbox.config_dir / "mytoolanalytics").exists()
    event = json.loads(sandbox.spool_lines(tool)[0])
    assert (event["app"], event["app_version"], event["event"]) == ("MyTool", "1.4", "build")
    assert not record("build", app=tool, environ={**sandbox.env, "MYTOOL_NO_ANALYTICS": "1"})


def test_app_validation_and_immutability() -> None:
    with pytest.raises(ValueError, match="name"):
        App(name="bad name", version="1")
    tool = App(name="MyTool", version="2.10.3")
    assert tool.version == "2.10"
    with pytest.raises(AttributeError):
        tool.name = "x"  # type: ignore[misc]
    assert tool == App(name="MyTool", version="2.10")


# --- no destination, nothing recorded (issue 16) --------------------------------------------------------


def no_destination(sandbox: Sandbox) -> dict[str, str]:
    return {k: v for k, v in sandbox.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}


NOTICE_RUN = """
from spool_reporter import record
from spool_reporter._hook import django_app
print(record("startproject", app=django_app("5.2"), notice=True))
"""


def test_without_a_destination_nothing_is_recorded_and_no_notice_printed(sandbox: Sandbox, app: App) -> None:
    sandbox.write_user(app, "disable=0\n")  # even an explicit yes: there is nowhere to send to
    result = py(NOTICE_RUN, no_destination(sandbox))
    assert (result.returncode, result.stdout, result.stderr) == (0, "False\n", "")
    assert not (sandbox.home / "state").exists()
    assert sandbox.user_file(app).read_text() == "disable=0\n"  # no client id created either
    # Configured afterwards: the first recorded event prints the notice then, once.
    sandbox.write_user(app, "disable=0\nendpoint=http://configured.invalid/v1/batch\n")
    first = py(NOTICE_RUN, no_destination(sandbox))
    assert (first.stdout, first.stderr) == ("True\n", notice_text(app))
    assert len(sandbox.spool_lines(app)) == 1


def test_debug_still_prints_without_a_destination_and_writes_nothing(sandbox: Sandbox, app: App) -> None:
    env = {**no_destination(sandbox), "DJANGO_ANALYTICS_DEBUG": "1"}
    result = py(NOTICE_RUN, env)
    assert result.stdout == "True\n"
    prefix, _, payload = result.stderr.partition(" ")
    assert prefix == "[DJANGO_ANALYTICS_DEBUG]"
    event = json.loads(payload)
    assert event["event"] == "startproject"
    assert not sandbox.config_dir.exists()  # the printed client id is not kept, and no notice
    assert not (sandbox.home / "state").exists()
    sandbox.write_user(app, "client_id=43325579-4ce9-4a2d-a152-0e993a4bb245\n")
    again = py(NOTICE_RUN, env)
    assert json.loads(again.stderr.partition(" ")[2])["client_id"] == "43325579-4ce9-4a2d-a152-0e993a4bb245"


def test_an_apps_default_destination_is_a_destination(sandbox: Sandbox) -> None:
    env = no_destination(sandbox)
    plain = App(name="MyTool", version="1.0")
    assert not record("build", app=plain, environ=env)
    assert not (sandbox.home / "state").exists()
    shipped = App(name="MyTool", version="1.0", endpoint="http://mytool.invalid/v1/batch")
    assert record("build", app=shipped, environ=env)
    assert len(sandbox.spool_lines(shipped)) == 1
    assert not record("build", app=shipped, environ={**env, "MYTOOL_NO_ANALYTICS": "1"})  # the user still decides
