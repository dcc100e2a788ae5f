"""The public releases (``collector/_release.py``) and what is published of them (``collector/_public.py``): the
fixed vocabulary, one value per developer per breakdown, the calendar of periods, the schedule of releases,
the noise (checked against OpenDP's own numbers and against the discrete Laplace distribution), and the
post-processing of released numbers into the document and the downloads.

The routes are tested in ``test_public_routes.py``; the attacks the releases must defeat in
``test_public_privacy.py``.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spool_reporter._event import OS_FAMILIES, OTHER
from spool_reporter._hook import iso_time
from spool_reporter.collector import Retention, _release, open_store
from spool_reporter.collector._common import (
    EPSILON,
    MAX_EPSILON,
    Publishing,
    Release,
    check_epsilon,
    check_min_count,
    parse_epsilon,
    parse_min_count,
)
from spool_reporter.collector._public import (
    CSV_COLUMNS,
    FAMILY_ALPHA,
    cell_threshold,
    document,
    number,
    releases_csv,
    releases_json,
)
from spool_reporter.collector._release import (
    ALPHA,
    BREAKDOWNS,
    FINAL,
    PROVISIONAL,
    PROVISIONAL_SHARE,
    WEEK_SENSITIVITY,
    Noisy,
    Period,
    Plan,
    due,
    periods,
    vocabulary,
    week_counts,
)
from spool_reporter.collector._rollup import closing_week
from spool_reporter.collector._store import Store
from spool_reporter.collector._weeks import first_week_of, iso_week

from support.events import DAY, at, event_row, monday, week_after
from support.releases import flat

# -- the distributions the noise must follow -----------------------------------------------------------------------


def discrete_laplace_pmf(scale: float) -> Callable[[int], float]:
    """P(k) = (1 - r) / (1 + r) * r^|k| with r = exp(-1/scale): proportional to exp(-|k| / scale)."""
    r = math.exp(-1.0 / scale)
    return lambda k: (1 - r) / (1 + r) * r ** abs(k)


def discrete_laplace_tail(scale: float, m: int) -> float:
    """P(|X| > m) for the discrete Laplace distribution of ``scale``."""
    r = math.exp(-1.0 / scale)
    return 2 * r ** (m + 1) / (1 + r)


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with ``df`` degrees of freedom > x): 1 - the regularized lower incomplete gamma P(df/2, x/2),
    summed as its series (accurate to about 1e-15 absolute: plenty for a floor of 1e-6)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    term = math.exp(a * math.log(z) - z - math.lgamma(a + 1))
    total = term
    for n in range(1, 100_000):
        term *= z / (a + n)
        total += term
        if term < total * 1e-17:
            break
    return max(0.0, 1.0 - total)


def chi2_test(samples: Sequence[int], pmf: Callable[[int], float], *, min_expected: float = 20.0) -> tuple[float, int]:
    """(p-value, degrees of freedom) of Pearson's test of integer ``samples`` against the symmetric ``pmf``: 0 in a
    bin of its own, then bins of consecutive values outwards on each side, each expecting at least
    ``min_expected`` samples, the last one of each side holding its whole tail."""
    n = len(samples)
    seen = Counter(samples)
    half = (1.0 - pmf(0)) / 2
    bins = [(n * pmf(0), seen.get(0, 0))]  # (expected, observed)
    for side in (1, -1):
        covered = p = 0.0
        lo = k = side
        for _ in range(100_000):
            p += pmf(k)
            if n * (half - covered - p) < min_expected:  # what is left beyond k is too little: one tail bin
                tail = sum(c for v, c in seen.items() if v * side >= lo * side)
                bins.append((n * (half - covered), tail))
                break
            if n * p >= min_expected:
                bins.append((n * p, sum(seen.get(j, 0) for j in range(lo, k + side, side))))
                covered, p, lo = covered + p, 0.0, k + side
            k += side
    assert sum(o for _, o in bins) == n
    stat = sum((o - e) ** 2 / e for e, o in bins)
    return chi2_sf(stat, len(bins) - 1), len(bins) - 1


WEEK = "2027-W05"
"""A week of the unit tests: Monday 2027-02-01 to Sunday 2027-02-07."""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(tmp_path / "c.sqlite3")
    try:
        yield opened
    finally:
        opened.close()


def counts(store: Store, week: str = WEEK, app: str = "Django") -> tuple[int, dict[str, dict[str, int]]]:
    with store.reading() as reader:
        return week_counts(reader, app, week)


# -- the vocabulary: fixed, never taken from the data --------------------------------------------------------------


def test_vocabulary_is_fixed() -> None:
    words = vocabulary("Django")
    assert tuple(words) == BREAKDOWNS == ("by_django", "by_python", "by_os")
    for values in words.values():
        assert values[-1] == OTHER
        assert len(set(values)) == len(values)
    assert words["by_django"][:4] == ("1.8", "1.9", "1.10", "1.11")
    assert {"2.2", "3.2", "4.1", "4.2", "5.2", "6.0", "7.2"} <= set(words["by_django"])
    assert "7.3" not in words["by_django"]
    assert len(words["by_python"]) == 3 * 9 + 1
    assert {"CPython 3.8", "PyPy 3.10", "GraalPy 3.16"} <= set(words["by_python"])
    assert set(words["by_os"]) == set(OS_FAMILIES)
    # Another application names no version of its own; it is the same whatever is asked first.
    assert vocabulary("MyTool") == {**words, "by_django": (OTHER,)}
    assert vocabulary("Django") == words


def test_every_cell_of_the_vocabulary_is_counted_whatever_the_data(store: Store) -> None:
    total, cells = counts(store)
    assert total == 0
    assert {name: tuple(values) for name, values in cells.items()} == vocabulary("Django")
    assert all(n == 0 for values in cells.values() for n in values.values())
    day = monday(WEEK)
    store.insert(
        [
            event_row("a", day, version="9.9", python="CPython 3.7", os_name="other"),  # all outside: "other"
            event_row("b", day, version="<b>", python="GraalPy 3.16", os_name="NetBSD"),
            event_row("c", day - datetime.timedelta(days=1)),  # the week before
            event_row("d", day, app="MyTool", version="1.4"),  # another application
        ]
    )
    total, cells = counts(store)
    assert total == 2
    assert {name: tuple(values) for name, values in cells.items()} == vocabulary("Django")  # no key from the data
    assert cells["by_django"][OTHER] == 2
    assert (cells["by_python"][OTHER], cells["by_python"]["GraalPy 3.16"]) == (1, 1)
    assert (cells["by_os"][OTHER], cells["by_os"]["NetBSD"]) == (1, 1)
    assert sum(n for values in cells.values() for n in values.values()) == 3 * total
    tool_total, tool_cells = counts(store, app="MyTool")
    assert (tool_total, tool_cells["by_django"]) == (1, {OTHER: 1})


def test_each_developer_counts_once_per_breakdown_under_the_newest_value(store: Store) -> None:
    day = monday(WEEK)
    store.insert(
        [
            # Two versions in a week: counted once, under the newer (by number: 1.11 is newer than 1.9).
            event_row("upgrader", day, version="4.2", python="CPython 3.9", os_name="Linux"),
            event_row("upgrader", day + datetime.timedelta(days=2), version="5.2", python="CPython 3.10", n=1),
            event_row("upgrader", day + datetime.timedelta(days=3), python="CPython 3.10", os_name="macOS", n=2),
            event_row("old", day, version="1.9"),
            event_row("old", day, version="1.11", n=1),
            event_row("pypy", day, python="PyPy 3.11", os_name="FreeBSD"),
            event_row("pypy", day, python="CPython 3.11", os_name="Windows", n=1),
            *(event_row("steady", day + datetime.timedelta(days=d), n=d) for d in range(7)),
        ]
    )
    total, cells = counts(store)
    assert total == 4
    assert {v: n for v, n in cells["by_django"].items() if n} == {"5.2": 3, "1.11": 1}
    # CPython 3.10 over 3.9 (by number); PyPy 3.11 over CPython 3.11 (same version: by name).
    assert {v: n for v, n in cells["by_python"].items() if n} == {"CPython 3.12": 2, "CPython 3.10": 1, "PyPy 3.11": 1}
    # The last by name: macOS over Linux, Windows over FreeBSD.
    assert {v: n for v, n in cells["by_os"].items() if n} == {"Linux": 2, "macOS": 1, "Windows": 1}
    for name in BREAKDOWNS:
        assert sum(cells[name].values()) == total


_VERSIONS = ["1.9", "1.11", "3.2", "4.1", "4.2", "5.2", "6.0", "9.0"]
_PYTHONS = ["CPython 3.9", "CPython 3.10", "CPython 3.12", "PyPy 3.10", "GraalPy 3.11", "CPython 3.7"]
_OSES = ["Linux", "macOS", "Windows", "FreeBSD", "other"]
_developer = st.lists(
    st.tuples(st.sampled_from(_VERSIONS), st.sampled_from(_PYTHONS), st.sampled_from(_OSES)), min_size=1, max_size=4
)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@settings(max_examples=40, deadline=None)
@given(developers=st.lists(_developer, max_size=12))
def test_week_counts_follow_the_rule_for_any_week(developers: list[list[tuple[str, str, str]]]) -> None:
    """Each developer's cell in each breakdown is the newest of their values, whatever else they sent."""
    day = monday(WEEK)
    rows = [
        event_row(("dev", i), day + datetime.timedelta(days=j % 7), version=v, python=p, os_name=o, n=j)
        for i, events in enumerate(developers)
        for j, (v, p, o) in enumerate(events)
    ]
    expected: dict[str, Counter[str]] = {name: Counter() for name in BREAKDOWNS}
    words = vocabulary("Django")
    for events in developers:
        newest = (
            max((v for v, _, _ in events), key=_key),
            max((p for _, p, _ in events), key=lambda p: (_key(p.split()[1]), p.split()[0])),
            max(o for _, _, o in events),
        )
        for name, value in zip(BREAKDOWNS, newest, strict=True):
            expected[name][value if value in words[name] else OTHER] += 1
    with tempfile.TemporaryDirectory() as folder:
        opened = open_store(Path(folder) / "c.sqlite3")
        try:
            opened.insert(rows)
            total, cells = counts(opened)
        finally:
            opened.close()
    assert total == len(developers)
    for name in BREAKDOWNS:
        assert {v: n for v, n in cells[name].items() if n} == dict(expected[name])
        assert sum(cells[name].values()) == total


