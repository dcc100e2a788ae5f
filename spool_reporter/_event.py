"""The event: exactly the allowlisted fields, serialised as one JSON line without importing :mod:`json`.

The allowlist (MISSION feature 2, docs/what-is-sent.md):

=====================  ==========================================  ==========================
field                  meaning                                     example
=====================  ==========================================  ==========================
``schema``             version of this layout                      ``1``
``event_id``           random uuid4, for de-duplication            ``"0b6f…"``
``event``              the command name                            ``"startproject"``
``app``                application name                            ``"Django"``
``app_version``        application major.minor                     ``"5.2"``
``python``             implementation                              ``"CPython"``
``python_version``     major.minor                                 ``"3.11"``
``os``                 OS family                                   ``"Linux"``
``os_release``         coarse release                              ``"6.1"``
``arch``               machine architecture                        ``"x86_64"``
``user_agent``         DEP 8's User-Agent                          ``"Django/5.2 CPython/3.11 (Linux; x86_64)"``
``client_id``          random uuid4 kept in the user config file   ``"5d1c…"``
``time``               when it happened, UTC, whole seconds         ``"2026-12-03T08:15:48Z"``
=====================  ==========================================  ==========================

Nothing else is ever recorded: no argument, path, host name, user name or environment value. The hook builds the
line (:func:`spool_reporter._hook.build_line`, without importing :mod:`json`, :mod:`uuid` or :mod:`platform`). This
module holds the allowlist and the one validator that both sides apply (:func:`check`, :func:`validate`): the
flusher before it sends (``spool_reporter/_spool.py`` reads every spooled line through it, and the ``json``
transport checks the time window), the collector for each event it receives
(``spool_reporter/collector/_wire.py``). A value is judged against a vocabulary, not only a length:

- every string is printable ASCII of at most :data:`MAX_VALUE` characters;
- ``event_id`` and ``client_id`` are canonical uuid4s; ``event`` is a name GA4 would accept (and, at the
  collector, one of the application's commands: :data:`DJANGO_COMMANDS` for Django);
- ``app`` is a name an :class:`~spool_reporter.App` accepts; ``app_version`` is ``major.minor`` (or ``major``),
  ``python_version`` is ``major.minor``, ``os_release`` is ``major[.minor]`` or ``unknown``, within
  :data:`VERSION_BOUNDS`;
- ``python``, ``os`` and ``arch`` come from :data:`PYTHON_IMPLEMENTATIONS`, :data:`OS_FAMILIES` and
  :data:`ARCHITECTURES`, each with an ``"other"`` value (what the hook sends for anything else);
- ``user_agent`` is exactly the one derived from the other fields (:func:`format_user_agent`);
- ``time`` is a real UTC time in the one format; with ``now`` given, at most ``max_age`` seconds old
  (:data:`MAX_AGE_SECONDS`, 30 days, by default) and at most :data:`MAX_FUTURE_SECONDS` ahead.

:func:`check` names the first rule an event breaks with one word of :data:`REASONS` (a fixed vocabulary:
the collector counts refusals by it, and never stores a client's text).
"""

from __future__ import annotations

import datetime
import functools
import re

# The hook builds every event line and imports nothing of the cold path, so the line's helpers live there; the
# collector takes them from here, the wire format's one doorway, and never imports the hook itself.
from ._hook import (
    ARCH,
    MAX_NAME,
    SCHEMA_VERSION,
    format_user_agent,
    is_uuid4,
    iso_time,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "ARCHITECTURES",
    "check",
    "DJANGO_COMMANDS",
    "FIELDS",
    "format_user_agent",
    "is_uuid4",
    "iso_time",
    "MAX_AGE_SECONDS",
    "MAX_FUTURE_SECONDS",
    "MAX_LINE_BYTES",
    "MEMO_SIZE",
    "MAX_VALUE",
    "OS_FAMILIES",
    "OTHER",
    "parse_time",
    "PYTHON_IMPLEMENTATIONS",
    "REASONS",
    "SCHEMA_VERSION",
    "validate",
    "window_problem",
]


FIELDS: Final = (
    "schema",
    "event_id",
    "event",
    "app",
    "app_version",
    "python",
    "python_version",
    "os",
    "os_release",
    "arch",
    "user_agent",
    "client_id",
    "time",
)
"""The allowlist, in serialisation order."""


