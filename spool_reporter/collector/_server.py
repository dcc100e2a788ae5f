"""The embedded HTTP server: one thread reads every connection, a few worker threads run the application.

Good for a laptop, a demo and the tests; a production deployment runs the same WSGI application under
gunicorn behind a TLS proxy (``docs/collector.md``). It is still built to stay up when clients misbehave:

- **A whole request is bounded in time**, not each ``recv``: the request line, the headers and the body
  must all arrive within :data:`REQUEST_DEADLINE` seconds of the connection's acceptance, or the
  connection is answered ``408`` and closed. A client trickling one byte every few seconds is cut off at
  the deadline however patient it is.
- **A slow client costs a buffer, not a thread.** One thread multiplexes every connection with
  :mod:`selectors` and hands only *complete* requests to :data:`WORKERS` worker threads; up to
  :data:`MAX_CONNECTIONS` connections may be reading at once (the oldest is dropped to make room), so a
  health probe or a batch is answered while many slow clients trickle.
- **It stops on SIGTERM/SIGINT within a second or two, whatever its load**: it stops accepting, answers
  ``503`` with ``Retry-After`` to requests read but not started, waits at most :data:`STOP_GRACE` seconds
  for those being stored (the clients keep whatever was not answered ``2xx`` and send it again), and
  closes the connections still being read.

Privacy: it writes **no access log** and no traceback, never passes the client's address (``REMOTE_ADDR``)
or any request header but ``Content-Type``, ``Content-Length``, ``Content-Encoding`` and
``Transfer-Encoding`` to the application, and never passes the query string (where the ``ga4`` transport
puts its ``api_secret``). Every answer says ``Connection: close``.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import queue
import selectors
import socket
import threading
import time
from urllib.parse import unquote_to_bytes

from ._common import BATCH_PATH, GA4_PATH
from ._wire import MAX_BODY_BYTES
from ._wsgi import DRAIN_LIMIT, status_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, Final

    from ._wsgi import Collector

REQUEST_DEADLINE: Final = 10.0
"""Seconds from a connection's acceptance to its whole request (line, headers, body) being read."""

MAX_CONNECTIONS: Final = 1024
"""Connections being read at once; beyond that, the oldest is closed to make room (a slow client's loss)."""

WORKERS: Final = 8
"""Threads running the application on complete requests (SQLite writes one batch at a time anyway)."""

MAX_HEAD_BYTES: Final = 16 * 1024
"""Request line and headers together (ours are a few hundred bytes); more is answered ``431``."""

STOP_GRACE: Final = 1.0
"""On stop, how long requests already being stored may take to finish before the server returns."""

WRITE_TIMEOUT: Final = 5.0
"""Seconds to hand an answer (a few hundred bytes) to a client that does not read it."""

SERVER_NAME: Final = "spool-reporter-collector"
"""The ``Server`` header: not the Python version, which helps nobody but attackers."""

_KEPT_HEADERS: Final = {"content-encoding": "HTTP_CONTENT_ENCODING", "transfer-encoding": "HTTP_TRANSFER_ENCODING"}
"""Request headers passed to the application (besides ``Content-Type`` and ``Content-Length``)."""

_STOP: Final = object()


