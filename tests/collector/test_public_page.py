"""The public page (``collector/_public_page.py``'s :func:`render_public`, with ``_html.py`` and ``_svg.py``),
parsed: made from releases that the real roll-up made (a SQLite store, :func:`rollup` at a chosen ``now``), it
shows each released number with its interval, "fewer than N" for the numbers below the display threshold and
never their estimate, an honest sentence when nothing is released, the downloads and the licence; hostile values
stay text; the same releases give the same bytes in any process. The operator's page (:func:`render_html`) is
checked at the end; ``test_public_browser.py`` loads both in a real browser.

The noise is real, so the tests compare the page with the document it was made from (``public(store)``),
not with the true counts, except where the settings make the outcome certain (a display threshold of a
million: every number is "fewer than").
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spool_reporter.collector import Publishing, Stats, Week, public, render_html
from spool_reporter.collector._html import CSP, CSP_HEADER, MAX_SERIES
from spool_reporter.collector._public import document
from spool_reporter.collector._public_page import render_public
from spool_reporter.collector._rollup import rollup
from spool_reporter.collector._store import Store
from spool_reporter.collector._svg import nice_max

from support.events import DAY
from support.releases import HOSTILE, OPENED, PAGE_NOW, PAGE_START, SECTIONS, hostile_releases, population, released

pytestmark = pytest.mark.usefixtures("close_released")


SVG = "{http://www.w3.org/2000/svg}"
UTC = datetime.timezone.utc
WHEN = datetime.datetime(2026, 12, 7, 9, 30, tzinfo=UTC)
DASH = "\u2013"


# Every element the pages may contain: anything else (script, img, iframe, link, object, ...) is an injection.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "p", "ul", "li", "strong", "section",
    "div", "figure", "table", "caption", "thead", "tbody", "tr", "th", "td", "span", "bdi", "code", "footer",
    "a", "sup",
    f"{SVG}svg", f"{SVG}title", f"{SVG}desc", f"{SVG}line", f"{SVG}text", f"{SVG}circle", f"{SVG}rect",
    f"{SVG}path",
}  # fmt: skip
LINK = re.compile(r"(https://spdx\.org/licenses/[A-Za-z0-9.+-]+\.html|https?://[^\s\"'<>\\`]+|v1/[a-z.]+)\Z")
"""The links the public page may hold: the licence (SPDX's page, or the operator's URL) and its own routes."""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """3000 developers over October and November 2026, released at :data:`PAGE_NOW` with the default settings."""
    made = released(tmp_path_factory.mktemp("public") / "c.sqlite3", population())
    OPENED.remove(made)  # the module's: closed when the module is done
    yield made
    made.close()


@pytest.fixture(scope="module")
def doc(store: Store) -> dict[str, object]:
    return public(store)


@pytest.fixture(scope="module")
def page(doc: dict[str, object]) -> str:
    return render_public(doc)


def _parse(page: str) -> ET.Element:
    assert page.startswith("<!DOCTYPE html>\n")
    root = ET.fromstring(page)  # well-formed XML as well as HTML5
    for element in root.iter():
        assert element.tag in ALLOWED_TAGS, element.tag
        for name, value in element.attrib.items():
            assert not name.lower().startswith("on"), name
            assert name not in ("style", "src", "srcdoc", "action", "formaction"), name
            if name == "href":
                assert element.tag == "a"
                assert LINK.match(value), value
    return root


def _text(element: ET.Element) -> str:
    return " ".join("".join(element.itertext()).split())


def _section(root: ET.Element, ident: str) -> ET.Element:
    for section in root.iter("section"):
        if section.get("aria-labelledby") == f"{ident}-h":
            return section
    raise AssertionError(f"no section {ident}")


def _rows(section: ET.Element) -> list[list[str]]:
    table = section.find(".//table")
    assert table is not None
    return [[_text(cell) for cell in tr] for tr in table.iter("tr")]


def _weeks(doc: dict[str, object], key: str = "weeks") -> list[dict[str, Any]]:
    """The document's list of weeks (or of months, ...), typed for reading."""
    periods: list[dict[str, Any]] = doc[key]  # type: ignore[assignment]
    return periods


