"""Headless Chromium driven over the DevTools protocol on a pipe, with the standard library only.

Why this and not a driver package: ``--remote-debugging-pipe`` makes Chromium read DevTools commands from
file descriptor 3 and write answers to 4, each a JSON text ending in a NUL byte. That needs no websocket
client, opens no port (not even a loopback one), can never download a browser (it only runs the one
found on ``PATH``, Debian's ``chromium``), and works with whatever Chromium version is installed, since
it uses only the stable ``Page``, ``Runtime``, ``Log``, ``Emulation`` and ``Target`` domains. Playwright
would add a Node.js driver process and a browser-build pairing to every test environment for the same
four calls. Every read is bounded by a deadline; the browser runs in its own process group, which
:meth:`Browser.close` ends if it does not quit by itself.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser")
"""Debian's and Ubuntu's names of the browser; ``SPOOL_REPORTER_CHROMIUM`` may name another binary."""

FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container; the pages are our own
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)

# Chromium reads fd 3 and writes fd 4; this puts our pipe ends there and runs the browser in place.
_EXEC = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execv(sys.argv[3], sys.argv[3:])"
)


def find_chromium() -> str | None:
    named = os.environ.get("SPOOL_REPORTER_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(Exception):
    pass


class Browser:
    """One headless Chromium with a fresh profile in ``profile``; its stderr goes to ``profile/stderr``."""

    def __init__(self, executable: str, profile: Path, *, timeout: float = 30.0) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._buf = b""
        self._id = 0
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Above 4, so that the two dup2 calls in the child cannot overwrite each other's source.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child_r, from_child_w)]
        for fd in (to_child_r, from_child_w):
            os.close(fd)
        self._stderr = (profile / "stderr").open("wb")
        args = [*FLAGS, f"--user-data-dir={profile / 'data'}", "about:blank"]
        # Its own home too: nothing of the browser's lands in the user's ~/.config or ~/.cache.
        env = {**os.environ, "HOME": str(profile), "XDG_CONFIG_HOME": str(profile), "XDG_CACHE_HOME": str(profile)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _EXEC, str(high[0]), str(high[1]), executable, *args],
            env=env,
            pass_fds=high,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            start_new_session=True,
        )
        for fd in high:
            os.close(fd)
        self._write, self._read = to_child_w, from_child_r
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._read, selectors.EVENT_READ)
        self.version = self.call("Browser.getVersion")["product"]

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited ({self.proc.poll()})")
            self._buf += chunk
        message, _, self._buf = self._buf.partition(b"\0")
        return json.loads(message)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> Any:
        """Send one command and return its result; events read meanwhile are kept in :attr:`events`."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, *, session: str, since: int) -> dict[str, Any]:
        """The first event ``method`` of ``session`` at or after index ``since`` of :attr:`events`."""
        deadline = time.monotonic() + self.timeout
        index = since
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            self.events.append(self._receive(deadline))

    def new_page(self) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session, target)
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        return page

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group we started (start_new_session)
            self.proc.wait(10)
        self._sel.close()
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stderr.close()


class Page:
    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self.browser = browser
        self.session = session
        self.target = target

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self.browser.call(method, params, session=self.session)

    def viewport(self, width: int, height: int) -> None:
        """A phone-like (``mobile``, below 800 px) or desktop viewport of ``width`` CSS pixels."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 800},
        )

    def load(self, url: str) -> None:
        since = len(self.browser.events)
        self.call("Page.navigate", {"url": url})
        self.browser.wait_for("Page.loadEventFired", session=self.session, since=since)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """A PNG of the whole page (beyond the viewport) at the current width."""
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        return base64.b64decode(data)

    def problems(self) -> list[str]:
        """Console errors and warnings, exceptions and browser log entries (CSP violations are these) so far."""
        out = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                entry = params["entry"]
                out.append(f"log ({entry.get('source')}, {entry.get('level')}): {entry.get('text')}")
        return out
