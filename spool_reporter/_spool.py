"""The spool: a folder of JSON-lines files guarded by one OS lock.

Layout of ``<user state dir>/spool_reporter/<app>/`` (folder ``0700``, files ``0600``)::

    spool.lock                 the lock file; never deleted (unlinking a locked file splits waiters
                               across inodes)
    spool.jsonl                the active file: the hook appends one line per event
    seg-<ns>-<pid>-<n>.jsonl   sealed segments of <n> lines, oldest first by name; only the flusher
                               reads them, and deletes one only after the destination answered 2xx
    counters                   the drop counts and the destination's refusals by reason (:mod:`._counters`)
    sent.jsonl, sent.jsonl.1   the record of the requests the flusher sent (:mod:`._sent`; deleted by every
                               purge)

**The lock protocol.** Every writer of the folder holds an exclusive ``flock`` on ``spool.lock`` while it
appends, seals (renames ``spool.jsonl`` to a segment), deletes segments or updates ``counters``. Every process
takes it the same way, through the folder's descriptor: the hook with :func:`~._hook.lock_fd`, the flusher and
the command line with :class:`~._files.FolderLock`. It is the ``flock`` that :class:`filelock.FileLock` takes on
the same file, so another program that locks ``spool.lock`` with :mod:`filelock` excludes them all and the
reverse (``tests/client/test_lock_interop.py``). On Windows the hook locks byte 0 with :func:`msvcrt.locking`, as
``filelock.WindowsFileLock`` does.

**Caps.** When ``spool.jsonl`` reaches :data:`SEGMENT_BYTES` the appender seals it; then, while the sealed
segments exceed ``max_events`` or ``max_bytes``, the oldest segment is deleted and its line count added to
``cap=``. The spool therefore never holds more than the caps plus one active segment.

**Never waiting.** If the lock stays busy for :data:`LOCK_WAIT_SECONDS`, the appender publishes its line
as a one-line sealed segment instead (:func:`append_aside`): no wait beyond a few milliseconds, no loss.

**Damage.** Every append writes one whole line with one ``write``; a short write (disk full) is truncated
away; a file whose last byte is not a newline (a writer killed mid-line, a crash) gets a newline first, so a
torn line costs that line only, and the reader skips and counts any line that is not a valid event.

The hook owns the folder, the lock and the append (:mod:`spool_reporter._hook`, one module for the command's
sake); this module owns the rest: sealing, the caps, the aside path, recovery from planted files, clearing what
killed processes left, purging and the readers (the counters: :mod:`._counters`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from . import _files
from ._counters import REFUSED_NAME, add_counter, read_counters, read_destination_refusals
from ._hook import (
    ACTIVE_NAME,
    HUGE_ACTIVE_BYTES,
    LOCK_NAME,
    LOCK_WAIT_SECONDS,
    MAX_ASIDE,
    O_BINARY,
    O_CLOEXEC,
    O_NOFOLLOW,
    OWN_LEVELS,
    READ_FLAGS,
    SEGMENT_BYTES,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    Folder,
    open_ours,
    trusted_file,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

ASIDE_PREFIX: Final = ".aside-"
""":func:`append_aside` writes ``.aside-<pid>-<random>.tmp``, then renames it to a one-line segment."""
ASIDE_SUFFIX: Final = ".tmp"
"""The suffix of an aside file (:data:`ASIDE_PREFIX`)."""

SENT_NAME: Final = "sent.jsonl"
"""The record of what left (:mod:`._sent`, which the hook never imports: a purge only unlinks these)."""
SENT_OLD_NAME: Final = "sent.jsonl.1"
""":data:`SENT_NAME` rotated once (``_sent`` keeps one older file)."""

STALE_ASIDE_SECONDS: Final = 60.0
"""An aside file is written and renamed within microseconds: one this old (or whose writer is gone) was left by
a process killed in between, and :func:`tidy` publishes or removes it."""

__all__ = [
    "append_aside",
    "ASIDE_PREFIX",
    "ASIDE_SUFFIX",
    "count_queued",
    "enforce_caps",
    "in_flight",
    "iter_lines",
    "names",
    "parse_lines",
    "purge",
    "purge_folder",
    "read_queued",
    "recut",
    "SCAN_LIMIT",
    "seal_active",
    "segment_count",
    "segment_name",
    "segments",
    "SENT_NAME",
    "SENT_OLD_NAME",
    "Sending",
    "STALE_ASIDE_SECONDS",
    "tidy",
]


def iter_lines(data: bytes) -> Iterator[bytes]:
    """Non-empty lines of a spool file, without their newline."""
    for raw in data.split(b"\n"):
        if raw.strip():
            yield raw


def parse_lines(data: bytes) -> tuple[list[dict[str, object]], int]:
    """Valid events of a spool file, and the number of lines that were not valid events."""
    import json

    from . import _event

    events: list[dict[str, object]] = []
    bad = 0
    for raw in iter_lines(data):
        if len(raw) > _event.MAX_LINE_BYTES:
            bad += 1
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            bad += 1
            continue
        valid = _event.validate(obj)
        if valid is None:
            bad += 1
        else:
            events.append(valid)
    return events, bad


def read_queued(path: str, *, own: int = OWN_LEVELS) -> tuple[list[dict[str, object]], int]:
    """The valid events of the spool folder at ``path`` (``own``: its levels that must be ours, as for
    :class:`~._hook.Folder`), oldest first, each event id once (a killed flusher can leave a resent copy
    behind), and how many lines are not valid events. Read without creating, locking or changing anything; a
    damaged file larger than we write is read as far as the flusher would re-cut it (:data:`SCAN_LIMIT`)."""
    events: list[dict[str, object]] = []
    invalid = 0
    seen: set[str] = set()
    with _files.ReadOnlyFolder(path, own=own) as folder:
        names = folder.names()
        ordered = sorted(n for n in names if segment_count(n) is not None)
        if ACTIVE_NAME in names:
            ordered.append(ACTIVE_NAME)
        for name in ordered:
            parsed, bad = parse_lines(folder.read(name, SCAN_LIMIT))
            invalid += bad
            for event in parsed:
                if str(event["event_id"]) not in seen:
                    seen.add(str(event["event_id"]))
                    events.append(event)
    return events, invalid


def _active_lines(folder: Folder) -> int:
    """Lines in the active file (0 if it cannot be read: something planted there holds no event of ours)."""
    try:
        data = _files.read_bytes(folder, ACTIVE_NAME, HUGE_ACTIVE_BYTES)
    except OSError:
        return 0
    return sum(1 for _ in iter_lines(data or b""))


def count_queued(folder: Folder) -> int:
    """Events waiting: sealed segments by their names, the active file by its lines."""
    return sum(s[1] for s in segments(folder)) + _active_lines(folder)


def purge(folder: Folder) -> int:
    """Delete every queued event (active file and segments) and the record of what was sent (``sent.jsonl``
    and ``sent.jsonl.1``). Caller holds the lock. Returns the count of events."""
    deleted = _active_lines(folder)
    with contextlib.suppress(FileNotFoundError):
        folder.unlink(ACTIVE_NAME)
    for name, count, _ in segments(folder):
        try:
            folder.unlink(name)
            deleted += count
        except FileNotFoundError:
            continue
    for name in names(folder):  # lines a killed command left beside a busy lock
        if name.startswith(ASIDE_PREFIX) and name.endswith(ASIDE_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                folder.unlink(name)
                deleted += 1
    for name in (SENT_NAME, SENT_OLD_NAME):
        with contextlib.suppress(OSError):  # missing; a folder planted there is no record of ours
            folder.unlink(name)
    return deleted


# --- the rare paths of the append, and the folder readers (imported lazily by the hook) ---


def names(folder: Folder) -> list[str]:
    if folder.fd is not None:
        with os.scandir(folder.fd) as it:
            return [entry.name for entry in it]
    return os.listdir(folder.path)  # pragma: no cover windows


def segments(folder: Folder) -> list[tuple[str, int, int]]:
    """Sealed segments, oldest first: ``(name, lines, bytes)``.

    Only regular files of ours count (anything else at a segment name holds no event of ours; the flusher sets
    it aside), and a name never claims more lines than its bytes can hold: a planted
    ``seg-...-99999999.jsonl`` must not inflate ``status``, trip the caps or be counted as that many losses.
    """
    found = []
    for name in names(folder):
        count = segment_count(name)
        if count is None:
            continue
        try:
            st = folder.lstat(name)
        except OSError:
            continue
        if trusted_file(st):
            found.append((name, min(count, st.st_size), st.st_size))
    found.sort()
    return found


def event_files(folder: Folder) -> list[str]:
    """The names of the files that hold queued events, oldest first: the sealed segments, then the active file."""
    return [name for name, _, _ in segments(folder)] + [ACTIVE_NAME]


def segment_count(name: str) -> int | None:
    """The line count encoded in a segment name, or ``None`` if ``name`` is not a segment."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    parts = name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return int(parts[2])


