"""The public page in a real browser: headless Chromium (Debian's ``chromium``) loads ``GET /`` from a real
``django-spool collector serve`` process on loopback, serving releases that the real roll-up made (a SQLite
database rolled up at a chosen ``now``; ``--rollup-every 0`` so that the server adds none by its own clock), at
a small phone's width (360 px), a phone's (390 px), a tablet's (800 px) and a desktop's (1280 px), and takes a
screenshot of each (kept in the test's tmp dir).

At every width nothing may stick out sideways (the page never scrolls horizontally: only a table scrolls, in
its own region), every table's last column can be scrolled into view whole, no two week labels of a chart
overlap, and the stylesheet is allowed by the Content-Security-Policy (no violation is reported).

The browser is driven over the DevTools protocol on a pipe (``tests/support/cdp.py`` says why). One browser serves
the whole module; the tests take a few seconds. Without Chromium they skip, saying so; ``.ci/run``
installs it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from spool_reporter.collector import Publishing, Stats, Week, render_html
from spool_reporter.collector._common import Row
from spool_reporter.collector._public import document
from spool_reporter.collector._public_page import render_public
from spool_reporter.collector._svg import LABEL_Y

from support.cdp import Browser, Page, find_chromium
from support.collector_server import start_server
from support.events import DAY, row
from support.releases import HOSTILE, PAGE_NOW, PAGE_START, hostile_releases, population, released

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("close_released"),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it when missing)",
    ),
]

WIDTHS = (360, 390, 800, 1280)
TREND = (0x0C, 0x4B, 0x33)
PALETTE = [(0x4E, 0x79, 0xA7), (0xF2, 0x8E, 0x2B), (0xE1, 0x57, 0x59), (0x76, 0xB7, 0xB2), (0xA5, 0xA5, 0xA5)]
"""The trend line's colour, and the first series colours and "other" of the stacked charts (``_html.py``)."""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    started = Browser(CHROMIUM, tmp_path_factory.mktemp("chromium"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    tab = browser.new_page()
    try:
        yield tab
    finally:
        tab.close()


@contextlib.contextmanager
def serving(tmp_path: Path, env: dict[str, str], rows: list[Row], *extra: str, now: float = PAGE_NOW) -> Iterator[str]:
    """``collector serve --port 0`` as a real process over a database holding ``rows`` and the releases the real
    roll-up made at ``now`` (``--rollup-every 0``: the server makes none by its own clock); yields its base URL."""
    db = tmp_path / f"collector-{len(rows)}-{now:.0f}.sqlite3"
    released(db, rows, now=now).close()
    srv = start_server(db, env, tmp_path, "--rollup-every", "0", *extra)
    try:
        yield srv.url.removesuffix("/v1/batch")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(10)
        if srv.proc.stdout is not None:
            srv.proc.stdout.close()


@pytest.fixture
def served(tmp_path: Path, sandbox: object) -> Iterator[str]:
    """The base URL of a real ``collector serve`` over 3000 developers over October and November 2026, rolled
    up on 2026-12-04 (final weeks, provisional weeks and a month)."""
    with serving(tmp_path, sandbox.env, population()) as base:  # type: ignore[attr-defined]
        yield base


_LAYOUT_JS = (
    """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const width = document.documentElement.clientWidth;
  // Everything outside a table's scroll region must lie within the page's width.
  const outside = [...document.querySelectorAll('main *')]
    .filter(e => !e.closest('div.table'))
    .filter(e => { const r = e.getBoundingClientRect();
                   return r.width > 0 && (r.right > width + 0.5 || r.left < -0.5); })
    .map(e => e.tagName + ' ' + (e.className.baseVal || e.className || '') + ' ' + e.textContent.slice(0, 40));
  const tables = [...document.querySelectorAll('div.table')].map(d => {
    const edges = d.getBoundingClientRect();  // the body cells out of sight before any scrolling
    const hidden = [...d.querySelectorAll('tbody td, tbody th')]
      .filter(c => { const r = c.getBoundingClientRect();
                     return r.left < edges.left - 1 || r.right > edges.right + 1; })
      .map(c => c.textContent);
    d.scrollLeft = d.scrollWidth;  // as far right as a reader can scroll
    const region = d.getBoundingClientRect();
    const cells = d.querySelector('thead tr').cells;
    const last = cells[cells.length - 1].getBoundingClientRect();
    const result = { id: d.querySelector('caption').id, scrolls: d.scrollWidth > d.clientWidth + 1, hidden,
                     region: [region.left, region.right], lastColumn: [last.left, last.right],
                     rows: d.querySelector('table').rows.length, box: box(d) };
    d.scrollLeft = 0;
    return result;
  });
  const labels = [...document.querySelectorAll('svg.chart')].map(s => [...s.querySelectorAll('text')]
    .filter(t => t.getAttribute('y') === 'LABEL_Y' && getComputedStyle(t).display !== 'none')
    .map(t => { const r = t.getBoundingClientRect(); return [r.left, r.right]; }));
  return {
    width, outside, tables, labels,
    scrollWidth: document.documentElement.scrollWidth,
    charts: [...document.querySelectorAll('svg.chart')].map(s => ({
      id: s.id, box: box(s), circles: s.querySelectorAll('circle').length,
      bands: s.querySelectorAll('path.band').length, rects: s.querySelectorAll('rect').length,
      fontSize: parseFloat(getComputedStyle(s.querySelector('text')).fontSize) })),
    styleRules: document.styleSheets.length ? document.styleSheets[0].cssRules.length : 0,
    marginLeft: parseFloat(getComputedStyle(document.querySelector('svg.chart')).marginLeft),
    headline: (document.querySelector('p.headline') || {}).innerText,
    text: document.body.innerText,
    links: [...document.querySelectorAll('a')].map(a => a.getAttribute('href')),
    injected: document.querySelectorAll('script, img, iframe, object, embed, link, form').length,
  };
})()"""
).replace("LABEL_Y", str(LABEL_Y))


