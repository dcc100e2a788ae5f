"""The root of the test suite: the shared fixtures (``tests/support/fixtures.py``) for every test, the rule that
says which tests run on every Python, and the interrupt signal handled. ``tests/README.md`` says where a new test
goes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest_plugins = ["support.fixtures"]

TESTS = Path(__file__).resolve().parent

EVERY_PYTHON = ("client", "integration")
"""The folders whose tests run on every Python, not only on the suite's own (``FAULTS_PYTHON`` in noxfile.py): the
code they test runs inside the developer's own interpreter, whichever it is -- the hook and its ``.pth`` arming,
the spool's locks and files, the flusher's spawn, the command line, and real Django on each pair. The rule, and
why the collector, the fault suite and the repository's own tests run once, is in docs/testing.md ("What runs
where"); ``tests/test_layout.py`` checks that the package's version branches are all in code these folders test."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(TESTS)
        if rel.parts[0] in EVERY_PYTHON:
            item.add_marker(pytest.mark.every_python)


if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A shell that starts the tests in the background without job control ignores SIGINT, and an ignored signal
    # is inherited through exec: the commands the tests start (runserver, stopped with Ctrl-C as a terminal
    # would) would then never see it. A handled signal is reset to the default in a child, so handle it here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
