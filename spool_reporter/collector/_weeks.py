"""The collector's calendar: ISO 8601 weeks (``"2026-W49"``), the unit it stores, counts and releases by.

The one place that turns a day or a time into its week and a week back into its Monday, for the store, the
releases, the statistics and the page alike. A week's name sorts as text in calendar order (``"2026-W53"`` <
``"2027-W01"``), which the store and the roll-up rely on. Standard library only (and the event's own time
parser).
"""

from __future__ import annotations

import datetime
import functools

from spool_reporter._event import MEMO_SIZE

__all__ = [
    "first_week_of",
    "iso_week",
    "monday",
    "monday_or_none",
    "this_week",
    "week_before",
    "week_of",
    "week_of_valid",
]


def week_of(day: datetime.date) -> str:
    """The ISO week of ``day``: ``date(2026, 12, 3)`` -> ``"2026-W49"``."""
    year, num, _ = day.isocalendar()
    return f"{year:04d}-W{num:02d}"


def monday(week: str) -> datetime.date:
    """The first day of ``week`` (``"2026-W49"`` -> ``date(2026, 11, 30)``); :exc:`ValueError` unless it is one."""
    year, num = week.split("-W")
    return datetime.date.fromisocalendar(int(year), int(num), 1)


def monday_or_none(week: str) -> datetime.date | None:
    """:func:`monday` of ``week``, or ``None`` if it is no ISO week (a name from a database written by hand)."""
    try:
        return monday(week)
    except ValueError:
        return None


def iso_week(time_text: str) -> str | None:
    """``"2026-12-03T08:15:48Z"`` -> ``"2026-W49"``; ``None`` unless it is a real UTC time in that exact form."""
    from spool_reporter._event import parse_time

    if parse_time(time_text) is None:
        return None
    return week_of_valid(time_text)


def week_of_valid(time_text: str) -> str:
    """:func:`iso_week` of a time already validated (:func:`spool_reporter._event.check` did): no re-parse."""
    return _week_of_day(time_text[:10])


@functools.lru_cache(maxsize=MEMO_SIZE)
def _week_of_day(day: str) -> str:
    """``"2026-12-03"`` -> ``"2026-W49"``, remembered for the days seen (the time window keeps them few)."""
    return week_of(datetime.date(int(day[0:4]), int(day[5:7]), int(day[8:10])))


def this_week(now: float) -> str:
    """The ISO week of the epoch time ``now`` (UTC)."""
    return week_of(datetime.datetime.fromtimestamp(now, datetime.timezone.utc).date())


def week_before(week: str) -> str:
    """The ISO week before ``week`` (``"2027-W01"`` -> ``"2026-W53"``)."""
    return week_of(monday(week) - datetime.timedelta(days=7))


def first_week_of(text: str) -> str:
    """``--first-week``'s text (``"2026-W49"``) checked: a real ISO week; :exc:`ValueError` otherwise."""
    first = monday_or_none(text.strip())
    if first is None or week_of(first) != text.strip():
        msg = f"not an ISO week like 2026-W49: {text!r}"
        raise ValueError(msg)
    return text.strip()
