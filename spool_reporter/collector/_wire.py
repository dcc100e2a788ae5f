"""The wire format of ``POST /v1/batch``, parsed strictly.

The body is ``{"schema": 1, "events": [...]}``: exactly those two keys, at most :data:`MAX_EVENTS` events,
each an object with exactly the allowlisted fields (:data:`spool_reporter._event.FIELDS`) that passes
:func:`spool_reporter._event.validate` and carries a real UTC ``time``. Anything else is refused as a whole
with a short reason (the client's own validation makes a refused batch a bug, not weather), so one
malformed event never slips in next to good ones.
"""

from __future__ import annotations

import json

from spool_reporter._event import FIELDS, SCHEMA_VERSION, validate

from ._store import Row, iso_week

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

MAX_EVENTS: Final = 500
"""Events per batch: the ``json`` transport's batch size, fixed by the wire format."""

MAX_BODY_BYTES: Final = 512 * 1024
"""Body cap: 500 events of ~420 bytes are ~210 KiB; twice that leaves room for non-ASCII escapes."""

_FIELD_SET: Final = frozenset(FIELDS)
_TOP_KEYS: Final = frozenset(("schema", "events"))


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


def parse_batch(body: bytes) -> list[Row]:
    """The events of a batch body, as rows to store; raises :class:`BadRequest` for anything else.

    Never raises anything but :class:`BadRequest` (fuzzed in ``tests/test_collector_wire.py``).
    """
    if len(body) > MAX_BODY_BYTES:
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
            unknown = sorted(set(obj) - _FIELD_SET)
            missing = sorted(_FIELD_SET - set(obj))
            what = f"unknown field {unknown[0][:40]!a}" if unknown else f"missing field {missing[0]!r}"
            raise BadRequest(f"event {index}: {what}")
        row = _row(obj)
        if row is None:
            raise BadRequest(f"event {index}: invalid")
        rows.append(row)
    return rows
