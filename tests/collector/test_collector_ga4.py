"""GA4-shaped payloads at the collector's ``POST /mp/collect``: the strict parser (fed by the ``ga4``
transport's own ``prepare()``), its fuzzing, the derived event ids, the WSGI rules, and a real embedded
server on a loopback port (privacy of the query string, de-duplication, forwarding).
``test_collector_flush.py`` runs real ``django-spool flush`` processes with ``transport=ga4`` against the
real collector subprocess."""

from __future__ import annotations

import copy
import http
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spool_reporter._event import REASONS, validate
from spool_reporter._hook import is_uuid4
from spool_reporter._settings import Destination
from spool_reporter.collector import GA4_PATH, CollectorServer, GA4Forwarder, Policy, make_app, serve
from spool_reporter.collector._common import COLUMNS
from spool_reporter.collector._weeks import iso_week
from spool_reporter.collector._wire import (
    GA4_MAX_BODY_BYTES,
    GA4_MAX_EVENTS,
    BadRequest,
    ga4_event_id,
    parse_batch,
    parse_ga4,
)
from spool_reporter.transports import event_time
from spool_reporter.transports.ga4 import MAX_BODY_BYTES, MAX_EVENTS, PARAMS, GA4Transport

from support.collector_server import HTTP, FakeGA4, call_wsgi
from support.events import (
    FORWARDED_FOR,
    GA4_NOW,
    JSON_VALUES,
    MARKER,
    PROBE_UA,
    assert_private,
    db_bytes,
    det_uuid4,
    event,
    probe_headers,
)
from support.polling import wait_for

pytestmark = pytest.mark.usefixtures("close_every_store")

MEASUREMENT_ID = "G-PROBE7Q3X"
"""A measurement id sent in the query string: the collector must never store, log or echo it."""
API_SECRET = "apisecret-9d41c7e0b2"
"""An API secret sent in the query string: the collector must never store, log or echo it."""
QUERY = f"?measurement_id={MEASUREMENT_ID}&api_secret={API_SECRET}"

WHEN = "2026-12-03T08:15:48Z"
CLOCK = event_time({"time": WHEN}) + 3600  # "now" for prepare(): an hour later, inside GA4's 72 hours
GA4_POLICY = Policy(clock=lambda: CLOCK)
"""The collector's clock in these tests: the same hour."""


def ga4_rows(body: bytes) -> list[tuple[str, ...]]:
    """The rows of a GA4 payload whose events must all be valid."""
    parsed = parse_ga4(body, GA4_POLICY)
    assert parsed.refused == {}, parsed.refused
    return list(parsed.rows)


def transport(endpoint: str = "http://127.0.0.1:9/mp/collect") -> GA4Transport:
    return GA4Transport(
        Destination(
            transport="ga4", endpoint=endpoint, source="user", measurement_id=MEASUREMENT_ID, api_secret=API_SECRET
        )
    )


def bodies(events: list[dict[str, object]]) -> list[bytes]:
    """What the ``ga4`` transport would send for ``events``: one body per request."""
    prepared = transport().prepare(events, now=CLOCK)
    assert prepared.rejected == ()
    return [b.request.body for b in prepared.batches]


def good_doc() -> dict[str, object]:
    """One valid GA4 document with one event, as the transport builds it."""
    (body,) = bodies([event(client="good")])
    doc = json.loads(body)
    assert isinstance(doc, dict)
    return doc


def dumps(doc: object) -> bytes:
    return json.dumps(doc).encode()


def expected_row(e: dict[str, object]) -> tuple[str, ...]:
    """The stored row for spooled event ``e`` sent through GA4: everything but its id and user agent."""
    values = {k: str(v) for k, v in e.items()}
    return tuple(values[c] for c in COLUMNS[1:-1])


# -- the parser, fed by the transport's own output ---------------------------------------------------------


