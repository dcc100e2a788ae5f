"""The wire formats of ``POST /v1/batch`` and ``POST /mp/collect``, parsed strictly.

**``/v1/batch``** (:func:`parse_batch`, the ``json`` transport): the body is ``{"schema": 1, "events": [...]}``:
exactly those two keys, at most :data:`MAX_EVENTS` events. Each event is then judged on its own by
:func:`spool_reporter._event.check` -- the one validator the client also runs before it sends -- under the
collector's :class:`Policy` (the time window, each application's commands): a valid event becomes a row
to store, an invalid one is counted by reason and never costs its neighbours.

**``/mp/collect``** (:func:`parse_ga4`, the ``ga4`` transport pointed at this collector): exactly what
``spool_reporter/transports/ga4.py`` emits, ``{"client_id": …, "events": [{"name": …, "params": {…},
"timestamp_micros": …}]}`` -- exactly those keys, exactly the parameters of
:data:`spool_reporter.transports.ga4.PARAMS`, at most :data:`GA4_MAX_EVENTS` events and
:data:`GA4_MAX_BODY_BYTES` bytes. Each event that has GA4's shape (an event name GA4 would accept, a
whole-second ``timestamp_micros``) is rebuilt as the project's event (``time`` from ``timestamp_micros`` in UTC,
``user_agent`` derived from the parameters as the hook derives it, ``schema`` 1) and judged by the same
:func:`~spool_reporter._event.check`, so one validator guards both paths. GA4 payloads carry no event
id: :func:`ga4_event_id` derives one from the event's content and its *day*, so an identical resend (a flusher
killed after the 2xx) is stored once -- and two identical events from one client on the same day count once
(the stored row keeps the day only, and an id derived from the second would give the second back to anyone
who tries the day's 86,400 of them).

**``/v1/forget``** (:func:`parse_forget`, ``django-spool forget``): the body is exactly ``{"client_id": "<uuid4>"}``,
at most :data:`FORGET_MAX_BODY_BYTES` bytes.

A body that is not a batch at all (not JSON, other keys, too many events, another schema) is refused as a
whole with a short reason (:class:`BadRequest`, a ``400``); a well-formed batch is always answered ``2xx``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time

from spool_reporter._event import (
    DJANGO_COMMANDS,
    MAX_AGE_SECONDS,
    SCHEMA_VERSION,
    check,
    format_user_agent,
    is_uuid4,
    iso_time,
)
from spool_reporter.transports import ga4 as _ga4

from ._common import COLUMNS, Row
from ._weeks import week_of_valid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Final

MAX_EVENTS: Final = 500
"""Events per batch: the ``json`` transport's batch size, fixed by the wire format."""

MAX_BODY_BYTES: Final = 512 * 1024
"""Body cap: 500 events of ~420 bytes are ~210 KiB; twice that leaves room for non-ASCII escapes."""

GA4_MAX_EVENTS: Final = _ga4.MAX_EVENTS
"""Events per ``/mp/collect`` request: the ``ga4`` transport's (and GA4's) limit."""

GA4_MAX_BODY_BYTES: Final = _ga4.MAX_BODY_BYTES
"""Body cap of ``/mp/collect``: the ``ga4`` transport keeps its requests under GA4's 130 kB."""

FORGET_MAX_BODY_BYTES: Final = 256
"""Body cap of ``/v1/forget``: ``{"client_id": "…"}`` is 53 bytes; room for spaces, not for anything else."""

GA4_ID_DOMAIN: Final = b"spool_reporter/collector ga4 event id v2\n"
"""Hashed before an event's content in :func:`ga4_event_id`: names the derivation, so it can change later."""

_ROW_FIELDS: Final = COLUMNS[:-1]
"""The event's fields a row keeps, in row order (the row adds ``week``)."""
_TOP_KEYS: Final = frozenset(("schema", "events"))
_GA4_TOP_KEYS: Final = frozenset(("client_id", "events"))
_GA4_EVENT_KEYS: Final = frozenset(("name", "params", "timestamp_micros"))
_GA4_PARAMS: Final = _ga4.PARAMS
_GA4_PARAM_SET: Final = frozenset(_GA4_PARAMS)
_MICROS: Final = 1_000_000
_LAST_SECOND: Final = 253_402_300_799
"""9999-12-31T23:59:59Z: the last second the event's ``time`` format can spell."""


