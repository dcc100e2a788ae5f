"""``application`` for a production WSGI server, configured from the environment.

::

    SPOOL_REPORTER_COLLECTOR_DB=postgresql://collector@db.internal/spool \\
        gunicorn --workers 4 --threads 4 --bind 127.0.0.1:8000 spool_reporter.collector.wsgi:application

``SPOOL_REPORTER_COLLECTOR_DB`` (required) is the SQLite file or the ``postgresql://`` URL; the other
settings are in :mod:`spool_reporter.collector._config` (maximum event age, per-client weekly cap, the
applications and their commands, the retention). Forwarding to GA4 is on when both ``SPOOL_REPORTER_GA4_MEASUREMENT_ID``
and ``SPOOL_REPORTER_GA4_API_SECRET`` are set. ``SPOOL_REPORTER_COLLECTOR_EPSILON`` (default 1) is the
privacy budget of the public releases, ``SPOOL_REPORTER_COLLECTOR_MIN_COUNT`` (default 10) their display
threshold and ``SPOOL_REPORTER_COLLECTOR_DATA_LICENSE`` (default ``CC-BY-4.0``) their licence.
``SPOOL_REPORTER_COLLECTOR_RETIRED=1`` (``serve --retired``) answers every batch ``410 Gone``: each client that
receives it stops reporting to this collector and deletes its queue (docs/collector.md, "Retiring a collector").
The schema is created or migrated when the application is first built (each gunicorn worker does it; a lock makes
it happen once).
"""

from __future__ import annotations

import os

from . import Collector, GA4Forwarder, make_app
from ._common import VARIABLES
from ._config import from_environ as _settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = ["API_SECRET_VARIABLE", "DB_VARIABLE", "MEASUREMENT_ID_VARIABLE", "MIN_COUNT_VARIABLE", "from_environ"]

# The public names of the variables this module reads; their one home is ``_common.VARIABLES``.
DB_VARIABLE: Final = VARIABLES.db
MIN_COUNT_VARIABLE: Final = VARIABLES.min_count
MEASUREMENT_ID_VARIABLE: Final = VARIABLES.forward_ga4
API_SECRET_VARIABLE: Final = VARIABLES.ga4_api_secret


def from_environ(environ: dict[str, str] | None = None) -> Collector:
    """Build the application from ``environ`` (default :data:`os.environ`)."""
    env = dict(os.environ if environ is None else environ)
    settings = _settings(env)
    measurement_id, secret = env.get(MEASUREMENT_ID_VARIABLE, ""), env.get(API_SECRET_VARIABLE, "")
    forward = GA4Forwarder(measurement_id=measurement_id, api_secret=secret) if measurement_id and secret else None
    return make_app(
        settings.db,
        forward=forward,
        policy=settings.policy,
        limits=settings.limits,
        publishing=settings.publishing,
        retention=settings.retention,
        retired=settings.retired,
    )


def __getattr__(name: str) -> Collector:
    # Built on first access, so that importing this module (e.g. to read its docs) needs no configuration.
    if name == "application":
        app = from_environ()
        globals()["application"] = app
        return app
    raise AttributeError(name)