def _answer(code: int, body: bytes = b"", headers: list[tuple[str, str]] | None = None) -> bytes:
    """A complete ``HTTP/1.0`` answer that closes the connection."""
    try:
        status = status_line(code)
    except ValueError:  # a code http does not know
        status = f"{code} Error"
    if not body and code != 204:
        body = f"{status}\n".encode("ascii")
    lines = [f"HTTP/1.0 {status}", f"Server: {SERVER_NAME}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers or [("Content-Type", "text/plain; charset=utf-8")]]
    if code != 204 and not any(k.lower() == "content-length" for k, _ in headers or []):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection:
    """One accepted connection while its request is read."""

    __slots__ = ("body_wanted", "buffer", "deadline", "drain", "environ", "head_end", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = bytearray()
        self.head_end = -1
        self.body_wanted = 0
        self.drain = False
        self.environ: dict[str, Any] | None = None


class _Errors(io.StringIO):
    """``wsgi.errors`` that keeps nothing: a traceback would carry request data."""

    def write(self, s: str) -> int:
        return len(s)


class _Problem(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _close(sock: socket.socket) -> None:
    """Close after the answer without a reset: unread bytes at ``close()`` make the kernel send RST, which
    can destroy the answer before the client reads it. Never blocks (the socket is non-blocking)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with contextlib.suppress(OSError):
        for _ in range(16):  # at most 1 MiB of what is already here
            if not sock.recv(65536):
                break
    with contextlib.suppress(OSError):
        sock.close()


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


class CollectorServer:
    """A bound (listening) embedded server for a :class:`~spool_reporter.collector.Collector`.

    Connections are accepted into the backlog from construction on, so a client may connect as soon as
    :attr:`url` is known. Run it with :meth:`serve_forever` (blocks) or :meth:`start` (a daemon thread),
    and end it with :meth:`stop` (from another thread or a signal handler), or use it as a context manager.
    """

    def __init__(
        self, app: Collector, *, host: str = "127.0.0.1", port: int = 0, request_deadline: float = REQUEST_DEADLINE
    ) -> None:
        self.app = app
        self.host = host
        self.request_deadline = request_deadline
        """Seconds a connection has to deliver its whole request (:data:`REQUEST_DEADLINE`)."""
        listener = socket.socket(_family(host), socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        """The port actually bound (the free one picked when asked for port 0)."""
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._done.set()  # not serving yet
        self._thread: threading.Thread | None = None
        self._work: queue.Queue[object] = queue.Queue()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._idle = threading.Condition(self._busy_lock)
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/v1/batch``: where clients post their batches."""
        return self._url(BATCH_PATH)

    @property
    def ga4_url(self) -> str:
        """``http://127.0.0.1:PORT/mp/collect``: the endpoint for clients using the ``ga4`` transport."""
        return self._url(GA4_PATH)

    def _url(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    # -- running --------------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`request_stop` or :meth:`stop` is called (from another thread or a signal handler)."""
        if self._closed:
            return
        self._done.clear()
        try:
            self._start_workers()
            self._loop()
        finally:
            self._done.set()

    def start(self) -> CollectorServer:
        """Serve in a daemon thread; returns ``self``."""
        if self._thread is None:
            self._done.clear()
            self._thread = threading.Thread(target=self.serve_forever, name="spool-collector", daemon=True)
            self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to return (safe from a signal handler: sets a flag, writes one byte)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (at most ~:data:`STOP_GRACE` s for requests being stored), flush the forwarder (at
        most ``timeout`` seconds), close the store."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            self._thread = None
        elif self._thread is None:
            self._done.wait(timeout)
        if not self._closed:
            self._closed = True
            for sock in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    sock.close()
            forward = self.app.forward
            if forward is not None:
                with contextlib.suppress(Exception):
                    forward.close(timeout)
            self.app.store.close()

    def __enter__(self) -> CollectorServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the reading thread ---------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        self._workers = [
            threading.Thread(target=self._worker, name=f"spool-collector-{i}", daemon=True) for i in range(WORKERS)
        ]
        for worker in self._workers:
            worker.start()

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        conns: dict[int, _Connection] = {}
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                timeout = 0.5
                if conns:
                    timeout = max(0.0, min(timeout, min(c.deadline for c in conns.values()) - now))
                for key, _ in sel.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept(sel, conns)
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._read(sel, conns, key.data)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline <= now]:
                    self._finish(sel, conns, conn, _answer(408))
        finally:
            self._shutdown(sel, conns)

    def _accept(self, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        for _ in range(64):  # bounded per wake-up, so reading is never starved by a flood of connects
            try:
                sock, _address = self._listener.accept()  # the address is never looked at, never kept
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: leave it in the backlog for now
                return
            if len(conns) >= MAX_CONNECTIONS:
                oldest = min(conns.values(), key=lambda c: c.deadline)
                self._finish(sel, conns, oldest, _answer(503, headers=[("Retry-After", "5")]))
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + self.request_deadline)
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, sel: selectors.BaseSelector, conns: dict[int, _Connection], conn: _Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._finish(sel, conns, conn, None)
            return
        if conn.drain:  # an oversized body, read and discarded so that the client gets the 413
            conn.body_wanted -= len(data)
            if not data or conn.body_wanted <= 0:
                self._dispatch(sel, conns, conn, b"")
            return
        conn.buffer += data
        try:
            if conn.environ is None:
                end = conn.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.buffer) > MAX_HEAD_BYTES:
                        raise _Problem(431 if b"\r\n" in conn.buffer else 414)
                    if not data:  # the client hung up before its headers ended
                        raise _Problem(400)
                    return
                if end > MAX_HEAD_BYTES:
                    raise _Problem(431)
                conn.environ = self._environ(bytes(conn.buffer[:end]))
                conn.head_end = end + 4
                length = conn.environ.get("CONTENT_LENGTH")
                conn.body_wanted = int(length) if length else 0
                if conn.body_wanted > DRAIN_LIMIT:
                    # Refused from its length at once, without reading a byte of the body.
                    self._dispatch(sel, conns, conn, b"")
                    return
                if conn.body_wanted > MAX_BODY_BYTES:
                    conn.drain = True
                    conn.body_wanted -= len(conn.buffer) - conn.head_end
                    conn.buffer = bytearray()
                    if conn.body_wanted <= 0:
                        self._dispatch(sel, conns, conn, b"")
                    return
            body_have = len(conn.buffer) - conn.head_end
            if body_have >= conn.body_wanted or not data:
                # Complete, or the client hung up early: the application sees a short body and refuses it.
                self._dispatch(sel, conns, conn, bytes(conn.buffer[conn.head_end : conn.head_end + conn.body_wanted]))
        except _Problem as problem:
            self._finish(sel, conns, conn, _answer(problem.code))

    def _environ(self, head: bytes) -> dict[str, Any]:
        """The WSGI environ of a request head; :class:`_Problem` for anything that is not HTTP/1.x."""
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
            raise _Problem(400) from exc
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha() or not parts[0].isupper():
            raise _Problem(400)
        method, target, version = parts
        if not target.startswith("/"):
            raise _Problem(400)
        path = target.split("?", 1)[0]  # the query string is never passed on
        env: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": version,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.errors": _Errors(),
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        chunked = False
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise _Problem(400)
            key, value = name.lower(), value.strip()
            if key == "content-type":
                env["CONTENT_TYPE"] = value
            elif key == "content-length":
                if not (value.isascii() and value.isdigit()) or len(value) > 18 or "CONTENT_LENGTH" in env:
                    raise _Problem(400)
                env["CONTENT_LENGTH"] = value
            elif key in _KEPT_HEADERS:
                env[_KEPT_HEADERS[key]] = value
                chunked = chunked or key == "transfer-encoding"
        if chunked:
            env.pop("CONTENT_LENGTH", None)  # not decoded here: the application answers 411
        return env

    def _dispatch(
        self, sel: selectors.BaseSelector, conns: dict[int, _Connection], conn: _Connection, body: bytes
    ) -> None:
        """Hand a complete request to the workers; the connection leaves the reading thread."""
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        assert conn.environ is not None
        conn.environ["wsgi.input"] = io.BytesIO(body)
        with self._busy_lock:
            self._busy += 1
        self._work.put((conn.sock, conn.environ))

    @staticmethod
    def _finish(
        sel: selectors.BaseSelector, conns: dict[int, _Connection], conn: _Connection, answer: bytes | None
    ) -> None:
        """Answer (best effort, never blocking) and close a connection the reading thread holds."""
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        if answer is not None:
            with contextlib.suppress(OSError):
                conn.sock.send(answer)
        _close(conn.sock)

    def _shutdown(self, sel: selectors.BaseSelector, conns: dict[int, _Connection]) -> None:
        """Stop: close what is being read, refuse what waits, give what is being stored a moment."""
        refuse = _answer(503, headers=[("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "5")])
        for conn in list(conns.values()):
            self._finish(sel, conns, conn, refuse)
        with contextlib.suppress(Exception):
            sel.close()
        for _ in range(MAX_CONNECTIONS):  # connected but not yet accepted: told too, not reset
            try:
                sock, _address = self._listener.accept()
            except OSError:
                break
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.send(refuse)
            _close(sock)
        with contextlib.suppress(OSError):
            self._listener.close()  # new connections are refused from here on
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                continue
            waiting: socket.socket = item[0]  # type: ignore[index]
            with contextlib.suppress(OSError):
                waiting.send(refuse)
            with contextlib.suppress(OSError):
                waiting.close()
            self._done_one()
        deadline = time.monotonic() + STOP_GRACE
        with self._idle:
            while self._busy > 0 and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
        for _ in self._workers:
            self._work.put(_STOP)

    # -- the workers ----------------------------------------------------------------------------------------

    def _done_one(self) -> None:
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is _STOP:
                return
            client: socket.socket = item[0]  # type: ignore[index]
            environ: dict[str, Any] = item[1]  # type: ignore[index]
            try:
                if self._stopping.is_set():
                    answer = _answer(503, headers=[("Content-Type", "text/plain; charset=utf-8"), ("Retry-After", "5")])
                else:
                    answer = self._run_app(environ)
                client.settimeout(WRITE_TIMEOUT)
                client.sendall(answer)
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_WR)
            except Exception:  # noqa: S110 - a client that went away; nothing of it is worth a line
                pass
            finally:
                with contextlib.suppress(OSError):
                    client.close()
                self._done_one()

    def _run_app(self, environ: dict[str, Any]) -> bytes:
        state: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            state["status"], state["headers"] = status, headers
            return lambda data: None

        try:
            body = b"".join(self.app(environ, start_response))
        except Exception:
            return _answer(500)
        code = int(str(state.get("status", "500")).split(" ", 1)[0])
        return _answer(code, body, list(state.get("headers", [])))
