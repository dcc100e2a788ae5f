"""The public page: the released numbers, as ``GET /`` serves it and ``collector stats --public --html FILE`` writes.

:func:`render_public` turns the public document (:class:`._public.Document`, made by :func:`._public.document`
from the stored differentially private releases, post-processed) into one HTML document made with the kit of
:mod:`._html`. It shows developers per ISO week: a headline, the release schedule, a trend, then stacked shares
of the application's versions, Python versions and operating systems, each chart with a data table beside it
(the table is the chart's text alternative: the same numbers, newest week first), then the months, quarters
and years, how the numbers are made, and the downloads. Every value that came from a client or from the
database (versions, OS names, the application's name, the licence) is escaped and isolated with ``<bdi>``.
It has plain links (the downloads, the licence), which a reader may follow; nothing is fetched when it is
opened.

**The page is a function of the document alone.** It reads no clock: "released" and "next release due" are
worked out from the releases' own dates (:func:`._release.schedule`), so every process serving the same
releases serves the same bytes, and reloading the page tells a reader nothing new (:mod:`._public`). A
number marked ``fewer_than`` is shown as "fewer than N" and nothing else: neither its estimate nor its
interval (which would give the estimate back), and the share charts fold such values into one series.
"""

from __future__ import annotations

import math
import re

from spool_reporter._event import OTHER, parse_time
from spool_reporter._version import __version__
from spool_reporter._words import plural

from . import _html
from ._common import DEFAULT_MAX_AGE_DAYS, STATS_PATH
from ._public import CHECK_SECONDS
from ._release import FINAL, PROVISIONAL, PROVISIONAL_SHARE, schedule
from ._svg import FOLD_CLASS, OTHER_CLASS, SERIES_CLASSES, Estimate, Series, esc, estimates_trend, stacked_shares

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final, NamedTuple

    from ._public import Document, Number, Period
else:
    from typing import NamedTuple

_SPDX_PAGE: Final = "https://spdx.org/licenses/{}.html"
"""Where an SPDX licence identifier (``CC-BY-4.0``) is explained: the SPDX licence list's page for it."""

_SPDX_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*\Z")
"""An SPDX short identifier (letters, digits, ``.``, ``-``, ``+``); an expression (``A OR B``) is shown as text."""

_LICENCE_URL: Final = re.compile(r"https?://[^\s\"'<>\\`]+\Z")
"""A licence given as a URL is linked as is; anything else (``javascript:``, text) is shown as text only."""

_SECTIONS: Final = _html.SECTIONS[:3]
"""The stacked charts of the public page: commands are not released (an event count is no developer count)."""


def _estimate(number: Number) -> Estimate:
    return Estimate(number["estimate"], number["low"], number["high"], number.get("fewer_than", 0))


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


