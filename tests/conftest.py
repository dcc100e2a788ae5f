"""The root of the test suite: the shared fixtures (``tests/support/fixtures.py``) for every test, and the
interrupt signal handled. ``tests/README.md`` says where a new test goes."""

from __future__ import annotations

import signal

pytest_plugins = ["support.fixtures"]

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A shell that starts the tests in the background without job control ignores SIGINT, and an ignored signal
    # is inherited through exec: the commands the tests start (runserver, stopped with Ctrl-C as a terminal
    # would) would then never see it. A handled signal is reset to the default in a child, so handle it here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