def _shown(number: dict[str, int]) -> str:
    """What a table cell must say for ``number``."""
    if "fewer_than" in number:
        return f"fewer than {number['fewer_than']:,}"
    return f"{number['estimate']:,} ({number['low']:,}{DASH}{number['high']:,})"


# -- the headline, the schedule, the trend --------------------------------------------------------------------


def test_the_headline_is_the_latest_week_with_its_interval(doc: dict[str, object], page: str) -> None:
    latest = _weeks(doc)[-1]
    assert latest["week"] == "2026-W48"
    assert latest["release"] == "provisional"
    number = latest["developers"]
    assert "fewer_than" not in number  # about 350 developers, the noise a few dozen
    headline = next(p for p in _parse(page).iter("p") if p.get("class") == "headline")
    assert _text(headline) == (
        f"About {number['estimate']:,} developers (95 %: {number['low']:,}{DASH}{number['high']:,}) "
        "in 2026-W48, provisional."
    )


def test_when_released_and_when_the_next_releases_are_due(page: str) -> None:
    text = _text(_parse(page))
    assert "Released 2026-12-04 12:00 UTC" in text
    # The next week ends on Sunday 2026-12-06: its provisional release is due from Monday, within the roll-up
    # interval; the oldest provisional week (2026-W45, ended 2026-11-08) closes 30 days after it ended.
    assert "the provisional release of 2026-W49, once that week has ended: from Monday 2026-12-07 00:00 UTC" in text
    assert "within the collector's roll-up interval" in text
    assert "The final release of 2026-W45 follows when that week closes" in text
    assert "from 2026-12-09 00:00 UTC" in text


@pytest.mark.parametrize(
    ("made", "shown"),
    [
        pytest.param("2026-12-04T12:00:59Z", "Released 2026-12-04 12:00 UTC", id="a-time"),
        pytest.param("2026-12-4T12:00:00Z", "Released 2026-12-4T12:00:00Z", id="unpadded-day"),
        pytest.param("2026-12-04T1:00:00Z", "Released 2026-12-04T1:00:00Z", id="unpadded-hour"),
        pytest.param("2026-02-30T12:00:00Z", "Released 2026-02-30T12:00:00Z", id="no-such-day"),
    ],
)
def test_the_release_time_is_shown_only_in_exactly_the_form_released(
    doc: dict[str, object], made: str, shown: str
) -> None:
    # parse_time, the one time parser, decides what is a time; anything else is shown as it is, never reformatted.
    assert shown in _text(_parse(render_public({**doc, "made": made})))


def test_the_trend_shows_every_week_with_its_interval(doc: dict[str, object], page: str) -> None:
    trend = _section(_parse(page), "trend")
    weeks = _weeks(doc)
    assert [w["week"] for w in weeks] == [f"2026-W{n}" for n in range(40, 49)]
    points = [c.findtext(f"{SVG}title") for c in trend.iter(f"{SVG}circle")]
    expected = [
        f"{w['week']}: about {n['estimate']:,} developers (95 %: {n['low']:,}{DASH}{n['high']:,})"
        for w in weeks
        for n in [w["developers"]]
    ]
    assert points == expected
    bands = list(trend.iter(f"{SVG}path"))
    assert len(bands) == 1  # nine weeks in a row: one band
    assert bands[0].get("class") == "band"
    rows = _rows(trend)
    assert rows[0] == ["Week", "Developers", "95 % interval", "Release", "ε spent"]
    assert rows[1:] == [
        [w["week"], f"{n['estimate']:,}", f"{n['low']:,}{DASH}{n['high']:,}", w["release"], f"{w['week_epsilon']:.3g}"]
        for w in reversed(weeks)
        for n in [w["developers"]]
    ]  # newest first
    assert [r[3] for r in rows[1:]] == ["provisional"] * 4 + ["final"] * 5


