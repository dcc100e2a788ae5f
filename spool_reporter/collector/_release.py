"""The public numbers as releases: each made once, by a differentially private mechanism, and stored.

**The guarantee.** Everything the collector publishes (``GET /``, ``GET /v1/stats``, the downloads) is read
from stored releases, and every number in a release is a true count plus noise drawn by OpenDP's discrete
Laplace mechanism (``make_laplace`` on integers: an exact sampler, Canonne, Kamath and Steinke 2020).
Whether one developer took part in a period, and which values they had, changes the probability of
anything released about that period by at most a factor e^ε, where ε is the release's budget (stored with
it). A release is never recomputed, so polling, several workers, late events, a forget or the retention
learn nothing new from it: each period has a fixed, small number of releases (:data:`KINDS`).

**One developer's contribution is bounded.** A developer is a client id. In a week they count once in the
total and once in each breakdown (``by_django``, ``by_python``, ``by_os``), under one value chosen by a
fixed rule: the newest version they used that week (the greatest by number; for an operating system, the
last by name). Each value is mapped onto a fixed vocabulary (:func:`vocabulary`, with ``"other"`` for
everything else) that does not depend on the data, and every cell of it is released, zero or not, so the
set of cells published says nothing either. Adding or removing a developer changes the released vector by
at most 4 in L1 norm (the total and one cell per breakdown); changing their values by at most 6 (two cells
per breakdown): the noise is scaled to :data:`WEEK_SENSITIVITY` = 6, so both are covered by ε. A month, a
quarter and a year release one number each, the distinct developers, of sensitivity 1.

**The budget** (``--epsilon``, default :data:`EPSILON`) is spent per developer and per period: a week's
ε is split between its two releases (:data:`PROVISIONAL_SHARE` for the provisional one when the week has
ended, the rest for the final one when it closes; a week that closed before its provisional release was
made gets only the final one, at the same share); each month, quarter and year gets ε for its one number.
By basic composition, a developer active all year is covered by 52 ε (weeks; 53 in some years) + 12 ε
(months) + 4 ε (quarters) + ε (a year) for everything ever published about that year: the docs spell this
out.

**What is released when.** Only periods on or after the first week of ``release_state`` (the week the
database was created, or the operator's choice), whose events the retention still keeps entirely (never a
period half deleted), and only once: a week's provisional release once it has ended, its final release once
it is closed (:mod:`._rollup`: no event of it can arrive any more); a month, quarter or year once the week of
its last day is closed. The roll-up (:func:`._rollup.rollup`) makes them, under its lock, before it deletes
anything.
"""

from __future__ import annotations

import datetime
import json
import math

from spool_reporter._event import OS_FAMILIES, OTHER, iso_time

from . import _weeks
from ._common import DEFAULT_MAX_AGE_DAYS, EPSILON, CollectorError, Release, check_epsilon
from ._store import BREAKDOWN_SQL, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Final, NamedTuple

    from ._store import Reader
else:
    from typing import NamedTuple

PROVISIONAL_SHARE: Final = 0.5
"""The share of a week's ε spent on its provisional release; the final release spends the rest."""

PROVISIONAL: Final = "provisional"
FINAL: Final = "final"
KINDS: Final = (PROVISIONAL, FINAL)
"""A week has at most these two releases; a month, a quarter and a year only a final one."""

WEEK_SENSITIVITY: Final = 6
"""How much one developer can change a week's released vector in L1 norm: 4 by taking part (the total and
one cell per breakdown), 6 by changing values (one cell out and one in, per breakdown)."""

PERIOD_SENSITIVITY: Final = 1
"""How much one developer can change a month's, a quarter's or a year's one count."""

ALPHA: Final = 0.05
"""Each released number carries the interval that holds the true count with probability 1 - ALPHA (95 %)."""

BODY_SCHEMA: Final = 1
"""The version of a release's JSON body."""

BREAKDOWNS: Final = tuple(BREAKDOWN_SQL)
"""The names of the breakdowns a week releases (those of :data:`~._store.BREAKDOWN_SQL`, in its order), each over
its fixed vocabulary (:func:`vocabulary`)."""

DJANGO_VERSIONS: Final = (
    *(f"1.{m}" for m in range(8, 12)),
    *(f"2.{m}" for m in range(3)),
    *(f"3.{m}" for m in range(3)),
    *(f"4.{m}" for m in range(3)),
    *(f"5.{m}" for m in range(3)),
    *(f"6.{m}" for m in range(3)),
    *(f"7.{m}" for m in range(3)),
)
"""Django's feature releases from 1.8 (LTS, 2015) to 7.2 (due in 2028): the versions released by name; every
other version counts under ``"other"``. Extending it changes later releases only."""

