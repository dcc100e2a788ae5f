"""Every consent rule, in order, and every way a file can fail to be trusted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from spool_reporter import App, decide
from spool_reporter._config import BROKEN, MAX_CONFIG_BYTES, parse, read
from spool_reporter._consent import CI_VARIABLES, Decision
from spool_reporter._consent import decide as pure_decide

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conftest import Sandbox

OPT_OUT = "opt-out"
OPT_IN = "opt-in"


def d(enabled: bool, reason: str, mode: str = OPT_OUT) -> Decision:
    return Decision(enabled=enabled, reason=reason, mode=mode)


CASES = [
    pytest.param({}, None, None, d(True, "default"), id="default-opt-out"),
    pytest.param({"DJANGO_NO_ANALYTICS": "1"}, None, None, d(False, "env:DJANGO_NO_ANALYTICS"), id="env-off"),
    pytest.param({"DJANGO_NO_ANALYTICS": "yes"}, None, None, d(False, "env:DJANGO_NO_ANALYTICS"), id="env-any"),
    pytest.param({"DJANGO_NO_ANALYTICS": "0"}, None, None, d(True, "default"), id="env-zero-is-not-off"),
    pytest.param({"DJANGO_NO_ANALYTICS": ""}, None, None, d(True, "default"), id="env-empty-is-not-off"),
    pytest.param({"DO_NOT_TRACK": "1"}, None, None, d(False, "env:DO_NOT_TRACK"), id="dnt"),
    pytest.param({"DO_NOT_TRACK": "true"}, None, None, d(False, "env:DO_NOT_TRACK"), id="dnt-true"),
    pytest.param({"DO_NOT_TRACK": "0"}, None, None, d(True, "default"), id="dnt-zero"),
    pytest.param({"DO_NOT_TRACK": "1"}, {"disable": "0"}, None, d(False, "env:DO_NOT_TRACK"), id="dnt-beats-yes"),
    pytest.param({}, {"disable": "1"}, None, d(False, "user:disable"), id="user-disable"),
    pytest.param({}, {"disable": "0"}, None, d(True, "user:enable"), id="user-explicit-yes"),
    pytest.param({}, BROKEN, None, d(False, "user:unreadable"), id="user-broken"),
    pytest.param({}, None, {"disable": "1"}, d(False, "policy:disable"), id="policy-disable"),
    pytest.param({}, {"disable": "0"}, {"disable": "1"}, d(False, "policy:disable"), id="policy-beats-yes"),
    pytest.param({}, None, BROKEN, d(False, "policy:unreadable"), id="policy-broken"),
    pytest.param({}, None, {"default": "off"}, d(False, "policy:opt-in", OPT_IN), id="opt-in"),
    pytest.param({}, {"disable": "0"}, {"default": "off"}, d(True, "user:enable", OPT_IN), id="opt-in-yes"),
    pytest.param({"CI": "true"}, None, None, d(False, "ci:CI"), id="ci"),
    pytest.param({"CI": "false"}, None, None, d(True, "default"), id="ci-false"),
    pytest.param({"GITHUB_ACTIONS": "true"}, None, None, d(False, "ci:GITHUB_ACTIONS"), id="ci-vendor"),
    pytest.param({"CI": "1"}, {"disable": "0"}, None, d(True, "user:enable"), id="ci-explicit-yes"),
    pytest.param({"CI": "1"}, None, {"default": "off"}, d(False, "ci:CI", OPT_IN), id="ci-in-opt-in"),
]


@pytest.mark.parametrize(("environ", "user", "policy", "expected"), CASES)
def test_decide(
    app: App,
    environ: dict[str, str],
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
    expected: Decision,
) -> None:
    assert pure_decide(app, environ, user, policy) == expected


@pytest.mark.parametrize("var", CI_VARIABLES)
def test_every_ci_variable_turns_reporting_off(app: App, var: str) -> None:
    assert pure_decide(app, {var: "x"}, None, None) == d(False, f"ci:{var}")


def test_env_prefix_is_per_app() -> None:
    tool = App(name="MyTool", version="1.0")
    assert pure_decide(tool, {"MYTOOL_NO_ANALYTICS": "1"}, None, None).reason == "env:MYTOOL_NO_ANALYTICS"
    assert pure_decide(tool, {"DJANGO_NO_ANALYTICS": "1"}, None, None).enabled


def test_hard_off_reasons(app: App) -> None:
    assert pure_decide(app, {"DO_NOT_TRACK": "1"}, None, None).hard_off
    assert pure_decide(app, {}, {"disable": "1"}, None).hard_off
    assert not pure_decide(app, {"CI": "1"}, None, None).hard_off
    assert not pure_decide(app, {}, None, {"default": "off"}).hard_off


# --- the files, read from disk -------------------------------------------------------------------------


def test_files_are_read_from_platform_folders(app: App, sandbox: Sandbox) -> None:
    assert decide(app, sandbox.env) == d(True, "default")
    sandbox.write_user(app, "# DEP 8 file\n[analytics]\ndisable = 1\n")
    assert decide(app, sandbox.env) == d(False, "user:disable")
    sandbox.write_user(app, "disable=0\n")
    sandbox.write_policy(app, "default=off\n")
    assert decide(app, sandbox.env) == d(True, "user:enable", OPT_IN)
    sandbox.write_policy(app, "disable=1\n")
    assert decide(app, sandbox.env) == d(False, "policy:disable")


def test_last_occurrence_of_a_key_wins() -> None:
    assert parse(b"disable=0\ndisable=1\n") == {"disable": "1"}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"disable 1\n", id="no-equals"),
        pytest.param(b"disable=0\n\xff\xfe\n", id="bad-utf8"),
        pytest.param(b"disable=0\0\n", id="nul"),
        pytest.param(b"=0\n", id="empty-key"),
        pytest.param(b"dis able=0\n", id="space-in-key"),
    ],
)
def test_malformed_user_file_counts_as_off(app: App, sandbox: Sandbox, data: bytes) -> None:
    sandbox.write_user(app, "")
    sandbox.user_file(app).write_bytes(data)
    assert decide(app, sandbox.env) == d(False, "user:unreadable")


def test_oversized_file_counts_as_off(app: App, sandbox: Sandbox) -> None:
    sandbox.write_user(app, "disable=0\n" + "#" * MAX_CONFIG_BYTES)
    assert decide(app, sandbox.env) == d(False, "user:unreadable")


def test_oversized_policy_counts_as_off(app: App, sandbox: Sandbox) -> None:
    sandbox.write_policy(app, "#" * (MAX_CONFIG_BYTES + 1))
    assert decide(app, sandbox.env) == d(False, "policy:unreadable")


def test_directory_at_the_file_path_counts_as_off(app: App, sandbox: Sandbox) -> None:
    sandbox.user_file(app).mkdir(parents=True)
    assert decide(app, sandbox.env) == d(False, "user:unreadable")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_does_not_block_and_counts_as_off(app: App, sandbox: Sandbox) -> None:
    sandbox.config_dir.mkdir(parents=True)
    os.mkfifo(sandbox.user_file(app))
    assert decide(app, sandbox.env) == d(False, "user:unreadable")


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file_counts_as_off(app: App, sandbox: Sandbox) -> None:
    path = sandbox.write_user(app, "disable=0\n")
    path.chmod(0)
    assert decide(app, sandbox.env) == d(False, "user:unreadable")


def test_unreadable_file_via_eacces_counts_as_off(tmp_path: Path) -> None:
    # As root (CI) permissions do not bite; a path through a non-directory gives ENOTDIR = "missing",
    # while a path that is a directory gives EISDIR at read time = BROKEN.
    (tmp_path / "file").write_text("x")
    assert read(str(tmp_path / "file" / "child")) is None
    assert read(str(tmp_path)) is BROKEN


def test_symlinked_config_is_followed_for_reading(app: App, sandbox: Sandbox, tmp_path: Path) -> None:
    # Dotfile managers symlink ~/.config files; reading through a link is fine (writing never is).
    target = tmp_path / "dotfiles-djangoanalytics"
    target.write_text("disable=1\n")
    sandbox.config_dir.mkdir(parents=True)
    sandbox.user_file(app).symlink_to(target)
    assert decide(app, sandbox.env) == d(False, "user:disable")


def test_policy_is_found_in_any_xdg_config_dir(app: App, sandbox: Sandbox, tmp_path: Path) -> None:
    first, second = tmp_path / "xdg-ubuntu", tmp_path / "xdg"
    second.mkdir()
    (second / app.config_name).write_text("disable=1\n")
    env = {**sandbox.env, "XDG_CONFIG_DIRS": f"{first}{os.pathsep}{second}"}
    assert decide(app, env) == d(False, "policy:disable")
    first.mkdir()
    (first / app.config_name).write_text("default=off\n")  # the more preferred folder wins
    assert decide(app, env) == d(False, "policy:opt-in", OPT_IN)


@pytest.mark.parametrize("value", ["", "0", " 0 "])
def test_empty_or_zero_disable_does_not_disable(app: App, value: str) -> None:
    assert pure_decide(app, {}, None, {"disable": value}) == d(True, "default")
    assert pure_decide(app, {}, {"disable": value}, None).enabled
