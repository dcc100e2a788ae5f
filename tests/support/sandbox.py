"""The sandbox of a test: its own home, config, policy and state folders (the ``sandbox`` fixture).

CI runs with ``CI=true``; tests of enabled reporting therefore build their environment explicitly with
:func:`clean_environ` (no CI markers, no opt-out switches) instead of inheriting the runner's.

Nothing is recorded without a destination (the consent rule ``destination:none``), so the environment names
one, :data:`SANDBOX_ENDPOINT`: plain http to a remote host, which the flusher refuses, so the hook never starts
a flusher for it and nothing can be sent -- recording works as for a user with a destination, and a test that
sends names a real loopback server instead (:func:`support.servers.with_destination`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import spool_reporter
from spool_reporter import App
from spool_reporter._hook import CI_VARIABLES

REPO = Path(__file__).resolve().parents[2]
PACKAGE_FROM_CHECKOUT = Path(spool_reporter.__file__).resolve().parent.parent == REPO
"""True when the tests import the checkout (``python -m pytest``), false under nox (installed package)."""

_STRIP_PREFIXES = ("DJANGO_", "SPOOL_REPORTER_", "XDG_")
_STRIP = {
    *CI_VARIABLES,
    "DO_NOT_TRACK",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
    "RUN_MAIN",
    "PYTHONPATH",
    "MYTOOL_NO_ANALYTICS",
}


SANDBOX_ENDPOINT = "http://sandbox.invalid/v1/batch"
"""Named, so events are recorded; refused (plain http to a remote host), so no flusher starts and nothing leaves."""


def clean_environ(home: Path) -> dict[str, str]:
    """This process's environment without CI markers, opt-outs or proxies, with ``home`` as the user's home
    and :data:`SANDBOX_ENDPOINT` as Django's destination."""
    env = {k: v for k, v in os.environ.items() if k not in _STRIP and not k.startswith(_STRIP_PREFIXES)}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_STATE_HOME=str(home / "state"),
        XDG_CONFIG_DIRS=str(home / "etc-xdg"),
        PYTHONDONTWRITEBYTECODE="1",
        DJANGO_ANALYTICS_ENDPOINT=SANDBOX_ENDPOINT,
    )
    if PACKAGE_FROM_CHECKOUT:
        # Developing without installing: let subprocesses import the same checkout.
        env["PYTHONPATH"] = str(REPO)
    return env


class Sandbox:
    """Paths and environment of one isolated user."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.env = clean_environ(self.home)
        self.config_dir = self.home / "config"
        self.policy_dir = self.home / "etc-xdg"

    def state_dir(self, app: App) -> Path:
        return self.home / "state" / "spool_reporter" / app.slug

    def user_file(self, app: App) -> Path:
        return self.config_dir / app.config_name

    def policy_file(self, app: App) -> Path:
        return self.policy_dir / app.config_name

    def write_user(self, app: App, text: str) -> Path:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        path = self.user_file(app)
        path.write_text(text)
        return path

    def write_policy(self, app: App, text: str) -> Path:
        self.policy_dir.mkdir(parents=True, exist_ok=True)
        path = self.policy_file(app)
        path.write_text(text)
        return path

    def local_dir(self, app: App) -> Path:
        """Where the events recorded in local mode are kept."""
        return self.state_dir(app) / "local"

    def local_lines(self, app: App) -> list[bytes]:
        """Every line recorded in local mode (the local folder's active file and segments)."""
        return self.spool_lines(app, folder=self.local_dir(app))

    def spool_lines(self, app: App, *, folder: Path | None = None) -> list[bytes]:
        """Every line in the active file and the sealed segments (of the queue, or of ``folder``)."""
        folder = self.state_dir(app) if folder is None else folder
        if not folder.exists():
            return []
        lines: list[bytes] = []
        for path in [*sorted(folder.glob("seg-*.jsonl")), folder / "spool.jsonl"]:
            if path.exists():
                lines.extend(line for line in path.read_bytes().split(b"\n") if line.strip())
        return lines


def run_py(
    code: str, env: dict[str, str], *, timeout: float = 60, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a fresh interpreter with ``env``; capture text output; bounded by ``timeout``."""
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )
