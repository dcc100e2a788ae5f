"""The operator's page: the full numbers (exact counts, no noise, no threshold) that ``collector stats --html
FILE`` writes for the collector's operator. It is never served: the public page is :mod:`._public_page`.

:func:`render_html` turns :class:`~spool_reporter.collector._stats.Stats` into one HTML document made with the
kit of :mod:`._html`: a summary, a trend of developers per ISO week, then stacked shares of the application's
versions, Python versions, operating systems and commands, each chart with its data table, and how the
numbers are made. Every value that came from a client or from the database is escaped and isolated with
``<bdi>``.
"""

from __future__ import annotations

import datetime

from spool_reporter._event import OTHER
from spool_reporter._version import __version__
from spool_reporter._words import plural

from . import _html
from ._svg import OTHER_CLASS, SERIES_CLASSES, Series, esc, stacked_shares, trend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._stats import Stats, Week


def _series(columns: Sequence[dict[str, int]]) -> list[str]:
    """The named values of a stacked chart (most counted first, at most :data:`_html.MAX_SERIES`), then "other"."""
    totals: dict[str, int] = {}
    for counts in columns:
        for name, count in counts.items():
            totals[name] = totals.get(name, 0) + count
    named = sorted((n for n in totals if n != OTHER), key=lambda n: (-totals[n], n))
    keep = named[: _html.MAX_SERIES]
    return [*keep, OTHER] if len(named) > _html.MAX_SERIES or OTHER in totals else keep


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
        for w in reversed(_html.shown(known, window))
    ]
    table = _html.trend_table("Developers per week, newest first", ['<th scope="col" class="n">Events</th>'], rows)
    return _html.chart_section("trend", "Developers per week", chart, table)


def _breakdown_section(section: tuple[str, str, str, str], weeks: Sequence[Week], window: list[str], app: str) -> str:
    name, ident, heading, unit = section
    heading = heading.format(app=app)
    known = {w.week: w for w in weeks}
    shown = _html.shown(known, window)
    names = _series([getattr(w, name) for w in shown])
    folded = {w.week: _fold(getattr(w, name), names) for w in shown}
    series = [
        Series(value, value, OTHER_CLASS if value == OTHER else SERIES_CLASSES[i % len(SERIES_CLASSES)])
        for i, value in enumerate(names)
    ]
    columns = [(label, folded.get(label) or None) for label in window]
    title = f"{heading} per ISO week, as shares of the week's {unit}"
    chart = stacked_shares(ident, title, columns, series, unit=unit, empty="Nothing to show.")
    legend = _html.legend([(s.cls, s.label) for s in series])
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
                f"{f'{counts[s]:,} ({100 * counts[s] / total:.0f}%)' if s in counts else _html.DASH}</td>"
                for s in names
            )
        rows.append(f'<tr><th scope="row">{esc(week.week)}</th>{cells}</tr>')
    caption = f"{esc(heading)}, newest week first"
    table = _html.table(f"{ident}-table", caption, head, rows)
    return _html.chart_section(ident, heading, chart + legend, table)


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
    return _html.method_section(items)


def render_html(doc: Stats, *, generated: datetime.datetime | None = None) -> str:
    """The operator's page of ``doc`` (the full numbers) as one HTML document (write UTF-8). Never served:
    the public page is :func:`render_public`."""
    when = (generated or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    app = esc(doc.app)
    weeks = doc.weeks
    window = _html.window([w.week for w in weeks])
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
        for section in _html.SECTIONS
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
    return _html.page(f"{app} developers per week", body)