def test_transport_output_round_trips() -> None:
    events = [
        event(
            client=i % 3,
            when=f"2026-11-{29 + i % 2}T08:15:{i:02d}Z",  # a Sunday (W48) and a Monday (W49)
            name=("startproject", "startapp", "runserver")[i % 3],
            os_name=("Linux", "macOS", "Windows", "Linux")[i % 4],
            app_version=f"5.{i}",  # distinct content: a GA4 event's id is its content and its day, not its second
        )
        for i in range(60)
    ]
    events.append(
        event(
            client="x",
            when="2026-11-30T12:00:00Z",
            python="PyPy",
            python_version="3.10",
            arch="arm64",
            app_version="6.0",
        )
    )
    # Another spooled event (its own event_id) with the same content as the first: same client, command, day
    # and parameters. GA4 payloads carry no id, so the collector cannot tell the two apart.
    twin = event(client=0, when="2026-11-29T23:59:59Z", name="startproject", os_name="Linux", app_version="5.0")
    assert twin["event_id"] != events[0]["event_id"]
    events.append(twin)
    now = event_time({"time": "2026-12-01T00:00:00Z"})
    sent = [b.request.body for b in transport().prepare(events, now=now).batches]
    assert len(sent) == 4  # one request per client: 21, 20 and 20 events, and one
    rows = [row for body in sent for row in ga4_rows(body)]
    assert sorted(r[1:] for r in rows) == sorted((*expected_row(e), iso_week(str(e["time"]))) for e in events)
    assert {r[-1] for r in rows} == {"2026-W48", "2026-W49"}
    ids = [r[0] for r in rows]
    assert all(is_uuid4(i) for i in ids)
    assert len(set(ids)) == len(events) - 1  # distinct events get distinct ids; the twin shares one
    assert "user_agent" not in str(rows)
    assert [ga4_rows(body) for body in sent] == [ga4_rows(body) for body in sent]  # deterministic


def test_stored_like_the_json_path_except_the_id() -> None:
    e = event(client="same")
    (via_ga4,) = ga4_rows(bodies([e])[0])
    (via_json,) = parse_batch(json.dumps({"schema": 1, "events": [e]}).encode(), GA4_POLICY).rows
    assert via_ga4[1:] == via_json[1:]
    assert via_ga4[0] != via_json[0] == e["event_id"]


def test_event_id_is_derived_from_the_whole_content() -> None:
    params = {p: f"v-{p}" for p in PARAMS}
    client = det_uuid4("client", "id")
    base = ga4_event_id(client, "startproject", 1796285748000000, params)
    assert is_uuid4(base)
    assert base == ga4_event_id(client, "startproject", 1796285748000000, dict(reversed(params.items())))
    changed = {
        ga4_event_id(det_uuid4("client", "other"), "startproject", 1796285748000000, params),
        ga4_event_id(client, "startapp", 1796285748000000, params),
        ga4_event_id(client, "startproject", 1796285748000000 + 86400_000000, params),  # the next day
        *(ga4_event_id(client, "startproject", 1796285748000000, {**params, p: "changed"}) for p in PARAMS),
    }
    assert base not in changed
    assert len(changed) == 3 + len(PARAMS)
    # The time of day is not in it (the collector keeps the day only): the id cannot give the second back.
    assert base == ga4_event_id(client, "startproject", 1796285748000000 + 3_000000, params)
    # Values are delimited, not concatenated: moving text from one parameter to the next changes the id.
    one = ga4_event_id(client, "startproject", 1796285748000000, {**params, "app": "ab", "app_version": "c"})
    two = ga4_event_id(client, "startproject", 1796285748000000, {**params, "app": "a", "app_version": "bc"})
    assert one != two


def _mutated(path: tuple[object, ...], value: object) -> bytes:
    """The good document with the value at ``path`` replaced (or removed, for ``...``)."""
    doc = good_doc()
    target: object = doc
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    if value is ...:
        del target[path[-1]]  # type: ignore[attr-defined]
    else:
        target[path[-1]] = value  # type: ignore[index]
    return dumps(doc)


