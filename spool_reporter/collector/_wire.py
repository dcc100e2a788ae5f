"""The wire formats of ``POST /v1/batch`` and ``POST /mp/collect``, parsed strictly.

**``/v1/batch``** (:func:`parse_batch`, the ``json`` transport): the body is ``{"schema": 1, "events": [...]}``:
exactly those two keys, at most :data:`MAX_EVENTS` events, each an object with exactly the allowlisted
fields (:data:`spool_reporter._event.FIELDS`) that passes :func:`spool_reporter._event.validate` and carries
a real UTC ``time``.

**``/mp/collect``** (:func:`parse_ga4`, the ``ga4`` transport pointed at this collector): exactly what
``spool_reporter/transports/ga4.py`` emits, ``{"client_id": …, "events": [{"name": …, "params": {…},
"timestamp_micros": …}]}`` -- exactly those keys, exactly the parameters of
:data:`spool_reporter.transports.ga4.PARAMS`, at most :data:`GA4_MAX_EVENTS` events and
:data:`GA4_MAX_BODY_BYTES` bytes, an event name GA4 would accept, a whole-second ``timestamp_micros``.
Each event is rebuilt as the project's event (``time`` from ``timestamp_micros`` in UTC, ``user_agent``
derived from the parameters as the hook derives it, ``schema`` 1) and passed through the same
:func:`~spool_reporter._event.validate`, so one allowlist guards both paths. GA4 payloads carry no event
id: :func:`ga4_event_id` derives one from the event's content, so an identical resend (a flusher killed
after the 2xx) is stored once -- and two identical events from one client in the same second count once.

Anything else is refused as a whole with a short reason (the client's own validation makes a refused batch
a bug, not weather), so one malformed event never slips in next to good ones.
"""

from __future__ import annotations

import hashlib
import json

from spool_reporter._event import FIELDS, SCHEMA_VERSION, format_user_agent, is_uuid4, iso_time, validate
from spool_reporter.transports import ga4 as _ga4

from ._store import Row, iso_week

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

MAX_EVENTS: Final = 500
"""Events per batch: the ``json`` transport's batch size, fixed by the wire format."""

MAX_BODY_BYTES: Final = 512 * 1024
"""Body cap: 500 events of ~420 bytes are ~210 KiB; twice that leaves room for non-ASCII escapes."""

GA4_MAX_EVENTS: Final = _ga4.MAX_EVENTS
"""Events per ``/mp/collect`` request: the ``ga4`` transport's (and GA4's) limit."""

GA4_MAX_BODY_BYTES: Final = _ga4.MAX_BODY_BYTES
"""Body cap of ``/mp/collect``: the ``ga4`` transport keeps its requests under GA4's 130 kB."""

GA4_ID_DOMAIN: Final = b"spool_reporter/collector ga4 event id v1\n"
"""Hashed before an event's content in :func:`ga4_event_id`: names the derivation, so it can change later."""

_FIELD_SET: Final = frozenset(FIELDS)
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


