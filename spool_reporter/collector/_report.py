"""The collector's page: ``GET /`` serves it, and ``collector stats --html FILE`` writes the same page.

One self-contained HTML document: an inline stylesheet, inline SVG charts (:mod:`._svg`) and no
JavaScript, fonts, images or anything else from elsewhere, so it opens offline and leaks nothing when
opened. Its Content-Security-Policy (:data:`CSP`, in a ``<meta>`` element and, when served, a header)
allows nothing but that one stylesheet, by its hash.

It shows distinct developers per ISO week: a trend line, then stacked shares of the application's
versions, Python versions and operating systems, each chart with a data table beside it (the table is
the chart's text alternative: the same numbers, newest week first). Given
:class:`~spool_reporter.collector._public.Published` (the public numbers) it says which threshold made
them; given :class:`~spool_reporter.collector._stats.Stats` (the operator's full numbers) it says that
none was applied, and adds the commands table. Every value that came from a client (versions, OS names,
command names) is escaped, and isolated with ``<bdi>``. The markup is also well-formed XML, which the
tests use to check it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib

from spool_reporter._version import __version__

from spool_reporter._event import OTHER

from ._stats import plural
from ._svg import OTHER_CLASS, SERIES_CLASSES, esc, stacked_shares, trend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

    from ._stats import Stats, Week

CHART_WEEKS: Final = 104
"""The page shows at most the last two years of weeks (the JSON document has them all)."""

MAX_SERIES: Final = len(SERIES_CLASSES)
"""Named values per stacked chart; the less common ones are drawn (and tabled) with "other"."""

_PALETTE: Final = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
"""Tableau 10's first nine colours, for the named series; "other" is grey."""