PYTHON_VERSIONS: Final = tuple(f"3.{m}" for m in range(8, 17))
"""Python 3.8 to 3.16, for each implementation of :data:`PYTHON_IMPLEMENTATIONS`."""

PYTHON_IMPLEMENTATIONS: Final = ("CPython", "PyPy", "GraalPy")
"""The implementations released by name (``spool_reporter._event.PYTHON_IMPLEMENTATIONS`` without "other")."""

PYTHON_CELLS: Final = tuple(f"{impl} {version}" for impl in PYTHON_IMPLEMENTATIONS for version in PYTHON_VERSIONS)

OS_CELLS: Final = tuple(sorted(OS_FAMILIES - {OTHER}))
"""The validator's operating system families (``"other"`` apart)."""


def vocabulary(app: str) -> dict[str, tuple[str, ...]]:
    """Breakdown -> the values released for ``app``, ``"other"`` last: fixed, never taken from the data.
    An application other than Django has no versions named (all of them count under ``"other"``)."""
    versions = DJANGO_VERSIONS if app == "Django" else ()
    return {
        "by_django": (*versions, OTHER),
        "by_python": (*PYTHON_CELLS, OTHER),
        "by_os": (*OS_CELLS, OTHER),
    }


# -- counting, one value per developer ---------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    """``"5.2"`` -> ``(5, 2)``, so that the newest version wins; a value that is no version sorts first."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return (-1,)


def _python_key(value: str) -> tuple[tuple[int, ...], str]:
    impl, _, version = value.partition(" ")
    return _version_key(version), impl


def week_counts(reader: Reader, app: str, week: str) -> tuple[int, dict[str, dict[str, int]]]:
    """(distinct developers, breakdown -> value -> developers) of ``app`` in ``week``: every value of
    :func:`vocabulary`, each developer counted once per breakdown, under the value of the fixed rule."""
    words = vocabulary(app)
    chosen: dict[str, tuple[str, str, str]] = {}
    columns = ", ".join(BREAKDOWN_SQL.values())  # app_version, python || ' ' || python_version, os
    rows = reader.query(
        f"SELECT client_id, {columns} FROM events WHERE app = ? AND week = ? GROUP BY client_id, {columns}",  # noqa: S608
        (app, week),
    )
    for client, version, python, family in rows:
        mine = (str(version), str(python), str(family))
        seen = chosen.get(str(client))
        if seen is not None:
            mine = (
                max(seen[0], mine[0], key=_version_key),
                max(seen[1], mine[1], key=_python_key),
                max(seen[2], mine[2]),
            )
        chosen[str(client)] = mine
    cells = {name: dict.fromkeys(values, 0) for name, values in words.items()}
    for values in chosen.values():
        for name, value in zip(BREAKDOWNS, values, strict=True):
            counts = cells[name]
            key = value if value in counts else OTHER
            counts[key] += 1
    return len(chosen), cells


def period_developers(reader: Reader, app: str, first: datetime.date, last: datetime.date) -> int:
    """Distinct developers of ``app`` with an event on a day from ``first`` to ``last``."""
    ((n,),) = reader.query(
        "SELECT COUNT(DISTINCT client_id) FROM events WHERE app = ? AND week >= ? AND week <= ? "
        "AND time >= ? AND time <= ?",
        (app, _weeks.week_of(first), _weeks.week_of(last), first.isoformat(), last.isoformat()),
    )
    return int(n)  # type: ignore[call-overload,no-any-return]


# -- the mechanism ------------------------------------------------------------------------------------------


def _opendp() -> Any:
    try:
        import opendp.prelude as dp
    except ImportError as exc:  # the collector extra holds it
        msg = "the public releases need OpenDP: pip install 'spool_reporter[collector]'"
        raise CollectorError(msg) from exc
    dp.enable_features("contrib")
    return dp


def mechanism_name() -> str:
    """The mechanism as a release names it (with OpenDP's version)."""
    from importlib.metadata import version

    return f"discrete Laplace, OpenDP {version('opendp')} make_laplace"


