"""Loopback ports for the servers the tests start as other programs (nginx, gunicorn, ``runserver``), which must
be told their port before they bind it.

A port the kernel picks (bind to 0, close, hand the number over) comes from its ephemeral range, where any
outgoing connection or ``bind(0)`` of another process can take it before the server binds it: rare with one test
process, frequent enough to matter with several pytest-xdist workers on one machine. So each worker hands out
ports from a block of its own below that range (``gw0`` the second block, ``gw1`` the third, a run without
workers the first), each checked free by binding it, and never hands out the same port twice. Two pytest runs at
once (``scripts/dev.py test`` runs the ``django`` sessions' parallel runs beside the ``tests`` sessions) keep
apart with ``SPOOL_REPORTER_TEST_PORT_BLOCK``: the first block of the run's own.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

BASE = 20_000
"""The first port of the first block; the blocks end below the kernel's ephemeral range (32768 on Linux)."""
BLOCK = 400
"""Ports per worker: more than any one worker's tests ask for (about 20 in a whole run)."""
WORKERS = 30
"""Blocks there are room for below 32768."""
PORT_BLOCK_ENV = "SPOOL_REPORTER_TEST_PORT_BLOCK"
"""The first block of this run's (``scripts/dev.py`` gives the runs it starts beside others blocks of their own)."""

_lock = threading.Lock()
_next = itertools.count()


def worker_index() -> int:
    """0 without pytest-xdist, else 1 + the worker's number (``PYTEST_XDIST_WORKER=gw3`` is 4), after the run's
    first block (``SPOOL_REPORTER_TEST_PORT_BLOCK``, 0 unless set)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    first = os.environ.get(PORT_BLOCK_ENV, "0")
    own = int(first) if first.isdigit() else 0
    return own + (int(name[2:]) + 1 if name.startswith("gw") and name[2:].isdigit() else 0)


def free_port() -> int:
    """A loopback TCP port of this worker's block that nothing is bound to right now."""
    first = BASE + (worker_index() % WORKERS) * BLOCK
    with _lock:
        for _ in range(BLOCK):
            port = first + next(_next) % BLOCK
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # another program's, or one of ours in TIME_WAIT
                return port
    raise RuntimeError(f"no free port in 127.0.0.1:{first}-{first + BLOCK - 1}")
