"""The fixtures of the collector's tests that close what the tests open: a module asks for them by name
(``pytestmark = pytest.mark.usefixtures(...)``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spool_reporter.collector._sqlite import SQLiteStore

from support.releases import OPENED


@pytest.fixture(scope="module")
def close_every_store() -> Iterator[None]:
    """Close every SQLite store the module's tests open (many open one inline): Python 3.13 warns about SQLite
    connections left to the garbage collector, and ``filterwarnings = error`` then fails whichever later test
    happens to trigger the collection."""
    opened: list[SQLiteStore] = []
    original = SQLiteStore.__init__

    def tracking(self: SQLiteStore, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(self)

    SQLiteStore.__init__ = tracking  # type: ignore[method-assign]
    try:
        yield
    finally:
        SQLiteStore.__init__ = original  # type: ignore[method-assign]
        for store in opened:
            store.close()


@pytest.fixture
def close_released() -> Iterator[None]:
    """Close the stores a test made with :func:`support.releases.released` (a module-scoped store made before the
    test is not the test's)."""
    before = len(OPENED)
    yield
    while len(OPENED) > before:
        OPENED.pop().close()
