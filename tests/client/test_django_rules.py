"""The Django integration without Django: the rules table, the .pth check, arming and the execute wrapper.

The real thing (real Django, installed wheel, real commands) is tests/integration/test_django.py.
"""

from __future__ import annotations

import builtins
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import spool_reporter.django as integration
from spool_reporter import _arm as arm_mod
from spool_reporter.django import _rules

REPO = Path(__file__).resolve().parents[2]
PTH = (REPO / "spool_reporter.pth").read_text()


# --- the rules table ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "debug", "environ", "expected"),
    [
        pytest.param(["django-admin", "startproject", "x"], None, {}, "startproject", id="startproject"),
        pytest.param(["manage.py", "startapp", "x"], True, {}, "startapp", id="startapp-debug"),
        pytest.param(["manage.py", "runserver"], True, {}, "runserver", id="runserver"),
        pytest.param(["manage.py", "runserver"], True, {"RUN_MAIN": "true"}, None, id="reloader-child"),
        pytest.param(["manage.py", "runserver"], True, {"RUN_MAIN": "false"}, "runserver", id="run-main-false"),
        pytest.param(["manage.py", "startapp", "x"], False, {}, None, id="debug-false"),
        pytest.param(["manage.py", "startapp", "x"], None, {}, "startapp", id="no-settings"),
        pytest.param(["django-admin", "startproject", "--help"], None, {}, None, id="--help"),
        pytest.param(["django-admin", "startproject", "x", "-h"], None, {}, None, id="-h"),
        pytest.param(["django-admin", "startproject", "--version"], None, {}, None, id="--version"),
        pytest.param(["django-admin", "startproject"], None, {"DJANGO_AUTO_COMPLETE": "1"}, None, id="completion"),
        pytest.param(["django-admin", "check"], None, {}, None, id="check"),
        pytest.param(["django-admin", "help", "startproject"], None, {}, None, id="help"),
        pytest.param(["django-admin"], None, {}, None, id="no-subcommand"),
        pytest.param([], None, {}, None, id="empty"),
    ],
)
def test_rules(argv: list[str], debug: bool | None, environ: dict[str, str], expected: str | None) -> None:
    rule = _rules.match(argv, debug=debug, environ=environ)
    assert (rule.name if rule else None) == expected


def test_the_table() -> None:
    assert {name: rule.long_lived for name, rule in _rules.COMMANDS.items()} == {
        "startproject": False,
        "startapp": False,
        "runserver": True,
    }
    assert all(rule.debug_only and rule.skip_in_reloader_child for rule in _rules.COMMANDS.values())
    with pytest.raises(AttributeError):
        _rules.COMMANDS["runserver"].long_lived = False  # type: ignore[misc]


def test_the_arm_prefilter_equals_the_table() -> None:
    assert set(arm_mod.REPORTED) == set(_rules.COMMANDS)


def test_record_command_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> bool:
        raise RuntimeError

    monkeypatch.setattr(_rules, "match", boom)
    assert integration.record_command(["django-admin", "startproject", "x"], debug=None) is False
    assert integration.record_command(["django-admin", "check"], debug=None, environ={}) is False


def test_settings_debug_without_django_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "django.conf", raising=False)
    assert integration.settings_debug() is None
    unconfigured = types.SimpleNamespace(settings=types.SimpleNamespace(configured=False))
    monkeypatch.setitem(sys.modules, "django.conf", unconfigured)  # type: ignore[arg-type]
    assert integration.settings_debug() is None
    debug = types.SimpleNamespace(settings=types.SimpleNamespace(configured=True, DEBUG=0))
    monkeypatch.setitem(sys.modules, "django.conf", debug)  # type: ignore[arg-type]
    assert integration.settings_debug() is False


# --- which processes are armed -----------------------------------------------------------------------------------

ARGVS = [
    # (sys.argv at .pth time, sys.orig_argv, a Django command?)
    pytest.param(["/v/bin/django-admin", "startproject", "x"], ["/v/bin/python", "/v/bin/django-admin"], True),
    pytest.param(["manage.py", "runserver"], ["python", "manage.py", "runserver"], True),
    pytest.param(["./manage.py"], ["python", "./manage.py"], True),
    pytest.param(["C:\\venv\\Scripts\\django-admin.exe", "x"], [], True),
    pytest.param(["C:\\venv\\Scripts\\django-admin-script.py"], [], False),
    pytest.param(["-m", "startproject", "x"], ["python", "-m", "django", "startproject", "x"], True),
    pytest.param(["-m"], ["python", "-X", "importtime", "-m", "django"], True),
    pytest.param(["-m"], ["python", "-mdjango"], True),
    pytest.param(["-m"], ["python", "-Imdjango"], True),
    pytest.param(["-m", "x"], ["python", "-m", "django.__main__", "x"], True),
    pytest.param(["-m", "django"], ["python", "-m", "pytest", "django"], False),
    pytest.param(["-m"], ["python", "-m", "mydjango"], False),
    pytest.param(["-m"], ["python", "-m", "pip"], False),
    pytest.param(["-c"], ["python", "-c", "pass"], False),
    pytest.param([""], ["python"], False),
    pytest.param(["/x/notmanage.py"], [], False),
    pytest.param(["/x/bin/pytest"], [], False),
    pytest.param([], [], False),
]


@pytest.mark.parametrize(("argv", "orig_argv", "django"), ARGVS)
def test_wanted(argv: list[str], orig_argv: list[str], django: bool) -> None:
    assert arm_mod.wanted(argv, orig_argv) is django