def _colours(png: bytes, box: list[float]) -> set[tuple[int, int, int]]:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top, width, height = (round(v) for v in box)
    return {rgb for _, rgb in image.crop((left, top, left + width, top + height)).getcolors(1 << 20) or []}


PHONE = 640
"""Up to this width (40rem) a table shows each row as a block, and no table scrolls sideways (``page.css``)."""


def _check_layout(found: dict[str, object], width: int) -> None:
    """Nothing sticks out sideways; each table's last column can be scrolled into view, and on a phone every cell
    is in sight without scrolling; labels do not overlap."""
    assert found["width"] == width
    assert found["scrollWidth"] <= width, found["outside"]  # the page itself never scrolls sideways
    assert found["outside"] == []
    for table in found["tables"]:  # type: ignore[attr-defined]
        left, right = table["region"]
        assert left >= 0, table
        assert right <= width, table
        first, last = table["lastColumn"]  # the last column, once scrolled to, is whole
        assert first >= left - 1, table
        assert last <= right + 1, table
        if width <= PHONE:
            assert not table["scrolls"], table
            assert table["hidden"] == [], table
    for labels in found["labels"]:  # type: ignore[attr-defined]
        spans = sorted(labels)
        assert len(spans) >= 2
        for (_, right), (left, _) in itertools.pairwise(spans):
            assert right <= left, spans


def test_the_served_page_at_phone_tablet_and_desktop_width(served: str, page: Page, tmp_path: Path) -> None:
    base = served
    doc = json.loads(served_get(base + "/v1/stats"))
    latest = doc["weeks"][-1]
    for width in WIDTHS:
        page.viewport(width, 900)
        page.load(base + "/")
        found = page.evaluate(_LAYOUT_JS)
        assert page.problems() == [], page.problems()  # no console error, no CSP violation
        assert found["styleRules"] > 20  # the stylesheet was allowed (by its hash) ...
        assert found["marginLeft"] > 0  # ... and applied
        assert found["injected"] == 0
        _check_layout(found, width)
        number = latest["developers"]
        assert found["headline"] == (
            f"About {number['estimate']:,} developers (95\u00a0%: {number['low']:,}\u2013{number['high']:,}) "
            "in 2026-W48, provisional."
        )
        assert "fewer than 37" in found["text"]
        assert "Released 2026-12-04 12:00 UTC" in found["text"]
        assert found["links"][:3] == [
            "v1/releases.json",
            "v1/releases.csv",
            "https://spdx.org/licenses/CC-BY-4.0.html",
        ]
        charts = {c["id"]: c for c in found["charts"]}
        assert list(charts) == ["trend", "versions", "python", "os"]
        assert [t["id"] for t in found["tables"]] == [
            "trend-table-c",
            "versions-table-c",
            "python-table-c",
            "os-table-c",
            "periods-table-c",
        ]
        for chart, table in zip(charts.values(), found["tables"], strict=False):
            left, top, w, h = chart["box"]
            assert 250 < w < width, chart
            assert h == 272, chart
            assert chart["fontSize"] >= 12  # the labels keep their size at a phone's width
            t_left, t_top, t_width, _ = table["box"]
            assert t_width > 250
            if width < 832:  # 52rem: the table under its chart
                assert t_top >= top + h
            else:  # a desktop: the table beside its chart, at the same height
                assert t_left >= left + w
                assert abs(t_top - top) < 100
        assert charts["trend"]["circles"] == 9  # nine weeks released, each above the threshold
        assert charts["trend"]["bands"] == 1
        # Three versions of ~110 developers a week, drawn named unless the noise takes one under the cells'
        # threshold (77) that week, and the fold of the rest: at least two bars a week whatever the noise.
        assert charts["versions"]["rects"] >= 9 * 2
        assert found["tables"][0]["rows"] == 1 + 9  # the trend's table: a header and the released weeks
        png = page.screenshot()
        (tmp_path / f"page-{width}.png").write_bytes(png)
        image = Image.open(io.BytesIO(png))
        assert image.format == "PNG"
        assert image.size[0] == width
        assert image.size[1] > 1500  # the whole page, beyond the viewport
        assert len(image.convert("RGB").getcolors(1 << 20) or []) > 50  # not blank
        assert TREND in _colours(png, charts["trend"]["box"])  # the line was drawn where the chart is
        assert len(set(PALETTE) & _colours(png, charts["versions"]["box"])) >= 3  # and the shares