class BadRequest(ValueError):
    """The request is not a valid batch; ``str(exc)`` is the short reason sent back with the 400."""


ANY_COMMAND: Final = "*"
"""In an application's command set: any valid event name (for a tool whose commands are open-ended)."""

DEFAULT_COMMANDS: Final = {"Django": DJANGO_COMMANDS}
"""Applications accepted by default, each with its command set: DEP 8's Django and its three commands."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the collector accepts, beyond the shape every event must have (keyword-only, immutable).

    :param commands: application name -> the event names accepted for it (:data:`ANY_COMMAND` for any valid
        name); events of another application
        are refused as ``app`` (an operator who collects for their own tool adds it here, or with
        ``serve --commands``).
    :param max_age: the oldest event accepted, in seconds before now (default 30 days).
    :param clock: the wall clock (``time.time``), replaceable in tests.
    """

    commands: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=lambda: dict(DEFAULT_COMMANDS))
    max_age: float = MAX_AGE_SECONDS
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not self.max_age > 0:
            msg = f"max_age must be positive, got {self.max_age!r}"
            raise ValueError(msg)


@dataclasses.dataclass
class Parsed:
    """The events of one request: rows to store and refusals by reason."""

    rows: list[Row]
    refused: dict[str, int]
    now: float
    """The clock reading the time window was judged against (also names the week the refusals count in)."""

    @property
    def rejected(self) -> int:
        return sum(self.refused.values())


