"""The self-hosted collector: receives the ``json`` transport's batches (and the ``ga4`` transport's
GA4-shaped payloads), judges each event on its own, and stores no IP address.

Public API (``__all__``: one line each here and on ``docs/public-api.md``; everything else in this package is
private)::

    make_app(db, *, forward=None, policy=None, limits=None, publishing=None, retention=None, retired=False)  # WSGI
    serve(db, *, host="127.0.0.1", port=0, ...) -> CollectorServer   # embedded server, bound; make_app's options
    stats(db, *, app="Django") -> Stats          # distinct developers per ISO week (exact: the operator's)
    public(db, *, publishing=None) -> dict       # what GET /v1/stats serves: the stored releases
    render_html(stats) -> str                    # the operator's page (collector stats --html)
    open_store(db, *, create=True, limits=None) -> Store  # the database: a SQLite path or a postgresql:// URL
    Publishing(epsilon=1.0, app="Django", min_count=10, licence="CC-BY-4.0")  # what is released, and how shown
    Policy(commands=..., max_age=...)            # what is accepted (applications, commands, time window)
    Limits(per_client_week=1000)                 # what is kept
    Retention(retain_days=430, rollup_every=3600)  # how long raw events are kept; how often to roll up
    GA4Forwarder(measurement_id=..., api_secret=...)  # optional server-side forwarding to GA4
    Collector                                    # make_app's WSGI application: .store, .counters, .rollup()
    CollectorServer                              # serve's server: .url, .port, .start(), .stop(), with
    Counters                                     # Collector.counters: what one process has seen
    Store                                        # open_store's database
    Stats                                        # stats()'s numbers
    Week                                         # one ISO week of Stats.weeks
    CollectorError                               # the root of the collector's errors (a SpoolReporterError)
    Unavailable                                  # the database is busy or unreachable for now (503)
    StoreClosed                                  # the store was used after close() (a CollectorError)
    MIN_COUNT                                    # 10: the default display threshold of the public numbers
    MAX_EVENTS                                   # events per batch at most
    MAX_BODY_BYTES                               # bytes per batch body at most
    BATCH_PATH                                   # "/v1/batch"
    FORGET_PATH                                  # "/v1/forget"
    GA4_PATH                                     # "/mp/collect"

``db`` is a SQLite file path (the default for a laptop and the demo; created ``0600``) or a PostgreSQL URL
(``postgresql://user@host/dbname``, with ``pip install 'spool_reporter[collector]'``). A demo or a test
starts one on a free loopback port and reads the numbers at the end::

    with serve(tmp / "events.sqlite3") as server:   # listening; served from a daemon thread
        ...                                          # clients post to server.url
    print(stats(tmp / "events.sqlite3").as_dict())

The wire format: ``POST /v1/batch`` with ``Content-Type: application/json`` and the body
``{"schema": 1, "events": [...]}`` (at most :data:`MAX_EVENTS` events, :data:`MAX_BODY_BYTES` bytes). Each
event is judged on its own; a well-formed batch is answered ``200 {"accepted": n, "duplicates": m,
"rejected": r, "refused": {reason: k}}`` once it is durable (``refused``: the ``r`` refused events by reason).
``400`` with a short reason for a body that is not a batch; ``413`` for a body over the cap; ``411`` without
a length; ``415`` for another content type or a content encoding;
``503`` with ``Retry-After`` when the database is busy or unreachable; ``410`` to every batch once the collector
is retired (``retired=True``: each client that receives it stops for good). ``GET /v1/health`` answers
``{"ok": true}``. ``GET /`` is the public page and ``GET /v1/stats`` its JSON (``public(db)``), with
``GET /v1/releases.json`` and ``GET /v1/releases.csv`` as downloads: every public number is a stored
release, made once with differential privacy (``docs/collector.md``). ``POST /v1/forget`` with
``{"client_id": "<uuid4>"}`` deletes that id's stored events and answers ``{"deleted": n}``.

``POST /mp/collect`` (:data:`GA4_PATH`) takes exactly what the ``ga4`` transport sends, so a client
configured with ``transport=ga4`` can use this collector instead of Google: the query string
(``measurement_id``, ``api_secret``) is ignored, each event gets an id derived from its content and its
day (identical events from one client on the same day count once: the collector keeps the day, never the
second), and success is ``204`` as from GA4.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os
    from typing import Final, TypedDict

    from typing_extensions import Unpack  # typing's from Python 3.11; read by the type checker only

    from ._common import (
        BATCH_PATH,
        FORGET_PATH,
        GA4_PATH,
        MIN_COUNT,
        CollectorError,
        Limits,
        Publishing,
        Retention,
        StoreClosed,
        Unavailable,
    )
    from ._forward import GA4Forwarder
    from ._open import open_store
    from ._operator_page import render_html
    from ._public import Document
    from ._server import CollectorServer
    from ._stats import Stats, Week
    from ._stats import compute as stats
    from ._store import Store
    from ._wire import MAX_BODY_BYTES, MAX_EVENTS, Policy
    from ._wsgi import Collector, Counters, Forwarder

    class _Settings(TypedDict, total=False):
        """:func:`make_app`'s keyword arguments, which :func:`serve` passes on."""

        forward: Forwarder | None
        policy: Policy | None
        limits: Limits | None
        min_count: int | None
        retention: Retention | None
        publishing: Publishing | None
        retired: bool