def _run_pth_line(argv: list[str]) -> bool:
    """Execute the .pth line as site.addpackage does, with a fake sys.argv; whether it imports the arm module."""
    imported = []
    fake_sys = types.SimpleNamespace(argv=argv)

    def fake_import(name: str, *args: Any, **kwargs: Any) -> object:
        if name == "sys":
            return fake_sys
        imported.append(name)
        return types.ModuleType(name)

    exec(PTH, {"__builtins__": {**vars(builtins), "__import__": fake_import}})
    assert imported in ([], ["spool_reporter._arm"])
    return bool(imported)


def test_the_pth_file_is_one_short_import_line() -> None:
    assert PTH.endswith("\n")
    assert PTH.count("\n") == 1
    assert PTH.startswith("import ")
    assert len(PTH) < 160  # every character is compiled twice in every Python process of a venv


@pytest.mark.parametrize(("argv", "orig_argv", "django"), ARGVS)
def test_the_pth_check_lets_every_django_command_through(argv: list[str], orig_argv: list[str], django: bool) -> None:
    if not argv:
        pytest.skip("sys.argv is never empty while .pth files run")
    if django:
        assert _run_pth_line(argv)


@pytest.mark.parametrize("argv0", ["-c", "/usr/bin/pytest", "/home/u/project/script.py", "/x/bin/pip", "/x/ipython"])
def test_the_pth_check_stops_other_processes(argv0: str) -> None:
    assert not _run_pth_line([argv0])


# --- the finder and the execute wrapper ----------------------------------------------------------------------------


class FakeUtility:
    """The part of django.core.management.ManagementUtility that the wrapper touches."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.fetched: list[str] = []

    def fetch_command(self, subcommand: str) -> str:
        if subcommand == "boom":
            raise SystemExit(1)
        self.fetched.append(subcommand)
        return f"<{subcommand}>"

    def execute(self) -> str:
        sub = self.argv[1] if len(self.argv) > 1 else "help"
        if sub == "help" and len(self.argv) > 2:
            return self.fetch_command(self.argv[2])
        self.fetch_command(sub)
        if "--explode" in self.argv:
            raise ValueError("django's own error")
        return self.fetch_command(sub)  # fetched twice, as runserver's broken-code path does


@pytest.fixture
def management(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, list[list[str]]]:
    recorded: list[list[str]] = []

    def record_command(argv: list[str], *, debug: bool | None, environ: object = None) -> bool:
        recorded.append(list(argv))
        return True

    monkeypatch.setattr(integration, "record_command", record_command)
    module = types.ModuleType("fake_management")

    class ManagementUtility(FakeUtility):
        pass

    ManagementUtility.execute = FakeUtility.execute  # type: ignore[method-assign]
    module.ManagementUtility = ManagementUtility  # type: ignore[attr-defined]
    assert arm_mod.patch(module)
    assert arm_mod.patch(module), "idempotent"
    return module, recorded


def test_the_wrapper_records_on_the_first_fetch_of_the_subcommand(management: tuple[Any, list[list[str]]]) -> None:
    module, recorded = management
    utility = module.ManagementUtility(["django-admin", "startproject", "x"])
    assert utility.execute() == "<startproject>"
    assert recorded == [["django-admin", "startproject", "x"]]
    assert utility.fetched == ["startproject", "startproject"]
    assert "fetch_command" not in vars(utility), "the shadow is gone after execute()"
    execute = module.ManagementUtility.execute
    assert execute.__wrapped__ is FakeUtility.execute
    assert execute.__name__ == "execute"


@pytest.mark.parametrize(
    "argv",
    [["django-admin", "help", "startproject"], ["django-admin", "check"], ["django-admin"], ["django-admin", "x"]],
)
def test_the_wrapper_ignores_other_commands(management: tuple[Any, list[list[str]]], argv: list[str]) -> None:
    module, recorded = management
    module.ManagementUtility(argv).execute()
    assert recorded == []


def test_django_errors_pass_through_unchanged(management: tuple[Any, list[list[str]]]) -> None:
    module, recorded = management
    utility = module.ManagementUtility(["django-admin", "startproject", "--explode"])
    with pytest.raises(ValueError, match="django's own error"):
        utility.execute()
    assert "fetch_command" not in vars(utility)
    assert len(recorded) == 1


def test_a_failing_record_changes_nothing(
    management: tuple[Any, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = management[0]

    def broken(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("reporting is broken")

    monkeypatch.setattr(integration, "record_command", broken)
    assert module.ManagementUtility(["manage.py", "runserver"]).execute() == "<runserver>"


def test_the_finder_answers_for_one_name_only() -> None:
    assert arm_mod.find_spec("django") is None
    assert arm_mod.find_spec("json") is None
    assert arm_mod.find_spec("django.core.management.base") is None


def test_arm_does_nothing_in_other_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])
    before = list(sys.meta_path)
    assert arm_mod.arm() is False
    assert sys.meta_path == before


def test_arm_is_idempotent_and_disarm_removes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["manage.py", "check"])
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, arm_mod.TARGET, raising=False)
    assert arm_mod.arm()
    assert arm_mod.arm()
    assert sum(1 for f in sys.meta_path if getattr(f, arm_mod.FINDER_MARK, False)) == 1
    assert sys.meta_path[0] is arm_mod
    arm_mod.disarm()
    assert not any(getattr(f, arm_mod.FINDER_MARK, False) for f in sys.meta_path)
