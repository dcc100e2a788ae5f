"""Look at the built docs the way readers do: every page in headless Chromium, at a phone and a desktop width.

    nox -s docs                                          # builds docs/_build/html
    python3 scripts/docs_shots.py docs/_build/html OUT   # screenshots in OUT, and what runs off the page

Serves the built site on a loopback port, opens each page in Chromium (``chromium`` or ``chromium-browser`` on
PATH, or ``SPOOL_REPORTER_CHROMIUM``; Debian: ``apt-get install chromium``) with a fresh profile and no network
features, through the tests' driver (``tests/support/cdp.py``), sets the viewport through the DevTools
protocol (``--window-size`` cannot go below 500 px in headless mode, so a phone's 390 px needs
``Emulation.setDeviceMetricsOverride``), and saves a full-page PNG per width. For each page it prints the
document's width against the viewport's and the elements that reach past its right edge without a scrolling
box around them: that is what "runs off the page" means. Exit status 1 if any page does.

Not part of CI (it needs Chromium); run it after changing the theme, the CSS or a wide table.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import importlib.util
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

WIDTHS = (390, 1280)
"""A phone (iPhone 12-15, CSS pixels) and a desktop."""
HEIGHT = {390: 844, 1280: 900}
PAGE_TIMEOUT = 30.0
"""Seconds to wait for any one answer of the browser (a page's load event among them)."""

OVERFLOW_JS = """(() => {
  const W = document.documentElement.clientWidth, out = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= W + 1) continue;
    let p = e.parentElement, boxed = false;
    while (p) {
      const s = getComputedStyle(p);
      if (['auto', 'scroll', 'hidden', 'clip'].includes(s.overflowX) && p.getBoundingClientRect().right <= W + 1) {
        boxed = true; break;
      }
      p = p.parentElement;
    }
    if (!boxed && getComputedStyle(e).visibility !== 'hidden') out.push(e.tagName.toLowerCase() +
      (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ')[0] : '') +
      ' @' + Math.round(r.right));
  }
  return {scroll: document.documentElement.scrollWidth, viewport: W, off: out.slice(0, 8)};
})()"""


def _driver() -> Any:
    """The tests' Chromium driver (``tests/support/cdp.py``, standard library only), loaded from its file: one
    driver for the tests and this script, without putting ``tests/`` on ``sys.path``."""
    path = Path(__file__).resolve().parent.parent / "tests" / "support" / "cdp.py"
    spec = importlib.util.spec_from_file_location("spool_tests_support_cdp", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def shoot(browser: Any, url: str, width: int, png: Path) -> dict[str, Any]:
    page = browser.new_page()
    try:
        page.viewport(width, HEIGHT[width])
        page.load(url)
        found = page.evaluate(OVERFLOW_JS)
        png.write_bytes(page.screenshot())
        return found  # type: ignore[no-any-return]
    finally:
        page.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("html", type=Path, help="the built site (docs/_build/html)")
    parser.add_argument("out", type=Path, help="where the screenshots go")
    parser.add_argument("pages", nargs="*", help="pages relative to the site (default: every page)")
    args = parser.parse_args(argv)
    cdp = _driver()
    executable = cdp.find_chromium()
    if executable is None:
        print("docs_shots: Chromium is required (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    pages = args.pages or sorted(
        str(p.relative_to(args.html))
        for p in args.html.rglob("*.html")
        if not {"_static", "_sources", "_modules"} & set(p.relative_to(args.html).parts)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(args.html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    bad = 0
    with tempfile.TemporaryDirectory(prefix="docs-shots-") as profile:
        browser = cdp.Browser(executable, Path(profile), timeout=PAGE_TIMEOUT)
        try:
            for page in pages:
                for width in WIDTHS:
                    png = args.out / f"{page.removesuffix('.html').replace('/', '_')}-{width}.png"
                    found = shoot(browser, base + page, width, png)
                    off = found["scroll"] > found["viewport"] or found["off"]
                    bad += bool(off)
                    detail = f"document {found['scroll']} px in a {found['viewport']} px viewport"
                    if found["off"]:
                        detail += "; past the edge: " + ", ".join(found["off"])
                    print(f"{'RUNS OFF' if off else 'ok':8} {width:>5} {page}: {detail}")
        finally:
            browser.close()
            server.shutdown()
    print(f"docs_shots: {len(pages)} pages x {len(WIDTHS)} widths, {bad} running off the page; PNGs in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
