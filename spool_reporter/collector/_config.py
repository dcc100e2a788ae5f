"""The collector's settings, from the command line or the environment: one parser for both.

- ``SPOOL_REPORTER_COLLECTOR_DB`` / ``--db``: the SQLite file or ``postgresql://`` URL (required);
- ``SPOOL_REPORTER_COLLECTOR_MAX_AGE_DAYS`` / ``--max-age-days``: the oldest event accepted (default 30);
- ``SPOOL_REPORTER_COLLECTOR_CLIENT_CAP`` / ``--max-per-client-week``: events kept per client id per week
  (default 1000, ``0`` for no cap);
- ``SPOOL_REPORTER_COLLECTOR_COMMANDS`` / ``--commands APP=CMD,CMD`` (repeated): more applications and their
  event names, ``*`` for any valid name (Django's three commands are accepted unless replaced);
- ``SPOOL_REPORTER_COLLECTOR_MIN_COUNT`` / ``--min-count``: the display threshold of the public numbers: a
  released count below it is shown as "fewer than N" (default 10, :mod:`._public`);
- ``SPOOL_REPORTER_COLLECTOR_EPSILON`` / ``--epsilon``: the privacy budget of the public releases per developer
  per week, and per month, quarter and year (default 1, :mod:`._release`);
- ``SPOOL_REPORTER_COLLECTOR_DATA_LICENSE`` / ``--data-license``: the licence the public numbers are published
  under (default ``CC-BY-4.0``);
- ``SPOOL_REPORTER_COLLECTOR_RETAIN_DAYS`` / ``--retain-days``: how long raw events are kept (default 430;
  at least a week more than the maximum event age, :mod:`._rollup`);
- ``SPOOL_REPORTER_COLLECTOR_ROLLUP_EVERY`` / ``--rollup-every``: seconds between two roll-ups started by
  ingest in one process (default 3600; ``0``: only ``collector rollup``).

In the environment, several ``--commands`` values are separated by ``;``.
"""

from __future__ import annotations

from spool_reporter._event import MAX_FUTURE_SECONDS, check

from ._common import (
    DEFAULT_MAX_AGE_DAYS,
    EPSILON,
    LICENCE,
    MIN_COUNT,
    CollectorError,
    Limits,
    Publishing,
    Retention,
    parse_epsilon,
    parse_min_count,
)
from ._public import MIN_COUNT_VARIABLE
from ._rollup import check_retention
from ._wire import ANY_COMMAND, DEFAULT_COMMANDS, Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Final, NamedTuple
else:
    from typing import NamedTuple

DB_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_DB"
"""``--db`` in the environment."""
MAX_AGE_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_MAX_AGE_DAYS"
"""``--max-age-days`` in the environment."""
CAP_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_CLIENT_CAP"
"""``--max-per-client-week`` in the environment."""
COMMANDS_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_COMMANDS"
"""``--commands`` in the environment (values separated by ``;``)."""
RETAIN_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_RETAIN_DAYS"
"""``--retain-days`` in the environment."""
ROLLUP_EVERY_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_ROLLUP_EVERY"
"""``--rollup-every`` in the environment."""
EPSILON_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_EPSILON"
"""``--epsilon`` in the environment."""
LICENCE_VARIABLE: Final = "SPOOL_REPORTER_COLLECTOR_DATA_LICENSE"
"""``--data-license`` in the environment."""

MAX_AGE_DAYS_LIMIT: Final = 3660
"""The largest ``--max-age-days`` (ten years): anything more is a typo."""


def parse_commands(values: Iterable[str]) -> dict[str, frozenset[str]]:
    """``["MyTool=build,test"]`` -> the default applications plus ``{"MyTool": {"build", "test"}}``.

    A value for an application already present replaces its commands. Names follow the event's rules
    (an application name an ``App`` accepts, GA4-valid command names).
    """
    out = dict(DEFAULT_COMMANDS)
    for value in values:
        app, eq, names = value.partition("=")
        app = app.strip()
        commands = frozenset(n.strip() for n in names.split(",") if n.strip())
        probe = {
            "schema": 1,
            "event_id": "00000000-0000-4000-8000-000000000000",
            "event": "x",
            "app": app,
            "app_version": "1.0",
            "python": "CPython",
            "python_version": "3.12",
            "os": "Linux",
            "os_release": "6.1",
            "arch": "x86_64",
            "user_agent": f"{app}/1.0 CPython/3.12 (Linux; x86_64)",
            "client_id": "00000000-0000-4000-8000-000000000000",
            "time": "2026-01-01T00:00:00Z",
        }
        if not eq or not commands or check(probe) == "app":
            msg = f"--commands takes APP=COMMAND[,COMMAND...], got {value!r}"
            raise CollectorError(msg)
        for name in commands - {ANY_COMMAND}:
            if check({**probe, "event": name}) is not None:
                msg = f"--commands: {name!r} is not a valid event name ([A-Za-z][A-Za-z0-9_]*, at most 40)"
                raise CollectorError(msg)
        out[app] = commands
    return out


