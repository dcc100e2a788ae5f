"""The fixtures every test may use, registered once by ``tests/conftest.py`` (``pytest_plugins``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter._hook import django_app

from . import pg
from .sandbox import Sandbox, run_py

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")]
"""The collector's two stores, the parameters of :func:`db_url`."""


COVERAGE_VARIABLES = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
"""What makes coverage start in every Python process the tests start (``nox -s tests-3.11``, docs/testing.md)."""


@pytest.fixture(autouse=True)
def _pristine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``pristine`` starts its processes without coverage: coverage loads modules (threading among
    them) that such a test asserts a process never loads. Autouse, so it runs before ``sandbox`` copies the
    environment."""
    if request.node.get_closest_marker("pristine"):
        for name in COVERAGE_VARIABLES:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


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
def app() -> App:
    return django_app("5.2.7")


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(name="run_py")
def run_py_fixture() -> Callable[..., object]:
    return run_py


@pytest.fixture(scope="session")
def pg_server() -> pg.Server:
    """The process's PostgreSQL; the test skips, with the reason, where PostgreSQL cannot be had."""
    try:
        return pg.server()
    except pg.Unavailable as exc:
        pytest.skip(f"PostgreSQL cannot be had here: {exc}")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each back end: a SQLite path, or a PostgreSQL URL with its own schema."""
    if request.param == "sqlite":
        return str(tmp_path / "c.sqlite3")
    server: pg.Server = request.getfixturevalue("pg_server")
    return server.url()