def _no_constants(name: str) -> object:
    # NaN and Infinity are not JSON; Python's parser accepts them unless told otherwise.
    raise BadRequest("not JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise BadRequest("duplicate key")
    return obj


def _row(obj: object) -> Row | None:
    event = validate(obj)
    if event is None or type(event["schema"]) is not int:  # validate() lets True pass as 1
        return None
    week = iso_week(str(event["time"]))
    if week is None:
        return None
    e = event
    return (
        str(e["event_id"]),
        str(e["event"]),
        str(e["app"]),
        str(e["app_version"]),
        str(e["python"]),
        str(e["python_version"]),
        str(e["os"]),
        str(e["os_release"]),
        str(e["arch"]),
        str(e["client_id"]),
        str(e["time"]),
        week,
    )


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


def _key_problem(obj: dict[str, object], expected: frozenset[str], what: str) -> str:
    """``unknown field 'x'`` or ``missing field 'y'`` for an object whose keys are not ``expected``."""
    present = set(obj)
    unknown = sorted(present - expected)
    missing = sorted(expected - present)
    return f"unknown {what} {unknown[0][:40]!a}" if unknown else f"missing {what} {missing[0]!r}"


def parse_batch(body: bytes) -> list[Row]:
    """The events of a batch body, as rows to store; raises :class:`BadRequest` for anything else.

    Never raises anything but :class:`BadRequest` (fuzzed in ``tests/test_collector.py``).
    """
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
    rows: list[Row] = []
    for index, obj in enumerate(events):
        if isinstance(obj, dict) and set(obj) != _FIELD_SET:
            raise BadRequest(f"event {index}: {_key_problem(obj, _FIELD_SET, 'field')}")
        row = _row(obj)
        if row is None:
            raise BadRequest(f"event {index}: invalid")
        rows.append(row)
    return rows


def ga4_event_id(client_id: str, name: str, timestamp_micros: int, params: dict[str, str]) -> str:
    """A uuid4-shaped event id derived from a GA4 event's whole content (GA4 payloads carry no event id).

    SHA-256 over :data:`GA4_ID_DOMAIN` and the canonical JSON of ``[client_id, name, timestamp_micros,
    [the values of PARAMS, in that order]]``, truncated to 128 bits with the version (4) and variant bits
    set, so that :func:`spool_reporter._event.is_uuid4` accepts it. The same event resent gets the same id
    and is stored once; two identical events from one client in the same second get one id too.
    """
    canonical = json.dumps(
        [client_id, name, timestamp_micros, [params[key] for key in _GA4_PARAMS]],
        ensure_ascii=True,
        separators=(",", ":"),
    ).encode("ascii")
    b = bytearray(hashlib.sha256(GA4_ID_DOMAIN + canonical).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _ga4_row(client_id: str, obj: object, index: int) -> Row:
    if not isinstance(obj, dict):
        raise BadRequest(f"event {index}: invalid")
    if set(obj) != _GA4_EVENT_KEYS:
        raise BadRequest(f"event {index}: {_key_problem(obj, _GA4_EVENT_KEYS, 'field')}")
    name, params, micros = obj["name"], obj["params"], obj["timestamp_micros"]
    if not isinstance(params, dict):
        raise BadRequest(f"event {index}: invalid")
    if set(params) != _GA4_PARAM_SET:
        raise BadRequest(f"event {index}: {_key_problem(params, _GA4_PARAM_SET, 'parameter')}")
    if not isinstance(name, str) or _ga4.name_problem(name, event=True) is not None:
        raise BadRequest(f"event {index}: invalid name")
    # An int (not a bool, not a float), whole seconds as the ga4 transport sends them, within the years the
    # event's time format can spell. Required: this collector never uses the arrival time instead.
    if type(micros) is not int or micros < 0 or micros % _MICROS or micros // _MICROS > _LAST_SECOND:
        raise BadRequest(f"event {index}: invalid timestamp_micros")
    if not all(isinstance(value, str) for value in params.values()):
        raise BadRequest(f"event {index}: invalid")
    p: dict[str, str] = params
    event: dict[str, object] = {
        "schema": SCHEMA_VERSION,
        "event_id": ga4_event_id(client_id, name, micros, p),
        "event": name,
        **{key: p[key] for key in _GA4_PARAMS},
        # Not sent by GA4; derived exactly as the hook derives it, so that validate() sees a whole event.
        "user_agent": format_user_agent(
            p["app"], p["app_version"], impl=p["python"], pyver=p["python_version"], family=p["os"], arch=p["arch"]
        ),
        "client_id": client_id,
        "time": iso_time(micros // _MICROS),
    }
    row = _row(event)
    if row is None:
        raise BadRequest(f"event {index}: invalid")
    return row


def parse_ga4(body: bytes) -> list[Row]:
    """The events of a GA4-shaped ``/mp/collect`` body, as rows to store; raises :class:`BadRequest` otherwise.

    Accepts exactly the shape :class:`spool_reporter.transports.ga4.GA4Transport` emits (see the module
    docstring). Never raises anything but :class:`BadRequest` (fuzzed in ``tests/test_collector_ga4.py``).
    """
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
    return [_ga4_row(client_id, obj, index) for index, obj in enumerate(events)]
