"""Inline SVG charts for the collector's pages: a trend line (exact counts, for the operator), a trend of
estimates with their 95 % intervals (the public releases), and stacked shares, one column per ISO week.

The charts have no ``viewBox``: vertical positions are CSS pixels of a fixed height and horizontal ones
are percentages of the chart's width, so a chart fills a phone's 390 px or a desktop's column while its
text keeps its size (a scaled ``viewBox`` would shrink 12 px labels to 6 px on a phone). The y-axis
labels sit in a gutter left of the chart (``overflow: visible``, a CSS margin), and the page's
stylesheet hides every other week label on narrow screens (class ``wide``).

The public trend's uncertainty band is the one shape that cannot be drawn in percentages (a ``<path>`` takes
only user units): it lives in a nested ``<svg>`` whose ``viewBox`` is one unit per week and whose
``preserveAspectRatio="none"`` stretches it over the chart's width. It has a fill and no stroke, so the
stretch distorts nothing a reader could see.

No ``style`` attribute anywhere: the page's Content-Security-Policy allows its one stylesheet by hash,
and colours come from classes (``s0``..``s8``, ``so`` for "other", ``sf`` for the values folded into
"fewer than N each"). Every client-supplied string is escaped here (:func:`esc`); callers pass raw values.
"""

from __future__ import annotations

import html
import math
import re

from spool_reporter._words import plural

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final, NamedTuple
else:
    from typing import NamedTuple

HEIGHT: Final = 272
"""Chart height in CSS pixels: the plot, then a band for the week labels."""
PLOT_TOP: Final = 12
PLOT_H: Final = 220
LABEL_Y: Final = PLOT_TOP + PLOT_H + 22

WIDE_LABELS: Final = 10
"""Week labels under a chart at most (a desktop's chart is 600 px or more)."""
NARROW_LABELS: Final = 4
"""Week labels left on a phone (below 40rem; the page's stylesheet hides the others)."""

SERIES_CLASSES: Final = tuple(f"s{i}" for i in range(9))
"""Colour classes of the named series of a stacked chart (the page's stylesheet defines them)."""
OTHER_CLASS: Final = "so"
"""The colour class of the "other" value (grey)."""
FOLD_CLASS: Final = "sf"
"""The colour class of the values folded together on the public page ("fewer than N each": light grey)."""


class Series(NamedTuple):
    """One series of a stacked chart: the key of its counts, the label a reader sees, its colour class."""

    key: str
    label: str
    cls: str


class Estimate(NamedTuple):
    """A released number as the public page shows it (``._public.number``)."""

    estimate: int
    low: int
    high: int
    fewer_than: int = 0
    """Above 0: the estimate is below this and is shown only as "fewer than N" (never the estimate itself)."""


_UNSAFE: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
"""Characters that XML forbids or that cannot be encoded (lone surrogates), and the C1 controls."""


def esc(value: object) -> str:
    """``value`` as text safe in HTML and SVG, in element content and in quoted attributes.

    Besides escaping markup, it replaces control characters and lone surrogates with U+FFFD: the
    validation upstream refuses them, but a page that cannot be encoded would be a 500, not a page.
    """
    return html.escape(_UNSAFE.sub("\ufffd", str(value)), quote=True)


def _x(index: float, slots: int) -> str:
    return f"{100 * index / slots:.3f}%"


def nice_max(value: int) -> int:
    """The top of a y axis for ``value``: four equal, round steps (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 x 10^n each)."""
    magnitude = 1
    while True:
        for step in (10, 15, 20, 25, 30, 40, 50, 60, 80):
            if step * magnitude % 10 == 0 and 4 * step * magnitude // 10 >= value:
                return 4 * step * magnitude // 10
        magnitude *= 10


def _week_labels(weeks: Sequence[str]) -> list[str]:
    """Labels under at most :data:`WIDE_LABELS` weeks; at most :data:`NARROW_LABELS` of them on narrow screens
    (the others have class ``wide``): a label is about 55 px wide, a phone's chart about 300 px."""
    n = len(weeks)
    every = max(1, math.ceil(n / WIDE_LABELS))
    narrow = every * math.ceil(math.ceil(n / every) / NARROW_LABELS)
    out = []
    for i, week in enumerate(weeks):
        if i % every:
            continue
        cls = "" if i % narrow == 0 else ' class="wide"'
        # Near the right edge a centred label would stick out of the page on a phone: end it at its slot.
        x, anchor = (_x(i + 1, n), "end") if n > 1 and (i + 0.5) / n > 0.88 else (_x(i + 0.5, n), "middle")
        out.append(f'<text x="{x}" y="{LABEL_Y}" text-anchor="{anchor}"{cls}>{esc(week)}</text>')
    return out


