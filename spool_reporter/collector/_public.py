"""The public numbers, served: stored releases (:mod:`._release`) turned into the page, its JSON and the downloads.

Nothing here counts anything. Every number served comes from a release made once by the differentially
private mechanism and stored in the database, so every request of every process, at any time, gets the same
bytes until a new release is made; polling learns nothing new. What is done here is post-processing of
released numbers, which spends no privacy budget and cannot weaken the guarantee:

- each released count n (true count plus noise, possibly below zero) is shown as an **estimate** ``max(n, 0)``
  with its 95 % **interval** ``[max(n - m, 0), n + m]``, where m is the release's margin (the noise stays within
  ±m with probability 95 %);
- an estimate below N is marked ``"fewer_than": N`` and the page shows "fewer than N": such a number cannot be
  told apart from zero, so printing it would only show the noise. For a period's total, N is the larger of
  the display threshold (``--min-count``, default :data:`MIN_COUNT`) and the release's margin (its interval
  would reach 0). For the cells of a week's breakdowns, of which a release has some sixty (most of them values
  nobody used, such as Django 1.8 or GraalPy 3.16), N is the larger of the display threshold and
  :func:`cell_threshold`: a value that nobody used shows a number in at most one release in twenty, instead of
  in most of them;
- a week shows its newest release (the final one once the week closed, else the provisional one); the
  downloads hold every release, with its ε, its mechanism and the licence.

Routes: ``GET /`` (the page), ``GET /v1/stats`` (its JSON: :func:`document`), ``GET /v1/releases.json`` and
``GET /v1/releases.csv`` (every release, as released); :mod:`._served` keeps each process's answers to them.
"""

from __future__ import annotations

import csv
import io
import json
import math

from spool_reporter._event import OTHER

from ._common import RELEASES_CSV_PATH, RELEASES_JSON_PATH, Publishing
from ._release import BREAKDOWNS, FINAL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Final, TypedDict

    from typing_extensions import NotRequired  # typing's own from Python 3.11

    from ._common import Release

    class Number(TypedDict):
        """One released count as published (:func:`number`)."""

        estimate: int
        low: int
        high: int
        fewer_than: NotRequired[int]

    class Period(TypedDict):
        """One period's newest release as published (:func:`_period`). Its name is under its unit's key
        (``"week": "2026-W48"``); only a week has the breakdowns, its ε spent and its cells' threshold."""

        week: NotRequired[str]
        month: NotRequired[str]
        quarter: NotRequired[str]
        year: NotRequired[str]
        release: str
        made: str
        first_day: str
        last_day: str
        epsilon: float
        margin: int
        developers: Number
        week_epsilon: NotRequired[float]
        cell_threshold: NotRequired[int]
        by_django: NotRequired[dict[str, Number]]
        by_python: NotRequired[dict[str, Number]]
        by_os: NotRequired[dict[str, Number]]

    class Downloads(TypedDict):
        json: str
        csv: str

    class Document(TypedDict):
        """The public document (:func:`document`): what ``GET /v1/stats`` serves and the page is made of. Only a
        type: at run time it is the plain dict that is served as JSON."""

        app: str
        guarantee: str
        epsilon: float
        min_count: int
        licence: str
        made: str | None
        first_week: str | None
        downloads: Downloads
        weeks: list[Period]
        months: list[Period]
        quarters: list[Period]
        years: list[Period]


CHECK_SECONDS: Final = 10.0
"""How often a process asks the database whether a release was added (one indexed count); between two checks
it serves the bytes it has. Releases are made at most a few times a week, so this only bounds how late a new
one shows."""

UNITS: Final = (("week", "weeks"), ("month", "months"), ("quarter", "quarters"), ("year", "years"))
"""A release's unit -> the list of the document that holds it."""


FAMILY_ALPHA: Final = 0.05
"""The chance, per release, that any breakdown cell of a value nobody used is shown with a number."""


def cell_threshold(scale: float, cells: int) -> int:
    """The smallest N such that, among ``cells`` cells with discrete Laplace noise of ``scale`` and a true count of
    0, any estimate reaches N with probability at most :data:`FAMILY_ALPHA` (a union bound over the cells).

    For the discrete Laplace distribution, P(X = k) = (1 - q) / (1 + q) q^|k| with q = exp(-1/scale), so
    P(X >= t) = q^t / (1 + q) for t >= 1. Post-processing of the release's public scale: it spends no budget.
    """
    q = math.exp(-1.0 / scale)
    target = FAMILY_ALPHA / max(cells, 1)
    return max(1, math.ceil(math.log(target * (1 + q)) / math.log(q)))


def number(released: int, margin: int, min_count: int, *, threshold: int | None = None) -> Number:
    """One released count as published: ``{"estimate", "low", "high"}``, and ``"fewer_than": N`` when the estimate
    is below N = max(``min_count``, ``threshold``), where ``threshold`` is ``margin`` unless given."""
    estimate = max(released, 0)
    out: Number = {"estimate": estimate, "low": max(released - margin, 0), "high": max(released + margin, 0)}
    shown_from = max(min_count, margin if threshold is None else threshold)
    if estimate < shown_from:
        out["fewer_than"] = shown_from
    return out