class Noisy:
    """The discrete Laplace mechanism over integer vectors, scaled for ``sensitivity`` (L1) and ``epsilon``.

    :ivar scale: the noise scale b (P(k) proportional to exp(-|k| / b)).
    :ivar epsilon: the ε OpenDP's privacy map gives for ``sensitivity`` (at most the one asked for).
    :ivar margin: the half-width of the interval holding the true count with probability 1 - :data:`ALPHA`.
    """

    def __init__(self, *, sensitivity: int, epsilon: float) -> None:
        dp = _opendp()
        space = (dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"))
        scale = sensitivity / check_epsilon(epsilon)
        measurement = dp.m.make_laplace(*space, scale=scale)
        spent = float(measurement.map(sensitivity))
        if spent > epsilon:  # OpenDP rounds its map up: widen the noise by that much, once
            scale *= spent / epsilon * (1 + 1e-12)
            measurement = dp.m.make_laplace(*space, scale=scale)
            spent = float(measurement.map(sensitivity))
        if spent > epsilon * (1 + 1e-9):
            msg = f"OpenDP's map gives {spent} for a budget of {epsilon}"
            raise CollectorError(msg)
        self._measurement = measurement
        self.scale = scale
        self.epsilon = spent
        self.sensitivity = sensitivity
        self.margin = math.ceil(float(dp.discrete_laplacian_scale_to_accuracy(scale, ALPHA)))

    def __call__(self, values: Sequence[int]) -> list[int]:
        return [int(v) for v in self._measurement([int(v) for v in values])]


# -- periods and the schedule -------------------------------------------------------------------------------


class Period(NamedTuple):
    """A period released: its unit (``"week"``, ``"month"``, ``"quarter"`` or ``"year"``), name, first and last day."""

    unit: str
    name: str
    first: datetime.date
    last: datetime.date


def periods(start: datetime.date, end: datetime.date) -> list[Period]:
    """Every week, month, quarter and year that begins on or after ``start`` and ends on or before ``end``."""
    out: list[Period] = []
    monday = start + datetime.timedelta(days=(7 - start.weekday()) % 7)
    while monday + datetime.timedelta(days=6) <= end:
        out.append(Period("week", _weeks.week_of(monday), monday, monday + datetime.timedelta(days=6)))
        monday += datetime.timedelta(days=7)
    year, month = start.year, start.month
    if start.day != 1:
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    while True:
        first = datetime.date(year, month, 1)
        nxt = datetime.date(year + 1, 1, 1) if month == 12 else datetime.date(year, month + 1, 1)
        last = nxt - datetime.timedelta(days=1)
        if last > end:
            break
        out.append(Period("month", f"{year:04d}-{month:02d}", first, last))
        if month % 3 == 0 and datetime.date(year, month - 2, 1) >= start:
            out.append(Period("quarter", f"{year:04d}-Q{month // 3}", datetime.date(year, month - 2, 1), last))
        if month == 12 and datetime.date(year, 1, 1) >= start:
            out.append(Period("year", f"{year:04d}", datetime.date(year, 1, 1), last))
        year, month = nxt.year, nxt.month
    return out


class Plan(NamedTuple):
    """A release that is due: the period, its kind and the budget it spends."""

    period: Period
    kind: str
    epsilon: float


def due(
    *,
    now: float,
    first_week: str,
    closed_through: str,
    retain_days: float,
    epsilon: float,
    made: set[tuple[str, str]],
) -> list[Plan]:
    """The releases to make now, oldest first: see this module's docstring for the rules.

    :param closed_through: the newest closed week (``rollup_state``); ``""`` for none.
    :param made: (period, kind) of the releases already stored.
    """
    today = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).date()
    start = _weeks.monday(first_week) if first_week else today
    # The roll-up deletes the events of days before the cutoff's day (``_rollup``): from keep_from on, all are kept.
    keep_from = today - datetime.timedelta(days=math.floor(retain_days))
    start = max(start, keep_from)
    ended = today - datetime.timedelta(days=1)
    plans: list[Plan] = []
    for period in periods(start, ended):
        closed = bool(closed_through) and _weeks.week_of(period.last) <= closed_through
        if period.unit == "week":
            if closed and (period.name, FINAL) not in made:
                plans.append(Plan(period, FINAL, epsilon * (1 - PROVISIONAL_SHARE)))
            elif not closed and (period.name, PROVISIONAL) not in made and (period.name, FINAL) not in made:
                plans.append(Plan(period, PROVISIONAL, epsilon * PROVISIONAL_SHARE))
        elif closed and (period.name, FINAL) not in made:
            plans.append(Plan(period, FINAL, epsilon))
    return plans


# -- making them --------------------------------------------------------------------------------------------


class Expected(NamedTuple):
    """A release not made yet: of ``period``, by the first roll-up from ``day`` 00:00 UTC on."""

    period: str
    day: datetime.date


