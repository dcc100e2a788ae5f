"""The collector's two pages: the public page of the released numbers, and the operator's page of the full ones.

:func:`render_public` turns the public document (:func:`._public.document`: stored differentially private
releases, post-processed) into the page ``GET /`` serves and ``collector stats --public --html FILE`` writes.
:func:`render_html` turns :class:`~spool_reporter.collector._stats.Stats` (the exact counts, for the operator
only) into the page ``collector stats --html FILE`` writes; it is never served.

Both are one self-contained HTML document: an inline stylesheet, inline SVG charts (:mod:`._svg`) and no
JavaScript, fonts, images or anything else from elsewhere, so they open offline and load nothing. The
public page has plain links (the downloads, the licence), which a reader may follow; nothing is fetched
when it is opened. Its Content-Security-Policy (:data:`CSP`, in a ``<meta>`` element and, when served, a
header) allows nothing but that one stylesheet, by its hash.

Each page shows developers per ISO week: a trend, then stacked shares of the application's versions,
Python versions and operating systems, each chart with a data table beside it (the table is the chart's
text alternative: the same numbers, newest week first). Every value that came from a client or from the
database (versions, OS names, command names, the application's name) is escaped, and isolated with
``<bdi>``. The markup is also well-formed XML, which the tests use to check it.

**The public page is a function of the document alone.** It reads no clock: "released" and "next release
due" are worked out from the releases' own dates, so every process serving the same releases serves the
same bytes, and reloading the page tells a reader nothing new (:mod:`._public`). A number marked
``fewer_than`` is shown as "fewer than N" and nothing else: neither its estimate nor its interval (which
would give the estimate back), and the share charts fold such values into one series.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import importlib.resources as _resources
import math
import re

from spool_reporter._event import OTHER, parse_time
from spool_reporter._version import __version__
from spool_reporter._words import plural

from . import _weeks
from ._common import DEFAULT_MAX_AGE_DAYS, RELEASES_CSV_PATH, RELEASES_JSON_PATH, STATS_PATH
from ._public import CHECK_SECONDS
from ._release import FINAL, PROVISIONAL, PROVISIONAL_SHARE
from ._svg import (
    FOLD_CLASS,
    OTHER_CLASS,
    SERIES_CLASSES,
    Estimate,
    Series,
    esc,
    estimates_trend,
    stacked_shares,
    trend,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final, NamedTuple, TypeVar

    from ._stats import Stats, Week

    _W = TypeVar("_W")
else:
    from typing import NamedTuple

CHART_WEEKS: Final = 104
"""The page shows at most the last two years of weeks (the JSON document has them all)."""

MAX_SERIES: Final = len(SERIES_CLASSES)
"""Named values per stacked chart; the less common ones are drawn (and tabled) with "other" (the operator's
page) or with the values below the display threshold (the public page)."""

_PALETTE: Final = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
"""Tableau 10's first nine colours, for the named series; "other" is grey, the folded values a lighter grey."""

_CSS: Final = (
    _resources.files("spool_reporter.collector").joinpath("page.css").read_text(encoding="utf-8")
    + "".join(f".s{i} {{ fill: {c}; background: {c}; }}\n" for i, c in enumerate(_PALETTE))
    + f".{OTHER_CLASS} {{ fill: #a5a5a5; background: #a5a5a5; }}\n"
    + f".{FOLD_CLASS} {{ fill: #d3d3d3; background: #d3d3d3; }}\n"
)

_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(_CSS.encode("utf-8")).digest()).decode("ascii")

CSP: Final = f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; form-action 'none'"
"""The page's Content-Security-Policy: nothing loads or runs but its own stylesheet (allowed by hash)."""

CSP_HEADER: Final = f"{CSP}; frame-ancestors 'none'"
"""The same as a response header, which may also refuse framing (a ``<meta>`` policy cannot)."""

_SECTIONS: Final = (
    ("by_django", "versions", "{app} versions", "developers"),
    ("by_python", "python", "Python versions", "developers"),
    ("by_os", "os", "Operating systems", "developers"),
    ("by_event", "commands", "Commands", "events"),
)
"""(breakdown, element id, heading, unit) of each stacked chart of the operator's page."""

_PUBLIC_SECTIONS: Final = _SECTIONS[:3]
"""The stacked charts of the public page: commands are not released (an event count is no developer count)."""

_SPDX_PAGE: Final = "https://spdx.org/licenses/{}.html"
"""Where an SPDX licence identifier (``CC-BY-4.0``) is explained: the SPDX licence list's page for it."""

_SPDX_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*\Z")
"""An SPDX short identifier (letters, digits, ``.``, ``-``, ``+``); an expression (``A OR B``) is shown as text."""

