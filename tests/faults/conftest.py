"""Fixtures of the fault suite: the figures collector and the file it writes at the end of the session.

Each test adds one row per fault to the session's :class:`~faults._helpers.Figures`. At the end:

* ``SPOOL_FAULTS_SCALE=full`` (``nox -s faults``), every faults test selected, all green: the rows replace
  ``docs/_generated/reliability.json``, which the docs' Reliability page renders;
* any other run (the CI size, a ``-k`` selection, a failure) writes them to a temporary file (or to
  ``$SPOOL_FAULTS_OUT``) and leaves the committed figures alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from ._helpers import FIGURES_NAME, GENERATED, OUT_ENV, Figures, dumps, scale_name

_FIGURES = pytest.StashKey[Figures]()
_PARTIAL = pytest.StashKey[bool]()
_HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    scale_name()  # a typo in SPOOL_FAULTS_SCALE fails at once, not after minutes
    config.stash[_FIGURES] = Figures()
    config.stash[_PARTIAL] = False


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.config.stash[_PARTIAL] = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def figures(pytestconfig: pytest.Config) -> Figures:
    return pytestconfig.stash[_FIGURES]


def _target(config: pytest.Config, exitstatus: int) -> Path:
    explicit = os.environ.get(OUT_ENV)
    if explicit:
        return Path(explicit)
    complete = not config.stash[_PARTIAL] and not config.option.keyword and not getattr(config.option, "lf", False)
    if scale_name() == "full" and exitstatus == 0 and complete:
        return GENERATED / FIGURES_NAME
    return Path(tempfile.gettempdir()) / f"spool_faults-{scale_name()}-{os.getpid()}" / FIGURES_NAME


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    figures = config.stash.get(_FIGURES, None)
    if figures is None or not figures.rows:
        return
    target = _target(config, int(exitstatus))
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = figures.document(scale=scale_name(), elapsed=time.monotonic() - figures.started)
    target.write_text(dumps(doc), encoding="utf-8")
    config.stash[_FIGURES] = Figures()  # written once
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"fault suite figures ({len(figures.rows)} rows) written to {target}")