class Schedule(NamedTuple):
    """When the next releases are due, as the public page states it (:func:`schedule`)."""

    first: Expected | None
    """Before any release: the provisional release of the first week released, once that week has ended."""
    following: Expected | None
    """The provisional release of the week after the newest released, once it has ended."""
    final: Expected | None
    """The final release of the oldest week released only provisionally, once it has closed (with the
    collector's default maximum event age: the document does not hold the operator's)."""


def _day(iso: str) -> datetime.date | None:
    """``2026-11-29`` as a date, if it is one that the schedule can count on from (``None`` otherwise)."""
    try:
        day = datetime.date.fromisoformat(iso)
    except ValueError:
        return None
    return day if day.year < datetime.MAXYEAR else None  # a week or a month later must still be a date


def schedule(weeks: Sequence[tuple[str, str, str]], first_week: str) -> Schedule:
    """When the next releases are due, from the releases' own dates only: ``weeks`` are (ISO week, kind, last
    day) of the weeks released, oldest first; ``first_week`` is the first week released (``release_state``).

    A week's provisional release is made by the first roll-up after it ended (Monday 00:00 UTC); its final one
    by the first roll-up after it closed, the maximum event age after it ended. Dates that are no dates (a
    database written by hand) give no expectation rather than an error.
    """
    first = None
    if not weeks:
        monday = _weeks.monday_or_none(first_week)
        if monday is not None and monday.year < datetime.MAXYEAR:
            first = Expected(first_week, monday + datetime.timedelta(days=7))
    following = None
    latest = _day(weeks[-1][2]) if weeks else None
    if latest is not None:
        following = Expected(_weeks.week_of(latest + datetime.timedelta(days=7)), latest + datetime.timedelta(days=8))
    final = None
    for week, kind, last_day in weeks:
        last = _day(last_day) if kind == PROVISIONAL else None
        if last is not None:
            final = Expected(week, last + datetime.timedelta(days=1 + DEFAULT_MAX_AGE_DAYS))
            break
    return Schedule(first, following, final)


def _body(plan: Plan, noisy: Noisy, app: str, made: str, numbers: dict[str, object]) -> str:
    body: dict[str, object] = {
        "schema": BODY_SCHEMA,
        "app": app,
        "period": plan.period.name,
        "unit": plan.period.unit,
        "kind": plan.kind,
        "first_day": plan.period.first.isoformat(),
        "last_day": plan.period.last.isoformat(),
        "made": made,
        "epsilon": noisy.epsilon,
        "mechanism": mechanism_name(),
        "sensitivity": noisy.sensitivity,
        "scale": noisy.scale,
        "margin": noisy.margin,
        **numbers,
    }
    return json.dumps(body, ensure_ascii=True, separators=(",", ":"))


def release(store: Store, plan: Plan, *, app: str, now: float) -> Release:
    """Count ``plan``'s period in one snapshot, add the noise, and return the release (not yet stored)."""
    made = iso_time(now)
    period = plan.period
    with store.reading() as reader:
        if period.unit == "week":
            total, cells = week_counts(reader, app, period.name)
            noisy = Noisy(sensitivity=WEEK_SENSITIVITY, epsilon=plan.epsilon)
            order = [(name, value) for name, counts in cells.items() for value in counts]
            released = noisy([total, *(cells[name][value] for name, value in order)])
            numbers: dict[str, object] = {"developers": released[0]}
            for (name, value), n in zip(order, released[1:], strict=True):
                numbers.setdefault(name, {})[value] = n  # type: ignore[index]
        else:
            noisy = Noisy(sensitivity=PERIOD_SENSITIVITY, epsilon=plan.epsilon)
            (n,) = noisy([period_developers(reader, app, period.first, period.last)])
            numbers = {"developers": n}
    return Release(app, period.name, plan.kind, made, noisy.epsilon, _body(plan, noisy, app, made, numbers))


def make(store: Store, *, app: str, now: float, retain_days: float, epsilon: float = EPSILON) -> list[Release]:
    """Make and store the releases of ``app`` that are due (the caller holds the roll-up lock); return them.

    :raises CollectorError: OpenDP is not installed, or the database cannot be used.
    """
    check_epsilon(epsilon)
    with store.reading() as reader:
        first = store.first_week(reader)
        closed = store.rollup_state(reader).closed_through
        made = {(r.period, r.kind) for r in store.releases(app, reader)}
    plans = due(now=now, first_week=first, closed_through=closed, retain_days=retain_days, epsilon=epsilon, made=made)
    out: list[Release] = []
    for plan in plans:
        item = release(store, plan, app=app, now=now)
        if store.save_release(item):
            out.append(item)
    return out
