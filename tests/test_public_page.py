"""The collector's page (``collector/_report.py`` and ``_svg.py``), parsed: its charts and tables hold the
same numbers, client-supplied strings stay text, and its Content-Security-Policy allows exactly its own
stylesheet. ``test_public_browser.py`` loads it in a real browser."""

from __future__ import annotations

import base64
import datetime
import hashlib
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spool_reporter.collector import render_html
from spool_reporter.collector._public import OTHER, publish
from spool_reporter.collector._report import CSP, CSP_HEADER, MAX_SERIES
from spool_reporter.collector._stats import Stats, Week
from spool_reporter.collector._svg import nice_max

SVG = "{http://www.w3.org/2000/svg}"
WHEN = datetime.datetime(2026, 12, 7, 9, 30, tzinfo=datetime.timezone.utc)

HOSTILE = [
    '<script>alert("x")</script>',
    '"><img src=x onerror=alert(1)>',
    "</style><script>alert(2)</script>",
    "' onmouseover='alert(3)",
    "]]><!-- &amp; -->",
    "</title></svg><iframe src=//example.org>",
]
"""Values a client could try to send (the validation upstream refuses them; the page must not rely on that)."""

# Every element the page may contain: anything else (script, img, iframe, link, object, ...) is an injection.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "p", "ul", "li", "strong", "section",
    "div", "figure", "table", "caption", "thead", "tbody", "tr", "th", "td", "span", "bdi", "code", "footer",
    f"{SVG}svg", f"{SVG}title", f"{SVG}desc", f"{SVG}line", f"{SVG}text", f"{SVG}circle", f"{SVG}rect",
}  # fmt: skip


def _weeks(n: int, *, start: str = "2026-W01", developers: int = 40, values: list[str] | None = None) -> list[Week]:
    year, num = (int(p) for p in start.split("-W"))
    monday = datetime.date.fromisocalendar(year, num, 1)
    names = values or ["5.2", "4.2"]
    out = []
    for i in range(n):
        y, w, _ = (monday + datetime.timedelta(weeks=i)).isocalendar()
        share = developers // len(names)
        cells = {name: share for name in names}
        cells[names[0]] += developers - share * len(names)
        out.append(
            Week(
                week=f"{y}-W{w:02d}",
                developers=developers,
                events=2 * developers,
                by_django=dict(cells),
                by_python={"CPython 3.12": developers // 2, "CPython 3.11": developers - developers // 2},
                by_os={"Linux": developers},
                by_event={"runserver": 2 * developers},
            )
        )
    return out


def _stats(weeks: list[Week], app: str = "Django") -> Stats:
    return Stats(app=app, developers=999, events=sum(w.events for w in weeks), weeks=weeks)


def _parse(page: str) -> ET.Element:
    assert page.startswith("<!DOCTYPE html>\n")
    root = ET.fromstring(page)  # well-formed XML as well as HTML5
    for element in root.iter():
        assert element.tag in ALLOWED_TAGS, element.tag
        for name in element.attrib:
            assert not name.lower().startswith("on"), name
            assert name not in ("style", "href", "src", "srcdoc", "action", "formaction"), name
    return root


def _text(element: ET.Element) -> str:
    return " ".join("".join(element.itertext()).split())


def _section(root: ET.Element, ident: str) -> ET.Element:
    for section in root.iter("section"):
        if section.get("aria-labelledby") == f"{ident}-h":
            return section
    raise AssertionError(f"no section {ident}")


def _table_rows(section: ET.Element) -> list[list[str]]:
    table = section.find(".//table")
    assert table is not None
    return [[_text(cell) for cell in row] for row in table.iter("tr")]


def test_hostile_values_stay_text_everywhere() -> None:
    weeks = _weeks(3, developers=60, values=HOSTILE)
    weeks = [
        Week(
            week=w.week,
            developers=w.developers,
            events=w.events,
            by_django=w.by_django,
            by_python={v: 10 for v in HOSTILE},
            by_os={HOSTILE[1]: 60},
            by_event={HOSTILE[0]: 1, HOSTILE[2]: 2},
        )
        for w in weeks
    ]
    for doc in (_stats(weeks, app=HOSTILE[3]), publish(_stats(weeks, app=HOSTILE[3]))):
        page = render_html(doc, generated=WHEN)
        root = _parse(page)
        text = _text(root)
        for value in HOSTILE:
            assert value in text  # shown, as text
        assert "<script" not in page
        assert "<img" not in page
        assert "<iframe" not in page
        assert page.count("<style>") == 1
        assert page.count("</style>") == 1


def test_control_characters_and_lone_surrogates_become_replacement_characters() -> None:
    weeks = _weeks(1, values=["5.2\x00\x1b[31m", "\ud800x"])
    page = render_html(_stats(weeks), generated=WHEN)
    page.encode("utf-8")  # would raise on a lone surrogate
    text = _text(_parse(page))
    assert "5.2\ufffd\ufffd[31m" in text
    assert "\ufffdx" in text


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.text(max_size=30), min_size=1, max_size=12, unique=True),
    app=st.text(min_size=1, max_size=20),
)
def test_any_text_gives_a_well_formed_page(values: list[str], app: str) -> None:
    weeks = _weeks(2, developers=12 * len(values), values=values)
    for doc in (_stats(weeks, app=app), publish(_stats(weeks, app=app), min_count=1)):
        page = render_html(doc, generated=WHEN)
        page.encode("utf-8")
        _parse(page)