def test_months_quarters_and_years(doc: dict[str, object], page: str) -> None:
    (month,) = _weeks(doc, "months")
    assert month["month"] == "2026-10"
    rows = _rows(_section(_parse(page), "periods"))
    assert rows[0] == ["Period", "Unit", "Distinct developers", "95 % interval", "ε", "Released"]
    n = month["developers"]
    assert rows[1] == ["2026-10", "month", f"{n['estimate']:,}", f"{n['low']:,}{DASH}{n['high']:,}", "1", "2026-12-04"]


def test_a_gap_in_the_weeks_is_a_gap_not_a_zero(tmp_path: Path) -> None:
    # No event in 2026-W43: its release says "fewer than N" (a noisy zero), never a point at 0 nor "0 developers".
    rows = [r for r in population(2000) if r[10][:10] not in {f"2026-10-{d}" for d in range(19, 26)}]
    doc = public(released(tmp_path / "c.sqlite3", rows, publishing=Publishing(epsilon=10)))
    page = render_public(doc)
    root = _parse(page)
    w43 = next(w for w in _weeks(doc) if w["week"] == "2026-W43")
    assert w43["developers"]["fewer_than"] == 10
    trend = _section(root, "trend")
    points = [c.findtext(f"{SVG}title") or "" for c in trend.iter(f"{SVG}circle")]
    assert len(points) == 8
    assert not any(p.startswith("2026-W43") for p in points)
    outline = [r.findtext(f"{SVG}title") for r in trend.iter(f"{SVG}rect")]
    assert outline == ["2026-W43: fewer than 10 developers"]
    assert len(list(trend.iter(f"{SVG}path"))) == 2  # the band breaks around it
    assert ["2026-W43", "fewer than 10", "final", "5"] in _rows(trend)  # closed before its provisional release
    assert re.search(r"\b0 developers", _text(root)) is None


# -- "fewer than N" ------------------------------------------------------------------------------------------


def test_cells_below_the_threshold_say_fewer_than_and_nothing_else(doc: dict[str, object], page: str) -> None:
    root = _parse(page)
    weeks = {w["week"]: w for w in _weeks(doc)}
    folded = 0
    for name, ident in SECTIONS.items():
        section = _section(root, ident)
        head, *rows = _rows(section)
        values = head[1:-1]
        # The cells' own threshold (family-wise: 77 for 58 cells at scale 12), not the total's margin (37).
        assert {w["cell_threshold"] for w in weeks.values()} == {77}
        assert head[-1].startswith("fewer than 77 each")
        for cells in rows:
            week = weeks[cells[0]]
            numbers: dict[str, dict[str, int]] = week[name]
            for value, cell in zip(values, cells[1:-1], strict=True):
                assert cell == _shown(numbers[value]), (week["week"], value)
            folded += sum("fewer_than" in n for n in numbers.values())
        # A value is a series (a legend entry, a column) only if some week shows it; the rest are folded.
        shown = {v for w in weeks.values() for v, n in w[name].items() if "fewer_than" not in n}
        assert set(values) <= shown
        if len(shown) <= MAX_SERIES:
            assert set(values) == shown
        legend = [_text(li) for li in section.iter("li")]
        assert legend == [*values, head[-1].removesuffix(": share")]
        # No segment of the chart stands for a number below the threshold: each says whose number it is.
        for rect in section.iter(f"{SVG}rect"):
            title = rect.findtext(f"{SVG}title") or ""
            week_name, _, rest = title.partition(", ")
            label, _, said = rest.partition(": ")
            if label.startswith("fewer than"):
                assert re.fullmatch(r"\d+% together", said), said
                continue
            number = weeks[week_name][name][label]
            assert "fewer_than" not in number
            assert said.startswith(f"about {number['estimate']:,} developers (")
    assert folded > 100  # the fixed vocabularies hold many values nobody used