def _y(value: float, top: float) -> float:
    return PLOT_TOP + PLOT_H - PLOT_H * value / top


def _open(ident: str, title: str, desc: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{ident}" width="100%" height="{HEIGHT}" '
        f'role="img" aria-labelledby="{ident}-t {ident}-d">',
        f'<title id="{ident}-t">{esc(title)}</title><desc id="{ident}-d">{esc(desc)}</desc>',
    ]


def _empty(ident: str, title: str, message: str) -> str:
    parts = _open(ident, title, message)
    parts.append(f'<text x="50%" y="{PLOT_TOP + PLOT_H // 2}" text-anchor="middle">{esc(message)}</text></svg>')
    return "".join(parts)


def trend(ident: str, title: str, points: Sequence[tuple[str, int | None]], *, empty: str) -> str:
    """A line of ``points`` (week, developers); ``None`` is a week not shown: the line breaks there."""
    values = [v for _, v in points if v is not None]
    if not values:
        return _empty(ident, title, empty)
    n = len(points)
    top = nice_max(max(values))
    parts = _open(ident, title, "A line of distinct developers per week. The table beside it has the numbers.")
    for i in range(5):
        tick = top * i // 4
        y = _y(tick, top)
        parts.append(f'<line class="grid" x1="0" y1="{y:.1f}" x2="100%" y2="{y:.1f}"/>')
        parts.append(f'<text x="-8" y="{y + 4:.1f}" text-anchor="end">{tick:,}</text>')
    parts.extend(_week_labels([week for week, _ in points]))
    for i in range(n - 1):
        a, b = points[i][1], points[i + 1][1]
        if a is not None and b is not None:
            parts.append(
                f'<line class="trend" x1="{_x(i + 0.5, n)}" y1="{_y(a, top):.1f}" '
                f'x2="{_x(i + 1.5, n)}" y2="{_y(b, top):.1f}"/>'
            )
    for i, (week, value) in enumerate(points):
        if value is not None:
            parts.append(
                f'<circle class="point" cx="{_x(i + 0.5, n)}" cy="{_y(value, top):.1f}" r="3">'
                f"<title>{esc(week)}: {value:,} {plural(value, 'developer')}</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts)


def stacked_shares(
    ident: str,
    title: str,
    columns: Sequence[tuple[str, dict[str, int] | None]],
    series: Sequence[Series],
    *,
    unit: str,
    empty: str,
    estimated: bool = False,
) -> str:
    """One bar of 100 % per week, split into the shares of ``series`` (bottom up, in that order).

    ``columns`` is (week, {series key: count}), or ``None`` for a week without a bar. With ``estimated``
    the counts are released estimates: a segment says "about" its count, and the folded series
    (:data:`FOLD_CLASS`) says only its share, since it stands for several values that are not shown one by one.
    """
    if not any(counts for _, counts in columns):
        return _empty(ident, title, empty)
    n = len(columns)
    parts = _open(ident, title, f"Stacked shares of {unit} per week. The table beside it has the numbers.")
    for i in range(5):
        y = _y(i, 4)
        parts.append(f'<line class="grid" x1="0" y1="{y:.1f}" x2="100%" y2="{y:.1f}"/>')
        parts.append(f'<text x="-8" y="{y + 4:.1f}" text-anchor="end">{25 * i}%</text>')
    parts.extend(_week_labels([week for week, _ in columns]))
    width = 100 * 0.72 / n
    for i, (week, counts) in enumerate(columns):
        total = sum(counts.values()) if counts else 0
        if not counts or total <= 0:
            continue
        x = f"{100 * (i + 0.14) / n:.3f}%"
        below = 0
        for item in series:
            count = counts.get(item.key, 0)
            if count <= 0:
                continue
            y_top = _y(below + count, total)
            height = _y(below, total) - y_top
            share = 100 * count / total
            if not estimated:
                said = f"{count:,} {esc(unit)} ({share:.0f}%)"
            elif item.cls == FOLD_CLASS:
                said = f"{share:.0f}% together"
            else:
                said = f"about {count:,} {esc(unit)} ({share:.0f}%)"
            parts.append(
                f'<rect class="seg {item.cls}" x="{x}" y="{y_top:.2f}" width="{width:.3f}%" height="{height:.2f}">'
                f"<title>{esc(week)}, {esc(item.label)}: {said}</title></rect>"
            )
            below += count
    parts.append("</svg>")
    return "".join(parts)


def _band(points: Sequence[tuple[str, Estimate | None]], top: int) -> str:
    """The 95 % intervals of the shown estimates as one filled band per run of consecutive shown weeks, in a
    nested ``<svg>`` of one user unit per week (see the module's docstring)."""
    n = len(points)
    runs: list[list[tuple[int, Estimate]]] = []
    previous = -2
    for i, (_, value) in enumerate(points):
        if value is None or value.fewer_than:
            continue
        if i != previous + 1:
            runs.append([])
        runs[-1].append((i, value))
        previous = i
    paths = []
    for run in runs:
        # From the left edge of the run's first slot to the right edge of its last, through each week's middle:
        # a week alone still gets a visible band.
        first, last = run[0], run[-1]
        upper = [(first[0], first[1].high)] + [(i + 0.5, v.high) for i, v in run] + [(last[0] + 1, last[1].high)]
        lower = [(last[0] + 1, last[1].low)] + [(i + 0.5, v.low) for i, v in reversed(run)] + [(first[0], first[1].low)]
        d = " ".join(f"{'M' if j == 0 else 'L'}{x:g} {_y(y, top):.1f}" for j, (x, y) in enumerate(upper + lower))
        paths.append(f'<path class="band" d="{d} Z"/>')
    return (
        f'<svg x="0" y="0" width="100%" height="{HEIGHT}" viewBox="0 0 {n} {HEIGHT}" preserveAspectRatio="none" '
        f'aria-hidden="true">{"".join(paths)}</svg>'
    )


def estimates_trend(ident: str, title: str, points: Sequence[tuple[str, Estimate | None]], *, empty: str) -> str:
    """A line of released weekly estimates in the band of their 95 % intervals.

    ``points`` is (week, estimate), ``None`` for a week without a release (the line breaks there). A week whose
    estimate is "fewer than N" gets no point, no line and no band: only a dashed outline from 0 to N, which
    shows what is known (below N) and not the estimate.
    """
    shown = [v for _, v in points if v is not None]
    if not shown:
        return _empty(ident, title, empty)
    n = len(points)
    top = nice_max(max(v.fewer_than or v.high for v in shown))
    parts = _open(
        ident,
        title,
        "A line of the estimated developers per week, in a band holding each week's 95 % interval. "
        "The table beside it has the numbers.",
    )
    for i in range(5):
        tick = top * i // 4
        y = _y(tick, top)
        parts.append(f'<line class="grid" x1="0" y1="{y:.1f}" x2="100%" y2="{y:.1f}"/>')
        parts.append(f'<text x="-8" y="{y + 4:.1f}" text-anchor="end">{tick:,}</text>')
    parts.append(_band(points, top))
    parts.extend(_week_labels([week for week, _ in points]))
    for i, (week, value) in enumerate(points):
        if value is not None and value.fewer_than:
            y_top = _y(value.fewer_than, top)
            parts.append(
                f'<rect class="few" x="{_x(i + 0.2, n)}" y="{y_top:.1f}" width="{60 / n:.3f}%" '
                f'height="{_y(0, top) - y_top:.1f}"><title>{esc(week)}: fewer than {value.fewer_than:,} '
                "developers</title></rect>"
            )
    for i in range(n - 1):
        a, b = points[i][1], points[i + 1][1]
        if a is not None and b is not None and not a.fewer_than and not b.fewer_than:
            parts.append(
                f'<line class="trend" x1="{_x(i + 0.5, n)}" y1="{_y(a.estimate, top):.1f}" '
                f'x2="{_x(i + 1.5, n)}" y2="{_y(b.estimate, top):.1f}"/>'
            )
    for i, (week, value) in enumerate(points):
        if value is not None and not value.fewer_than:
            parts.append(
                f'<circle class="point" cx="{_x(i + 0.5, n)}" cy="{_y(value.estimate, top):.1f}" r="3">'
                f"<title>{esc(week)}: about {value.estimate:,} {plural(value.estimate, 'developer')} "
                f"(95 %: {value.low:,}&#8211;{value.high:,})</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts)
