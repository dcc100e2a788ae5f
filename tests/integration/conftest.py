"""The Django integration's fixtures: the project's wheel and a Django environment, each built once for every
worker and run that shares the folder, and one isolated ``user`` of it (``_django_user.User``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ._django_user import SERIES, User
from ._django_venv import Venv, build_wheel, built_once, shared_dir
from support.sandbox import Sandbox


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once for every worker and run that shares the folder (the wheel is the same
    whatever Django series is under test)."""
    (found,) = built_once(shared_dir(tmp_path_factory) / "wheel", build_wheel).glob("spool_reporter-*.whl")
    return found


@pytest.fixture(scope="session")
def dj(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    """Django ``SERIES`` plus the wheel, built once for every worker and run that shares the folder."""
    folder = shared_dir(tmp_path_factory) / f"django-{SERIES}-{sys.version_info[0]}.{sys.version_info[1]}"
    return Venv(built_once(folder, lambda root: Venv.create(root, str(wheel), f"Django=={SERIES}.*")))


@pytest.fixture
def user(sandbox: Sandbox, dj: Venv) -> User:
    return User(sandbox, dj)