def test_every_number_below_a_high_threshold_is_hidden(tmp_path: Path) -> None:
    # A display threshold of a million: every released number is "fewer than 1,000,000", whatever the noise.
    store = released(tmp_path / "c.sqlite3", population(600), publishing=Publishing(min_count=10**6))
    doc = public(store, publishing=Publishing(min_count=10**6))
    page = render_public(doc)
    root = _parse(page)
    text = _text(root)
    assert "Fewer than 1,000,000 developers in 2026-W48, provisional." in text
    assert "About" not in text
    trend = _section(root, "trend")
    assert list(trend.iter(f"{SVG}circle")) == []
    assert list(trend.iter(f"{SVG}path")) == []
    for cells in _rows(trend)[1:]:
        assert cells[1] == "fewer than 1,000,000"
    for ident in SECTIONS.values():
        section = _section(root, ident)
        assert list(section.iter(f"{SVG}rect")) == []
        assert "No week has enough developers released to show shares." in _text(section)
        assert {row[1] for row in _rows(section)[1:]} == {"fewer than 1,000,000 developers this week: no shares"}
    (month,) = _rows(_section(root, "periods"))[1:]
    assert month[2] == "fewer than 1,000,000"
    # No table cell holds a number but the threshold, ε and dates.
    for table in root.iter("table"):
        for td in table.iter("td"):
            assert re.fullmatch(
                r"fewer than 1,000,000( developers this week: no shares)?|provisional|final|month|"
                r"0\.5|1|2026-12-04",
                _text(td),
            ), _text(td)


# -- nothing released ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("app", ["Django", "MyTool"])
def test_nothing_released_says_so(tmp_path: Path, app: str) -> None:
    store = released(tmp_path / "c.sqlite3", [], now=PAGE_START)  # 2026-W40 has not ended
    doc = public(store, publishing=Publishing(app=app))
    assert doc["made"] is None
    page = render_public(doc)
    root = _parse(page)
    text = _text(root)
    assert "Nothing released yet: a week's numbers are released once it has ended" in text
    assert (
        "First: the provisional release of 2026-W40, the first week released, once it has ended: from Monday " in text
    )
    assert re.search(r"\b0 developers", text) is None
    assert "About" not in text
    assert f"<h1><bdi>{app}</bdi> developers per week</h1>" in page
    assert "None released yet" in _text(_section(root, "periods"))
    assert not [s for s in root.iter("section") if s.get("aria-labelledby") in ("trend-h", "versions-h")]
    _section(root, "method")
    _section(root, "data")


# -- the method, the downloads, the licence ------------------------------------------------------------------


def test_how_these_numbers_are_made(page: str) -> None:
    method = _text(_section(_parse(page), "method"))
    for words in (
        "Differential privacy.",
        "discrete Laplace mechanism of the OpenDP library",
        "ε = 1 per developer for each week, and again for each month, quarter and year",
        "changes in probability by at most a factor eε ≈ 2.7, whether or not you took part that week, and "
        "whichever versions you used",
        "counts once in the total and once in each breakdown, under the newest version they used that week",
        "For 2026-W48 that margin is ±37",
        "shown only as “fewer than N”, neither its estimate nor its interval",
        "with 50 % of its ε",
        "Each release is made once and stored",
        "late events, a developer's request to forget their id, and the deletion of old events never change a "
        "release already made",
        "It stores no IP address, and of each event only the day, not the time.",
    ):
        assert words in method


def test_downloads_and_licence_are_links(page: str) -> None:
    root = _parse(page)
    links = [(a.get("href"), _text(a)) for a in root.iter("a")]
    assert links == [
        # Near the top, under the headline ...
        # Relative to the page, so that they work under a proxy's prefix too.
        ("v1/releases.json", "JSON"),
        ("v1/releases.csv", "CSV"),
        ("https://spdx.org/licenses/CC-BY-4.0.html", "CC-BY-4.0"),
        # ... and at the end, with what they hold.
        ("v1/releases.json", "releases.json"),
        ("v1/releases.csv", "releases.csv"),
        ("v1/stats", "/v1/stats"),
        ("https://spdx.org/licenses/CC-BY-4.0.html", "CC-BY-4.0"),
    ]
    assert [a.get("rel") for a in root.iter("a") if "spdx" in (a.get("href") or "")] == ["license", "license"]
    data = _text(_section(root, "data"))
    assert "the raw noisy counts (which can be below zero)" in data
    assert "The released numbers are licensed under CC-BY-4.0." in data


