"""The HTML kit both of the collector's pages are made with: the document around a page, its stylesheet and
policy, the chart sections and data tables, and the window of weeks a chart shows.

The public page (:mod:`._public_page`) and the operator's page (:mod:`._operator_page`) are each one
self-contained HTML document: an inline stylesheet (``page.css``, a file of the package, and the series
colours), inline SVG charts (:mod:`._svg`) and no JavaScript, fonts, images or anything else from elsewhere, so
they open offline and load nothing. Their Content-Security-Policy (:data:`CSP`, in a ``<meta>`` element and,
when served, a header) allows nothing but that one stylesheet, by its hash.

Every value that came from a client or from the database is escaped with :func:`._svg.esc` where it is put
into the markup, and isolated with ``<bdi>``; the markup is also well-formed XML, which the tests use to check
it. The pages are written as Python f-strings, without a template engine: the reason is in the design notes
("The pages without a template engine").
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import importlib.resources as _resources

from . import _weeks
from ._svg import FOLD_CLASS, OTHER_CLASS, SERIES_CLASSES, esc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Final, TypeVar

    _W = TypeVar("_W")

CHART_WEEKS: Final = 104
"""The page shows at most the last two years of weeks (the JSON document has them all)."""

MAX_SERIES: Final = len(SERIES_CLASSES)
"""Named values per stacked chart; the less common ones are drawn (and tabled) with "other" (the operator's
page) or with the values below the display threshold (the public page)."""

SECTIONS: Final = (
    ("by_django", "versions", "{app} versions", "developers"),
    ("by_python", "python", "Python versions", "developers"),
    ("by_os", "os", "Operating systems", "developers"),
    ("by_event", "commands", "Commands", "events"),
)
"""(breakdown, element id, heading, unit) of each stacked chart of the operator's page; the public page shows
the first three (an event count is no developer count, so commands are not released)."""

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

DASH: Final = "&#8211;"
"""The en dash of an interval (``1,197-1,271`` with an en dash), as a character reference: the source stays ASCII."""

NBSP: Final = "&#160;"
"""Keeps ``95 %`` on one line."""


def window(labels: Sequence[str]) -> list[str]:
    """The last :data:`CHART_WEEKS` ISO weeks up to the newest of ``labels`` (oldest first), weeks without
    numbers included, so that a chart shows a gap where a week has none."""
    if not labels:
        return []
    last, first = _weeks.monday_or_none(labels[-1]), _weeks.monday_or_none(labels[0])
    if last is None or first is None:  # not ISO weeks (a database written by hand): the labels as they are
        return list(labels[-CHART_WEEKS:])
    span = max(1, min(CHART_WEEKS, (last - first).days // 7 + 1))
    return [_weeks.week_of(last - datetime.timedelta(weeks=back)) for back in range(span - 1, -1, -1)]


def shown(known: dict[str, _W], window: Sequence[str]) -> list[_W]:
    """The weeks of ``known`` (by name) that the chart's ``window`` shows, oldest first."""
    return [known[label] for label in window if label in known]


def legend(items: Sequence[tuple[str, str]]) -> str:
    """A stacked chart's legend: a swatch of each series' class and its label (escaped), in order."""
    swatches = "".join(
        f'<li><span class="sw {cls}" aria-hidden="true"></span><bdi>{esc(label)}</bdi></li>' for cls, label in items
    )
    return f'<ul class="legend">{swatches}</ul>'


def chart_section(ident: str, heading: str, figure: str, table: str) -> str:
    """A section of both pages: its heading, then the chart (``figure``) with its table beside or under it."""
    return (
        f'<section aria-labelledby="{ident}-h"><h2 id="{ident}-h">{esc(heading)}</h2>'
        f'<div class="pair"><figure>{figure}</figure>{table}</div></section>'
    )


def table(ident: str, caption: str, head: list[str], rows: list[str]) -> str:
    """A data table in its own scroll region. On a phone (``page.css``) each row is shown as a block, its cells
    side by side as far as they fit, each under its column's name (the cell's ``data-label``, escaped), so
    that no column is ever out of sight, however many values a breakdown has."""
    return (
        f'<div class="table" role="region" aria-labelledby="{ident}-c" tabindex="0"><table>'
        f'<caption id="{ident}-c"><span>{caption}</span></caption><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def trend_table(caption: str, more: list[str], rows: list[str]) -> str:
    """The table beside a page's trend: a row per week (``rows``, newest first) under the week, its developers
    and ``more`` column heads; nothing while no week has numbers."""
    head = ['<th scope="col">Week</th>', '<th scope="col" class="n">Developers</th>', *more]
    return table("trend-table", caption, head, rows) if rows else ""


def method_section(items: str) -> str:
    """The section "How these numbers are made" of either page: ``items``, its list items."""
    return (
        '<section aria-labelledby="method-h"><h2 id="method-h">How these numbers are made</h2>'
        f'<ul class="method">{items}</ul></section>'
    )


def page(title: str, body: str) -> str:
    """The whole document: ``title`` (escaped already) and ``body`` inside ``<main>``, with the stylesheet and
    the policy."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        # Nothing may load or run, even if a value slipped past the escaping.
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}"/>'
        '<meta name="referrer" content="no-referrer"/>'
        f"<title>{title}</title><style>{_CSS}</style></head><body><main>{body}</main></body></html>\n"
    )
