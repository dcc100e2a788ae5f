"""The production front as shipped: ``deploy/nginx/spool-collector.conf`` in a real nginx, in front of a real
gunicorn started with ``deploy/gunicorn.conf.py`` (docs/collector.md, "Run it in production").

The test writes its own main ``nginx.conf`` (``daemon off``, the pid file, the main error log at ``info`` and
every temporary path in a throw-away prefix, and an ``http`` block with the access log, error log, proxy headers
and TLS protocols an operator's ``nginx.conf`` typically has) and includes the repository's file after
substituting only its site-specific lines: the ``listen`` address, ``server_name``, the two certificate paths
(a throw-away CA's certificate for ``localhost`` and ``127.0.0.1``) and the upstream ``server`` (gunicorn on a
unix socket, so that no address appears on the path from nginx to the collector). Each substitution must match
exactly once: a change in the file's shape fails here instead of going untested.

Then every situation in which nginx writes the client's address to its error log: a real flusher delivering
over TLS; an oversized body (413); a chunked body (411); clients that stall in the handshake, the headers or
the body beyond the timeouts (held all along, while the rest runs); gunicorn stopped (``503`` with
``Retry-After``, and a real flusher that keeps its batch and backs off as asked); meanwhile a stand-in on
gunicorn's socket, which records what nginx forwards (no client header, no address) and answers a download
larger than every buffer to a client slow to read it; a flood (``429`` with ``Retry-After``, and a real
flusher that honours it); and failed TLS handshakes (plain HTTP, garbage, TLS 1.0, ciphers nginx does not
offer, an untrusted certificate, a client gone mid-handshake, and the malformed ClientHellos that nginx 1.22
with OpenSSL 3 logs at ``crit``). Afterwards no file in nginx's prefix, gunicorn's log or the collector's
database holds ``127.0.0.1`` (nor, in the database, its four bytes), nor the API secret of a ``/mp/collect``
query.

The same scenarios run first against a control: the same file with the collector's ``error_log /dev/null``
replaced by a file at ``info``, which must then hold the address, scenario by scenario -- so the scan above
can fail -- and must not say that a body went through a temporary file. ``SPOOL_REPORTER_TEST_NGINX`` names
another nginx binary (e.g. a current one) to run it against.

Skipped, with the reason, where nginx, gunicorn or trustme is missing -- except on Linux in CI (``CI`` set),
where ``.ci/run`` installs nginx and a skip would hide a broken front: there it fails.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spool_reporter import App, _state
from spool_reporter.collector import stats

from support.commands import spool_command
from support.polling import stop_process, wait_for
from support.ports import free_port
from support.sandbox import REPO, Sandbox, clean_environ
from support.servers import fill, with_destination

SITE = REPO / "deploy" / "nginx" / "spool-collector.conf"
GUNICORN_CONF = REPO / "deploy" / "gunicorn.conf.py"
ADDRESS = b"127.0.0.1"
"""The clients' address, which must reach no file."""
API_SECRET = "nginx-probe-secret-93be1c"  # in /mp/collect's query: must reach no file either


def _find_nginx() -> str | None:
    named = os.environ.get("SPOOL_REPORTER_TEST_NGINX")
    if named:
        return named
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


NGINX = _find_nginx()


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "runs nginx and gunicorn as on a Linux server"
    if NGINX is None:
        return "nginx is not installed (Debian: apt-get install nginx; .ci/run installs it when missing)"
    if not os.access(NGINX, os.X_OK):
        return f"SPOOL_REPORTER_TEST_NGINX={NGINX} is not an executable"
    if importlib.util.find_spec("gunicorn") is None:
        return "gunicorn is not installed (pip install 'spool_reporter[collector]')"
    if importlib.util.find_spec("trustme") is None:
        return "trustme is not installed"
    return None


MISSING = _missing()
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    if MISSING is None:
        return
    if os.environ.get("CI") and sys.platform.startswith("linux"):
        pytest.fail(f"{MISSING}: CI must run the production front's test", pytrace=False)
    pytest.skip(MISSING)


