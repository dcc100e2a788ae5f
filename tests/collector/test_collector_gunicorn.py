"""``gunicorn spool_reporter.collector.wsgi:application`` as real processes: the deployment the docs describe.

Two gunicorn instances with several workers each, writing to one real PostgreSQL (``tests/support/pg.py``), count
every event once however the clients spread their (overlapping) batches; the same application on SQLite
under one instance; a chunked body, which only a server that delimits the stream (gunicorn) can pass.
Skipped, with the reason, where gunicorn or PostgreSQL cannot be had.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter.collector import stats

from support import pg
from support.collector_server import post
from support.events import PROBE_UA, batch, event, probe_headers, recent
from support.polling import stop_process
from support.ports import free_port

gunicorn = pytest.importorskip("gunicorn", reason="gunicorn is not installed (pip install 'spool_reporter[collector]')")


class Gunicorn:
    def __init__(self, db: str, env: dict[str, str], log: Path, *, workers: int = 2, threads: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/batch"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--threads", str(threads),
                 "--bind", f"127.0.0.1:{self.port}", "--graceful-timeout", "5",
                 "spool_reporter.collector.wsgi:application"],
                env={**env, "SPOOL_REPORTER_COLLECTOR_DB": db},
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:  # bounded: until the workers answer, the process dies, or the deadline
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v1/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("gunicorn did not answer in 60 s")
            time.sleep(0.1)

    def stop(self) -> int:
        code = stop_process(self.proc, grace=30)
        return -signal.SIGKILL if code is None else code


@contextlib.contextmanager
def running(db: str, env: dict[str, str], tmp: Path, count: int = 1, **kw: int) -> Iterator[list[Gunicorn]]:
    servers: list[Gunicorn] = []
    try:
        for k in range(count):
            servers.append(Gunicorn(db, env, tmp / f"gunicorn-{k}.log", **kw))
        yield servers
    finally:
        codes = [s.stop() for s in servers]
        assert codes == [0] * len(servers), [s.log.read_text(errors="replace")[-2000:] for s in servers]


def test_gunicorn_on_sqlite(tmp_path: Path, sandbox: object) -> None:
    db = tmp_path / "c.sqlite3"
    events = [event(client=i % 5, when=recent(), valid=False) for i in range(300)]
    with running(str(db), sandbox.env, tmp_path) as (server,):  # type: ignore[attr-defined]
        assert post(server.url, batch(events), probe_headers()) == (
            200,
            b'{"accepted": 300, "duplicates": 0, "rejected": 0, "refused": {}}',
        )
        status, body = post(server.url, batch([*events[:10], event(name="migrate", valid=False)]))
        assert (status, json.loads(body)) == (
            200,
            {"accepted": 0, "duplicates": 10, "rejected": 1, "refused": {"command": 1}},
        )
        # gunicorn delimits a chunked body itself (wsgi.input_terminated): accepted without a length.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        extra = batch([event(client="chunked", when=recent(), valid=False)])
        conn.request(
            "POST", "/v1/batch", body=iter([extra[:50], extra[50:]]), headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())["accepted"]) == (200, 1)
        conn.close()
    assert (stats(db).events, stats(db).developers) == (301, 6)
    assert PROBE_UA not in server.log.read_text(errors="replace")  # gunicorn keeps no access log by default


_CLIENT_ROUNDS = 5
_BATCH = 200


def test_two_gunicorns_on_one_postgres_count_each_event_once(
    tmp_path: Path,
    sandbox: object,
    pg_server: pg.Server,
) -> None:
    url = pg_server.url("gunicorn")
    when = recent()
    # Three pairs of clients; the two clients of a pair send the same events, each to another instance,
    # at the same time: every event arrives twice, at two processes of two different instances.
    plans = [
        [[event(event_id=None, client=(pair, r, i % 20), when=when, valid=False) for i in range(_BATCH)]
         for r in range(_CLIENT_ROUNDS)]
        for pair in range(3)
    ]  # fmt: skip
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(server_url: str, rounds: list[list[dict[str, object]]]) -> None:
        try:
            for events in rounds:
                status, body = post(server_url, batch(events))
                assert status == 200, body
                doc = json.loads(body)
                with lock:
                    results.append((doc["accepted"], doc["duplicates"], doc["rejected"]))
        except BaseException as exc:
            errors.append(exc)

    with running(url, sandbox.env, tmp_path, count=2, workers=3, threads=2) as servers:  # type: ignore[attr-defined]
        threads = [
            threading.Thread(target=client, args=(servers[side].url, plans[pair]))
            for pair in range(3)
            for side in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    distinct = 3 * _CLIENT_ROUNDS * _BATCH
    assert sum(a for a, _, _ in results) == distinct
    assert sum(d for _, d, _ in results) == distinct
    assert sum(r for _, _, r in results) == 0
    result = stats(url)
    assert (result.events, result.developers) == (distinct, 3 * _CLIENT_ROUNDS * 20)