_LICENCE_URL: Final = re.compile(r"https?://[^\s\"'<>\\`]+\Z")
"""A licence given as a URL is linked as is; anything else (``javascript:``, text) is shown as text only."""

_DASH: Final = "&#8211;"
"""The en dash of an interval (``1,197-1,271`` with an en dash), as a character reference: the source stays ASCII."""

_NBSP: Final = "&#160;"
"""Keeps ``95 %`` on one line."""


def _monday(week: str) -> datetime.date | None:
    try:
        return _weeks.monday(week)
    except ValueError:
        return None


def _window(labels: Sequence[str]) -> list[str]:
    """The last :data:`CHART_WEEKS` ISO weeks up to the newest of ``labels`` (oldest first), weeks without
    numbers included, so that a chart shows a gap where a week has none."""
    if not labels:
        return []
    last, first = _monday(labels[-1]), _monday(labels[0])
    if last is None or first is None:  # not ISO weeks (a database written by hand): the labels as they are
        return list(labels[-CHART_WEEKS:])
    span = max(1, min(CHART_WEEKS, (last - first).days // 7 + 1))
    return [_weeks.week_of(last - datetime.timedelta(weeks=back)) for back in range(span - 1, -1, -1)]


def _swatch(cls: str) -> str:
    return f'<span class="sw {cls}" aria-hidden="true"></span>'


def _chart_section(ident: str, heading: str, figure: str, table: str) -> str:
    """A section of both pages: its heading, then the chart (``figure``) with its table beside or under it."""
    return (
        f'<section aria-labelledby="{ident}-h"><h2 id="{ident}-h">{esc(heading)}</h2>'
        f'<div class="pair"><figure>{figure}</figure>{table}</div></section>'
    )


def _table(ident: str, caption: str, head: list[str], rows: list[str]) -> str:
    """A data table in its own scroll region. On a phone (:data:`_CSS`) each row is shown as a block, its cells
    side by side as far as they fit, each under its column's name (the cell's ``data-label``, escaped), so
    that no column is ever out of sight, however many values a breakdown has."""
    return (
        f'<div class="table" role="region" aria-labelledby="{ident}-c" tabindex="0"><table>'
        f'<caption id="{ident}-c"><span>{caption}</span></caption><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _trend_table(caption: str, more: list[str], rows: list[str]) -> str:
    """The table beside a page's trend: a row per week (``rows``, newest first) under the week, its developers
    and ``more`` column heads; nothing while no week has numbers."""
    head = ['<th scope="col">Week</th>', '<th scope="col" class="n">Developers</th>', *more]
    return _table("trend-table", caption, head, rows) if rows else ""


def _shown(known: dict[str, _W], window: Sequence[str]) -> list[_W]:
    """The weeks of ``known`` (by name) that the chart's ``window`` shows, oldest first."""
    return [known[label] for label in window if label in known]


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        # Nothing may load or run, even if a value slipped past the escaping.
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}"/>'
        '<meta name="referrer" content="no-referrer"/>'
        f"<title>{title}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n"
    )


# -- the public page: the released numbers ------------------------------------------------------------------


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _estimate(value: object) -> Estimate:
    number = _dict(value)
    return Estimate(
        _int(number.get("estimate")), _int(number.get("low")), _int(number.get("high")), _int(number.get("fewer_than"))
    )


class _Released(NamedTuple):
    """One period of the document (a week, month, quarter or year), as the page reads it."""

    name: str
    unit: str
    release: str
    made: str
    last_day: str
    epsilon: float
    """What this period's releases spent together (a week: ``week_epsilon``; else its one release's)."""
    margin: int
    threshold: int
    """N of "fewer than N" for this release's total: the larger of the display threshold and the margin."""
    cell_threshold: int
    """N of "fewer than N" for its breakdown cells (a week): the document's ``cell_threshold`` (family-wise)."""
    developers: Estimate
    cells: dict[str, dict[str, Estimate]]
    """Breakdown -> value -> number, in the document's order (a week only)."""


def _released(item: object, unit: str, min_count: int) -> _Released:
    period = _dict(item)
    margin = _int(period.get("margin"))
    cells = {
        name: {str(value): _estimate(number) for value, number in _dict(period.get(name)).items()}
        for name, _, _, _ in _PUBLIC_SECTIONS
    }
    spent = period.get("week_epsilon") if unit == "week" else period.get("epsilon")
    return _Released(
        name=_str(period.get(unit)),
        unit=unit,
        release=_str(period.get("release")),
        made=_str(period.get("made")),
        last_day=_str(period.get("last_day")),
        epsilon=_float(spent),
        margin=margin,
        threshold=max(min_count, margin),
        cell_threshold=_int(period.get("cell_threshold")) or max(min_count, margin),
        developers=_estimate(period.get("developers")),
        cells=cells if unit == "week" else {},
    )


def _eps(value: float) -> str:
    """ε as a reader reads it: ``1``, ``0.5`` (OpenDP's map may give ``0.49999999999999994``)."""
    return f"{value:.3g}"


def _factor(epsilon: float) -> str:
    """e^ε, rounded for reading: ``2.7`` for ε = 1."""
    factor = math.exp(epsilon)
    return f"{factor:.1f}" if factor < 100 else f"{factor:,.0f}"


def _when(iso: str) -> str:
    """``2026-12-04T12:00:00Z`` -> ``2026-12-04 12:00 UTC`` (escaped; shown as it is if it is no such time in
    exactly that form, which :func:`~spool_reporter._event.parse_time`, the package's one time parser, decides)."""
    if parse_time(iso) is None:
        return f"<bdi>{esc(iso)}</bdi>"
    return f"{iso[:10]} {iso[11:16]} UTC"


def _date(iso: str) -> str:
    """``2026-12-04T12:00:00Z`` -> ``2026-12-04`` (escaped; shown as it is if it is no such time)."""
    shown = _when(iso)
    return shown[:10] if shown.endswith(" UTC") else shown


def _day(iso: str) -> datetime.date | None:
    """``2026-11-29`` as a date, if it is one that the schedule can count on from (``None`` otherwise)."""
    try:
        day = datetime.date.fromisoformat(iso)
    except ValueError:
        return None
    return day if day.year < datetime.MAXYEAR else None  # a week or a month later must still be a date


def _number(value: Estimate) -> str:
    """A number in a table cell: ``141 (104-178)`` (an en dash), or ``fewer than 37`` and nothing else."""
    if value.fewer_than:
        return f"fewer than {value.fewer_than:,}"
    return f'{value.estimate:,} <span class="ci">({value.low:,}{_DASH}{value.high:,})</span>'


def _number_cells(value: Estimate, label: str) -> str:
    """The estimate and the interval in two cells; "fewer than N" across both. ``label``: the estimate's column."""
    if value.fewer_than:
        return f'<td class="n" colspan="2" data-label="{label}">fewer than {value.fewer_than:,}</td>'
    return (
        f'<td class="n" data-label="{label}">{value.estimate:,}</td>'
        f'<td class="n" data-label="95{_NBSP}% interval">{value.low:,}{_DASH}{value.high:,}</td>'
    )


def _kind(release: str) -> str:
    return esc(release) if release in (PROVISIONAL, FINAL) else f"<bdi>{esc(release)}</bdi>"


def _headline(weeks: Sequence[_Released]) -> str:
    if not weeks:
        return (
            '<p class="headline">Nothing released yet: a week\'s numbers are released once it has ended, '
            "and made final once it has closed.</p>"
        )
    latest = weeks[-1]
    value = latest.developers
    where = f"in <bdi>{esc(latest.name)}</bdi>, {_kind(latest.release)}"
    if value.fewer_than:
        return f'<p class="headline">Fewer than <strong>{value.fewer_than:,}</strong> developers {where}.</p>'
    return (
        f'<p class="headline">About <strong>{value.estimate:,}</strong> {plural(value.estimate, "developer")} '
        f'<span class="ci">(95{_NBSP}%: {value.low:,}{_DASH}{value.high:,})</span> {where}.</p>'
    )


def _schedule(made: str, weeks: Sequence[_Released], first_week: str) -> str:
    """When the numbers were released and when the next releases are due, from the releases' own dates (and,
    before the first, the first week released) only.

    A week's provisional release is made by the first roll-up after it ended (Monday 00:00 UTC), so within the
    collector's roll-up interval; its final one by the first roll-up after it closed, which is the collector's
    maximum event age after it ended. Neither is in the document: the page says "from" and names the default.
    A process serving the page sees a new release within :data:`._public.CHECK_SECONDS`.
    """
    items = []
    if made:
        items.append(
            f"<li>Released {_when(made)} (the newest release). This page shows stored releases, not live counts: "
            f"it changes only when a release is made, and shows a new one within {CHECK_SECONDS:.0f} seconds.</li>"
        )
    first = _monday(first_week) if not weeks else None
    if first is not None and first.year < datetime.MAXYEAR:
        items.append(
            f"<li>First: the provisional release of <bdi>{esc(first_week)}</bdi>, the first week released, once it "
            f"has ended: from Monday {(first + datetime.timedelta(days=7)).isoformat()} 00:00 UTC, within the "
            "collector's roll-up interval (an hour by default). Until then nothing is published about how many "
            "developers there are, nor whether there are any.</li>"
        )
    latest = _day(weeks[-1].last_day) if weeks else None
    if latest is not None:
        ends = latest + datetime.timedelta(days=8)
        following = _weeks.week_of(latest + datetime.timedelta(days=7))
        items.append(
            f"<li>Next: the provisional release of {following}, once that week "
            f"has ended: from Monday {ends.isoformat()} 00:00 UTC, within the collector's roll-up interval (an hour "
            "by default).</li>"
        )
    pending = [(w, _day(w.last_day)) for w in weeks if w.release == PROVISIONAL]
    oldest = next(((w, day) for w, day in pending if day is not None), None)
    if oldest is not None:
        week, last = oldest
        closes = last + datetime.timedelta(days=1 + DEFAULT_MAX_AGE_DAYS)
        items.append(
            f"<li>The final release of <bdi>{esc(week.name)}</bdi> follows when that week closes, once none of "
            f"its events can arrive any more: from {closes.isoformat()} 00:00 UTC with the collector's default "
            f"maximum event age of {DEFAULT_MAX_AGE_DAYS} days.</li>"
        )
    return f'<ul class="when">{"".join(items)}</ul>' if items else ""


def _licence(licence: str) -> str:
    text = f"<bdi>{esc(licence)}</bdi>"
    if _SPDX_ID.match(licence):
        return f'<a href="{esc(_SPDX_PAGE.format(licence))}" rel="license">{text}</a>'
    if _LICENCE_URL.match(licence):
        return f'<a href="{esc(licence)}" rel="license">{text}</a>'
    return text


def _relative(path: str) -> str:
    """``/v1/stats`` -> ``v1/stats``: a link relative to the page, so that it still works when a proxy serves the
    collector under a prefix (``https://example.org/spool/``)."""
    return path.lstrip("/")


def _downloads(doc: dict[str, object]) -> tuple[str, str]:
    """The download links (relative) of the paths the document names (the routes of :mod:`._public` if it names
    none)."""
    named = _dict(doc.get("downloads"))
    paths = []
    for key, default in (("json", RELEASES_JSON_PATH), ("csv", RELEASES_CSV_PATH)):
        path = _str(named.get(key))
        paths.append(_relative(path if path.startswith("/") and not path.startswith("//") else default))
    return paths[0], paths[1]


def _public_trend(weeks: Sequence[_Released], window: list[str]) -> str:
    known = {w.name: w for w in weeks}
    points = [(label, known[label].developers if label in known else None) for label in window]
    span = f", {window[0]} to {window[-1]}" if window else ""
    chart = estimates_trend(
        "trend",
        f"Estimated developers per ISO week{span}, with 95 % intervals",
        points,
        empty="No week has been released yet.",
    )
    rows = [
        f'<tr><th scope="row"><bdi>{esc(w.name)}</bdi></th>{_number_cells(w.developers, "Developers")}'
        f'<td data-label="Release">{_kind(w.release)}</td>'
        f'<td class="n" data-label="&#949; spent">{_eps(w.epsilon)}</td></tr>'
        for w in reversed(_shown(known, window))
    ]
    more = [
        f'<th scope="col" class="n">95{_NBSP}% interval</th>',
        '<th scope="col">Release</th>',
        '<th scope="col" class="n">&#949; spent</th>',
    ]
    table = _trend_table("Estimated developers per week, newest first", more, rows)
    return _chart_section("trend", "Developers per week", chart, table)


def _fold_label(thresholds: Sequence[int], *, more: int) -> str:
    """The label of the folded series: "fewer than N each", and the less common values if some joined it."""
    if not thresholds:
        label = "fewer than N each"
    elif len(thresholds) == 1:
        label = f"fewer than {thresholds[0]:,} each"
    else:  # the margin changed with ε between weeks: each week's N is in its row
        label = f"fewer than {thresholds[0]:,}{_DASH}{thresholds[-1]:,} each"
    return f"{label}, and {more} less common {plural(more, 'value')}" if more else label


def _share_columns(
    known: dict[str, _Released], window: list[str], name: str, series: list[Series], fold: Series
) -> list[tuple[str, dict[str, int] | None]]:
    """Each week of ``window`` -> the estimated developers of each series of breakdown ``name`` (``None``: the
    week shows no shares), the folded values as what the week's total leaves."""
    columns: list[tuple[str, dict[str, int] | None]] = []
    for label in window:
        found = known.get(label)
        cells = found.cells.get(name, {}) if found else {}
        if found is None or found.developers.fewer_than or not cells:
            columns.append((label, None))
            continue
        counts = {
            item.key: cells[item.label].estimate
            for item in series
            if item.label in cells and not cells[item.label].fewer_than and cells[item.label].estimate > 0
        }
        # The folded values are drawn as what the week's total leaves: adding up their clamped estimates would
        # add the noise of every empty value of the vocabulary (each at least 0), a bias that grows with the list.
        rest = found.developers.estimate - sum(counts.values())
        if rest > 0:
            counts[fold.key] = rest
        columns.append((label, counts))
    return columns


def _public_breakdown(
    section: tuple[str, str, str, str], weeks: Sequence[_Released], window: list[str], app: str
) -> str:
    name, ident, heading, unit = section
    heading = heading.format(app=app)
    known = {w.name: w for w in weeks}
    shown = _shown(known, window)
    # The values shown (not "fewer than N") in some week of a week whose total is shown, most counted first,
    # "other" last: the chart's series and the table's columns. The rest are folded into one series.
    totals: dict[str, int] = {}
    for week in shown:
        if week.developers.fewer_than:
            continue
        for value, number in week.cells.get(name, {}).items():
            if not number.fewer_than:
                totals[value] = totals.get(value, 0) + number.estimate
    named = sorted((v for v in totals if v != OTHER), key=lambda v: (-totals[v], v))
    values = [*named[:MAX_SERIES], *([OTHER] if OTHER in totals else [])]
    fold_label = _fold_label(sorted({w.cell_threshold for w in shown}), more=max(0, len(named) - MAX_SERIES))
    # Keys by position: a value's name, whatever it is, cannot collide with the folded series.
    series = [
        Series(str(i), value, OTHER_CLASS if value == OTHER else SERIES_CLASSES[i % len(SERIES_CLASSES)])
        for i, value in enumerate(values)
    ]
    fold = Series("fold", fold_label, FOLD_CLASS)
    columns = _share_columns(known, window, name, series, fold)
    title = f"{heading} per ISO week, as estimated shares of the week's developers"
    chart = stacked_shares(
        ident,
        title,
        columns,
        [*series, fold],
        unit=unit,
        empty="No week has enough developers released to show shares.",
        estimated=True,
    )
    legend = "".join(f"<li>{_swatch(s.cls)}<bdi>{esc(s.label)}</bdi></li>" for s in [*series, fold])
    head = ['<th scope="col">Week</th>']
    head += [f'<th scope="col" class="n"><bdi>{esc(s.label)}</bdi></th>' for s in series]
    head.append(f'<th scope="col" class="n fold">{esc(fold_label)}: share</th>')
    bars = dict(columns)
    rows = []
    for week in reversed(shown):
        cells = week.cells.get(name, {})
        if week.developers.fewer_than or not cells:
            note = (
                f"fewer than {week.developers.fewer_than:,} developers this week: no shares"
                if week.developers.fewer_than
                else "not released this week"
            )
            row = f'<td class="none" colspan="{len(series) + 1}">{note}</td>'
        else:
            row = "".join(
                f'<td class="n" data-label="{esc(s.label)}">'
                f"{_number(cells[s.label]) if s.label in cells else _DASH}</td>"
                for s in series
            )
            bar = bars.get(week.name) or {}
            whole = sum(bar.values())
            share = f"{100 * bar[fold.key] / whole:.0f}{_NBSP}%" if whole and fold.key in bar else _DASH
            row += f'<td class="n" data-label="{esc(fold_label)}: share">{share}</td>'
        rows.append(f'<tr><th scope="row"><bdi>{esc(week.name)}</bdi></th>{row}</tr>')
    caption = f"{esc(heading)}: estimated developers (95{_NBSP}% interval), newest week first"
    table = _table(f"{ident}-table", caption, head, rows)
    return _chart_section(ident, heading, f'{chart}<ul class="legend">{legend}</ul>', table)


_UNIT_ORDER: Final = {"year": 0, "quarter": 1, "month": 2}
"""Periods ending on the same day are listed from the longest to the shortest (2026, 2026-Q4, 2026-12)."""


def _periods_section(periods: Sequence[_Released]) -> str:
    ordered = sorted(periods, key=lambda p: (p.last_day, -_UNIT_ORDER.get(p.unit, 3), p.name), reverse=True)
    if ordered:
        rows = [
            f'<tr><th scope="row"><bdi>{esc(p.name)}</bdi></th><td data-label="Unit">{esc(p.unit)}</td>'
            f"{_number_cells(p.developers, 'Distinct developers')}"
            f'<td class="n" data-label="&#949;">{_eps(p.epsilon)}</td><td data-label="Released">{_date(p.made)}</td>'
            "</tr>"
            for p in ordered
        ]
        head = [
            '<th scope="col">Period</th>',
            '<th scope="col">Unit</th>',
            '<th scope="col" class="n">Distinct developers</th>',
            f'<th scope="col" class="n">95{_NBSP}% interval</th>',
            '<th scope="col" class="n">&#949;</th>',
            '<th scope="col">Released</th>',
        ]
        caption = "Distinct developers in each month, quarter and year (one final release each), newest first"
        body = (
            "<p>A developer active in several weeks of a month counts once in the month, so these are not sums "
            f"of the weeks.</p>{_table('periods-table', caption, head, rows)}"
        )
    else:
        body = (
            "<p>None released yet: a month, a quarter or a year is released once the week holding its last day "
            "has closed.</p>"
        )
    return f'<section aria-labelledby="periods-h"><h2 id="periods-h">Months, quarters and years</h2>{body}</section>'


def _public_method(doc: dict[str, object], weeks: Sequence[_Released]) -> str:
    epsilon = _float(doc.get("epsilon"))
    min_count = _int(doc.get("min_count"))
    share = f"{100 * PROVISIONAL_SHARE:.0f}{_NBSP}%"
    year = 53 + 12 + 4 + 1  # ISO weeks touching a year, its months, its quarters, the year itself
    margin = ""
    if weeks:
        latest = weeks[-1]
        margin = (
            f" For <bdi>{esc(latest.name)}</bdi> that margin is &#177;{latest.margin:,}, so its total is shown as "
            f"&#8220;fewer than {latest.threshold:,}&#8221; below {latest.threshold:,}; a version or system, of "
            f"which a week has dozens (most of them used by nobody), below {latest.cell_threshold:,}, so that a "
            "value nobody used shows a number in at most one week in twenty."
        )
    items = [
        "<li><strong>Differential privacy.</strong> Every number here is a true count plus random noise, drawn "
        "by the discrete Laplace mechanism of the OpenDP library when the number was released. The noise "
        "protects each developer; &#949; (epsilon), the privacy budget, says how much: the smaller, the "
        f"more noise and the stronger the protection. This collector spends &#949; = {_eps(epsilon)} per "
        "developer for each week, and again for each month, quarter and year. The &#949; columns show what "
        "each period's releases spent.</li>",
        "<li><strong>What it means for you.</strong> With &#949; = "
        f"{_eps(epsilon)}, anything published about a week changes in probability by at most a factor "
        f"e<sup>&#949;</sup> &#8776; {_factor(epsilon)}, whether or not you took part that week, and whichever "
        "versions you used. The same holds for each month, quarter and year. Across periods the budgets add "
        "up: for a developer active all year, everything published about that year is covered by "
        f"{year} &#215; &#949; = {_eps(year * epsilon)} at most (53 weeks, 12 months, 4 quarters and the year "
        "itself).</li>",
        "<li><strong>Counted once.</strong> A developer is an anonymous client id: a random id kept in one "
        "user's configuration on one machine. In a week each developer counts once in the total and once in "
        "each breakdown, under the newest version they used that week (the newest application and Python "
        "version; of operating systems, the last by name). Every value of a fixed list is released, zero or "
        "not, so which values appear says nothing about anyone; any other version counts as "
        "&#8220;other&#8221;.</li>",
        "<li><strong>Estimates and 95&#160;% intervals.</strong> An estimate is the released number, shown as 0 "
        "if the noise took it below zero. Its interval is the released number plus or minus the release's "
        "margin: the noise stays within that margin with probability at least 95&#160;%, so the interval "
        "holds the true count 19 times in 20. A breakdown need not add up to its week's total: each number "
        f"carries its own noise.{margin}</li>",
        f"<li><strong>&#8220;Fewer than N&#8221;.</strong> An estimate below N, the larger of {min_count:,} and "
        "the release's margin, cannot be told apart from zero, so it is shown only as &#8220;fewer than "
        "N&#8221;, neither its estimate nor its interval; the share charts fold such values into one light "
        "grey series, &#8220;fewer than N each&#8221;, drawn as what the week's total leaves. This only "
        "changes how released numbers are shown: it spends no privacy budget.</li>",
        "<li><strong>Released once, never recomputed.</strong> A week is released provisionally once it has "
        f"ended (with {share} of its &#949;) and finally once it has closed, when none of its events can arrive "
        "any more (with the rest). A month, a quarter and a year get one final release each, of their distinct "
        "developers only. Each release is made once and stored: this page, its JSON and the downloads only show "
        "stored releases, so reloading them tells nothing new, and late events, a developer's request to "
        "forget their id, and the deletion of old events never change a release already made.</li>",
        "<li><strong>What the collector keeps.</strong> It stores no IP address, and of each event only the "
        "day, not the time.</li>",
    ]
    return (
        '<section aria-labelledby="method-h"><h2 id="method-h">How these numbers are made</h2>'
        f'<ul class="method">{"".join(items)}</ul></section>'
    )


def _data_section(doc: dict[str, object]) -> str:
    json_path, csv_path = _downloads(doc)
    licence = _licence(_str(doc.get("licence")))
    return (
        '<section aria-labelledby="data-h"><h2 id="data-h">Downloads and licence</h2>'
        f"<p>Every release as it was made, with its &#949;, mechanism, noise scale and margin, and the raw noisy "
        f'counts (which can be below zero): <a href="{esc(json_path)}">releases.json</a> (JSON) and '
        f'<a href="{esc(csv_path)}">releases.csv</a> (CSV, one number per row). The numbers of this page: '
        f'<a href="{esc(_relative(STATS_PATH))}">{esc(STATS_PATH)}</a> (JSON). The released numbers are licensed under '
        f"{licence}.</p></section>"
    )


def render_public(doc: dict[str, object]) -> str:
    """The public page (``GET /``) of ``doc``, the public document (:func:`._public.document`).

    A function of ``doc`` alone (no clock), so every process renders the same bytes for the same releases.
    """
    app = _str(doc.get("app"))
    min_count = _int(doc.get("min_count"))
    weeks = [_released(item, "week", min_count) for item in _list(doc.get("weeks"))]
    weeks.sort(key=lambda w: w.name)
    periods = [
        _released(item, unit, min_count)
        for unit, key in (("month", "months"), ("quarter", "quarters"), ("year", "years"))
        for item in _list(doc.get(key))
    ]
    window = _window([w.name for w in weeks])
    json_path, csv_path = _downloads(doc)
    name = esc(app)
    sections = [_public_trend(weeks, window)] if weeks else []
    if weeks:
        sections += [_public_breakdown(section, weeks, window, app) for section in _PUBLIC_SECTIONS]
    body = (
        f"<h1><bdi>{name}</bdi> developers per week</h1>"
        f'<p class="lead">Distinct anonymous developers of <bdi>{name}</bdi> per ISO week, counted by a self-hosted '
        "spool_reporter collector from the reports of its developer commands, and released with differential "
        "privacy: every number is an estimate with random noise added, shown with its 95&#160;% interval.</p>"
        f"{_headline(weeks)}"
        f"{_schedule(_str(doc.get('made')), weeks, _str(doc.get('first_week')))}"
        f'<p>Every release: <a href="{esc(json_path)}">JSON</a>, <a href="{esc(csv_path)}">CSV</a>. '
        f"Licence: {_licence(_str(doc.get('licence')))}. How these numbers are made, and what they protect: "
        "below.</p>"
        f"{''.join(sections)}"
        f"{_periods_section(periods)}"
        f"{_public_method(doc, weeks)}"
        f"{_data_section(doc)}"
        f"<footer>Released numbers of a spool_reporter collector; page made by spool_reporter "
        f"{esc(__version__)}.</footer>"
    )
    return _page(f"{name} developers per week", body)


# -- the operator's page: the full numbers ------------------------------------------------------------------


def _series(columns: Sequence[dict[str, int]]) -> list[str]:
    """The named values of a stacked chart (most counted first, at most :data:`MAX_SERIES`), then "other"."""
    totals: dict[str, int] = {}
    for counts in columns:
        for name, count in counts.items():
            totals[name] = totals.get(name, 0) + count
    named = sorted((n for n in totals if n != OTHER), key=lambda n: (-totals[n], n))
    keep = named[:MAX_SERIES]
    return [*keep, OTHER] if len(named) > MAX_SERIES or OTHER in totals else keep


def _fold(counts: dict[str, int], series: Sequence[str]) -> dict[str, int]:
    """``counts`` with every value outside ``series`` added to "other"."""
    kept = {name: counts[name] for name in series if name in counts and name != OTHER}
    rest = sum(c for name, c in counts.items() if name not in kept)
    if rest:
        kept[OTHER] = rest
    return kept


def _trend_section(weeks: Sequence[Week], window: list[str]) -> str:
    known = {w.week: w for w in weeks}
    # The full numbers: a week without events had none, so it is drawn as a zero.
    points: list[tuple[str, int | None]] = [
        (label, known[label].developers if label in known else 0) for label in window
    ]
    span = f", {window[0]} to {window[-1]}" if window else ""
    chart = trend("trend", f"Distinct developers per ISO week{span}", points, empty="No events have been received yet.")
    rows = [
        f'<tr><th scope="row">{esc(w.week)}</th><td class="n" data-label="Developers">{w.developers:,}</td>'
        f'<td class="n" data-label="Events">{w.events:,}</td></tr>'
        for w in reversed(_shown(known, window))
    ]
    table = _trend_table("Developers per week, newest first", ['<th scope="col" class="n">Events</th>'], rows)
    return _chart_section("trend", "Developers per week", chart, table)


def _breakdown_section(section: tuple[str, str, str, str], weeks: Sequence[Week], window: list[str], app: str) -> str:
    name, ident, heading, unit = section
    heading = heading.format(app=app)
    known = {w.week: w for w in weeks}
    shown = _shown(known, window)
    names = _series([getattr(w, name) for w in shown])
    folded = {w.week: _fold(getattr(w, name), names) for w in shown}
    series = [
        Series(value, value, OTHER_CLASS if value == OTHER else SERIES_CLASSES[i % len(SERIES_CLASSES)])
        for i, value in enumerate(names)
    ]
    columns = [(label, folded.get(label) or None) for label in window]
    title = f"{heading} per ISO week, as shares of the week's {unit}"
    chart = stacked_shares(ident, title, columns, series, unit=unit, empty="Nothing to show.")
    legend = "".join(f"<li>{_swatch(s.cls)}<bdi>{esc(s.label)}</bdi></li>" for s in series)
    head = ['<th scope="col">Week</th>'] + [f'<th scope="col" class="n"><bdi>{esc(s)}</bdi></th>' for s in names]
    rows = []
    for week in reversed(shown):
        counts = folded[week.week]
        total = sum(counts.values())
        if not counts:
            cells = f'<td class="none" colspan="{max(1, len(names))}">none</td>'
        else:
            cells = "".join(
                f'<td class="n" data-label="{esc(s)}">'
                f"{f'{counts[s]:,} ({100 * counts[s] / total:.0f}%)' if s in counts else _DASH}</td>"
                for s in names
            )
        rows.append(f'<tr><th scope="row">{esc(week.week)}</th>{cells}</tr>')
    caption = f"{esc(heading)}, newest week first"
    table = _table(f"{ident}-table", caption, head, rows)
    return _chart_section(ident, heading, f'{chart}<ul class="legend">{legend}</ul>', table)


def _method(app: str) -> str:
    items = (
        "<li><strong>These are the full numbers, for the collector's operator:</strong> exact counts, with no "
        "noise and no threshold. Do not publish them. The public page (<code>GET /</code>), "
        "<code>GET /v1/stats</code> and the downloads show only releases made with differential privacy "
        "(<code>collector stats --public</code> shows them).</li>"
        "<li>A developer is a distinct anonymous client id: a random id kept in one user's configuration on "
        "one machine. Weeks are ISO 8601 weeks of when the command ran.</li>"
        f"<li>A developer who used two {app} or Python versions in one week counts under both here, so the "
        "shares are of the week's developer-version pairs, and a week's numbers can add up to more than its "
        "developers. (The public releases count each developer once per breakdown.)</li>"
        "<li>The collector stores no IP address and no request header, and of each event only the day.</li>"
    )
    return (
        '<section aria-labelledby="method-h"><h2 id="method-h">How these numbers are made</h2>'
        f'<ul class="method">{items}</ul></section>'
    )


def render_html(doc: Stats, *, generated: datetime.datetime | None = None) -> str:
    """The operator's page of ``doc`` (the full numbers) as one HTML document (write UTF-8). Never served:
    the public page is :func:`render_public`."""
    when = (generated or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    app = esc(doc.app)
    weeks = doc.weeks
    window = _window([w.week for w in weeks])
    in_window = set(window)
    shown = [w for w in weeks if w.week in in_window]
    summary = (
        f"<li><strong>{doc.developers:,}</strong> {plural(doc.developers, 'developer')} in all</li>"
        f"<li><strong>{doc.events:,}</strong> {plural(doc.events, 'event')}</li>"
        f"<li><strong>{len(weeks)}</strong> {plural(len(weeks), 'week')} with events</li>"
    )
    sections = [_trend_section(weeks, window)]
    sections += [
        _breakdown_section(section, weeks, window, doc.app)
        for section in _SECTIONS
        if any(getattr(w, section[0]) for w in shown)
    ]
    body = (
        f"<h1>{app} developers per week</h1>"
        f'<p class="lead">Distinct anonymous developers per ISO week, counted by a self-hosted spool_reporter '
        f"collector from the reports of {app}'s developer commands. The full numbers, for the operator: no "
        "noise, no threshold applied.</p>"
        f'<ul class="summary">{summary}</ul>'
        f"{''.join(sections)}"
        f"{_method(app)}"
        f"<footer>Generated {esc(when)} by spool_reporter {esc(__version__)}.</footer>"
    )
    return _page(f"{app} developers per week", body)
