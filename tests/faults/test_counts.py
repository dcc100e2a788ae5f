"""Counters equal what was lost, event by event: ``recorded - delivered - still queued == sum(counters)``.

Three ways the counts used to lie: an oversized active file (valid events before and after one 10 MB line)
was discarded whole and counted as one; the caps deleted -- and counted as dropped -- a segment the flusher had
already delivered; a segment name claiming a million lines counted as a million (and made the caps delete the
real events before it). Real commands, the detached flusher and a loopback collector.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from spool_reporter._hook import django_app

from ._helpers import Figures, cli_cmd, counters, flusher_cmd, ids_in, python_cmd, spool_bytes
from support.servers import Received, Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: flock")]

APP = django_app("5.2")

RECORD = """
import sys
from spool_reporter import record
from spool_reporter._hook import django_app
record("startapp", app=django_app("5.2"))
"""


def _flush(env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(flusher_cmd(), env=env, capture_output=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("layout", "who"),
    [
        pytest.param("5 valid, then a 10 MB line", "flusher", id="tail-flusher"),
        pytest.param("3 valid, a 10 MB line, 2 valid", "flusher", id="middle-flusher"),
        pytest.param("3 valid, a 10 MB line, 2 valid", "hook", id="middle-hook"),
    ],
)
def test_an_overlong_line_costs_that_line_only(sandbox: Sandbox, figures: Figures, layout: str, who: str) -> None:
    sandbox.write_user(APP, "disable=0\n")
    fill(APP, sandbox.env, 5)
    folder = sandbox.state_dir(APP)
    active = folder / "spool.jsonl"
    lines = active.read_bytes().splitlines(keepends=True)
    junk = b'{"schema":1,"event_id":"' + b"x" * (10 * 1024 * 1024) + b'"}\n'
    if layout.endswith("a 10 MB line"):
        active.write_bytes(b"".join(lines) + junk)
    else:
        active.write_bytes(b"".join(lines[:3]) + junk + b"".join(lines[3:]))
    recorded = 5
    with Server() as server:
        env = with_destination(sandbox.env, server.url())
        started = time.monotonic()
        if who == "hook":  # the next command finds the active file past the seal size and seals it first
            result = subprocess.run(python_cmd(RECORD), env=sandbox.env, capture_output=True, timeout=60, check=False)
            assert (result.returncode, result.stdout, result.stderr) == (0, b"", b""), result
            recorded += 1
        took = time.monotonic() - started
        result = _flush(env)
        delivered = len(set(server.event_ids()))
    assert result.returncode == 0, result
    assert delivered == recorded, f"{delivered} of {recorded} valid events delivered"
    assert counters(folder) == {"corrupt": 1}
    assert not ids_in(spool_bytes(folder))
    figures.row(
        fault=f"overlong line in the active file ({layout}), sealed by the {who}",
        injected="a 10 MiB line written into spool.jsonl among valid events"
        + ("; then a command records" if who == "hook" else "")
        + "; then the detached flusher",
        trials=1,
        recorded=recorded,
        delivered=delivered,
        lost=recorded - delivered,
        worst_s=took,
        checked="every valid event delivered; counters corrupt=1 (the overlong line), nothing else",
    )


class _HeldServer(Server):
    """A healthy collector that holds its first answer until :attr:`release` is set (bounded)."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        super().__init__("healthy")

    def respond(self, conn: socket.socket, request: Received) -> bool:
        if not self.arrived.is_set():
            self.arrived.set()
            self.release.wait(30)
        return self.respond_healthy(conn, request)


WRITER = """
import os, sys
from spool_reporter._hook import record_event
from spool_reporter._hook import django_app
app = django_app("5.2")
for _ in range(int(sys.argv[1])):
    assert record_event("startproject", app=app)
"""

CAP = 100
WRITES = 900  # past the seal size (256 KiB, ~750 events): the writer's hook seals and enforces the caps


def test_the_caps_never_count_a_segment_being_delivered(sandbox: Sandbox, figures: Figures) -> None:
    sandbox.write_user(APP, f"disable=0\nmax_events={CAP}\n")
    fill(APP, sandbox.env, CAP)
    folder = sandbox.state_dir(APP)
    with _HeldServer() as server:
        env = with_destination(sandbox.env, server.url())
        env.update(SPOOL_REPORTER_FLUSH_DEADLINE="15", SPOOL_REPORTER_READ_TIMEOUT="10")
        started = time.monotonic()
        flusher = subprocess.Popen(flusher_cmd(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert server.arrived.wait(30), "the flusher never sent its batch"
            writer = subprocess.run(
                [*python_cmd(WRITER), str(WRITES)], env=sandbox.env, capture_output=True, timeout=120, check=False
            )
            assert writer.returncode == 0, writer
            server.release.set()
            out, err = flusher.communicate(timeout=60)
        finally:
            server.release.set()
            if flusher.poll() is None:
                flusher.kill()
                flusher.communicate(timeout=30)
        took = time.monotonic() - started
        delivered = len(set(server.event_ids()))
    assert flusher.returncode == 0, (out, err)
    recorded = CAP + WRITES
    queued = len(ids_in(spool_bytes(folder)))
    lost = recorded - delivered - queued
    counted = counters(folder)
    assert delivered == CAP, delivered
    assert counted == {"cap": lost}, f"counted {counted} for {lost} events actually dropped"
    figures.row(
        fault="caps enforced while the flusher delivers",
        injected=f"max_events={CAP}; the flusher sends a sealed segment of {CAP} events to a collector that holds "
        f"its 200 while another command records {WRITES} events (its hook seals and enforces the caps)",
        trials=1,
        recorded=recorded,
        delivered=delivered,
        lost=lost,
        worst_s=took,
        checked=f"counters cap={counted.get('cap', 0)} equals the {lost} events that were never sent; the segment "
        "on its way was neither deleted nor counted",
    )


def test_a_segment_name_never_counts_more_than_its_bytes(sandbox: Sandbox, figures: Figures) -> None:
    sandbox.write_user(APP, "disable=0\n")
    fill(APP, sandbox.env, 20)
    folder = sandbox.state_dir(APP)
    planted = folder / "seg-99999999999999999999-1-1000000.jsonl"
    planted.write_bytes(b"junk\n")
    planted.chmod(0o600)
    size = planted.stat().st_size
    status = subprocess.run(
        cli_cmd("status", "--json"), env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert status.returncode == 0, status
    queued_shown = json.loads(status.stdout)["queued"]
    with Server() as server:
        result = _flush(with_destination(sandbox.env, server.url()))
        delivered = len(set(server.event_ids()))
    assert result.returncode == 0, result
    # Without reading it, a segment can only be trusted to hold no more lines than it has bytes.
    assert queued_shown <= 20 + size, f"status showed {queued_shown} queued"
    assert delivered == 20, f"{delivered} of 20 delivered: the caps took the real events"
    assert counters(folder) == {"corrupt": 1}
    figures.row(
        fault="a segment name claiming a million lines",
        injected="seg-99999999999999999999-1-1000000.jsonl holding one 4-byte line, beside 20 queued events; "
        "status, then the detached flusher",
        trials=1,
        recorded=20,
        delivered=delivered,
        lost=20 - delivered,
        checked=f"status showed {queued_shown} queued; the caps left the real events alone; counters corrupt=1",
    )
