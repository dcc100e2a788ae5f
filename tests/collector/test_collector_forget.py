"""``POST /v1/forget`` on both back ends, through the WSGI application and a real embedded server, and the
roll-up that ingest starts in the background."""

from __future__ import annotations

import http
import json
from collections.abc import Iterator

import pytest

from spool_reporter.collector import FORGET_PATH, Collector, Policy, Retention, make_app, serve, stats
from spool_reporter.collector._common import FORGET_REFUSED
from spool_reporter.collector._rollup import rollup
from spool_reporter.collector._weeks import week_of_valid
from spool_reporter.collector._wire import FORGET_MAX_BODY_BYTES

from support.collector_server import call_wsgi, post
from support.events import CLOCK, DAY, POLICY, ROLLUP_MAX_AGE, ROLLUP_NOW, batch, det_uuid4, event, row
from support.polling import wait_for

JSON = {"CONTENT_TYPE": "application/json"}


@pytest.fixture
def app(db_url: str) -> Iterator[Collector]:
    application = make_app(db_url, policy=POLICY, retention=Retention(rollup_every=0))
    try:
        yield application
    finally:
        application.store.close()


def forget(app: Collector, body: bytes, **headers: str) -> tuple[str, bytes]:
    return call_wsgi(app, "POST", FORGET_PATH, body, {**JSON, "CONTENT_LENGTH": str(len(body)), **headers})


def client_body(client: object) -> bytes:
    return json.dumps({"client_id": det_uuid4("client", client)}).encode()


def test_forget_deletes_every_event_of_one_client(app: Collector) -> None:
    events = [event(client=c, when=f"2026-12-0{d}T10:00:00Z") for c in ("alice", "bob") for d in range(1, 9)]
    events += [event(client="alice", when="2026-12-15T10:00:00Z", name="runserver") for _ in range(3)]
    body = batch(events)
    assert call_wsgi(app, "POST", "/v1/batch", body, {**JSON, "CONTENT_LENGTH": str(len(body))})[0] == "200 OK"
    assert app.store.count() == (19, 2)
    assert forget(app, client_body("alice")) == ("200 OK", b'{"deleted": 11}')
    assert app.store.count() == (8, 1)
    assert forget(app, client_body("alice")) == ("200 OK", b'{"deleted": 0}')  # nothing left: still a 200
    assert forget(app, client_body("nobody")) == ("200 OK", b'{"deleted": 0}')
    assert app.counters.forgotten == 11
    assert {w.developers for w in stats(app.store).weeks} == {1}  # bob alone
    with app.store.reading() as reader:
        left = reader.query("SELECT COUNT(*) FROM client_weeks WHERE client_id = ?", (det_uuid4("client", "alice"),))
    assert left == [(0,)]
    # Her id stays forgotten: a batch that was in flight, or a spool that still held her events, brings nothing
    # back (the client starts over with a new id). Counted where the operator looks, as `forgotten`.
    again = batch([event(client="alice", when="2026-12-15T11:00:00Z") for _ in range(2)])
    assert call_wsgi(app, "POST", "/v1/batch", again, {**JSON, "CONTENT_LENGTH": str(len(again))})[1] == (
        b'{"accepted": 0, "duplicates": 0, "rejected": 2, "refused": {"forgotten": 2}}'
    )
    assert app.store.count() == (8, 1)
    assert {reason: n for week in app.store.refusals().values() for reason, n in week.items()} == {"forgotten": 2}
    # A new id (what the client takes after a forget) is counted as anyone.
    fresh = batch([event(client="alice-new", when="2026-12-15T11:00:00Z")])
    assert call_wsgi(app, "POST", "/v1/batch", fresh, {**JSON, "CONTENT_LENGTH": str(len(fresh))})[1].startswith(
        b'{"accepted": 1'
    )


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"", "400 Bad Request", id="empty"),
        pytest.param(b"not json", "400 Bad Request", id="not-json"),
        pytest.param(b'{"client_id": "5d1c0c8e-7c53-1a35-9a3e-a5b0d7e0e1f2"}', "400 Bad Request", id="uuid1"),
        pytest.param(b'{"client_id": "5D1C0C8E-7C53-4A35-9A3E-A5B0D7E0E1F2"}', "400 Bad Request", id="upper-case"),
        pytest.param(b'{"client_id": 5}', "400 Bad Request", id="number"),
        pytest.param(b'["5d1c0c8e-7c53-4a35-9a3e-a5b0d7e0e1f2"]', "400 Bad Request", id="list"),
        pytest.param(
            b'{"client_id": "5d1c0c8e-7c53-4a35-9a3e-a5b0d7e0e1f2", "also": 1}', "400 Bad Request", id="more-keys"
        ),
        pytest.param(
            b'{"client_id": "5d1c0c8e-7c53-4a35-9a3e-a5b0d7e0e1f2", '
            b'"client_id": "5d1c0c8e-7c53-4a35-9a3e-a5b0d7e0e1f3"}',
            "400 Bad Request",
            id="duplicate-key",
        ),
        pytest.param(
            b'{"client_id": "' + b" " * FORGET_MAX_BODY_BYTES + b'"}', f"413 {http.HTTPStatus(413).phrase}", id="huge"
        ),
    ],
)
def test_forget_refuses_what_is_not_one_client_id(app: Collector, body: bytes, status: str) -> None:
    events = [event(client="alice")]
    ingest = batch(events)
    call_wsgi(app, "POST", "/v1/batch", ingest, {**JSON, "CONTENT_LENGTH": str(len(ingest))})
    got, reason = forget(app, body)
    assert got == status
    assert b"5d1c0c8e" not in reason  # never echoed
    assert app.store.count() == (1, 1)
    week = week_of_valid("2027-01-06T00:00:00Z")
    assert app.store.refusals() == {week: {FORGET_REFUSED: 1}}  # counted for the operator, with nothing of the body
    assert app.counters.rejected == 1


