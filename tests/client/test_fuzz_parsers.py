"""Property-based fuzzing of everything the hook and the flusher parse from disk: no exception escapes."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from spool_reporter import App
from spool_reporter._event import FIELDS, validate
from spool_reporter._hook import MAX_CONFIG_BYTES, build_line, decide, django_app, parse
from spool_reporter._spool import parse_lines, segment_count

APP = django_app("5.2")
GOOD = json.loads(build_line(APP, "startproject", "43325579-4ce9-4a2d-a152-0e993a4bb245", 0))

config_lines = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.builds(
            lambda k, v: f"{k}={v}".encode(),
            st.sampled_from(["disable", "default", "client_id", "x"]),
            st.text(max_size=20),
        ),
    ),
    max_size=20,
)


@given(config_lines)
def test_config_parser_never_raises_and_decision_is_total(lines: list[bytes]) -> None:
    data = b"\n".join(lines)[:MAX_CONFIG_BYTES]
    values = parse(data)
    assert values is None or isinstance(values, dict)
    decision = decide(APP, {}, values, None)  # a malformed file is passed as-is: never an exception
    assert isinstance(decision.enabled, bool)


@given(st.binary(max_size=4096))
def test_spool_reader_never_raises(data: bytes) -> None:
    events, bad = parse_lines(data)
    assert bad >= 0
    assert all(set(e) == set(FIELDS) for e in events)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from([*FIELDS, "extra"]), json_values, max_size=16))
@settings(max_examples=300)
def test_validate_accepts_only_the_allowlist(obj: dict[str, object]) -> None:
    result = validate(obj)
    if result is not None:
        assert set(result) == set(FIELDS)


@given(st.sampled_from(FIELDS), json_values)
def test_any_single_field_mutation_is_validated(field: str, value: object) -> None:
    mutated = {**GOOD, field: value}
    result = validate(mutated)
    if result is not None:
        assert result == mutated
        assert isinstance(result[field], int if field == "schema" else str)


@given(st.text(max_size=60))
def test_segment_names_parse_or_are_ignored(name: str) -> None:
    count = segment_count(name)
    assert count is None or count >= 0


@given(st.text(max_size=45), st.text(max_size=12))
def test_app_rejects_or_accepts_cleanly(name: str, version: str) -> None:
    try:
        app = App(name=name, version=version)
    except ValueError:
        return
    assert app.version.replace(".", "").isdigit()


def test_non_ascii_digits_are_not_numbers(tmp_path: object) -> None:
    # str.isdigit() accepts '²' and '٣', which int() refuses: every numeric field read from disk or the
    # network must say "not a number" rather than raise (the fault suite's fuzzing found four).
    from spool_reporter._hook import int_setting
    from spool_reporter._http import parse_retry_after

    for text in ("²", "٣", "1²"):
        assert segment_count(f"seg-{text}-1-1.jsonl") is None
        assert segment_count(f"seg-1-1-{text}.jsonl") is None
        assert parse_retry_after(text, 0.0) is None
        assert int_setting({"max_events": text}, "max_events", 7) == 7
    assert parse("cap=²\n".encode()) == {"cap": "²"}
