"""The public numbers (``collector/_public.py``): the threshold rule, checked against the developers behind
every count, and the public document. The page itself is tested in ``test_public_page.py`` and in a real
browser in ``test_public_browser.py``."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spool_reporter.collector._public import (
    BREAKDOWNS,
    MIN_COUNT,
    OTHER,
    Published,
    merge_small,
    parse_min_count,
    publish,
)
from spool_reporter.collector._stats import Stats, Week

# -- the rule on examples (k = 10) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cells", "total", "published"),
    [
        pytest.param({"5.2": 50, "4.2": 30}, 80, {"5.2": 50, "4.2": 30}, id="nothing-small"),
        pytest.param({"5.2": 80}, 80, {"5.2": 80}, id="one-value-for-everyone"),
        # 3.2 (3) and 3.1 (8) are small; together 11 >= 10 and the others stand alone.
        pytest.param({"5.2": 50, "4.2": 20, "3.2": 3, "3.1": 8}, 81, {"5.2": 50, "4.2": 20, OTHER: 11}, id="two-small"),
        # 3.2 alone would make "other: 3": the next smallest (4.2, 12) joins it.
        pytest.param({"5.2": 50, "4.2": 12, "3.2": 3}, 65, {"5.2": 50, OTHER: 15}, id="complementary"),
        # "5.2: 95" would tell that 5 developers used something else: nothing can be published by name.
        pytest.param({"5.2": 95, "4.2": 5}, 100, {OTHER: 100}, id="complement-small"),
        pytest.param({"5.2": 95, "4.2": 3, "3.2": 2}, 100, {OTHER: 100}, id="complement-of-two-small"),
        # A client-sent "other" (3) is merged like any small cell, and not left alone either.
        pytest.param({"5.2": 40, "6.0": 30, OTHER: 3}, 73, {"5.2": 40, OTHER: 33}, id="sent-other-small"),
        pytest.param({"5.2": 40, OTHER: 12}, 52, {"5.2": 40, OTHER: 12}, id="sent-other-stands-alone"),
        # Overlaps: 15 developers used both; 30 - 25 = 5 never used 5.2, so 5.2 cannot stand alone, and
        # "other" = 5.2 alone would give its 25 (and 30 - 25) away: 6.0 joins it.
        pytest.param({"5.2": 25, "6.0": 20}, 30, {OTHER: 45}, id="overlap-complement"),
        pytest.param({"5.2": 20, "6.0": 15}, 30, {}, id="overlap-5-of-30-used-both"),
        pytest.param({"5.2": 30, "6.0": 20}, 40, {"5.2": 30, "6.0": 20}, id="overlap-10-used-both"),
        pytest.param({"5.2": 9}, 9, {}, id="week-below-k"),
    ],
)
def test_merge_small_examples(cells: dict[str, int], total: int, published: dict[str, int]) -> None:
    assert merge_small(cells, total, 10) == published
    assert list(merge_small(cells, total, 10)) == list(published)  # most first, "other" last


def test_merge_small_with_k_1_publishes_every_cell() -> None:
    cells = {"5.2": 3, "4.2": 1, "6.0": 1}
    assert merge_small(cells, 5, 1) == cells


def test_inconsistent_counts_are_withheld() -> None:
    # Cells adding up to fewer than the week's developers cannot come from the store: publish nothing.
    assert merge_small({"5.2": 40}, 50, 10) == {}


# -- the rule against the developers behind the counts (hypothesis) -----------------------------------------

VALUES = ["5.2", "4.2", "6.0", "5.1", "3.2", OTHER, "<b>"]

one_value_each = st.lists(st.sets(st.sampled_from(VALUES), min_size=1, max_size=1), max_size=60)
some_two_values = st.lists(st.sets(st.sampled_from(VALUES), min_size=1, max_size=3), max_size=60)
# Skewed: most developers on one or two versions, a long tail of rare ones (the case the rule is for).
skewed = st.lists(
    st.one_of(
        st.just({"5.2"}), st.just({"4.2"}), st.just({"5.2", "6.0"}), st.sets(st.sampled_from(VALUES), min_size=1)
    ),
    max_size=80,
)


def _cells(developers: list[set[str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for values in developers:
        for value in values:
            out[value] = out.get(value, 0) + 1
    return out


def _group(developers: list[set[str]], values: Iterable[str]) -> int:
    """How many developers have at least one of ``values``."""
    wanted = set(values)
    return sum(1 for mine in developers if mine & wanted)


def _safe(n: int, k: int) -> bool:
    return n == 0 or n >= k


@settings(max_examples=600, deadline=None)
@given(developers=st.one_of(one_value_each, some_two_values, skewed), k=st.integers(1, 15))
def test_no_published_or_derivable_number_counts_a_small_group(developers: list[set[str]], k: int) -> None:
    total = len(developers)
    cells = _cells(developers)
    published = merge_small(cells, total, k)
    excess = sum(cells.values()) - total
    if total < k or 0 < excess < k:
        assert published == {}
        return
    assert published, "a published week's breakdown is never empty"
    # Merging loses nobody and invents nobody: the excess stays what it was (and is safe).
    assert sum(published.values()) == sum(cells.values())
    assert _safe(excess, k)
    named = {v: c for v, c in published.items() if v != OTHER}
    merged = [v for v in cells if v not in named]
    for value, count in named.items():
        assert count == cells[value]  # published by name: the true count ...
        assert count >= k  # ... of at least k developers ...
        assert _safe(total - count, k)  # ... and "everyone else" is not a small group either
    if merged:
        assert published[OTHER] == sum(cells[v] for v in merged)
        assert _group(developers, merged) >= k  # the developers really behind "other"
        # No cell can be read off "other": it holds two cells or more, or one that could stand alone.
        assert len(merged) >= 2 or (cells[merged[0]] >= k and _safe(total - cells[merged[0]], k))
    else:
        assert OTHER not in published
    if excess == 0:
        # A partition: every sum of published cells, subtracted from the week's total, is 0 or >= k ...
        entries = list(published.values())
        for size in range(1, len(entries) + 1):
            for chosen in itertools.combinations(entries, size):
                assert _safe(total - sum(chosen), k)
        # ... and publishing the published numbers again changes nothing.
        assert merge_small(published, total, k) == published
    if len(named) == 2 and not merged:
        # Two values, no "other": the whole Venn diagram can be worked out. Every region is safe.
        a, b = named
        both = sum(1 for mine in developers if {a, b} <= mine)
        assert _safe(both, k)
        assert _safe(total - named[a], k)
        assert _safe(total - named[b], k)


@given(developers=some_two_values, k=st.integers(1, 15))
def test_merge_small_does_not_depend_on_the_order_of_the_cells(developers: list[set[str]], k: int) -> None:
    cells = _cells(developers)
    backwards = dict(reversed(list(cells.items())))
    assert merge_small(cells, len(developers), k) == merge_small(backwards, len(developers), k)


# -- the document ---------------------------------------------------------------------------------------------


def _week(name: str, developers: int, **fields: dict[str, int]) -> Week:
    base = {"by_django": {"5.2": developers}, "by_python": {"CPython 3.12": developers}, "by_os": {"Linux": developers}}
    base.update(fields)
    return Week(week=name, developers=developers, events=3 * developers, by_event={"runserver": 3 * developers}, **base)


def test_publish_drops_small_weeks_commands_and_the_all_time_count() -> None:
    stats = Stats(
        app="Django",
        developers=40,
        events=120,
        weeks=[
            _week("2026-W47", 35, by_os={"Linux": 20, "macOS": 10, "FreeBSD": 2, "Windows": 3}),
            _week("2026-W48", 9),  # below k: absent, and its events are not in the total
            _week("2026-W49", 12),
        ],
    )
    doc = publish(stats)
    assert isinstance(doc, Published)
    assert doc.min_count == MIN_COUNT == 10
    assert [w.week for w in doc.weeks] == ["2026-W47", "2026-W49"]
    assert doc.events == 3 * 35 + 3 * 12
    # FreeBSD and Windows (5 in all) are small, and so is "other" then: macOS (10) joins them.
    assert doc.weeks[0].by_os == {"Linux": 20, OTHER: 15}
    assert doc.weeks[0].by_django == {"5.2": 35}
    assert all(w.by_event == {} for w in doc.weeks)
    as_dict = doc.as_dict()
    assert as_dict["developers"] is None
    assert set(as_dict) == {"app", "min_count", "developers", "events", "weeks"}
    assert set(as_dict["weeks"][0]) == set(stats.as_dict()["weeks"][0])  # type: ignore[index]
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_publish_knows_every_field_of_a_week() -> None:
    # A new field of Week is unpublished until this module decides how to publish it (fail closed).
    names = {f.name for f in dataclasses.fields(Week)}
    assert names == {"week", "developers", "events", "by_event", *BREAKDOWNS}


def test_publish_refuses_k_0() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        publish(Stats(app="Django", developers=0, events=0, weeks=[]), min_count=0)


@pytest.mark.parametrize(("text", "value"), [("10", 10), ("1", 1), (" 25 ", 25)])
def test_parse_min_count(text: str, value: int) -> None:
    assert parse_min_count(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "ten", "", "1.5", "\u0661\u0660", "9999999999"])
def test_parse_min_count_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="whole number of at least 1"):
        parse_min_count(text)
