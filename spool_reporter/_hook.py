"""The hot path: consent, the event line, lock + append, the one-time notice, maybe a flusher.

Everything here runs inside the user's command, so (docs/how-it-works.md):

* it imports only the standard library modules a Django process already has (``os``, ``sys``, ``time``,
  ``stat``, ``fcntl``) and our own small modules: no ``filelock``, ``urllib3``, ``platformdirs``, ``uuid``,
  ``platform`` or ``json``;
* it never touches the network, never resolves a name, never calls ``fsync``;
* it never raises and never prints, except the one-time notice and the ``<P>_ANALYTICS_DEBUG`` echo.
  Do not log here.

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports (the first run also loads
:mod:`spool_reporter._firstrun`); this module names it.
"""

from __future__ import annotations

from ._firstrun import notice_text
from ._hot import (
    FLUSHER_ENV,
    ensure_client_id,
    record_event,
    state_dir,
)
from ._hot import _int_setting as _int_setting  # noqa: PLC0414 - re-exported for the flusher

__all__ = [
    "FLUSHER_ENV",
    "ensure_client_id",
    "notice_text",
    "record_event",
    "state_dir",
]
