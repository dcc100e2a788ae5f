"""Talking to a collector: over HTTP (:func:`post`), as a WSGI application in the test's process (:func:`call_wsgi`),
as a real ``python -m spool_reporter.collector serve`` process (:func:`start_server`, :class:`Served`); and a
loopback stand-in for Google Analytics' endpoint (:class:`FakeGA4`)."""

from __future__ import annotations

import http.server
import io
import json
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import urllib3

HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=20))


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``url``: the status and the body of the answer."""
    response = HTTP.request("POST", url, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    return response.status, response.data


def call_wsgi(app: object, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[str, bytes]:
    """One request to the WSGI application ``app``, in this process (``headers`` as WSGI environ keys): the status
    line and the body."""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "wsgi.input": io.BytesIO(body),
        "REMOTE_ADDR": "127.0.0.1",
        **headers,
    }
    seen: list[str] = []
    out = b"".join(app(environ, lambda status, hdrs: seen.append(status)))  # type: ignore[operator]
    return seen[0], out


class FakeGA4(http.server.ThreadingHTTPServer):
    """Google Analytics' Measurement Protocol endpoint on a loopback port: it keeps what it received and answers
    ``status``."""

    daemon_threads = True

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, object]]] = []
        self.headers_seen: list[str] = []
        self.status = 204
        super().__init__(("127.0.0.1", 0), _FakeGA4Handler)


class _FakeGA4Handler(http.server.BaseHTTPRequestHandler):
    server: FakeGA4

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.headers_seen.append(str(self.headers))
        self.server.received.append((self.path, json.loads(body)))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class Served:
    """A collector process started by :func:`start_server`, and where its stderr goes."""

    def __init__(self, proc: subprocess.Popen[str], url: str, stderr: Path) -> None:
        self.proc, self.url, self.stderr = proc, url, stderr

    def stop(self) -> str:
        """SIGTERM, wait (bounded), return the rest of stdout."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=20)
        return out


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints on stdout, waiting at most ``timeout`` seconds for it."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError("the collector printed nothing in time")
        return proc.stdout.readline()
    finally:
        sel.close()


def start_server(db: Path, env: dict[str, str], tmp: Path, *extra: str) -> Served:
    """``python -m spool_reporter.collector serve`` on a free loopback port with the database ``db`` (and ``extra``
    arguments), once it says where it listens; its stderr goes to a file under ``tmp``."""
    stderr = tmp / f"server-{time.monotonic_ns()}.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spool_reporter.collector", "serve", "--port", "0", "--db", str(db), *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            text=True,
            bufsize=1,
        )
    line = read_line(proc, 30)
    assert re.fullmatch(r"listening on http://127\.0\.0\.1:\d+/v1/batch\n", line), line
    return Served(proc, line.split()[-1], stderr)