def _released(period: Period, unit: str, min_count: int) -> _Released:
    margin = period["margin"]
    cells = {
        name: {value: _estimate(number) for value, number in period.get(name, {}).items()}  # type: ignore[attr-defined]
        for name, _, _, _ in _SECTIONS
    }
    spent = period.get("week_epsilon") if unit == "week" else period["epsilon"]
    return _Released(
        name=period[unit],  # type: ignore[literal-required]
        unit=unit,
        release=period["release"],
        made=period["made"],
        last_day=period["last_day"],
        epsilon=float(spent or 0.0),
        margin=margin,
        threshold=max(min_count, margin),
        cell_threshold=period.get("cell_threshold") or max(min_count, margin),
        developers=_estimate(period["developers"]),
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


def _number(value: Estimate) -> str:
    """A number in a table cell: ``141 (104-178)`` (an en dash), or ``fewer than 37`` and nothing else."""
    if value.fewer_than:
        return f"fewer than {value.fewer_than:,}"
    return f'{value.estimate:,} <span class="ci">({value.low:,}{_html.DASH}{value.high:,})</span>'


def _number_cells(value: Estimate, label: str) -> str:
    """The estimate and the interval in two cells; "fewer than N" across both. ``label``: the estimate's column."""
    if value.fewer_than:
        return f'<td class="n" colspan="2" data-label="{label}">fewer than {value.fewer_than:,}</td>'
    return (
        f'<td class="n" data-label="{label}">{value.estimate:,}</td>'
        f'<td class="n" data-label="95{_html.NBSP}% interval">{value.low:,}{_html.DASH}{value.high:,}</td>'
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
        f'<span class="ci">(95{_html.NBSP}%: {value.low:,}{_html.DASH}{value.high:,})</span> {where}.</p>'
    )


def _schedule(made: str, weeks: Sequence[_Released], first_week: str) -> str:
    """The release schedule of :func:`._release.schedule`, in words: when the numbers were released and when the
    next releases are due.

    A week's provisional release is made within the collector's roll-up interval after it ended, its final one
    within it after it closed. Neither the interval nor the operator's maximum event age is in the document: the
    page says "from" and names the defaults. A process serving the page sees a new release within
    :data:`._public.CHECK_SECONDS`.
    """
    due = schedule([(w.name, w.release, w.last_day) for w in weeks], first_week)
    items = []
    if made:
        items.append(
            f"<li>Released {_when(made)} (the newest release). This page shows stored releases, not live counts: "
            f"it changes only when a release is made, and shows a new one within {CHECK_SECONDS:.0f} seconds.</li>"
        )
    if due.first is not None:
        items.append(
            f"<li>First: the provisional release of <bdi>{esc(due.first.period)}</bdi>, the first week released, "
            f"once it has ended: from Monday {due.first.day.isoformat()} 00:00 UTC, within the "
            "collector's roll-up interval (an hour by default). Until then nothing is published about how many "
            "developers there are, nor whether there are any.</li>"
        )
    if due.following is not None:
        items.append(
            f"<li>Next: the provisional release of {due.following.period}, once that week "
            f"has ended: from Monday {due.following.day.isoformat()} 00:00 UTC, within the collector's roll-up "
            "interval (an hour by default).</li>"
        )
    if due.final is not None:
        items.append(
            f"<li>The final release of <bdi>{esc(due.final.period)}</bdi> follows when that week closes, once none "
            f"of its events can arrive any more: from {due.final.day.isoformat()} 00:00 UTC with the collector's "
            f"default maximum event age of {DEFAULT_MAX_AGE_DAYS} days.</li>"
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


def _downloads(doc: Document) -> tuple[str, str]:
    """The links (relative) of the downloads the document names: its JSON, then its CSV."""
    return _relative(doc["downloads"]["json"]), _relative(doc["downloads"]["csv"])


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
        for w in reversed(_html.shown(known, window))
    ]
    more = [
        f'<th scope="col" class="n">95{_html.NBSP}% interval</th>',
        '<th scope="col">Release</th>',
        '<th scope="col" class="n">&#949; spent</th>',
    ]
    table = _html.trend_table("Estimated developers per week, newest first", more, rows)
    return _html.chart_section("trend", "Developers per week", chart, table)


def _fold_label(thresholds: Sequence[int], *, more: int) -> str:
    """The label of the folded series: "fewer than N each", and the less common values if some joined it."""
    if not thresholds:
        label = "fewer than N each"
    elif len(thresholds) == 1:
        label = f"fewer than {thresholds[0]:,} each"
    else:  # the margin changed with ε between weeks: each week's N is in its row
        label = f"fewer than {thresholds[0]:,}{_html.DASH}{thresholds[-1]:,} each"
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
    shown = _html.shown(known, window)
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
    values = [*named[: _html.MAX_SERIES], *([OTHER] if OTHER in totals else [])]
    fold_label = _fold_label(sorted({w.cell_threshold for w in shown}), more=max(0, len(named) - _html.MAX_SERIES))
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
    legend = _html.legend([(s.cls, s.label) for s in [*series, fold]])
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
                f"{_number(cells[s.label]) if s.label in cells else _html.DASH}</td>"
                for s in series
            )
            bar = bars.get(week.name) or {}
            whole = sum(bar.values())
            share = f"{100 * bar[fold.key] / whole:.0f}{_html.NBSP}%" if whole and fold.key in bar else _html.DASH
            row += f'<td class="n" data-label="{esc(fold_label)}: share">{share}</td>'
        rows.append(f'<tr><th scope="row"><bdi>{esc(week.name)}</bdi></th>{row}</tr>')
    caption = f"{esc(heading)}: estimated developers (95{_html.NBSP}% interval), newest week first"
    table = _html.table(f"{ident}-table", caption, head, rows)
    return _html.chart_section(ident, heading, chart + legend, table)


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
            f'<th scope="col" class="n">95{_html.NBSP}% interval</th>',
            '<th scope="col" class="n">&#949;</th>',
            '<th scope="col">Released</th>',
        ]
        caption = "Distinct developers in each month, quarter and year (one final release each), newest first"
        body = (
            "<p>A developer active in several weeks of a month counts once in the month, so these are not sums "
            f"of the weeks.</p>{_html.table('periods-table', caption, head, rows)}"
        )
    else:
        body = (
            "<p>None released yet: a month, a quarter or a year is released once the week holding its last day "
            "has closed.</p>"
        )
    return f'<section aria-labelledby="periods-h"><h2 id="periods-h">Months, quarters and years</h2>{body}</section>'


