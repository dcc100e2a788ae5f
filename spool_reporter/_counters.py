"""The spool's counters: what left the queue without being sent, counted in the folder's ``counters`` file.

``counters`` holds ``key=value`` lines: the drop counts ``cap=`` (the caps deleted the oldest segment),
``corrupt=`` (a line that was not a valid event), ``rejected=`` (refused by a 4xx or the destination's limits),
and the events the destination refused inside a 2xx, by its reason (``destination_<reason>=``). Every update is
one whole-file replace under the spool lock. Events turned away beside a busy lock (:func:`~._spool.append_aside`)
are counted without the lock, one byte each in :data:`REFUSED_NAME`. ``status`` shows them all
(:func:`~._spool.summary`).
"""

from __future__ import annotations

from . import _files
from ._hook import COUNTERS_NAME, Folder, parse, trusted_file
from ._words import counted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

REFUSED_NAME: Final = "refused"
"""One byte per event refused beside a busy lock past :data:`~._hook.MAX_ASIDE` (see :func:`~._spool.append_aside`)."""

DESTINATION_PREFIX: Final = "destination_"
"""``counters`` keys of events the destination refused inside a 2xx, by its reason (``destination_too_old``):
no drop counter's key starts so, and neither does ``refused`` (events turned away beside a busy lock)."""

MAX_DESTINATION_REASONS: Final = 32
"""Distinct reasons kept in ``counters`` (the collector has 19); a further one is counted as ``other``, so a
hostile destination cannot grow the file past what :func:`read_counters` reads."""

__all__ = [
    "add_counter",
    "add_destination_refusals",
    "DESTINATION_PREFIX",
    "MAX_DESTINATION_REASONS",
    "read_counters",
    "read_destination_refusals",
    "refused_text",
    "REFUSED_NAME",
]


def add_counter(folder: Folder, key: str, amount: int) -> None:
    """Add ``amount`` to drop counter ``key`` in ``counters``. Caller holds the lock."""
    if amount <= 0:
        return
    counts = _counters_file(folder)  # not read_counters: 'refused' lives in its own file
    counts[key] = counts.get(key, 0) + amount
    _write_counters(folder, counts)


def add_destination_refusals(folder: Folder, refused: Mapping[str, int]) -> None:
    """Add the events the destination refused (reason -> events, reasons already checked to be short
    ``[a-z_]`` words) to ``counters`` under ``destination_<reason>``, in one write. Caller holds the lock."""
    if not any(n > 0 for n in refused.values()):
        return
    counts = _counters_file(folder)
    kinds = sum(1 for k in counts if k.startswith(DESTINATION_PREFIX))
    for reason, n in sorted(refused.items()):
        if n <= 0:
            continue
        key = DESTINATION_PREFIX + reason
        if key not in counts and kinds >= MAX_DESTINATION_REASONS:
            key = DESTINATION_PREFIX + "other"
        kinds += key not in counts
        counts[key] = counts.get(key, 0) + n
    _write_counters(folder, counts)


def _write_counters(folder: Folder, counts: dict[str, int]) -> None:
    _files.replace_file(folder, COUNTERS_NAME, "".join(f"{k}={v}\n" for k, v in sorted(counts.items())).encode("ascii"))


def _counters_file(folder: Folder) -> dict[str, int]:
    try:
        data = _files.read_bytes(folder, COUNTERS_NAME, 4096)
    except OSError:
        data = None
    values = parse(data or b"") or {}
    return {k: int(v) for k, v in values.items() if v.isascii() and v.isdigit()}


def read_destination_refusals(folder: Folder) -> dict[str, int]:
    """Events the destination refused inside a 2xx, by its reason (running totals); damage reads as empty."""
    n = len(DESTINATION_PREFIX)
    return {k[n:]: v for k, v in _counters_file(folder).items() if k.startswith(DESTINATION_PREFIX) and k[n:]}


def refused_text(refused: Mapping[str, int], noun: str = "") -> str:
    """``"500 (over_cap 500)"``; with ``noun="event"``: ``"1 event (too_old 1)"``, ``"2 events (...)"``."""
    total = sum(refused.values())
    head = str(total) if not noun else counted(total, noun)
    parts = ", ".join(f"{reason} {n}" for reason, n in sorted(refused.items()) if n)
    return f"{head} ({parts})" if parts else head


def read_counters(folder: Folder) -> dict[str, int]:
    """The drop counters, with ``refused`` (events turned away beside a busy lock); damage reads as empty.
    The destination's refusals are not drops: :func:`read_destination_refusals` reads them."""
    counts = {k: v for k, v in _counters_file(folder).items() if not k.startswith(DESTINATION_PREFIX)}
    try:
        st = folder.lstat(REFUSED_NAME)
    except OSError:
        return counts
    if trusted_file(st) and st.st_size:
        counts["refused"] = counts.get("refused", 0) + st.st_size
    return counts