def segment_name(lines: int, now_ns: int | None = None) -> str:
    ns = time.time_ns() if now_ns is None else now_ns
    return f"{SEGMENT_PREFIX}{ns:020d}-{os.getpid()}-{lines}{SEGMENT_SUFFIX}"


def summary(folder: Folder) -> dict[str, object]:
    """What ``status`` shows of the queue, read without writing anything: ``queued``, ``oldest`` (the time of the
    oldest queued event, or ``None``), ``dropped`` and ``dropped_by_reason`` (:func:`~._counters.read_counters`),
    and ``refused_by_destination`` (:func:`~._counters.read_destination_refusals`)."""
    counters = read_counters(folder)
    oldest = None
    for name in event_files(folder):
        try:
            data = _files.read_bytes(folder, name, HUGE_ACTIVE_BYTES)
        except OSError:
            continue
        events, _ = parse_lines(data or b"")
        if events:
            oldest = events[0]["time"]
            break
    return {
        "queued": count_queued(folder),
        "oldest": oldest,
        "dropped": sum(counters.values()),
        "dropped_by_reason": counters,
        "refused_by_destination": read_destination_refusals(folder),
    }


def unreadable_file(folder: Folder) -> str | None:
    """The name of the first event file of ``folder`` that this user may not read, or ``None``. A missing or
    planted one (a symlink, a FIFO) is not counted: the reader skips it, as the flusher does."""
    for name in event_files(folder):
        try:
            os.close(folder.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)))
        except PermissionError:
            return name
        except OSError:
            continue
    return None


