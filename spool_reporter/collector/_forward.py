"""Optional server-side forwarding to the GA4 Measurement Protocol.

The collector can pass the events it stores on to Google Analytics, so that a project that wants GA4's
dashboards still never has its users' machines contact Google: Google sees the collector's address, not
a developer's. Only events stored for the first time are forwarded (a re-sent batch is not counted twice).

The payload has the same shape as the flusher's own ``ga4`` transport (``spool_reporter/transports/ga4.py``):
one request per client id with at most 25 events, the allowlisted fields as parameters, and each event's
own ``timestamp_micros``. GA4 accepts times at most 72 hours old; older events are kept in the collector's
database and counted as ``stale``, not sent.

Forwarding never delays an answer to a client: :meth:`GA4Forwarder.submit` puts the events on a bounded
queue and returns at once (``False``, counted, when the queue is full); one worker thread sends them with
urllib3, strict timeouts, no retries and no redirects. A failed request is counted and not retried: GA4's
numbers are a copy, the database is the record.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time

from spool_reporter._event import parse_time
from spool_reporter._net import is_loopback
from spool_reporter.transports import ga4 as _ga4

from ._common import COLUMNS, CollectorError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Final

    import urllib3

GA4_ENDPOINT: Final = "https://www.google-analytics.com/mp/collect"
"""Google's Measurement Protocol endpoint (``/debug/mp/collect`` validates without recording)."""

MAX_EVENTS_PER_REQUEST: Final = _ga4.MAX_EVENTS
"""GA4 Measurement Protocol limit (the ``ga4`` transport's)."""

MAX_AGE_SECONDS: Final = _ga4.MAX_AGE_SECONDS
"""GA4 accepts ``timestamp_micros`` at most 72 hours in the past."""

MAX_VALUE: Final = _ga4.MAX_VALUE
"""GA4's limit on a parameter value's length (ours are shorter: validated at 100 by the wire format)."""

QUEUE_EVENTS: Final = 50_000
"""Events waiting to be forwarded before :meth:`GA4Forwarder.submit` refuses more (about 25 MB)."""

RESPONSE_BYTES: Final = 4096
"""At most this much of a response is read (GA4 answers 204 with an empty body)."""

PARAMS: Final = _ga4.PARAMS
"""Stored columns sent as event parameters; client id and time travel in their own GA4 fields."""

_COL: Final = {name: i for i, name in enumerate(COLUMNS)}
"""Positions in a stored row (:data:`spool_reporter.collector._common.COLUMNS`)."""

_STOP: Final = object()


def check_endpoint(url: str) -> str:
    """``url`` if it is HTTPS, or plain HTTP to this machine (a test double); else :class:`CollectorError`."""
    from urllib3.util import parse_url

    try:
        parsed = parse_url(url)
    except ValueError as exc:
        msg = f"not a URL: {url!r}"
        raise CollectorError(msg) from exc
    if parsed.scheme == "https" and parsed.host:
        return url
    if parsed.scheme == "http" and parsed.host and is_loopback(parsed.host):
        return url
    msg = "the GA4 endpoint must be https:// (plain http only to this machine)"
    raise CollectorError(msg)


def _epoch(time_text: str) -> int:
    epoch = parse_time(time_text)
    if epoch is None:  # pragma: no cover - stored rows were validated
        msg = f"not a stored time: {time_text!r}"
        raise ValueError(msg)
    return epoch


