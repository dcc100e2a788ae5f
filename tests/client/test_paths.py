"""The hook's directories equal platformdirs' answers, under every environment we can produce here."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import platformdirs
import pytest

from spool_reporter import _hook

# The Windows folders (``_hook._windows_folder``: LOCALAPPDATA, PROGRAMDATA) are not tested: no CI runs Windows.
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX layouts (XDG, HOME); Windows is not tested")

ENVIRONMENTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"XDG_CONFIG_HOME": "/x/config", "XDG_STATE_HOME": "/x/state"}, id="xdg-absolute"),
    pytest.param({"XDG_CONFIG_HOME": "relative/config", "XDG_STATE_HOME": "rel"}, id="xdg-relative-ignored"),
    pytest.param({"XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}, id="xdg-empty"),
    pytest.param({"XDG_CONFIG_DIRS": "/etc/one:/etc/two"}, id="config-dirs-first"),
    pytest.param({"XDG_CONFIG_DIRS": "relative:/etc/abs"}, id="config-dirs-skip-relative"),
    pytest.param({"XDG_CONFIG_DIRS": ""}, id="config-dirs-empty"),
    pytest.param({"HOME": "/home/someone"}, id="home"),
]


@pytest.fixture
def patched_environ(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    saved = dict(os.environ)
    for key in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CONFIG_DIRS"):
        os.environ.pop(key, None)
    os.environ.update(request.param)
    try:
        yield dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("patched_environ", ENVIRONMENTS, indirect=True)
def test_user_config_dir_matches_platformdirs(patched_environ: dict[str, str]) -> None:
    assert _hook.user_config_dir() == platformdirs.user_config_dir()


@pytest.mark.parametrize("patched_environ", ENVIRONMENTS, indirect=True)
def test_site_config_dir_matches_platformdirs(patched_environ: dict[str, str]) -> None:
    assert _hook.site_config_dirs()[0] == platformdirs.site_config_dir()


@pytest.mark.parametrize("patched_environ", ENVIRONMENTS, indirect=True)
def test_user_state_dir_matches_platformdirs(patched_environ: dict[str, str]) -> None:
    expected = platformdirs.user_state_dir("spool_reporter", appauthor=False)
    assert _hook.user_state_dir("spool_reporter") == expected


def test_explicit_environ_is_used_instead_of_process_environ() -> None:
    env = {"HOME": "/h", "XDG_CONFIG_HOME": "/c", "XDG_STATE_HOME": "/s", "XDG_CONFIG_DIRS": "/p"}
    assert _hook.user_config_dir(env) == "/c"
    assert _hook.user_state_dir("a", env) == "/s/a"
    assert _hook.site_config_dirs(env)[0] == "/p"


def test_relative_home_is_treated_as_unset() -> None:
    # platformdirs 4.14 asks the password database, as we do; 4.12 (the newest for Python 3.10) used HOME as-is.
    import pwd

    expected = pwd.getpwuid(os.getuid()).pw_dir
    assert _hook.user_config_dir({"HOME": "relative-home"}) == os.path.join(expected, ".config")


@pytest.mark.parametrize("patched_environ", ENVIRONMENTS, indirect=True)
def test_site_config_dirs_match_platformdirs_multipath(patched_environ: dict[str, str]) -> None:
    expected = platformdirs.PlatformDirs(multipath=True).site_config_dir.split(os.pathsep)
    assert _hook.site_config_dirs() == expected