def seal_active(folder: Folder) -> tuple[str, int] | None:
    """Rename ``spool.jsonl`` to a new segment. Caller holds the lock. Returns ``(name, lines)``.

    Something planted there that is not a regular file of ours is set aside unread (no event of ours is in it).
    An active file larger than we ever write (damage: a crash's run of zeros, a line gone wrong) is re-cut into
    proper segments instead (:func:`recut`): its valid lines are kept and each overlong line is counted.
    """
    try:
        st = folder.lstat(ACTIVE_NAME)
    except FileNotFoundError:
        return None
    if not trusted_file(st):
        _files.set_aside(folder, ACTIVE_NAME)
        return None
    if st.st_size == 0:
        return None
    if st.st_size > HUGE_ACTIVE_BYTES:
        recut(folder, ACTIVE_NAME)
        return None
    data = _files.read_bytes(folder, ACTIVE_NAME, HUGE_ACTIVE_BYTES) or b""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    name = segment_name(lines)
    folder.rename(ACTIVE_NAME, name)
    return name, lines


SCAN_LIMIT: Final = 64 * 1024 * 1024
""":func:`recut` reads at most this much of a damaged file (~30 ms): what lies beyond is one corrupt remainder."""


def recut(folder: Folder, name: str) -> tuple[int, int]:
    """Re-cut file ``name`` (ours, but larger than we write) into segments of whole lines and delete it. Caller
    holds the lock. Lines longer than any event are skipped, never held in memory, and counted as ``corrupt``,
    one each; so is an unread remainder past :data:`SCAN_LIMIT`. Returns ``(lines kept, lines counted)``."""
    from ._event import MAX_LINE_BYTES

    fd = folder.open(name, READ_FLAGS)
    kept = bad = 0
    try:
        out: list[bytes] = []
        out_bytes = 0
        line = bytearray()
        overlong = False
        left = SCAN_LIMIT

        def flush_segment() -> None:
            nonlocal out, out_bytes
            if out:
                tmp = _files.write_new(folder, SEGMENT_SUFFIX, b"".join(out))
                folder.rename(tmp, segment_name(len(out)))
                out, out_bytes = [], 0

        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
            start = 0
            while start < len(chunk):
                end = chunk.find(b"\n", start)
                stop = len(chunk) if end < 0 else end
                if not overlong:
                    line += chunk[start:stop]
                    if len(line) > MAX_LINE_BYTES:
                        overlong, line = True, bytearray()
                if end < 0:
                    break
                if overlong:
                    bad += 1
                elif line.strip():
                    out.append(bytes(line) + b"\n")
                    out_bytes += len(line) + 1
                    kept += 1
                    if out_bytes >= SEGMENT_BYTES:
                        flush_segment()
                line, overlong = bytearray(), False
                start = end + 1
        if left <= 0 and os.read(fd, 1):
            bad += 1  # the line in progress and everything past SCAN_LIMIT: one unread remainder
        elif overlong:
            bad += 1
        elif line.strip():  # a last line without its newline: the reader decides, as for any active file
            out.append(bytes(line) + b"\n")
            kept += 1
        flush_segment()
    finally:
        os.close(fd)
    folder.unlink(name)
    add_counter(folder, "corrupt", bad)
    return kept, bad


