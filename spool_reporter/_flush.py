"""The flusher: claim the spool, send it in batches, delete only what got a 2xx, back off on failure.

Run detached by the hook (``python -m spool_reporter._flush --app django``, see :mod:`._spawn`) or in the
foreground by ``django-spool flush`` (:func:`run`). docs/flusher.md explains the whole life of a flusher.

**Public API for the command line** (stable; everything else in this module is private):

* :func:`run` -- one flusher run; returns a :class:`FlushResult`.
* :func:`plan` -- what a run would send, without writing, locking, creating or connecting anything
  (``flush --dry-run``); returns a :class:`Plan` of :class:`PlannedRequest`.
* :func:`read_state` -- the last run, the back-off and the log tail (``status``); returns a
  :class:`FlushState`.

**One deadline.** A run ends within :data:`~._settings.DEADLINE` seconds, whatever the network does: every
request runs in a worker thread that the run abandons at the deadline (DNS look-ups and trickling servers
included, which no socket timeout bounds), and a detached flusher also has a watchdog thread that calls
:func:`os._exit` shortly after the deadline and, on POSIX, a ``SIGALRM`` whose default action ends the
process even if the interpreter is stuck.

**Delivery.** At least once: claim by rename under the spool lock, send sealed segments oldest first,
delete a segment's events only after their batch got a 2xx (a partly sent segment is rewritten with the
unsent lines, temporary file + rename, under the lock). 4xx other than 408/429 drop that batch (counted as
``rejected``); timeouts, connection errors, 3xx, 408, 429 and 5xx keep everything and back off.

Files this module writes in the spool folder (all ``0600``, opened with ``O_NOFOLLOW``): ``flusher.lock``,
``flush.notbefore`` (mtime = back-off), ``state.json``, ``flush.log`` + ``flush.log.1`` (≤ 64 KiB together),
and short-lived ``tmp-*`` files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from . import _consent, _hook, _settings, _spawn, _spool
from ._hook import FLUSHER_LOCK_FD_ENV, FLUSHER_LOCK_NAME, GATE_NAME, App
from .transports import Batch, Event, Request, transport_for

if TYPE_CHECKING:
    import urllib3

__all__ = ["FlushResult", "FlushState", "Plan", "PlannedRequest", "main", "plan", "read_state", "run"]

OUTCOMES: Final = frozenset({"delivered", "nothing", "disabled", "no-endpoint", "failed", "busy"})
"""The values of :attr:`FlushResult.outcome`."""

STATE_NAME: Final = "state.json"
LOG_NAME: Final = "flush.log"
LOG_OLD_NAME: Final = "flush.log.1"

LOG_FILE_BYTES: Final = 32 * 1024
"""``flush.log`` is rotated to ``flush.log.1`` at this size: both together stay under 64 KiB."""

LOG_TAIL_LINES: Final = 20
"""Lines of the log :func:`read_state` returns."""

DEADLINE_SLACK: Final = 0.05
"""A request that ends in a timeout this close to the deadline (or later) is reported as the deadline's: the
per-request timeouts are clamped to what is left of it (urllib3's own rounding makes up the slack)."""

MAX_RESPONSE_BYTES: Final = 4096
"""Response bytes read at most (no content decoding): enough for the collector's answer or an error text."""

SPOOL_LOCK_TIMEOUT: Final = 2.0
"""Seconds to wait for ``spool.lock``: every holder keeps it for microseconds to milliseconds."""

SETTLE_SECONDS: Final = 1.0
"""The bookkeeping after the deadline (deleting what was acknowledged, the counters, the state, the back-off)
waits at most this long for the spool lock in all; what it cannot delete in time stays queued and is sent
again, with the same ids."""

WATCHDOG_GRACE: Final = 2.0
"""A detached flusher still alive this long after its deadline is ended by :func:`os._exit`: later than any
bookkeeping (:data:`SETTLE_SECONDS`), measured from the same deadline, so a run that ends on time is never
killed while it settles."""

ALARM_GRACE: Final = 5
"""...and, on POSIX, by the default action of ``SIGALRM`` this long after it (the last resort)."""

NO_ENDPOINT_RETRY: Final = 3600.0
"""A background flusher that finds the named endpoint unusable keeps the next one away this long."""

EXIT_DEADLINE: Final = 3
"""Exit status of a flusher ended by its watchdog."""


def _now() -> float:
    """The wall clock, in one place so that tests can move it."""
    return time.time()


# --- public value objects ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FlushResult:
    """What one :func:`run` did."""

    outcome: str
    """``delivered`` (something was sent or rejected, nothing failed), ``nothing`` (empty spool),
    ``disabled`` (reporting is off; see :attr:`purged`), ``no-endpoint`` (nowhere to send; see
    :attr:`message`), ``failed`` (a request failed or the back-off is pending; events kept) or ``busy``
    (another flusher is running, or the spool lock is held)."""
    sent: int = 0
    """Events the destination acknowledged with a 2xx and that left the spool."""
    rejected: int = 0
    """Events dropped as refused: a 4xx answer, or checked locally against the destination's limits."""
    failed: int = 0
    """Events of the batch whose request failed (kept for the next run)."""
    remaining: int = 0
    """Events still queued when the run ended."""
    purged: int = 0
    """Events deleted because reporting is off."""
    message: str = ""
    """One line for humans (no secrets)."""


@dataclass(frozen=True, kw_only=True)
class PlannedRequest:
    """One request :func:`plan` says would be sent (the URL with secrets redacted)."""

    method: str
    url_redacted: str
    headers: Mapping[str, str]
    body: bytes
    event_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the next run would send; see :func:`plan`."""

    events: list[dict[str, object]]
    """The queued events, oldest first, each once."""
    requests: list[PlannedRequest]
    """The requests, batch by batch; empty when :attr:`reason` is set."""
    reason: str | None = None
    """Why nothing would be sent (reporting off, no endpoint), or ``None``."""
    destination: str | None = None
    """``<transport> to <redacted url>`` when a destination is configured."""
    rejected: list[tuple[dict[str, object], str]] = field(default_factory=list)
    """Events the destination's limits exclude, with the reason (they would be counted, not sent)."""
    invalid: int = 0
    """Spool lines that are not valid events (they would be counted as corrupt, never sent)."""


@dataclass(frozen=True, kw_only=True)
class FlushState:
    """The flusher's record on disk, for ``status``; see :func:`read_state`."""

    last_flush: float | None = None
    """When the last run ended (seconds since the epoch)."""
    last_result: str | None = None
    """Its outcome (:attr:`FlushResult.outcome`)."""
    last_error: str | None = None
    """Its error, if it failed."""
    next_retry: float | None = None
    """The earliest time a background flusher will try again (the back-off), or ``None``."""
    consecutive_failures: int = 0
    log_tail: tuple[str, ...] = ()
    """The last lines of the flusher's log, oldest first."""


# --- files in the spool folder -------------------------------------------------------------------------

O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
READ_FLAGS: Final = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK


def _read_small(folder: _spool.Folder, name: str, limit: int) -> bytes | None:
    try:
        return folder.read_bytes(name, limit)
    except OSError:
        return None


def _load_state(folder: _spool.Folder) -> dict[str, object]:
    data = _read_small(folder, STATE_NAME, 4096)
    try:
        state = json.loads(data) if data else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _log(folder: _spool.Folder, line: str) -> None:
    """Append one line to the bounded log (rotating at :data:`LOG_FILE_BYTES`). Never raises."""
    data = (line.replace("\n", " ")[:500] + "\n").encode("ascii", "replace")
    try:
        fd, st = _hook.open_ours(folder, LOG_NAME, _APPEND_FLAGS)
        if st.st_size + len(data) > LOG_FILE_BYTES:
            os.close(fd)
            _spool.set_aside(folder, LOG_OLD_NAME)  # a folder planted there would stop the rotation for good
            folder.rename(LOG_NAME, LOG_OLD_NAME)
            fd = _hook.open_ours(folder, LOG_NAME, _APPEND_FLAGS)[0]
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def _gate(folder: _spool.Folder) -> float | None:
    """The back-off time on disk (``flush.notbefore``'s mtime), if a regular file holds it."""
    import stat

    try:
        st = folder.lstat(GATE_NAME)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# --- HTTP ----------------------------------------------------------------------------------------------


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

    A loopback destination (:func:`~._settings.is_loopback_host`) never goes through a proxy, whatever the
    environment says: plain ``http://`` is allowed only there, and a proxy would see every event in clear
    text (and could answer 2xx for a collector it never reached). ``NO_PROXY`` is matched as curl and requests
    match it (:func:`no_proxy_matches`). With no proxy variable at all in the process's own environment, the
    system's settings apply (:func:`urllib.request.getproxies` and :func:`~urllib.request.proxy_bypass` read
    them on macOS and Windows).
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if _settings.is_loopback_host(host):
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

    @property
    def kind(self) -> str:
        """``ok`` (2xx), ``drop`` (4xx other than 408/429: the batch is refused for good) or ``retry``."""
        if self.status is None:
            return "retry"
        if 200 <= self.status < 300:
            return "ok"
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


