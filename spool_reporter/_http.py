"""Sending one request within the flusher's deadline: proxies, the TLS pool, answers, ``Retry-After``.

Used by the flusher (:mod:`._flush`) and by ``forget`` (:mod:`._forget`); never by the hook.

* **One deadline.** :class:`Sender` runs each request in a worker thread that the caller abandons at the run's
  deadline: DNS look-ups (which no urllib3 timeout covers) and servers that trickle bytes (a read timeout is
  per ``recv``) cannot hold a run past it. The per-request timeouts are clamped to what is left of it.
* **Certificates always verified**, against the system's trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR``
  honoured); plain ``http://`` is accepted by :mod:`._settings` only for loopback destinations.
* **Proxies** from ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``, matched as curl and requests match them
  (:func:`no_proxy_matches`); a loopback destination never goes through a proxy (:func:`proxy_for`).
  ``localhost`` names are connected to on 127.0.0.1 then ::1, never resolved (RFC 6761).
* **No redirect is followed, no retry made**, and at most :data:`MAX_RESPONSE_BYTES` of an answer are read.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from . import _settings
from ._net import is_localhost_name, is_loopback
from .transports import Request

if TYPE_CHECKING:
    import urllib3

__all__ = ["Answer", "Sender", "no_proxy_matches", "parse_retry_after", "proxy_for"]

DEADLINE_SLACK: Final = 0.05
"""A request that ends in a timeout this close to the deadline (or later) is reported as the deadline's: the
per-request timeouts are clamped to what is left of it (urllib3's own rounding makes up the slack)."""

GONE: Final = 410
"""``410 Gone`` (RFC 9110 15.5.11: "no longer available ... likely to be permanent"): the one answer that stops a
flusher for good, the destination retiring itself (:attr:`Answer.kind` ``gone``). It can only reduce what is
sent, so it needs no signature (docs/threat-model.md)."""

MAX_RESPONSE_BYTES: Final = 4096
"""Response bytes read at most (no content decoding): enough for the collector's answer or an error text."""


def _env_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``urllib.request.getproxies_environment`` for an explicit mapping (lower case wins, CGI-safe)."""
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        key = name.lower()
        if value and key.endswith("_proxy"):
            proxies[key[:-6]] = value
    if "REQUEST_METHOD" in environ:
        proxies.pop("http", None)  # httpoxy: a CGI request's Proxy: header must not become HTTP_PROXY
    for name, value in environ.items():
        if name.endswith("_proxy"):
            key = name.lower()
            if value:
                proxies[key[:-6]] = value
            else:
                proxies.pop(key[:-6], None)
    return proxies


def _no_proxy_entry(entry: str) -> tuple[str, int | None] | None:
    """One ``NO_PROXY`` entry as ``(host or network, port or None)``; ``None`` if it cannot match anything."""
    port: int | None = None
    if entry.startswith("["):  # [v6], [v6]:port, [v6]/bits
        close = entry.find("]")
        if close < 0:
            return None
        host, rest = entry[1:close], entry[close + 1 :]
        if rest.startswith("/"):
            host += rest
        elif rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit():
            port = int(rest[1:])
        elif rest:
            return None
        return host, port
    if entry.count(":") == 1:  # host:port (an IPv6 literal has two colons or more)
        host, _, digits = entry.partition(":")
        if not (digits.isascii() and digits.isdigit()):
            return None
        return host, int(digits)
    return entry, None


def no_proxy_matches(no_proxy: str, host: str, port: int | None) -> bool:
    """Whether ``NO_PROXY`` (``no_proxy``) exempts ``host`` (a URL's host name, without brackets) on ``port``.

    The rules of curl's ``Curl_check_noproxy`` and requests' ``should_bypass_proxies``: entries separated by
    commas or blanks, compared without regard to case; ``*`` alone exempts every host; a name matches itself
    and every name under it (``example.com`` and ``.example.com`` both match ``example.com`` and
    ``www.example.com``, never ``notexample.com``; ``*.example.com`` is read as ``.example.com``); trailing dots
    are ignored; an IP literal host matches IPv4 or IPv6 entries, with or without brackets, and CIDR networks
    (``10.0.0.0/8``, ``fd00::/8``), never a name (nothing is resolved); an entry with a port (``example.com:8443``,
    ``[::1]:8080``) matches only that port.
    """
    import ipaddress

    value = no_proxy.strip()
    if value == "*":
        return True
    name = host.strip().lower().strip("[]")
    name = name[:-1] if name.endswith(".") else name
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(name)
    except ValueError:
        address = None
    for raw in value.replace(",", " ").split():
        parsed = _no_proxy_entry(raw.lower())
        if parsed is None:
            continue
        entry, entry_port = parsed
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if network.version == address.version and address in network:
                return True
            continue
        if entry.startswith("*."):
            entry = entry[1:]
        entry = entry.lstrip(".")
        entry = entry[:-1] if entry.endswith(".") else entry
        if entry and (name == entry or name.endswith("." + entry)):
            return True
    return False


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The proxy URL to reach ``url`` through (``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``), or ``None``.

    A loopback destination (:func:`~._net.is_loopback` with ``localhost_names``) never goes through a proxy,
    whatever the environment says: plain ``http://`` is allowed only there, and a proxy would see every event in
    clear text (and could answer 2xx for a collector it never reached). ``NO_PROXY`` is matched as curl and requests
    match it (:func:`no_proxy_matches`). With no proxy variable at all in the process's own environment, the
    system's settings apply (:func:`urllib.request.getproxies` and :func:`~urllib.request.proxy_bypass` read
    them on macOS and Windows).
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if is_loopback(host, localhost_names=True):
        return None
    proxies = _env_proxies(environ)
    if not proxies and environ is os.environ:
        import urllib.request

        system = urllib.request.getproxies().get(parts.scheme)
        if not system or urllib.request.proxy_bypass(host):
            return None
        return system
    proxy = proxies.get(parts.scheme)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not proxy or no_proxy_matches(proxies.get("no", ""), host, port):
        return None
    return proxy


def _pool(url: str, environ: Mapping[str, str]) -> urllib3.PoolManager:
    """A connection pool that verifies certificates against the system's CAs and follows no redirect.

    The trust store is OpenSSL's default (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured, as by OpenSSL
    itself, also when ``environ`` is an explicit mapping): no certifi bundle, and never ``CERT_NONE``.
    """
    import ssl

    import urllib3

    cafile = environ.get("SSL_CERT_FILE") or None
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    proxy = proxy_for(url, environ)
    if proxy:
        return urllib3.ProxyManager(
            proxy,
            num_pools=2,
            maxsize=1,
            proxy_ssl_context=context,
            ssl_context=context,
            cert_reqs="CERT_REQUIRED",
            retries=False,
        )
    return urllib3.PoolManager(num_pools=2, maxsize=1, ssl_context=context, cert_reqs="CERT_REQUIRED", retries=False)


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A response, or the error that replaced it."""

    status: int | None = None
    retry_after: float | None = None
    body: bytes = b""
    error: str | None = None
    attempted: bool = True
    """False when nothing was sent at all (the deadline had passed before the request started)."""

    @property
    def kind(self) -> str:
        """``ok`` (2xx), ``gone`` (410: the destination retired itself, docs/flusher.md), ``drop`` (any other 4xx
        but 408/429: the batch is refused for good) or ``retry``."""
        if self.status is None:
            return "retry"
        if 200 <= self.status < 300:
            return "ok"
        if self.status == GONE:
            return "gone"
        if 400 <= self.status < 500 and self.status not in (408, 429):
            return "drop"
        return "retry"

    def describe(self) -> str:
        if self.status is None:
            return self.error or "no answer"
        text = f"HTTP {self.status}"
        snippet = self.body[:120].decode("ascii", "replace").strip()
        if snippet and self.kind != "ok":
            text += f" {snippet!r}"
        return text


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` (delay-seconds or an HTTP date) as seconds from ``now``; ``None`` if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit() alone accepts '²', which int() refuses
        return float(int(value[:12]))
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


LOCALHOST_ADDRESSES: Final = ("127.0.0.1", "::1")
"""Where a ``localhost`` name is connected to, in this order (RFC 6761: never resolved)."""


def _localhost_request(pool: urllib3.PoolManager, request: Request, options: dict[str, Any]) -> Any:
    """Send ``request`` to a ``localhost`` name on :data:`LOCALHOST_ADDRESSES` without resolving the name.

    ``Host`` (and, for HTTPS, the SNI name and the certificate check) keep the URL's name; only the address
    is chosen here. ``::1`` is tried when nothing listens on 127.0.0.1.
    """
    import urllib3

    parts = urlsplit(request.url)
    name = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {**options["headers"], "Host": parts.netloc.rpartition("@")[2]}
    tls = {"server_hostname": name, "assert_hostname": name} if parts.scheme == "https" else {}

    def send(address: str) -> Any:
        conn = pool.connection_from_host(address, port=parts.port, scheme=parts.scheme, pool_kwargs=tls)
        return conn.urlopen(request.method, target, **{**options, "headers": headers}, assert_same_host=False)

    for address in LOCALHOST_ADDRESSES[:-1]:
        with contextlib.suppress(urllib3.exceptions.NewConnectionError):
            return send(address)
    return send(LOCALHOST_ADDRESSES[-1])


class Sender:
    """Sends one request at a time, each in a worker thread that the caller abandons at the deadline."""

    def __init__(self, url: str, environ: Mapping[str, str], tune: _settings.Tuning, deadline: float) -> None:
        self._url = url
        self._environ = environ
        self._tune = tune
        self._deadline = deadline
        self._pool: urllib3.PoolManager | None = None

    def _exchange(self, request: Request, reply: dict[str, object]) -> None:
        import urllib3

        if self._pool is None:
            self._pool = _pool(self._url, self._environ)
        left = max(0.05, self._deadline - time.monotonic())
        timeout = urllib3.Timeout(
            connect=min(self._tune.connect_timeout, left), read=min(self._tune.read_timeout, left)
        )
        options: dict[str, Any] = {
            "body": request.body,
            "headers": dict(request.headers),
            "redirect": False,
            "retries": False,
            "preload_content": False,
            "decode_content": False,
            "timeout": timeout,
        }
        if is_localhost_name(urlsplit(request.url).hostname or ""):
            response = _localhost_request(self._pool, request, options)
        else:
            response = self._pool.request(request.method, request.url, **options)
        # The status line and headers are the answer; the body is read only for the log, and a server that
        # trickles it cannot turn a 2xx into a failure (the caller reads `status` at the deadline).
        reply["status"] = response.status
        reply["retry_after"] = response.headers.get("Retry-After")
        try:
            reply["body"] = response.read(MAX_RESPONSE_BYTES, decode_content=False)
        finally:
            if response.length_remaining == 0:
                response.release_conn()
            else:
                response.close()  # never drain a huge or endless body

    def close(self) -> None:
        """Close idle connections (a request abandoned at the deadline keeps its own until the process ends)."""
        if self._pool is not None:
            self._pool.clear()

    def send(self, request: Request) -> Answer:
        left = self._deadline - time.monotonic()
        if left <= 0:
            return Answer(error="deadline reached", attempted=False)
        reply: dict[str, object] = {}

        def work() -> None:
            try:
                self._exchange(request, reply)
            except BaseException as exc:  # reported through reply; a worker must never print a traceback
                reply["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=work, name="spool_reporter-send", daemon=True)
        worker.start()
        worker.join(left)
        status = reply.get("status")
        if not isinstance(status, int):
            # A timeout that urllib3 raised at the deadline is the deadline's doing: its per-read timeout was
            # clamped to what was left, so the worker can end a moment before `join` would have.
            if worker.is_alive() or time.monotonic() >= self._deadline - DEADLINE_SLACK:
                return Answer(error=f"no answer within the {self._tune.deadline:g}s deadline")
            return Answer(error=str(reply.get("error", "no answer")))
        body = reply.get("body")
        raw_retry = reply.get("retry_after")
        return Answer(
            status=status,
            retry_after=parse_retry_after(raw_retry if isinstance(raw_retry, str) else None, time.time()),
            body=body if isinstance(body, bytes) else b"",
        )
