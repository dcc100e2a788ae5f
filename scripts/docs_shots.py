"""Look at the built docs the way readers do: every page in headless Chromium, at a phone and a desktop width.

    nox -s docs                                          # builds docs/_build/html
    python3 scripts/docs_shots.py docs/_build/html OUT   # screenshots in OUT, and what runs off the page

Serves the built site on a loopback port, opens each page in Chromium (``chromium`` or ``chromium-browser`` on
PATH; Debian: ``apt-get install chromium``) with a fresh profile and no network features, sets the viewport
through the DevTools protocol (``--window-size`` cannot go below 500 px in headless mode, so a phone's 390 px
needs ``Emulation.setDeviceMetricsOverride``), and saves a full-page PNG per width. For each page it prints the
document's width against the viewport's and the elements that reach past its right edge without a scrolling
box around them: that is what "runs off the page" means. Exit status 1 if any page does.

Not part of CI (it needs Chromium); run it after changing the theme, the CSS or a wide table.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WIDTHS = (390, 1280)
"""A phone (iPhone 12-15, CSS pixels) and a desktop."""
HEIGHT = {390: 844, 1280: 900}
PAGE_TIMEOUT = 30.0
"""Seconds to wait for one page's load event."""

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


class Browser:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (file descriptors 3 and 4): no WebSocket needed."""

    def __init__(self, executable: str, profile: str) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        args = [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank",
        ]  # fmt: skip

        # The protocol's fixed descriptors: commands on 3, replies on 4. Both ends are first copied above 4, so
        # that neither dup2 clobbers the other.
        copies = [os.dup(to_child_r), os.dup(from_child_w)]
        while min(copies[-2:]) <= 4:
            copies += [os.dup(fd) for fd in copies[-2:]]
        high = copies[-2:]
        actions = [(os.POSIX_SPAWN_DUP2, high[0], 3), (os.POSIX_SPAWN_DUP2, high[1], 4)]
        if not os.environ.get("DOCS_SHOTS_DEBUG"):
            actions += [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
        self.pid = os.posix_spawn(executable, args, dict(os.environ), file_actions=actions)
        for fd in (to_child_r, from_child_w, *copies):
            os.close(fd)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium exited")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + PAGE_TIMEOUT
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            self.events.append(reply)

    def wait_event(self, method: str) -> None:
        deadline = time.monotonic() + PAGE_TIMEOUT
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    del self.events[: i + 1]
                    return
            self.events.append(self._read(deadline))

    def close(self) -> None:
        os.close(self._to_child)  # Chromium exits when its command pipe closes
        deadline = time.monotonic() + 10
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        os.close(self._from_child)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def shoot(browser: Browser, url: str, width: int, png: Path) -> dict[str, Any]:
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    try:
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=HEIGHT[width],
            deviceScaleFactor=1,
            mobile=width < 800,
        )
        browser.call("Page.enable", session)
        browser.call("Page.navigate", session, url=url)
        browser.wait_event("Page.loadEventFired")
        found = browser.call("Runtime.evaluate", session, expression=OVERFLOW_JS, returnByValue=True)["result"]["value"]
        shot = browser.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        png.write_bytes(base64.b64decode(shot["data"]))
        return found  # type: ignore[no-any-return]
    finally:
        browser.call("Target.closeTarget", targetId=target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("html", type=Path, help="the built site (docs/_build/html)")
    parser.add_argument("out", type=Path, help="where the screenshots go")
    parser.add_argument("pages", nargs="*", help="pages relative to the site (default: every page)")
    args = parser.parse_args(argv)
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
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
        browser = Browser(executable, profile)
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