P = ("events", 0, "params")
E = ("events", 0)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(lambda: b"", "not JSON", id="empty"),
        pytest.param(lambda: b"\xff\xfe", "not JSON", id="not-utf8"),
        pytest.param(lambda: b"[1, 2]", "not a JSON object", id="list"),
        pytest.param(lambda: b"[" * 100_000, "not JSON", id="deep"),
        pytest.param(lambda: b"{" + b" " * GA4_MAX_BODY_BYTES + b"}", "body too large", id="too-large"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), float("nan")), "not JSON", id="nan"),
        pytest.param(
            lambda: good_doc_text().replace(b'"client_id":', b'"client_id":"x","client_id":', 1),
            "duplicate key",
            id="duplicate-top-key",
        ),
        pytest.param(
            lambda: good_doc_text().replace(b'"name":', b'"name":"x","name":', 1), "duplicate key", id="duplicate-key"
        ),
        pytest.param(
            lambda: good_doc_text().replace(b'"arch":', b'"arch":"x","arch":', 1),
            "duplicate key",
            id="duplicate-param",
        ),
        pytest.param(lambda: _mutated(("events",), ...), "exactly the keys", id="no-events"),
        pytest.param(lambda: _mutated(("user_properties",), {"ip": "1.2.3.4"}), "exactly the keys", id="extra-key"),
        pytest.param(lambda: _mutated(("timestamp_micros",), 1), "exactly the keys", id="top-timestamp"),
        pytest.param(lambda: _mutated(("client_id",), "123.456"), "not a client id", id="ga-style-client-id"),
        pytest.param(lambda: _mutated(("client_id",), 7), "not a client id", id="client-id-int"),
        pytest.param(lambda: _mutated(("events",), {}), "not a list", id="events-object"),
        pytest.param(lambda: _mutated(("events",), good_doc()["events"] * 26), "too many", id="26-events"),  # type: ignore[operator]
        pytest.param(lambda: _mutated(E, "startproject"), "shape", id="event-string"),
        pytest.param(lambda: _mutated((*E, "ip"), "1.2.3.4"), "shape", id="event-extra"),
        pytest.param(
            lambda: _mutated((*E, "timestamp_micros"), ...),
            "shape",
            id="no-timestamp",
        ),
        pytest.param(lambda: _mutated((*E, "params"), [1]), "shape", id="params-list"),
        pytest.param(lambda: _mutated((*P, "ip"), "1.2.3.4"), "shape", id="param-extra"),
        pytest.param(lambda: _mutated((*P, "arch"), ...), "shape", id="param-missing"),
        pytest.param(lambda: _mutated((*E, "name"), "session_start"), "shape", id="reserved-name"),
        pytest.param(lambda: _mutated((*E, "name"), "ga_thing"), "shape", id="reserved-prefix"),
        pytest.param(lambda: _mutated((*E, "name"), "start-project"), "shape", id="name-chars"),
        pytest.param(lambda: _mutated((*E, "name"), "a" * 41), "shape", id="name-long"),
        pytest.param(lambda: _mutated((*E, "name"), 1), "shape", id="name-int"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), 1.5e15), "shape", id="ts-float"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), True), "shape", id="ts-bool"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), "1796285748000000"), "shape", id="ts-str"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), -1_000_000), "shape", id="ts-negative"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), 1796285748000001), "shape", id="ts-fraction"),
        pytest.param(lambda: _mutated((*E, "timestamp_micros"), 10**20), "shape", id="ts-year-10000"),
        pytest.param(lambda: _mutated((*P, "os"), ""), "os", id="value-empty"),
        pytest.param(lambda: _mutated((*P, "os"), "x" * 101), "os", id="value-long"),
        pytest.param(lambda: _mutated((*P, "os"), "Linux\n"), "os", id="value-control"),
        pytest.param(lambda: _mutated((*P, "os"), 6), "shape", id="value-int"),
        pytest.param(lambda: _mutated((*P, "os"), None), "shape", id="value-null"),
        # Each value fits, but the user agent derived from them (validated like a spooled one) would not.
        pytest.param(lambda: _mutated((*P, "app"), "A" * 90), "app", id="user-agent-long"),
    ],
)
def test_parse_refuses(body: object, reason: str) -> None:
    data = body()  # type: ignore[operator]
    if reason not in REASONS:  # not a GA4 request at all: refused whole
        with pytest.raises(BadRequest, match=reason):
            parse_ga4(data, GA4_POLICY)
        return
    parsed = parse_ga4(data, GA4_POLICY)  # one event without GA4's shape, or invalid: refused alone
    assert (parsed.rows, parsed.refused) == ([], {reason: 1})


def good_doc_text() -> bytes:
    text = bodies([event(client="good")])[0]
    assert ga4_rows(text)  # the mutations above start from a payload that is accepted
    return text


def test_one_bad_event_costs_only_itself() -> None:
    doc = json.loads(bodies([event(client="one") for _ in range(3)])[0])
    doc["events"][1]["params"]["os"] = ""
    parsed = parse_ga4(dumps(doc), GA4_POLICY)
    assert (len(parsed.rows), parsed.refused) == (2, {"os": 1})
    doc["events"][1]["params"]["os"] = "Linux"
    assert len(ga4_rows(dumps(doc))) == 3