def served_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=20) as response:  # a loopback http URL of the test
        assert response.status == 200
        body: bytes = response.read()
        return body


def test_nothing_released_in_the_browser(page: Page, tmp_path: Path) -> None:
    store = released(tmp_path / "c.sqlite3", [], now=PAGE_START)  # 2026-W40 has not ended
    path = tmp_path / "empty.html"
    path.write_text(render_public(document(store.releases("Django"), Publishing())), encoding="utf-8")
    page.viewport(390, 900)
    page.load(path.as_uri())
    found = page.evaluate(
        "({ text: document.body.innerText, width: document.documentElement.scrollWidth,"
        " charts: document.querySelectorAll('svg').length })"
    )
    assert page.problems() == []
    assert "Nothing released yet: a week's numbers are released once it has ended" in found["text"]
    assert " 0 developers" not in found["text"]
    assert found["charts"] == 0
    assert found["width"] <= 390


def test_hostile_values_stay_inert_in_the_browser(page: Page, tmp_path: Path) -> None:
    store = released(tmp_path / "c.sqlite3", population(900))
    public_page = render_public(
        document(hostile_releases(store), Publishing(app="W" * 120 + HOSTILE[0], licence=HOSTILE[1]))
    )
    weeks = [
        Week(
            week=f"2026-W{num}",
            developers=60,
            events=60,
            by_django=dict.fromkeys(HOSTILE, 10),
            by_python={HOSTILE[0]: 60},
            by_os={HOSTILE[1]: 30, HOSTILE[2]: 30},
            by_event={HOSTILE[3]: 60},
        )
        for num in (47, 48, 49)
    ]
    operator_page = render_html(Stats(app=HOSTILE[4], developers=60, events=180, weeks=weeks))
    for name, html in (("public", public_page), ("operator", operator_page)):
        path = tmp_path / f"{name}.html"
        path.write_text(html, encoding="utf-8")
        page.viewport(390, 900)
        page.load(path.as_uri())
        found = page.evaluate(_LAYOUT_JS)
        assert page.problems() == []  # an injected script or element would at least be a CSP violation
        assert found["injected"] == 0
        for value in HOSTILE[:3]:
            assert value in found["text"]
        assert found["scrollWidth"] <= 390, found["outside"]  # a long value wraps instead of widening the page


def test_problems_are_seen(page: Page) -> None:
    # The checks above mean something only if CSP violations and console errors are reported at all.
    page.load(
        'data:text/html,<meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        "<p style='color: red'>x</p>"
    )
    assert any("Content Security Policy" in p for p in page.problems()), page.problems()
    page.load("data:text/html,<script>console.error('boom')</script>")
    assert any("console.error" in p and "boom" in p for p in page.problems()), page.problems()


# -- a phone: every column in sight; what the page says when numbers are few, or none are released -----------

_COLUMNS_JS = """(() => ({
  width: document.documentElement.clientWidth,
  scrollWidth: document.documentElement.scrollWidth,
  tables: [...document.querySelectorAll('div.table')].map(d => {
    const region = d.getBoundingClientRect();
    return {
      id: d.querySelector('caption').id, scrolls: d.scrollWidth > d.clientWidth + 1,
      region: [region.left, region.right],
      head: [...d.querySelectorAll('thead th')].map(th => th.textContent),
      rows: [...d.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(c => {
        const r = c.getBoundingClientRect();
        return { text: c.textContent, label: getComputedStyle(c, '::before').content, box: [r.left, r.right] };
      })),
    };
  }),
}))()"""

WIDE_VERSIONS = ("3.0", "3.1", "3.2", "4.0", "4.1", "4.2", "5.0", "5.1", "5.2", "6.0", "0.96")
"""Ten Django versions of the released list and one that is not ("other"), each used by some 180 developers a
week: nine named columns, "other" and the folded values, the widest table a week's release can make."""