__all__ = [
    "BATCH_PATH",
    "FORGET_PATH",
    "GA4_PATH",
    "MAX_BODY_BYTES",
    "MAX_EVENTS",
    "MIN_COUNT",
    "Collector",
    "CollectorError",
    "CollectorServer",
    "Counters",
    "GA4Forwarder",
    "Limits",
    "Policy",
    "Publishing",
    "Retention",
    "Stats",
    "Store",
    "StoreClosed",
    "Unavailable",
    "Week",
    "make_app",
    "open_store",
    "public",
    "render_html",
    "serve",
    "stats",
]

_HOMES: Final = {
    "BATCH_PATH": "_common",
    "FORGET_PATH": "_common",
    "GA4_PATH": "_common",
    "MAX_BODY_BYTES": "_wire",
    "MAX_EVENTS": "_wire",
    "MIN_COUNT": "_common",
    "Collector": "_wsgi",
    "CollectorError": "_common",
    "CollectorServer": "_server",
    "Counters": "_wsgi",
    "GA4Forwarder": "_forward",
    "Limits": "_common",
    "Policy": "_wire",
    "Publishing": "_common",
    "Retention": "_common",
    "Stats": "_stats",
    "Store": "_store",
    "StoreClosed": "_common",
    "Unavailable": "_common",
    "Week": "_stats",
    "open_store": "_open",
    "render_html": "_operator_page",
    "stats": "_stats.compute",
}
"""Where each public name lives: the package loads a module when one of its names is first used (PEP 562), so
that ``django-spool status``, whose parser lists the collector's commands, does not import the server."""


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, _, attr = home.partition(".")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def make_app(
    db: str | os.PathLike[str],
    *,
    forward: Forwarder | None = None,
    policy: Policy | None = None,
    limits: Limits | None = None,
    min_count: int | None = None,
    retention: Retention | None = None,
    publishing: Publishing | None = None,
    retired: bool = False,
) -> Collector:
    """The collector as a WSGI application storing into ``db`` (a SQLite path, created if missing, or a
    ``postgresql://`` URL; the schema is created or migrated either way).

    :param forward: an optional forwarder (:class:`GA4Forwarder`) that receives every newly stored event.
    :param policy: what is accepted (:class:`Policy`: applications and their commands, the time window).
    :param limits: what is kept (:class:`Limits`: events per client id per week).
    :param min_count: the display threshold of the public numbers: a released count below it is shown as
        "fewer than N" (default: ``publishing``'s, :data:`MIN_COUNT`, 10).
    :param retention: how long raw events are kept, and how often ingest starts a roll-up (:class:`Retention`).
    :param publishing: what is released publicly and how (:class:`Publishing`: ε, the application, the
        licence).
    :param retired: answer every batch (``POST /v1/batch`` and ``POST /mp/collect``) ``410 Gone``, which makes
        each client that receives it stop reporting here for good and delete its queue; forgetting, the health
        check and the public numbers keep working (``serve --retired``, docs/collector.md).
    :raises CollectorError: the database cannot be opened (one line saying why), or the retention is shorter
        than the maximum event age plus a week.
    """
    from ._common import Publishing, Retention, check_epsilon, check_min_count
    from ._open import open_store
    from ._rollup import check_retention
    from ._wire import Policy
    from ._wsgi import Collector

    publishing = publishing or Publishing()
    if min_count is not None:
        publishing = publishing._replace(min_count=min_count)
    check_min_count(publishing.min_count)  # before the store opens the database
    check_epsilon(publishing.epsilon)
    check_retention(retention or Retention(), (policy or Policy()).max_age)
    store = open_store(db, limits=limits)
    try:
        return Collector(
            store, forward=forward, policy=policy, publishing=publishing, retention=retention, retired=retired
        )
    except BaseException:
        store.close()
        raise


def serve(
    db: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0, **settings: Unpack[_Settings]
) -> CollectorServer:
    """A bound embedded server for :func:`make_app` (``port=0``: a free port, see ``.port`` and ``.url``), which
    takes the rest of the keyword arguments (``forward``, ``policy``, ``limits``, ``min_count``, ``retention``,
    ``publishing``, ``retired``).

    Call ``.serve_forever()`` or ``.start()`` (a daemon thread), and ``.stop()``; or use ``with``.
    """
    from ._server import CollectorServer

    app = make_app(db, **settings)
    try:
        return CollectorServer(app, host=host, port=port)
    except BaseException:
        app.store.close()
        raise


def public(db: str | os.PathLike[str] | Store, *, publishing: Publishing | None = None) -> Document:
    """The public document (what ``GET /v1/stats`` serves) of the releases stored in ``db``: nothing is counted.

    :raises CollectorError: the database does not exist or cannot be read.
    """
    from ._common import Publishing
    from ._open import open_store
    from ._public import document
    from ._store import Store

    publishing = publishing or Publishing()
    store = db if isinstance(db, Store) else open_store(db, create=False)
    try:
        return document(store.releases(publishing.app), publishing, first_week=store.first_week())
    finally:
        if store is not db:
            store.close()
