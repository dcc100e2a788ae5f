"""The built docs: no placeholder, no stale figure, and the "What is sent" table readable on a phone.

One real ``sphinx-build -W`` of ``docs/`` (about 5 s) serves the whole module. It already fails on a figure
reference that does not resolve (``docs/_ext/spool_generated.py`` warns); these tests look at what it made:

* a placeholder left standing: an ALL_CAPS token alone in a paragraph (``STATS_TABLE`` once stood where a
  generated table should have been), a ``{spool-generated}`` "missing" note although the generated file
  exists, a raw JSON list or mapping in a rendered table;
* a figure typed by hand: a sentence or table row that states a measured rate, RSS, percentile, median or
  budget with a number not read from ``docs/_generated/`` or a benchmark's constant (the ``{figure}`` role,
  a ``{spool-generated}`` block). A hand-copied figure goes stale with the next benchmark run; one read at
  build time cannot;
* the "this build machine" column of the field table on ``what-is-sent.html`` inside a 390 px viewport, in
  headless Chromium (``tests/support/cdp.py``; skipped without it, like ``tests/collector/test_public_browser.py``).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cdp import Browser, find_chromium

if os.environ.get("SPOOL_REPORTER_DOCS_TESTS") == "required":
    # noxfile.py's tests session installs the docs tools on one Python and sets this: there a missing tool is
    # an error, never a silent skip.
    import furo  # noqa: F401
    import myst_parser  # noqa: F401
    import sphinx  # noqa: F401
else:
    for _module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(
            _module, reason="the docs tests build the docs (nox's tests session on 3.11 installs the tools)"
        )

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GENERATED = DOCS / "_generated"
CHROMIUM = find_chromium()

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``docs/`` built once for the module, as ``nox -s docs`` builds it (warnings are errors)."""
    out = tmp_path_factory.mktemp("docs-html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _pages(built: Path) -> Iterator[tuple[str, str]]:
    for path in sorted(built.glob("*.html")):
        if path.stem not in ("genindex", "search"):
            yield path.stem, path.read_text(encoding="utf-8")


def _article(page: str) -> str:
    """The page's own content (furo's ``<article>``), without the sidebar and the footer."""
    m = re.search(r"<article\b.*?</article>", page, re.DOTALL)
    return m[0] if m else page


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


# --- placeholders -------------------------------------------------------------------------------------------

_CAPS_ALONE = re.compile(r"<p>\s*([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\s*</p>")
_TEMPLATE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|@@\w+@@")


def placeholders(built: Path) -> list[str]:
    found = []
    for name, page in _pages(built):
        article = _article(page)
        found += [f"{name}: {m[1]} stands alone" for m in _CAPS_ALONE.finditer(article)]
        # Outside <pre> and <code>: a template tag in an example is fine, one in the prose is not.
        prose = re.sub(r"<(pre|code)\b.*?</\1>", " ", article, flags=re.DOTALL)
        found += [f"{name}: template leftover {m[0]!r}" for m in _TEMPLATE.finditer(_text(prose))]
    return found


def _missing_notes() -> dict[str, list[str]]:
    """``page -> [the :missing: text of each {spool-generated} figures block on it]``, and the default note."""
    notes: dict[str, list[str]] = {}
    block = re.compile(r"^(`{3,})\{spool-generated\}\s+figures\s*\n(.*?)^\1", re.MULTILINE | re.DOTALL)
    for path in DOCS.glob("*.md"):
        for m in block.finditer(path.read_text(encoding="utf-8")):
            missing = re.search(r"^:missing:\s*(.*)$", m[2], re.MULTILINE)
            notes.setdefault(path.stem, []).append(missing[1] if missing else "No generated figures yet.")
    return notes


def missing_notes_shown(built: Path) -> list[str]:
    """A "No ... yet" note rendered although ``docs/_generated/`` has files: the figures were not found."""
    assert any(GENERATED.glob("*.json")), "docs/_generated/ has no figures to render"
    found = []
    for name, notes in _missing_notes().items():
        text = _text(_article((built / f"{name}.html").read_text(encoding="utf-8")))
        # The note's Markdown (backticks) is gone from the page: compare its first words.
        found += [f"{name}: {note[:60]!r}" for note in notes if _text(note.replace("`", ""))[:40] in text]
    return found


_SMART_QUOTES = str.maketrans("\u201c\u201d\u2018\u2019", "\"\"''")
"""Docutils curls the quotes of prose, a JSON text in a table cell included."""


def raw_json_cells(built: Path) -> list[str]:
    """Table cells whose text, outside ``<code>``, is a JSON list or mapping: data nobody turned into a table."""
    found = []
    for name, page in _pages(built):
        for cell in re.findall(r"<td\b[^>]*>(.*?)</td>", _article(page), re.DOTALL):
            text = _text(re.sub(r"<code\b.*?</code>", " ", cell, flags=re.DOTALL))
            if text[:1] in "[{" and text:
                try:
                    value = json.loads(text.translate(_SMART_QUOTES))
                except ValueError:
                    continue
                if isinstance(value, (list, dict)):
                    found.append(f"{name}: {text[:80]}")
    return found


def test_no_placeholder_left(built: Path) -> None:
    assert placeholders(built) == []


def test_no_missing_note_while_the_figures_exist(built: Path) -> None:
    assert missing_notes_shown(built) == []


def test_generated_lists_and_mappings_are_tables(built: Path) -> None:
    assert raw_json_cells(built) == []
    collector = _text(_article((built / "collector.html").read_text(encoding="utf-8")))
    best = json.loads((GENERATED / "collector.json").read_text(encoding="utf-8"))["figures"]["ingest"][0]["best"]
    assert f"{best:,}" in collector  # with its thousands separator, in the ingest table


# --- figures typed by hand -----------------------------------------------------------------------------------

EXEMPT_PAGES = {
    "design-notes": "its measurements are historical: each says when, on what machine and with which command "
    "it was taken, and they explain decisions made at the time, so they must not follow the latest run",
    "changelog": "a record of past releases, whose figures were true when each was written",
    "cli": "generated from the argparse help texts (docs/_ext/cli_reference.py)",
}

DATED = re.compile(r"\b[Mm]easured (?:once )?by hand on \d{4}-\d{2}-\d{2}\b")
"""A measurement that says when it was taken and how (like the design notes') may stay typed: it is history,
not a claim about the latest run."""

_FENCE = re.compile(r"^(`{3,}).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # {figure}`...`, {doc}`...`: resolved at build time
_CODE = re.compile(r"`[^`\n]*`")
_NUMBER = r"(?<![\w.])[+±≈~-]?\d[\d,]*(?:\.\d+)?(?:[\u2013-]\d[\d,]*(?:\.\d+)?)?"
_RATE = re.compile(_NUMBER + r"\s?(?:events/s|/s\b|per second)")
_AMOUNT = re.compile(_NUMBER + r"\s?(?:µs|us\b|ms\b|s\b|seconds?\b|MiB|KiB|%)")
_MEASURE = re.compile(r"\b(?:RSS|p50|p90|p95|p99|percentile|median|throughput|budget|measured|took)\b", re.IGNORECASE)


def statements(markdown: str) -> Iterator[str]:
    """The sentences, list items and table rows of a page, without code, generated blocks and roles."""
    markdown = _ROLE.sub(" ", _FENCE.sub(" ", markdown))
    markdown = _CODE.sub(" ", markdown)
    for block in re.split(r"\n\s*\n", markdown):
        lines = block.splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            yield from lines
            continue
        for item in re.split(r"\n\s*(?:[-*]|\d+\.)\s+", "\n" + block):
            yield from re.split(r"(?<=[.;:!?])\s+(?=[A-Z(*])", " ".join(item.split()))


def hand_typed_figures(pages: dict[str, str]) -> list[str]:
    found = []
    for name, markdown in sorted(pages.items()):
        if name in EXEMPT_PAGES:
            continue
        for statement in statements(markdown):
            if DATED.search(statement):
                continue
            if _RATE.search(statement) or (_AMOUNT.search(statement) and _MEASURE.search(statement)):
                found.append(f"{name}: {statement[:160]}")
    return found


def _sources() -> dict[str, str]:
    return {path.stem: path.read_text(encoding="utf-8") for path in DOCS.glob("*.md")}


def test_no_figure_is_typed_by_hand() -> None:
    """Every measured figure and budget on a page is read from docs/_generated/ or a benchmark's constant."""
    assert hand_typed_figures(_sources()) == []


def test_the_figure_check_sees_a_stale_table_row() -> None:
    # The row that went stale on the collector page: the guard must see it, in a table and in a sentence.
    stale = "| SQLite, gunicorn | 19,759 events/s | 15,798 events/s | 37.1 MiB |"
    assert hand_typed_figures({"collector": f"| a | b |\n|---|---|\n{stale}\n"})
    assert hand_typed_figures({"flusher": "A flusher delivers them in about 0.3 s (budget 2 s)."})
    assert not hand_typed_figures({"flusher": "In {figure}`flush.json:figures.wall_s` s (budget 2 `s`)."})


_TEST_PATH = re.compile(r"(?<![\w/.-])tests/[\w/]+\.(?:py|md)\b")
_NAMING_TEST_PATHS = ("README.md", "docs/*.md", "docs/_ext/*.py", "docs/_generated/README.txt", "noxfile.py",
                      ".ci/run", "benchmarks/*.py", "scripts/*.py", "spool_reporter/**/*.py", "deploy/**/*.conf",
                      "tests/**/*.py", "tests/README.md")  # fmt: skip
"""Where the repository names a test file; the changelog is left out (it says where things were)."""


def named_test_paths(text: str) -> set[str]:
    return set(_TEST_PATH.findall(text))


def test_every_named_test_file_exists() -> None:
    """A page or comment that sends the reader to a test names a file that is there (the tests moved once)."""
    missing = []
    for pattern in _NAMING_TEST_PATHS:
        for path in sorted(REPO.glob(pattern)):
            for name in sorted(named_test_paths(path.read_text(encoding="utf-8"))):
                if not (REPO / name).is_file():
                    missing.append(f"{path.relative_to(REPO)}: {name}")
    assert missing == []


def test_the_test_path_check_sees_an_old_path() -> None:
    old = "tests" + "/test_spool.py"  # spelled in two parts, or the check above would find it here
    text = f"checked by `{old}` and tests/client/test_spool.py::test_x, not dj/tests/x.py"
    assert named_test_paths(text) == {old, "tests/client/test_spool.py"}


def test_the_index_does_not_repeat_the_sidebar(built: Path) -> None:
    """The toctrees are hidden: furo's sidebar shows the tree, the index's body orients the reader instead."""
    index = _article((built / "index.html").read_text(encoding="utf-8"))
    assert "toctree-l1" not in index  # a hidden toctree leaves an empty wrapper, no entries
    assert "how-it-works.html" in index  # the hand-written orientation still links onward


# --- "What is sent" on a phone -------------------------------------------------------------------------------

_COLUMN_JS = """(() => {
  const table = [...document.querySelectorAll('article table')].find(t =>
    [...t.querySelectorAll('th')].some(th => th.textContent.trim() === 'this build machine'));
  if (!table) return null;
  const index = [...table.querySelectorAll('th')].findIndex(th => th.textContent.trim() === 'this build machine');
  return {
    width: document.documentElement.clientWidth,
    cells: [...table.querySelectorAll('tbody tr')].map(tr => {
      const td = tr.cells[index], r = td.getBoundingClientRect(), s = getComputedStyle(td);
      return { text: td.textContent.trim(), left: r.left, right: r.right, width: r.width, height: r.height,
               visible: s.visibility !== 'hidden' && s.display !== 'none' };
    }),
  };
})()"""


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it when missing)",
)
def test_what_is_sent_shows_this_machine_at_390_px(built: Path, tmp_path: Path) -> None:
    """The column that is the point of the table is on screen on a phone, without scrolling sideways."""
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM, tmp_path / "chromium")
    try:
        page = browser.new_page()
        page.viewport(390, 844)
        page.load((built / "what-is-sent.html").as_uri())
        found = page.evaluate(_COLUMN_JS)
    finally:
        browser.close()
    assert found is not None, "no table with a 'this build machine' column"
    assert found["width"] == 390
    assert len(found["cells"]) >= 10
    off = [c for c in found["cells"] if not (c["visible"] and c["width"] > 0 and c["left"] >= 0 and c["right"] <= 390)]
    assert off == [], off