def test_forget_takes_post_json_only(app: Collector) -> None:
    assert call_wsgi(app, "GET", FORGET_PATH, b"", {})[0] == "405 Method Not Allowed"
    body = client_body("alice")
    plain = {"CONTENT_TYPE": "text/plain", "CONTENT_LENGTH": str(len(body))}
    assert call_wsgi(app, "POST", FORGET_PATH, body, plain)[0] == "415 Unsupported Media Type"
    assert call_wsgi(app, "POST", FORGET_PATH, body, JSON)[0] == "411 Length Required"
    # The 415 and the 411 are forget requests refused; the GET was not one.
    assert app.store.refusals() == {week_of_valid("2027-01-06T00:00:00Z"): {FORGET_REFUSED: 2}}


def test_forget_leaves_the_rollups_alone(app: Collector) -> None:
    """A closed week's numbers are final: they hold no client id, so a forget cannot reach them."""
    store = app.store
    store.insert([row(("dev", i), ROLLUP_NOW - 40 * DAY) for i in range(12)])  # 2027-W03: closed at ROLLUP_NOW
    store.insert([row(("dev", i), ROLLUP_NOW - DAY) for i in range(12)])  # 2027-W09: open
    rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    before = {w.week: w.developers for w in stats(store).weeks}
    assert before == {"2027-W03": 12, "2027-W09": 12}
    assert forget(app, client_body(("dev", 0))) == ("200 OK", b'{"deleted": 2}')  # its raw rows, both weeks
    after = {w.week: w.developers for w in stats(store).weeks}
    assert after == {"2027-W03": 12, "2027-W09": 11}


def test_forget_through_a_real_server(db_url: str) -> None:
    with serve(db_url, policy=POLICY) as server:
        assert post(server.url, batch([event(client="carol") for _ in range(3)]))[0] == 200
        url = server.url.replace("/v1/batch", FORGET_PATH)
        assert post(url, client_body("carol")) == (200, b'{"deleted": 3}')
        assert post(url, b'{"client_id": "x"}')[0] == 400
        assert server.app.store.count() == (0, 0)


# -- the roll-up that ingest starts ---------------------------------------------------------------------------


def test_ingest_starts_a_rollup_in_the_background(db_url: str) -> None:
    clock = [CLOCK]
    policy = Policy(commands=POLICY.commands, max_age=ROLLUP_MAX_AGE, clock=lambda: clock[0])
    app = make_app(db_url, policy=policy, retention=Retention(rollup_every=3600))
    try:
        body = batch([event(client=i, when="2026-12-28T10:00:00Z") for i in range(3)])  # 2026-W53
        headers = {**JSON, "CONTENT_LENGTH": str(len(body))}
        assert call_wsgi(app, "POST", "/v1/batch", body, headers)[0] == "200 OK"
        assert app.wait_rollup(60)
        assert app.store.rollup_state().closed_through < "2026-W53"  # not closed yet at CLOCK
        clock[0] = CLOCK + 40 * DAY  # the week is closed now; the next batch does not start another yet
        late = batch([event(client="late", when="2027-02-10T10:00:00Z", valid=False)])
        assert call_wsgi(app, "POST", "/v1/batch", late, {**JSON, "CONTENT_LENGTH": str(len(late))})[0] == "200 OK"
        assert app.wait_rollup(60)
        assert app.store.rollup_state().closed_through < "2026-W53"
        app._next_rollup = 0.0  # an hour later
        assert call_wsgi(app, "POST", "/v1/batch", late, {**JSON, "CONTENT_LENGTH": str(len(late))})[0] == "200 OK"
        wait_for(lambda: app.store.rollup_state().rolled_through >= "2026-W53", timeout=60)
        assert app.wait_rollup(60)
        assert stats(app.store).as_dict() == stats(app.store, rollups=False).as_dict()
    finally:
        app.store.close()


def test_no_background_rollup_when_off(db_url: str) -> None:
    clock = [CLOCK + 40 * DAY]
    policy = Policy(commands=POLICY.commands, max_age=ROLLUP_MAX_AGE, clock=lambda: clock[0])
    app = make_app(db_url, policy=policy, retention=Retention(rollup_every=0))
    try:
        app.store.insert([row(("old", 1), CLOCK - 3 * DAY)])
        body = batch([event(client="new", when="2027-02-10T10:00:00Z", valid=False)])
        assert call_wsgi(app, "POST", "/v1/batch", body, {**JSON, "CONTENT_LENGTH": str(len(body))})[0] == "200 OK"
        assert app.wait_rollup(1)
        assert app.store.rollup_state() == ("", "")
        done = app.rollup()  # what `collector rollup` does, with this collector's clock and window
        assert done.rolled == ("2026-W53",)  # Sunday 2027-01-03 is in ISO week 2026-W53
    finally:
        app.store.close()


def test_a_rollup_after_close_ends_quietly(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(db_url, policy=POLICY)
    app.store.close()
    app._background_rollup()  # what the thread does when the application shut down under it
    assert caplog.records == []
