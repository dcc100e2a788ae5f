"""The embedded HTTP server: the standard library's :mod:`wsgiref` with one thread per connection.

Good for a laptop, a demo and the tests; a production deployment runs the same WSGI application under
gunicorn or uWSGI behind a TLS proxy (``docs/collector.md``).

:mod:`http.server` and :mod:`socketserver` log every request *with the client's address* to stderr, and
print the address again with any traceback. Every one of those paths is silenced here: the request
handler's ``log_message``, the server's ``handle_error``, and the environ (``REMOTE_ADDR`` and
``REMOTE_HOST`` are removed before the application sees it, so not even a future bug can store them).
"""

from __future__ import annotations

import contextlib
import http
import ipaddress
import socket
import socketserver
import threading
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from ._wsgi import BATCH_PATH, GA4_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, Final

    from ._wsgi import Collector

SOCKET_TIMEOUT: Final = 10.0
"""A connection that sends nothing for this long is closed (a slow client cannot hold a thread forever)."""

_KEPT_HEADERS: Final = frozenset(("HTTP_CONTENT_ENCODING", "HTTP_TRANSFER_ENCODING"))
"""Request headers passed to the application (besides CONTENT_TYPE and CONTENT_LENGTH, which are not HTTP_*)."""

MAX_CONNECTIONS: Final = 64
"""Connections served at once; the next ones wait in the listen backlog (back-pressure, bounded threads)."""


class _QuietServerHandler(ServerHandler):
    server_software = "spool-reporter-collector"  # not the Python version, which helps nobody but attackers

    def log_exception(self, exc_info: Any) -> None:
        # The default prints a traceback to stderr; ours could only come from a dead socket. Say nothing.
        pass

    def cleanup_headers(self) -> None:
        # wsgiref adds "Content-Length: 0" to an answer without one; a 204 must not carry it (RFC 9110).
        if not str(getattr(self, "status", "")).startswith("204"):  # typeshed omits BaseHandler.status
            super().cleanup_headers()


class _Handler(WSGIRequestHandler):
    """wsgiref's handler without request logging and without the client's address in the environ."""

    timeout = SOCKET_TIMEOUT
    server_version = "spool-reporter-collector"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        # BaseHTTPRequestHandler writes '<client address> - - [date] "request line" status' here.
        pass

    def get_environ(self) -> dict[str, Any]:
        # The application needs the body's length, type and encoding and nothing else about the request:
        # the client's address and every other header (User-Agent, X-Forwarded-For, cookies) never reach it.
        env = super().get_environ()
        for key in [k for k in env if k.startswith("HTTP_") and k not in _KEPT_HEADERS]:
            del env[key]
        env.pop("REMOTE_ADDR", None)
        env.pop("REMOTE_HOST", None)
        return env

    def address_string(self) -> str:
        return "-"

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's page echoes the request line back in HTML and, for an unparsable request, omits the
        # status line (HTTP/0.9). Answer every protocol error the same short, plain way instead.
        self.close_connection = True
        try:
            phrase = http.HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        body = f"{code} {phrase}\n".encode("ascii")
        head = (
            f"HTTP/1.0 {code} {phrase}\r\nServer: {self.server_version}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            self.wfile.write(head.encode("ascii") + body)

    def handle(self) -> None:
        # Same as WSGIRequestHandler.handle, with the quiet ServerHandler.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = ""
            self.request_version = ""
            self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = _QuietServerHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]  # typeshed: BufferedIOBase, wsgiref wants IO[bytes]
            self.get_stderr(),
            self.get_environ(),
            multithread=True,
        )
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref's ServerHandler reads it
        handler.run(self.server.get_app())  # type: ignore[attr-defined]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn() on the address: a DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints "Exception occurred during processing of request from ('1.2.3.4', 5678)"
        # and a traceback. A client that hung up is not worth a line, and its address is not ours to print.
        pass


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CollectorServer:
    """A bound (listening) embedded server for a :class:`~spool_reporter.collector.Collector`.

    Connections are accepted into the backlog from construction on, so a client may connect as soon as
    :attr:`url` is known. Run it with :meth:`serve_forever` (blocks) or :meth:`start` (a daemon thread),
    and end it with :meth:`stop`, or use it as a context manager.
    """

    def __init__(self, app: Collector, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self._httpd = _ThreadingServer((host, port), _family(host))
        self._httpd.set_app(app)
        self._thread: threading.Thread | None = None
        self.host = host
        self.port: int = self._httpd.server_port
        """The port actually bound (the free one picked when asked for port 0)."""

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

    def serve_forever(self) -> None:
        """Serve until :meth:`stop` is called from another thread (or the process is interrupted)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> CollectorServer:
        """Serve in a daemon thread; returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, name="spool-collector", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close the socket, flush the forwarder (at most ``timeout`` seconds), close the store."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout)
            self._thread = None
        self._httpd.server_close()
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