def _cells(released: dict[str, int], margin: int, min_count: int, threshold: int) -> dict[str, Number]:
    # Shown first by estimate (the larger first), then by name; "other" last. The order is post-processing too.
    named = sorted((v for v in released if v != OTHER), key=lambda v: (-max(released[v], 0), v))
    if OTHER in released:
        named.append(OTHER)
    return {value: number(released[value], margin, min_count, threshold=threshold) for value in named}


def _period(body: dict[str, Any], min_count: int, week_epsilon: float | None) -> Period:
    """One release's body (as :mod:`._release` stored it) as the document shows it."""
    margin = int(body["margin"])
    unit = str(body["unit"])
    out: Period = {
        unit: body["period"],  # type: ignore[misc]  # the period's own key: its unit's name, one of four
        "release": body["kind"],
        "made": body["made"],
        "first_day": body["first_day"],
        "last_day": body["last_day"],
        "epsilon": body["epsilon"],
        "margin": margin,
        "developers": number(int(body["developers"]), margin, min_count),
    }
    if unit == "week":
        out["week_epsilon"] = week_epsilon  # type: ignore[typeddict-item]  # a week's is always given
        breakdowns: dict[str, dict[str, int]] = {name: body[name] for name in BREAKDOWNS}
        cells = sum(len(values) for values in breakdowns.values())
        threshold = cell_threshold(float(body["scale"]), cells)
        out["cell_threshold"] = max(min_count, threshold)
        for name, values in breakdowns.items():
            out[name] = _cells(values, margin, min_count, threshold)  # type: ignore[literal-required]
    return out


def document(releases: Sequence[Release], publishing: Publishing, *, first_week: str = "") -> Document:
    """The public document (``GET /v1/stats``) of ``releases``: each period's newest release, post-processed.

    ``first_week`` is the first ISO week released (``release_state``: a date of the calendar or the operator's
    choice, never of the data), from which the page works out when the first release is due.
    """
    newest: dict[str, dict[str, Any]] = {}
    spent: dict[str, float] = {}
    made = ""
    # A week's final release is shown over its provisional one, whatever order they come in and whatever their
    # times say (made in the same second by another process, or by a clock set back).
    for item in sorted(releases, key=lambda r: (r.period, r.kind == FINAL, r.made)):
        body = json.loads(item.body)
        newest[item.period] = body
        spent[item.period] = spent.get(item.period, 0.0) + item.epsilon
        made = max(made, item.made)
    periods = {
        key: [
            _period(body, publishing.min_count, spent[period] if unit == "week" else None)
            for period, body in sorted(newest.items())
            if body["unit"] == unit
        ]
        for unit, key in UNITS
    }
    return {
        "app": publishing.app,
        "guarantee": (
            f"differential privacy: each number is a true count plus discrete Laplace noise; for each week, "
            f"month, quarter and year, whether one developer took part, and which versions they used, changes "
            f"the probability of anything published about it by at most a factor e^epsilon "
            f"(epsilon {publishing.epsilon:g} per developer per period as this collector is set; each period "
            f"states the epsilon it was released with)"
        ),
        "epsilon": publishing.epsilon,
        "min_count": publishing.min_count,
        "licence": publishing.licence,
        "made": made or None,
        "first_week": first_week or None,
        "downloads": {"json": RELEASES_JSON_PATH, "csv": RELEASES_CSV_PATH},
        "weeks": periods["weeks"],
        "months": periods["months"],
        "quarters": periods["quarters"],
        "years": periods["years"],
    }


def releases_json(releases: Sequence[Release], publishing: Publishing) -> bytes:
    """Every release, as released (raw noisy counts, which may be below zero), with the licence."""
    doc = {
        "app": publishing.app,
        "licence": publishing.licence,
        "releases": [json.loads(item.body) for item in sorted(releases, key=lambda r: (r.period, r.made))],
    }
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")


CSV_COLUMNS: Final = (
    "app",
    "period",
    "unit",
    "kind",
    "made",
    "epsilon",
    "mechanism",
    "scale",
    "margin",
    "breakdown",
    "value",
    "released",
    "licence",
)
"""The columns of ``GET /v1/releases.csv``: one released number per row; ``breakdown`` is ``developers`` for a
period's total."""


def releases_csv(releases: Sequence[Release], publishing: Publishing) -> bytes:
    """Every released number, one per row (:data:`CSV_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for item in sorted(releases, key=lambda r: (r.period, r.made)):
        body = json.loads(item.body)
        head = [body[k] for k in ("app", "period", "unit", "kind", "made", "epsilon", "mechanism", "scale", "margin")]
        writer.writerow([*head, "developers", "", body["developers"], publishing.licence])
        for name in BREAKDOWNS:
            for value, n in body.get(name, {}).items():
                writer.writerow([*head, name, value, n, publishing.licence])
    return out.getvalue().encode("utf-8")