def test_period_developers_counts_the_days_of_the_period(store: Store) -> None:
    jan31, feb1, feb28, mar1 = (datetime.date(2027, m, d) for m, d in ((1, 31), (2, 1), (2, 28), (3, 1)))
    store.insert(
        [
            event_row("before", jan31),
            event_row("first-day", feb1),
            event_row("first-day", feb1 + datetime.timedelta(days=9), n=1),  # once, however often
            event_row("last-day", feb28),
            event_row("after", mar1),
            event_row("tool", feb1, app="MyTool"),
        ]
    )
    with store.reading() as reader:
        assert _release.period_developers(reader, "Django", feb1, feb28) == 2
        assert _release.period_developers(reader, "Django", jan31, mar1) == 4
        assert _release.period_developers(reader, "MyTool", feb1, feb28) == 1


# -- the calendar --------------------------------------------------------------------------------------------------


def _names(found: list[Period], unit: str) -> list[str]:
    return [p.name for p in found if p.unit == unit]


def test_periods_of_a_year() -> None:
    found = periods(datetime.date(2026, 1, 1), datetime.date(2026, 12, 31))
    # 2026-01-01 is a Thursday: its week (2026-W01) began in 2025; 2026-W53 ends in 2027. Neither is whole.
    assert _names(found, "week") == [f"2026-W{n:02d}" for n in range(2, 53)]
    assert _names(found, "month") == [f"2026-{m:02d}" for m in range(1, 13)]
    assert _names(found, "quarter") == ["2026-Q1", "2026-Q2", "2026-Q3", "2026-Q4"]
    assert _names(found, "year") == ["2026"]
    by_name = {p.name: p for p in found}
    assert (by_name["2026-02"].first, by_name["2026-02"].last) == (
        datetime.date(2026, 2, 1),
        datetime.date(2026, 2, 28),
    )
    assert (by_name["2026-Q2"].first, by_name["2026-Q2"].last) == (
        datetime.date(2026, 4, 1),
        datetime.date(2026, 6, 30),
    )
    assert (by_name["2026-Q4"].first, by_name["2026-Q4"].last) == (
        datetime.date(2026, 10, 1),
        datetime.date(2026, 12, 31),
    )
    assert (by_name["2026"].first, by_name["2026"].last) == (datetime.date(2026, 1, 1), datetime.date(2026, 12, 31))
    assert (by_name["2026-W02"].first, by_name["2026-W02"].last) == (
        datetime.date(2026, 1, 5),
        datetime.date(2026, 1, 11),
    )


