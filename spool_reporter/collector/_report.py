"""A readable, self-contained HTML report of :class:`~spool_reporter.collector._stats.Stats`.

One file with inline CSS and an inline SVG bar chart of weekly distinct developers: no JavaScript, no
fonts, images or stylesheets from elsewhere, so it opens offline and leaks nothing when opened. Every
value that came from a client (versions, OS names, command names) is escaped. The markup is also
well-formed XML, which the tests use to check it.
"""

from __future__ import annotations

import datetime
import html

from spool_reporter._version import __version__

from ._stats import plural

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

    from ._stats import Stats, Week

CHART_WEEKS: Final = 104
"""The chart shows at most the last two years of weeks (the table below it has them all)."""

_W: Final = 760
_H: Final = 280
_LEFT: Final = 48
_RIGHT: Final = 12
_TOP: Final = 16
_BOTTOM: Final = 56

_CSS: Final = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2327; margin: 2rem auto;
       max-width: 62rem; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
p.lead { color: #50575e; margin-top: 0; }
.summary { display: flex; gap: 2rem; margin: 1rem 0 1.5rem; }
.summary div { font-size: .85rem; color: #50575e; }
.summary strong { display: block; font-size: 1.6rem; color: #0c4b33; }
svg { max-width: 100%; height: auto; }
svg .bar { fill: #0c4b33; }
svg .axis { stroke: #8c8f94; stroke-width: 1; }
svg .grid { stroke: #dcdcde; stroke-width: 1; }
svg text { font-size: 11px; fill: #50575e; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid #dcdcde; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
footer { margin-top: 2rem; font-size: .8rem; color: #787c82; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _week_monday(week: str) -> datetime.date | None:
    try:
        year, num = week.split("-W")
        return datetime.date.fromisocalendar(int(year), int(num), 1)
    except ValueError:
        return None


def _series(weeks: list[Week]) -> list[tuple[str, int]]:
    """The last :data:`CHART_WEEKS` weeks, with the weeks nobody reported filled in as zero."""
    known = {w.week: w.developers for w in weeks}
    if not weeks:
        return []
    last = _week_monday(weeks[-1].week)
    first = _week_monday(weeks[0].week)
    if last is None or first is None:  # pragma: no cover - weeks come from iso_week()
        return [(w.week, w.developers) for w in weeks[-CHART_WEEKS:]]
    span = min(CHART_WEEKS, (last - first).days // 7 + 1)
    out = []
    for back in range(span - 1, -1, -1):
        year, num, _ = (last - datetime.timedelta(weeks=back)).isocalendar()
        label = f"{year:04d}-W{num:02d}"
        out.append((label, known.get(label, 0)))
    return out


def _nice_max(value: int) -> int:
    for step in (1, 2, 5):
        magnitude = 1
        while magnitude * 10 <= max(value, 1):
            magnitude *= 10
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def chart_svg(weeks: list[Week]) -> str:
    """An inline SVG bar chart of distinct developers per week (each bar has a tooltip with its number)."""
    series = _series(weeks)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        'role="img" aria-labelledby="chart-title">',
        '<title id="chart-title">Distinct developers per ISO week</title>',
    ]
    if not series:
        parts.append(f'<text x="{_W // 2}" y="{_H // 2}" text-anchor="middle">No events yet.</text></svg>')
        return "".join(parts)
    top = _nice_max(max(n for _, n in series))
    for i in range(5):
        value = top * i // 4
        y = _TOP + plot_h - plot_h * value / top
        parts.append(f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value}</text>')
    slot = plot_w / len(series)
    bar = max(1.0, slot * 0.75)
    label_every = max(1, round(len(series) / 12))
    for i, (week, count) in enumerate(series):
        x = _LEFT + i * slot + (slot - bar) / 2
        h = plot_h * count / top
        y = _TOP + plot_h - h
        plural = "" if count == 1 else "s"
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}">'
            f"<title>{_e(week)}: {count} developer{plural}</title></rect>"
        )
        if len(series) <= 16 and count:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{count}</text>')
        if i % label_every == 0 or i == len(series) - 1:
            lx, ly = x + bar / 2, _TOP + plot_h + 14
            parts.append(
                f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="end" '
                f'transform="rotate(-40 {lx:.1f} {ly:.1f})">{_e(week)}</text>'
            )
    base = _TOP + plot_h
    parts.append(f'<line class="axis" x1="{_LEFT}" y1="{base}" x2="{_W - _RIGHT}" y2="{base}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _counts(counts: dict[str, int]) -> str:
    if not counts:
        return "&#8212;"
    return "<br/>".join(f"{_e(name)}: {count}" for name, count in counts.items())


def render_html(stats: Stats, *, generated: datetime.datetime | None = None) -> str:
    """The whole report as one HTML document (a ``str``; write it with UTF-8)."""
    when = (generated or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for week in reversed(stats.weeks):  # newest first in the table
        rows.append(
            "<tr>"
            f"<td>{_e(week.week)}</td>"
            f'<td class="num">{week.developers}</td>'
            f'<td class="num">{week.events}</td>'
            f"<td>{_counts(week.by_django)}</td>"
            f"<td>{_counts(week.by_python)}</td>"
            f"<td>{_counts(week.by_os)}</td>"
            f"<td>{_counts(week.by_event)}</td>"
            "</tr>"
        )
    table = (
        "<table><thead><tr><th>Week</th>"
        '<th class="num">Developers</th><th class="num">Events</th>'
        f"<th>{_e(stats.app)} version</th><th>Python</th><th>OS</th><th>Commands (events)</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        if rows
        else "<p>No events have been received yet.</p>"
    )
    app = _e(stats.app)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        # Nothing may load from elsewhere, even if a value slipped past the escaping.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\"/>"
        f"<title>{app} developers per week</title><style>{_CSS}</style></head><body>"
        f"<h1>{app} developers per week</h1>"
        '<p class="lead">Distinct anonymous client ids per ISO week, from the spool_reporter collector. '
        "No IP address or request header was ever stored.</p>"
        '<div class="summary">'
        f"<div><strong>{stats.developers}</strong>{plural(stats.developers, 'developer')} in all</div>"
        f"<div><strong>{stats.events}</strong>{plural(stats.events, 'event')}</div>"
        f"<div><strong>{len(stats.weeks)}</strong>{plural(len(stats.weeks), 'week')} with events</div>"
        "</div>"
        f"<figure>{chart_svg(stats.weeks)}</figure>"
        "<h2>Week by week</h2>"
        "<p>A developer who used two versions in one week is counted under both, so a breakdown can add up "
        "to more than the week's developers.</p>"
        f"{table}"
        f"<footer>Generated {_e(when)} by spool_reporter {_e(__version__)}.</footer>"
        "</body></html>\n"
    )