def test_limits_are_the_transports() -> None:
    assert (GA4_MAX_EVENTS, GA4_MAX_BODY_BYTES) == (MAX_EVENTS, MAX_BODY_BYTES)
    doc = json.loads(bodies([event(client="max", when=f"2026-12-03T08:15:{s:02d}Z") for s in range(25)])[0])
    assert len(ga4_rows(dumps(doc))) == 25
    assert ga4_rows(dumps({**doc, "events": []})) == []  # like an empty /v1/batch: nothing to store
    # The first and the last second the event's time can spell: well-formed, and outside the time window.
    for micros, reason in ((0, "too_old"), (253402300799 * 10**6, "future")):
        item = {**doc["events"][0], "timestamp_micros": micros}
        parsed = parse_ga4(dumps({**doc, "events": [item]}), GA4_POLICY)
        assert parsed.refused == {reason: 1}
    item = {**doc["events"][0], "timestamp_micros": int(CLOCK) * 10**6}
    (row,) = ga4_rows(dumps({**doc, "events": [item]}))
    assert row[COLUMNS.index("time")] == "2026-12-03T09:15:48Z"
    # At the byte cap exactly: accepted (padding with JSON whitespace keeps the document the same).
    text = dumps(doc)
    assert len(ga4_rows(text + b" " * (GA4_MAX_BODY_BYTES - len(text)))) == 25


# -- fuzzing: only BadRequest escapes ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_fuzz_json(doc: object) -> None:
    try:
        parsed = parse_ga4(json.dumps(doc).encode(), GA4_POLICY)
    except BadRequest:
        return
    raise AssertionError(f"accepted {doc!r} as {parsed!r}")  # no valid client id can come out of JSON_VALUES


_PATHS = [
    ("client_id",),
    ("events",),
    ("events", 0),
    ("events", 0, "name"),
    ("events", 0, "params"),
    ("events", 0, "timestamp_micros"),
    *(("events", 0, "params", p) for p in PARAMS),
]


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(_PATHS),
    JSON_VALUES | st.text(max_size=120) | st.integers() | st.just(...),
    st.sampled_from([None, "extra", "events", "params"]),
)
def test_fuzz_one_value(path: tuple[object, ...], value: object, extra: str | None) -> None:
    doc = json.loads(bodies([event(client="fuzz")])[0])
    original = copy.deepcopy(doc)
    target = doc
    for step in path[:-1]:
        target = target[step]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    if extra is not None and isinstance(target, dict):
        target[extra] = "x"
    try:
        rows = parse_ga4(dumps(doc), GA4_POLICY).rows
    except BadRequest:
        return
    # Accepted: then the document still has the transport's exact shape, and every row validates.
    assert set(doc) == set(original)
    for row in rows:
        assert is_uuid4(row[0])
        assert len(row) == len(COLUMNS)
        e = dict(zip(COLUMNS[:-1], row[:-1], strict=True))
        ua = f"{e['app']}/{e['app_version']} {e['python']}/{e['python_version']} ({e['os']}; {e['arch']})"
        assert validate({"schema": 1, **e, "user_agent": ua}, now=CLOCK) is not None


# -- the WSGI application ---------------------------------------------------------------------------------