def test_iso_week_53_across_the_new_year() -> None:
    found = periods(datetime.date(2026, 12, 28), datetime.date(2027, 1, 3))
    assert [(p.unit, p.name, p.first, p.last) for p in found] == [
        ("week", "2026-W53", datetime.date(2026, 12, 28), datetime.date(2027, 1, 3))
    ]
    # 2027 has 52 weeks: its W52 ends on 2028-01-02, and 2027-01-01 belongs to 2026-W53.
    weeks = _names(periods(datetime.date(2027, 1, 1), datetime.date(2028, 1, 2)), "week")
    assert (weeks[0], weeks[-1], len(weeks)) == ("2027-W01", "2027-W52", 52)


def test_periods_leap_february_and_partial_ranges() -> None:
    feb = periods(datetime.date(2028, 2, 1), datetime.date(2028, 2, 29))
    assert [(p.name, p.last) for p in feb if p.unit == "month"] == [("2028-02", datetime.date(2028, 2, 29))]
    # Begun after the first of the month or the quarter: neither is released; a month cut by the end neither.
    mid = periods(datetime.date(2027, 2, 2), datetime.date(2027, 6, 29))
    assert _names(mid, "month") == ["2027-03", "2027-04", "2027-05"]
    assert _names(mid, "quarter") == []
    assert _names(periods(datetime.date(2027, 4, 1), datetime.date(2027, 12, 31)), "year") == []
    assert periods(datetime.date(2027, 3, 8), datetime.date(2027, 3, 13)) == []  # Monday to Saturday
    assert periods(datetime.date(2027, 3, 8), datetime.date(2027, 3, 1)) == []


def _month_end(first: datetime.date) -> datetime.date:
    return (first.replace(day=28) + datetime.timedelta(days=4)).replace(day=1) - datetime.timedelta(days=1)


@settings(max_examples=200, deadline=None)
@given(
    start=st.dates(datetime.date(2020, 1, 1), datetime.date(2035, 12, 31)),
    length=st.integers(-3, 800),
)
def test_periods_are_exactly_the_whole_ones_inside(start: datetime.date, length: int) -> None:
    end = start + datetime.timedelta(days=length)
    found = periods(start, end)
    days = [start + datetime.timedelta(days=i) for i in range(max(length + 1, 0))]
    # Worked out another way: from the days of the range.
    weeks = [d for d in days if d.weekday() == 0 and d + datetime.timedelta(days=6) <= end]
    assert [(p.first, p.last) for p in found if p.unit == "week"] == [
        (d, d + datetime.timedelta(days=6)) for d in weeks
    ]
    assert _names(found, "week") == ["{:04d}-W{:02d}".format(*d.isocalendar()[:2]) for d in weeks]
    months = [d for d in days if d.day == 1 and _month_end(d) <= end]
    assert _names(found, "month") == [f"{d.year:04d}-{d.month:02d}" for d in months]
    quarters = [d for d in months if d.month in (1, 4, 7, 10) and _month_end(d.replace(month=d.month + 2)) <= end]
    assert _names(found, "quarter") == [f"{d.year:04d}-Q{(d.month + 2) // 3}" for d in quarters]
    years = [d for d in months if d.month == 1 and datetime.date(d.year, 12, 31) <= end]
    assert _names(found, "year") == [str(d.year) for d in years]
    for p in found:
        assert start <= p.first <= p.last <= end