def test_the_policy_allows_exactly_the_page_stylesheet() -> None:
    page = render_html(_stats(_weeks(2)), generated=WHEN)
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"default-src 'none'; style-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'" == CSP
    assert CSP_HEADER == CSP + "; frame-ancestors 'none'"  # a <meta> policy cannot refuse framing
    root = _parse(page)
    metas = {m.get("http-equiv"): m.get("content") for m in root.iter("meta") if m.get("http-equiv")}
    assert metas == {"Content-Security-Policy": CSP}
    # Nothing loads from elsewhere.
    for needle in ("src=", "href=", "@import", "url(", "<link", "<script"):
        assert needle not in page
    assert page.count("http") == page.count('xmlns="http://www.w3.org/2000/svg"') + page.count("http-equiv")


def test_each_chart_has_a_table_with_its_numbers() -> None:
    weeks = _weeks(6, developers=41)
    root = _parse(render_html(_stats(weeks), generated=WHEN))
    trend = _section(root, "trend")
    points = [c.findtext(f"{SVG}title") for c in trend.iter(f"{SVG}circle")]
    assert points == [f"{w.week}: 41 developers" for w in weeks]
    rows = _table_rows(trend)
    assert rows[0] == ["Week", "Developers", "Events"]
    assert rows[1:] == [[w.week, "41", "82"] for w in reversed(weeks)]  # newest first
    svg = trend.find(f".//{SVG}svg")
    assert svg is not None
    assert svg.get("role") == "img"
    labels = (svg.get("aria-labelledby") or "").split()
    assert [svg.find(f"{SVG}title").get("id"), svg.find(f"{SVG}desc").get("id")] == labels  # type: ignore[union-attr]
    versions = _section(root, "versions")
    segments = [r.findtext(f"{SVG}title") for r in versions.iter(f"{SVG}rect")]
    assert segments[:2] == [f"{weeks[0].week}, 5.2: 21 developers (51%)", f"{weeks[0].week}, 4.2: 20 developers (49%)"]
    assert len(segments) == 2 * len(weeks)
    rows = _table_rows(versions)
    assert rows[0] == ["Week", "5.2", "4.2"]
    assert rows[1] == [weeks[-1].week, "21 (51%)", "20 (49%)"]
    legend = [_text(li) for li in versions.iter("li")]
    assert legend == ["5.2", "4.2"]
    # The operator's page has the commands (counted in events); the public one does not.
    assert _table_rows(_section(root, "commands"))[1] == [weeks[-1].week, "82 (100%)"]