def nginx_version() -> tuple[int, ...]:
    assert NGINX is not None
    done = subprocess.run([NGINX, "-v"], capture_output=True, text=True, timeout=30, check=True)
    match = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", done.stderr)
    assert match, done.stderr
    return tuple(int(part) for part in match.groups())


def _seconds(directive: str) -> int:
    match = re.search(rf"^\s*{directive}\s+(\d+)s;", SITE.read_text(), re.MULTILINE)
    assert match, f"{SITE.name} sets no {directive} in seconds"
    return int(match.group(1))


# --- the files under test, made runnable ------------------------------------------------------------------


def substitute(text: str, old: str, new: str) -> str:
    """``text`` with its one occurrence of ``old`` replaced; fails unless ``old`` occurs exactly once."""
    assert text.count(old) == 1, f"{SITE.name}: expected exactly one {old!r}, found {text.count(old)}"
    return text.replace(old, new)


@dataclass
class Certs:
    ca: Path
    chain: Path
    key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    import trustme

    folder = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    paths = Certs(folder / "ca.pem", folder / "chain.pem", folder / "key.pem")
    ca.cert_pem.write_to_path(str(paths.ca))
    paths.chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(paths.key))
    return paths


class Nginx:
    """The repository's site file in a main configuration of the test's, in a prefix of its own.

    ``prefix`` is nginx's: its logs, pid file and temporary files, all scanned afterwards. ``conf`` holds the
    test's own files (the configuration, which names 127.0.0.1 in ``listen``), never written by nginx.
    """

    def __init__(self, root: Path, certs: Certs, upstream: Path, *, control: bool) -> None:
        assert NGINX is not None
        self.binary = NGINX
        self.prefix = root / "nginx"
        self.conf = root / "conf"
        for folder in (self.prefix / "logs", self.prefix / "temp", self.conf):
            folder.mkdir(parents=True)
        self.port = free_port()
        self.control_log = self.prefix / "logs" / "collector-error.log"
        site = SITE.read_text()
        site = substitute(site, "listen 443 ssl default_server;", f"listen 127.0.0.1:{self.port} ssl default_server;")
        site = substitute(site, "server_name collector.example.org;", "server_name localhost;")
        site = substitute(site, "/etc/letsencrypt/live/collector.example.org/fullchain.pem;", f"{certs.chain};")
        site = substitute(site, "/etc/letsencrypt/live/collector.example.org/privkey.pem;", f"{certs.key};")
        site = substitute(site, "server 127.0.0.1:8000;", f"server unix:{upstream};")
        if control:  # the one difference: the collector's server logs, to a file, everything down to info
            site = substitute(site, "error_log /dev/null;", f"error_log {self.control_log} info;")
        (self.conf / "spool-collector.conf").write_text(site)
        temp = self.prefix / "temp"
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers that can reach the socket in a 0700 tmp
        (self.conf / "nginx.conf").write_text(
            f"""daemon off;
master_process on;
worker_processes 1;
{user}pid {self.prefix / "nginx.pid"};
error_log {self.prefix / "logs" / "error.log"} info;
events {{
    worker_connections 256;
}}
http {{
    # What an operator's nginx.conf may hold (Debian's has the access log and the TLS protocols): the
    # site's own directives must win over each.
    access_log {self.prefix / "logs" / "access.log"};
    ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3;
    error_log {self.prefix / "logs" / "http-error.log"} info;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Real-IP $remote_addr;
    client_body_temp_path {temp / "client_body"};
    proxy_temp_path {temp / "proxy"};
    fastcgi_temp_path {temp / "fastcgi"};
    uwsgi_temp_path {temp / "uwsgi"};
    scgi_temp_path {temp / "scgi"};
    include {self.conf / "spool-collector.conf"};
}}
"""
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, *extra: str) -> list[str]:
        main, startup_log = self.conf / "nginx.conf", self.prefix / "logs" / "startup.log"
        return [self.binary, "-p", f"{self.prefix}/", "-c", str(main), "-e", str(startup_log), *extra]

    def check(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command("-t"), capture_output=True, text=True, timeout=30, check=False)

    def start(self) -> None:
        with (self.prefix / "logs" / "stderr.log").open("wb") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT)

        def listening() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, (self.prefix / "logs" / "stderr.log").read_text(errors="replace")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
            return False

        try:
            wait_for(listening, timeout=20, what="nginx to listen", interval=0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc, grace=15)  # SIGTERM, nginx's fast shutdown: close whatever is still open