@pytest.mark.parametrize(
    ("licence", "href"),
    [
        pytest.param("CC0-1.0", "https://spdx.org/licenses/CC0-1.0.html", id="spdx"),
        pytest.param("https://example.org/terms", "https://example.org/terms", id="url"),
        pytest.param("CC-BY-4.0 OR ODbL-1.0", None, id="expression-is-text"),
        pytest.param("javascript:alert(1)", None, id="script-is-text"),
        pytest.param('https://example.org/"><script>', None, id="broken-url-is-text"),
    ],
)
def test_licence(doc: dict[str, object], licence: str, href: str | None) -> None:
    page = render_public({**doc, "licence": licence})
    root = _parse(page)
    licensed = [a for a in root.iter("a") if a.get("rel") == "license"]
    if href is None:
        assert licensed == []
        assert licence in _text(root)
    else:
        assert {a.get("href") for a in licensed} == {href}
        assert {_text(a) for a in licensed} == {licence}


# -- escaping, well-formedness, the policy --------------------------------------------------------------------


def test_hostile_values_stay_text_everywhere(store: Store) -> None:
    doc = document(hostile_releases(store), Publishing(app=HOSTILE[3], licence=HOSTILE[4]))
    page = render_public(doc)
    root = _parse(page)
    text = _text(root)
    for value in HOSTILE:
        assert value in text  # shown, as text
    assert "<script" not in page
    assert "<img" not in page
    assert "<iframe" not in page
    assert page.count("<style>") == page.count("</style>") == 1
    # Each is isolated in its own <bdi> (a right-to-left name cannot reorder the text around it).
    isolated = {_text(b) for b in root.iter("bdi")}
    assert {HOSTILE[0], HOSTILE[3], HOSTILE[4], HOSTILE[5]} <= isolated


def test_control_characters_and_lone_surrogates_become_replacement_characters(doc: dict[str, object]) -> None:
    page = render_public({**doc, "app": "5.2\x00\x1b[31m", "licence": "\ud800x"})
    page.encode("utf-8")  # would raise on a lone surrogate
    text = _text(_parse(page))
    assert "5.2\ufffd\ufffd[31m" in text
    assert "\ufffdx" in text


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.text(max_size=30), min_size=1, max_size=12, unique=True),
    app=st.text(min_size=1, max_size=20),
    licence=st.text(max_size=40),
    numbers=st.lists(st.integers(-200, 5000), min_size=12, max_size=12),
    day=st.one_of(st.just("9999-12-31"), st.just("0001-01-01"), st.text(max_size=12)),
)
def test_any_text_gives_a_well_formed_page(
    store: Store, values: list[str], app: str, licence: str, numbers: list[int], day: str
) -> None:
    releases = store.releases("Django")
    changed = []
    for release in releases:
        body = json.loads(release.body)
        if body["unit"] == "week":
            body["developers"] = numbers[0]
            body["by_os"] = dict(zip(values, numbers[1:], strict=False))
        body["last_day"] = body["made"] = day
        changed.append(release._replace(body=json.dumps(body)))
    page = render_public(document(changed, Publishing(app=app, licence=licence, min_count=1)))
    page.encode("utf-8")
    _parse(page)
    # Before the first release the page names the first week released, as the database holds it.
    for first_week in (day, "9999-W52", "0001-W01", f"2026-W{day[:2]}"):
        _parse(render_public(document([], Publishing(app=app), first_week=first_week)))


def test_the_policy_allows_exactly_the_page_stylesheet(page: str) -> None:
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"default-src 'none'; style-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'" == CSP
    assert CSP_HEADER == CSP + "; frame-ancestors 'none'"  # a <meta> policy cannot refuse framing
    root = _parse(page)
    metas = {m.get("http-equiv"): m.get("content") for m in root.iter("meta") if m.get("http-equiv")}
    assert metas == {"Content-Security-Policy": CSP}
    # Nothing loads from elsewhere: the only URLs are links a reader may follow.
    for needle in ("src=", "@import", "url(", "<link", "<script"):
        assert needle not in page


