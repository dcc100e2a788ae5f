"""Throw-away virtual environments with real Django and the built spool_reporter wheel in them.

The package is installed the way users install it (a wheel, or ``pip install -e``), never via ``PYTHONPATH``,
because the thing under test is the installation itself: ``spool_reporter.pth`` in site-packages arming the
hook in ``django-admin`` / ``manage.py`` / ``python -m django`` processes.

``SPOOL_REPORTER_TEST_DJANGO`` picks the Django series (``4.2``, ``5.2``, ``6.0``, ``6.1``; nox's ``django`` session
sets it); the interpreter is the one running the tests. The wheel and each Django series' environment are built
once in :func:`shared_dir` and reused by every pytest-xdist worker of the run, and by every run of one nox session.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DJANGO_ENV = "SPOOL_REPORTER_TEST_DJANGO"
DEFAULT_DJANGO = "5.2"
SHARED_ENV = "SPOOL_REPORTER_TEST_SHARED"
"""A folder that outlives one pytest run (nox's ``django`` session sets it, and empties it when it starts)."""
PIP_TIMEOUT = 600  # seconds; a cold pip cache downloads Django (~8 MB)


def django_series() -> str:
    """The Django series under test, e.g. ``"5.2"``."""
    return os.environ.get(DJANGO_ENV, "").strip() or DEFAULT_DJANGO


UV_ENV = "SPOOL_REPORTER_UV"
"""The uv that filled nox's session environment (the noxfile sets it): the throw-away environments are filled by
``uv pip install --python`` (about 1 s where pip takes 5-10; ``--compile-bytecode``, as pip does), else by the
test interpreter's pip."""


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    _installer(cmd)


def _install_into(python: Path, *requirements: str) -> None:
    """Install ``requirements`` into the environment of ``python``: with uv when the session has one, else pip."""
    uv = os.environ.get(UV_ENV, "").strip()
    if uv:
        _installer([uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python), *requirements])
    else:
        _pip("--python", str(python), "install", "-q", *requirements)


def _installer(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False)
    if proc.returncode != 0:
        msg = f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        raise RuntimeError(msg)


def _isolation(*backend: str) -> list[str]:
    # Building without isolation saves pip a fresh environment with the backend in it (seconds per build).
    have = all(importlib.util.find_spec(name) is not None for name in backend)
    return ["--no-build-isolation"] if have else []


def build_wheel(out: Path) -> Path:
    """Build the project's wheel into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    _pip("wheel", "-q", "--no-deps", *_isolation("hatchling"), "-w", str(out), str(REPO))
    (wheel,) = out.glob("spool_reporter-*.whl")
    return wheel


def shared_dir(factory: pytest.TempPathFactory) -> Path:
    """Where the environments of this run are built once: ``$SPOOL_REPORTER_TEST_SHARED``, else the run's base
    temporary folder, which pytest-xdist's workers share (each worker's own is a folder inside it)."""
    explicit = os.environ.get(SHARED_ENV, "").strip()
    if explicit:
        return Path(explicit)
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker is building it: wait (its pip is bounded in time)
        yield


def built_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """``folder``, built by ``build(folder)`` unless a process has built it already; concurrent callers wait."""
    with _locked(folder.with_name(folder.name + ".lock")):
        done = folder.with_name(folder.name + ".done")
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            build(folder)
            done.touch()
    return folder


class Venv:
    """A virtual environment at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.bin / ("python.exe" if os.name == "nt" else "python")
        self.django_admin = self.bin / "django-admin"

    @classmethod
    def create(cls, root: Path, *requirements: str, editable: bool = False) -> Venv:
        """Create it and install ``requirements`` into it (:func:`_install_into`)."""
        venv.EnvBuilder(with_pip=False, clear=True, symlinks=os.name != "nt").create(root)
        env = cls(root)
        reqs = list(requirements)
        if editable:  # with build isolation: `pip --python` would look for the backend in the new venv
            reqs = ["-e", str(REPO), *reqs]
        _install_into(env.python, *reqs)
        return env

    def site_packages(self) -> Path:
        out = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return Path(out.stdout.strip())


def venv_env(env: dict[str, str], venv_: Venv) -> dict[str, str]:
    """``env`` for a process of ``venv_``: no ``PYTHONPATH`` (the installed package only), its bin first on PATH."""
    out = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out["PATH"] = str(venv_.bin) + os.pathsep + env.get("PATH", os.defpath)
    out["VIRTUAL_ENV"] = str(venv_.root)
    return out
