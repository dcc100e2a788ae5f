"""Every consent rule, in order, and every way a file can fail to be trusted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spool_reporter import App, decide
from spool_reporter._consent import explain
from spool_reporter._hook import BROKEN, CI_VARIABLES, MAX_CONFIG_BYTES, Decision, parse, read
from spool_reporter._hook import decide as pure_decide

from support.users import AS_NOBODY, ROOT_WITH_SETPRIV

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

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


DEST = {"DJANGO_ANALYTICS_ENDPOINT": "https://collector.example/v1/batch"}
"""A destination, so that the cases above are decided by the rules they name (without one, "on" is off)."""


@pytest.mark.parametrize(("environ", "user", "policy", "expected"), CASES)
def test_decide(
    app: App,
    environ: dict[str, str],
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
    expected: Decision,
) -> None:
    assert pure_decide(app, {**DEST, **environ}, user, policy) == expected


ENDPOINT = "https://collector.example/v1/batch"
TOOL_WITH_DEFAULT = App(name="MyTool", version="1.0", endpoint=ENDPOINT)

DESTINATION_CASES = [
    pytest.param(None, {}, None, None, d(False, "destination:none"), id="none-anywhere"),
    pytest.param(None, {"DJANGO_ANALYTICS_ENDPOINT": " "}, None, None, d(False, "destination:none"), id="env-blank"),
    pytest.param(None, {}, {"endpoint": ""}, None, d(False, "destination:none"), id="user-empty"),
    pytest.param(None, {"DJANGO_ANALYTICS_ENDPOINT": ENDPOINT}, None, None, d(True, "default"), id="env"),
    pytest.param(None, {}, {"endpoint": ENDPOINT}, None, d(True, "default"), id="user-file"),
    pytest.param(None, {}, None, {"endpoint": ENDPOINT}, d(True, "default"), id="policy"),
    pytest.param(TOOL_WITH_DEFAULT, {}, None, None, d(True, "default"), id="app-default"),
    pytest.param(None, {}, {"disable": "0"}, None, d(False, "destination:none"), id="an-explicit-yes-needs-one-too"),
    pytest.param(None, {}, {"disable": "0"}, {"default": "off"}, d(False, "destination:none", OPT_IN), id="opt-in"),
    # The rules that say no still name themselves: a destination does not matter to them.
    pytest.param(None, {"DO_NOT_TRACK": "1"}, None, None, d(False, "env:DO_NOT_TRACK"), id="dnt-first"),
    pytest.param(None, {}, {"disable": "1"}, None, d(False, "user:disable"), id="user-disable-first"),
    pytest.param(None, {"CI": "true"}, None, None, d(False, "ci:CI"), id="ci-first"),
    pytest.param(TOOL_WITH_DEFAULT, {"MYTOOL_NO_ANALYTICS": "1"}, None, None, d(False, "env:MYTOOL_NO_ANALYTICS"),
                 id="app-default-opted-out"),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "environ", "user", "policy", "expected"), DESTINATION_CASES)
def test_nothing_is_recorded_without_a_destination(
    app: App,
    tool: App | None,
    environ: dict[str, str],
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
    expected: Decision,
) -> None:
    decision = pure_decide(tool or app, environ, user, policy)
    assert decision == expected
    assert not decision.hard_off or decision.reason != "destination:none"  # nothing queued is deleted for it


@pytest.mark.parametrize("var", CI_VARIABLES)
def test_every_ci_variable_turns_reporting_off(app: App, var: str) -> None:
    assert pure_decide(app, {**DEST, var: "x"}, None, None) == d(False, f"ci:{var}")


def test_env_prefix_is_per_app() -> None:
    tool = App(name="MyTool", version="1.0", endpoint=ENDPOINT)
    assert pure_decide(tool, {"MYTOOL_NO_ANALYTICS": "1"}, None, None).reason == "env:MYTOOL_NO_ANALYTICS"
    assert pure_decide(tool, {"DJANGO_NO_ANALYTICS": "1"}, None, None).enabled


@pytest.mark.parametrize(
    ("reason", "inputs", "text"),
    [
        pytest.param("user:disable", {"user": {"disable": "1"}}, "you turned it off (disable=1 in your config file)",
                     id="disable=1"),
        pytest.param("user:disable", {"user": {"disable": "maybe"}},
                     "you turned it off (disable=maybe in your config file; any value but empty or 0 means off)",
                     id="disable=maybe"),
        pytest.param("env:DO_NOT_TRACK", {"environ": {"DO_NOT_TRACK": "false"}},
                     "the environment variable DO_NOT_TRACK is set (DO_NOT_TRACK=false; any value but empty or 0 "
                     "means off)", id="dnt=false"),
        pytest.param("policy:disable", {"policy": {"disable": ""}},
                     "the system policy turns reporting off (disable=)", id="policy-disable-empty"),
        pytest.param("ci:CI", {"environ": {"CI": "true"}}, "this looks like a CI run (CI=true); 'enable' overrides",
                     id="ci"),
        pytest.param("destination:none", {}, "no destination configured: nothing is recorded until an endpoint is set",
                     id="destination"),
        pytest.param("user:disable", {}, "you turned it off (disable=1 in your config file)", id="no-inputs"),
    ],
)  # fmt: skip
def test_explain_quotes_the_value_that_decided(reason: str, inputs: dict[str, dict[str, str]], text: str) -> None:
    assert explain(reason, **inputs) == text


def test_app_default_destination_is_checked_at_construction() -> None:
    assert App(name="MyTool", version="1", endpoint=ENDPOINT).endpoint == ENDPOINT
    assert App(name="MyTool", version="1").endpoint is None
    for bad in ("collector.example/v1/batch", "ftp://collector.example/", "https://a b/", "https://é.example/"):
        with pytest.raises(ValueError, match="endpoint must be an https:// URL"):
            App(name="MyTool", version="1", endpoint=bad)
    with pytest.raises(ValueError, match="transport must be 'json'"):
        App(name="MyTool", version="1", endpoint=ENDPOINT, transport="ga4")
    assert App(name="T", version="1", endpoint=ENDPOINT) != App(name="T", version="1")
    assert "endpoint='https://collector.example/v1/batch'" in repr(App(name="T", version="1", endpoint=ENDPOINT))


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


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_unreadable_file_counts_as_off(app: App, sandbox: Sandbox, nobody_sandbox: Sandbox) -> None:
    if os.geteuid() != 0:
        path = sandbox.write_user(app, "disable=0\n")
        path.chmod(0)
        assert decide(app, sandbox.env) == d(False, "user:unreadable")
        return
    # Root reads any file whatever its mode: decide as the unprivileged user who owns the home.
    if not ROOT_WITH_SETPRIV:
        pytest.skip("as root, needs setpriv and a Python the unprivileged user can run")
    sb = nobody_sandbox
    code = "from spool_reporter import decide\nfrom spool_reporter._hook import django_app\n"
    code += "print(decide(django_app('5.2')).reason)"

    def reason() -> str:
        done = subprocess.run(
            [*AS_NOBODY, sys.executable, "-c", code],
            env=sb.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done
        return done.stdout.strip()

    path = sb.write_user(app, "disable=0\n")
    subprocess.run(["chown", "-R", "nobody:nogroup", str(sb.home)], check=True, timeout=30)
    assert reason() == "user:enable"  # readable: the file decides
    path.chmod(0)
    assert reason() == "user:unreadable"


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
    assert pure_decide(app, DEST, None, {"disable": value}) == d(True, "default")
    assert pure_decide(app, DEST, {"disable": value}, None).enabled
