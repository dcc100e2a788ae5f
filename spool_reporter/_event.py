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

Nothing else is ever recorded: no argument, path, host name, user name or environment value.
``uuid`` and ``platform`` cost ~1 ms to import, more than the hook's whole budget, so uuid4 and the OS facts
are computed here with :func:`os.urandom`, :func:`os.uname` and :data:`sys.implementation`; the tests check
them against :mod:`uuid` and :mod:`platform`.

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports; this module names it.
It adds the allowlist check the flusher applies (:func:`validate`).
"""

from __future__ import annotations

from ._hot import (
    SCHEMA_VERSION,
    build_line,
    format_user_agent,
    is_event_name,
    is_uuid4,
    iso_time,
    platform_facts,
    user_agent,
    uuid4,
)
from ._hot import _quote as _quote  # noqa: PLC0414 - re-exported for the cold path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "FIELDS",
    "MAX_LINE_BYTES",
    "SCHEMA_VERSION",
    "build_line",
    "format_user_agent",
    "is_event_name",
    "is_uuid4",
    "iso_time",
    "platform_facts",
    "user_agent",
    "uuid4",
    "validate",
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


def validate(obj: object) -> dict[str, object] | None:
    """Check a parsed spool line: exactly the allowlisted fields with sane types, or ``None``.

    Used by the flusher (cold path) so that a planted or corrupt line never leaves the machine.
    """
    if not isinstance(obj, dict) or set(obj) != set(FIELDS):
        return None
    if obj["schema"] != SCHEMA_VERSION:
        return None
    for key in FIELDS[1:]:
        value = obj[key]
        if not isinstance(value, str) or not value or len(value) > 100 or not value.isprintable():
            return None
    if not (is_uuid4(obj["event_id"]) and is_uuid4(obj["client_id"]) and is_event_name(obj["event"])):
        return None
    t = obj["time"]
    if len(t) != 20 or t[4] != "-" or t[10] != "T" or t[-1] != "Z":
        return None
    return obj
