"""The public answers of one process: the bytes of ``GET /``, ``GET /v1/stats`` and the downloads, with their
headers, kept until a release is added.

The numbers are :mod:`._public`'s (the stored releases, post-processed) and the page is :mod:`._public_page`'s; this
module only decides when to rebuild them and how they go out over HTTP. Imports run one way: the WSGI
application (:mod:`._wsgi`) imports this module, which imports the page and the numbers, which import neither.
"""

from __future__ import annotations

import json
import threading
import time

from ._common import CollectorError
from ._html import CSP_HEADER
from ._public import CHECK_SECONDS, document, releases_csv, releases_json
from ._public_page import render_public

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final

    from ._common import Publishing, Release
    from ._public import Document
    from ._store import Store

_JSON_CSP: Final = "default-src 'none'; frame-ancestors 'none'"
"""The JSON and CSV answers run nothing and may not be framed."""

_JSON_HEADERS: Final = [("Content-Security-Policy", _JSON_CSP), ("X-Content-Type-Options", "nosniff")]
_DOWNLOAD_HEADERS: Final = [*_JSON_HEADERS, ("Content-Disposition", "attachment")]
_PAGE_HEADERS: Final = [
    ("Content-Security-Policy", CSP_HEADER),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]

Answer = tuple[int, bytes, str, list[tuple[str, str]]]
"""(status, body, content type, more headers): what :class:`~._wsgi.Collector` sends."""


class Served:
    """The public answers of one process, rebuilt only when a release was added, or the first week released
    changed (checked every :data:`CHECK_SECONDS`).

    Every answer is a function of the stored releases and the :class:`Publishing` settings alone, so all
    processes serve the same bytes. Each answer is built when it is first asked for (the page and the document
    do not wait for the CSV download). While the database cannot be read, the answers already built are
    served; with none yet, the request fails as the database does (``503`` when it is unavailable).
    """

    def __init__(self, store: Store, publishing: Publishing, *, check_every: float = CHECK_SECONDS) -> None:
        self.store = store
        self.publishing = publishing
        self.check_every = check_every
        self._lock = threading.Lock()
        self._mark: tuple[tuple[int, str], str] | None = None
        self._checked = -1e18  # monotonic
        self._releases: list[Release] = []
        self._doc: Document = document([], publishing)  # replaced by the first read, before any answer
        self._answers: dict[str, Answer] = {}  # a builder's name -> its answer

    def answer(self, build: Callable[[Served], Answer]) -> Answer:
        """The answer that ``build`` (one of :meth:`page`, :meth:`stats`, :meth:`releases_json` and
        :meth:`releases_csv`: the route table's, :data:`._wsgi.ROUTES`) makes of the current releases, built once
        per change."""
        with self._lock:
            if time.monotonic() - self._checked >= self.check_every:
                self._refresh()
            name = build.__name__
            got = self._answers.get(name)
            if got is None:
                got = self._answers[name] = build(self)
            return got

    def _refresh(self) -> None:
        app = self.publishing.app
        try:
            # One read, bounded (a request waits for it), one snapshot: the mark, the first week (the operator may
            # set it at any time: the page names it) and, when they changed, the releases they describe.
            with self.store.reading(quick=True) as reader:
                first_week = self.store.first_week(reader)
                mark = (self.store.release_mark(app, reader), first_week)
                releases = self.store.releases(app, reader) if mark != self._mark else None
            if releases is not None:
                doc = document(releases, self.publishing, first_week=first_week)
                self._releases, self._doc, self._answers = releases, doc, {}
                self._mark = mark
        except CollectorError:
            if self._mark is None:
                raise  # nothing to serve instead
        self._checked = time.monotonic()

    def page(self) -> Answer:
        """``GET /``: the page."""
        return 200, render_public(self._doc).encode("utf-8"), "text/html; charset=utf-8", _PAGE_HEADERS

    def stats(self) -> Answer:
        """``GET /v1/stats``: the page's document as JSON."""
        return 200, json.dumps(self._doc, ensure_ascii=True).encode("ascii"), "application/json", _JSON_HEADERS

    def releases_json(self) -> Answer:
        """``GET /v1/releases.json``: every release as released, a download."""
        return 200, releases_json(self._releases, self.publishing), "application/json", _DOWNLOAD_HEADERS

    def releases_csv(self) -> Answer:
        """``GET /v1/releases.csv``: every released number, a download."""
        return 200, releases_csv(self._releases, self.publishing), "text/csv; charset=utf-8", _DOWNLOAD_HEADERS