def policy(*, max_age_days: float = DEFAULT_MAX_AGE_DAYS, commands: Iterable[str] = ()) -> Policy:
    """A :class:`~._wire.Policy` from the settings' values; :class:`CollectorError` for a bad one."""
    if not 0 < max_age_days <= MAX_AGE_DAYS_LIMIT:
        msg = f"the maximum event age must be 1-{MAX_AGE_DAYS_LIMIT} days, got {max_age_days:g}"
        raise CollectorError(msg)
    if max_age_days * 86400 < MAX_FUTURE_SECONDS:
        msg = "the maximum event age must be at least one day"
        raise CollectorError(msg)
    return Policy(commands=parse_commands(commands), max_age=max_age_days * 86400)


def limits(*, per_client_week: int = Limits().per_client_week) -> Limits:
    if per_client_week < 0:
        msg = f"the per-client weekly cap must be 0 (none) or more, got {per_client_week}"
        raise CollectorError(msg)
    return Limits(per_client_week=per_client_week)


def retention(
    *,
    retain_days: float = Retention().retain_days,
    rollup_every: float = Retention().rollup_every,
    max_age_days: float = DEFAULT_MAX_AGE_DAYS,
) -> Retention:
    """A :class:`~._common.Retention` that fits the maximum event age; :class:`CollectorError` otherwise."""
    return check_retention(Retention(retain_days=retain_days, rollup_every=rollup_every), max_age_days * 86400)


def _number(env: Mapping[str, str], name: str, default: float, kind: type[float] | type[int]) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        msg = f"{name} must be a number, got {text!r}"
        raise CollectorError(msg) from None


class Settings(NamedTuple):
    """The collector's settings read from the environment (:func:`from_environ`)."""

    db: str
    policy: Policy
    limits: Limits
    publishing: Publishing
    retention: Retention


def from_environ(env: Mapping[str, str]) -> Settings:
    """The settings from the environment variables above; :class:`CollectorError` for a bad one."""
    db = env.get(DB_VARIABLE, "").strip()
    if not db:
        msg = f"set {DB_VARIABLE} to the collector's SQLite file or postgresql:// URL"
        raise CollectorError(msg)
    commands = [v for v in env.get(COMMANDS_VARIABLE, "").split(";") if v.strip()]
    try:
        min_count = parse_min_count(env.get(MIN_COUNT_VARIABLE, "").strip() or str(MIN_COUNT))
    except ValueError as exc:
        msg = f"{MIN_COUNT_VARIABLE}: {exc}"
        raise CollectorError(msg) from None
    try:
        epsilon = parse_epsilon(env.get(EPSILON_VARIABLE, "").strip() or str(EPSILON))
    except ValueError as exc:
        msg = f"{EPSILON_VARIABLE}: {exc}"
        raise CollectorError(msg) from None
    licence = env.get(LICENCE_VARIABLE, "").strip() or LICENCE
    max_age_days = _number(env, MAX_AGE_VARIABLE, DEFAULT_MAX_AGE_DAYS, float)
    return Settings(
        db=db,
        policy=policy(max_age_days=max_age_days, commands=commands),
        limits=limits(per_client_week=int(_number(env, CAP_VARIABLE, Limits().per_client_week, int))),
        publishing=Publishing(epsilon=epsilon, min_count=min_count, licence=licence),
        retention=retention(
            retain_days=_number(env, RETAIN_VARIABLE, Retention().retain_days, float),
            rollup_every=_number(env, ROLLUP_EVERY_VARIABLE, Retention().rollup_every, float),
            max_age_days=max_age_days,
        ),
    )