def unix_get(path: Path, target: str, timeout: float = 5) -> bytes:
    """``GET target`` on the unix socket ``path`` (gunicorn's), the whole answer; bounded in time and size."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(f"GET {target} HTTP/1.0\r\nHost: collector\r\n\r\n".encode())
        return _read_all(sock, time.monotonic() + timeout)


def _read_all(sock: socket.socket, deadline: float, limit: int = 1 << 20) -> bytes:
    data = b""
    while time.monotonic() < deadline and len(data) < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class Gunicorn:
    """``gunicorn -c deploy/gunicorn.conf.py --bind unix:SOCKET``: the shipped settings, but for the bind."""

    def __init__(self, socket_path: Path, db: Path, log: Path, env: dict[str, str]) -> None:
        self.socket = socket_path
        self.log = log
        self.env = {**env, "SPOOL_REPORTER_COLLECTOR_DB": str(db)}
        self.proc: subprocess.Popen[bytes] | None = None
        self.cwd = db.parent

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "--bind", f"unix:{self.socket}"],
                env=self.env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def healthy() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            with contextlib.suppress(OSError):
                return unix_get(self.socket, "/v1/health").split(b"\r\n", 1)[0].endswith(b" 200 OK")
            return False

        try:
            wait_for(healthy, timeout=60, what="gunicorn to answer", interval=0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int:
        assert self.proc is not None
        code = stop_process(self.proc, grace=30)
        if code is None:
            raise AssertionError("gunicorn did not stop within 30 s of SIGTERM")
        return code


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    # A short path: a unix socket's path must fit in 108 bytes, which a deep pytest tmp dir may not.
    folder = Path(tempfile.mkdtemp(prefix="spool-ngx-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- clients ------------------------------------------------------------------------------------------------


def client_context(certs: Certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


def request(
    port: int,
    ctx: ssl.SSLContext,
    method: str,
    target: str,
    body: bytes | None = None,
    *,
    pause: float = 0.0,
    **headers: str,
) -> tuple[int, dict[str, str], bytes]:
    """One request; its status, headers and body (read ``pause`` seconds after the headers)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=15)
    try:
        conn.request(method, target, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
        response = conn.getresponse()
        time.sleep(pause)
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def raw_exchange(port: int, ctx: ssl.SSLContext, data: bytes) -> int:
    """Send ``data``, a request as written, over TLS; the answer's status. (The answer is read by its length:
    after an answer to a body it did not read, nginx may keep the connection a while before it closes.)"""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as plain,
        ctx.wrap_socket(plain, server_hostname="localhost") as sock,
    ):
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        response.read()
        return response.status


EMPTY_BATCH = b'{"schema": 1, "events": []}'