def test_every_column_of_the_widest_table_is_in_sight_on_a_phone(page: Page, tmp_path: Path, sandbox: object) -> None:
    rows = [row(c, PAGE_START + (c % 14) * DAY, version=WIDE_VERSIONS[c % len(WIDE_VERSIONS)]) for c in range(4000)]
    with serving(tmp_path, sandbox.env, rows) as base:  # type: ignore[attr-defined]
        for width in (360, 390):
            page.viewport(width, 900)
            page.load(base + "/")
            found = page.evaluate(_COLUMNS_JS)
            assert page.problems() == [], page.problems()
            assert found["width"] == width
            assert found["scrollWidth"] <= width  # the page never scrolls sideways
            tables = {t["id"]: t for t in found["tables"]}
            versions = tables["versions-table-c"]
            assert len(versions["head"]) == 1 + 9 + 1 + 1, versions["head"]  # the week, 9 named, other, the fold
            assert versions["head"][-2] == "other"
            # At least one named value more than there are colours: noise may name a value nobody used, too.
            assert versions["head"][-1].startswith("fewer than 77 each, and "), versions["head"]
            for table in found["tables"]:
                left, right = table["region"]
                assert not table["scrolls"], (width, table["id"])  # nothing to scroll to: every cell is in sight
                for cells in table["rows"]:
                    for cell in cells:
                        cell_left, cell_right = cell["box"]
                        assert left - 1 <= cell_left < cell_right <= right + 1, (width, table["id"], cell)
                        assert cell_right <= width
            # Each cell of a full row stands under its column's name (the header row is for screen readers).
            full = [cells for cells in versions["rows"] if len(cells) == len(versions["head"])]
            assert len(full) >= 2  # the weeks with shares (the later, empty weeks say "fewer than 37 developers")
            for cells in full:
                assert [c["label"] for c in cells[1:]] == [json.dumps(h) for h in versions["head"][1:]]
            other = full[0][-2]
            assert other["label"] == '"other"'
            assert other["text"][:1].isdigit() or other["text"].startswith("fewer than"), other


def _page_text(page: Page, url: str) -> str:
    page.viewport(390, 900)
    page.load(url)
    assert page.problems() == [], page.problems()
    found = page.evaluate("({ text: document.body.innerText, width: document.documentElement.scrollWidth })")
    assert found["width"] <= 390
    return " ".join(str(found["text"]).split())


def test_few_developers_say_fewer_than_n_and_when_the_page_changes(page: Page, tmp_path: Path, sandbox: object) -> None:
    # Five developers a week, shown from 200 on: the noise (scale 12) would take a week's total of five to the
    # margin (37) in about one week in thirty, to 200 practically never, so every week says "fewer than 200".
    rows = [row(c, PAGE_START + (c % 60) * DAY) for c in range(45)]
    with serving(tmp_path, sandbox.env, rows, "--min-count", "200") as base:  # type: ignore[attr-defined]
        doc = json.loads(served_get(base + "/v1/stats"))
        assert {w["developers"].get("fewer_than") for w in doc["weeks"]} == {200}
        with urllib.request.urlopen(base + "/", timeout=20) as response:  # a loopback http URL of the test
            assert response.headers["Cache-Control"] == "no-store"  # every reload asks: the page says when it changes
        text = _page_text(page, base + "/")
    assert "Fewer than 200 developers in 2026-W48, provisional." in text
    assert "Nothing released" not in text
    assert re.search(r"(?<!than )\b\d+ developers\b", text) is None  # no count of developers, 0 included
    assert (
        "Released 2026-12-04 12:00 UTC (the newest release). This page shows stored releases, not live counts: it "
        "changes only when a release is made, and shows a new one within 10 seconds." in text
    )
    assert "Next: the provisional release of 2026-W49, once that week has ended: from Monday 2026-12-07" in text


def test_nothing_released_says_when_the_first_release_is_due(page: Page, tmp_path: Path, sandbox: object) -> None:
    # Developers below any threshold, in a week that has not ended: nothing is released, and the page says
    # nothing about them -- neither "0" nor "fewer than N", which would be a statement about the data.
    rows = [row(c, PAGE_START) for c in range(3)]
    with serving(tmp_path, sandbox.env, rows, now=PAGE_START) as base:  # type: ignore[attr-defined]
        doc = json.loads(served_get(base + "/v1/stats"))
        assert (doc["made"], doc["first_week"], doc["weeks"]) == (None, "2026-W40", [])
        text = _page_text(page, base + "/")
    assert "Nothing released yet: a week's numbers are released once it has ended" in text
    assert (
        "First: the provisional release of 2026-W40, the first week released, once it has ended: from Monday "
        "2026-10-05 00:00 UTC, within the collector's roll-up interval (an hour by default). Until then nothing is "
        "published about how many developers there are, nor whether there are any." in text
    )
    assert re.search(r"\b\d+ developers\b", text) is None
    assert "fewer than" not in text.split("How these numbers are made")[0].lower()
