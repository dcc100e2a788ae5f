"""The WSGI application: ``POST /v1/batch`` in, ``{"accepted": n, "duplicates": m, "rejected": r, "refused":
{reason: k}}`` out.

Each event of a well-formed batch is judged on its own (:mod:`._wire`, :class:`~._wire.Policy`): the answer is
``200`` with how many were stored, already known, and refused, so one bad event never costs its neighbours.
``rejected`` is the total refused and ``refused`` the same events by reason (only the reasons that count some):
the validator's words (:data:`spool_reporter._event.REASONS`: ``too_old`` and ``future`` outside the time window,
``shape`` or a field's name for an invalid event), and the store's ``over_cap`` (beyond the per-client weekly
cap), ``too_old`` (a week already closed) and ``forgotten`` (a forgotten client id). The flusher counts those
events as refused by reason, not as sent. The ``200`` is sent once the batch is durable.

It also accepts what the ``ga4`` transport sends, at ``POST /mp/collect``, so that a client configured for
GA4 can point its endpoint at this collector instead of Google: the body is parsed by
:func:`~spool_reporter.collector._wire.parse_ga4` (the same allowlist, an id derived from the content) and
success is answered like GA4 answers it, ``204`` with no body. The request's query string
(``measurement_id=…&api_secret=…``) is never read, so it is never stored, logged or echoed.

It reads nothing from the request but the method, the path, ``Content-Type``, ``Content-Length``,
``Content-Encoding`` and the body. Request headers, ``REMOTE_ADDR`` and the proxy headers that carry a
client address (``X-Forwarded-For``, ``Forwarded``) are never read, stored or logged; the application
logs nothing per request at all.

``GET /``, ``GET /v1/stats`` and the downloads serve the public releases (:mod:`._public`, kept by
:mod:`._served`): numbers made
once, with differential privacy, by the roll-up (:mod:`._release`), and stored; a request never counts
anything. ``POST /v1/forget`` with ``{"client_id": "<uuid4>"}`` deletes every stored event of that client id
and answers ``{"deleted": n}``; from then on, for as long as an event recorded before it could still be
accepted, that id's events are refused (``forgotten``), so that a batch in flight or a spool that still held
them cannot bring them back (:meth:`~._store.Store.forget`). The roll-ups of closed weeks and the releases
hold no client id and are not touched.

**Failures are answered as such.** A database that cannot take the request now -- busy beyond its lock wait,
unreachable, silent, a full disk -- is answered ``503`` with ``Retry-After`` within
:data:`~._store.REQUEST_WAIT_S` seconds (the flusher keeps the batch and comes back); the reason is logged for
the operator, at most once a minute for the same reason, with nothing of the request. ``500`` is left for
defects.

**A retired collector** (``retired=True``, ``serve --retired``, ``SPOOL_REPORTER_COLLECTOR_RETIRED=1``) answers every
batch, at ``/v1/batch`` and ``/mp/collect``, ``410 Gone`` with :data:`RETIRED_BODY`, without reading or storing it:
each client that receives it records the destination as retired, deletes its queue and sends nothing more there.
``/v1/forget``, the health check and the public numbers keep working: a retired collector still deletes on request.

Ingest also keeps the retention (:mod:`._rollup`): at most once per ``rollup_every`` seconds, a batch starts a
roll-up in a background thread of this process, so that no request waits for it.
"""

from __future__ import annotations

import contextlib
import http
import json
import logging
import threading
import time
from typing import NamedTuple

