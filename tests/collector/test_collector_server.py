"""The embedded server under misbehaving clients: a whole request is bounded in time, slow clients cost no
thread, and SIGTERM/SIGINT stop it within a second or two whatever its load (a real subprocess)."""

from __future__ import annotations

import contextlib
import json
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter.collector import CollectorServer, make_app, serve

from support.collector_server import HTTP, post, start_server
from support.events import POLICY, batch, event, recent, rows_of

SLOW_CLIENTS = 64
"""The connection limit of the old thread-per-connection server, which 64 trickling clients filled."""


def _health(url: str) -> tuple[int, float]:
    started = time.monotonic()
    status = HTTP.request("GET", url.replace("/v1/batch", "/v1/health"), timeout=5).status
    return status, time.monotonic() - started


@contextlib.contextmanager
def slow_clients(port: int, n: int = SLOW_CLIENTS) -> Iterator[list[socket.socket]]:
    """``n`` connections that each sent the first byte of a request line and nothing more (yet)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"P")
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_slow_clients_do_not_stop_the_others(tmp_path: Path) -> None:
    with serve(tmp_path / "c.sqlite3", policy=POLICY) as srv, slow_clients(srv.port):
        # One header byte every 9 s keeps a per-recv timeout of 10 s from ever firing: these answers come
        # within the first gap, while all 64 connections are open and waiting.
        answers = [_health(srv.url) for _ in range(5)]
        status, body = post(srv.url, batch([event() for _ in range(20)]))
        assert [a[0] for a in answers] == [200] * 5
        assert max(a[1] for a in answers) < 3.0, answers
        assert (status, json.loads(body)["accepted"]) == (200, 20)


@pytest.mark.serial
def test_a_whole_request_is_bounded_in_time(tmp_path: Path) -> None:
    srv = CollectorServer(make_app(tmp_path / "c.sqlite3", policy=POLICY), request_deadline=1.5)
    with srv:
        request = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Trickle: " + b"a" * 200 + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            started = time.monotonic()
            answer = b""
            for byte in request:  # a byte every 0.1 s: no single recv ever waits long
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # closed by the server at its deadline
                    break
                time.sleep(0.1)
                if time.monotonic() - started > 8:
                    break
            with contextlib.suppress(OSError):
                answer = sock.recv(4096)
            elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.0 408 "), answer
    assert 1.4 < elapsed < 4.0, elapsed  # cut at the deadline, not when the client chose to stop


@pytest.mark.serial
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_it_under_load(tmp_path: Path, sandbox: object, sig: signal.Signals) -> None:
    served = start_server(tmp_path / "c.sqlite3", sandbox.env, tmp_path)  # type: ignore[attr-defined]
    port = int(served.url.split(":")[2].split("/")[0])
    stop = threading.Event()
    statuses: list[int] = []

    def post_forever(k: int) -> None:
        n = 0
        while not stop.is_set() and n < 200:
            n += 1
            events = [event(client=(k, n), when=recent(), valid=False) for _ in range(100)]
            try:
                statuses.append(post(served.url, batch(events))[0])
            except Exception:  # the server went away mid-request: what a client sees when it stops
                statuses.append(-1)

    posters = [threading.Thread(target=post_forever, args=(k,)) for k in range(4)]
    try:
        with slow_clients(port):
            for t in posters:
                t.start()
            deadline = time.monotonic() + 20
            while len(statuses) < 8 and time.monotonic() < deadline:  # under load: batches are flowing
                time.sleep(0.05)
            assert len(statuses) >= 8
            started = time.monotonic()
            served.proc.send_signal(sig)
            served.proc.wait(timeout=10)
            elapsed = time.monotonic() - started
    finally:
        stop.set()
        for t in posters:
            t.join(30)
        if served.proc.poll() is None:
            served.proc.kill()
    out = served.stop()
    assert served.proc.returncode == 0
    assert elapsed < 2.5, elapsed
    assert out.startswith("stopped after "), out
    # Every answer was a 200 or a refusal to come back later, never half an answer.
    assert set(statuses) <= {200, 503, -1}, statuses
    assert served.stderr.read_bytes() == b""


def test_stop_answers_what_it_cannot_finish(tmp_path: Path) -> None:
    srv = serve(tmp_path / "c.sqlite3", policy=POLICY).start()
    with slow_clients(srv.port, 3) as socks:
        started = time.monotonic()
        srv.stop()
        assert time.monotonic() - started < 2.5
        for sock in socks:  # being read when the server stopped: told to come back later
            assert sock.recv(4096).startswith(b"HTTP/1.0 503 ")
    with pytest.raises(OSError):  # and nothing listens any more
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()


def test_an_ipv4_mapped_loopback_host_is_this_machine(tmp_path: Path, sandbox: object) -> None:
    # ::ffff:127.0.0.1 is loopback, which ipaddress says only from Python 3.13 on: serve must not warn that
    # clients reach it over the network, and the GA4 forwarder may send plain HTTP there (a test double).
    from spool_reporter.collector import CollectorError
    from spool_reporter.collector._forward import check_endpoint

    serve_args = ["serve", "--port", "0", "--db", str(tmp_path / "c.db"), "--host", "::ffff:127.0.0.1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spool_reporter.collector", *serve_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=sandbox.env,  # type: ignore[attr-defined]
        text=True,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(30), "the collector printed nothing in time"
        assert proc.stdout.readline().startswith("listening on http://[::ffff:127.0.0.1]:")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert err == ""
    url = "http://[::ffff:127.0.0.1]:9/mp/collect"
    assert check_endpoint(url) == url
    # The forwarder asks the system resolver: only the name localhost itself is this machine for certain.
    assert check_endpoint("http://localhost:9/mp/collect")
    with pytest.raises(CollectorError, match="plain http only to this machine"):
        check_endpoint("http://collector.localhost:9/mp/collect")


def test_cli_help_names_the_command_that_works(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    first = done.stdout.splitlines()[0]
    assert first.startswith("usage: python -m spool_reporter.collector [-h] COMMAND"), first
    assert " collector " not in first
    for command in ("serve", "stats", "migrate"):
        assert command in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", "stats", "--help"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("usage: python -m spool_reporter.collector stats ")


def test_one_of_each_is_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spool_reporter.collector import open_store, render_html, stats
    from spool_reporter.collector._cli import main

    db = tmp_path / "one.sqlite3"
    store = open_store(db)
    store.insert(rows_of(batch([event(client="solo")])))
    store.close()
    assert main(["stats", "--db", str(db)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"Django: 1 developer, 1 event, 1 week with events ({db})"
    page = render_html(stats(db))
    assert "</strong> developer in all" in page
    assert "</strong> week with events" in page