def _public_method(doc: Document, weeks: Sequence[_Released]) -> str:
    epsilon = doc["epsilon"]
    min_count = doc["min_count"]
    share = f"{100 * PROVISIONAL_SHARE:.0f}{_html.NBSP}%"
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
    return _html.method_section("".join(items))


def _data_section(doc: Document) -> str:
    json_path, csv_path = _downloads(doc)
    licence = _licence(doc["licence"])
    return (
        '<section aria-labelledby="data-h"><h2 id="data-h">Downloads and licence</h2>'
        f"<p>Every release as it was made, with its &#949;, mechanism, noise scale and margin, and the raw noisy "
        f'counts (which can be below zero): <a href="{esc(json_path)}">releases.json</a> (JSON) and '
        f'<a href="{esc(csv_path)}">releases.csv</a> (CSV, one number per row). The numbers of this page: '
        f'<a href="{esc(_relative(STATS_PATH))}">{esc(STATS_PATH)}</a> (JSON). The released numbers are licensed under '
        f"{licence}.</p></section>"
    )


def render_public(doc: Document) -> str:
    """The public page (``GET /``) of ``doc``, the public document (:func:`._public.document`).

    A function of ``doc`` alone (no clock), so every process renders the same bytes for the same releases.
    """
    app, min_count = doc["app"], doc["min_count"]
    weeks = sorted((_released(item, "week", min_count) for item in doc["weeks"]), key=lambda w: w.name)
    periods = [
        _released(item, unit, min_count)
        for unit, key in (("month", "months"), ("quarter", "quarters"), ("year", "years"))
        for item in doc[key]  # type: ignore[literal-required]
    ]
    window = _html.window([w.name for w in weeks])
    json_path, csv_path = _downloads(doc)
    name = esc(app)
    sections = [_public_trend(weeks, window)] if weeks else []
    if weeks:
        sections += [_public_breakdown(section, weeks, window, app) for section in _SECTIONS]
    body = (
        f"<h1><bdi>{name}</bdi> developers per week</h1>"
        f'<p class="lead">Distinct anonymous developers of <bdi>{name}</bdi> per ISO week, counted by a self-hosted '
        "spool_reporter collector from the reports of its developer commands, and released with differential "
        "privacy: every number is an estimate with random noise added, shown with its 95&#160;% interval.</p>"
        f"{_headline(weeks)}"
        f"{_schedule(doc['made'] or '', weeks, doc['first_week'] or '')}"
        f'<p>Every release: <a href="{esc(json_path)}">JSON</a>, <a href="{esc(csv_path)}">CSV</a>. '
        f"Licence: {_licence(doc['licence'])}. How these numbers are made, and what they protect: "
        "below.</p>"
        f"{''.join(sections)}"
        f"{_periods_section(periods)}"
        f"{_public_method(doc, weeks)}"
        f"{_data_section(doc)}"
        f"<footer>Released numbers of a spool_reporter collector; page made by spool_reporter "
        f"{esc(__version__)}.</footer>"
    )
    return _html.page(f"{name} developers per week", body)