from . import _common, _public, _rollup
from ._common import FORGET_REFUSED, CollectorError, Retention, Row, StoreClosed, Unavailable
from ._intake import forget_until, merge_counts
from ._served import Served
from ._store import Inserted, Store
from ._wire import (
    FORGET_MAX_BODY_BYTES,
    GA4_MAX_BODY_BYTES,
    MAX_BODY_BYTES,
    BadRequest,
    Parsed,
    Policy,
    parse_batch,
    parse_forget,
    parse_ga4,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Final, Protocol

    from ._served import Answer

    StartResponse = Callable[..., Any]
    Environ = dict[str, Any]

    class Forwarder(Protocol):
        """Something that takes newly stored events and sends them on without blocking the request."""

        def submit(self, rows: list[tuple[str, ...]]) -> bool: ...

        def close(self, timeout: float = ...) -> None: ...


DRAIN_FACTOR: Final = 4
"""An oversized body up to this many times the path's cap is read and discarded before the 413, so that the
client, still sending, gets the answer instead of a connection reset; a larger one is answered at once."""

DRAIN_LIMIT: Final = DRAIN_FACTOR * MAX_BODY_BYTES
"""The drain limit of ``/v1/batch``."""

_CHUNK: Final = 64 * 1024
RETRY_AFTER: Final = "5"
"""Seconds a client is asked to wait after a ``503`` (the flusher waits at least its own backoff)."""
RETIRED_BODY: Final = (
    b'{"retired": true, "message": "this collector has retired: send nothing more, delete what is queued"}'
)
"""The body of a retired collector's ``410``: a short JSON object for a human who looks (the client reads only the
status)."""
LOG_EVERY_S: Final = 60.0
"""The same reason for a ``503`` is logged at most once per this many seconds."""
_LOG: Final = logging.getLogger("spool_reporter.collector")
# Do not log anything about a request here: no address, no header, no body.


def status_line(code: int) -> str:
    """``413`` -> ``"413 Request Entity Too Large"``: the code and its reason phrase, as :mod:`http` names it (Python
    3.13 took RFC 9110's ``Content Too Large``; a client reads the code, never the phrase)."""
    return f"{code} {http.HTTPStatus(code).phrase}"


class Counters:
    """What this process's collector has seen since it started (for tests, the benchmark and the demo)."""

    __slots__ = (
        "_lock",
        "accepted",
        "duplicates",
        "forgotten",
        "forward_dropped",
        "refused",
        "rejected",
        "requests",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        """Requests answered, whatever the status."""
        self.accepted = 0
        """Events stored for the first time."""
        self.duplicates = 0
        """Events whose id was already stored (or repeated within a batch)."""
        self.rejected = 0
        """Requests answered 4xx."""
        self.refused = 0
        """Events of well-formed requests refused (invalid, or over the per-client weekly cap)."""
        self.forward_dropped = 0
        """New events the forwarder's full queue refused."""
        self.forgotten = 0
        """Events deleted by ``POST /v1/forget``."""

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {
                "requests": self.requests,
                "accepted": self.accepted,
                "duplicates": self.duplicates,
                "rejected": self.rejected,
                "refused": self.refused,
                "forward_dropped": self.forward_dropped,
                "forgotten": self.forgotten,
            }


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or []


def _read_body(environ: Environ, cap: int = MAX_BODY_BYTES) -> bytes:
    stream = environ.get("wsgi.input")
    length_text = str(environ.get("CONTENT_LENGTH") or "").strip()
    if stream is None:
        raise _Refusal(400, "no body")
    if not length_text:
        # Without a length we may only read to the end when the server says the stream ends
        # (gunicorn and uWSGI do for chunked bodies); wsgiref's stream would block on a keep-alive socket.
        if not environ.get("wsgi.input_terminated"):
            raise _Refusal(411, "Content-Length required")
        length = None
    else:
        if not (length_text.isascii() and length_text.isdigit()) or len(length_text) > 18:
            raise _Refusal(400, "bad Content-Length")
        length = int(length_text)
        if length > cap:
            if length <= DRAIN_FACTOR * cap:
                _drain(stream, length)
            raise _Refusal(413, f"body larger than {cap} bytes")
    # Enforced while reading too: never hold more than the cap plus one chunk.
    budget = cap + 1 if length is None else length
    parts: list[bytes] = []
    got = 0
    while got < budget:
        chunk = stream.read(min(_CHUNK, budget - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got > cap:
        raise _Refusal(413, f"body larger than {cap} bytes")
    if length is not None and got != length:
        raise _Refusal(400, "body shorter than Content-Length")
    return b"".join(parts)


def _drain(stream: Any, length: int) -> None:
    left = length
    try:
        while left > 0:
            chunk = stream.read(min(_CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:  # the client gave up, or the socket timed out: the answer is the same
        return


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json"


def _check_json_request(environ: Environ) -> None:
    """The body's encoding and type, as both POST paths require them."""
    encoding = str(environ.get("HTTP_CONTENT_ENCODING") or "identity").strip().lower()
    if encoding != "identity":
        raise _Refusal(415, "Content-Encoding not supported")
    if not _is_json(str(environ.get("CONTENT_TYPE") or "")):
        raise _Refusal(415, "Content-Type must be application/json")


class Collector:
    """The WSGI application (a callable ``app(environ, start_response)``); build it with :func:`make_app`.

    :ivar store: the :class:`~spool_reporter.collector._store.Store` it writes to.
    :ivar counters: what it has seen since it started (:class:`Counters`).
    """

    def __init__(
        self,
        store: Store,
        *,
        forward: Forwarder | None = None,
        policy: Policy | None = None,
        publishing: _common.Publishing | None = None,
        retention: Retention | None = None,
        public_check: float = _public.CHECK_SECONDS,
        retired: bool = False,
    ) -> None:
        self.store = store
        self.retired = retired
        """Every batch is answered ``410 Gone`` (the collector retired itself); see the module's docstring."""
        self.forward = forward
        self.policy = policy or Policy()
        self.counters = Counters()
        self.publishing = publishing or _common.Publishing()
        """What is released (ε, the application) and how it is shown (the display threshold, the licence)."""
        _common.check_min_count(self.publishing.min_count)
        _common.check_epsilon(self.publishing.epsilon)
        self.public = Served(store, self.publishing, check_every=public_check)
        """The public answers, rebuilt only when a release is added (checked every ``public_check`` seconds)."""
        self.retention = _rollup.check_retention(retention or Retention(), self.policy.max_age)
        """How long raw events are kept and how often ingest starts a roll-up (:mod:`._rollup`)."""
        self._rollup_lock = threading.Lock()
        self._rollup_thread: threading.Thread | None = None
        self._next_rollup = 0.0  # monotonic; the first batch starts one (a restarted collector catches up)
        self._release_error = ""  # logged once until it changes
        self._unavailable_logged: dict[str, float] = {}  # reason -> when it was last logged (monotonic)
        self._log_lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        try:
            status, body, content_type, extra = self._handle(environ)
        except Unavailable as exc:  # the database cannot take it now (busy, unreachable, full): come back later
            self._log_unavailable(str(exc))
            status, body, content_type = 503, b"unavailable, retry later\n", "text/plain; charset=utf-8"
            extra = [("Retry-After", RETRY_AFTER)]
        except Exception as exc:  # never a traceback with request data in a server's error log
            _LOG.error("collector: internal error (%s)", type(exc).__name__)
            status, body, content_type, extra = 500, b"internal error\n", "text/plain; charset=utf-8", []
        self.counters.add(requests=1, rejected=int(400 <= status < 500))
        if status == 204:  # no body, hence neither a type nor a length (RFC 9110: a 204 has no Content-Length)
            headers = [("Cache-Control", "no-store"), *extra]
        else:
            headers = [
                ("Content-Type", content_type),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                *extra,
            ]
        start_response(status_line(status), headers)
        return [body]

    def _log_unavailable(self, reason: str) -> None:
        """Tell the operator why requests are answered ``503`` (the store's message: no request data in it)."""
        now = time.monotonic()
        with self._log_lock:
            last = self._unavailable_logged.get(reason)
            if last is not None and now - last < LOG_EVERY_S:
                return
            if len(self._unavailable_logged) > 64:
                self._unavailable_logged.clear()
            self._unavailable_logged[reason] = now
        _LOG.warning("collector: answering 503: %s", reason)

    def _handle(self, environ: Environ) -> Answer:
        path = str(environ.get("PATH_INFO") or "/")
        method = str(environ.get("REQUEST_METHOD") or "GET").upper()
        try:
            route = _ROUTE_OF.get(path)
            if route is None:
                raise _Refusal(404, "not found")
            if method != route.method:
                raise _Refusal(405, f"use {route.method}", [("Allow", route.method)])
            return route.answer(self, environ)
        except _Refusal as refusal:
            text = (refusal.reason + "\n").encode("utf-8", "backslashreplace")
            return refusal.status, text, "text/plain; charset=utf-8", refusal.headers
        except BadRequest as exc:
            return 400, (str(exc) + "\n").encode("utf-8", "backslashreplace"), "text/plain; charset=utf-8", []

    def _health(self, environ: Environ) -> Answer:
        return 200, b'{"ok": true}', "application/json", []

    def _public(self, build: Callable[[Served], Answer]) -> Answer:
        self._maybe_rollup()  # releases fall due with time, not only with batches
        return self.public.answer(build)

    def _batch(self, environ: Environ) -> Answer:
        if self.retired:
            return 410, RETIRED_BODY, "application/json", []
        _check_json_request(environ)
        parsed = parse_batch(_read_body(environ), self.policy)
        inserted = self._store(parsed)
        refused = merge_counts(parsed.refused, inserted.refused)
        answer = {
            "accepted": inserted.added,
            "duplicates": len(parsed.rows) - inserted.added - inserted.limited,
            "rejected": sum(refused.values()),
            "refused": refused,
        }
        return 200, json.dumps(answer).encode("ascii"), "application/json", []

    def _ga4(self, environ: Environ) -> Answer:
        # QUERY_STRING (measurement_id, api_secret) is deliberately never read.
        if self.retired:
            return 410, RETIRED_BODY, "application/json", []
        _check_json_request(environ)
        self._store(parse_ga4(_read_body(environ, GA4_MAX_BODY_BYTES), self.policy))
        return 204, b"", "", []  # what GA4 answers; the ga4 transport only looks for a 2xx

    def _forget(self, environ: Environ) -> Answer:
        try:
            _check_json_request(environ)
            client_id = parse_forget(_read_body(environ, FORGET_MAX_BODY_BYTES))
        except (_Refusal, BadRequest):
            # Counted where the operator looks (collector stats), with no client id and nothing of the body; a
            # database that cannot count it does not change the answer.
            with contextlib.suppress(CollectorError):
                self.store.insert([], refused={FORGET_REFUSED: 1}, now=self.policy.clock())
            raise
        deleted = self.store.forget(client_id, until=forget_until(self.policy.clock(), self.policy.max_age))
        self.counters.add(forgotten=deleted)
        return 200, json.dumps({"deleted": deleted}).encode("ascii"), "application/json", []

    # -- the roll-up ------------------------------------------------------------------------------------------

    def rollup(self) -> _rollup.Done:
        """Run a roll-up now, in this thread, with this collector's clock, maximum age and retention."""
        return _rollup.rollup(
            self.store,
            now=self.policy.clock(),
            max_age=self.policy.max_age,
            retention=self.retention,
            publishing=self.publishing,
        )

    def _maybe_rollup(self) -> None:
        """Start a roll-up in a background thread if none ran for ``rollup_every`` seconds in this process."""
        every = self.retention.rollup_every
        if every <= 0 or time.monotonic() < self._next_rollup:
            return
        with self._rollup_lock:
            if time.monotonic() < self._next_rollup or (self._rollup_thread and self._rollup_thread.is_alive()):
                return
            self._next_rollup = time.monotonic() + every
            # Started lazily, from a request: a pre-forking server's workers each get their own (threads do not
            # survive a fork), and the lock in the database lets one of them work at a time.
            thread = threading.Thread(target=self._background_rollup, name="spool_reporter-rollup", daemon=True)
            self._rollup_thread = thread
        thread.start()

    def _background_rollup(self) -> None:
        try:
            done = self.rollup()
            if done.released:  # what the public page says it shows, and when: the operator learns it here
                _LOG.info(
                    "collector: %s (made %s); GET / shows it within %.0f s",
                    done.released_publicly(),
                    done.released[-1].made,
                    self.public.check_every,
                )
            if done.release_error and done.release_error != self._release_error:
                _LOG.warning("collector: no public release made: %s", done.release_error)
            self._release_error = done.release_error
        except StoreClosed:
            pass  # the application shut down meanwhile: nothing to report
        except CollectorError as exc:
            _LOG.warning("collector: roll-up failed: %s", exc)
        except Exception as exc:  # a thread must not die with a traceback that could hold row data
            _LOG.warning("collector: roll-up failed (%s)", type(exc).__name__)

    def wait_rollup(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for a background roll-up of this process; ``True`` once none runs."""
        thread = self._rollup_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _store(self, parsed: Parsed) -> Inserted:
        """Store the rows and count the refusals (one transaction), hand the new rows to the forwarder;
        return what the store did (rows new, rows it refused by reason)."""
        forward = self.forward
        rows: list[Row] = parsed.rows
        inserted = self.store.insert(rows, want_new=forward is not None, refused=parsed.refused, now=parsed.now)
        added, new, limited = inserted.added, inserted.new, inserted.limited
        dropped = 0
        if forward is not None and new and not forward.submit(list(new)):
            dropped = len(new)
        self.counters.add(
            accepted=added,
            duplicates=len(rows) - added - limited,
            refused=parsed.rejected + limited,
            forward_dropped=dropped,
        )
        self._maybe_rollup()
        return inserted


class Route(NamedTuple):
    """One path the collector answers, the one method it takes there, and what answers it."""

    path: str
    method: str
    answer: Callable[[Collector, Environ], Answer]


def _served(build: Callable[[Served], Answer]) -> Callable[[Collector, Environ], Answer]:
    """A public route's answer: ``build``'s bytes, built once per release (:class:`~._served.Served`)."""
    return lambda collector, environ: collector._public(build)


ROUTES: Final = (
    Route(_common.BATCH_PATH, "POST", Collector._batch),
    Route(_common.GA4_PATH, "POST", Collector._ga4),
    Route(_common.FORGET_PATH, "POST", Collector._forget),
    Route(_common.HEALTH_PATH, "GET", Collector._health),
    Route(_common.PAGE_PATH, "GET", _served(Served.page)),
    Route(_common.STATS_PATH, "GET", _served(Served.stats)),
    Route(_common.RELEASES_JSON_PATH, "GET", _served(Served.releases_json)),
    Route(_common.RELEASES_CSV_PATH, "GET", _served(Served.releases_csv)),
)
"""Every path the collector answers, with its method and handler: any other path is ``404``, any other method
``405`` with ``Allow`` (:meth:`Collector._handle`). The docs' list of endpoints is tested equal to it."""

_ROUTE_OF: Final = {route.path: route for route in ROUTES}
