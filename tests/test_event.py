"""The event line: exactly the allowlist, valid JSON, facts that agree with the libraries that own them."""

from __future__ import annotations

import json
import platform
import re
import sys
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spool_reporter import App
from spool_reporter._event import (
    FIELDS,
    MAX_LINE_BYTES,
    _quote,
    build_line,
    is_event_name,
    is_uuid4,
    platform_facts,
    user_agent,
    uuid4,
    validate,
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
    assert json.loads(_quote(value)) == value
    assert _quote(value).isascii()


def test_validate_rejects_extra_missing_and_bad_fields(app: App) -> None:
    good = json.loads(build_line(app, "startapp", CID, 0))
    assert validate({**good, "path": "/home/me"}) is None
    assert validate({k: v for k, v in good.items() if k != "arch"}) is None
    assert validate({**good, "client_id": str(uuid.uuid1())}) is None
    assert validate({**good, "event": "bad name"}) is None
    assert validate({**good, "schema": 2}) is None
    assert validate({**good, "os": 5}) is None
    assert validate([good]) is None
