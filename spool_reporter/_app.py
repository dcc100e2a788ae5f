"""The description of a reporting application: who is counted, and where its files and switches are.

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports; this module names it.
"""

from __future__ import annotations

from ._hot import (
    MAX_NAME,
    STATE_APPNAME,
    App,
    coarse_version,
    django_app,
)

__all__ = [
    "App",
    "MAX_NAME",
    "STATE_APPNAME",
    "coarse_version",
    "django_app",
]
