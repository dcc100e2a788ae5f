"""The self-hosted collector in one process: wire format, store, statistics, report, forwarding, and a
real embedded server on a loopback port (in a thread). ``test_collector_processes.py`` runs it as a real
subprocess with concurrent client processes."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import io
import json
import logging
import socket
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spool_reporter._event import DJANGO_COMMANDS, FIELDS, validate
from spool_reporter.collector import (
    MAX_BODY_BYTES,
    MAX_EVENTS,
    CollectorError,
    CollectorServer,
    GA4Forwarder,
    Policy,
    make_app,
    open_store,
    render_html,
    serve,
    stats,
)
from spool_reporter.collector._weeks import iso_week
from spool_reporter.collector._wire import BadRequest, parse_batch, parse_ga4

from support.collector_server import HTTP, FakeGA4, call_wsgi, post
from support.events import (
    CLOCK,
    FORWARDED_FOR,
    GA4_NOW,
    JSON_VALUES,
    MARKER,
    POLICY,
    PROBE_UA,
    assert_private,
    batch,
    db_bytes,
    det_uuid4,
    event,
    probe_headers,
    rows_of,
    store_sample_events,
)
from support.polling import wait_for

pytestmark = pytest.mark.usefixtures("close_every_store")


# -- a database and an embedded server ----------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "collector.sqlite3"


@pytest.fixture
def server(db: Path) -> Iterator[CollectorServer]:
    srv = serve(db, policy=POLICY).start()
    try:
        yield srv
    finally:
        srv.stop()


# -- the wire format ----------------------------------------------------------------------------------------


def test_parse_accepts_a_valid_batch() -> None:
    events = [event(client=i) for i in range(3)]
    rows = rows_of(batch(events))
    assert [r[0] for r in rows] == [e["event_id"] for e in events]
    assert rows[0][-1] == "2026-W49"
    assert "user_agent" not in str(rows)  # dropped: derivable, and free text
    assert all(e["user_agent"] not in r for e in events for r in rows)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"", "not JSON", id="empty"),
        pytest.param(b"\xff\xfe", "not JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", "not a JSON object", id="list"),
        pytest.param(b'{"schema": 1}', "exactly the keys", id="no-events"),
        pytest.param(b'{"schema": 2, "events": []}', "unsupported schema", id="schema-2"),
        pytest.param(b'{"schema": true, "events": []}', "unsupported schema", id="schema-true"),
        pytest.param(b'{"schema": 1, "events": {}}', "not a list", id="events-object"),
        pytest.param(b'{"schema": 1, "events": [], "ip": "1.2.3.4"}', "exactly the keys", id="extra-key"),
        pytest.param(b'{"schema": 1, "schema": 1, "events": []}', "duplicate key", id="duplicate-key"),
        pytest.param(b'{"schema": NaN, "events": []}', "not JSON", id="nan"),
        pytest.param(b"[" * 100_000, "not JSON", id="deep"),
    ],
)
def test_parse_refuses_garbage(body: bytes, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        parse_batch(body)


def test_each_event_is_judged_on_its_own() -> None:
    good = event()
    cases = {
        "shape": [
            {**good, "remote_addr": "127.0.0.1"},
            {k: v for k, v in good.items() if k != "time"},
            [good],
            "startproject",
            {**good, "os": 5},
        ],
        "schema": [{**good, "schema": True}, {**good, "schema": 2}],
        "event_id": [{**good, "event_id": "not-a-uuid"}],
        "time": [
            {**good, "time": when}
            for when in (
                "2026-02-30T00:00:00Z",
                "2026-12-03T24:00:00Z",
                "2026-12-03 08:15:48Z",
                "\uff12\uff10\uff126-12-03T08:15:48Z",
            )
        ],
        "too_old": [{**good, "time": "2026-10-01T00:00:00Z"}],
        "future": [{**good, "time": "9999-12-31T23:59:59Z"}, {**good, "time": "2027-01-07T00:00:01Z"}],
        "app_version": [event(app_version=v, valid=False) for v in ("7777.1", "5.2.1", "05.2", "5.x", "\u0665.2")],
        "os": [event(os_name=v, valid=False) for v in ("<script>", "Linu\u0445", "Linux; DROP TABLE events")],
        "python": [event(python="Jython", valid=False)],
        "python_version": [event(python_version=v, valid=False) for v in ("3", "13.0", "3.100")],
        "arch": [event(arch="mips", valid=False)],
        "command": [event(name="migrate", valid=False)],
        "app": [event(app="Unknown", valid=False), event(app="Djang\u043e", valid=False)],
        "user_agent": [{**good, "user_agent": "Django/5.2 CPython/3.11 (Linux; x86_64) <b>"}],
    }
    bad = [obj for objs in cases.values() for obj in objs]
    parsed = parse_batch(batch([good, *bad, event()]), POLICY)
    assert [r[0] for r in parsed.rows] == [good["event_id"], parsed.rows[1][0]]  # both neighbours kept
    assert parsed.refused == {reason: len(objs) for reason, objs in cases.items()}
    with pytest.raises(BadRequest, match="too many events"):
        rows_of(batch([good] * (MAX_EVENTS + 1)))


@pytest.mark.parametrize(
    ("when", "week"),
    [
        ("2026-12-03T08:15:48Z", "2026-W49"),
        ("2026-12-31T23:59:59Z", "2026-W53"),
        ("2027-01-03T12:00:00Z", "2026-W53"),  # a Sunday: still the last ISO week of 2026
        ("2027-01-04T00:00:00Z", "2027-W01"),
        ("2024-12-30T00:00:00Z", "2025-W01"),  # a Monday that belongs to the next ISO year
        ("2016-12-31T23:59:60Z", "2016-W52"),  # a leap second
    ],
)
def test_iso_week(when: str, week: str) -> None:
    assert iso_week(when) == week


@pytest.mark.parametrize("parse", [parse_batch, parse_ga4], ids=["batch", "ga4"])
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_parse_bytes(parse: Callable[[bytes], object], body: bytes) -> None:
    with contextlib.suppress(BadRequest):
        parse(body)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_fuzz_parse_json(doc: object) -> None:
    try:
        parsed = parse_batch(json.dumps(doc).encode(), POLICY)
    except BadRequest:
        return
    assert parsed.rows == []  # hypothesis cannot build a valid event here: only refusals, by reason
    assert set(parsed.refused) <= {"shape", "schema"}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), JSON_VALUES | st.text(max_size=120))
def test_fuzz_one_field(field: str, value: object) -> None:
    bad = {**event(), field: value}
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        with pytest.raises(BadRequest, match="not JSON"):  # json.dumps wrote Infinity: not a batch
            parse_batch(batch([bad]), POLICY)
        return
    parsed = parse_batch(batch([bad]), POLICY)  # a well-formed batch: never a BadRequest
    assert len(parsed.rows) + parsed.rejected == 1
    assert (len(parsed.rows) == 1) == (
        validate(bad, now=CLOCK, max_age=POLICY.max_age, commands=DJANGO_COMMANDS) is not None
    )


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> object:
    return make_app(tmp_path_factory.mktemp("fuzz") / "c.sqlite3", policy=POLICY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["POST", "GET", "PUT", "HEAD", "DELETE", "post"]),
    path=st.sampled_from(["/v1/batch", "/", "/v1/batch/", "/mp/collect", "/v1/health", "/v1/stats", "/v1/forget"])
    | st.text(max_size=10),
    content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", ""]),
    length=st.none() | st.sampled_from(["", "-1", "abc", "99999999999999999999", "0"]) | st.integers(0, 10**9).map(str),
    encoding=st.none() | st.sampled_from(["gzip", "identity"]),
    body=st.binary(max_size=300),
)
def test_fuzz_wsgi_app(
    fuzz_app: object, method: str, path: str, content_type: str, length: str | None, encoding: str | None, body: bytes
) -> None:
    headers = {"CONTENT_TYPE": content_type}
    headers["CONTENT_LENGTH"] = str(len(body)) if length is None else length
    if encoding:
        headers["HTTP_CONTENT_ENCODING"] = encoding
    status, out = call_wsgi(fuzz_app, method, path, body, headers)
    code = int(status.split()[0])
    public = code == 200 and method == "GET" and (path or "/") in ("/", "/v1/stats")  # an empty PATH_INFO is "/"
    ok = (
        public
        or (code == 200 and path in ("/v1/batch", "/v1/health", "/v1/forget"))
        or (code == 204 and path == "/mp/collect")
    )
    assert 400 <= code < 500 or ok, (status, out)


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "code"),
    [
        pytest.param("GET", "/v1/health", {}, b"", 200, id="200"),
        pytest.param("POST", "/v1/batch", {"CONTENT_TYPE": "application/json"}, b"[", 400, id="400"),
        pytest.param("GET", "/nowhere", {}, b"", 404, id="404"),
        pytest.param("GET", "/v1/batch", {}, b"", 405, id="405"),
        pytest.param("POST", "/v1/batch", {"CONTENT_TYPE": "application/json"}, b"{}", 411, id="411"),
        pytest.param("POST", "/v1/forget", {"CONTENT_TYPE": "application/json"}, b" " * 4096, 413, id="413"),
        pytest.param("POST", "/v1/batch", {"CONTENT_TYPE": "text/plain"}, b"{}", 415, id="415"),
    ],
)
def test_status_lines_are_the_ones_http_names(
    fuzz_app: object, method: str, path: str, headers: dict[str, str], body: bytes, code: int
) -> None:
    # The same words the embedded server puts on its own answers, and on the application's.
    if code != 411:
        headers = {**headers, "CONTENT_LENGTH": str(len(body))}
    assert call_wsgi(fuzz_app, method, path, body, headers)[0] == f"{code} {http.HTTPStatus(code).phrase}"


def test_wsgi_without_length(tmp_path: Path) -> None:
    app = make_app(tmp_path / "c.sqlite3", policy=POLICY)
    body = batch([event()])
    status, _ = call_wsgi(app, "POST", "/v1/batch", body, {"CONTENT_TYPE": "application/json"})
    assert status.startswith("411")
    # A server that delimits the stream itself (gunicorn, chunked) may omit the length; the cap still holds.
    headers = {"CONTENT_TYPE": "application/json", "wsgi.input_terminated": True}
    status, out = call_wsgi(app, "POST", "/v1/batch", body, headers)  # type: ignore[arg-type]
    assert status.startswith("200"), out
    status, out = call_wsgi(app, "POST", "/v1/batch", b" " * (MAX_BODY_BYTES + 10), headers)  # type: ignore[arg-type]
    assert status.startswith("413"), out


def test_wsgi_module_from_environ(tmp_path: Path) -> None:
    from spool_reporter.collector import wsgi

    with pytest.raises(CollectorError):
        wsgi.from_environ({})
    app = wsgi.from_environ({wsgi.DB_VARIABLE: str(tmp_path / "c.sqlite3")})
    assert app.forward is None
    status, _ = call_wsgi(app, "GET", "/v1/health", b"", {})
    assert status.startswith("200")


# -- the store ----------------------------------------------------------------------------------------------


def test_store_deduplicates_and_reports_new_rows(db: Path) -> None:
    store = open_store(db)
    rows = rows_of(batch([event(client=i) for i in range(5)]))
    assert store.insert(rows)[0] == 5
    added, new, _ = store.insert([*rows[:2], *rows_of(batch([event(client="x")])) * 2], want_new=True)
    assert added == 1
    assert len(new) == 1
    assert new[0][9] == det_uuid4("client", "x")
    assert store.count() == (6, 6)
    store.close()
    assert open_store(db, create=False).count() == (6, 6)


def test_store_refuses_to_create_for_reading(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match="no collector database"):
        stats(tmp_path / "missing.sqlite3")
    assert not (tmp_path / "missing.sqlite3").exists()
    (tmp_path / "junk.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(CollectorError, match="cannot open"):
        stats(tmp_path / "junk.sqlite3")


def test_store_is_wal(db: Path) -> None:
    store = open_store(db)
    with store.connection() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# -- statistics and the report ------------------------------------------------------------------------------


def test_stats_over_weeks(db: Path) -> None:
    store_sample_events(db)
    result = stats(db)
    doc = result.as_dict()
    assert doc["developers"] == 4
    assert doc["events"] == 7
    weeks = {w["week"]: w for w in doc["weeks"]}  # type: ignore[attr-defined]
    assert list(weeks) == ["2026-W49", "2026-W50", "2027-W01"]
    w49, w50, w01 = weeks["2026-W49"], weeks["2026-W50"], weeks["2027-W01"]
    assert (w49["developers"], w49["events"]) == (2, 3)
    assert w49["by_django"] == {"4.2": 1, "5.2": 1}
    assert w49["by_python"] == {"CPython 3.11": 1, "CPython 3.12": 1}
    assert w49["by_os"] == {"Linux": 1, "macOS": 1}
    assert w49["by_event"] == {"startproject": 2, "runserver": 1}
    assert (w50["developers"], w50["events"]) == (2, 3)
    assert w50["by_django"] == {"5.2": 2, "6.0": 1}  # alice under both versions, and carol
    assert w50["by_python"] == {"CPython 3.11": 1, "PyPy 3.10": 1}
    assert w50["by_os"] == {"Linux": 1, "Windows": 1}
    assert (w01["developers"], w01["by_event"]) == (1, {"startapp": 1})
    other = stats(db, app="MyTool").as_dict()
    assert other["developers"] == 1
    assert other["weeks"][0]["by_django"] == {"1.4": 1}
    assert stats(db, app="Nothing").as_dict() == {
        "app": "Nothing", "developers": 0, "events": 0, "weeks": [], "refused": {}
    }  # fmt: skip


def test_html_report(db: Path) -> None:
    store_sample_events(db)
    store = open_store(db)
    # The collector refuses such a value now; a database written by an older one may still hold it.
    hostile = event(client="mallory", when="2026-12-08T00:00:00Z", os_name='<script>alert("x")</script>&', valid=False)
    (row,) = rows_of(batch([{**hostile, "os": "Linux", "user_agent": "Django/5.2 CPython/3.11 (Linux; x86_64)"}]))
    store.insert([(*row[:6], str(hostile["os"]), *row[7:])])  # type: ignore[list-item]
    store.close()
    result = stats(db)
    page = render_html(result, generated=datetime.datetime(2027, 1, 6, tzinfo=datetime.timezone.utc))
    root = ET.fromstring(page)  # well-formed (it is also valid HTML5)
    ns = "{http://www.w3.org/2000/svg}"
    svg = root.find(f".//{ns}svg")
    assert svg is not None
    points = svg.findall(f"{ns}circle")
    # 2026-W49 .. 2027-W01 is six weeks; the three without events are drawn as zeros (full numbers)
    titles = [point.findtext(f"{ns}title") for point in points]
    assert titles == [
        "2026-W49: 2 developers",
        "2026-W50: 3 developers",
        "2026-W51: 0 developers",
        "2026-W52: 0 developers",
        "2026-W53: 0 developers",
        "2027-W01: 1 developer",
    ]
    text = "".join(root.itertext())
    assert "5 developers in all" in " ".join(text.split()).replace("5developers", "5 developers")
    assert '<script>alert("x")</script>&' in text  # shown as text ...
    assert "<script" not in page  # ... never as markup
    assert "&lt;script&gt;" in page
    # self-contained: nothing loads from elsewhere
    for needle in ("src=", "href=", "@import", "url("):
        assert needle not in page
    assert page.count("http") == page.count("http://www.w3.org/2000/svg") + page.count("http-equiv")


def test_html_report_empty(db: Path) -> None:
    open_store(db).close()
    page = render_html(stats(db))
    ET.fromstring(page)
    assert "No events" in page


# -- a real server on a loopback port -----------------------------------------------------------------------


def test_server_accepts_and_deduplicates(server: CollectorServer, db: Path) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}/v1/batch"
    events = [event(client=i % 7) for i in range(MAX_EVENTS)]
    body = batch(events)
    assert post(server.url, body) == (200, b'{"accepted": 500, "duplicates": 0, "rejected": 0, "refused": {}}')
    assert post(server.url, body) == (200, b'{"accepted": 0, "duplicates": 500, "rejected": 0, "refused": {}}')
    half = batch(events[:250] + [event(client="new") for _ in range(3)])
    status, answer = post(server.url, half)
    assert (status, json.loads(answer)) == (200, {"accepted": 3, "duplicates": 250, "rejected": 0, "refused": {}})
    assert post(server.url, batch([])) == (200, b'{"accepted": 0, "duplicates": 0, "rejected": 0, "refused": {}}')
    assert server.app.counters.as_dict() == {
        "requests": 4, "accepted": 503, "duplicates": 750, "rejected": 0, "refused": 0, "forward_dropped": 0,
        "forgotten": 0,
    }  # fmt: skip
    assert server.app.store.count() == (503, 8)


def test_server_refuses_invalid_input(server: CollectorServer) -> None:
    url = server.url
    assert post(url, b"{nope")[0] == 400
    status, answer = post(url, batch([{**event(), "ip": "1.2.3.4"}, event()]))
    assert (status, json.loads(answer)) == (
        200,
        {"accepted": 1, "duplicates": 0, "rejected": 1, "refused": {"shape": 1}},
    )
    assert post(url, batch([event()] * (MAX_EVENTS + 1)))[0] == 400
    assert post(url, b'{"schema": 1, "events": []}', {"Content-Type": "text/plain"})[0] == 415
    assert post(url, b'{"schema": 1, "events": []}', {"Content-Encoding": "gzip"})[0] == 415
    status, reason = post(url, b"[" + b" " * MAX_BODY_BYTES + b"]")
    assert status == 413
    assert b"larger than" in reason
    response = HTTP.request("GET", url)
    assert (response.status, response.headers["Allow"]) == (405, "POST")
    assert HTTP.request("GET", url.replace("/v1/batch", "/nowhere")).status == 404
    assert HTTP.request("POST", url.replace("/v1/batch", "/v1/batchx"), body=b"{}").status == 404
    assert HTTP.request("GET", url.replace("/v1/batch", "/v1/health")).data == b'{"ok": true}'
    assert server.app.store.count() == (1, 1)
    assert server.app.store.refusals() == {"2027-W01": {"shape": 1}}


def _raw(server: CollectorServer, data: bytes, *, shutdown: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        for _ in range(1000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_server_checks_length_before_reading(server: CollectorServer) -> None:
    # Declares 10 MB and sends none of it: the answer comes at once, without waiting for the body.
    started = time.monotonic()
    answer = _raw(server, b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 10000000\r\n\r\n")  # fmt: skip
    assert answer.startswith(b"HTTP/1.0 413 ")
    assert time.monotonic() - started < 5
    # A body shorter than its length (the client hung up) is refused, not half-parsed.
    answer = _raw(server, b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{\"schema\"", shutdown=True)  # fmt: skip
    assert answer.startswith(b"HTTP/1.0 400 ")
    assert _raw(server, b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n").startswith(
        b"HTTP/1.0 411 "
    )
    assert _raw(server, b"\x16\x03\x01 garbage, perhaps TLS\r\n\r\n").startswith(b"HTTP/1.0 400 ")


def test_server_with_concurrent_threads(server: CollectorServer) -> None:
    # 8 threads x 6 batches x 50 events; every event id is sent by two threads.
    threads, batches, size = 8, 6, 50
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        try:
            for b in range(batches):
                events = [event(event_id=det_uuid4("conc", t // 2, b, i), client=(t // 2, i % 5)) for i in range(size)]
                status, answer = post(server.url, batch(events))
                assert status == 200
                doc = json.loads(answer)
                with lock:
                    results.append((doc["accepted"], doc["duplicates"]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors
    assert len(results) == threads * batches
    distinct = threads // 2 * batches * size
    assert sum(a for a, _ in results) == distinct
    assert sum(d for _, d in results) == threads * batches * size - distinct
    assert server.app.store.count() == (distinct, threads // 2 * 5)


def test_server_stores_and_logs_no_address_or_header(
    server: CollectorServer, db: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    events = [event(client=i) for i in range(20)]
    assert post(server.url, batch(events), probe_headers())[0] == 200
    assert post(server.url, batch(events), probe_headers())[0] == 200
    assert post(server.url, b"garbage", probe_headers())[0] == 400
    assert HTTP.request("GET", server.url, headers=probe_headers()).status == 405
    _raw(server, f"BROKEN {MARKER}\r\nUser-Agent: {PROBE_UA}\r\n\r\n".encode())
    _raw(server, b"POST /v1/batch HTTP/1.1\r\nContent-Length: 50\r\n\r\n{", shutdown=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:  # hang up mid-request
        sock.sendall(b"POST /v1/batch HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 900\r\n\r\n{")
    assert HTTP.request("GET", server.url.replace("/v1/batch", "/v1/health")).status == 200
    assert_private(db_bytes(db))  # while running: the WAL holds the recent writes
    server.stop()
    assert_private(db_bytes(db))
    out, err = capfd.readouterr()
    assert_private((out + err).encode())
    server_side = [r.getMessage() for r in caplog.records if not r.name.startswith("urllib3")]  # the test's client
    assert_private("\n".join(server_side).encode())
    assert err == ""  # no access log at all


def test_server_prints_nothing_when_the_app_fails(db: Path, capfd: pytest.CaptureFixture[str]) -> None:
    class Broken:
        forward = None
        store = open_store(db)

        def __call__(self, environ: object, start_response: object) -> list[bytes]:
            raise RuntimeError(f"boom {MARKER}")

    with CollectorServer(Broken(), port=0).start() as srv:  # type: ignore[arg-type]
        assert post(srv.url, batch([event()]), probe_headers())[0] == 500
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


# -- forwarding to GA4 (a loopback fake, never Google) -----------------------------------------------------


@pytest.fixture
def fake_ga4() -> Iterator[FakeGA4]:
    fake = FakeGA4()
    thread = threading.Thread(target=fake.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.shutdown()
        fake.server_close()
        thread.join(5)


def test_forward_to_ga4(db: Path, fake_ga4: FakeGA4) -> None:
    endpoint = f"http://127.0.0.1:{fake_ga4.server_address[1]}/mp/collect"
    forward = GA4Forwarder(measurement_id="G-TEST123", api_secret="s3cret", endpoint=endpoint, clock=lambda: GA4_NOW)
    policy = Policy(commands={"Django": DJANGO_COMMANDS | {"session_start"}}, clock=lambda: GA4_NOW)
    with serve(db, forward=forward, policy=policy) as srv:
        recent = [event(client=i % 2, when="2026-12-03T08:15:48Z") for i in range(60)]
        stale = [event(client=9, when="2026-11-20T00:00:00Z")]
        reserved = [event(client=9, name="session_start", valid=False)]
        assert post(srv.url, batch(recent + stale + reserved), probe_headers())[0] == 200
        assert post(srv.url, batch(recent), probe_headers()) == (
            200,
            b'{"accepted": 0, "duplicates": 60, "rejected": 0, "refused": {}}',
        )
        wait_for(lambda: forward.stats()["sent"] + forward.stats()["failed"] >= 60)
    assert forward.stats() == {"sent": 60, "failed": 0, "stale": 2, "dropped": 0, "requests": 4}
    paths = {path for path, _ in fake_ga4.received}
    assert paths == {"/mp/collect?measurement_id=G-TEST123&api_secret=s3cret"}
    payloads = [doc for _, doc in fake_ga4.received]
    assert sorted(len(p["events"]) for p in payloads) == [5, 5, 25, 25]  # type: ignore[arg-type]
    item = payloads[0]["events"][0]  # type: ignore[index]
    assert item == {
        "name": "startproject",
        "params": {"app": "Django", "app_version": "5.2", "python": "CPython", "python_version": "3.11",
                   "os": "Linux", "os_release": "6.1", "arch": "x86_64"},
        "timestamp_micros": 1796285748 * 1_000_000,
    }  # fmt: skip
    assert {p["client_id"] for p in payloads} == {det_uuid4("client", 0), det_uuid4("client", 1)}
    # Google would see the collector, never the client's request headers.
    assert_private(json.dumps(payloads).encode())
    headers = "".join(fake_ga4.headers_seen)
    assert PROBE_UA not in headers
    assert MARKER not in headers
    assert FORWARDED_FOR not in headers


def test_forward_failures_are_counted(db: Path, fake_ga4: FakeGA4) -> None:
    fake_ga4.status = 500
    endpoint = f"http://127.0.0.1:{fake_ga4.server_address[1]}/mp/collect"
    forward = GA4Forwarder(measurement_id="G-1", api_secret="s", endpoint=endpoint, clock=lambda: GA4_NOW)
    assert forward.submit(rows_of(batch([event()])))
    forward.close(10)
    assert forward.stats()["failed"] == 1
    assert not forward.submit(rows_of(batch([event()])))  # closed
    # Nothing listens on a freshly closed port: a connection error is a failure, not an exception.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/mp/collect"
    forward = GA4Forwarder(measurement_id="G-1", api_secret="s", endpoint=dead, clock=lambda: GA4_NOW, queue_events=3)
    assert not forward.submit(rows_of(batch([event() for _ in range(4)])))  # over the queue's bound
    assert forward.submit(rows_of(batch([event()])))
    forward.close(10)
    assert forward.stats() == {"sent": 0, "failed": 1, "stale": 0, "dropped": 4, "requests": 1}


@pytest.mark.parametrize("url", ["http://www.google-analytics.com/mp/collect", "ftp://x/", "not a url", "https://"])
def test_forward_endpoint_must_be_https(url: str) -> None:
    with pytest.raises(CollectorError):
        GA4Forwarder(measurement_id="G-1", api_secret="s", endpoint=url)


def test_http_client_sees_no_keepalive_surprises(server: CollectorServer) -> None:
    # http.client (no urllib3) with HTTP/1.1: the answer is complete and the body length is right.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/v1/batch", body=batch([event()]), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (
            200,
            b'{"accepted": 1, "duplicates": 0, "rejected": 0, "refused": {}}',
        )
        assert response.getheader("Server") == "spool-reporter-collector"
    finally:
        conn.close()


def test_embedded_server_hands_the_app_no_address_or_header(db: Path) -> None:
    from spool_reporter.collector import Collector

    seen: list[dict[str, object]] = []

    class Spy(Collector):
        def __call__(self, environ, start_response):  # type: ignore[no-untyped-def]
            seen.append(dict(environ))
            return super().__call__(environ, start_response)

    with CollectorServer(Spy(open_store(db)), port=0).start() as srv:
        assert post(srv.url, batch([event()]), {**probe_headers(), "Content-Encoding": "identity"})[0] == 200
    (environ,) = seen
    assert "REMOTE_ADDR" not in environ
    assert "REMOTE_HOST" not in environ
    assert sorted(k for k in environ if k.startswith("HTTP_")) == ["HTTP_CONTENT_ENCODING"]
    assert_private(repr({k: v for k, v in environ.items() if k not in ("SERVER_NAME",)}).encode())


# -- the public names are written down (the direction of imports: the contracts in pyproject.toml) ---------------

REPO = Path(__file__).resolve().parents[2]


def test_the_public_names_are_written_down_once_each() -> None:
    # __all__, the package docstring's list and docs/public-api.md's table name the same public API, one line each.
    import re

    import spool_reporter.collector as package

    doc = package.__doc__ or ""
    block = doc.split("Public API", 1)[1].split("::\n\n", 1)[1].split("\n\n", 1)[0]
    listed = [re.match(r" {4}([A-Za-z_]\w*)", line).group(1) for line in block.splitlines()]  # type: ignore[union-attr]
    page = (REPO / "docs" / "public-api.md").read_text(encoding="utf-8")
    section = page.split("### The collector from Python", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([A-Za-z_]\w*)(?:\(\))?` \|", section, flags=re.MULTILINE)
    assert sorted(listed) == sorted(set(listed)) == sorted(package.__all__)
    assert sorted(documented) == sorted(set(documented)) == sorted(package.__all__)
    for name in package.__all__:
        assert getattr(package, name) is not None


def test_the_docs_list_every_route_and_no_other() -> None:
    """The endpoints table of ``docs/collector.md`` is the route table (``_wsgi.ROUTES``), in its order."""
    from spool_reporter.collector._wsgi import ROUTES

    text = (Path(__file__).resolve().parents[2] / "docs" / "collector.md").read_text(encoding="utf-8")
    table = text[text.index("(collector-endpoints)=") :].split("\n\n")[1]
    documented = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert documented == [f"{route.method} {route.path}" for route in ROUTES]


def test_each_route_takes_its_one_method(tmp_path: Path) -> None:
    """Every route answers another method ``405`` with its own in ``Allow``; a path outside the table ``404``."""
    from spool_reporter.collector._wsgi import ROUTES

    app = make_app(tmp_path / "c.sqlite3", policy=POLICY)

    def call(method: str, path: str) -> tuple[str, dict[str, str], bytes]:
        seen: list[tuple[str, list[tuple[str, str]]]] = []
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(b"")}
        body = b"".join(app(environ, lambda status, headers: seen.append((status, headers))))
        return seen[0][0], dict(seen[0][1]), body

    try:
        for route in ROUTES:
            other = "GET" if route.method == "POST" else "POST"
            status, headers, body = call(other, route.path)
            assert (status, headers.get("Allow"), body) == (
                "405 Method Not Allowed",
                route.method,
                f"use {route.method}\n".encode(),
            ), route.path
        assert call("GET", "/v1/nothing-here")[0] == "404 Not Found"
        assert call("GET", "/v1/health")[2] == b'{"ok": true}'
    finally:
        app.store.close()