def in_flight(folder: Folder, name: str) -> bool:
    """Whether a flusher is sending segment ``name`` right now (it holds a shared ``flock`` on it: see
    :class:`Sending`)."""
    if folder.fd is None:  # pragma: no cover windows - no shared locks; the caps may count a resend
        return False
    import fcntl

    try:
        fd = folder.open(name, READ_FLAGS)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class Sending:
    """Held by the flusher while it sends segment ``name``: a shared ``flock`` on the segment, so that the caps
    (:func:`enforce_caps`, in any process) never delete -- and count as dropped -- events already on their way.
    ``held`` is false when the segment is gone (the caps or a purge took it first)."""

    def __init__(self, folder: Folder, name: str) -> None:
        self.fd: int | None = None
        self.held = False
        try:
            self.fd = folder.open(name, READ_FLAGS)
        except FileNotFoundError:
            return
        if folder.fd is not None:
            import fcntl

            # The caps' probe holds its exclusive try-lock for an instant; a process that holds one for longer
            # only costs the protection (the caps may then count this segment), never a wait past LOCK_WAIT.
            deadline = time.monotonic() + LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.0002)
        self.held = True

    def __enter__(self) -> Sending:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def enforce_caps(folder: Folder, max_events: int, max_bytes: int) -> int:
    """Delete the oldest segments until the sealed ones fit the caps. Caller holds the lock.

    A segment a flusher is sending (:func:`in_flight`) is neither deleted nor counted against the caps: its
    events are leaving. Returns the number of events dropped (added to the ``cap`` counter), each one an event
    that was still waiting.
    """
    sealed = segments(folder)
    events = sum(s[1] for s in sealed)
    size = sum(s[2] for s in sealed)
    if events <= max_events and size <= max_bytes:
        return 0
    waiting = [s for s in sealed if not in_flight(folder, s[0])]
    events = sum(s[1] for s in waiting)
    size = sum(s[2] for s in waiting)
    dropped = 0
    for name, count, nbytes in waiting:
        if events <= max_events and size <= max_bytes:
            break
        try:
            folder.unlink(name)
        except FileNotFoundError:
            continue
        events -= count
        size -= nbytes
        dropped += count
    add_counter(folder, "cap", dropped)
    return dropped


def append_aside(folder: Folder, line: bytes) -> int:
    """Keep the event without the lock: publish it as a one-line sealed segment.

    Used when the lock stays busy past :data:`LOCK_WAIT_SECONDS` (a preempted holder on a loaded machine, or
    a process holding it forever): the command must not wait, and the event must not be lost. The line is
    written to a private temporary name (``O_EXCL``) and renamed to a segment name in one step, so the
    flusher never sees it half-written. Beyond :data:`MAX_ASIDE` such files the event is dropped, and
    counted without the lock: one byte appended to :data:`~._counters.REFUSED_NAME` (``O_APPEND`` writes of one
    byte never interleave), whose size ``status`` shows as the ``refused`` drop count.
    Returns 0 (the active file was not touched).
    """
    present = names(folder)
    if sum(1 for n in present if n.endswith("-1" + SEGMENT_SUFFIX)) >= MAX_ASIDE:
        fd = open_ours(folder, REFUSED_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC)[0]
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)
        raise BlockingIOError("spool lock busy and too many aside segments")
    tmp = f"{ASIDE_PREFIX}{os.getpid()}-{os.urandom(4).hex()}{ASIDE_SUFFIX}"
    fd = folder.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_BINARY)
    try:
        written = os.write(fd, line)
    finally:
        os.close(fd)
    if written != len(line):
        folder.unlink(tmp)
        raise OSError("short write")
    folder.rename(tmp, segment_name(1))
    return 0


