"""The collector's test data: events as a client sends them (:func:`event`, :func:`batch`) under a fixed
:data:`POLICY`, rows as a store holds them (:func:`row`, :func:`event_row`), deterministic ids (:func:`det_uuid4`), the
clocks the tests run at, ISO weeks and days (:func:`monday`, :func:`week_after`, :func:`at`), and the headers that must
never be stored (:func:`probe_headers`, :func:`assert_private`)."""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from pathlib import Path

from hypothesis import strategies as st

from spool_reporter._event import DJANGO_COMMANDS, FIELDS, check
from spool_reporter._hook import iso_time
from spool_reporter.collector import Policy, open_store
from spool_reporter.collector._common import Row
from spool_reporter.collector._weeks import week_of_valid
from spool_reporter.collector._wire import parse_batch

# -- events as a client sends them ---------------------------------------------------------------------------

PROBE_UA = "PrivacyProbe/7.3 (collector-test; ua-3b9e1c)"
"""A request User-Agent header that must never reach the database or the logs."""

MARKER = "marker-5f0d2a7c-header-value"
"""A value sent in an unrelated request header that must never reach the database or the logs."""

FORWARDED_FOR = "203.0.113.77"
"""A documentation address sent as X-Forwarded-For: it must not be stored either."""


CLOCK = 1_799_193_600.0  # 2027-01-06T00:00:00Z: the collector's clock in these tests


POLICY = Policy(
    commands={"Django": DJANGO_COMMANDS, "MyTool": frozenset({"startproject"})}, max_age=60 * 86400, clock=lambda: CLOCK
)
"""The tests' events are dated 2026-11-30 .. 2027-01-05: a fixed clock keeps them inside the time window."""


def rows_of(body: bytes, policy: Policy = POLICY) -> list[Row]:
    """The rows of a batch that must be wholly valid."""
    parsed = parse_batch(body, policy)
    assert parsed.refused == {}, parsed.refused
    return parsed.rows


def det_uuid4(*parts: object) -> str:
    """A deterministic, valid uuid4 from ``parts`` (so tests can plan which ids repeat)."""
    b = bytearray(hashlib.sha256(repr(parts).encode()).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def event(
    *,
    event_id: str | None = None,
    client: object = "dev",
    when: str = "2026-12-03T08:15:48Z",
    name: str = "startproject",
    app: str = "Django",
    app_version: str = "5.2",
    python: str = "CPython",
    python_version: str = "3.11",
    os_name: str = "Linux",
    arch: str = "x86_64",
    valid: bool = True,
) -> dict[str, object]:
    """One event with exactly the allowlisted fields (checked valid under :data:`POLICY` unless ``valid=False``)."""
    obj: dict[str, object] = {
        "schema": 1,
        "event_id": event_id or det_uuid4("event", client, when, name, time.perf_counter_ns()),
        "event": name,
        "app": app,
        "app_version": app_version,
        "python": python,
        "python_version": python_version,
        "os": os_name,
        "os_release": "6.1",
        "arch": arch,
        "user_agent": f"{app}/{app_version} {python}/{python_version} ({os_name}; {arch})",
        "client_id": det_uuid4("client", client),
        "time": when,
    }
    assert list(obj) == list(FIELDS)
    if valid:
        assert check(dict(obj), now=CLOCK, max_age=POLICY.max_age, commands=POLICY.commands.get(app)) is None
    return obj


def batch(events: list[dict[str, object]]) -> bytes:
    return json.dumps({"schema": 1, "events": events}).encode()


def probe_headers() -> dict[str, str]:
    return {"User-Agent": PROBE_UA, "X-Probe": MARKER, "X-Forwarded-For": FORWARDED_FOR}


def db_bytes(db: Path) -> bytes:
    """The database file and its WAL/shared-memory files, as they are on disk now."""
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())


def assert_private(data: bytes) -> None:
    for secret in ("127.0.0.1", PROBE_UA, MARKER, FORWARDED_FOR, "PrivacyProbe"):
        assert secret.encode() not in data, secret


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
"""Any JSON value (a hypothesis strategy), for the parsers' fuzz tests."""