@dataclass
class Flusher:
    """A user with a spool and the real ``django-spool flush`` pointed at the front."""

    sandbox: Sandbox
    env: dict[str, str]
    app: App

    def queue(self, count: int) -> None:
        fill(self.app, self.sandbox.env, count)

    def flush(self) -> tuple[int, str, float | None]:
        """Exit status, the first line (the counts), and the seconds until the next retry (``None`` after a
        success)."""
        done = subprocess.run(
            [*spool_command(), "flush"], env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        state = _state.read_state(self.app, environ=self.env)
        ahead = None if state.next_retry is None else state.next_retry - time.time()
        return done.returncode, (done.stdout.strip() or done.stderr.strip()).split("\n")[0], ahead


def flusher(root: Path, port: int, certs: Certs, app: App) -> Flusher:
    root.mkdir(parents=True)
    sandbox = Sandbox(root)
    env = with_destination(
        sandbox.env,
        f"https://localhost:{port}/v1/batch",
        SSL_CERT_FILE=str(certs.ca),  # the throw-away CA, as a user's system trust store would hold a real one
        SPOOL_REPORTER_FLUSH_DEADLINE="20",
        SPOOL_REPORTER_CONNECT_TIMEOUT="5",
        SPOOL_REPORTER_READ_TIMEOUT="10",
    )
    return Flusher(sandbox, env, app)


# Clients that stall: each is held open from the start of a run while the other scenarios go on, until nginx
# drops it (client_header_timeout, which also bounds a handshake, or client_body_timeout).


@dataclass
class Stalled:
    name: str
    tls: bool
    sends: bytes
    got: bytes = b""
    ended_after: float | None = None
    error: str = ""


STALLED = [
    ("handshake never started", False, b""),
    ("plain HTTP, half a request line", False, b"GET /v1/health HTT"),
    ("TLS, headers never finished", True, b"POST /v1/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: applic"),
    (
        "TLS, body never finished",
        True,
        b"POST /v1/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4000\r\n\r\n" + b'{"schema": 1, "events": [' + b" " * 100,
    ),
]


def hold(port: int, ctx: ssl.SSLContext, stalled: Stalled, started: float, wait: float) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            sock = ctx.wrap_socket(plain, server_hostname="localhost") if stalled.tls else plain
            with sock:
                if stalled.sends:
                    sock.sendall(stalled.sends)
                sock.settimeout(wait)
                stalled.got = _read_all(sock, started + wait)
    except (OSError, ssl.SSLError) as exc:
        stalled.error = type(exc).__name__
    stalled.ended_after = time.monotonic() - started


# TLS handshakes that fail. nginx 1.22 with OpenSSL 3 logs the reasons it does not know at crit (the crafted
# ClientHellos below); the rest at info.


def _extension(kind: int, data: bytes) -> bytes:
    return struct.pack("!HH", kind, len(data)) + data


def _list16(items: list[int]) -> bytes:
    data = b"".join(struct.pack("!H", i) for i in items)
    return struct.pack("!H", len(data)) + data


def client_hello(
    *,
    groups: tuple[int, ...] = (0x1D,),
    share: tuple[int, bytes] | None = None,
    sigalgs: bool = True,
    twice: bool = False,
) -> bytes:
    """A TLS 1.3 ClientHello, malformed as asked (0x1d: x25519, 0x17: secp256r1)."""
    group, key = share if share is not None else (0x1D, os.urandom(32))
    name = b"localhost"
    extensions = [
        _extension(0x00, struct.pack("!HBH", len(name) + 3, 0, len(name)) + name),
        _extension(0x2B, b"\x02\x03\x04"),  # supported_versions: TLS 1.3
        _extension(0x0A, _list16(list(groups))),
        _extension(0x33, struct.pack("!HHH", len(key) + 4, group, len(key)) + key),
    ]
    if sigalgs:
        extensions.append(_extension(0x0D, _list16([0x0403, 0x0804, 0x0401])))
    if twice:
        extensions.append(extensions[1])  # the same extension twice
    body = b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32) + _list16([0x1301, 0x1302, 0xC02B, 0xC02F])
    body += b"\x01\x00" + struct.pack("!H", sum(map(len, extensions))) + b"".join(extensions)
    handshake = b"\x01" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def real_client_hello() -> bytes:
    """The ClientHello Python's own TLS client sends first."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


RAW_HANDSHAKES: list[tuple[str, Callable[[], bytes], bool]] = [
    # (what, the bytes sent, whether the client waits for an answer before it closes)
    ("plain HTTP to the TLS port", lambda: b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n", True),
    ("garbage bytes", lambda: bytes(range(1, 200)) * 2, True),
    ("garbage after a handshake record's type", lambda: b"\x16" + bytes(range(200, 0, -1)), True),
    ("a record longer than TLS allows", lambda: b"\x16\x03\x01\xff\xff" + os.urandom(300), True),
    ("a key share for a group not offered", lambda: client_hello(groups=(0x17,)), True),
    ("a malformed key share", lambda: client_hello(groups=(0x17,), share=(0x17, b"\x04" + os.urandom(10))), True),
    ("an extension twice", lambda: client_hello(twice=True), True),
    ("no signature algorithms", lambda: client_hello(sigalgs=False), True),
    ("half a ClientHello, then gone", lambda: real_client_hello()[:60], False),
    ("a whole ClientHello, gone after the server's answer", real_client_hello, True),
]


def raw_handshake(port: int, data: bytes, *, read: bool) -> str:
    """What nginx answered (an alert, an HTTP answer, nothing), as text for the report."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        if not read:
            return "-"
        try:
            answer = sock.recv(4096)
        except OSError as exc:
            return type(exc).__name__
    if answer[:1] == b"\x15":
        return "TLS alert"
    if answer[:1] == b"\x16":
        return "TLS handshake answer"
    return repr(answer[:30])