def test_wsgi_rules(tmp_path: Path) -> None:
    app = make_app(tmp_path / "c.sqlite3", policy=GA4_POLICY)
    body = bodies([event(client="w")])[0]
    json_headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "QUERY_STRING": QUERY[1:]}
    assert call_wsgi(app, "POST", GA4_PATH, body, json_headers) == ("204 No Content", b"")
    assert call_wsgi(app, "POST", GA4_PATH, body, json_headers) == ("204 No Content", b"")  # stored once
    assert app.counters.as_dict() == {  # type: ignore[attr-defined]
        "requests": 2, "accepted": 1, "duplicates": 1, "rejected": 0, "refused": 0, "forward_dropped": 0,
        "forgotten": 0,
    }  # fmt: skip
    status, out = call_wsgi(app, "GET", GA4_PATH, b"", {})
    assert (status, out) == ("405 Method Not Allowed", b"use POST\n")
    assert call_wsgi(app, "POST", "/mp/collect/", body, json_headers)[0].startswith("404")
    assert call_wsgi(app, "POST", "/debug/mp/collect", body, json_headers)[0].startswith("404")
    status, out = call_wsgi(app, "POST", GA4_PATH, body, {**json_headers, "CONTENT_TYPE": "text/plain"})
    assert (status, out) == ("415 Unsupported Media Type", b"Content-Type must be application/json\n")
    status, out = call_wsgi(app, "POST", GA4_PATH, body, {**json_headers, "HTTP_CONTENT_ENCODING": "gzip"})
    assert (status, out) == ("415 Unsupported Media Type", b"Content-Encoding not supported\n")
    status, _ = call_wsgi(app, "POST", GA4_PATH, body, {"CONTENT_TYPE": "application/json"})
    assert status.startswith("411")
    status, out = call_wsgi(
        app, "POST", GA4_PATH, b"x", {**json_headers, "CONTENT_LENGTH": str(GA4_MAX_BODY_BYTES + 1)}
    )
    too_large = f"413 {http.HTTPStatus(413).phrase}"
    assert (status, out) == (too_large, f"body larger than {GA4_MAX_BODY_BYTES} bytes\n".encode())
    # Without a length (a server that delimits the body itself), the cap is enforced while reading.
    big = b" " * (GA4_MAX_BODY_BYTES + 10)
    unframed = {"CONTENT_TYPE": "application/json", "wsgi.input_terminated": True}
    status, _ = call_wsgi(app, "POST", GA4_PATH, big, unframed)  # type: ignore[arg-type]
    assert status.startswith("413")
    # /v1/batch keeps its own, larger cap: the same body is read there, and refused as not JSON.
    framed = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(big))}
    assert call_wsgi(app, "POST", "/v1/batch", big, framed) == ("400 Bad Request", b"not JSON\n")
    assert call_wsgi(app, "POST", GA4_PATH, big, framed)[0].startswith("413")
    status, out = call_wsgi(app, "POST", GA4_PATH, b'{"client_id": 1}', {**json_headers, "CONTENT_LENGTH": "16"})
    assert (status, out) == ("400 Bad Request", b'expected exactly the keys "client_id" and "events"\n')
    assert app.store.count() == (1, 1)  # type: ignore[attr-defined]


# -- a real server on a loopback port ---------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "collector.sqlite3"


