"""``ga4``: the GA4 Measurement Protocol (``POST /mp/collect?measurement_id=…&api_secret=…``).

One request per client id and up to 25 events::

    {"client_id": "<client id>",
     "events": [{"name": "startproject",
                 "params": {"app": "Django", "app_version": "5.2", "python": "CPython", "python_version": "3.11",
                            "os": "Linux", "os_release": "6.1", "arch": "x86_64"},
                 "timestamp_micros": 1796285748000000}]}

``/mp/collect`` answers 2xx even to payloads it then discards, so every documented limit is checked here
before sending (DESIGN constraint 7): at most 25 events per request and 25 params per event; event and
param names at most 40 characters, ``[A-Za-z][A-Za-z0-9_]*``, no reserved prefix (``_``, ``firebase_``,
``ga_``, ``google_``, ``gtag.``) and no reserved event name; param values at most 100 characters; body under
130 kB. An event that breaks a rule is rejected (counted, never sent).

**Old events.** GA4 accepts ``timestamp_micros`` at most 72 hours in the past. An event older than that
cannot be recorded at its real time: sending it without a timestamp would date it today (misdated), so it
is rejected and counted as ``rejected`` instead. A laptop offline for more than three days therefore loses
those events for GA4 (the self-hosted ``json`` collector takes them, up to its ``--max-age-days``). Each event
carries its own ``timestamp_micros`` (the event-level override); a time in the future (a skewed clock) is sent
as "now".

GA4 has no way to anonymise the sender's IP address; the ``json`` collector is the IP-free path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Final

from . import Batch, Event, Prepared, Request, Transport, event_time

MAX_EVENTS: Final = 25
"""Events per request (GA4 Measurement Protocol limit)."""

MAX_PARAMS: Final = 25
"""Parameters per event (GA4 limit)."""

MAX_NAME: Final = 40
"""Characters in an event or parameter name (GA4 limit)."""

MAX_VALUE: Final = 100
"""Characters in a parameter value (GA4 limit for standard properties)."""

MAX_BODY_BYTES: Final = 130_000
"""The request body must stay under 130 kB (GA4 limit)."""

MAX_AGE_SECONDS: Final = 72 * 3600
"""``timestamp_micros`` may reach back at most 72 hours (GA4 limit)."""

RESERVED_PREFIXES: Final = ("_", "firebase_", "ga_", "google_", "gtag.")
"""Prefixes GA4 reserves for event and parameter names."""

RESERVED_EVENTS: Final = frozenset(
    {
        "ad_activeview", "ad_click", "ad_exposure", "ad_impression", "ad_query", "ad_reward",
        "adunit_exposure", "app_background", "app_clear_data", "app_exception", "app_install",
        "app_remove", "app_store_refund", "app_store_subscription_cancel",
        "app_store_subscription_convert", "app_store_subscription_renew", "app_update",
        "app_upgrade", "dynamic_link_app_open", "dynamic_link_app_update", "dynamic_link_first_open",
        "error", "firebase_campaign", "firebase_in_app_message_action",
        "firebase_in_app_message_dismiss", "firebase_in_app_message_impression", "first_open",
        "first_visit", "in_app_purchase", "notification_dismiss", "notification_foreground",
        "notification_open", "notification_receive", "notification_send", "os_update",
        "screen_view", "session_start", "user_engagement",
    }
)  # fmt: skip
"""Event names GA4 reserves (Measurement Protocol reference, "Reserved event names")."""

PARAMS: Final = ("app", "app_version", "python", "python_version", "os", "os_release", "arch")
"""The allowlisted fields sent as parameters; ids travel as ``client_id`` and the time as a timestamp.
The event id is not sent: GA4 cannot de-duplicate by it."""

_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}\Z")


def name_problem(name: str, *, event: bool) -> str | None:
    """Why GA4 would refuse ``name`` as an event (or parameter) name, or ``None``."""
    if not _NAME.match(name):
        return f"name {name!r} is not [A-Za-z][A-Za-z0-9_]* of at most {MAX_NAME} characters"
    if name.lower().startswith(RESERVED_PREFIXES):
        return f"name {name!r} has a reserved prefix"
    if event and name in RESERVED_EVENTS:
        return f"event name {name!r} is reserved"
    return None


class GA4Transport(Transport):
    """Requests per client id, each within GA4's limits, validated before they leave."""

    name = "ga4"

    def item(self, event: Event, *, now: float) -> dict[str, object] | str:
        """The ``events[]`` entry for ``event``, or the reason it cannot be sent."""
        name = str(event["event"])
        problem = name_problem(name, event=True)
        if problem is not None:
            return problem
        when = event_time(event)
        if when < now - MAX_AGE_SECONDS:
            return "older than GA4's 72-hour back-dating window"
        params = {key: str(event[key]) for key in PARAMS}
        if len(params) > MAX_PARAMS:  # pragma: no cover - PARAMS is fixed
            return "too many parameters"
        for key, value in params.items():
            problem = name_problem(key, event=False)
            if problem is not None:  # pragma: no cover - PARAMS is fixed
                return problem
            if len(value) > MAX_VALUE:
                return f"parameter {key} longer than {MAX_VALUE} characters"
        return {"name": name, "params": params, "timestamp_micros": int(min(when, now)) * 1_000_000}

    def _request(self, client_id: str, items: list[dict[str, object]]) -> Request:
        body = json.dumps({"client_id": client_id, "events": items}, separators=(",", ":")).encode("ascii")
        return Request(
            method="POST",
            url=self.destination.request_url(),
            url_redacted=self.destination.redacted_url(),
            headers={"Content-Type": "application/json"},
            body=body,
        )

    def prepare(self, events: Sequence[Event], *, now: float) -> Prepared:
        groups: dict[str, list[tuple[Event, dict[str, object]]]] = {}
        rejected: list[tuple[Event, str]] = []
        for event in events:
            item = self.item(event, now=now)
            if isinstance(item, str):
                rejected.append((event, item))
            else:
                groups.setdefault(str(event["client_id"]), []).append((event, item))
        batches: list[Batch] = []
        for client_id, group in groups.items():
            empty = len(self._request(client_id, []).body)
            chunk: list[tuple[Event, dict[str, object]]] = []
            size = empty
            for event, item in group:
                added = len(json.dumps(item, separators=(",", ":"))) + (1 if chunk else 0)
                if chunk and (len(chunk) >= MAX_EVENTS or size + added >= MAX_BODY_BYTES):
                    batches.append(self._batch(client_id, chunk))
                    chunk, size, added = [], empty, added - 1
                chunk.append((event, item))
                size += added
            if chunk:
                batches.append(self._batch(client_id, chunk))
        return Prepared(batches=tuple(batches), rejected=tuple(rejected))

    def _batch(self, client_id: str, chunk: list[tuple[Event, dict[str, object]]]) -> Batch:
        return Batch(events=tuple(e for e, _ in chunk), request=self._request(client_id, [i for _, i in chunk]))
