"""A store that cannot take a request now is answered ``503`` with ``Retry-After``, quickly, never ``500``.

Each through a real embedded server (the same WSGI application gunicorn runs) and real failures:

- SQLite locked by another process past the busy timeout, and this process's writer held past its wait;
- SQLite on a full disk: a real ``tmpfs`` of a few MiB, filled up (root only: ``mount``), then freed again;
- PostgreSQL holding the client's row lock past ``lock_timeout`` (others' batches still go through);
- PostgreSQL frozen with ``SIGSTOP``: it answers nothing, so only the collector's own watchdog and libpq's
  ``connect_timeout`` can bound the wait (before them, a batch hung until gunicorn killed its worker, 30 s).

Each 503 must come within :data:`~spool_reporter.collector._store.REQUEST_WAIT_S` plus a margin for a loaded
2-core machine, and the collector must log why, once, with nothing of the request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from spool_reporter.collector import CollectorServer, Retention, serve
from spool_reporter.collector._store import LOCK_WAIT_S, REQUEST_WAIT_S

from support import pg
from support.events import POLICY, batch, det_uuid4, event

pytestmark = pytest.mark.serial  # each 503's wall time is asserted (docs/testing.md)

MARGIN_S = 3.0
"""What a loaded machine may add to a bound (thread switches, the watchdog's own wake-up)."""

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30))


@contextlib.contextmanager
def running(db: str | Path) -> Iterator[CollectorServer]:
    server = serve(db, policy=POLICY, retention=Retention(rollup_every=0)).start()
    try:
        yield server
    finally:
        server.stop()


def send(server: CollectorServer, client: object, n: int = 5, path: str = "/v1/batch") -> tuple[int, float, dict]:
    """POST a batch of ``n`` new events of ``client``: (status, seconds, headers)."""
    body = batch([event(client=client, when="2027-01-04T10:00:00Z") for _ in range(n)])
    started = time.monotonic()
    response = HTTP.request(
        "POST", server.url.replace("/v1/batch", path), body=body, headers={"Content-Type": "application/json"}
    )
    return response.status, time.monotonic() - started, dict(response.headers)


def forget(server: CollectorServer, client: object) -> tuple[int, float]:
    body = json.dumps({"client_id": det_uuid4("client", client)}).encode()
    started = time.monotonic()
    response = HTTP.request(
        "POST", server.url.replace("/v1/batch", "/v1/forget"), body=body, headers={"Content-Type": "application/json"}
    )
    return response.status, time.monotonic() - started


def assert_unavailable(got: tuple[int, float, dict], bound: float) -> None:
    status, seconds, headers = got
    assert status == 503, got
    assert headers.get("Retry-After", "").isdigit(), headers
    assert seconds <= bound + MARGIN_S, f"503 after {seconds:.1f} s, bound {bound} s"


def test_sqlite_locked_by_another_process(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "c.sqlite3"
    with running(db) as server:
        assert send(server, "before")[0] == 200
        holder = subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys, time\n"
             "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "c.execute('BEGIN IMMEDIATE')\n"
             "print('held', flush=True)\n"
             "time.sleep(60)\n", str(db)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            with caplog.at_level(logging.WARNING, logger="spool_reporter.collector"):
                assert_unavailable(send(server, "during"), LOCK_WAIT_S)
                assert_unavailable(send(server, "during-2"), LOCK_WAIT_S)
        finally:
            holder.kill()
            holder.wait(10)
            if holder.stdout is not None:
                holder.stdout.close()
        assert send(server, "after")[0] == 200
        assert server.app.store.count() == (10, 2)
    logged = [r.getMessage() for r in caplog.records if "answering 503" in r.getMessage()]
    assert len(logged) == 1, logged  # once for the same reason, not once per request
    assert "locked" in logged[0] or "busy" in logged[0], logged


def test_sqlite_writer_held_in_this_process(tmp_path: Path) -> None:
    """A thread that keeps this process's writer (a stuck transaction) makes the others answer 503, not wait."""
    with running(tmp_path / "c.sqlite3") as server:
        lock = server.app.store._write_lock  # type: ignore[attr-defined]
        with lock:
            assert_unavailable(send(server, "waiting"), LOCK_WAIT_S)
            status, seconds = forget(server, "waiting")
            assert status == 503
            assert seconds <= LOCK_WAIT_S + MARGIN_S
        assert send(server, "waiting")[0] == 200


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that really fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)], check=False)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("cannot mount a tmpfs in CI")
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system is full (bounded by its size)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 512):
            for _ in range(4096):  # 256 MiB at most: far more than the tmpfs holds
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)


