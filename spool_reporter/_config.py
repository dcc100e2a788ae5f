"""Reading the small ``key=value`` files: the user's ``djangoanalytics`` and a distributor's policy.

DEP 8 keeps the user's choice in ``~/.config/djangoanalytics``; we keep its shape: one ``key=value`` a line,
``#`` or ``;`` comments, blank lines, and ``[section]`` headers ignored (so an INI-style file is read too).
Reading never follows a FIFO into a block, never reads more than :data:`MAX_CONFIG_BYTES`, and reports a
file it cannot trust as :data:`BROKEN`, which the consent rules treat as "off".

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports; this module names it.
"""

from __future__ import annotations

from ._hot import (
    BROKEN,
    MAX_CONFIG_BYTES,
    is_broken,
    parse,
    read,
)

__all__ = [
    "BROKEN",
    "MAX_CONFIG_BYTES",
    "is_broken",
    "parse",
    "read",
]