def _no_constants(name: str) -> object:
    # NaN and Infinity are not JSON; Python's parser accepts them unless told otherwise.
    raise BadRequest("not JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise BadRequest("duplicate key")
    return obj


def _judge(obj: object, policy: Policy, now: float, rows: list[Row], refused: dict[str, int]) -> None:
    """Append ``obj`` to ``rows`` if valid, else count it in ``refused`` under its reason."""
    app = obj.get("app") if type(obj) is dict else None
    commands = policy.commands.get(app) if type(app) is str else None
    if commands is None:
        reason = check(obj, now=now, max_age=policy.max_age)
        reason = reason or "app"  # valid, but not an application this collector counts
    else:
        reason = check(obj, now=now, max_age=policy.max_age, commands=None if ANY_COMMAND in commands else commands)
    if reason is not None:
        refused[reason] = refused.get(reason, 0) + 1
        return
    e: dict[str, str] = obj  # type: ignore[assignment]  # check() proved it an event
    rows.append(Row._make([*[e[key] for key in _ROW_FIELDS], week_of_valid(e["time"])]))


def _load(body: bytes, cap: int) -> dict[str, object]:
    """The body as a JSON object: UTF-8, no NaN, no duplicate key, at most ``cap`` bytes."""
    if len(body) > cap:
        raise BadRequest("body too large")
    try:
        text = body.decode("utf-8")
        doc = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except BadRequest:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadRequest("not JSON") from exc
    if not isinstance(doc, dict):
        raise BadRequest("not a JSON object")
    return doc


def parse_batch(body: bytes, policy: Policy | None = None) -> Parsed:
    """The events of a batch body: rows to store and refusals; raises :class:`BadRequest` if not a batch.

    Never raises anything but :class:`BadRequest` (fuzzed in ``tests/collector/test_collector.py``).
    """
    policy = policy or Policy()
    doc = _load(body, MAX_BODY_BYTES)
    if set(doc) != _TOP_KEYS:
        raise BadRequest('expected exactly the keys "schema" and "events"')
    schema = doc["schema"]
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise BadRequest(f"unsupported schema (this collector speaks schema {SCHEMA_VERSION})")
    events = doc["events"]
    if not isinstance(events, list):
        raise BadRequest('"events" is not a list')
    if len(events) > MAX_EVENTS:
        raise BadRequest(f"too many events (at most {MAX_EVENTS} per batch)")
    now = policy.clock()
    parsed = Parsed(rows=[], refused={}, now=now)
    for obj in events:
        _judge(obj, policy, now, parsed.rows, parsed.refused)
    return parsed


def ga4_event_id(client_id: str, name: str, timestamp_micros: int, params: dict[str, str]) -> str:
    """A uuid4-shaped event id derived from a GA4 event's whole content (GA4 payloads carry no event id).

    SHA-256 over :data:`GA4_ID_DOMAIN` and the canonical JSON of ``[client_id, name, the UTC day of
    timestamp_micros ("2026-12-03"), [the values of PARAMS, in that order]]``, truncated to 128 bits with the
    version (4) and variant bits set, so that :func:`spool_reporter._event.is_uuid4` accepts it. The same event
    resent gets the same id and is stored once; two identical events from one client on the same day get one
    id too. The time of day is left out on purpose: the collector keeps the day of an event, never its second.
    """
    canonical = json.dumps(
        [client_id, name, iso_time(timestamp_micros // _MICROS)[:10], [params[key] for key in _GA4_PARAMS]],
        ensure_ascii=True,
        separators=(",", ":"),
    ).encode("ascii")
    b = bytearray(hashlib.sha256(GA4_ID_DOMAIN + canonical).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _ga4_event(client_id: str, obj: object) -> dict[str, object] | None:
    """The project's event rebuilt from one GA4-shaped event, or ``None`` if it does not have GA4's shape."""
    if type(obj) is not dict or obj.keys() != _GA4_EVENT_KEYS:
        return None
    name, params, micros = obj["name"], obj["params"], obj["timestamp_micros"]
    if type(params) is not dict or params.keys() != _GA4_PARAM_SET:
        return None
    if not isinstance(name, str) or _ga4.name_problem(name, event=True) is not None:
        return None
    # An int (not a bool, not a float), whole seconds as the ga4 transport sends them, within the years the
    # event's time format can spell. Required: this collector never uses the arrival time instead.
    if type(micros) is not int or micros < 0 or micros % _MICROS or micros // _MICROS > _LAST_SECOND:
        return None
    if not all(type(value) is str for value in params.values()):
        return None
    p: dict[str, str] = params
    return {
        "schema": SCHEMA_VERSION,
        "event_id": ga4_event_id(client_id, name, micros, p),
        "event": name,
        **{key: p[key] for key in _GA4_PARAMS},
        # Not sent by GA4; derived exactly as the hook derives it, so that check() sees a whole event.
        "user_agent": format_user_agent(
            p["app"], p["app_version"], impl=p["python"], pyver=p["python_version"], family=p["os"], arch=p["arch"]
        ),
        "client_id": client_id,
        "time": iso_time(micros // _MICROS),
    }


def parse_ga4(body: bytes, policy: Policy | None = None) -> Parsed:
    """The events of a GA4-shaped ``/mp/collect`` body: rows and refusals; :class:`BadRequest` if not one.

    Accepts exactly the shape :class:`spool_reporter.transports.ga4.GA4Transport` emits (see the module
    docstring). An event without GA4's shape is refused as ``shape``. Never raises anything but
    :class:`BadRequest` (fuzzed in ``tests/collector/test_collector_ga4.py``).
    """
    policy = policy or Policy()
    doc = _load(body, GA4_MAX_BODY_BYTES)
    if set(doc) != _GA4_TOP_KEYS:
        raise BadRequest('expected exactly the keys "client_id" and "events"')
    client_id = doc["client_id"]
    if not isinstance(client_id, str) or not is_uuid4(client_id):
        raise BadRequest('"client_id" is not a client id (a uuid4)')
    events = doc["events"]
    if not isinstance(events, list):
        raise BadRequest('"events" is not a list')
    if len(events) > GA4_MAX_EVENTS:
        raise BadRequest(f"too many events (at most {GA4_MAX_EVENTS} per request)")
    now = policy.clock()
    parsed = Parsed(rows=[], refused={}, now=now)
    for obj in events:
        event = _ga4_event(client_id, obj)
        if event is None:
            parsed.refused["shape"] = parsed.refused.get("shape", 0) + 1
        else:
            _judge(event, policy, now, parsed.rows, parsed.refused)
    return parsed


_FORGET_KEYS: Final = frozenset(("client_id",))


def parse_forget(body: bytes) -> str:
    """The client id a ``/v1/forget`` body names; :class:`BadRequest` unless exactly ``{"client_id": <uuid4>}``."""
    doc = _load(body, FORGET_MAX_BODY_BYTES)
    if set(doc) != _FORGET_KEYS:
        raise BadRequest('expected exactly the key "client_id"')
    client_id = doc["client_id"]
    if not isinstance(client_id, str) or not is_uuid4(client_id):
        raise BadRequest('"client_id" is not a client id (a uuid4)')
    return client_id
