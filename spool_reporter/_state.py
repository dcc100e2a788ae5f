"""The flusher's record on disk: ``state.json``, the back-off gate, and the bounded log -- what ``status`` reads.

Files in the spool folder (``0600``, opened through the folder's descriptor, nothing planted followed):

* ``state.json`` -- the last run: when, its outcome and error, events sent, events the destination refused by
  reason (``last_refused``), consecutive failures, next retry;
* ``flush.notbefore`` -- its mtime is the back-off, the earliest time a background flusher may start again
  (the hook's spawn gate reads it with one ``stat``);
* ``flush.log`` and ``flush.log.1`` -- one line per run and per dropped batch, rotated at
  :data:`LOG_FILE_BYTES` (64 KiB together).

:func:`read_state` is all ``django-spool status`` needs: it opens the folder read-only and imports neither the
flusher nor urllib3.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from . import _files, _hook, _settings, _spawn
from ._hook import GATE_NAME

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._hook import App, Folder

__all__ = ["FlushState", "backoff_delay", "log", "now", "read_state", "record_outcome"]

STATE_NAME: Final = "state.json"

LOG_NAME: Final = "flush.log"

LOG_OLD_NAME: Final = "flush.log.1"

MAX_STATE_BYTES: Final = 4096
"""``state.json`` is read up to this size (ours is under 2 KiB, with at most 32 reasons in ``last_refused``):
anything longer is damage, parsed as empty."""

LOG_FILE_BYTES: Final = 32 * 1024
"""``flush.log`` is rotated to ``flush.log.1`` at this size: both together stay under 64 KiB."""

LOG_TAIL_LINES: Final = 20
"""Lines of the log :func:`read_state` returns."""

_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _hook.O_NOFOLLOW | _hook.O_CLOEXEC | _hook.O_NONBLOCK


def now() -> float:
    """The wall clock, read in one place (the flusher, the dry run and ``status``)."""
    return time.time()


Outcome = Literal[
    "delivered", "nothing", "disabled", "local", "invalid-endpoint", "failed", "retired", "busy", "unusable-folder"
]
"""How a flusher run ended (:attr:`spool_reporter._flush.FlushResult.outcome`); the first seven are written to
``state.json`` (``busy``: another run writes it; ``unusable-folder``: there is no folder to write to)."""


@dataclass(frozen=True, kw_only=True)
class FlushState:
    """The flusher's record on disk, for ``status``; see :func:`read_state`."""

    last_flush: float | None = None
    """When the last run ended (seconds since the epoch)."""
    last_result: str | None = None
    """Its outcome (:attr:`FlushResult.outcome`)."""
    last_error: str | None = None
    """Its error, if it failed."""
    next_retry: float | None = None
    """The earliest time a background flusher will try again (the back-off), or ``None``."""
    consecutive_failures: int = 0
    log_tail: tuple[str, ...] = ()
    """The last lines of the flusher's log, oldest first."""


def _parse(raw: bytes | None) -> dict[str, object]:
    """``state.json``'s contents as a mapping; empty for a missing, damaged or hostile file."""
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _failures(state: dict[str, object]) -> int:
    failures = state.get("consecutive_failures")
    return failures if isinstance(failures, int) and failures >= 0 else 0


def load_state(folder: Folder) -> dict[str, object]:
    """The flusher's own reading of ``state.json`` (its folder open for writing)."""
    try:
        return _parse(_files.read_bytes(folder, STATE_NAME, MAX_STATE_BYTES))
    except OSError:
        return {}


def log(folder: Folder, line: str) -> None:
    """Append ``line`` to the bounded log (rotating at :data:`LOG_FILE_BYTES`), after the time and this process's
    id (``2026-12-03T08:15:48Z pid=4242 delivered: ...``). Never raises."""
    line = f"{_hook.iso_time(now())} pid={os.getpid()} {line}"
    data = (line.replace("\n", " ")[:500] + "\n").encode("ascii", "replace")
    try:
        fd, st = _hook.open_ours(folder, LOG_NAME, _APPEND_FLAGS)
        if st.st_size + len(data) > LOG_FILE_BYTES:
            os.close(fd)
            _files.set_aside(folder, LOG_OLD_NAME)  # a folder planted there would stop the rotation for good
            folder.rename(LOG_NAME, LOG_OLD_NAME)
            fd = _hook.open_ours(folder, LOG_NAME, _APPEND_FLAGS)[0]
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def backoff_delay(failures: int, retry_after: float | None, tune: _settings.Tuning) -> float:
    """Seconds until the next try after ``failures`` consecutive failures (≥ 1).

    Exponential (``base * 2**(failures-1)``, capped) with equal jitter (a random point in the upper half, so
    that many laptops coming back online do not retry in step); a ``Retry-After`` is honoured (never retry
    earlier than asked) and clamped to the cap.
    """
    delay = min(tune.backoff_cap, tune.backoff_base * 2.0 ** min(failures - 1, 40))
    delay = random.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, tune.backoff_cap))
    return delay


def record_outcome(
    folder: Folder,
    *,
    outcome: Outcome,
    error: str | None,
    retry_after: float | None,
    tune: _settings.Tuning,
    sent: int,
    refused: Mapping[str, int] | None = None,
) -> float | None:
    """Write ``state.json`` and the back-off gate after a run; returns the next retry time on failure.
    ``refused``: the events the destination refused inside a 2xx, by reason (``last_refused``)."""
    failures = _failures(load_state(folder))
    when = now()
    next_retry: float | None = None
    if outcome == "failed":
        failures += 1
        next_retry = when + backoff_delay(failures, retry_after, tune)
    else:
        failures = 0
    new = {
        "last_flush": when,
        "last_result": outcome,
        "last_error": error,
        "last_sent": sent,
        "last_refused": dict(refused or {}),
        "consecutive_failures": failures,
        "next_retry": next_retry,
    }
    try:
        _files.replace_file(folder, STATE_NAME, json.dumps(new, sort_keys=True).encode("ascii") + b"\n")
        _spawn.touch(folder, GATE_NAME, next_retry if next_retry is not None else when)
    except OSError:
        pass
    return next_retry


def read_state(app: App, *, environ: Mapping[str, str] | None = None) -> FlushState:
    """The flusher's record for ``status``: last run, back-off and log tail. Reads only; never raises."""
    with _files.ReadOnlyFolder(_hook.state_dir(app, environ)) as folder:
        state = _parse(folder.read(STATE_NAME, MAX_STATE_BYTES))
        logged = folder.read(LOG_OLD_NAME, LOG_FILE_BYTES) + folder.read(LOG_NAME, LOG_FILE_BYTES)
    tail = tuple(line for line in logged.decode("ascii", "replace").splitlines() if line.strip())[-LOG_TAIL_LINES:]

    def num(key: str) -> float | None:
        value = state.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def text(key: str) -> str | None:
        value = state.get(key)
        return value[:500] if isinstance(value, str) else None

    next_retry = num("next_retry")
    if next_retry is not None and next_retry > now() + _hook.MAX_BACKOFF:
        next_retry = None  # further ahead than any back-off (a wrong clock): the gate counts it as expired
    return FlushState(
        last_flush=num("last_flush"),
        last_result=text("last_result"),
        last_error=text("last_error"),
        next_retry=next_retry,
        consecutive_failures=_failures(state),
        log_tail=tail,
    )
