"""Kills: writers and flushers end by SIGKILL at random moments, and at the two moments that matter most
(right after the claim; after the 2xx but before the delete). No acknowledged event is lost, and what is
sent again carries the same event ids."""

from __future__ import annotations

import fcntl
import os
import platform
import random
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from spool_reporter import _flush
from spool_reporter._hook import django_app

from ._helpers import (
    SLEEP_SYSCALLS,
    Figures,
    collector,
    counters,
    event_names,
    flusher_cmd,
    ids_in,
    kill,
    main_thread_syscall,
    python_cmd,
    read_line,
    scale,
    spool_bytes,
)
from support.servers import Received, Server, fill, serving, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(900)

APP = django_app("5.2")
BIG_CAPS = "disable=0\nmax_events=10000000\nmax_bytes=4000000000\n"

ENDLESS_WRITER = """
import os, sys
from spool_reporter import record
from spool_reporter._hook import django_app
app = django_app("5.2")
tag = sys.argv[1]
os.write(1, b"ready\\n")
for i in range(10**9):
    if record(f"{tag}_{i}", app=app):
        os.write(1, f"{tag}_{i}\\n".encode())
"""


def test_writers_killed_at_random_moments(sandbox: Sandbox, figures: Figures) -> None:
    sandbox.write_user(APP, BIG_CAPS)
    rng = random.Random(os.environ.get("SPOOL_FAULTS_SEED", "writers"))
    trials = scale("writer_kills")
    acked: list[str] = []
    folder = sandbox.state_dir(APP)
    for trial in range(trials):
        proc = subprocess.Popen(
            [*python_cmd(ENDLESS_WRITER), f"k{trial}"], env=sandbox.env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert read_line(proc, 30) == "ready\n"
            target = rng.randrange(0, 400)  # kill after this many acknowledged events: a random point in the loop
            for _ in range(target):
                line = read_line(proc, 30)
                if not line:
                    break
                acked.append(line.strip())
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            assert proc.stdout is not None
            tail = proc.stdout.read()  # acks already in the pipe (or read ahead into the buffer) count too
            proc.stdout.close()
            acked += tail.split()
        finally:
            if proc.poll() is None:
                kill(proc)
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
    from spool_reporter import record

    assert record("after_the_kills", app=APP, environ=sandbox.env)
    data = spool_bytes(folder)
    found = event_names(data)
    from spool_reporter._spool import parse_lines

    _, bad = parse_lines(data)
    missing = set(acked) - set(found)
    assert not missing, f"{len(missing)} acknowledged events lost, e.g. {sorted(missing)[:3]}"
    assert found[-1] == "after_the_kills"
    unacked = len(found) - 1 - len(acked)
    extra = sorted(set(found) - set(acked) - {"after_the_kills"})
    assert 0 <= unacked <= trials, extra[:20]  # at most the one event being appended when the kill landed
    assert bad <= trials  # a kill tears at most the line being written
    assert Counter(found).most_common(1)[0][1] == 1
    figures.row(
        fault="writer killed mid-append",
        injected="SIGKILL a process looping over record() after a random number (0-399) of acknowledged events",
        trials=trials,
        recorded=len(acked),
        lost=len(missing),
        checked=f"every acknowledged event is in the spool; {bad} torn lines and {unacked} unacknowledged but "
        f"complete events in {trials} kills",
    )


def test_flushers_killed_at_random_moments(sandbox: Sandbox, tmp_path: Path, figures: Figures) -> None:
    sandbox.write_user(APP, BIG_CAPS)
    rng = random.Random(os.environ.get("SPOOL_FAULTS_SEED", "flushers"))
    trials = scale("flusher_kills")
    folder = sandbox.state_dir(APP)
    recorded: set[str] = set()
    killed = 0
    worst = 0.0
    with collector(tmp_path / "c.sqlite3", sandbox.env) as server:
        env = with_destination(sandbox.env, server.url)
        env["SPOOL_REPORTER_FLUSH_DEADLINE"] = "10"
        for _ in range(trials):
            fill(APP, sandbox.env, rng.randrange(1, 700))  # one or two batches, sometimes two segments
            recorded |= set(ids_in(spool_bytes(folder)))
            started = time.monotonic()
            proc = subprocess.Popen(flusher_cmd(), env=env, cwd=folder)
            try:
                proc.wait(timeout=rng.uniform(0.0, 0.6))  # the random moment: anywhere in the flusher's life
            except subprocess.TimeoutExpired:
                kill(proc)
                killed += 1
            worst = max(worst, time.monotonic() - started)
            assert proc.returncode in (0, -signal.SIGKILL), proc.returncode
        for _ in range(10):
            result = _flush.run(APP, foreground=True, environ=env, ignore_backoff=True)
            if result.outcome == "nothing":
                break
            assert result.outcome == "delivered", result
        counts = server.stop()
        rows = server.rows()
    stored = {event_id for event_id, _ in rows}
    assert stored == recorded, (len(stored - recorded), len(recorded - stored))  # nothing lost, nothing invented
    assert ids_in(spool_bytes(folder)) == []
    assert counters(folder).get("corrupt", 0) == 0
    assert not list(folder.glob("tmp-*"))
    figures.row(
        fault="flusher killed at a random moment",
        injected="SIGKILL the detached flusher at a uniform random time in 0-0.6 s while it sends 1-699 "
        "queued events to a real collector process",
        trials=trials,
        recorded=len(recorded),
        delivered=len(stored),
        lost=len(recorded - stored),
        duplicated=counts["duplicates"],
        worst_s=worst,
        checked=f"{killed} of {trials} flushers killed before they finished; the collector holds exactly the "
        f"recorded ids; resends were de-duplicated by id",
    )


class _PointServer(Server):
    """A healthy json server that SIGKILLs the flusher at a chosen point of the first request it gets."""

    def __init__(self, point: str, spool_lock: Path) -> None:
        self.point = point
        self.spool_lock = spool_lock
        self.target = 0
        self.hit = threading.Event()
        self.failure = ""
        self.first_ids: list[str] = []
        super().__init__("healthy")

    def respond(self, conn: socket.socket, request: Received) -> bool:
        if self.target == 0 or self.hit.is_set():
            return self.respond_healthy(conn, request)
        self.first_ids = [e["event_id"] for e in request.json()["events"]]
        try:
            if self.point == "claim":
                # The request arrived: the claim (seal by rename) is done. Nothing is acknowledged.
                os.kill(self.target, signal.SIGKILL)
                return False
            # "2xx": hold the spool lock, so that the flusher can take the 2xx but cannot delete anything, send
            # the 200, and kill the flusher once its main thread sleeps in the lock's retry loop, i.e. after
            # it has read the answer and is waiting to delete the acknowledged events.
            fd = os.open(self.spool_lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self.respond_healthy(conn, request)
                sleeping = SLEEP_SYSCALLS[platform.machine()]
                deadline = time.monotonic() + 1.5  # the flusher waits 2 s for the spool lock
                while main_thread_syscall(self.target) not in sleeping:
                    if time.monotonic() > deadline:
                        self.failure = "the flusher never waited for the spool lock after the 2xx"
                        return False
                    time.sleep(0.001)
                os.kill(self.target, signal.SIGKILL)
                return False
            finally:
                os.close(fd)
        finally:
            self.hit.set()


@pytest.mark.parametrize("point", ["claim", "2xx"])
def test_flusher_killed_at_the_critical_points(sandbox: Sandbox, figures: Figures, point: str) -> None:
    if point == "2xx" and platform.machine() not in SLEEP_SYSCALLS:
        pytest.skip(f"no system call table for {platform.machine()}")
    sandbox.write_user(APP, BIG_CAPS)
    rng = random.Random(os.environ.get("SPOOL_FAULTS_SEED", point))
    trials = scale("point_kills")
    folder = sandbox.state_dir(APP)
    recorded: set[str] = set()
    resent_same = 0
    acknowledged_then_resent = 0
    delivered: set[str] = set()
    worst = 0.0
    for _ in range(trials):
        fill(APP, sandbox.env, rng.randrange(1, 450))  # one batch
        queued = set(ids_in(spool_bytes(folder)))
        recorded |= queued
        server = _PointServer(point, folder / "spool.lock")
        try:
            env = with_destination(sandbox.env, server.url())
            started = time.monotonic()
            proc = subprocess.Popen(flusher_cmd(), env=env, cwd=folder)
            server.target = proc.pid
            try:
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    kill(proc)
            worst = max(worst, time.monotonic() - started)
            assert not server.failure, server.failure
            assert server.hit.is_set()
            assert proc.returncode == -signal.SIGKILL
            if point == "2xx":
                assert set(server.first_ids) <= server.seen_ids  # acknowledged with a 200
            # Nothing left the spool: the killed batch is still queued, sealed, with its ids.
            assert set(ids_in(spool_bytes(folder))) == queued
            assert not (folder / "spool.jsonl").exists() or not (folder / "spool.jsonl").read_bytes().strip()
        finally:
            server.close()
        with serving() as healthy:
            result = _flush.run(APP, foreground=True, environ=with_destination(sandbox.env, healthy.url()))
            assert result.outcome == "delivered", result
            resent = healthy.event_ids()
        assert set(server.first_ids) <= set(resent)  # resent with the same ids
        assert set(resent) == queued
        resent_same += len(set(server.first_ids))
        if point == "2xx":
            acknowledged_then_resent += len(set(server.first_ids))
        delivered |= set(resent)
    assert delivered == recorded
    assert ids_in(spool_bytes(folder)) == []
    where = {
        "claim": "right after the claim (the server SIGKILLs the flusher when its request arrives)",
        "2xx": "after the 2xx, before the delete (the server holds the spool lock, answers 200, and SIGKILLs the "
        "flusher once /proc shows it waiting for that lock)",
    }[point]
    figures.row(
        fault=f"flusher killed {'after claiming' if point == 'claim' else 'after a 2xx, before deleting'}",
        injected=where,
        trials=trials,
        recorded=len(recorded),
        delivered=len(delivered),
        lost=len(recorded - delivered),
        duplicated=acknowledged_then_resent,
        worst_s=worst,
        checked=f"the killed batch stayed queued and the next run resent all {resent_same} of its events with "
        "the same ids",
    )