MAX_LINE_BYTES: Final = 1024
"""A spooled line longer than this is not one of ours (ours are about 420 bytes)."""

MAX_VALUE: Final = 100
"""The longest string field (GA4's parameter-value limit; ours are far shorter)."""

OTHER: Final = "other"
"""The value the hook sends for an implementation, OS family or architecture outside the vocabularies."""

PYTHON_IMPLEMENTATIONS: Final = frozenset({"CPython", "PyPy", "GraalPy", OTHER})
"""``sys.implementation.name`` as the hook names it (``spool_reporter/_hook.py``, ``_python``)."""

OS_FAMILIES: Final = frozenset({"Linux", "macOS", "Windows", "FreeBSD", "OpenBSD", "NetBSD", OTHER})
"""The OS families the hook names (``spool_reporter/_hook.py``, ``_os``); anything else is ``"other"``."""

ARCHITECTURES: Final = frozenset({*ARCH.values(), OTHER})
"""The hook's folded machine names (``spool_reporter/_hook.py``, ``ARCH``); anything else is ``"other"``."""

DJANGO_COMMANDS: Final = frozenset(("startproject", "startapp", "runserver"))
"""DEP 8's three commands: the Django integration's rules table (``spool_reporter/django/_rules.py``,
``COMMANDS``; a test holds the two equal) without importing the Django integration here."""

VERSION_BOUNDS: Final = {"app_version": (999, 999), "python_version": (9, 99), "os_release": (9999, 9999)}
"""Largest major and minor accepted: Django 5.2 and Python 3.13 are far inside, a forged ``7777.1`` is not."""

MAX_AGE_SECONDS: Final = 30 * 86400
"""Default oldest event accepted: a laptop offline for a month still counts; a week can close after that."""

MAX_FUTURE_SECONDS: Final = 86400
"""Newest event accepted, ahead of the receiver's clock: time zones are UTC here, so only clock skew."""

REASONS: Final = ("shape", *FIELDS, "command", "too_old", "future")
"""Every answer :func:`check` can give: ``shape`` (not an object with exactly :data:`FIELDS`, or a value that
is not a printable ASCII string), a field's name (its value breaks that field's rule), ``command`` (a valid
name outside the application's commands), ``too_old`` and ``future`` (outside the time window)."""

_FIELD_SET: Final = frozenset(FIELDS)
_STRINGS: Final = FIELDS[1:]
# Compiled patterns and small memos: the collector checks every event of every batch (a few us an event).
_UUID4: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
_VERSION: Final = re.compile(r"(0|[1-9][0-9]{0,3})(?:\.(0|[1-9][0-9]{0,3}))?\Z")
_TIME: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)Z\Z")
_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}\Z")  # is_event_name, compiled
_APP_NAME: Final = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAME}}}\Z")  # App(name=...)'s rule, compiled
MEMO_SIZE: Final = 4096
"""Entries kept per memo (``functools.lru_cache``) of the validator: one machine sends the same facts every time,
and the time window keeps the set of days small."""


@functools.lru_cache(maxsize=MEMO_SIZE)
def _version(text: str, field: str) -> bool:
    # ``major.minor`` (``major`` alone where allowed), no leading zeros (coarse_version strips them), bounded.
    m = _VERSION.match(text)
    ok = False
    if m is not None:
        major_bound, minor_bound = VERSION_BOUNDS[field]
        minor = m.group(2)
        if minor is None:
            ok = field != "python_version" and int(m.group(1)) <= major_bound
        else:
            ok = int(m.group(1)) <= major_bound and int(minor) <= minor_bound
    return ok


def parse_time(text: str) -> int | None:
    """``"2026-12-03T08:15:48Z"`` -> seconds since the epoch; ``None`` unless a real UTC time in that exact form.

    Hand-parsed (``time.strptime`` costs ~7 us, and the collector parses every event). A leap second
    (``:60``) is a real time and counts as the next second.
    """
    m = _TIME.match(text)
    if m is None:
        return None
    days = _day_number(text[:10])
    if days is None:
        return None
    hour, minute, second = m.groups()
    return days * 86400 + int(hour) * 3600 + int(minute) * 60 + int(second)


