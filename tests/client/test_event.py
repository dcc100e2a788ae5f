"""The event line: exactly the allowlist, valid JSON, facts that agree with the libraries that own them."""

from __future__ import annotations

import json
import platform
import re
import sys
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spool_reporter import App
from spool_reporter._event import (
    ARCHITECTURES,
    DJANGO_COMMANDS,
    FIELDS,
    MAX_LINE_BYTES,
    OS_FAMILIES,
    OTHER,
    PYTHON_IMPLEMENTATIONS,
    REASONS,
    check,
    validate,
)
from spool_reporter._hook import (
    build_line,
    format_user_agent,
    is_event_name,
    is_uuid4,
    platform_facts,
    quote,
    user_agent,
    uuid4,
)

CID = "43325579-4ce9-4a2d-a152-0e993a4bb245"


def test_uuid4_is_a_canonical_version_4_uuid() -> None:
    for _ in range(1000):
        text = uuid4()
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
        assert is_uuid4(text)


def test_is_uuid4_rejects_uuid1_and_garbage() -> None:
    assert not is_uuid4(str(uuid.uuid1()))  # uuid1 embeds the MAC address: never accepted
    assert not is_uuid4(CID.upper())
    assert not is_uuid4(CID[:-1])
    assert not is_uuid4("x" * 36)


def test_line_has_exactly_the_allowlisted_fields(app: App) -> None:
    line = build_line(app, "startproject", CID, 1796286146.7)
    assert line.endswith(b"\n")
    assert len(line) < MAX_LINE_BYTES
    obj = json.loads(line)
    assert list(obj) == list(FIELDS)
    assert obj["event"] == "startproject"
    assert obj["app"] == "Django"
    assert obj["app_version"] == "5.2"
    assert obj["client_id"] == CID
    assert obj["time"] == "2026-12-03T08:22:26Z"
    assert validate(obj) == obj


def test_platform_facts_agree_with_the_platform_module() -> None:
    impl, pyver, family, release, arch = platform_facts()
    assert impl == platform.python_implementation()
    assert pyver == ".".join(platform.python_version_tuple()[:2])
    if sys.platform.startswith("linux"):
        assert family == "Linux"
        assert platform.release().startswith(release)
        assert re.fullmatch(r"\d+\.\d+", release)
    machine = platform.machine().lower()
    assert arch == {"amd64": "x86_64", "aarch64": "arm64"}.get(machine, machine)


def test_user_agent_is_dep8_shaped(app: App) -> None:
    ua = user_agent(app)
    assert re.fullmatch(r"Django/5\.2 CPython/3\.\d+ \((Linux|macOS|Windows); [a-z0-9_]+\)", ua), ua


@pytest.mark.parametrize("name", ["startproject", "runserver", "a", "A_b9", "x" * 40])
def test_valid_event_names(name: str) -> None:
    assert is_event_name(name)


@pytest.mark.parametrize("name", ["", "9x", "_x", "a-b", "a b", "x" * 41, "é"])
def test_invalid_event_names(name: str) -> None:
    assert not is_event_name(name)


@given(st.text(max_size=60))
def test_quote_is_json(value: str) -> None:
    assert json.loads(quote(value)) == value
    assert quote(value).isascii()


def test_validate_rejects_extra_missing_and_bad_fields(app: App) -> None:
    good = json.loads(build_line(app, "startapp", CID, 0))
    assert validate({**good, "path": "/home/me"}) is None
    assert validate({k: v for k, v in good.items() if k != "arch"}) is None
    assert validate({**good, "client_id": str(uuid.uuid1())}) is None
    assert validate({**good, "event": "bad name"}) is None
    assert validate({**good, "schema": 2}) is None
    assert validate({**good, "os": 5}) is None
    assert validate([good]) is None


# -- the shared validator (collector side too: tests/collector/test_collector.py) --------------------------------------


def _line(app: App, when: float, **fields: str) -> dict[str, object]:
    obj = json.loads(build_line(app, "startproject", CID, when))
    obj.update(fields)
    return obj  # type: ignore[no-any-return]


def test_the_hook_writes_what_the_validator_accepts(app: App) -> None:
    now = time.time()
    assert check(_line(app, now), now=now, commands=DJANGO_COMMANDS) is None
    impl, _, family, _, arch = platform_facts()
    assert (impl in PYTHON_IMPLEMENTATIONS, family in OS_FAMILIES, arch in ARCHITECTURES) == (True, True, True)


def test_vocabularies_follow_the_hook_and_the_django_rules() -> None:
    from spool_reporter._hook import ARCH, NAME_CHARS
    from spool_reporter.django._rules import COMMANDS

    assert frozenset(COMMANDS) == DJANGO_COMMANDS
    assert set(ARCH.values()) | {OTHER} == ARCHITECTURES
    assert frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == NAME_CHARS


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"app_version": "7777.1"}, "app_version", id="version-bounds"),
        pytest.param({"app_version": "5.2.1"}, "app_version", id="version-three-parts"),
        pytest.param({"python_version": "3"}, "python_version", id="python-major-only"),
        pytest.param({"os": "Djang\u043e"}, "os", id="cyrillic"),
        pytest.param({"os": "TempleOS"}, "os", id="unknown-os"),
        pytest.param({"arch": "mips"}, "arch", id="unknown-arch"),
        pytest.param({"python": "Jython"}, "python", id="unknown-python"),
        pytest.param({"user_agent": "Django/5.2 CPython/3.11 (Linux; x86_64) extra"}, "user_agent", id="agent"),
        pytest.param({"event": "migrate"}, "command", id="not-a-django-command"),
        pytest.param({"time": "9999-12-31T23:59:59Z"}, "future", id="year-9999"),
        pytest.param({"time": "2000-01-01T00:00:00Z"}, "too_old", id="old"),
    ],
)
def test_check_names_the_rule(app: App, fields: dict[str, str], reason: str) -> None:
    now = time.time()
    obj = _line(app, now)
    if "user_agent" not in fields and any(
        k in fields for k in ("app_version", "python_version", "os", "arch", "python")
    ):
        merged = {**obj, **fields}
        fields = {**fields, "user_agent": format_user_agent(
            str(merged["app"]), str(merged["app_version"]), impl=str(merged["python"]),
            pyver=str(merged["python_version"]), family=str(merged["os"]), arch=str(merged["arch"]),
        )}  # fmt: skip
    assert check({**obj, **fields}, now=now, commands=DJANGO_COMMANDS) == reason
    assert reason in REASONS


def test_the_json_transport_leaves_the_time_window_to_the_collector(app: App) -> None:
    # The collector judges an event's time with its own --max-age-days and counts what it refuses; a client
    # that dropped month-old events itself would hide them from a collector that takes them.
    from spool_reporter._settings import Destination
    from spool_reporter.transports import transport_for

    now = time.time()
    dest = Destination(transport="json", endpoint="https://collector.example/v1/batch", source="user")
    events = [_line(app, now - 31 * 86400), _line(app, now), _line(app, now + 2 * 86400)]
    prepared = transport_for(dest).prepare(events, now=now)
    assert [e["time"] for b in prepared.batches for e in b.events] == [e["time"] for e in events]
    assert prepared.rejected == ()
