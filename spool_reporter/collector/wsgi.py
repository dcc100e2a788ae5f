"""``application`` for a production WSGI server, configured from the environment.

::

    SPOOL_REPORTER_COLLECTOR_DB=/var/lib/spool-collector/events.sqlite3 \\
        gunicorn --workers 2 --threads 4 --bind 127.0.0.1:8000 spool_reporter.collector.wsgi:application

``SPOOL_REPORTER_COLLECTOR_DB`` (required) is the SQLite file. Forwarding to GA4 is on when both
``SPOOL_REPORTER_GA4_MEASUREMENT_ID`` and ``SPOOL_REPORTER_GA4_API_SECRET`` are set.
``SPOOL_REPORTER_COLLECTOR_MIN_COUNT`` (default 10) is the fewest developers a public number may count.
"""

from __future__ import annotations

import os

from . import Collector, CollectorError, GA4Forwarder, make_app
from ._public import MIN_COUNT, MIN_COUNT_VARIABLE, parse_min_count

DB_VARIABLE = "SPOOL_REPORTER_COLLECTOR_DB"
MEASUREMENT_ID_VARIABLE = "SPOOL_REPORTER_GA4_MEASUREMENT_ID"
API_SECRET_VARIABLE = "SPOOL_REPORTER_GA4_API_SECRET"  # noqa: S105 - the variable's name, not a secret


def from_environ(environ: dict[str, str] | None = None) -> Collector:
    """Build the application from ``environ`` (default :data:`os.environ`)."""
    env = dict(os.environ if environ is None else environ)
    db = env.get(DB_VARIABLE, "")
    if not db:
        msg = f"set {DB_VARIABLE} to the collector's SQLite file"
        raise CollectorError(msg)
    measurement_id, secret = env.get(MEASUREMENT_ID_VARIABLE, ""), env.get(API_SECRET_VARIABLE, "")
    forward = GA4Forwarder(measurement_id=measurement_id, api_secret=secret) if measurement_id and secret else None
    try:
        min_count = parse_min_count(env.get(MIN_COUNT_VARIABLE) or str(MIN_COUNT))
    except ValueError as exc:
        msg = f"{MIN_COUNT_VARIABLE}: {exc}"
        raise CollectorError(msg) from None
    return make_app(db, forward=forward, min_count=min_count)


def __getattr__(name: str) -> Collector:
    # Built on first access, so that importing this module (e.g. to read its docs) needs no configuration.
    if name == "application":
        app = from_environ()
        globals()["application"] = app
        return app
    raise AttributeError(name)
