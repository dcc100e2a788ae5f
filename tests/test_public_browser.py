"""The public page in a real browser: headless Chromium (Debian's ``chromium``) loads ``GET /`` from a real
``django-spool collector serve`` process on loopback, filled through its real ingest endpoint, at a phone's
width (390 px) and a desktop's (1280 px), and takes a screenshot of each (kept in the test's tmp dir).

The browser is driven over the DevTools protocol on a pipe (``tests/cdp.py`` says why). One browser serves
the whole module; the tests take a few seconds. Without Chromium they skip, saying so; ``.ci/run``
installs it.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdp import Browser, Page, find_chromium
from PIL import Image
from test_cli import spool_command
from test_collector import batch, event, post
from test_collector_processes import Served, _read_line
from test_public_page import HOSTILE
from test_public_routes import recent_week_times

from spool_reporter.collector import Stats, Week, publish, render_html

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it when missing)",
    ),
]

WIDTHS = (390, 1280)
TREND = (0x0C, 0x4B, 0x33)
PALETTE = [(0x4E, 0x79, 0xA7), (0xF2, 0x8E, 0x2B), (0xE1, 0x57, 0x59), (0x76, 0xB7, 0xB2), (0xA5, 0xA5, 0xA5)]
"""The trend line's colour, and the first series colours and "other" of the stacked charts (``_report.py``)."""


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


def _population(times: list[str]) -> list[dict[str, object]]:
    """Developers per week growing from 40 to 95, on a mix of versions; every fourth one also ran Django 6.0
    that week (in the first weeks fewer than 10 of them had not been on 6.0 already, so the Django breakdown
    of those weeks is withheld); the third week has 7 developers only (not published); FreeBSD (2 a week)
    and Django 3.2 (3) are rare."""
    events = []
    for w, when in enumerate(times):
        people = 7 if w == 2 else 40 + 5 * w
        for i in range(people):
            share = i / people
            django = "3.2" if i < 3 else "5.2" if share < 0.5 else "4.2" if share < 0.75 else "6.0"
            python = "3.12" if share < 0.4 else "3.11" if share < 0.7 else "3.13" if share < 0.9 else "3.10"
            os_name = "FreeBSD" if i in (3, 4) else "Linux" if share < 0.55 else "macOS" if share < 0.85 else "Windows"
            facts = {"python_version": python, "os_name": os_name}
            # valid=False: judged by the served collector's clock (the helper's fixed clock is for in-process tests)
            events.append(event(client=("dev", i), when=when, app_version=django, valid=False, **facts))
            if i % 4 == 0:  # every fourth developer also ran runserver on Django 6.0
                events.append(
                    event(client=("dev", i), when=when, name="runserver", app_version="6.0", valid=False, **facts)
                )
    return events


@pytest.fixture
def served(tmp_path: Path, sandbox: object) -> Iterator[Served]:
    """``django-spool collector serve --port 0`` as a real process (default --min-count 10)."""
    db = tmp_path / "collector.sqlite3"
    stderr = tmp_path / "serve.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            # Twelve weeks of history: beyond the default 30 days of --max-age-days.
            [*spool_command(), "collector", "serve", "--port", "0", "--db", str(db), "--max-age-days", "90"],
            stdout=subprocess.PIPE,
            stderr=err,
            env=sandbox.env,  # type: ignore[attr-defined]
            text=True,
            bufsize=1,
        )
    try:
        line = _read_line(proc, 30)
        assert line.startswith("listening on http://127.0.0.1:"), line
        srv = Served(proc, line.split()[-1], stderr)
        events = _population(recent_week_times(12))
        for start in range(0, len(events), 500):
            assert post(srv.url, batch(events[start : start + 500]))[0] == 200
        yield srv
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