def store_sample_events(db: Path) -> None:
    """Eight events of five developers and two applications over 2026-W49 to 2027-W01 into the SQLite store ``db``."""
    store = open_store(db)
    events = [
        # 2026-W49: alice (5.2, 3.11, Linux) twice, bob (4.2, 3.12, macOS) once
        event(client="alice", when="2026-11-30T09:00:00Z"),
        event(client="alice", when="2026-12-06T23:59:59Z", name="runserver"),
        event(client="bob", when="2026-12-02T10:00:00Z", app_version="4.2", python_version="3.12", os_name="macOS"),
        # 2026-W50: alice upgraded mid-week (counted under both versions), carol on PyPy/Windows
        event(client="alice", when="2026-12-07T00:00:00Z"),
        event(client="alice", when="2026-12-09T00:00:00Z", app_version="6.0"),
        event(client="carol", when="2026-12-10T00:00:00Z", python="PyPy", python_version="3.10", os_name="Windows"),
        # 2027-W01, after an empty 2026-W51..W53
        event(client="dave", when="2027-01-05T12:00:00Z", name="startapp"),
        # another application in the same database is not mixed in
        event(client="erin", when="2026-12-03T00:00:00Z", app="MyTool", app_version="1.4"),
    ]
    assert store.insert(rows_of(batch(events)))[0] == len(events)
    store.close()


GA4_NOW = 1796300000.0  # 2026-12-03T12:53:20Z: the clock of the tests that forward to GA4


def recent() -> str:
    """Ten minutes ago, as an event's time: inside a real collector's time window whatever today is."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))


# -- rows as a store holds them, days and weeks -----------------------------------------------------------------

DAY = 86400.0

ROLLUP_NOW = datetime.datetime(2027, 3, 3, 12, tzinfo=datetime.timezone.utc).timestamp()  # a Wednesday of 2027-W09

ROLLUP_MAX_AGE = 30 * DAY


def row(
    client: object,
    when: float,
    *,
    app: str = "Django",
    version: str = "5.2",
    python: str = "3.12",
    os_name: str = "Linux",
    name: str = "runserver",
    n: object = 0,
    impl: str | None = None,
) -> Row:
    """One stored row (the store takes rows as validated; these are valid) at epoch ``when``; ``impl`` is the
    Python implementation (by default PyPy for 3.10, CPython otherwise)."""
    time_text = iso_time(when)
    impl = impl or ("PyPy" if python == "3.10" else "CPython")
    return (
        det_uuid4("event", client, when, name, app, version, impl, python, os_name, n),
        name,
        app,
        version,
        impl,
        python,
        os_name,
        "6.1",
        "x86_64",
        det_uuid4("client", client),
        time_text,
        week_of_valid(time_text),
    )


def monday(week: str) -> datetime.date:
    """The Monday of an ISO week (``"2027-W05"``)."""
    year, num = week.split("-W")
    return datetime.date.fromisocalendar(int(year), int(num), 1)


def week_after(week: str, weeks: int = 1) -> str:
    year, num, _ = (monday(week) + datetime.timedelta(weeks=weeks)).isocalendar()
    return f"{year:04d}-W{num:02d}"


def at(day: datetime.date, hour: float = 12.0) -> float:
    """Epoch seconds of ``hour`` o'clock UTC on ``day``."""
    midnight = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.timezone.utc)
    return midnight.timestamp() + hour * 3600


def event_row(
    client: object,
    day: datetime.date,
    *,
    app: str = "Django",
    version: str = "5.2",
    python: str = "CPython 3.12",
    os_name: str = "Linux",
    name: str = "runserver",
    n: object = 0,
) -> Row:
    """One stored row (the store takes rows as validated) of ``client`` on ``day``; ``python`` is
    ``"<implementation> <version>"`` as the releases name it."""
    impl, _, python_version = python.partition(" ")
    return row(
        client, at(day), app=app, version=version, python=python_version, impl=impl, os_name=os_name, name=name, n=n
    )