# -- the schedule --------------------------------------------------------------------------------------------------


def _due(
    now: float,
    *,
    first_week: str = WEEK,
    closed_through: str = "",
    retain_days: float = 400,
    epsilon: float = EPSILON,
    made: set[tuple[str, str]] | None = None,
) -> list[tuple[str, str, float]]:
    plans = due(
        now=now,
        first_week=first_week,
        closed_through=closed_through,
        retain_days=retain_days,
        epsilon=epsilon,
        made=made or set(),
    )
    return [(p.period.name, p.kind, p.epsilon) for p in plans]


def test_a_week_is_released_provisionally_once_it_has_ended() -> None:
    sunday_night = at(monday(WEEK) + datetime.timedelta(days=6), 23.99)
    assert _due(sunday_night) == []
    next_monday = at(monday(WEEK) + datetime.timedelta(days=7), 0.0)
    assert _due(next_monday) == [(WEEK, PROVISIONAL, EPSILON * PROVISIONAL_SHARE)]
    assert _due(next_monday, epsilon=0.4) == [(WEEK, PROVISIONAL, 0.4 * PROVISIONAL_SHARE)]
    # Never twice, and never a provisional release after the final one.
    assert _due(next_monday, made={(WEEK, PROVISIONAL)}) == []
    assert _due(next_monday, made={(WEEK, FINAL)}) == []


def test_a_week_is_released_finally_once_closed() -> None:
    later = at(monday(WEEK) + datetime.timedelta(days=40))
    closed = WEEK
    made = {(WEEK, PROVISIONAL)}
    assert (WEEK, FINAL, EPSILON * (1 - PROVISIONAL_SHARE)) in _due(later, closed_through=closed, made=made)
    assert [p for p in _due(later, closed_through=closed, made=made) if p[0] == WEEK] == [
        (WEEK, FINAL, EPSILON * (1 - PROVISIONAL_SHARE))
    ]
    assert [p for p in _due(later, closed_through=closed, made={*made, (WEEK, FINAL)}) if p[0] == WEEK] == []
    # Closed before its provisional release was made: the final one only, at the same share, never both.
    assert [p for p in _due(later, closed_through=closed) if p[0] == WEEK] == [
        (WEEK, FINAL, EPSILON * (1 - PROVISIONAL_SHARE))
    ]
    # A week's releases together spend at most the budget.
    assert PROVISIONAL_SHARE * EPSILON + (1 - PROVISIONAL_SHARE) * EPSILON <= EPSILON


def test_nothing_is_released_before_the_first_week() -> None:
    now = at(monday(WEEK) + datetime.timedelta(days=7 * 5 + 2))  # Wednesday, five weeks later
    weeks = [name for name, _, _ in _due(now)]
    assert weeks == [WEEK, *(week_after(WEEK, k) for k in range(1, 5))]
    assert _due(now, first_week=week_after(WEEK, 3)) == [
        (week_after(WEEK, 3), PROVISIONAL, 0.5),
        (week_after(WEEK, 4), PROVISIONAL, 0.5),
    ]
    assert _due(now, first_week="") == []  # no first week: nothing (a database always has one)


def test_nothing_whose_start_the_retention_may_have_deleted() -> None:
    now = at(monday(WEEK) + datetime.timedelta(days=7 * 10 + 3))  # Thursday, ten weeks later
    today = monday(WEEK) + datetime.timedelta(days=7 * 10 + 3)
    released = [name for name, _, _ in _due(now, retain_days=1000)]
    assert len(released) == 10
    for retain in (30, 37, 44.5, 45, 60):
        names = [name for name, _, _ in _due(now, retain_days=retain)]
        starts = [monday(n) for n in names]
        # The roll-up deletes the days before the day of (now - retain): a period from that day on is whole ...
        first_kept = (
            datetime.datetime.fromtimestamp(now, datetime.timezone.utc) - datetime.timedelta(days=retain)
        ).date()
        assert all(s >= first_kept for s in starts), (retain, names)
        # ... and everything that starts on today - floor(retain) or later (never before that day) is released.
        assert names == [n for n in released if monday(n) >= today - datetime.timedelta(days=math.floor(retain))]


def test_months_quarters_and_years_once_the_week_of_their_last_day_is_closed() -> None:
    first = "2026-W53"  # Monday 2026-12-28: January 2027, its quarter and its year are whole from there
    now = at(datetime.date(2027, 5, 12))
    closed = "2027-W13"  # ends Sunday 2027-04-04: March's last day is in a closed week, April's not
    longer = {"first_week": first, "retain_days": 800}
    plans = _due(now, closed_through=closed, **longer)  # type: ignore[arg-type]
    others = [(name, kind, eps) for name, kind, eps in plans if "W" not in name]
    assert others == [
        ("2027-01", FINAL, 1.0),
        ("2027-02", FINAL, 1.0),
        ("2027-03", FINAL, 1.0),
        ("2027-Q1", FINAL, 1.0),
    ]
    made = {(name, kind) for name, kind, _ in plans}
    assert [p for p in _due(now, closed_through=closed, made=made, **longer) if "W" not in p[0]] == []  # type: ignore[arg-type]
    year_end = at(datetime.date(2028, 2, 10))
    plans = _due(year_end, closed_through="2028-W02", made=made, epsilon=0.3, **longer)  # type: ignore[arg-type]
    assert ("2027", FINAL, 0.3) in plans
    assert ("2027-Q4", FINAL, 0.3) in plans
    assert sum(1 for name, _, _ in plans if name == "2027") == 1


