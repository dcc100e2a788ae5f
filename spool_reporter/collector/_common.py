"""The collector's shared vocabulary: its errors, the values its parts hand each other, the reasons it refuses
an event for, the defaults of what it publishes, and the names of the environment variables it reads.

Every other module of the collector builds on these: the store, the releases, the public page, the servers
and the command line (whose ``--help`` shows these defaults, so building the parser must stay cheap: this
module needs only the standard library and the event's field list). Nothing here touches a database.
"""

from __future__ import annotations

import math
import os

from spool_reporter import SpoolReporterError
from spool_reporter._event import FIELDS, MAX_AGE_SECONDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final, NamedTuple
else:
    from typing import NamedTuple


# -- errors ----------------------------------------------------------------------------------------------------


class CollectorError(SpoolReporterError):
    """The collector cannot do what was asked (a missing database, an unusable configuration)."""


class Unavailable(CollectorError):
    """The database is busy or unreachable for now: answered ``503`` with ``Retry-After``."""


class NotACollectorDatabase(CollectorError):
    """``create=False`` and the database holds no collector tables (a SQLite file missing or of another program,
    a PostgreSQL database never migrated): ``collector migrate`` or ``serve`` would create them."""


class StoreClosed(CollectorError):
    """The store was closed (:meth:`Store.close`) and opens no connection any more: a roll-up thread still running
    when the application shut down gets this, and has nothing to report."""


# -- what a row holds, and the values handed around ------------------------------------------------------------

COLUMNS: Final = (*(f for f in FIELDS if f not in ("schema", "user_agent")), "week")
"""The stored columns: :data:`~spool_reporter._event.FIELDS` minus ``schema`` and ``user_agent``, plus ``week``."""


class Row(NamedTuple):
    """One event as stored: the fields of :data:`COLUMNS`, in that order (a plain tuple of them converts with
    ``Row._make``)."""

    event_id: str
    event: str
    app: str
    app_version: str
    python: str
    python_version: str
    os: str
    os_release: str
    arch: str
    client_id: str
    time: str
    """The day only (``"2026-12-03"``) once stored; a batch's row may still carry the whole time."""
    week: str
    """The ISO week of :attr:`time` (``"2026-W49"``)."""


assert Row._fields == COLUMNS, "Row and COLUMNS must name the same fields in one order"


class Release(NamedTuple):
    """One public release (:mod:`._release`): made once, stored, served as it is, never changed."""

    app: str
    period: str
    """``"2026-W49"`` (a week), ``"2026-12"`` (a month), ``"2026-Q4"`` (a quarter) or ``"2026"`` (a year)."""
    kind: str
    """``"provisional"`` (a week that ended but is still open) or ``"final"``."""
    made: str
    """When it was made (UTC, ``"2027-01-04T01:00:00Z"``)."""
    epsilon: float
    """The privacy budget this release spent on each developer in it."""
    body: str
    """The released numbers as JSON (:func:`._release.make`): noisy counts, never a true one."""


DEFAULT_MAX_AGE_DAYS: Final = MAX_AGE_SECONDS // 86400
"""The oldest event a collector accepts by default, in days (``--max-age-days``): the client's own time window."""


class Limits(NamedTuple):
    """Per-store limits on what is kept."""

    per_client_week: int = 1000
    """Events stored per client id per ISO week; beyond that they are refused and counted as ``over_cap``.
    A developer who runs ``runserver`` a hundred times a day stays far below; ``0`` turns the cap off."""


class Retention(NamedTuple):
    """How long raw events are kept, and how often the collector rolls closed weeks up (:mod:`._rollup`)."""

    retain_days: float = 430
    """Raw events older than this are deleted once their week is rolled up. A year's public release needs its
    first events until the week of its 31 December closes: 366 + the maximum event age (30) + 6 days in the
    worst case (402), and 430 leaves four weeks of slack for a roll-up that did not run (:mod:`._release`).
    The roll-ups and the releases, which hold no client id, are kept."""
    rollup_every: float = 3600
    """Seconds between two roll-ups started by ingest in one process (``0``: only ``collector rollup``)."""


# -- why an event is refused -----------------------------------------------------------------------------------

OVER_CAP: Final = "over_cap"
"""The refusal reason of an event beyond :attr:`Limits.per_client_week`."""

TOO_OLD: Final = "too_old"
"""The refusal reason of an event of a week already closed (:data:`spool_reporter._event.REASONS`' own word for
an event outside the time window: a collector process with a longer ``--max-age-days`` than the one that
closed the week would otherwise add to numbers that are final)."""

FORGET_REFUSED: Final = "forget"
"""The refusal reason of a ``POST /v1/forget`` refused (not a client id, not the request's shape)."""

FORGOTTEN: Final = "forgotten"
"""The refusal reason of an event whose client id was forgotten (:meth:`Store.forget`)."""


# -- the database named by --db --------------------------------------------------------------------------------

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")
"""A ``--db`` value that starts with one of these is a PostgreSQL connection URL; anything else a SQLite path."""


