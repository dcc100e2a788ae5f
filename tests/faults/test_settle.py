"""The flusher's watchdog never ends a run that ended on time while it settles.

The collector acknowledges the batch (200 and its headers) but never sends the body, so the 2xx is taken
exactly at the run's deadline; and once the request has arrived it holds ``spool.lock``, so the bookkeeping
that follows (deleting what was acknowledged) has to wait for it. The run must give up that wait in time,
record its outcome and exit by itself -- before its watchdog would end it (exit status 3).
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spool_reporter import _detached, _flush, _state
from spool_reporter._hook import django_app

from ._helpers import Figures, flusher_cmd, ids_in, scale, spool_bytes
from support.servers import Received, Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: flock")]

APP = django_app("5.2")
DEADLINE = 2.0


class _AckThenHoldTheLock(Server):
    """Takes ``spool.lock`` when the request arrives, answers 200 with its headers, and never sends the body."""

    def __init__(self, spool_lock: Path) -> None:
        self.spool_lock = spool_lock
        self.fds: list[int] = []
        self.arrived = threading.Event()
        super().__init__("healthy")

    def respond(self, conn: socket.socket, request: Received) -> bool:
        fd = os.open(self.spool_lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.fds.append(fd)
        self.respond_healthy_head(request)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        self.arrived.set()
        self.stop.wait(60)
        return False

    def close(self) -> None:
        super().close()
        for fd in self.fds:
            os.close(fd)


def test_settling_after_the_deadline_is_never_killed(sandbox: Sandbox, figures: Figures) -> None:
    trials = scale("behaviour_trials") + 1
    sandbox.write_user(APP, "disable=0\n")
    folder = sandbox.state_dir(APP)
    worst = 0.0
    recorded = kept = 0
    for _ in range(trials):
        fill(APP, sandbox.env, 3)
        queued = set(ids_in(spool_bytes(folder)))
        recorded += len(queued)
        (folder / "state.json").unlink(missing_ok=True)
        (folder / "flush.notbefore").unlink(missing_ok=True)
        with _AckThenHoldTheLock(folder / "spool.lock") as server:
            env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_READ_TIMEOUT="10")
            env["SPOOL_REPORTER_FLUSH_DEADLINE"] = str(DEADLINE)
            started = time.monotonic()
            result = subprocess.run(flusher_cmd(), env=env, capture_output=True, timeout=60, check=False)
            took = time.monotonic() - started
            assert server.arrived.is_set()
        worst = max(worst, took)
        assert result.returncode != _detached.EXIT_DEADLINE, (
            f"the watchdog ended the run while it settled ({took:.2f} s)"
        )
        assert (result.returncode, result.stdout, result.stderr) == (2, b"", b""), result
        state = _state.read_state(APP, environ=env)
        assert state.last_result == "failed", state  # acknowledged but not deleted: it will be sent again
        assert "spool lock" in (state.last_error or ""), state
        assert state.next_retry is not None
        left = set(ids_in(spool_bytes(folder)))
        assert left == queued  # at least once: resent later with the same ids
        kept += len(left)
        for name in ("spool.jsonl", *(p.name for p in folder.glob("seg-*.jsonl"))):
            (folder / name).unlink(missing_ok=True)
    figures.row(
        fault="bookkeeping blocked at the deadline",
        injected=f"the collector answers 200 but never sends the body (the 2xx is taken at the {DEADLINE:g} s "
        "deadline) and holds spool.lock from the moment the request arrives; the detached flusher",
        trials=trials,
        recorded=recorded,
        delivered=0,
        lost=recorded - kept,
        worst_s=worst,
        checked=f"never ended by the watchdog (exit 2, not 3); the outcome, error and back-off recorded; the "
        f"acknowledged events kept for a resend; lifetime < deadline + {_flush.WATCHDOG_GRACE:g} s + start-up",
    )