@pytest.fixture
def server(db: Path) -> Iterator[CollectorServer]:
    srv = serve(db, policy=GA4_POLICY).start()
    try:
        yield srv
    finally:
        srv.stop()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    response = HTTP.request("POST", url, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    return response.status, dict(response.headers), response.data


def test_server_stores_ga4_payloads_once(server: CollectorServer) -> None:
    assert server.ga4_url == f"http://127.0.0.1:{server.port}/mp/collect"
    events = [
        event(client=i % 4, when=f"2026-12-03T08:{i // 60:02d}:{i % 60:02d}Z", app_version=f"5.{i}") for i in range(90)
    ]
    sent = bodies(events)
    assert len(sent) == 4  # one request per client (23, 23, 22 and 22 events)
    for body in sent:
        status, headers, data = post(server.ga4_url + QUERY, body)
        assert (status, data) == (204, b"")
        assert "Content-Length" not in headers
        assert "Content-Type" not in headers
    for body in sent:  # a flusher killed after the 2xx sends the same requests again
        assert post(server.ga4_url + QUERY, body)[0] == 204
    assert server.app.counters.as_dict() == {
        "requests": 2 * len(sent), "accepted": 90, "duplicates": 90, "rejected": 0, "refused": 0, "forward_dropped": 0,
        "forgotten": 0,
    }  # fmt: skip
    assert server.app.store.count() == (90, 4)
    # The /v1/batch answer is unchanged by the second path.
    status, _, data = post(server.url, json.dumps({"schema": 1, "events": events[:3]}).encode())
    assert (status, data) == (200, b'{"accepted": 3, "duplicates": 0, "rejected": 0, "refused": {}}')


def test_server_never_stores_logs_or_echoes_the_query_or_the_address(
    server: CollectorServer, db: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.ga4_url + QUERY
    (body,) = bodies([event(client="private")])
    answers = [
        post(url, body, probe_headers()),
        post(url, body, probe_headers()),
        post(url, b"garbage " + API_SECRET.encode(), probe_headers()),
        post(url, _mutated(("events", 0, "params", "os"), ""), probe_headers()),
        post(url, b"{}", {**probe_headers(), "Content-Type": "text/plain"}),
        post(url, b"{" + b" " * GA4_MAX_BODY_BYTES + b"}", probe_headers()),
    ]
    assert [a[0] for a in answers] == [204, 204, 400, 204, 415, 413]  # the bad event alone is refused: 204
    response = HTTP.request("GET", url, headers=probe_headers())
    assert response.status == 405
    answers.append((response.status, dict(response.headers), response.data))
    for _, headers, data in answers:  # nothing from the query string comes back
        assert MEASUREMENT_ID.encode() not in data
        assert API_SECRET.encode() not in data
        assert MEASUREMENT_ID not in repr(headers)
        assert API_SECRET not in repr(headers)
    assert_private(db_bytes(db))
    server.stop()
    stored = db_bytes(db)
    assert_private(stored)
    assert MEASUREMENT_ID.encode() not in stored
    assert API_SECRET.encode() not in stored
    out, err = capfd.readouterr()
    server_side = [r.getMessage() for r in caplog.records if not r.name.startswith("urllib3")]  # the test's client
    for text in (out + err, "\n".join(server_side)):
        assert_private(text.encode())
        assert MEASUREMENT_ID not in text
        assert API_SECRET not in text
    assert err == ""


def test_ga4_payloads_are_forwarded_once(db: Path) -> None:
    fake = FakeGA4()
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{fake.server_address[1]}/mp/collect"
        forward = GA4Forwarder(measurement_id="G-FORWARD1", api_secret="fwd", endpoint=endpoint, clock=lambda: GA4_NOW)
        with serve(db, forward=forward, policy=GA4_POLICY) as srv:
            events = [event(client=i % 2, when=f"2026-12-03T08:15:{i:02d}Z", app_version=f"5.{i}") for i in range(30)]
            sent = bodies(events)
            for body in sent + sent:  # every request twice: the copies are neither stored nor forwarded
                assert post(srv.ga4_url + QUERY, body, probe_headers())[0] == 204
            wait_for(lambda: forward.stats()["sent"] + forward.stats()["failed"] >= 30)
            assert srv.app.counters.as_dict()["accepted"] == 30
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(5)
    assert forward.stats() == {"sent": 30, "failed": 0, "stale": 0, "dropped": 0, "requests": len(sent)}
    # Google gets the collector's own credentials, and the same events the client sent.
    assert {path for path, _ in fake.received} == {"/mp/collect?measurement_id=G-FORWARD1&api_secret=fwd"}
    got = sorted(
        (doc["client_id"], json.dumps(item, sort_keys=True))  # type: ignore[index]
        for _, doc in fake.received
        for item in doc["events"]  # type: ignore[attr-defined]
    )
    want = sorted(
        (doc["client_id"], json.dumps(item, sort_keys=True)) for doc in map(json.loads, sent) for item in doc["events"]
    )
    assert got == want
    payloads = json.dumps([doc for _, doc in fake.received])
    assert_private(payloads.encode())
    headers = "".join(fake.headers_seen)  # Host: is the fake's own loopback address; nothing of the client's
    for text in (payloads, headers):
        for probe in (PROBE_UA, MARKER, FORWARDED_FOR, MEASUREMENT_ID, API_SECRET):
            assert probe not in text, probe


def test_wsgi_body_must_match_its_length(tmp_path: Path) -> None:
    app = make_app(tmp_path / "c.sqlite3", policy=GA4_POLICY)
    (body,) = bodies([event()])
    for length in (0, 1, len(body) - 1, len(body) + 1):
        headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(length)}
        assert call_wsgi(app, "POST", GA4_PATH, body, headers)[0].startswith("400"), length
    assert call_wsgi(app, "POST", GA4_PATH, body, {**headers, "CONTENT_LENGTH": str(len(body))})[0].startswith("204")


@pytest.fixture(scope="module")
def ga4_fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> object:
    return make_app(tmp_path_factory.mktemp("fuzz-ga4") / "c.sqlite3", policy=GA4_POLICY)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.text(max_size=40))
def test_fuzz_wsgi_body_and_query(ga4_fuzz_app: object, body: bytes, secret: str) -> None:
    query = f"measurement_id=G-FUZZ&api_secret={secret}"
    headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "QUERY_STRING": query}
    status, out = call_wsgi(ga4_fuzz_app, "POST", GA4_PATH, body, headers)
    assert status.startswith("400"), (status, out)
    assert b"api_secret" not in out
    assert b"G-FUZZ" not in out