_CHARTS_JS = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  return {
    charts: [...document.querySelectorAll('svg.chart')].map(s => ({
      id: s.id, box: box(s), circles: s.querySelectorAll('circle').length,
      rects: s.querySelectorAll('rect').length,
      labels: [...s.querySelectorAll('text')].filter(t => t.getBBox().width > 0).length,
      fontSize: parseFloat(getComputedStyle(s.querySelector('text')).fontSize) })),
    tables: [...document.querySelectorAll('div.table')].map(
      d => ({ rows: d.querySelector('table').rows.length, box: box(d) })),
    scrollWidth: document.documentElement.scrollWidth,
    styleRules: document.styleSheets.length ? document.styleSheets[0].cssRules.length : 0,
    marginLeft: parseFloat(getComputedStyle(document.querySelector('svg.chart')).marginLeft),
    text: document.body.innerText,
    injected: document.querySelectorAll('script, img, iframe, object, embed, link, form').length,
  };
})()"""


def _colours(png: bytes, box: list[float]) -> set[tuple[int, int, int]]:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    left, top, width, height = (round(v) for v in box)
    return {rgb for _, rgb in image.crop((left, top, left + width, top + height)).getcolors(1 << 20) or []}


def test_the_served_page_renders_at_phone_and_desktop_width(served: Served, page: Page, tmp_path: Path) -> None:
    base = served.url.removesuffix("/v1/batch")
    for width in WIDTHS:
        page.viewport(width, 900)
        page.load(base + "/")
        found = page.evaluate(_CHARTS_JS)
        assert page.problems() == [], page.problems()  # no console error, no CSP violation
        assert found["styleRules"] > 20  # the stylesheet was allowed (by its hash) ...
        assert found["marginLeft"] > 0  # ... and applied
        assert found["injected"] == 0
        charts = {c["id"]: c for c in found["charts"]}
        assert list(charts) == ["trend", "versions", "python", "os"]
        assert len(found["tables"]) == 4
        for chart, table in zip(charts.values(), found["tables"], strict=True):
            left, top, w, h = chart["box"]
            assert 250 < w < width, chart
            assert h == 272, chart
            assert chart["fontSize"] >= 12  # the labels keep their size at a phone's width
            assert chart["labels"] >= 5 + 3  # the y axis and at least three weeks
            t_left, t_top, t_width, _ = table["box"]
            assert t_width > 250
            if width < 800:  # a phone: the table under its chart
                assert t_top >= top + h
            else:  # a desktop: the table beside its chart, at the same height
                assert t_left >= left + w
                assert abs(t_top - top) < 100
        assert charts["trend"]["circles"] == 11  # 12 weeks, one not published
        assert charts["versions"]["rects"] >= 11 * 2
        assert found["scrollWidth"] <= width  # nothing sticks out sideways: no horizontal scrolling
        assert found["tables"][0]["rows"] == 1 + 11  # the trend's table: a header and the published weeks
        assert "FreeBSD" not in found["text"]
        assert "3.2" not in found["text"]
        png = page.screenshot()
        shot = tmp_path / f"page-{width}.png"
        shot.write_bytes(png)
        image = Image.open(io.BytesIO(png))
        assert image.format == "PNG"
        assert image.size[0] == width
        assert image.size[1] > 1500  # the whole page, beyond the viewport
        assert len(image.convert("RGB").getcolors(1 << 20) or []) > 50  # not blank
        assert TREND in _colours(png, charts["trend"]["box"])  # the line was drawn where the chart is
        assert len(set(PALETTE) & _colours(png, charts["versions"]["box"])) >= 3  # and the shares


def test_hostile_values_stay_inert_in_the_browser(page: Page, tmp_path: Path) -> None:
    weeks = [
        Week(
            week=f"2026-W{num}",
            developers=60,
            events=60,
            by_django={value: 10 for value in HOSTILE},
            by_python={HOSTILE[0]: 60},
            by_os={HOSTILE[1]: 30, HOSTILE[2]: 30},
            by_event={HOSTILE[3]: 60},
        )
        for num in (47, 48, 49)
    ]
    full = Stats(app=HOSTILE[4], developers=60, events=180, weeks=weeks)
    for doc in (full, publish(full)):
        path = tmp_path / f"{type(doc).__name__}.html"
        path.write_text(render_html(doc), encoding="utf-8")
        page.viewport(390, 900)
        page.load(path.as_uri())
        found = page.evaluate(_CHARTS_JS)
        assert page.problems() == []  # an injected script or element would at least be a CSP violation
        assert found["injected"] == 0
        for value in HOSTILE[:3]:
            assert value in found["text"]


def test_problems_are_seen(page: Page) -> None:
    # The checks above mean something only if CSP violations and console errors are reported at all.
    page.load(
        'data:text/html,<meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        "<p style='color: red'>x</p>"
    )
    assert any("Content Security Policy" in p for p in page.problems()), page.problems()
    page.load("data:text/html,<script>console.error('boom')</script>")
    assert any("console.error" in p and "boom" in p for p in page.problems()), page.problems()