class GA4Forwarder:
    """Send newly stored events on to GA4 from a background thread.

    :param measurement_id: the GA4 data stream's measurement id (``G-XXXXXXX``).
    :param api_secret: a Measurement Protocol API secret of that stream. Keep it out of command lines:
        the ``collector serve`` command reads it from ``SPOOL_REPORTER_GA4_API_SECRET``.
    :param endpoint: where to send (default :data:`GA4_ENDPOINT`; tests use a loopback fake).
    :param connect_timeout: seconds to connect.
    :param read_timeout: seconds to wait for each read of the answer.
    :param queue_events: events waiting at most; beyond that :meth:`submit` refuses and counts.
    :param clock: the wall clock (``time.time``), replaceable in tests.
    """

    def __init__(
        self,
        *,
        measurement_id: str,
        api_secret: str,
        endpoint: str = GA4_ENDPOINT,
        connect_timeout: float = 5.0,
        read_timeout: float = 5.0,
        queue_events: int = QUEUE_EVENTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not measurement_id or not api_secret:
            msg = "GA4 forwarding needs a measurement id and an API secret"
            raise CollectorError(msg)
        self.endpoint = check_endpoint(endpoint)
        self._fields = {"measurement_id": measurement_id, "api_secret": api_secret}
        self._timeouts = (connect_timeout, read_timeout)
        self._clock = clock
        self._queue: queue.Queue[object] = queue.Queue()
        self._capacity = queue_events
        self._waiting = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        self._http: urllib3.PoolManager | None = None
        self.sent = 0
        """Events GA4 answered 2xx for."""
        self.failed = 0
        """Events whose request failed (network error, timeout, non-2xx)."""
        self.stale = 0
        """Events older than GA4's 72-hour window, or otherwise unsendable; kept only in the database."""
        self.dropped = 0
        """Events refused by :meth:`submit` because the queue was full or the forwarder closed."""
        self.requests = 0
        """Requests sent to GA4."""

    def submit(self, rows: Sequence[Sequence[str]]) -> bool:
        """Queue stored rows for forwarding; never blocks. ``False`` (and counted) when full or closed."""
        count = len(rows)
        with self._lock:
            if self._pid != os.getpid():  # forked (a pre-forking server): this process needs its own thread
                self._pid, self._thread, self._waiting, self._queue = os.getpid(), None, 0, queue.Queue()
            if self._closed or self._waiting + count > self._capacity:
                self.dropped += count
                return False
            self._waiting += count
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spool-ga4-forward", daemon=True)
                self._thread.start()
        self._queue.put([tuple(row) for row in rows])
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued for at most ``timeout`` seconds, then stop the worker."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(max(0.0, timeout))
        if self._http is not None:
            self._http.clear()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "sent": self.sent,
                "failed": self.failed,
                "stale": self.stale,
                "dropped": self.dropped,
                "requests": self.requests,
            }

    # -- the worker ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            rows: list[tuple[str, ...]] = item  # type: ignore[assignment]
            with self._lock:
                self._waiting -= len(rows)
            try:
                self._forward(rows)
            except Exception:  # counted; never let the worker die and the queue fill up behind it
                with self._lock:
                    self.failed += len(rows)

    def payloads(self, rows: Sequence[Sequence[str]], *, now: float) -> tuple[list[bytes], int, list[int]]:
        """(request bodies, events left out as stale/unsendable, events per body) for ``rows``."""
        groups: dict[str, list[dict[str, object]]] = {}
        stale = 0
        for row in rows:
            name = row[_COL["event"]]
            when = _epoch(row[_COL["time"]])
            if (
                when < now - MAX_AGE_SECONDS
                or _ga4.name_problem(name, event=True) is not None
                or any(len(row[_COL[p]]) > MAX_VALUE for p in PARAMS)
            ):
                stale += 1
                continue
            params = {p: row[_COL[p]] for p in PARAMS}
            item = {"name": name, "params": params, "timestamp_micros": int(min(when, now)) * 1_000_000}
            groups.setdefault(row[_COL["client_id"]], []).append(item)
        bodies: list[bytes] = []
        sizes: list[int] = []
        for client_id, items in groups.items():
            for start in range(0, len(items), MAX_EVENTS_PER_REQUEST):
                chunk = items[start : start + MAX_EVENTS_PER_REQUEST]
                doc = {"client_id": client_id, "events": chunk}
                bodies.append(json.dumps(doc, separators=(",", ":")).encode("utf-8"))
                sizes.append(len(chunk))
        return bodies, stale, sizes

    def _pool(self) -> urllib3.PoolManager:
        if self._http is None:
            import urllib3

            timeout = urllib3.Timeout(connect=self._timeouts[0], read=self._timeouts[1])
            # retries=False: no retry, no redirect; a redirect answer is a failure, not followed.
            self._http = urllib3.PoolManager(num_pools=2, maxsize=1, timeout=timeout, retries=False)
        return self._http

    def _forward(self, rows: list[tuple[str, ...]]) -> None:
        from urllib.parse import urlencode

        bodies, stale, sizes = self.payloads(rows, now=self._clock())
        with self._lock:
            self.stale += stale
        url = f"{self.endpoint}?{urlencode(self._fields)}"
        http = self._pool()
        for body, size in zip(bodies, sizes, strict=True):
            ok = False
            try:
                response = http.request(
                    "POST",
                    url,
                    body=body,
                    headers={"Content-Type": "application/json"},
                    preload_content=False,
                    redirect=False,
                )
                try:
                    response.read(RESPONSE_BYTES)
                    ok = 200 <= response.status < 300
                finally:
                    # Never drain an answer of unknown size: close the connection (GA4 volume is small).
                    with contextlib.suppress(Exception):
                        response.close()
                    response.release_conn()
            except Exception:  # urllib3.exceptions.HTTPError, OSError: counted below, never logged with the URL
                ok = False
            with self._lock:
                self.requests += 1
                if ok:
                    self.sent += size
                else:
                    self.failed += size