def _writer_gone(name: str) -> bool:
    """Whether the process named in ``.aside-<pid>-...`` is gone (a pid in use again reads as alive)."""
    digits = name[len(ASIDE_PREFIX) :].split("-", 1)[0]
    if not (digits.isascii() and digits.isdigit()):
        return True
    try:
        os.kill(int(digits), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _leftover_aside(folder: Folder, name: str, now: float) -> str | None:
    """Publish a complete line a killed appender left in an aside file as its own segment, or delete a torn one
    (counted as ``corrupt``: that line only). Returns a line for the log, or ``None`` if the writer may still
    be at work."""
    from ._event import MAX_LINE_BYTES

    try:
        st = folder.lstat(name)
    except FileNotFoundError:
        return None
    if not trusted_file(st):
        _files.set_aside(folder, name)
        return f"removed {name}: not a file of ours"
    if now - st.st_mtime < STALE_ASIDE_SECONDS and not _writer_gone(name):
        return None
    data = _files.read_bytes(folder, name, MAX_LINE_BYTES + 2) or b""
    if data.endswith(b"\n") and data.count(b"\n") == 1 and len(data) <= MAX_LINE_BYTES + 1:
        new = segment_name(1, max(0, int(st.st_mtime * 1e9)))
        if new not in names(folder):
            folder.rename(name, new)
            return f"kept the event a killed command left in {name}"
    folder.unlink(name)
    if data.strip():
        add_counter(folder, "corrupt", 1)
        return f"removed {name}: a torn line (counted as corrupt)"
    return f"removed {name}: empty"


def tidy(folder: Folder, now: float) -> list[str]:
    """What killed processes and planted folders left behind, cleared at a claim (caller holds the lock):
    ``tmp-*`` files are deleted, stale aside files published or deleted (:func:`_leftover_aside`), and folders
    set aside at our file names removed if empty (a non-empty one is left, renamed ``.intruder-kept-*``, and
    reported once). Returns lines for the flusher's log."""
    notes = []
    for name in names(folder):
        if name.startswith(_files.TMP_PREFIX):
            with contextlib.suppress(OSError):
                folder.unlink(name)
        elif name.startswith(ASIDE_PREFIX) and name.endswith(ASIDE_SUFFIX):
            note = _leftover_aside(folder, name, now)
            if note:
                notes.append(note)
        elif segment_count(name) is not None:
            if _files.planted(folder, name):
                _files.set_aside(folder, name)
                notes.append(f"removed {name}: not a segment of ours")
        elif name.startswith(_files.INTRUDER_PREFIX) and not name.startswith(_files.INTRUDER_PREFIX + "kept-"):
            where = name[len(_files.INTRUDER_PREFIX) :].split("-", 2)[-1]
            try:
                os.rmdir(name, dir_fd=folder.fd)
                notes.append(f"removed an empty folder planted at {where}")
            except OSError:
                with contextlib.suppress(OSError):
                    folder.rename(name, _files.INTRUDER_PREFIX + "kept-" + name[len(_files.INTRUDER_PREFIX) :])
                notes.append(f"a folder was planted at {where}; it is kept as {_files.INTRUDER_PREFIX}kept-...")
    return notes


def purge_folder(path: str, *, wait: float) -> int:
    """Delete every queued event of the spool folder at ``path`` under the spool lock, waiting at most ``wait``
    seconds for it, and return how many; 0 when there is no such folder. The record of what was sent goes
    with them (:func:`purge`). The one purge behind ``disable``,
    ``purge`` and ``forget``, and behind a flusher or a hook that finds reporting turned off. Raises
    :class:`~._files.LockTimeout` when the lock stays busy, :class:`OSError` for a folder that cannot be used."""
    try:
        folder = Folder(path, create=False)
    except FileNotFoundError:
        return 0
    with folder, _files.FolderLock(folder, LOCK_NAME, wait):
        return purge(folder)