def _run_schedule(
    start: datetime.date, days: int, *, retain_days: float = Retention().retain_days, max_age_days: int = 30
) -> list[Plan]:
    """Every release the schedule makes with a roll-up every six hours from ``start`` for ``days`` days."""
    made: set[tuple[str, str]] = set()
    out: list[Plan] = []
    closed = ""
    first = "{:04d}-W{:02d}".format(*start.isocalendar()[:2])
    for step in range(days * 4):
        now = at(start, 0.5) + step * 6 * 3600
        closed = max(closed, closing_week(now, max_age_days * DAY))
        plans = due(now=now, first_week=first, closed_through=closed, retain_days=retain_days, epsilon=1.0, made=made)
        for plan in plans:
            assert (plan.period.name, plan.kind) not in made
            made.add((plan.period.name, plan.kind))
        out += plans
    return out


def test_the_schedule_over_two_years() -> None:
    """Every week gets at most one provisional and exactly one final release, together at most ε; every whole
    month and quarter exactly one final release at ε."""
    start = datetime.date(2026, 12, 28)  # the Monday of 2026-W53: January 2027 is whole from there
    plans = _run_schedule(start, 2 * 366)
    spent: dict[str, float] = {}
    kinds: dict[str, list[str]] = {}
    for plan in plans:
        spent[plan.period.name] = spent.get(plan.period.name, 0.0) + plan.epsilon
        kinds.setdefault(plan.period.name, []).append(plan.kind)
    weeks = [name for name in kinds if "W" in name]
    assert len(weeks) >= 100
    for name in weeks:
        if monday(name) + datetime.timedelta(days=7 + 30 + 1) < start + datetime.timedelta(days=2 * 366):
            assert kinds[name] == [PROVISIONAL, FINAL], name  # ended, then closed: both, in that order
        assert spent[name] <= 1.0 + 1e-12
    months = [name for name in kinds if len(name) == 7 and "-Q" not in name and "W" not in name]
    assert months[:3] == ["2027-01", "2027-02", "2027-03"]
    assert len(months) >= 22
    assert all(kinds[name] == [FINAL] and spent[name] == 1.0 for name in months)
    quarters = [name for name in kinds if "-Q" in name]
    assert quarters[:2] == ["2027-Q1", "2027-Q2"]
    assert all(kinds[name] == [FINAL] for name in quarters)


def test_every_year_is_released_under_the_default_settings() -> None:
    """2029 ends on a Monday: with the old 400-day retention its 1 January had left the window before the week of
    its 31 December closed (tests/collector/test_collector_rollup.py checks every year to 2060)."""
    plans = _run_schedule(datetime.date(2028, 12, 25), 500)
    assert "2029" in {plan.period.name for plan in plans}


# -- the noise -----------------------------------------------------------------------------------------------------


def _opendp_space() -> tuple[object, object]:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64")


@pytest.mark.parametrize("sensitivity", [1, WEEK_SENSITIVITY, 11])
@pytest.mark.parametrize("epsilon", [0.05, 0.25, 0.5, 1.0, 3.0, MAX_EPSILON])
def test_noisy_spends_at_most_epsilon_by_opendps_own_map(sensitivity: int, epsilon: float) -> None:
    import opendp.prelude as dp

    noisy = Noisy(sensitivity=sensitivity, epsilon=epsilon)
    assert noisy.sensitivity == sensitivity
    assert noisy.epsilon <= epsilon
    assert noisy.epsilon >= epsilon * (1 - 1e-9)  # and wastes none of it
    assert noisy.scale == pytest.approx(sensitivity / epsilon, rel=1e-9)
    # OpenDP's map of a measurement built anew with the stated scale: what the release states is what it spends.
    rebuilt = dp.m.make_laplace(*_opendp_space(), scale=noisy.scale)
    assert float(rebuilt.map(sensitivity)) <= epsilon
    assert float(rebuilt.map(sensitivity)) == noisy.epsilon
    # The margin is OpenDP's accuracy at ALPHA, rounded up, and the interval holds with probability 1 - ALPHA.
    assert noisy.margin == math.ceil(float(dp.discrete_laplacian_scale_to_accuracy(noisy.scale, ALPHA)))
    assert discrete_laplace_tail(noisy.scale, noisy.margin) <= ALPHA


def test_noisy_refuses_a_budget_it_cannot_state() -> None:
    for bad in (0, -1.0, MAX_EPSILON * 1.01, math.inf, math.nan):
        with pytest.raises(ValueError, match="epsilon must be a number above 0"):
            Noisy(sensitivity=1, epsilon=bad)


DRAWS = 20_000
P_FLOOR = 1e-6
"""A correct sampler fails a distribution test with probability P_FLOOR (the chi-square p-value's floor)."""