_CSS: Final = (
    """
:root { color-scheme: light; }
body { font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2327;
       background: #fff; margin: 0; }
main { max-width: 76rem; margin: 0 auto; padding: 1.5rem 1rem 3rem; }
h1 { font-size: 1.6rem; line-height: 1.25; margin: 0 0 .4rem; }
h2 { font-size: 1.2rem; margin: 2.4rem 0 .8rem; }
p { max-width: 48rem; }
.lead { color: #50575e; margin-top: 0; }
.summary { display: flex; flex-wrap: wrap; gap: .75rem 2.5rem; margin: 1.2rem 0 0; padding: 0; list-style: none; }
.summary li { font-size: .85rem; color: #50575e; }
.summary strong { display: block; font-size: 1.6rem; color: #0c4b33; font-variant-numeric: tabular-nums; }
.pair { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 1.25rem 2rem; align-items: start; }
@media (max-width: 52rem) { .pair { grid-template-columns: minmax(0, 1fr); } }
figure { margin: 0; }
svg.chart { display: block; width: calc(100% - 3.5rem); margin-left: 3.5rem; overflow: visible; }
svg.chart text { font-size: 12px; fill: #50575e; }
@media (max-width: 40rem) { svg.chart .wide { display: none; } }
.grid { stroke: #dcdcde; stroke-width: 1; }
.trend { stroke: #0c4b33; stroke-width: 2; }
.point { fill: #0c4b33; }
.seg { stroke: #fff; stroke-width: .5; }
.legend { list-style: none; padding: 0; margin: .5rem 0 0 3.5rem; display: flex; flex-wrap: wrap;
          gap: .2rem 1rem; font-size: .85rem; }
.sw { display: inline-block; width: .8rem; height: .8rem; margin-right: .35rem; border-radius: 2px;
      vertical-align: -.05rem; }
.table { max-height: 21rem; overflow: auto; border: 1px solid #dcdcde; border-radius: 4px; }
table { border-collapse: collapse; width: 100%; font-size: .85rem; }
caption { text-align: left; font-weight: 600; padding: .45rem .6rem; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #ececec; white-space: nowrap; }
thead th { position: sticky; top: 0; background: #f6f7f7; white-space: normal; vertical-align: bottom; }
.n { text-align: right; font-variant-numeric: tabular-nums; }
td.none { color: #787c82; white-space: normal; }
.method li { margin: .3rem 0; max-width: 48rem; }
footer { margin-top: 2.5rem; font-size: .8rem; color: #787c82; }
"""
    + "".join(f".s{i} {{ fill: {c}; background: {c}; }}\n" for i, c in enumerate(_PALETTE))
    + f".{OTHER_CLASS} {{ fill: #a5a5a5; background: #a5a5a5; }}\n"
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
"""(breakdown, element id, heading, unit) of each stacked chart."""


def _monday(week: str) -> datetime.date | None:
    try:
        year, num = week.split("-W")
        return datetime.date.fromisocalendar(int(year), int(num), 1)
    except ValueError:
        return None


def _window(weeks: Sequence[Week]) -> list[str]:
    """The labels of the last :data:`CHART_WEEKS` weeks up to the newest, weeks without numbers included."""
    if not weeks:
        return []
    last, first = _monday(weeks[-1].week), _monday(weeks[0].week)
    if last is None or first is None:  # pragma: no cover - weeks come from iso_week()
        return [w.week for w in weeks[-CHART_WEEKS:]]
    span = min(CHART_WEEKS, (last - first).days // 7 + 1)
    out = []
    for back in range(span - 1, -1, -1):
        year, num, _ = (last - datetime.timedelta(weeks=back)).isocalendar()
        out.append(f"{year:04d}-W{num:02d}")
    return out


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


def _swatch(index: int, name: str) -> str:
    cls = OTHER_CLASS if name == OTHER else SERIES_CLASSES[index % len(SERIES_CLASSES)]
    return f'<span class="sw {cls}" aria-hidden="true"></span>'


def _table(ident: str, caption: str, head: list[str], rows: list[str]) -> str:
    return (
        f'<div class="table" role="region" aria-labelledby="{ident}-c" tabindex="0"><table>'
        f'<caption id="{ident}-c">{caption}</caption><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _trend_section(weeks: Sequence[Week], window: list[str], public: None) -> str:
    known = {w.week: w for w in weeks}
    points = [(label, known[label].developers if label in known else None if public else 0) for label in window]
    span = f", {window[0]} to {window[-1]}" if window else ""
    empty = f"No week has reached {public.min_count} developers yet." if public else "No events have been received yet."
    chart = trend("trend", f"Distinct developers per ISO week{span}", points, empty=empty)
    rows = [
        f'<tr><th scope="row">{esc(w.week)}</th><td class="n">{w.developers:,}</td><td class="n">{w.events:,}</td></tr>'
        for w in reversed([known[label] for label in window if label in known])
    ]
    head = [
        '<th scope="col">Week</th>',
        '<th scope="col" class="n">Developers</th>',
        '<th scope="col" class="n">Events</th>',
    ]
    table = _table("trend-table", "Developers per week, newest first", head, rows) if rows else ""
    return (
        '<section aria-labelledby="trend-h"><h2 id="trend-h">Developers per week</h2>'
        f'<div class="pair"><figure>{chart}</figure>{table}</div></section>'
    )


def _breakdown_section(
    section: tuple[str, str, str, str], weeks: Sequence[Week], window: list[str], *, app: str, public: bool
) -> str:
    name, ident, heading, unit = section
    heading = heading.format(app=app)
    known = {w.week: w for w in weeks}
    shown = [known[label] for label in window if label in known]
    series = _series([getattr(w, name) for w in shown])
    folded = {w.week: _fold(getattr(w, name), series) for w in shown}
    columns = [(label, folded.get(label) or None) for label in window]
    title = f"{heading} per ISO week, as shares of the week's {unit}"
    empty = "Not published for these weeks: see how these numbers are made, below." if public else "Nothing to show."
    chart = stacked_shares(ident, title, columns, series, unit=unit, empty=empty)
    legend = "".join(f"<li>{_swatch(i, s)}<bdi>{esc(s)}</bdi></li>" for i, s in enumerate(series))
    head = ['<th scope="col">Week</th>'] + [f'<th scope="col" class="n"><bdi>{esc(s)}</bdi></th>' for s in series]
    rows = []
    for week in reversed(shown):
        counts = folded[week.week]
        total = sum(counts.values())
        if not counts:
            note = "not published this week: it would reveal a small group (see below)" if public else "none"
            cells = f'<td class="none" colspan="{max(1, len(series))}">{note}</td>'
        else:
            cells = "".join(
                f'<td class="n">{counts[s]:,} ({100 * counts[s] / total:.0f}%)</td>'
                if s in counts
                else '<td class="n">&#8211;</td>'
                for s in series
            )
        rows.append(f'<tr><th scope="row">{esc(week.week)}</th>{cells}</tr>')
    caption = f"{esc(heading)}, newest week first"
    table = _table(f"{ident}-table", caption, head, rows)
    return (
        f'<section aria-labelledby="{ident}-h"><h2 id="{ident}-h">{esc(heading)}</h2>'
        f'<div class="pair"><figure>{chart}<ul class="legend">{legend}</ul></figure>{table}</div></section>'
    )


def _method(app: str, public: None) -> str:
    common = (
        "<li>A developer is a distinct anonymous client id: a random id kept in one user's configuration on "
        "one machine. Weeks are ISO 8601 weeks of when the command ran.</li>"
        f"<li>A developer who used two {app} or Python versions in one week counts under both, so the shares "
        "are of the week's developer-version pairs, and a week's numbers can add up to more than its "
        "developers.</li>"
        "<li>No IP address, request header or arrival time is stored by the collector.</li>"
    )
    if public is None:
        rule = (
            "<li><strong>These are the full numbers, for the collector's operator:</strong> no threshold is "
            "applied. The public page (<code>GET /</code>) and <code>GET /v1/stats</code> merge small groups "
            "first (<code>collector stats --min-count</code> shows what they publish).</li>"
        )
    else:
        k = public.min_count
        rule = (
            f"<li><strong>Every number here counts at least {k} developers.</strong> A version or operating "
            f"system used by fewer than {k} developers in a week is merged into &#8220;other&#8221;, and so is "
            f"one whose complement would be smaller than {k}; if &#8220;other&#8221; would still hold fewer "
            f"than {k}, the next smallest value joins it, so that no small group can be worked out by "
            "subtraction from the week's total.</li>"
            f"<li>Weeks with fewer than {k} developers are not shown. A breakdown is not published for a "
            f"week in which between 1 and {k - 1} developers were counted under two values.</li>"
            "<li>Commands are not published: they are counted in events, and an event count says nothing "
            "about how many developers ran them.</li>"
        )
    return (
        '<section aria-labelledby="method-h"><h2 id="method-h">How these numbers are made</h2>'
        f'<ul class="method">{rule}{common}</ul></section>'
    )


def render_public(doc: dict[str, object]) -> str:
    """The public page of the released numbers (``GET /``): stub, replaced by the full page."""
    import json

    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"/>'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}"/>'
        f"<title>developers</title><style>{_CSS}</style></head><body><main><pre>{esc(json.dumps(doc))}</pre>"
        "</main></body></html>\n"
    )


def render_html(doc: Stats, *, generated: datetime.datetime | None = None) -> str:
    """The operator's page of ``doc`` (the full numbers) as one HTML document (write UTF-8)."""
    public = None
    when = (generated or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    app = esc(doc.app)
    weeks = doc.weeks
    window = _window(weeks)
    shown = [w for w in weeks if w.week in set(window)]
    if isinstance(doc, Published):
        latest = f"in {esc(weeks[-1].week)}" if weeks else "in the latest week"
        latest_developers = weeks[-1].developers if weeks else 0
        summary = (
            f"<li><strong>{latest_developers:,}</strong> {plural(latest_developers, 'developer')} {latest}</li>"
            f"<li><strong>{len(weeks)}</strong> {plural(len(weeks), 'week')} shown</li>"
            f"<li><strong>&#8805; {doc.min_count}</strong> developers behind every number</li>"
        )
        lead_rule = f"To protect small groups, every number counts at least {doc.min_count} developers."
    else:
        summary = (
            f"<li><strong>{doc.developers:,}</strong> {plural(doc.developers, 'developer')} in all</li>"
            f"<li><strong>{doc.events:,}</strong> {plural(doc.events, 'event')}</li>"
            f"<li><strong>{len(weeks)}</strong> {plural(len(weeks), 'week')} with events</li>"
        )
        lead_rule = "The full numbers, for the operator: no threshold applied."
    sections = [_trend_section(weeks, window, public)]
    for section in _SECTIONS:
        # A breakdown of developers withheld in every week shown still gets its section, which says so.
        if any(getattr(w, section[0]) for w in shown) or (public and shown and section[0] in BREAKDOWNS):
            sections.append(_breakdown_section(section, weeks, window, app=doc.app, public=public is not None))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        # Nothing may load or run, even if a value slipped past the escaping.
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}"/>'
        '<meta name="referrer" content="no-referrer"/>'
        f"<title>{app} developers per week</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{app} developers per week</h1>"
        f'<p class="lead">Distinct anonymous developers per ISO week, counted by a self-hosted spool_reporter '
        f"collector from the reports of {app}'s developer commands. {esc(lead_rule)}</p>"
        f'<ul class="summary">{summary}</ul>'
        f"{''.join(sections)}"
        f"{_method(app, public)}"
        f"<footer>Generated {esc(when)} by spool_reporter {esc(__version__)}.</footer>"
        "</main></body></html>\n"
    )