def is_postgres(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a PostgreSQL database (a ``postgresql://`` URL) rather than a SQLite file."""
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


# -- what is published, by default -----------------------------------------------------------------------------

DEFAULT_APP: Final = "Django"
"""The application whose weeks are counted and released unless another is asked for (DEP 8 is about Django)."""

EPSILON: Final = 1.0
"""The default budget (``--epsilon``): per developer for each week (both its releases together), and for each
month, quarter and year."""

MAX_EPSILON: Final = 10.0
"""The largest ε accepted: beyond it the noise no longer protects anyone, and "private" would be a false word."""

MIN_COUNT: Final = 10
"""The default display threshold: a released count below it is shown as "fewer than 10"."""

LICENCE: Final = "CC-BY-4.0"
"""The default licence of the released numbers (``--data-license``): Creative Commons Attribution 4.0."""


class Publishing(NamedTuple):
    """What the collector publishes, and how: read by the roll-up (which makes releases) and the public routes."""

    epsilon: float = EPSILON
    """The budget per developer: for each week (its releases together), and for each month, quarter and year."""
    app: str = DEFAULT_APP
    """The application whose numbers are released."""
    min_count: int = MIN_COUNT
    """The display threshold: a released count below it is shown as "fewer than N" (post-processing: it spends no
    budget and protects nobody by itself; the noise does that)."""
    licence: str = LICENCE
    """The licence the downloads and the page state (an SPDX identifier or a URL)."""


def check_epsilon(epsilon: float) -> float:
    """``epsilon`` if it is a usable budget (above 0, at most :data:`MAX_EPSILON`); :exc:`ValueError` otherwise."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon <= MAX_EPSILON:
        msg = f"epsilon must be a number above 0 and at most {MAX_EPSILON:g}, got {epsilon!r}"
        raise ValueError(msg)
    return float(epsilon)


def parse_epsilon(text: str) -> float:
    """``--epsilon``'s text as a budget; :exc:`ValueError` with the rule otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        msg = f"epsilon must be a number above 0 and at most {MAX_EPSILON:g}, got {text!r}"
        raise ValueError(msg)
    return check_epsilon(value)


def parse_min_count(text: str) -> int:
    """``text`` as a display threshold: a whole number of at least 1. Raises :exc:`ValueError`."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) < 1:
        msg = f"the minimum count must be a whole number of at least 1, got {text!r}"
        raise ValueError(msg)
    return int(value)


def check_min_count(min_count: int) -> int:
    """``min_count`` if it is a valid display threshold (at least 1); raises :exc:`ValueError` otherwise."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        msg = f"min_count must be a whole number of at least 1, got {min_count!r}"
        raise ValueError(msg)
    return min_count


# -- the paths the collector answers (with their methods and handlers: ``_wsgi.ROUTES``) -----------------------

BATCH_PATH: Final = "/v1/batch"
"""``POST`` a batch of the ``json`` transport's events."""

GA4_PATH: Final = "/mp/collect"
"""GA4-shaped payloads (the ``ga4`` transport's requests); the query string is ignored."""

FORGET_PATH: Final = "/v1/forget"
"""``POST`` a client id to delete its stored events (``django-spool forget``)."""

HEALTH_PATH: Final = "/v1/health"
"""``GET``: ``{"ok": true}``, without touching the database (for a load balancer or a monitor)."""

PAGE_PATH: Final = "/"
"""``GET /``: the public page (:func:`~spool_reporter.collector._public_page.render_public` of
:func:`._public.document`)."""

STATS_PATH: Final = "/v1/stats"
"""``GET /v1/stats``: :func:`._public.document` as JSON."""

RELEASES_JSON_PATH: Final = "/v1/releases.json"
"""``GET /v1/releases.json``: every release as released (:func:`._public.releases_json`)."""

RELEASES_CSV_PATH: Final = "/v1/releases.csv"
"""``GET /v1/releases.csv``: every released number, one per row (:func:`._public.releases_csv`)."""


# -- the environment variables the collector reads -------------------------------------------------------------


class Variables(NamedTuple):
    """The names of the environment variables the collector reads, a field for each setting, named as the
    command-line option it stands for (``max_age_days`` is ``--max-age-days``, ``forward_ga4`` the measurement id
    ``serve --forward-ga4`` takes). ``_config.from_environ`` reads them all for ``wsgi.py``; the command line reads
    ``db`` when ``--db`` is not given, and ``ga4_api_secret``, which no option takes. Use :data:`VARIABLES`."""

    db: str = "SPOOL_REPORTER_COLLECTOR_DB"
    max_age_days: str = "SPOOL_REPORTER_COLLECTOR_MAX_AGE_DAYS"
    max_per_client_week: str = "SPOOL_REPORTER_COLLECTOR_CLIENT_CAP"
    commands: str = "SPOOL_REPORTER_COLLECTOR_COMMANDS"
    min_count: str = "SPOOL_REPORTER_COLLECTOR_MIN_COUNT"
    epsilon: str = "SPOOL_REPORTER_COLLECTOR_EPSILON"
    data_license: str = "SPOOL_REPORTER_COLLECTOR_DATA_LICENSE"
    retain_days: str = "SPOOL_REPORTER_COLLECTOR_RETAIN_DAYS"
    rollup_every: str = "SPOOL_REPORTER_COLLECTOR_ROLLUP_EVERY"
    retired: str = "SPOOL_REPORTER_COLLECTOR_RETIRED"
    forward_ga4: str = "SPOOL_REPORTER_GA4_MEASUREMENT_ID"
    # Never an option: on the command line, ``ps`` would show the secret.
    ga4_api_secret: str = "SPOOL_REPORTER_GA4_API_SECRET"  # noqa: S105 - a variable's name, not a secret


VARIABLES: Final = Variables()
"""The one table of the collector's environment variables' names (public: ``docs/collector.md`` lists them)."""