def test_noise_follows_the_discrete_laplace_distribution() -> None:
    """20,000 draws at scale 2 against P(k) proportional to exp(-|k|/2): Pearson's chi-square, bins expecting at
    least 20 draws, rejected below p = 1e-6; the same test rejects a scale only 10 % off."""
    noisy = Noisy(sensitivity=1, epsilon=0.5)
    assert noisy.scale == 2.0
    # The noise does not depend on the value it is added to.
    values = [0, 7, -3, 1_000_000]
    out = noisy([v for v in values for _ in range(DRAWS // len(values))])
    noise = [o - v for o, v in zip(out, (v for v in values for _ in range(DRAWS // len(values))), strict=True)]
    p, df = chi2_test(noise, discrete_laplace_pmf(noisy.scale))
    assert df >= 15
    assert p >= P_FLOOR, (p, df)
    # Centred and spread as the distribution says (variance 2r/(1-r)^2 = 7.83 at scale 2), as a sanity check.
    mean = sum(noise) / len(noise)
    assert abs(mean) < 0.15
    r = math.exp(-1 / noisy.scale)
    variance = sum(x * x for x in noise) / len(noise)
    assert variance == pytest.approx(2 * r / (1 - r) ** 2, rel=0.1)
    # Power: noise at scale 2.2 fails the test of scale 2.
    wider = Noisy(sensitivity=11, epsilon=5.0)
    assert wider.scale == pytest.approx(2.2)
    p_wrong, _ = chi2_test(wider([0] * DRAWS), discrete_laplace_pmf(noisy.scale))
    assert p_wrong < P_FLOOR


# -- a release -----------------------------------------------------------------------------------------------------


def _week_plan(week: str = WEEK, kind: str = PROVISIONAL, epsilon: float = 0.5) -> Plan:
    (period,) = (p for p in periods(monday(week), monday(week) + datetime.timedelta(days=6)) if p.unit == "week")
    return Plan(period, kind, epsilon)


def _population(store: Store, week: str = WEEK) -> None:
    day = monday(week)
    store.insert(
        [
            event_row(
                ("dev", week, i),
                day + datetime.timedelta(days=i % 7),
                version=["5.2", "4.2", "4.1", "6.0"][i % 4],
                python=["CPython 3.12", "CPython 3.11", "PyPy 3.10"][i % 3],
                os_name=["Linux", "macOS", "Windows", "FreeBSD"][i % 4],
            )
            for i in range(60)
        ]
    )


def test_a_release_adds_noise_of_its_stated_scale_to_every_cell(store: Store) -> None:
    """150 releases of one week: each body states its mechanism; every cell of the vocabulary is released, and
    released minus true, over all cells, follows the discrete Laplace distribution of the stated scale."""
    _population(store)
    true = flat(counts(store))
    plan = _week_plan()
    now = at(monday(WEEK) + datetime.timedelta(days=8), 1.0)
    noise: list[int] = []
    per_cell: dict[tuple[str, str], set[int]] = {key: set() for key in true}
    for _ in range(150):
        item = _release.release(store, plan, app="Django", now=now)
        assert (item.app, item.period, item.kind, item.made) == ("Django", WEEK, PROVISIONAL, iso_time(now))
        body = json.loads(item.body)
        assert body["epsilon"] == item.epsilon <= plan.epsilon
        assert (body["schema"], body["unit"], body["kind"], body["sensitivity"]) == (1, "week", PROVISIONAL, 6)
        assert (body["first_day"], body["last_day"]) == ("2027-02-01", "2027-02-07")
        assert body["scale"] == 12.0
        assert "OpenDP" in body["mechanism"]
        assert "discrete Laplace" in body["mechanism"]
        released = {("developers", ""): body["developers"]}
        for name in BREAKDOWNS:
            assert tuple(body[name]) == vocabulary("Django")[name]
            released.update({(name, v): n for v, n in body[name].items()})
        assert released.keys() == true.keys()
        for key, n in released.items():
            noise.append(n - true[key])
            per_cell[key].add(n)
    p, _ = chi2_test(noise, discrete_laplace_pmf(12.0))
    assert p >= P_FLOOR
    # No cell is left without noise (at scale 12, 150 equal draws have probability below 1e-150).
    assert all(len(seen) > 1 for seen in per_cell.values())


def test_a_month_releases_its_developers_only(store: Store) -> None:
    _population(store)
    (feb,) = (p for p in periods(datetime.date(2027, 2, 1), datetime.date(2027, 2, 28)) if p.unit == "month")
    item = _release.release(store, Plan(feb, FINAL, 1.0), app="Django", now=at(datetime.date(2027, 4, 20)))
    body = json.loads(item.body)
    assert (item.period, item.kind, body["unit"]) == ("2027-02", FINAL, "month")
    assert (body["sensitivity"], body["scale"]) == (1, 1.0)
    assert set(body) & {*BREAKDOWNS} == set()
    assert isinstance(body["developers"], int)


# -- post-processing -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("released", "margin", "min_count", "published"),
    [
        pytest.param(100, 7, 10, {"estimate": 100, "low": 93, "high": 107}, id="large"),
        pytest.param(25, 37, 10, {"estimate": 25, "low": 0, "high": 62, "fewer_than": 37}, id="below-the-margin"),
        pytest.param(9, 3, 10, {"estimate": 9, "low": 6, "high": 12, "fewer_than": 10}, id="below-min-count"),
        pytest.param(10, 3, 10, {"estimate": 10, "low": 7, "high": 13}, id="at-min-count"),
        pytest.param(37, 37, 10, {"estimate": 37, "low": 0, "high": 74}, id="at-the-margin"),
        pytest.param(-5, 7, 10, {"estimate": 0, "low": 0, "high": 2, "fewer_than": 10}, id="negative"),
        pytest.param(-50, 37, 1, {"estimate": 0, "low": 0, "high": 0, "fewer_than": 37}, id="far-below-zero"),
    ],
)
def test_number(released: int, margin: int, min_count: int, published: dict[str, int]) -> None:
    assert number(released, margin, min_count) == published


@given(released=st.integers(-1000, 10**6), margin=st.integers(0, 500), min_count=st.integers(1, 100))
def test_number_is_an_estimate_with_its_interval(released: int, margin: int, min_count: int) -> None:
    out = number(released, margin, min_count)
    assert out["estimate"] == max(released, 0)
    assert out["low"] <= out["estimate"] <= out["high"]
    assert (out["low"], out["high"]) == (max(released - margin, 0), max(released + margin, 0))
    if out["estimate"] < max(min_count, margin):
        assert out["fewer_than"] == max(min_count, margin)
    else:
        assert "fewer_than" not in out


def _made(store: Store, *nows: float, closed: str = "") -> list[Release]:
    out = []
    for now in nows:
        if closed:
            store.close_weeks(closed)
        out += _release.make(store, app="Django", now=now, retain_days=400)
    return out


def test_document_shows_each_periods_newest_release(store: Store) -> None:
    store.set_first_week(WEEK)
    _population(store)
    _population(store, week_after(WEEK))
    first = _made(store, at(monday(WEEK) + datetime.timedelta(days=8)))
    assert [(r.period, r.kind) for r in first] == [(WEEK, PROVISIONAL)]
    second = _made(store, at(monday(WEEK) + datetime.timedelta(days=15)))
    assert [(r.period, r.kind) for r in second] == [(week_after(WEEK), PROVISIONAL)]
    third = _made(store, at(monday(WEEK) + datetime.timedelta(days=16)), closed=WEEK)
    assert [(r.period, r.kind) for r in third] == [(WEEK, FINAL)]
    releases = store.releases("Django")
    assert sorted(releases) == sorted(first + second + third)
    publishing = Publishing(min_count=5, licence="CC0-1.0")
    doc = document(releases, publishing)
    assert document(list(reversed(releases)), publishing) == doc  # a function of the releases, not their order
    assert (doc["app"], doc["epsilon"], doc["min_count"], doc["licence"]) == ("Django", 1.0, 5, "CC0-1.0")
    assert doc["made"] == third[0].made
    assert doc["downloads"] == {"json": "/v1/releases.json", "csv": "/v1/releases.csv"}
    assert (doc["months"], doc["quarters"], doc["years"]) == ([], [], [])
    weeks = doc["weeks"]
    assert isinstance(weeks, list)
    assert [(w["week"], w["release"], w["week_epsilon"]) for w in weeks] == [
        (WEEK, FINAL, 1.0),  # the final release shown; both releases' budget stated
        (week_after(WEEK), PROVISIONAL, 0.5),
    ]
    for shown, item in zip(weeks, [third[0], second[0]], strict=True):
        body = json.loads(item.body)
        assert shown["made"] == item.made
        assert shown["epsilon"] == item.epsilon
        assert shown["margin"] == body["margin"] == 37
        assert shown["developers"] == number(body["developers"], 37, 5)
        # The cells: "fewer than N" from the family-wise threshold (58 cells at scale 12: 77), the intervals are
        # each cell's own 95 % margin.
        assert shown["cell_threshold"] == cell_threshold(body["scale"], 58) == 77
        for name in BREAKDOWNS:
            assert shown[name] == {v: number(n, 37, 5, threshold=77) for v, n in body[name].items()}
            order = list(shown[name])
            assert order[-1] == OTHER
            named = order[:-1]
            assert named == sorted(named, key=lambda v: (-max(body[name][v], 0), v))  # larger first, then by name
    assert json.loads(json.dumps(doc)) == doc


def test_document_shows_the_final_release_when_both_were_made_in_the_same_second(store: Store) -> None:
    """Two roll-ups in the same second (another process with a shorter maximum age closed the week meanwhile): the
    final release is still the one shown, whatever order the store lists them in."""
    store.set_first_week(WEEK)
    _population(store)
    now = at(monday(WEEK) + datetime.timedelta(days=8))
    (provisional,) = _release.make(store, app="Django", now=now, retain_days=400)
    store.close_weeks(WEEK)
    (final,) = _release.make(store, app="Django", now=now, retain_days=400)
    assert (provisional.kind, final.kind, provisional.made) == (PROVISIONAL, FINAL, final.made)
    for releases in ([provisional, final], [final, provisional], store.releases("Django")):
        (week,) = document(releases, Publishing())["weeks"]  # type: ignore[misc]
        assert (week["release"], week["week_epsilon"]) == (FINAL, 1.0)
        assert week["developers"] == number(json.loads(final.body)["developers"], week["margin"], 10)


def test_document_of_nothing() -> None:
    doc = document([], Publishing())
    assert (doc["made"], doc["first_week"]) == (None, None)
    assert document([], Publishing(), first_week="2026-W40")["first_week"] == "2026-W40"
    assert (doc["weeks"], doc["months"], doc["quarters"], doc["years"]) == ([], [], [], [])
    assert "differential privacy" in str(doc["guarantee"])


def test_downloads_hold_every_release_as_released(store: Store) -> None:
    store.set_first_week(WEEK)
    _population(store)  # the next week is empty: its cells are noise around 0, some of it below 0
    made = _made(store, at(monday(WEEK) + datetime.timedelta(days=15)))
    made += _made(store, at(datetime.date(2027, 4, 20)), closed="2027-W14")
    kinds = {(r.period, r.kind) for r in made}
    assert {(WEEK, FINAL), (week_after(WEEK), FINAL), ("2027-02", FINAL)} <= kinds
    assert (WEEK, PROVISIONAL) in kinds
    releases = store.releases("Django")
    assert len(releases) == len(made)
    publishing = Publishing(licence="CC-BY-4.0")
    as_json = json.loads(releases_json(releases, publishing))
    assert as_json["app"] == "Django"
    assert as_json["licence"] == "CC-BY-4.0"
    ordered = sorted(releases, key=lambda r: (r.period, r.made))
    assert as_json["releases"] == [json.loads(r.body) for r in ordered]
    assert [(b["period"], b["kind"], b["epsilon"]) for b in as_json["releases"]] == [
        (r.period, r.kind, r.epsilon) for r in ordered
    ]
    rows = list(csv.reader(io.StringIO(releases_csv(releases, publishing).decode("ascii"))))
    assert tuple(rows[0]) == CSV_COLUMNS
    records = [dict(zip(CSV_COLUMNS, row, strict=True)) for row in rows[1:]]
    expected = []
    for body in as_json["releases"]:
        cells = [("developers", "", body["developers"])]
        cells += [(name, v, n) for name in BREAKDOWNS for v, n in body.get(name, {}).items()]
        expected += [
            {
                "app": "Django",
                "period": body["period"],
                "unit": body["unit"],
                "kind": body["kind"],
                "made": body["made"],
                "epsilon": str(body["epsilon"]),
                "mechanism": body["mechanism"],
                "scale": str(body["scale"]),
                "margin": str(body["margin"]),
                "breakdown": name,
                "value": value,
                "released": str(n),
                "licence": "CC-BY-4.0",
            }
            for name, value, n in cells
        ]
    assert records == expected
    # Raw: the noisy counts as released, below zero too (an empty week: ~46 % of its cells; all >= 0 has p < 1e-15).
    assert any(int(r["released"]) < 0 for r in records)


# -- configuration values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.01, 0.5, 1, 10])
def test_check_epsilon_accepts(value: float) -> None:
    assert check_epsilon(value) == float(value)
    assert isinstance(check_epsilon(value), float)


@pytest.mark.parametrize("value", [0, 0.0, -1, 10.000001, math.inf, math.nan, True, "1", None])
def test_check_epsilon_refuses(value: object) -> None:
    with pytest.raises(ValueError, match=r"epsilon must be a number above 0 and at most 10, got"):
        check_epsilon(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), (" 0.5 ", 0.5), ("1e1", 10.0), ("0.01", 0.01)])
def test_parse_epsilon(text: str, value: float) -> None:
    assert parse_epsilon(text) == value


@pytest.mark.parametrize("text", ["", "one", "nan", "NaN", "inf", "-inf", "0", "-0.5", "11", "1e2", "0x1"])
def test_parse_epsilon_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"epsilon must be a number above 0 and at most 10, got"):
        parse_epsilon(text)


@pytest.mark.parametrize("text", ["1", " 10 ", "999999999"])
def test_parse_min_count(text: str) -> None:
    assert parse_min_count(text) == int(text)
    assert check_min_count(int(text)) == int(text)


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5", "ten", "1000000000", "\u0661"])
def test_parse_min_count_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"the minimum count must be a whole number of at least 1, got"):
        parse_min_count(text)


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "10", None])
def test_check_min_count_refuses(value: object) -> None:
    with pytest.raises(ValueError, match=r"min_count must be a whole number of at least 1, got"):
        check_min_count(value)  # type: ignore[arg-type]