# -- the same releases, the same bytes -----------------------------------------------------------------------


def test_the_same_releases_give_the_same_bytes_in_any_process(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    released(db, population(900)).close()
    here = render_public(public(str(db)))
    assert render_public(public(str(db))) == here
    code = (
        "import sys; from spool_reporter.collector import public; "
        "from spool_reporter.collector._public_page import render_public; "
        "sys.stdout.buffer.write(render_public(public(sys.argv[1])).encode())"
    )
    for seed in ("1", "2"):  # other hash seeds: no set order, no clock, no process state shows
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": "Pacific/Kiritimati"}
        done = subprocess.run(
            [sys.executable, "-c", code, str(db)], env=env, capture_output=True, timeout=60, check=True
        )
        assert done.stdout.decode() == here


def test_a_new_release_changes_the_page(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    store = released(db, population(900))
    before = render_public(public(store))
    rollup(store, now=PAGE_NOW + 7 * DAY)  # 2026-W49 has ended: its provisional release is made
    after = render_public(public(store))
    assert before != after
    assert "in 2026-W49, provisional." in _text(_parse(after))


# -- the operator's page (collector stats --html): the full numbers -------------------------------------------


def _week_rows(n: int, *, start: str = "2026-W01", developers: int = 40, values: list[str] | None = None) -> list[Week]:
    year, num = (int(p) for p in start.split("-W"))
    monday = datetime.date.fromisocalendar(year, num, 1)
    names = values or ["5.2", "4.2"]
    out = []
    for i in range(n):
        y, w, _ = (monday + datetime.timedelta(weeks=i)).isocalendar()
        share = developers // len(names)
        cells = dict.fromkeys(names, share)
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


def test_operator_page_escapes_hostile_values() -> None:
    weeks = [
        Week(**{**w.__dict__, "by_python": dict.fromkeys(HOSTILE, 10), "by_os": {HOSTILE[1]: 60}})
        for w in _week_rows(3, developers=60, values=HOSTILE)
    ]
    page = render_html(_stats(weeks, app=HOSTILE[3]), generated=WHEN)
    text = _text(_parse(page))
    for value in HOSTILE:
        assert value in text
    assert "<script" not in page
    assert "<iframe" not in page
    assert "href=" not in page  # the operator's page links nowhere


def test_operator_page_says_it_is_not_for_publishing() -> None:
    root = _parse(render_html(_stats(_week_rows(6, developers=41)), generated=WHEN))
    text = _text(root)
    assert "These are the full numbers, for the collector's operator: exact counts, with no noise" in text
    assert "999 developers in all" in text
    trend = _section(root, "trend")
    assert [c.findtext(f"{SVG}title") for c in trend.iter(f"{SVG}circle")][-1] == "2026-W06: 41 developers"
    assert _rows(trend)[1] == ["2026-W06", "41", "82"]
    versions = _section(root, "versions")
    assert _rows(versions)[1] == ["2026-W06", "21 (51%)", "20 (49%)"]
    assert _rows(_section(root, "commands"))[1] == ["2026-W06", "82 (100%)"]
    assert "Generated 2026-12-07 09:30 UTC" in text


def test_operator_page_folds_rare_values_into_other() -> None:
    values = [f"1.{i}" for i in range(MAX_SERIES + 3)]
    root = _parse(render_html(_stats(_week_rows(2, developers=10 * len(values), values=values)), generated=WHEN))
    versions = _section(root, "versions")
    header = _rows(versions)[0]
    assert header[-1] == "other"
    assert len(header) == 1 + MAX_SERIES + 1
    assert [_text(li) for li in versions.iter("li")] == header[1:]


def test_operator_chart_keeps_two_years() -> None:
    weeks = _week_rows(130, start="2024-W01")
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
