"""The collector's settings, from the command line or the environment: one parser for both.

Each setting has an option (``--max-age-days``) and an environment variable, named in one table,
:data:`~._common.VARIABLES` (``VARIABLES.max_age_days``); ``docs/collector.md`` lists them with their defaults,
which are :mod:`._common`'s. The command line parses its options with argparse and checks their values here
(:func:`policy`, :func:`limits`, :func:`retention`); :func:`from_environ` reads the variables for ``wsgi.py``.

In the environment, several ``--commands`` values are separated by ``;``, and the switch ``serve --retired``
is ``VARIABLES.retired=1`` (:func:`parse_switch`).
"""

from __future__ import annotations

from spool_reporter._event import MAX_FUTURE_SECONDS, check

from ._common import (
    DEFAULT_MAX_AGE_DAYS,
    EPSILON,
    LICENCE,
    MIN_COUNT,
    VARIABLES,
    CollectorError,
    Limits,
    Publishing,
    Retention,
    parse_epsilon,
    parse_min_count,
)
from ._rollup import check_retention
from ._wire import ANY_COMMAND, DEFAULT_COMMANDS, Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Final, NamedTuple
else:
    from typing import NamedTuple

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


def parse_switch(env: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: ``1``, ``true``, ``yes`` or ``on`` is yes; empty, ``0``, ``false``, ``no`` or ``off``
    is no; anything else is a :class:`CollectorError` (a typo must not leave a retired collector taking
    batches, nor retire one by accident)."""
    text = env.get(name, "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    msg = f"{name} must be 1 (yes) or 0 (no), got {text!r}"
    raise CollectorError(msg)


class Settings(NamedTuple):
    """The collector's settings read from the environment (:func:`from_environ`)."""

    db: str
    policy: Policy
    limits: Limits
    publishing: Publishing
    retention: Retention
    retired: bool = False
    """Answer every batch ``410 Gone`` (``serve --retired``): the collector retires itself (docs/collector.md)."""


def from_environ(env: Mapping[str, str]) -> Settings:
    """The settings from the environment variables (:data:`~._common.VARIABLES`); :class:`CollectorError` for a
    bad one."""
    db = env.get(VARIABLES.db, "").strip()
    if not db:
        msg = f"set {VARIABLES.db} to the collector's SQLite file or postgresql:// URL"
        raise CollectorError(msg)
    commands = [v for v in env.get(VARIABLES.commands, "").split(";") if v.strip()]
    try:
        min_count = parse_min_count(env.get(VARIABLES.min_count, "").strip() or str(MIN_COUNT))
    except ValueError as exc:
        msg = f"{VARIABLES.min_count}: {exc}"
        raise CollectorError(msg) from None
    try:
        epsilon = parse_epsilon(env.get(VARIABLES.epsilon, "").strip() or str(EPSILON))
    except ValueError as exc:
        msg = f"{VARIABLES.epsilon}: {exc}"
        raise CollectorError(msg) from None
    licence = env.get(VARIABLES.data_license, "").strip() or LICENCE
    max_age_days = _number(env, VARIABLES.max_age_days, DEFAULT_MAX_AGE_DAYS, float)
    return Settings(
        db=db,
        policy=policy(max_age_days=max_age_days, commands=commands),
        limits=limits(per_client_week=int(_number(env, VARIABLES.max_per_client_week, Limits().per_client_week, int))),
        publishing=Publishing(epsilon=epsilon, min_count=min_count, licence=licence),
        retention=retention(
            retain_days=_number(env, VARIABLES.retain_days, Retention().retain_days, float),
            rollup_every=_number(env, VARIABLES.rollup_every, Retention().rollup_every, float),
            max_age_days=max_age_days,
        ),
        retired=parse_switch(env, VARIABLES.retired),
    )
