"""``json``: the self-hosted collector's batch format (``spool_reporter.collector`` serves it).

One request::

    POST <endpoint>                      (the collector's is http(s)://host:port/v1/batch)
    Content-Type: application/json
    User-Agent: spool_reporter/<version>

    {"schema": 1, "events": [<the spooled event objects, exactly as recorded>]}

The events carry their ``event_id``, so the collector de-duplicates what an interrupted flusher resends. It
answers 2xx (``{"accepted": n, "duplicates": m, "rejected": r, "refused": {reason: k}}``) once the batch is
durable; anything else keeps the events. The flusher counts the events of ``refused`` as refused by the
destination, by reason, and the others as sent.

**No time window here.** An event of any age is sent: the collector judges each event's time against its own
clock and its own ``--max-age-days`` (a collector run with a longer maximum age recovers a laptop's month-old
events), and answers the ones it refuses as ``too_old`` or ``future``, which the flusher counts. The only event
kept back is one larger than a whole batch, which no collector could take.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from spool_reporter._version import __version__

from . import Batch, Event, Prepared, Request, Transport

BATCH_SCHEMA: Final = 1
"""The version of the batch envelope (the events carry their own ``schema``)."""

MAX_EVENTS: Final = 500
"""Events per request: the collector's documented limit."""

MAX_BODY_BYTES: Final = 512 * 1024
"""Bytes per request body: the collector's documented limit (500 events of ~420 bytes fit)."""

_HEAD: Final = b'{"schema":1,"events":['
_TAIL: Final = b"]}"


def encode(event: Event) -> bytes:
    """One event as compact ASCII JSON, the same shape the hook writes to the spool."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class JSONTransport(Transport):
    """Batches of at most :data:`MAX_EVENTS` events and :data:`MAX_BODY_BYTES` bytes."""

    name = "json"

    def _request(self, items: list[bytes]) -> Request:
        body = _HEAD + b",".join(items) + _TAIL
        return Request(
            method="POST",
            url=self.destination.request_url(),
            url_redacted=self.destination.redacted_url(),
            headers={"Content-Type": "application/json", "User-Agent": f"spool_reporter/{__version__}"},
            body=body,
        )

    def prepare(self, events: Sequence[Event], *, now: float) -> Prepared:
        batches: list[Batch] = []
        rejected: list[tuple[Event, str]] = []
        chunk: list[Event] = []
        items: list[bytes] = []
        size = len(_HEAD) + len(_TAIL)
        for event in events:
            item = encode(event)
            if size + len(item) + 1 > MAX_BODY_BYTES and len(_HEAD) + len(_TAIL) + len(item) > MAX_BODY_BYTES:
                rejected.append((event, "larger than a whole batch"))
                continue
            if chunk and (len(chunk) >= MAX_EVENTS or size + len(item) + 1 > MAX_BODY_BYTES):
                batches.append(Batch(events=tuple(chunk), request=self._request(items)))
                chunk, items, size = [], [], len(_HEAD) + len(_TAIL)
            chunk.append(event)
            items.append(item)
            size += len(item) + 1
        if chunk:
            batches.append(Batch(events=tuple(chunk), request=self._request(items)))
        assert BATCH_SCHEMA == 1  # _HEAD spells it out
        return Prepared(batches=tuple(batches), rejected=tuple(rejected))
