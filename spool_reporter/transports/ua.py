"""``ua``: DEP 8's original Google Analytics Measurement Protocol v1 hits, through ``/batch``.

Kept for fidelity with the proposal; Google stopped processing Universal Analytics hits in July 2023.
Each event becomes exactly DEP 8's field set, form-encoded, one hit a line::

    v=1&tid=UA-XXXX-Y&cid=<client id>&t=event&ec=<command>&an=Django&av=5.2&aip=1

sent as ``POST <endpoint>`` (``https://www.google-analytics.com/batch``) with DEP 8's User-Agent header
(``Django/5.2 CPython/3.11 (Linux; x86_64)``), so hits with different User-Agents go in different requests.
Nothing else is added: not the event time (v1's ``qt`` only reaches back 4 hours), not the event id.
Limits (Measurement Protocol v1 reference): at most 20 hits and 16 KB per request, 8 KB per hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from urllib.parse import urlencode

from . import Batch, Event, Prepared, Request, Transport

MAX_HITS: Final = 20
"""Hits per ``/batch`` request (Measurement Protocol v1 limit)."""

MAX_BODY_BYTES: Final = 16 * 1024
"""Bytes per ``/batch`` request body (Measurement Protocol v1 limit: 16K bytes)."""

MAX_HIT_BYTES: Final = 8 * 1024
"""Bytes per hit (Measurement Protocol v1 limit: 8K bytes)."""


class UATransport(Transport):
    """DEP 8's hits, grouped by User-Agent, within the ``/batch`` limits."""

    name = "ua"

    def hit(self, event: Event) -> bytes:
        """The one line DEP 8 specifies for ``event``."""
        return urlencode(
            [
                ("v", "1"),
                ("tid", self.destination.tracking_id or ""),
                ("cid", str(event["client_id"])),
                ("t", "event"),
                ("ec", str(event["event"])),
                ("an", str(event["app"])),
                ("av", str(event["app_version"])),
                ("aip", "1"),
            ]
        ).encode("ascii")

    def _request(self, user_agent: str, hits: list[bytes]) -> Request:
        return Request(
            method="POST",
            url=self.destination.request_url(),
            url_redacted=self.destination.redacted_url(),
            headers={"Content-Type": "text/plain", "User-Agent": user_agent},
            body=b"\n".join(hits),
        )

    def prepare(self, events: Sequence[Event], *, now: float) -> Prepared:
        groups: dict[str, list[Event]] = {}
        for event in events:
            groups.setdefault(str(event["user_agent"]), []).append(event)
        batches: list[Batch] = []
        rejected: list[tuple[Event, str]] = []
        for user_agent, group in groups.items():
            chunk: list[Event] = []
            hits: list[bytes] = []
            size = 0
            for event in group:
                line = self.hit(event)
                if len(line) > MAX_HIT_BYTES:
                    rejected.append((event, "hit larger than 8 KB"))
                    continue
                added = len(line) + (1 if hits else 0)
                if chunk and (len(chunk) >= MAX_HITS or size + added > MAX_BODY_BYTES):
                    batches.append(Batch(events=tuple(chunk), request=self._request(user_agent, hits)))
                    chunk, hits, size, added = [], [], 0, len(line)
                chunk.append(event)
                hits.append(line)
                size += added
            if chunk:
                batches.append(Batch(events=tuple(chunk), request=self._request(user_agent, hits)))
        return Prepared(batches=tuple(batches), rejected=tuple(rejected))
