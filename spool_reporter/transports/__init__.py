"""Destinations: one small module per wire format behind one interface.

A transport turns spooled events (the dicts :func:`spool_reporter._spool.parse_lines` returns) into HTTP
requests that respect its destination's documented limits. It does no I/O: the flusher sends what
:meth:`Transport.prepare` returns, and ``flush --dry-run`` prints it.

=========  ==================================================  ===========================================
name       wire format                                         limits enforced locally
=========  ==================================================  ===========================================
``json``   ``{"schema": 1, "events": [...]}`` to a collector   500 events, 512 KiB per request; any age
``ga4``    GA4 Measurement Protocol JSON                       25 events, 25 params, names, values, 130 kB
``ua``     Measurement Protocol v1 ``/batch`` (DEP 8)          20 hits, 16 KB per request, 8 KB per hit
=========  ==================================================  ===========================================

Every event handed to :meth:`~Transport.prepare` comes back exactly once: in one :class:`Batch`, or in
:attr:`Prepared.rejected` with a reason (an event the destination would refuse or misrecord for certain: GA4's
72-hour limit, a request size no batch can hold). The flusher deletes a batch's events after a 2xx, and counts
rejected events as ``rejected`` without sending them. A rule the destination applies with its own settings
(the collector's ``--max-age-days``) is left to it: ``json`` sends events of any age, and the collector's
answer says which it refused and why. ``ua`` has no age limit to keep: it sends no event time.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spool_reporter._settings import Destination

__all__ = [
    "Batch",
    "Event",
    "Prepared",
    "Request",
    "Transport",
    "event_time",
    "transport_for",
]

Event = Mapping[str, object]
"""One spooled event, already validated against the allowlist by :func:`spool_reporter._event.validate`."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """One HTTP request exactly as it would leave the machine."""

    method: str
    url: str
    """The full URL, secrets included: never log or print it (use :attr:`url_redacted`)."""
    url_redacted: str
    """The URL with secrets (GA4's ``api_secret``) replaced by ``REDACTED``."""
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, kw_only=True)
class Batch:
    """Events that travel in one request and are acknowledged together."""

    events: tuple[Event, ...]
    request: Request


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """The outcome of :meth:`Transport.prepare`: batches to send, and events that cannot be sent."""

    batches: tuple[Batch, ...] = ()
    rejected: tuple[tuple[Event, str], ...] = field(default=())
    """``(event, reason)`` for each event the destination would refuse or misrecord."""


class Transport(abc.ABC):
    """The interface of a destination. Instances are immutable and hold the :class:`Destination`."""

    name: str = ""

    def __init__(self, destination: Destination) -> None:
        self.destination = destination

    @abc.abstractmethod
    def prepare(self, events: Sequence[Event], *, now: float) -> Prepared:
        """Split ``events`` (oldest first) into requests within the destination's limits.

        ``now`` is the wall clock (seconds since the epoch), for rules about an event's age.
        """


def event_time(event: Event) -> float:
    """The event's ``time`` (``2026-12-03T08:15:48Z``) as seconds since the epoch (the package's one parser,
    :func:`spool_reporter._event.parse_time`); :class:`ValueError` if it is no such time."""
    from spool_reporter._event import parse_time

    epoch = parse_time(str(event["time"]))
    if epoch is None:
        raise ValueError(f"not a UTC time of the form 2026-12-03T08:15:48Z: {event['time']!r}")
    return float(epoch)


def transport_for(destination: Destination) -> Transport:
    """The transport that speaks ``destination.transport``."""
    if destination.transport == "ga4":
        from .ga4 import GA4Transport

        return GA4Transport(destination)
    if destination.transport == "ua":
        from .ua import UATransport

        return UATransport(destination)
    if destination.transport == "json":
        from .json import JSONTransport

        return JSONTransport(destination)
    msg = f"unknown transport {destination.transport!r}"
    raise ValueError(msg)