def _legacy_context(version: ssl.TLSVersion | None, ciphers: str) -> ssl.SSLContext:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0 is deprecated: that is the point
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if version is not None:
            ctx.minimum_version = version
        ctx.maximum_version = version or ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(ciphers)
    return ctx


def tls_clients(certs: Certs) -> list[tuple[str, ssl.SSLContext]]:
    import trustme

    untrusted = ssl.create_default_context()
    trustme.CA().configure_trust(untrusted)
    return [
        ("only TLS 1.0", _legacy_context(ssl.TLSVersion.TLSv1, "DEFAULT:@SECLEVEL=0")),
        ("only ciphers nginx does not offer", _legacy_context(None, "AES128-SHA:AES256-SHA:@SECLEVEL=0")),
        ("a client that does not trust the certificate", untrusted),
    ]


def tls_attempt(port: int, ctx: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        try:
            with ctx.wrap_socket(plain, server_hostname="localhost") as tls:
                return f"handshake completed ({tls.version()})"
        except (OSError, ssl.SSLError) as exc:
            return type(exc).__name__


# --- one run of every scenario ------------------------------------------------------------------------------


@dataclass
class Observed:
    statuses: dict[str, str] = field(default_factory=dict)
    stalled: list[Stalled] = field(default_factory=list)


def recorder(path: Path, answers: list[bytes], received: list[bytes]) -> threading.Thread:
    """A stand-in for gunicorn on its socket: records each request exactly as nginx sends it, and answers
    200 with the next of ``answers``, one connection each."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(10)

    def serve() -> None:
        try:
            for answer in answers:
                exchange(answer)
        except OSError:
            pass
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def exchange(answer: bytes) -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(15)
            data = b""
            deadline = time.monotonic() + 15
            while b"\r\n\r\n" not in data and time.monotonic() < deadline:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            head = data.partition(b"\r\n\r\n")[0]
            match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            length = int(match.group(1)) if match else 0
            while len(data) < len(head) + 4 + length and time.monotonic() < deadline:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            received.append(data)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def flood_requests(
    port: int, ctx: ssl.SSLContext, count: int, stop: threading.Event | None = None, pause: float = 0.05
) -> list[tuple[int, str | None]]:
    """Up to ``count`` empty batches in a row on one connection (until ``stop``, ``pause`` seconds apart); each
    status and Retry-After."""
    seen: list[tuple[int, str | None]] = []
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=15)
    try:
        for _ in range(count):
            if stop is not None and stop.wait(pause):
                break
            conn.request("POST", "/v1/batch", body=EMPTY_BATCH, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            seen.append((response.status, response.getheader("Retry-After")))
    finally:
        conn.close()
    return seen


def quietly(function: Callable[..., object]) -> Callable[..., None]:
    """``function`` for a helper thread, whose outcome is seen elsewhere: an error ends it without a trace."""

    def run(*args: object) -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            function(*args)

    return run


def run_scenarios(nginx: Nginx, gunicorn: Gunicorn, certs: Certs, db: Path, root: Path, app: App) -> Observed:
    seen = Observed()
    ctx = client_context(certs)
    port = nginx.port
    started = time.monotonic()
    wait = max(_seconds("client_header_timeout"), _seconds("client_body_timeout")) + 15.0
    seen.stalled = [Stalled(name, tls, sends) for name, tls, sends in STALLED]
    holders = [threading.Thread(target=hold, args=(port, ctx, s, started, wait), daemon=True) for s in seen.stalled]
    for t in holders:
        t.start()

    # A real flusher delivers two batches (500 and 100 events) over TLS.
    before = stats(db).events
    alice = flusher(root / "alice", port, certs, app)
    alice.queue(600)
    code, line, _ = alice.flush()
    assert (code, line) == (0, "delivered: sent 600, rejected 0, failed 0, still queued 0"), line
    assert stats(db).events == before + 600
    seen.statuses["flusher"] = line

    # The body cap and a body without a length, refused by nginx itself.
    big = raw_exchange(
        port,
        ctx,
        b"POST /v1/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 600000\r\n\r\n" + EMPTY_BATCH,
    )
    assert big == 413
    chunked = raw_exchange(
        port,
        ctx,
        b"POST /v1/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(EMPTY_BATCH), EMPTY_BATCH),
    )
    assert chunked == 411
    seen.statuses["oversized body"] = "413"
    seen.statuses["chunked body"] = "411"
    # /mp/collect's query carries a GA4 API secret, which no log may keep (the collector refuses the body).
    status, _, _ = request(port, ctx, "POST", f"/mp/collect?measurement_id=G-PROBE&api_secret={API_SECRET}", b"{}")
    seen.statuses["/mp/collect with a secret in the query"] = str(status)

    # gunicorn down: 503 with Retry-After; a real flusher keeps its events and backs off as long as asked.
    assert gunicorn.stop() == 0, gunicorn.log.read_text(errors="replace")[-2000:]
    assert not gunicorn.socket.exists()
    status, headers, body = request(port, ctx, "GET", "/v1/health")
    assert (status, headers.get("retry-after"), body) == (503, "30", b"collector unavailable\n")
    status, headers, _ = request(port, ctx, "POST", "/v1/batch", EMPTY_BATCH, Content_Type="application/json")
    assert (status, headers.get("retry-after")) == (503, "30")
    bob = flusher(root / "bob", port, certs, app)
    bob.queue(3)
    code, line, ahead = bob.flush()
    assert (code, line) == (1, "failed: sent 0, rejected 0, failed 3, still queued 3"), line
    assert ahead is not None
    assert 25 <= ahead <= 31, ahead  # Retry-After: 30 (the flusher's own base is 0.5 s here)
    seen.statuses["gunicorn down"] = f"503, Retry-After {headers.get('retry-after')}; flusher: {line}"

    # What reaches the collector: a stand-in on gunicorn's socket records the request as nginx forwards it.
    # Then a download larger than nginx's buffers and the client's socket can hold, to a client slow to read
    # it: passed on as the client reads, never spooled to a temporary file.
    received: list[bytes] = []
    download = os.urandom(16 << 20)
    stand_in = recorder(gunicorn.socket, [b"{}", download], received)
    status, _, _ = request(
        port,
        ctx,
        "POST",
        "/v1/batch",
        EMPTY_BATCH,
        Content_Type="application/json",
        X_Forwarded_For="198.51.100.7",
        X_Real_IP="198.51.100.7",
        Forwarded="for=198.51.100.7",
        User_Agent="PrivacyProbe/1.0",
        Cookie="probe=1",
    )
    assert status == 200
    status, _, body = request(port, ctx, "GET", "/v1/releases.csv", pause=1.0)
    assert (status, len(body), body == download) == (200, len(download), True)
    stand_in.join(15)
    assert len(received) == 2, received
    head, _, forwarded_body = received[0].partition(b"\r\n\r\n")
    names = {line.split(b":")[0].strip().lower() for line in head.split(b"\r\n")[1:]}
    assert names <= {b"host", b"connection", b"content-length", b"content-type"}, head
    assert forwarded_body == EMPTY_BATCH
    for probe in (ADDRESS, b"198.51.100.7", b"PrivacyProbe"):
        assert probe not in received[0], head
    seen.statuses["headers forwarded to gunicorn"] = ", ".join(sorted(n.decode() for n in names))

    gunicorn.start()
    code, line, ahead = bob.flush()
    assert (code, line, ahead) == (0, "delivered: sent 3, rejected 0, failed 0, still queued 0", None), line

    # A flood from one address: 429 with Retry-After once the burst is spent; a real flusher honours it.
    flood = flood_requests(port, ctx, 40)
    counts = Counter(status for status, _ in flood)
    assert set(counts) == {200, 429}, flood
    assert flood[0][0] == 200, flood
    assert {retry for status, retry in flood if status == 429} == {"60"}, flood
    assert {retry for status, retry in flood if status == 200} == {None}, flood
    carol = flusher(root / "carol", port, certs, app)
    carol.queue(2)
    # The bucket refills one request every 2 s: keep it spent while the flusher starts. A request every 5 ms takes
    # a refilled token before the flusher's request can (a pause of 50 ms left that request about one chance in 40
    # at each refill, and a flusher was once let through); at most 4,000 of them (about 30 s), or until it is done.
    stop = threading.Event()
    keep_spent = threading.Thread(target=quietly(flood_requests), args=(port, ctx, 4000, stop, 0.005), daemon=True)
    keep_spent.start()
    try:
        code, line, ahead = carol.flush()
    finally:
        stop.set()
        keep_spent.join(20)
    assert (code, line) == (1, "failed: sent 0, rejected 0, failed 2, still queued 2"), line
    assert ahead is not None
    assert 55 <= ahead <= 61, ahead  # Retry-After: 60
    seen.statuses["flood of 40"] = ", ".join(f"{n} x {status}" for status, n in sorted(counts.items()))
    seen.statuses["flusher after the flood"] = f"{line}; next try in {ahead:.0f} s"

    # Failed handshakes.
    for name, data, read in RAW_HANDSHAKES:
        answer = raw_handshake(port, data(), read=read)
        if name == "plain HTTP to the TLS port":
            assert answer.startswith("b'HTTP/1.1 400 "), answer
        seen.statuses[name] = answer
    for name, client in tls_clients(certs):
        outcome = tls_attempt(port, client)
        assert "completed" not in outcome, (name, outcome)
        seen.statuses[name] = outcome

    for t in holders:
        t.join(wait + 5)
    limit = max(_seconds("client_header_timeout"), _seconds("client_body_timeout"))
    for s in seen.stalled:
        # Dropped by nginx at its timeout (not by the client's own, later one).
        assert s.ended_after is not None
        assert limit - 1 <= s.ended_after <= limit + 8, s
        seen.statuses[f"stalled: {s.name}"] = f"closed after {s.ended_after:.1f} s {s.got[:12]!r} {s.error}".strip()
    return seen


# --- the tests ----------------------------------------------------------------------------------------------


def test_nginx_t_accepts_the_file_without_a_warning(tmp_path: Path, certs: Certs) -> None:
    for control in (False, True):
        nginx = Nginx(tmp_path / f"t-{control}", certs, tmp_path / "gunicorn.sock", control=control)
        done = nginx.check()
        assert done.returncode == 0, done.stderr
        assert "[warn]" not in done.stderr, done.stderr
        assert "[emerg]" not in done.stderr, done.stderr


def _hits(folder_or_file: Path, needle: bytes) -> dict[str, int]:
    if folder_or_file.is_file():
        files = [folder_or_file]
    else:
        files = sorted(p for p in folder_or_file.rglob("*") if p.is_file())
    found = {}
    for path in files:
        count = path.read_bytes().count(needle)
        if count:
            found[str(path)] = count
    return found


CONTROL_MESSAGES: dict[str, Callable[[str], bool]] = {
    # scenario -> the lines nginx writes about it (each also names the client's address)
    "flood": lambda line: "limiting requests" in line,
    "oversized body": lambda line: "client intended to send too large body" in line,
    "gunicorn down": lambda line: "while connecting to upstream" in line,
    "plain HTTP, garbage": lambda line: "plain HTTP request to HTTPS port" in line or "client sent invalid" in line,
    "failed TLS handshakes (info)": lambda line: "[info]" in line and "SSL_do_handshake() failed" in line,
    "failed TLS handshakes (crit)": lambda line: "[crit]" in line and "SSL_do_handshake() failed" in line,
    "client gone mid-handshake": lambda line: "peer closed connection in SSL handshake" in line,
    "stalled clients": lambda line: "client timed out" in line,
    "keep-alive connections closed": lambda line: "closed keepalive connection" in line,
}


@pytest.mark.serial  # a rate limit kept spent by a thread, and timeouts waited out (docs/testing.md)
def test_no_client_address_on_disk(tmp_path: Path, certs: Certs, socket_dir: Path, app: App) -> None:
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    db = db_dir / "collector.sqlite3"
    home = tmp_path / "gunicorn-home"
    home.mkdir()
    gunicorn = Gunicorn(socket_dir / "gunicorn.sock", db, tmp_path / "gunicorn.log", clean_environ(home))
    gunicorn.start()
    runs: dict[str, tuple[Nginx, Observed]] = {}
    try:
        for variant in ("control", "as-shipped"):
            nginx = Nginx(tmp_path / variant, certs, gunicorn.socket, control=variant == "control")
            checked = nginx.check()
            assert checked.returncode == 0, checked.stderr
            assert "[warn]" not in checked.stderr, checked.stderr
            nginx.start()
            try:
                runs[variant] = (nginx, run_scenarios(nginx, gunicorn, certs, db, tmp_path / f"{variant}-users", app))
            finally:
                nginx.stop()
    finally:
        code = gunicorn.stop()
    assert code == 0, gunicorn.log.read_text(errors="replace")[-2000:]

    # The control proves the scenarios make nginx log the address: scenario by scenario, in its server's log.
    control, _ = runs["control"]
    lines = [
        line
        for line in control.control_log.read_text(errors="replace").splitlines()
        if re.search(r"\bclient:? 127\.0\.0\.1\b", line)
    ]
    found = {scenario: sum(map(matches, lines)) for scenario, matches in CONTROL_MESSAGES.items()}
    print(f"\ncontrol: {len(lines)} lines with the client's address in {control.control_log.name}: {found}")
    if nginx_version() >= (1, 23):  # 1.23 logs at info the handshake failures 1.22 logs at crit
        del found["failed TLS handshakes (crit)"]
    assert all(found.values()), found
    # ... and that no body, sent or answered, went through a temporary file (nginx says so at warn).
    assert "buffered to a temporary file" not in control.control_log.read_text(errors="replace")
    assert _hits(control.prefix, ADDRESS), "the control found nothing: the scan cannot fail"

    # As shipped: not one byte of the address anywhere nginx, gunicorn or the collector wrote.
    shipped, observed = runs["as-shipped"]
    for key, value in observed.statuses.items():
        print(f"  {key}: {value}")
    scanned = [shipped.prefix, gunicorn.log, db_dir]
    assert any(p.is_file() for p in shipped.prefix.rglob("*")), "nothing to scan"
    for place in scanned:
        assert _hits(place, ADDRESS) == {}, place
        assert _hits(place, API_SECRET.encode()) == {}, place
    assert _hits(db_dir, socket.inet_aton("127.0.0.1")) == {}  # nor in binary form in the database
    assert stats(db).events == 2 * (600 + 3)  # and what was sent arrived, once
    json.dumps(observed.statuses)  # the report is plain data
