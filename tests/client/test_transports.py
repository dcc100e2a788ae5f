"""Destinations: settings resolution and each transport's wire format and limits (pure, no I/O)."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

import pytest

from spool_reporter import App, _event, _hook
from spool_reporter._net import is_loopback
from spool_reporter._settings import Destination, resolve, tuning
from spool_reporter.transports import ga4, transport_for, ua
from spool_reporter.transports import json as json_transport

NOW = 1_796_285_748.0  # 2026-12-03T08:15:48Z


def event(app: App, name: str = "startproject", *, when: float = NOW, client: str | None = None) -> dict[str, object]:
    line = _hook.build_line(app, name, client or _hook.uuid4(), when)
    valid = _event.validate(json.loads(line))
    assert valid is not None
    return valid


def dest(transport: str = "json", endpoint: str = "https://collector.example/v1/batch", **kw: str) -> Destination:
    return Destination(transport=transport, endpoint=endpoint, source="user", **kw)


# --- settings ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        pytest.param("https://collector.example/v1/batch", True, id="https"),
        pytest.param("http://127.0.0.1:8000/v1/batch", True, id="http-ipv4-loopback"),
        pytest.param("http://127.9.9.9/v1/batch", True, id="http-127/8"),
        pytest.param("http://[::1]:8000/v1/batch", True, id="http-ipv6-loopback"),
        pytest.param("http://localhost/v1/batch", True, id="http-localhost"),
        pytest.param("http://collector.example/v1/batch", False, id="http-remote"),
        pytest.param("http://10.0.0.1/v1/batch", False, id="http-private"),
        pytest.param("http://127.0.0.1.nip.io/", False, id="http-lookalike"),
        pytest.param("ftp://collector.example/", False, id="ftp"),
        pytest.param("https://user:pw@collector.example/", False, id="credentials"),
        pytest.param("https:///nohost", False, id="no-host"),
        pytest.param("https://collector.example:99999/", False, id="bad-port"),
        pytest.param("https://collector.example/x#frag", False, id="fragment"),
        pytest.param("https://collector.example/ x", False, id="space"),
    ],
)
def test_endpoint_validation(app: App, url: str, ok: bool) -> None:
    resolved = resolve(app, {app.env_endpoint: url}, read_files=False)
    assert (resolved.destination is not None) is ok, resolved.reason
    if not ok:
        assert resolved.reason


@pytest.mark.parametrize(
    ("host", "client", "collector"),
    [
        pytest.param("127.0.0.1", True, True, id="ipv4"),
        pytest.param("127.8.9.10", True, True, id="ipv4-net"),
        pytest.param("::1", True, True, id="ipv6"),
        pytest.param("[::1]", True, True, id="ipv6-brackets"),
        pytest.param("::ffff:127.0.0.1", True, True, id="ipv4-mapped"),
        pytest.param("[::ffff:7f00:1]", True, True, id="ipv4-mapped-hex"),
        pytest.param("localhost", True, True, id="localhost"),
        # Names the client pins to 127.0.0.1 itself; the collector would ask the system resolver.
        pytest.param("LOCALHOST", True, False, id="localhost-upper"),
        pytest.param("localhost.", True, False, id="localhost-dot"),
        pytest.param("collector.localhost", True, False, id="under-localhost"),
        pytest.param("128.0.0.1", False, False, id="other-ipv4"),
        pytest.param("::ffff:10.0.0.1", False, False, id="other-mapped"),
        pytest.param("::2", False, False, id="other-ipv6"),
        pytest.param("localhost.example", False, False, id="lookalike"),
        pytest.param("127.0.0.1.nip.io", False, False, id="lookalike-ip"),
        pytest.param("", False, False, id="empty"),
    ],
)
def test_loopback_hosts(host: str, client: bool, collector: bool) -> None:
    assert is_loopback(host, localhost_names=True) is client
    assert is_loopback(host) is collector


def test_no_endpoint_gives_a_reason(app: App) -> None:
    resolved = resolve(app, {}, read_files=False)
    assert resolved.destination is None
    assert app.env_endpoint in resolved.reason


def test_precedence_env_over_user_over_policy(app: App) -> None:
    user = {"endpoint": "https://user.example/v1/batch"}
    policy = {"endpoint": "https://policy.example/v1/batch", "transport": "json"}
    env = {app.env_endpoint: "https://env.example/v1/batch"}
    assert resolve(app, env, user=user, policy=policy, read_files=False).destination.endpoint.startswith(  # type: ignore[union-attr]
        "https://env."
    )
    got = resolve(app, {}, user=user, policy=policy, read_files=False).destination
    assert got is not None
    assert got.endpoint.startswith("https://user.")
    assert got.source == "user"
    got = resolve(app, {}, user={}, policy=policy, read_files=False).destination
    assert got is not None
    assert got.source == "policy"


def test_credentials_come_from_the_endpoints_file(app: App) -> None:
    # The user's own endpoint must not receive the distributor's GA4 secret.
    policy = {
        "endpoint": "https://g.example/mp/collect",
        "transport": "ga4",
        "measurement_id": "G-1",
        "api_secret": "s",
    }
    user = {"endpoint": "https://mine.example/mp/collect", "transport": "ga4"}
    resolved = resolve(app, {}, user=user, policy=policy, read_files=False)
    assert resolved.destination is None
    assert "measurement_id" in resolved.reason
    # With the endpoint from the environment, user then policy supply the rest.
    env = {app.env_endpoint: "https://g.example/mp/collect", app.env_transport: "ga4"}
    got = resolve(app, env, user={"api_secret": "u"}, policy=policy, read_files=False).destination
    assert got is not None
    assert (got.measurement_id, got.api_secret) == ("G-1", "u")


def test_transport_env_override_and_unknown(app: App) -> None:
    env = {app.env_endpoint: "https://x.example/batch", app.env_transport: "ua"}
    got = resolve(app, env, user={"tracking_id": "UA-1-1"}, read_files=False).destination
    assert got is not None
    assert got.transport == "ua"
    bad = resolve(app, {app.env_endpoint: "https://x.example/", app.env_transport: "carrier-pigeon"}, read_files=False)
    assert bad.destination is None
    assert "carrier-pigeon" in bad.reason


def test_broken_user_file_is_ignored_for_destination(app: App) -> None:
    from spool_reporter._hook import BROKEN

    assert resolve(app, {}, user=BROKEN, policy=None, read_files=False).destination is None


def test_resolve_reads_the_files(sandbox: object, app: App) -> None:
    from support.sandbox import Sandbox

    assert isinstance(sandbox, Sandbox)
    sandbox.write_policy(app, "endpoint=https://policy.example/v1/batch\n")
    env = {k: v for k, v in sandbox.env.items() if k != app.env_endpoint}  # the environment beats the files
    got = resolve(app, env).destination
    assert got is not None
    assert got.source == "policy"


def test_secret_is_redacted_everywhere() -> None:
    d = dest("ga4", "https://www.google-analytics.com/mp/collect", measurement_id="G-ABC", api_secret="s3cr3t")
    assert "s3cr3t" in d.request_url()
    assert "s3cr3t" not in d.redacted_url()
    assert "s3cr3t" not in repr(d)
    assert d.redacted_url().endswith("measurement_id=G-ABC&api_secret=REDACTED")


def test_destination_is_frozen_and_keyword_only() -> None:
    d = dest()
    with pytest.raises(AttributeError):
        d.endpoint = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Destination("json", "https://x/", "user")  # type: ignore[misc]


def test_tuning_can_only_shorten() -> None:
    t = tuning(
        {
            "SPOOL_REPORTER_FLUSH_DEADLINE": "1.5",
            "SPOOL_REPORTER_BACKOFF_BASE": "99999",
            "SPOOL_REPORTER_READ_TIMEOUT": "x",
        }
    )
    assert t.deadline == 1.5
    assert t.backoff_base == 60.0
    assert t.read_timeout == 10.0
    assert tuning({"SPOOL_REPORTER_FLUSH_DEADLINE": "0"}).deadline == 0.05
    assert tuning({"SPOOL_REPORTER_FLUSH_DEADLINE": "nan"}).deadline == 20.0


# --- json ----------------------------------------------------------------------------------------------


def test_json_batches_carry_events_as_is(app: App) -> None:
    events = [event(app) for _ in range(1201)]
    prepared = transport_for(dest()).prepare(events, now=NOW)
    assert [len(b.events) for b in prepared.batches] == [500, 500, 201]
    first = prepared.batches[0].request
    assert first.method == "POST"
    assert first.url == "https://collector.example/v1/batch"
    assert first.headers["Content-Type"] == "application/json"
    doc = json.loads(first.body)
    assert doc["schema"] == 1
    assert doc["events"] == events[:500]
    assert all(len(b.request.body) <= json_transport.MAX_BODY_BYTES for b in prepared.batches)


def test_json_splits_by_bytes(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_transport, "MAX_BODY_BYTES", 2000)
    events = [event(app) for _ in range(20)]
    prepared = transport_for(dest()).prepare(events, now=NOW)
    assert sum(len(b.events) for b in prepared.batches) == 20
    assert all(len(b.request.body) <= 2000 for b in prepared.batches)


# --- ga4 -----------------------------------------------------------------------------------------------


def ga4_dest() -> Destination:
    return dest("ga4", "https://www.google-analytics.com/mp/collect", measurement_id="G-ABC", api_secret="s")


def test_ga4_format_and_grouping(app: App) -> None:
    alice, bob = _hook.uuid4(), _hook.uuid4()
    events = [event(app, client=alice, when=NOW - 60) for _ in range(30)] + [event(app, client=bob)]
    prepared = transport_for(ga4_dest()).prepare(events, now=NOW)
    assert not prepared.rejected
    assert [len(b.events) for b in prepared.batches] == [25, 5, 1]
    request = prepared.batches[0].request
    assert request.url == "https://www.google-analytics.com/mp/collect?measurement_id=G-ABC&api_secret=s"
    body = json.loads(request.body)
    assert body["client_id"] == alice
    assert len(body["events"]) == 25
    item = body["events"][0]
    assert item["name"] == "startproject"
    assert item["timestamp_micros"] == int(NOW - 60) * 1_000_000
    assert set(item["params"]) == set(ga4.PARAMS)
    assert len(item["params"]) <= ga4.MAX_PARAMS
    assert all(len(v) <= ga4.MAX_VALUE for v in item["params"].values())
    assert json.loads(prepared.batches[2].request.body)["client_id"] == bob
    assert all(len(b.request.body) < ga4.MAX_BODY_BYTES for b in prepared.batches)


def test_ga4_rejects_events_older_than_72_hours(app: App) -> None:
    cid = _hook.uuid4()
    old = event(app, when=NOW - 72 * 3600 - 1, client=cid)
    fresh = event(app, when=NOW - 72 * 3600 + 60, client=cid)
    future = event(app, when=NOW + 3600, client=cid)
    prepared = transport_for(ga4_dest()).prepare([old, fresh, future], now=NOW)
    assert [e for e, _ in prepared.rejected] == [old]
    assert "72-hour" in prepared.rejected[0][1]
    items = json.loads(prepared.batches[0].request.body)["events"]
    assert items[1]["timestamp_micros"] == int(NOW) * 1_000_000  # a future time is sent as now


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        pytest.param("startproject", True, id="plain"),
        pytest.param("session_start", False, id="reserved-name"),
        pytest.param("error", False, id="reserved-error"),
        pytest.param("ga_thing", False, id="reserved-prefix"),
        pytest.param("Google_x", False, id="reserved-prefix-case"),
        pytest.param("firebase_x", False, id="firebase"),
        pytest.param("a" * 41, False, id="too-long"),
        pytest.param("1abc", False, id="digit-first"),
    ],
)
def test_ga4_event_names(name: str, ok: bool) -> None:
    assert (ga4.name_problem(name, event=True) is None) is ok


def test_ga4_rejects_reserved_event_locally(app: App) -> None:
    bad = event(app, "session_start")
    prepared = transport_for(ga4_dest()).prepare([bad], now=NOW)
    assert not prepared.batches
    assert "reserved" in prepared.rejected[0][1]


# --- ua ------------------------------------------------------------------------------------------------


def test_ua_hits_are_dep8s_exact_field_set(app: App) -> None:
    d = dest("ua", "https://www.google-analytics.com/batch", tracking_id="UA-12345-6")
    events = [event(app) for _ in range(45)]
    prepared = transport_for(d).prepare(events, now=NOW)
    assert [len(b.events) for b in prepared.batches] == [20, 20, 5]
    request = prepared.batches[0].request
    assert request.headers["User-Agent"] == _hook.user_agent(app)
    lines = request.body.split(b"\n")
    assert len(lines) == 20
    first = lines[0].decode()
    assert first.split("&")[0] == "v=1"
    fields = parse_qs(first)
    assert list(fields) == ["v", "tid", "cid", "t", "ec", "an", "av", "aip"]
    assert fields["tid"] == ["UA-12345-6"]
    assert fields["cid"] == [events[0]["client_id"]]
    assert fields["t"] == ["event"]
    assert fields["ec"] == ["startproject"]
    assert fields["an"] == ["Django"]
    assert fields["av"] == ["5.2"]
    assert fields["aip"] == ["1"]
    assert all(len(b.request.body) <= ua.MAX_BODY_BYTES for b in prepared.batches)


def test_ua_groups_by_user_agent_and_respects_byte_limit(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    other = App(name="Django", version="4.2")
    d = dest("ua", "https://www.google-analytics.com/batch", tracking_id="UA-1-1")
    events = [event(app), event(other), event(app)]
    prepared = transport_for(d).prepare(events, now=NOW)
    assert sorted(len(b.events) for b in prepared.batches) == [1, 2]
    assert {b.request.headers["User-Agent"] for b in prepared.batches} == {
        _hook.user_agent(app),
        _hook.user_agent(other),
    }
    monkeypatch.setattr(ua, "MAX_BODY_BYTES", 300)
    prepared = transport_for(d).prepare([event(app) for _ in range(5)], now=NOW)
    assert sum(len(b.events) for b in prepared.batches) == 5
    assert all(len(b.request.body) <= 300 for b in prepared.batches)


def test_every_event_comes_back_exactly_once(app: App) -> None:
    events = [event(app, when=NOW - 80 * 3600 * (i % 2)) for i in range(60)]
    for d in (dest(), ga4_dest(), dest("ua", "https://x.example/batch", tracking_id="UA-1-1")):
        prepared = transport_for(d).prepare(events, now=NOW)
        ids = [e["event_id"] for b in prepared.batches for e in b.events] + [
            e["event_id"] for e, _ in prepared.rejected
        ]
        assert sorted(ids) == sorted(e["event_id"] for e in events), d.transport
