"""Shared fixtures: every test gets its own home, config, policy and state folders.

CI runs with ``CI=true``; tests of enabled reporting therefore build their environment explicitly with
:func:`clean_environ` (no CI markers, no opt-out switches) instead of inheriting the runner's.

Nothing is recorded without a destination (the consent rule ``destination:none``), so the environment names
one, :data:`SANDBOX_ENDPOINT`: plain http to a remote host, which the flusher refuses, so the hook never starts
a flusher for it and nothing can be sent -- recording works as for a user with a destination, and a test that
sends names a real loopback server instead (``servers.with_destination``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import spool_reporter
from spool_reporter import App
from spool_reporter._hook import CI_VARIABLES, django_app

REPO = Path(__file__).resolve().parent.parent
PACKAGE_FROM_CHECKOUT = Path(spool_reporter.__file__).resolve().parent.parent == REPO
"""True when the tests import the checkout (``python -m pytest``), false under nox (installed package)."""

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A shell that starts the tests in the background without job control ignores SIGINT, and an ignored signal
    # is inherited through exec: the commands the tests start (runserver, stopped with Ctrl-C as a terminal
    # would) would then never see it. A handled signal is reset to the default in a child, so handle it here.
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


# --- an unprivileged user, for tests of file permissions ------------------------------------------------

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def _nobody_can_run_python() -> bool:
    """Root with setpriv, and an interpreter (with this package) that an unprivileged user can start: a pyenv
    build under /root may load its libpython from a folder only root can enter."""
    if not (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("setpriv")):
        return False
    env = {**os.environ, "PYTHONPATH": str(REPO)} if PACKAGE_FROM_CHECKOUT else None
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import spool_reporter"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


ROOT_WITH_SETPRIV = _nobody_can_run_python()
"""Tests of file permissions run their commands as ``nobody`` (:data:`AS_NOBODY`): root ignores file modes, so
a test run as root could pass for the wrong reason."""


@pytest.fixture
def nobody_sandbox() -> Iterator[Sandbox]:
    """A sandbox that the unprivileged user ``nobody`` owns (root ignores file modes, so these run as nobody)."""
    root = Path(tempfile.mkdtemp(prefix="spool-nobody-"))
    try:
        root.chmod(0o755)
        sb = Sandbox(root)
        yield sb
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(root)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


@pytest.fixture
def app() -> App:
    return django_app("5.2.7")


@pytest.fixture
def python() -> str:
    return sys.executable


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


@pytest.fixture(name="run_py")
def run_py_fixture() -> object:
    return run_py
