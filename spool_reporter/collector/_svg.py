"""Inline SVG charts for the collector's page: a trend line and stacked shares, one column per ISO week.

The charts have no ``viewBox``: vertical positions are CSS pixels of a fixed height and horizontal ones
are percentages of the chart's width, so a chart fills a phone's 390 px or a desktop's column while its
text keeps its size (a scaled ``viewBox`` would shrink 12 px labels to 6 px on a phone). The y-axis
labels sit in a gutter left of the chart (``overflow: visible``, a CSS margin), and the page's
stylesheet hides every other week label on narrow screens (class ``wide``).

No ``style`` attribute anywhere: the page's Content-Security-Policy allows its one stylesheet by hash,
and colours come from classes (``s0``..``s8``, ``so`` for "other"). Every client-supplied string is
escaped here (:func:`esc`); callers pass raw values.
"""

from __future__ import annotations

import html
import math
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final

HEIGHT: Final = 272
"""Chart height in CSS pixels: the plot, then a band for the week labels."""
PLOT_TOP: Final = 12
PLOT_H: Final = 220
LABEL_Y: Final = PLOT_TOP + PLOT_H + 22

SERIES_CLASSES: Final = tuple(f"s{i}" for i in range(9))
"""Colour classes of the named series of a stacked chart (the page's stylesheet defines them)."""
OTHER_CLASS: Final = "so"


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
    """Labels under every ``wide``-th week; every other one of them only on wide screens."""
    n = len(weeks)
    every = max(1, math.ceil(n / 10))
    out = []
    for i, week in enumerate(weeks):
        if i % every:
            continue
        cls = "" if i % (2 * every) == 0 else ' class="wide"'
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
            plural = "" if value == 1 else "s"
            parts.append(
                f'<circle class="point" cx="{_x(i + 0.5, n)}" cy="{_y(value, top):.1f}" r="3">'
                f"<title>{esc(week)}: {value:,} developer{plural}</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts)


def stacked_shares(
    ident: str,
    title: str,
    columns: Sequence[tuple[str, dict[str, int] | None]],
    series: Sequence[str],
    *,
    unit: str,
    empty: str,
) -> str:
    """One bar of 100 % per week, split into the shares of ``series`` (bottom up, in that order).

    ``columns`` is (week, {series name: count}) with every name in ``series``, or ``None`` for a week
    without a bar. The last name of ``series`` gets the "other" colour if it is ``"other"``.
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
        for j, name in enumerate(series):
            count = counts.get(name, 0)
            if count <= 0:
                continue
            y_top = _y(below + count, total)
            height = _y(below, total) - y_top
            cls = OTHER_CLASS if name == "other" else SERIES_CLASSES[j % len(SERIES_CLASSES)]
            share = 100 * count / total
            parts.append(
                f'<rect class="seg {cls}" x="{x}" y="{y_top:.2f}" width="{width:.3f}%" height="{height:.2f}">'
                f"<title>{esc(week)}, {esc(name)}: {count:,} {esc(unit)} ({share:.0f}%)</title></rect>"
            )
            below += count
    parts.append("</svg>")
    return "".join(parts)