class _Sender:
    """Sends one request at a time, each in a worker thread that the caller abandons at the deadline."""

    def __init__(self, url: str, environ: Mapping[str, str], tune: _settings.Tuning, deadline: float) -> None:
        self._url = url
        self._environ = environ
        self._tune = tune
        self._deadline = deadline
        self._pool: urllib3.PoolManager | None = None

    def _exchange(self, request: Request, box: dict[str, object]) -> None:
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
        if _settings.is_localhost_name(urlsplit(request.url).hostname or ""):
            response = _localhost_request(self._pool, request, options)
        else:
            response = self._pool.request(request.method, request.url, **options)
        # The status line and headers are the answer; the body is read only for the log, and a server that
        # trickles it cannot turn a 2xx into a failure (the caller reads `status` at the deadline).
        box["status"] = response.status
        box["retry_after"] = response.headers.get("Retry-After")
        try:
            box["body"] = response.read(MAX_RESPONSE_BYTES, decode_content=False)
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
            return Answer(error="deadline reached")
        box: dict[str, object] = {}

        def work() -> None:
            try:
                self._exchange(request, box)
            except BaseException as exc:  # reported through box; a worker must never print a traceback
                box["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=work, name="spool_reporter-send", daemon=True)
        worker.start()
        worker.join(left)
        status = box.get("status")
        if not isinstance(status, int):
            # A timeout that urllib3 raised at the deadline is the deadline's doing: its per-read timeout was
            # clamped to what was left, so the worker can end a moment before `join` would have.
            if worker.is_alive() or time.monotonic() >= self._deadline - DEADLINE_SLACK:
                return Answer(error=f"no answer within the {self._tune.deadline:g}s deadline")
            return Answer(error=str(box.get("error", "no answer")))
        body = box.get("body")
        raw_retry = box.get("retry_after")
        return Answer(
            status=status,
            retry_after=parse_retry_after(raw_retry if isinstance(raw_retry, str) else None, _now()),
            body=body if isinstance(body, bytes) else b"",
        )


# --- the run -------------------------------------------------------------------------------------------


def _cap(values: dict[str, str] | None, key: str, default: int) -> int:
    """A spool cap from the user file, read as the hook reads it (digits, at least 1; else the default)."""
    raw = None if values is None else values.get(key)
    if raw is None or not (raw.isascii() and raw.isdigit()):
        return default
    return max(1, int(raw))


def _event_id(event: Event) -> str:
    return str(event["event_id"])


def backoff_delay(failures: int, retry_after: float | None, tune: _settings.Tuning) -> float:
    """Seconds until the next try after ``failures`` consecutive failures (≥ 1).

    Exponential (``base * 2**(failures-1)``, capped) with equal jitter (a random point in the upper half, so
    that many laptops coming back online do not retry in step); a ``Retry-After`` is honoured (never retry
    earlier than asked) and clamped to the cap.
    """
    delay = min(tune.backoff_cap, tune.backoff_base * 2.0 ** min(failures - 1, 40))
    delay = random.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, tune.backoff_cap))
    return delay