def test_iso_week_of_a_time_only_in_its_exact_form() -> None:
    assert iso_week("2026-12-03T08:15:48Z") == "2026-W49"
    assert iso_week("2027-01-03T23:59:59Z") == "2026-W53"
    for bad in ("2026-12-03", "2026-12-03T08:15:48+00:00", "2026-02-30T00:00:00Z", "tomorrow"):
        assert iso_week(bad) is None


def test_first_week_of() -> None:
    assert first_week_of(" 2026-W53 ") == "2026-W53"
    for bad in ("2027-W53", "2026-W00", "2026-w01", "2026-W1", "W01", ""):
        with pytest.raises(ValueError, match="not an ISO week"):
            first_week_of(bad)


def test_a_value_nobody_used_rarely_shows_a_number() -> None:
    """The cells' "fewer than N" is family-wise: in a release of a week, with every one of its 58 cells empty, any
    cell reaches N in at most FAMILY_ALPHA of the releases (one in twenty); the per-cell margin would let one
    through in most releases. 3,000 releases through the mechanism the releases use."""
    noisy = Noisy(sensitivity=WEEK_SENSITIVITY, epsilon=0.5)
    threshold = cell_threshold(noisy.scale, 58)
    trials = 3000
    shown_at_threshold = shown_at_margin = 0
    for _ in range(trials):
        draws = noisy([0] * 58)
        shown_at_threshold += max(draws) >= threshold
        shown_at_margin += max(draws) >= noisy.margin
    slack = 4 * math.sqrt(FAMILY_ALPHA * (1 - FAMILY_ALPHA) / trials)  # four standard deviations
    assert shown_at_threshold / trials <= FAMILY_ALPHA + slack
    assert shown_at_threshold / trials >= FAMILY_ALPHA / 4  # not a threshold so high that nothing ever shows
    assert shown_at_margin / trials > 0.5  # what the per-cell margin did
    # The formula is the distribution's own: P(X >= t) = q^t / (1 + q), q = exp(-1/b), summed over the cells.
    q = math.exp(-1 / noisy.scale)
    assert 58 * q**threshold / (1 + q) <= FAMILY_ALPHA < 58 * q ** (threshold - 1) / (1 + q)