_EPOCH_ORDINAL: Final = datetime.date(1970, 1, 1).toordinal()


@functools.lru_cache(maxsize=MEMO_SIZE)
def _day_number(day: str) -> int | None:
    """``"2026-12-03"`` -> days since 1970-01-01; ``None`` for a day that does not exist."""
    try:
        return datetime.date(int(day[0:4]), int(day[5:7]), int(day[8:10])).toordinal() - _EPOCH_ORDINAL
    except ValueError:  # 2023-02-29, month 13, year 0
        return None


@functools.lru_cache(maxsize=MEMO_SIZE)
def _facts_problem(facts: tuple[str, ...]) -> str | None:
    """The rule broken by (event, app, app_version, python, python_version, os, os_release, arch, user_agent)."""
    name, app, app_version, python, python_version, family, release, arch, agent = facts
    if _NAME.match(name) is None:
        return "event"
    if _APP_NAME.match(app) is None:
        return "app"
    if not _version(app_version, "app_version"):
        return "app_version"
    if python not in PYTHON_IMPLEMENTATIONS:
        return "python"
    if not _version(python_version, "python_version"):
        return "python_version"
    if family not in OS_FAMILIES:
        return "os"
    if release != "unknown" and not _version(release, "os_release"):
        return "os_release"
    if arch not in ARCHITECTURES:
        return "arch"
    if agent != format_user_agent(app, app_version, impl=python, pyver=python_version, family=family, arch=arch):
        return "user_agent"
    return None


def window_problem(epoch: int, *, now: float, max_age: float = MAX_AGE_SECONDS) -> str | None:
    """``"too_old"``, ``"future"`` or ``None``: whether an event at ``epoch`` is inside the time window."""
    if epoch < now - max_age:
        return "too_old"
    if epoch > now + MAX_FUTURE_SECONDS:
        return "future"
    return None


def check(
    obj: object,
    *,
    now: float | None = None,
    max_age: float = MAX_AGE_SECONDS,
    commands: frozenset[str] | None = None,
) -> str | None:
    """The first rule ``obj`` (a parsed event) breaks, as one word of :data:`REASONS`; ``None`` if it is valid.

    :param now: the receiver's clock; ``None`` skips the time window (the format is checked all the same).
    :param max_age: the oldest event accepted, in seconds before ``now``.
    :param commands: the event names accepted for this event's ``app``; ``None`` accepts any valid name.
    """
    if type(obj) is not dict or obj.keys() != _FIELD_SET:
        return "shape"
    e: dict[str, object] = obj
    if type(e["schema"]) is not int or e["schema"] != SCHEMA_VERSION:  # not True, which == 1
        return "schema"
    for key in _STRINGS:
        # Each field's own rule below admits only printable ASCII of at most MAX_VALUE characters.
        if type(e[key]) is not str:
            return "shape"
    s: dict[str, str] = e  # type: ignore[assignment]  # every field but schema is a str, checked above
    if _UUID4.match(s["event_id"]) is None:
        return "event_id"
    if _UUID4.match(s["client_id"]) is None:
        return "client_id"
    # The descriptive fields repeat across events (one machine sends the same facts every time): judge each
    # combination once, then look it up.
    facts = (s["event"], s["app"], s["app_version"], s["python"], s["python_version"], s["os"], s["os_release"],
             s["arch"], s["user_agent"])  # fmt: skip
    reason = _facts_problem(facts)
    if reason is not None:
        return reason
    if commands is not None and facts[0] not in commands:
        return "command"
    epoch = parse_time(s["time"])
    if epoch is None:
        return "time"
    if now is not None:
        return window_problem(epoch, now=now, max_age=max_age)
    return None


def validate(
    obj: object,
    *,
    now: float | None = None,
    max_age: float = MAX_AGE_SECONDS,
    commands: frozenset[str] | None = None,
) -> dict[str, object] | None:
    """``obj`` if it is a valid event (:func:`check` finds nothing), else ``None``.

    Used by the flusher (cold path) so that a planted or corrupt line never leaves the machine, and by the
    collector for every event it receives.
    """
    if check(obj, now=now, max_age=max_age, commands=commands) is not None:
        return None
    return obj  # type: ignore[return-value]  # check() proved it a dict