class _Run:
    def __init__(
        self,
        *,
        app: App,
        folder: _spool.Folder,
        env: Mapping[str, str],
        user: dict[str, str] | None,
        destination: _settings.Destination,
        tune: _settings.Tuning,
        deadline: float,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.app = app
        self.folder = folder
        self.env = env
        self.user = user
        self.destination = destination
        self.tune = tune
        self.deadline = deadline
        self.progress = progress
        self.transport = transport_for(destination)
        self.sender = _Sender(destination.request_url(), env, tune, deadline)
        self.sent = 0
        self.rejected = 0
        self.failed = 0
        self.sent_ids: set[str] = set()

    @property
    def spool_lock(self) -> _spool.FolderLock:
        """The spool lock, waited for at most :data:`SPOOL_LOCK_TIMEOUT` and never past the deadline plus
        :data:`SETTLE_SECONDS` (then :class:`~._spool.LockTimeout`): the watchdog comes after that."""
        left = self.deadline + SETTLE_SECONDS - time.monotonic()
        return _spool.FolderLock(self.folder, _hook.LOCK_NAME, max(0.0, min(SPOOL_LOCK_TIMEOUT, left)))

    def secretless(self, text: str) -> str:
        secret = self.destination.api_secret
        return text.replace(secret, "REDACTED") if secret else text

    def claim(self) -> list[tuple[str, int, int]]:
        """Seal the active file and enforce the caps, under the spool lock; the sealed segments, oldest first."""
        with self.spool_lock:
            for note in _spool.tidy(self.folder, _now()):  # what killed processes and planted folders left
                _log(self.folder, f"{_iso(_now())} pid={os.getpid()} {note}")
            _spool.seal_active(self.folder)
            for name, _, size in self.folder.segments():
                if size > _hook.HUGE_ACTIVE_BYTES:  # damaged: whole lines are kept, overlong ones counted
                    kept, bad = _spool.recut(self.folder, name)
                    _log(self.folder, f"{_iso(_now())} pid={os.getpid()} re-cut {name}: {kept} lines kept, {bad} bad")
            _spool.enforce_caps(
                self.folder,
                _cap(self.user, "max_events", _hook.MAX_EVENTS),
                _cap(self.user, "max_bytes", _hook.MAX_BYTES),
            )
            return self.folder.segments()

    def settle(self, name: str, events: Sequence[Event], done: set[str], bad: int, rejected: int) -> None:
        """Under the lock: drop the done events (and bad lines) from segment ``name``, count what was lost."""
        keep = [e for e in events if _event_id(e) not in done]
        with self.spool_lock:
            try:
                self.folder.lstat(name)
            except FileNotFoundError:
                # The caps (or a purge) removed it meanwhile and counted its lines already.
                _spool.add_counter(self.folder, "rejected", rejected)
                return
            if not keep:
                self.folder.unlink(name)
            elif len(keep) < len(events) or bad:
                data = b"".join(
                    json.dumps(e, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n" for e in keep
                )
                prefix = name[: -len(_hook.SEGMENT_SUFFIX)].rsplit("-", 2)[0]  # keeps its place in the order
                new = f"{prefix}-{os.getpid()}-{len(keep)}{_hook.SEGMENT_SUFFIX}"
                tmp = _spool.write_new(self.folder, new, data)
                self.folder.rename(tmp, new)
                if new != name:
                    self.folder.unlink(name)
            _spool.add_counter(self.folder, "rejected", rejected)
            _spool.add_counter(self.folder, "corrupt", bad)

    def send_segment(self, name: str, count: int, total: int, done_before: int) -> tuple[Answer | None, int]:
        """Send one segment batch by batch, holding it as :class:`~._spool.Sending` (the caps leave it alone).
        Returns the failed answer (or ``None``) and the events handled."""
        with _spool.Sending(self.folder, name) as sending:
            if not sending.held:
                return None, 0  # the caps (which counted it) or a purge took it since the claim
            return self._send_segment(name, count, total, done_before)

    def _send_segment(self, name: str, count: int, total: int, done_before: int) -> tuple[Answer | None, int]:
        try:
            data = self.folder.read_bytes(name, _hook.HUGE_ACTIVE_BYTES + 1)
        except FileNotFoundError:
            return None, 0
        except OSError:
            data = None
        if data is None or len(data) > _hook.HUGE_ACTIVE_BYTES:
            # Replaced since the claim by something that is not a segment of ours: it never leaves the machine.
            with self.spool_lock:
                _spool.set_aside(self.folder, name)
            return None, 0
        events, bad = _spool.parse_lines(data)
        done = {_event_id(e) for e in events if _event_id(e) in self.sent_ids}  # duplicates of this run
        prepared = self.transport.prepare([e for e in events if _event_id(e) not in done], now=_now())
        rejected = 0
        for event, reason in prepared.rejected:
            done.add(_event_id(event))
            rejected += 1
            self.rejected += 1
            _log(self.folder, f"{_iso(_now())} pid={os.getpid()} rejected {_event_id(event)}: {reason}")
        failure: Answer | None = None
        handled = len(done)
        for batch in prepared.batches:
            answer = self.sender.send(batch.request)
            ids = {_event_id(e) for e in batch.events}
            if answer.kind == "ok":
                self.sent += len(ids - self.sent_ids)
                self.sent_ids |= ids
                done |= ids
            elif answer.kind == "drop":
                done |= ids
                rejected += len(ids)
                self.rejected += len(ids)
                _log(
                    self.folder,
                    self.secretless(
                        f"{_iso(_now())} pid={os.getpid()} batch of {len(ids)} refused: {answer.describe()}"
                    ),
                )
            else:
                self.failed += len(ids)
                failure = answer
                break
            handled += len(ids)
            if self.progress is not None:
                self.progress(done_before + handled, total)
        self.settle(name, events, done, bad, rejected)
        return failure, handled

    def send_all(self, segments: list[tuple[str, int, int]]) -> Answer | None:
        total = sum(count for _, count, _ in segments)
        done = 0
        for name, count, _size in segments:
            failure, handled = self.send_segment(name, count, total, done)
            done += handled
            if failure is not None:
                return failure
        return None


def _record(
    folder: _spool.Folder,
    *,
    outcome: str,
    error: str | None,
    retry_after: float | None,
    tune: _settings.Tuning,
    sent: int,
) -> float | None:
    """Write ``state.json`` and the back-off gate after a run; returns the next retry time on failure."""
    state = _load_state(folder)
    now = _now()
    failures = state.get("consecutive_failures")
    failures = failures if isinstance(failures, int) and failures >= 0 else 0
    next_retry: float | None = None
    if outcome == "failed":
        failures += 1
        next_retry = now + backoff_delay(failures, retry_after, tune)
    else:
        failures = 0
    new = {
        "last_flush": now,
        "last_result": outcome,
        "last_error": error,
        "last_sent": sent,
        "consecutive_failures": failures,
        "next_retry": next_retry,
    }
    try:
        _spool.replace_file(folder, STATE_NAME, json.dumps(new, sort_keys=True).encode("ascii") + b"\n")
        _spawn.touch(folder, GATE_NAME, next_retry if next_retry is not None else now)
    except OSError:
        pass
    return next_retry


def _purge(path: str) -> int:
    try:
        folder = _spool.Folder(path, create=False)
    except (FileNotFoundError, NotADirectoryError, _hook.SpoolError):
        return 0
    with folder, _spool.FolderLock(folder, _hook.LOCK_NAME, SPOOL_LOCK_TIMEOUT):
        return _spool.purge(folder)


def run(
    app: App,
    *,
    foreground: bool,
    environ: Mapping[str, str] | None = None,
    ignore_backoff: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> FlushResult:
    """One flusher run: check consent, claim the spool, send it, record the outcome. Never raises for network
    or spool trouble (the result says what happened: an unusable spool folder is ``failed``); bounded by the
    deadline.

    :param app: whose spool to send.
    :param foreground: the command line's ``flush``: wait (bounded) for a running flusher to finish instead
        of giving up at once. A background run (the detached process) never waits.
    :param environ: the environment to read switches, destination and proxies from (default: ``os.environ``).
    :param ignore_backoff: send even if the back-off has not expired (``flush`` does).
    :param progress: called as ``progress(handled, total)`` after each batch, in the calling thread.
    """
    env = os.environ if environ is None else environ
    return _guarded_run(app, foreground=foreground, env=env, ignore_backoff=ignore_backoff, progress=progress)


def _guarded_run(
    app: App,
    *,
    foreground: bool,
    env: Mapping[str, str],
    ignore_backoff: bool,
    progress: Callable[[int, int], None] | None,
    deadline: float | None = None,
) -> FlushResult:
    try:
        return _run(
            app, foreground=foreground, env=env, ignore_backoff=ignore_backoff, progress=progress, deadline=deadline
        )
    except OSError as exc:
        # A read-only or missing home, a symlink planted for the folder or a file of ours: nothing can be
        # claimed or recorded safely, so nothing is sent; the hook cannot append there either.
        reason = exc.strerror or str(exc) or type(exc).__name__
        return FlushResult(outcome="failed", message=f"the spool folder is not usable: {reason}")


def _run(
    app: App,
    *,
    foreground: bool,
    env: Mapping[str, str],
    ignore_backoff: bool,
    progress: Callable[[int, int], None] | None,
    deadline: float | None,
) -> FlushResult:
    tune = _settings.tuning(env)
    path = _hook.state_dir(app, env)
    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    if not decision.enabled:
        purged = _purge(path) if decision.hard_off else 0
        return FlushResult(
            outcome="disabled",
            purged=purged,
            message=f"reporting is off: {_consent.explain(decision.reason)}"
            + (f"; deleted {purged} queued events" if purged else ""),
        )
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False)
    try:
        folder = _spool.Folder(path, create=False)
    except FileNotFoundError:
        if resolved.destination is None:
            return FlushResult(outcome="no-endpoint", message=resolved.reason)
        return FlushResult(outcome="nothing", message="nothing is queued")
    with folder:
        if resolved.destination is None:
            if not foreground:
                # The hook started us because an endpoint is *named*, but it is not usable (plain http to a
                # remote host, a missing api_secret...): do not let every interval start another flusher
                # just to find that out again. Fixing the setting takes effect within the hour (or at once
                # with `django-spool flush`).
                with contextlib.suppress(OSError):
                    _spawn.touch(folder, GATE_NAME, _now() + min(NO_ENDPOINT_RETRY, tune.backoff_cap))
            return FlushResult(outcome="no-endpoint", remaining=_spool.count_queued(folder), message=resolved.reason)
        inherited = None if foreground else _inherited_lock(env, folder)
        if inherited is not None:  # started by the hook, which handed over flusher.lock already locked
            release: Callable[[], None] = functools.partial(os.close, inherited)
        else:
            wait = tune.deadline + WATCHDOG_GRACE + 1 if foreground else 0
            flusher_lock = _spool.FolderLock(folder, FLUSHER_LOCK_NAME, wait)
            try:
                flusher_lock.acquire()
            except _spool.LockTimeout:
                return FlushResult(outcome="busy", message="another flusher is running")
            release = flusher_lock.release
        try:
            return _run_locked(
                app=app,
                folder=folder,
                env=env,
                user=user,
                destination=resolved.destination,
                tune=tune,
                # The detached process's deadline was set when it armed its watchdog; in the foreground the
                # run starts once the flusher lock is ours.
                deadline=time.monotonic() + tune.deadline if deadline is None else deadline,
                ignore_backoff=ignore_backoff,
                progress=progress,
            )
        finally:
            release()


def _inherited_lock(env: Mapping[str, str], folder: _spool.Folder) -> int | None:
    """The locked ``flusher.lock`` descriptor the hook handed over, if it really is that (same file, still
    locked by this process); else ``None`` and the flusher takes the lock itself."""
    raw = env.get(FLUSHER_LOCK_FD_ENV, "")
    if not (raw.isascii() and raw.isdigit()):
        return None
    fd = int(raw)
    try:
        st = os.fstat(fd)
        ours = folder.lstat(FLUSHER_LOCK_NAME)
        if (st.st_dev, st.st_ino) != (ours.st_dev, ours.st_ino):
            return None
        # Re-locking through the same open file description succeeds only if we (the description) hold it.
        if not _hook.try_lock(fd):
            return None
    except OSError:
        return None
    return fd


def _run_locked(
    *,
    app: App,
    folder: _spool.Folder,
    env: Mapping[str, str],
    user: dict[str, str] | None,
    destination: _settings.Destination,
    tune: _settings.Tuning,
    deadline: float,
    ignore_backoff: bool,
    progress: Callable[[int, int], None] | None,
) -> FlushResult:
    if not ignore_backoff:
        gate = _gate(folder)
        if gate is not None and _hook.backing_off(gate, _now()):
            return FlushResult(
                outcome="failed",
                remaining=_spool.count_queued(folder),
                message=f"backing off until {_iso(gate)}",
            )
    job = _Run(
        app=app,
        folder=folder,
        env=env,
        user=user,
        destination=destination,
        tune=tune,
        deadline=deadline,
        progress=progress,
    )
    try:
        segments = job.claim()
    except _spool.LockTimeout:
        return FlushResult(outcome="busy", remaining=_spool.count_queued(folder), message="the spool lock is busy")
    if not segments:
        _record(folder, outcome="nothing", error=None, retry_after=None, tune=tune, sent=0)
        return FlushResult(outcome="nothing", message="nothing is queued")
    try:
        failure = job.send_all(segments)
    except _spool.LockTimeout:
        failure = Answer(error="the spool lock is busy")
    finally:
        job.sender.close()
    remaining = _spool.count_queued(folder)
    pid = os.getpid()
    if failure is not None:
        error = job.secretless(failure.describe())
        retry = _record(
            folder, outcome="failed", error=error, retry_after=failure.retry_after, tune=tune, sent=job.sent
        )
        when = f"; next try after {_iso(retry)}" if retry is not None else ""
        message = f"sent {job.sent}, kept {remaining}: {error}{when}"
        _log(folder, f"{_iso(_now())} pid={pid} failed: {message}")
        return FlushResult(
            outcome="failed",
            sent=job.sent,
            rejected=job.rejected,
            failed=job.failed,
            remaining=remaining,
            message=message,
        )
    _record(folder, outcome="delivered", error=None, retry_after=None, tune=tune, sent=job.sent)
    message = f"sent {job.sent} events to {destination.redacted_url()}" + (
        f", {job.rejected} rejected" if job.rejected else ""
    )
    _log(folder, f"{_iso(_now())} pid={pid} delivered: {message}")
    return FlushResult(outcome="delivered", sent=job.sent, rejected=job.rejected, remaining=remaining, message=message)


# --- read-only views -----------------------------------------------------------------------------------


class _ReadOnly:
    """The spool folder opened for reading only (``flush --dry-run``, ``status``): level by level through
    descriptors as every writer opens it (a symlink planted at ``spool_reporter/`` or above is never followed
    into someone else's folder), changing nothing, not even a mode. :attr:`usable` is false when there is no
    such folder of ours."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        if _hook.DIR_FD:
            try:
                self.fd = _spool.open_dirs(path, create=False, own=_hook.OWN_LEVELS, tighten=False)
            except OSError:
                self.usable = False
                return
            self.usable = True
        else:  # pragma: no cover - Windows
            self.usable = os.path.isdir(path) and not os.path.islink(path)

    def __enter__(self) -> _ReadOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def names(self) -> list[str]:
        if not self.usable:
            return []
        try:
            return os.listdir(self.fd if self.fd is not None else self.path)
        except OSError:
            return []

    def read(self, name: str, limit: int) -> bytes:
        """A regular file of ours, at most ``limit`` bytes; ``b""`` for anything else."""
        if not self.usable:
            return b""
        try:
            if self.fd is not None:
                fd = os.open(name, READ_FLAGS, dir_fd=self.fd)
            else:  # pragma: no cover - Windows
                fd = os.open(os.path.join(self.path, name), READ_FLAGS)
        except OSError:
            return b""
        try:
            if not _hook.trusted_file(os.fstat(fd)):
                return b""
            chunks = []
            while limit > 0:
                chunk = os.read(fd, min(limit, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                limit -= len(chunk)
            return b"".join(chunks)
        except OSError:
            return b""
        finally:
            os.close(fd)


def _read_only_files(path: str) -> list[bytes]:
    """The spool's files, oldest first, read without creating, locking or changing anything. A damaged file
    larger than we write is read as far as the flusher would re-cut it (:data:`~._spool.SCAN_LIMIT`)."""
    with _ReadOnly(path) as folder:
        names = folder.names()
        ordered = sorted(n for n in names if _spool.segment_count(n) is not None)
        if _hook.ACTIVE_NAME in names:
            ordered.append(_hook.ACTIVE_NAME)
        return [data for data in (folder.read(name, _spool.SCAN_LIMIT) for name in ordered) if data]


def plan(app: App, *, environ: Mapping[str, str] | None = None) -> Plan:
    """What a run would send now, batch by batch, for ``flush --dry-run``.

    Reads the spool without writing, locking, creating or connecting anything (the spool folder may not
    exist). A line being appended while this reads may be skipped (and counted in :attr:`Plan.invalid`).
    """
    env = os.environ if environ is None else environ
    events: list[dict[str, object]] = []
    invalid = 0
    seen: set[str] = set()
    for data in _read_only_files(_hook.state_dir(app, env)):
        parsed, bad = _spool.parse_lines(data)
        invalid += bad
        for event in parsed:
            if _event_id(event) not in seen:  # a killed flusher can leave a resent copy behind
                seen.add(_event_id(event))
                events.append(event)
    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    if not decision.enabled:
        what = "queued events would be deleted" if decision.hard_off else "nothing would be sent"
        return Plan(
            events=events,
            requests=[],
            reason=f"reporting is off ({_consent.explain(decision.reason)}); {what}",
            invalid=invalid,
        )
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False)
    if resolved.destination is None:
        return Plan(events=events, requests=[], reason=resolved.reason, invalid=invalid)
    prepared = transport_for(resolved.destination).prepare(events, now=_now())
    return Plan(
        events=events,
        requests=[_planned(batch) for batch in prepared.batches],
        destination=resolved.reason,
        rejected=[(dict(e), reason) for e, reason in prepared.rejected],
        invalid=invalid,
    )


def _planned(batch: Batch) -> PlannedRequest:
    r = batch.request
    return PlannedRequest(
        method=r.method,
        url_redacted=r.url_redacted,
        headers=dict(r.headers),
        body=r.body,
        event_ids=tuple(_event_id(e) for e in batch.events),
    )


def read_state(app: App, *, environ: Mapping[str, str] | None = None) -> FlushState:
    """The flusher's record for ``status``: last run, back-off and log tail. Reads only; never raises."""
    with _ReadOnly(_hook.state_dir(app, environ)) as folder:
        raw = folder.read(STATE_NAME, 4096)
        log = folder.read(LOG_OLD_NAME, LOG_FILE_BYTES) + folder.read(LOG_NAME, LOG_FILE_BYTES)
    try:
        state = json.loads(raw or b"{}")
    except ValueError:
        state = {}
    if not isinstance(state, dict):
        state = {}
    tail = tuple(line for line in log.decode("ascii", "replace").splitlines() if line.strip())[-LOG_TAIL_LINES:]

    def num(key: str) -> float | None:
        value = state.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def text(key: str) -> str | None:
        value = state.get(key)
        return value[:500] if isinstance(value, str) else None

    failures = state.get("consecutive_failures")
    next_retry = num("next_retry")
    if next_retry is not None and next_retry > _now() + _hook.MAX_BACKOFF:
        next_retry = None  # further ahead than any back-off (a wrong clock): the gate counts it as expired
    return FlushState(
        last_flush=num("last_flush"),
        last_result=text("last_result"),
        last_error=text("last_error"),
        next_retry=next_retry,
        consecutive_failures=failures if isinstance(failures, int) and failures >= 0 else 0,
        log_tail=tail,
    )


# --- the detached process ------------------------------------------------------------------------------


def _lower_priority() -> None:
    """Lowest CPU priority; on Linux the I/O priority follows the nice value when no I/O class is set.

    The hook starts the flusher in a new session, and Linux's autogroup scheduling (on by default on desktop
    kernels) shares CPU between *sessions* before nice values count: a session-leading flusher at nice 19
    still took a full share from the user's next command (measured: +100 ms on a busy 2-core machine, +35 ms
    with the autogroup's own nice set too). So a flusher that leads its own session also sets its autogroup's
    nice -- never anyone else's (a flusher started from a terminal shares the terminal's group). A kernel
    without autogroups has no file, and a process still in the root group (never moved by a ``setsid``, as in
    some containers) shows an empty one and refuses the write; both are ignored.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.nice(19)
    with contextlib.suppress(AttributeError, OSError):
        if os.getsid(0) == os.getpid():
            fd = os.open("/proc/self/autogroup", os.O_WRONLY | O_CLOEXEC)
            try:
                os.write(fd, b"19")
            finally:
                os.close(fd)


def _arm_watchdog(deadline: float) -> None:
    """End the process :data:`WATCHDOG_GRACE` after ``deadline`` (a :func:`time.monotonic` time: the run's own)
    whatever it is doing (DNS, a stuck lock)."""
    seconds = max(0.0, deadline - time.monotonic())

    def bite() -> None:
        while (left := deadline + WATCHDOG_GRACE - time.monotonic()) > 0:
            time.sleep(left)
        os._exit(EXIT_DEADLINE)

    threading.Thread(target=bite, name="spool_reporter-watchdog", daemon=True).start()
    if hasattr(os, "fork"):
        import signal

        # SIG_DFL for SIGALRM terminates the process in the kernel: the last resort if the interpreter hangs.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(seconds + WATCHDOG_GRACE) + ALARM_GRACE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spool_reporter._flush --app django``: one detached run; the exit status is for tests."""
    import argparse

    _lower_priority()
    parser = argparse.ArgumentParser(prog="python -m spool_reporter._flush")
    parser.add_argument("--app", required=True, help="the application's slug (its spool folder)")
    parser.add_argument("--name", help="the application's name (default: from the slug)")
    parser.add_argument("--config-name", help="its config/policy file name")
    parser.add_argument("--env-prefix", help="its environment variable prefix")
    args = parser.parse_args(argv)
    # One deadline for the run and its watchdog, taken now: the sends end by it, the bookkeeping within
    # SETTLE_SECONDS after it, and only then (WATCHDOG_GRACE) may the watchdog end the process.
    deadline = time.monotonic() + _settings.tuning().deadline
    _arm_watchdog(deadline)
    if args.app == "django" and not (args.name or args.config_name or args.env_prefix):
        from ._hook import django_app

        app = django_app()
    else:
        app = App(
            name=args.name or args.app,
            version="0",
            slug=args.app,
            config_name=args.config_name,
            env_prefix=args.env_prefix,
        )
    try:
        result = _guarded_run(
            app, foreground=False, env=os.environ, ignore_backoff=False, progress=None, deadline=deadline
        )
    except Exception:
        return 1
    return 0 if result.outcome in ("delivered", "nothing", "disabled", "no-endpoint", "busy") else 2


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # A worker may still sit in getaddrinfo(); do not wait for the interpreter to tear down around it.
    os._exit(code)