def test_sqlite_on_a_full_disk(tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk is 503 with Retry-After (it used to be ``500 internal error (OperationalError)``), and once
    space is freed the same server stores again, every batch once."""
    with running(tmpfs / "c.sqlite3") as server:
        assert send(server, "first", 200)[0] == 200
        _fill(tmpfs / "filler")
        statuses: list[int] = []
        with caplog.at_level(logging.WARNING, logger="spool_reporter.collector"):
            for k in range(300):  # bounded: a few batches fill what the WAL had left
                got = send(server, ("full", k), 200)
                statuses.append(got[0])
                if got[0] != 200:
                    assert_unavailable(got, REQUEST_WAIT_S)
                    break
        assert 503 in statuses, f"the disk never filled up: {len(statuses)} batches stored"
        assert set(statuses) <= {200, 503}, statuses
        assert any("full" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        (tmpfs / "filler").unlink()
        assert send(server, "after", 200)[0] == 200
        stored = statuses.count(200)
        assert server.app.store.count()[0] == 200 * (2 + stored)


def test_postgres_row_lock_past_lock_timeout(pg_server: pg.Server) -> None:
    import psycopg

    url = pg_server.url()
    with running(url) as server:
        assert send(server, "locked")[0] == 200
        with psycopg.connect(url) as other:  # a transaction that keeps the client's row
            other.execute(
                "SELECT n FROM client_weeks WHERE client_id = %s::uuid FOR UPDATE", (det_uuid4("client", "locked"),)
            )
            assert_unavailable(send(server, "locked"), LOCK_WAIT_S)
            status, seconds, _ = send(server, "someone-else")
            assert status == 200
            assert seconds < LOCK_WAIT_S  # not behind the locked client
            other.rollback()
        assert send(server, "locked")[0] == 200
        assert server.app.store.count() == (15, 2)


def _cluster_pids(root: Path) -> list[int]:
    """The postmaster and its children (the backends, the checkpointer, ...)."""
    postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False)
    return [postmaster, *(int(p) for p in children.stdout.split())]


def test_postgres_frozen(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="spool_reporter.collector")
    """SIGSTOP on the whole cluster: the server enforces nothing, so the watchdog (a pooled connection) and
    ``connect_timeout`` (a new one) must bound the wait; the health check answers meanwhile."""
    try:
        server = pg._start(fsync=False)  # its own cluster: the session's stays untouched
    except pg.Unavailable as exc:
        pytest.skip(f"PostgreSQL cannot be had here: {exc}")
    pids: list[int] = []
    try:
        with running(server.url()) as collector:
            assert send(collector, "before")[0] == 200
            pids = _cluster_pids(server.root)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            results: list[tuple[int, float, dict]] = []
            threads = [
                threading.Thread(target=lambda k=k: results.append(send(collector, ("frozen", k)))) for k in range(3)
            ]
            for thread in threads:
                thread.start()
            health = HTTP.request("GET", collector.url.replace("/v1/batch", "/v1/health"))
            assert health.status == 200
            for thread in threads:
                thread.join(REQUEST_WAIT_S + 10)
            assert len(results) == 3, "a batch hung"
            for got in results:  # one on the pooled connection (the watchdog), two on new ones (connect_timeout)
                assert_unavailable(got, REQUEST_WAIT_S)
            status, seconds = forget(collector, "before")
            assert status == 503
            assert seconds <= REQUEST_WAIT_S + MARGIN_S
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            pids = []
            deadline = time.monotonic() + 30
            while True:  # bounded: the thawed server takes the next batch
                status = send(collector, "after")[0]
                if status == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 200
            assert collector.app.store.count()[0] >= 10
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        server.stop()
    logged = [r.getMessage() for r in caplog.records if "answering 503" in r.getMessage()]
    assert logged, "the operator was not told why"


_FORKS = """
import os, sys, threading, time
from spool_reporter.collector import open_store
store = open_store(sys.argv[1])
stop = threading.Event()

def busy() -> None:  # the parent's threads use the watchdog all the time, as a server's do
    while not stop.is_set():
        store.schema_version()

threads = [threading.Thread(target=busy) for _ in range(3)]
for t in threads:
    t.start()
stuck = 0
for _ in range(50):
    pid = os.fork()
    if pid == 0:  # the child: a store of its own, whose first request starts its own watchdog
        child = open_store(sys.argv[1])
        child.schema_version()
        os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        stuck += 1
        os.kill(pid, 9)
        os.waitpid(pid, 0)
stop.set()
for t in threads:
    t.join()
store.close()
print("stuck", stuck)
"""


def test_postgres_watchdog_survives_fork(pg_server: pg.Server) -> None:
    """A pre-forking server may fork while a thread of the parent holds the watchdog's lock: the child must get a
    fresh one (``os.register_at_fork``), or its first request waits forever."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKS, pg_server.url()], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stuck 0", done.stdout + done.stderr[-2000:]
