"""Values the docs quote from the code, read from the code at build time.

``{spool-generated} fixed-values`` renders a table of the constants that shape behaviour (caps, sizes,
timeouts, back-off), each read from the module that defines it. A constant that disappears or is renamed
is a warning, so ``sphinx-build -W`` fails and the page is fixed instead of quietly going stale.
"""

from __future__ import annotations

import importlib
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging
from spool_generated import REPO, register, table

logger = logging.getLogger(__name__)


def _size(n: int) -> str:
    if n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)} MiB ({n:,} bytes)"
    if n % 1024 == 0:
        return f"{n // 1024} KiB ({n:,} bytes)"
    return f"{n:,} bytes"


def _seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:g} ms"
    if s >= 3600 and s % 3600 == 0:
        return f"{s / 3600:g} h ({s:g} s)"
    return f"{s:g} s"


def _count(n: int) -> str:
    return f"{n:,}"


FACTS: tuple[tuple[str, str, str, Any], ...] = (
    ("default `max_events` (count cap)", "spool_reporter._hook", "MAX_EVENTS", _count),
    ("default `max_bytes` (size cap)", "spool_reporter._hook", "MAX_BYTES", _size),
    ("active spool file sealed at", "spool_reporter._hook", "SEGMENT_BYTES", _size),
    ("longest wait for the spool lock inside a command", "spool_reporter._hook", "LOCK_WAIT_SECONDS", _seconds),
    ("one-line segments kept beside a busy lock, at most", "spool_reporter._hook", "MAX_ASIDE", _count),
    ("largest spool line accepted", "spool_reporter._event", "MAX_LINE_BYTES", _size),
    ("largest config or policy file trusted", "spool_reporter._hook", "MAX_CONFIG_BYTES", _size),
    ("flusher: whole-run deadline, DNS included", "spool_reporter._settings", "DEADLINE", _seconds),
    ("flusher: connect timeout per request", "spool_reporter._settings", "CONNECT_TIMEOUT", _seconds),
    ("flusher: read (inactivity) timeout per request", "spool_reporter._settings", "READ_TIMEOUT", _seconds),
    ("back-off after the first failure (doubles, with jitter)", "spool_reporter._settings", "BACKOFF_BASE", _seconds),
    ("longest back-off, and cap on `Retry-After`", "spool_reporter._settings", "BACKOFF_CAP", _seconds),
    ("background flusher started at most every", "spool_reporter._hook", "SPAWN_INTERVAL", _seconds),
    ("... unless the active spool is larger than", "spool_reporter._hook", "SPAWN_THRESHOLD_BYTES", _size),
    ("record of sent requests rotated at", "spool_reporter._sent", "SENT_FILE_BYTES", _size),
)


def generate_fixed_values(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    app.env.note_dependency(REPO / "spool_reporter")  # a folder: re-read on every build
    rows = []
    for what, module_name, attr, fmt in FACTS:
        try:
            value = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            logger.warning(
                "code_facts: %s.%s is gone (%s); update docs/_ext/code_facts.py",
                module_name,
                attr,
                exc,
                location=docname,
            )
            continue
        rows.append([what, fmt(value), f"`{module_name.rsplit('.', 1)[-1]}.{attr}`"])
    return table(["what", "value", "constant"], rows)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("spool_generated")
    register("fixed-values", generate_fixed_values)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
