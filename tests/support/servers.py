"""Loopback HTTP(S) servers that misbehave on purpose, for the flusher's tests and benchmark.

Every server binds 127.0.0.1 on a free port, serves from daemon threads, and stops (closing every
connection) when its ``with`` block ends; nothing here ever talks to anything but loopback.

Behaviours (:class:`Server` ``behaviour=``):

==============  ===================================================================================
``healthy``     the collector's answer: 200 ``{"accepted": n, "duplicates": m}`` (de-duplicated by id)
``status``      answers ``status`` (e.g. 400, 413, 500, 429/503 with ``retry_after``) and ``body``
``silent``      accepts the connection, reads the request and never answers
``slow``        answers 200 after ``delay`` seconds
``trickle``     sends the status line one byte every ``interval`` seconds, forever
``redirect``    302 to another host
``huge``        200 with an endless body (a gigabyte announced)
``ack-stall``   sends a 200 status line and headers, then never the body
``script``      answers the statuses in ``script`` in turn (200 as ``healthy``), repeating the last
==============  ===================================================================================

``tls=`` a :class:`trustme.CA` serves HTTPS with a certificate for ``127.0.0.1``, ``localhost`` and
``collector.example``; ``untrusted=True`` signs it with a throw-away CA the client does not trust.
:class:`RefusedPort` is a port nobody listens on (connections are refused) that a server can later take.
:class:`Proxy` is a forward proxy (absolute-form requests and ``CONNECT``) that sends every target to one
loopback address and records what it was asked for.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_HEAD = 64 * 1024
POLL = 0.05  # seconds between checks of the stop flag in every loop here


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _receive(conn: socket.socket, buf: bytearray, stop: threading.Event) -> bool:
    """Append what arrives to ``buf`` (nothing on a poll timeout); false once the peer or the server stops."""
    if stop.is_set():
        return False
    try:
        chunk = conn.recv(65536)
    except TimeoutError:
        return True
    except (OSError, ssl.SSLError):
        return False
    buf += chunk
    return bool(chunk)


def _read_head(conn: socket.socket, buf: bytearray, stop: threading.Event) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD or not _receive(conn, buf, stop):
            return None
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    buf[:] = rest
    return head


def _read_request(conn: socket.socket, buf: bytearray, stop: threading.Event) -> Received | None:
    head = _read_head(conn, buf, stop)
    if head is None:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = ([*lines[0].split(" "), "", ""])[:3]
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(buf) < length:
        if not _receive(conn, buf, stop):
            return None
    body = bytes(buf[:length])
    del buf[:length]
    return Received(method=method, target=target, headers=headers, body=body)


def _response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    reason = {
        200: "OK",
        302: "Found",
        400: "Bad Request",
        413: "Payload Too Large",
        429: "Too Many Requests",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }.get(status, "Status")
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def ipv6_loopback_socket() -> socket.socket:
    """A TCP socket bound to ``[::1]`` on a free port, for ``Server(sock=...)``; skips when IPv6 is off."""
    import pytest

    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.bind(("::1", 0))
    except OSError as exc:
        sock.close()
        pytest.skip(f"cannot bind [::1]: {exc}")
    return sock


class _Listener:
    """Accept loop + per-connection threads, all stopped by :meth:`close`."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.settimeout(POLL)
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self.stop = threading.Event()
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(POLL)
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=self._guarded, args=(conn,), daemon=True).start()

    def _guarded(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def handle(self, conn: socket.socket) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(5)
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    conn.close()


class Server(_Listener):
    """An HTTP(S) server with one behaviour; see the module docstring."""

    def __init__(
        self,
        behaviour: str = "healthy",
        *,
        status: int = 200,
        body: bytes = b"",
        retry_after: str | None = None,
        delay: float = 0.0,
        interval: float = 0.05,
        tls: Any = None,
        untrusted: bool = False,
        script: list[int] | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.script = list(script or [200])
        self.status = status
        self.body = body
        self.retry_after = retry_after
        self.delay = delay
        self.interval = interval
        self.received: list[Received] = []
        self.seen_ids: set[str] = set()
        self.context: ssl.SSLContext | None = None
        if tls is not None:
            import trustme

            ca = trustme.CA() if untrusted else tls
            cert = ca.issue_cert("127.0.0.1", "localhost", "collector.example")
            self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            cert.configure_cert(self.context)
        super().__init__(sock)

    @property
    def scheme(self) -> str:
        return "https" if self.context is not None else "http"

    def url(self, path: str = "/v1/batch", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def event_ids(self) -> list[str]:
        """Every event id received in json batches, in arrival order (duplicates included)."""
        ids = []
        for request in list(self.received):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                ids.extend(event["event_id"] for event in request.json()["events"])
        return ids

    def handle(self, conn: socket.socket) -> None:
        if self.context is not None:
            conn.settimeout(5)
            wrapped = self.context.wrap_socket(conn, server_side=True)
            try:
                wrapped.settimeout(POLL)
                self.serve_connection(wrapped)
            finally:
                wrapped.close()
            return
        self.serve_connection(conn)

    def serve_connection(self, conn: socket.socket) -> None:
        buf = bytearray()
        while not self.stop.is_set():
            request = _read_request(conn, buf, self.stop)
            if request is None:
                return
            self.received.append(request)
            if not self.respond(conn, request):
                return

    def respond(self, conn: socket.socket, request: Received) -> bool:
        b = self.behaviour
        if b == "healthy":
            return self.respond_healthy(conn, request)
        return self.respond_other(conn, request, b)

    def respond_healthy_head(self, request: Received) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            self.seen_ids.update(event["event_id"] for event in request.json()["events"])

    def respond_healthy(self, conn: socket.socket, request: Received) -> bool:
        try:
            ids = [event["event_id"] for event in request.json()["events"]]
        except (ValueError, KeyError, TypeError):
            ids = []
        duplicates = sum(1 for i in ids if i in self.seen_ids)
        self.seen_ids.update(ids)
        body = json.dumps({"accepted": len(ids) - duplicates, "duplicates": duplicates}).encode()
        conn.sendall(_response(200, body, {"Content-Type": "application/json"}))
        return True

    def respond_other(self, conn: socket.socket, request: Received, b: str) -> bool:
        if b == "status":
            headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
            conn.sendall(_response(self.status, self.body, headers))
            return True
        if b == "script":
            status = self.script.pop(0) if len(self.script) > 1 else self.script[0]
            if status == 200:
                return self.respond_healthy(conn, request)
            conn.sendall(_response(status, b"nope"))
            return True
        if b == "slow":
            self.stop.wait(self.delay)
            conn.sendall(_response(200, b"{}"))
            return True
        if b == "silent":
            self.stop.wait(3600)
            return False
        if b == "trickle":
            for byte in b"HTTP/1.1 200 OK\r\n" * 10_000:
                if self.stop.wait(self.interval):
                    return False
                conn.sendall(bytes([byte]))
            return False
        if b == "ack-stall":
            self.respond_healthy_head(request)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            self.stop.wait(3600)
            return False
        if b == "redirect":
            conn.sendall(_response(302, b"", {"Location": "https://elsewhere.example/v1/batch"}))
            return True
        if b == "huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
            chunk = b"x" * 65536
            deadline = time.monotonic() + 30
            while not self.stop.is_set() and time.monotonic() < deadline:
                conn.sendall(chunk)
            return False
        raise ValueError(b)


class RefusedPort:
    """A loopback port that refuses connections (bound, not listening) until :meth:`serve` takes it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]

    def url(self, path: str = "/v1/batch") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, behaviour: str = "healthy", **kwargs: Any) -> Server:
        """Start listening on this very port (the destination "comes back")."""
        return Server(behaviour, sock=self.sock, **kwargs)

    def close(self) -> None:
        self.sock.close()


class Proxy(_Listener):
    """A forward proxy sending every target to ``upstream`` (a loopback ``(host, port)``)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.requests: list[str] = []
        super().__init__()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        buf = bytearray()
        head = _read_head(conn, buf, self.stop)
        if head is None:
            return
        first, _, rest = head.partition(b"\r\n")
        method, target, version = first.decode("latin-1").split(" ")
        self.requests.append(f"{method} {target}")
        upstream = socket.create_connection(self.upstream, timeout=5)
        upstream.settimeout(POLL)
        try:
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                path = "/" + target.split("://", 1)[1].partition("/")[2]
                upstream.sendall(f"{method} {path} {version}\r\n".encode("latin-1") + rest + b"\r\n\r\n")
            if buf:
                upstream.sendall(bytes(buf))
            self._pipe(conn, upstream)
        finally:
            upstream.close()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        def copy(src: socket.socket, dst: socket.socket) -> None:
            while not self.stop.is_set():
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    break
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        other = threading.Thread(target=copy, args=(b, a), daemon=True)
        other.start()
        copy(a, b)
        other.join(10)


@contextlib.contextmanager
def serving(behaviour: str = "healthy", **kwargs: Any) -> Iterator[Server]:
    server = Server(behaviour, **kwargs)
    try:
        yield server
    finally:
        server.close()


# --- spool helpers -------------------------------------------------------------------------------------


REFUSED_ENDPOINT = "http://fill.invalid/v1/batch"
"""The destination :func:`fill` records with: reporting records nothing without one, and plain http to a remote
host is refused (``_settings``), so the hook starts no flusher for it and nothing is ever sent."""


def fill(app: Any, env: dict[str, str], count: int, *, now: float | None = None, event: str = "startproject") -> None:
    """Record ``count`` events in-process, with a destination but no flusher (:data:`REFUSED_ENDPOINT` in the
    environment, which beats the files)."""
    from spool_reporter._hook import record_event

    quiet = {**env, app.env_endpoint: REFUSED_ENDPOINT}
    for _ in range(count):
        assert record_event(event, app=app, environ=quiet, now=now)


def with_destination(env: dict[str, str], url: str, **extra: str) -> dict[str, str]:
    """``env`` pointing at ``url``, with sub-second flusher timing (docs/flusher.md, "Tuning for tests")."""
    out = dict(env)
    out.update(
        DJANGO_ANALYTICS_ENDPOINT=url,
        SPOOL_REPORTER_FLUSH_DEADLINE="2",
        SPOOL_REPORTER_CONNECT_TIMEOUT="0.5",
        SPOOL_REPORTER_READ_TIMEOUT="0.5",
        SPOOL_REPORTER_BACKOFF_BASE="0.5",
    )
    out.update(extra)
    return out