def test_public_page_says_what_it_hides_and_draws_no_false_zero() -> None:
    weeks = _weeks(5, developers=40)
    small = weeks[2]
    weeks[2] = Week(**{**small.__dict__, "developers": 4, "by_os": {"Linux": 4}})
    # Week 4: 5 of 40 developers counted under two Python versions: the Python breakdown is withheld.
    weeks[3] = Week(**{**weeks[3].__dict__, "by_python": {"CPython 3.12": 25, "CPython 3.11": 20}})
    doc = publish(_stats(weeks))
    page = render_html(doc, generated=WHEN)
    root = _parse(page)
    text = _text(root)
    assert "every number counts at least 10 developers" in text
    assert "developers in all" not in text  # the all-time count is not published
    trend = _section(root, "trend")
    points = [c.findtext(f"{SVG}title") for c in trend.iter(f"{SVG}circle")]
    assert f"{small.week}: 4 developers" not in points
    assert f"{small.week}: 0 developers" not in points  # a week not shown is a gap, not a zero
    assert len(points) == 4
    assert [row[0] for row in _table_rows(trend)[1:]] == [weeks[i].week for i in (4, 3, 1, 0)]
    python_rows = _table_rows(_section(root, "python"))
    withheld = next(row for row in python_rows if row[0] == weeks[3].week)
    assert withheld[1].startswith("not published this week")
    assert "commands-h" not in page  # by_event is never published
    assert "Commands are not published" in text


def test_full_page_says_it_is_not_for_publishing() -> None:
    text = _text(_parse(render_html(_stats(_weeks(2)), generated=WHEN)))
    assert "These are the full numbers, for the collector's operator: no threshold is applied." in text
    assert "999 developers in all" in text


def test_rare_values_share_one_other_series_in_chart_and_table() -> None:
    values = [f"1.{i}" for i in range(MAX_SERIES + 3)]
    root = _parse(render_html(_stats(_weeks(2, developers=10 * len(values), values=values)), generated=WHEN))
    versions = _section(root, "versions")
    header = _table_rows(versions)[0]
    assert header[-1] == OTHER
    assert len(header) == 1 + MAX_SERIES + 1
    assert [_text(li) for li in versions.iter("li")] == header[1:]


@pytest.mark.parametrize("app", ["Django", "MyTool"])
def test_empty_pages(app: str) -> None:
    empty = _stats([], app=app)
    assert "No events have been received yet." in render_html(empty, generated=WHEN)
    public = render_html(publish(_stats(_weeks(2, developers=3), app=app)), generated=WHEN)
    assert "No week has reached 10 developers yet." in _text(_parse(public))
    assert f"<h1>{app} developers per week</h1>" in public


def test_chart_keeps_two_years() -> None:
    weeks = _weeks(130, start="2024-W01")
    root = _parse(render_html(_stats(weeks), generated=WHEN))
    points = [c.findtext(f"{SVG}title") for c in _section(root, "trend").iter(f"{SVG}circle")]
    assert len(points) == 104
    assert points[-1] == f"{weeks[-1].week}: 40 developers"


@pytest.mark.parametrize(
    ("value", "top"), [(0, 4), (1, 4), (5, 8), (10, 12), (99, 100), (504, 600), (1001, 1200), (123_456, 160_000)]
)
def test_axis_top_is_four_round_steps(value: int, top: int) -> None:
    assert nice_max(value) == top
    assert top % 4 == 0


def test_a_breakdown_withheld_in_every_week_still_says_so() -> None:
    # 5 of 40 developers used two versions each week: the Django breakdown is withheld everywhere.
    weeks = [Week(**{**w.__dict__, "by_django": {"5.2": 25, "4.2": 20}}) for w in _weeks(3, developers=40)]
    root = _parse(render_html(publish(_stats(weeks)), generated=WHEN))
    versions = _section(root, "versions")
    assert "Not published for these weeks" in _text(versions)
    assert [row[1].startswith("not published this week") for row in _table_rows(versions)[1:]] == [True] * 3
