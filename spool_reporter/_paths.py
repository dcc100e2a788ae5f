"""Where spool_reporter keeps things, computed without importing :mod:`platformdirs`.

The hook runs inside every reported command, and importing ``platformdirs`` costs about 2 ms there (see
docs/design-notes.md). These few functions reproduce its answers for the three directories we use:

* ``user_config_dir()``  -> platformdirs ``user_config_dir()`` (the folder that holds ``djangoanalytics``);
* ``site_config_dir()``  -> platformdirs ``site_config_dir()`` (where a distributor's policy file lives);
* ``user_state_dir(app)`` -> platformdirs ``user_state_dir(app, appauthor=False)``.

``tests/test_paths.py`` checks each one against ``platformdirs`` itself under many environments, so the hook,
the flusher and the command line always agree on the same files.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

_MACOS: Final = sys.platform == "darwin"
_WINDOWS: Final = sys.platform == "win32"


def _home(environ: Mapping[str, str]) -> str:
    # platformdirs treats a relative HOME as unset and asks the password database instead.
    home = environ.get("HOME", "")
    if home.startswith("/"):
        return home
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def _xdg(environ: Mapping[str, str], var: str) -> str | None:
    # platformdirs only honours absolute XDG values (posixpath.isabs).
    value = environ.get(var, "")
    return value if value.startswith("/") else None


def _windows_folder(environ: Mapping[str, str], var: str, which: str) -> str:  # pragma: no cover - Windows
    value = environ.get(var, "")
    if value:
        return os.path.normpath(value)
    import platformdirs  # the registry fallback is platformdirs' business; rare enough to pay for

    return str(getattr(platformdirs, which)())


def user_config_dir(environ: Mapping[str, str] | None = None) -> str:
    """The user's configuration folder (no application part)."""
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover - Windows
        return _windows_folder(env, "LOCALAPPDATA", "user_config_dir")
    xdg = _xdg(env, "XDG_CONFIG_HOME")
    if xdg is not None:
        return xdg
    if _MACOS:  # pragma: no cover - macOS
        return os.path.join(_home(env), "Library", "Application Support")
    return os.path.join(_home(env), ".config")


def site_config_dir(environ: Mapping[str, str] | None = None) -> str:
    """The first system-wide configuration folder, where a distributor ships its policy."""
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover - Windows
        return _windows_folder(env, "PROGRAMDATA", "site_config_dir")
    for entry in env.get("XDG_CONFIG_DIRS", "").split(os.pathsep):
        if entry.startswith("/"):
            return entry
    return "/Library/Application Support" if _MACOS else "/etc/xdg"


def user_state_dir(appname: str, environ: Mapping[str, str] | None = None) -> str:
    """The user's state folder for ``appname``."""
    env = os.environ if environ is None else environ
    if _WINDOWS:  # pragma: no cover - Windows
        return os.path.join(_windows_folder(env, "LOCALAPPDATA", "user_data_dir"), appname)
    xdg = _xdg(env, "XDG_STATE_HOME")
    if xdg is not None:
        return os.path.join(xdg, appname)
    if _MACOS:  # pragma: no cover - macOS
        return os.path.join(_home(env), "Library", "Application Support", appname)
    return os.path.join(_home(env), ".local", "state", appname)
