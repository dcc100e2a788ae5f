"""The spool: a folder of JSON-lines files guarded by one OS lock.

Layout of ``<user state dir>/spool_reporter/<app>/`` (folder ``0700``, files ``0600``)::

    spool.lock                 the lock file; never deleted (unlinking a locked file splits waiters
                               across inodes)
    spool.jsonl                the active file: the hook appends one line per event
    seg-<ns>-<pid>-<n>.jsonl   sealed segments of <n> lines, oldest first by name; only the flusher
                               reads them, and deletes one only after the destination answered 2xx
    counters                   ``cap=`` / ``corrupt=`` / ``rejected=`` drop counts (``key=value``)

**The lock protocol.** Every writer of the folder holds an exclusive ``flock`` on ``spool.lock`` while it
appends, seals (renames ``spool.jsonl`` to a segment), deletes segments or updates ``counters``. The hook
takes it with :func:`fcntl.flock` directly (:mod:`filelock` costs ~10 ms to import); the flusher and the
command line take it through :class:`filelock.FileLock`, which is the same ``flock`` on the same file, so
each excludes the other (``tests/test_lock_interop.py``). On Windows the hook locks byte 0 with
:func:`msvcrt.locking`, as ``filelock.WindowsFileLock`` does.

**Caps.** When ``spool.jsonl`` reaches :data:`SEGMENT_BYTES` the appender seals it; then, while the sealed
segments exceed ``max_events`` or ``max_bytes``, the oldest segment is deleted and its line count added to
``cap=``. The spool therefore never holds more than the caps plus one active segment.

**Never waiting.** If the lock stays busy for :data:`LOCK_WAIT_SECONDS`, the appender publishes its line
as a one-line sealed segment instead (:func:`append_aside`): no wait beyond a few milliseconds, no loss.

**Damage.** Every append writes one whole line with one ``write``; a short write (disk full) is truncated
away; a file whose last byte is not a newline (a writer killed mid-line, a crash) gets a newline first, so a
torn line costs that line only, and the reader skips and counts any line that is not a valid event.

Stdlib only: the append path runs inside the user's command.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Final

LOCK_NAME: Final = "spool.lock"
ACTIVE_NAME: Final = "spool.jsonl"
COUNTERS_NAME: Final = "counters"
SEGMENT_PREFIX: Final = "seg-"
SEGMENT_SUFFIX: Final = ".jsonl"

SEGMENT_BYTES: Final = 256 * 1024
"""The active file is sealed at this size: ~600 events; counting its lines then reads 256 KiB (~60 us)."""

MAX_EVENTS: Final = 10_000
"""Default count cap: a year of a busy developer's commands, and the flusher benchmark's queue."""

MAX_BYTES: Final = 8 * 1024 * 1024
"""Default byte cap: 10,000 events of ~420 bytes fit twice over; a small price on any disk."""

HUGE_ACTIVE_BYTES: Final = 4 * SEGMENT_BYTES
"""An active file this large was not written by us (we seal at SEGMENT_BYTES): it is discarded."""

LOCK_WAIT_SECONDS: Final = 0.005
"""The hook gives up on a lock held this long (a flusher's claim is a rename: microseconds)."""

MAX_ASIDE: Final = 1000
"""At most this many one-line segments written beside a busy lock (see :func:`append_aside`)."""

FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700

_WINDOWS: Final = sys.platform == "win32"
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_BINARY: Final = getattr(os, "O_BINARY", 0)
_DIR_FD: Final = (not _WINDOWS) and os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd
_UID: Final = os.geteuid() if hasattr(os, "geteuid") else None

_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK | _O_BINARY
_APPEND_FLAGS: Final = os.O_RDWR | os.O_APPEND | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK | _O_BINARY
# O_RDWR, not O_WRONLY: the append reads the last byte back to detect a torn line.
_READ_FLAGS: Final = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK | _O_BINARY


class SpoolError(OSError):
    """The spool folder or one of its files is not safe to use (symlink, wrong owner, not a file)."""


def _trusted_file(st: os.stat_result) -> bool:
    # A regular file we own with exactly one name: a hard link planted at our path could point anywhere.
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (_UID is None or st.st_uid == _UID)


def make_dirs(path: str) -> None:
    """Create ``path`` and missing parents with mode ``0700``, whatever the umask."""
    missing = []
    head = path
    while head and not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(directory, DIR_MODE)  # mkdir's mode is filtered by the umask; this one is not


class Folder:
    """An open, verified spool folder: operations are relative to a descriptor, so a symlink swapped in
    for the folder after the check cannot redirect them. Use as a context manager."""

    __slots__ = ("fd", "path")

    path: str
    fd: int | None

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        self.fd = None
        if not _DIR_FD:  # pragma: no cover - Windows
            if create:
                make_dirs(path)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                raise SpoolError(f"not a folder: {path}")
            return
        flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            if not create:
                raise
            make_dirs(path)
            fd = os.open(path, flags)
        except OSError as exc:  # ELOOP / ENOTDIR: a symlink or a file planted at the folder's path
            raise SpoolError(f"not a folder: {path}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode) or (_UID is not None and st.st_uid != _UID):
                raise SpoolError(f"not our folder: {path}")
            if st.st_mode & 0o077:
                os.fchmod(fd, DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _name(self, name: str) -> str:
        return name if self.fd is not None else os.path.join(self.path, name)

    def open(self, name: str, flags: int, mode: int = FILE_MODE) -> int:
        if self.fd is not None:
            return os.open(name, flags, mode, dir_fd=self.fd)
        return os.open(os.path.join(self.path, name), flags, mode)  # pragma: no cover - Windows

    def rename(self, src: str, dst: str) -> None:
        if self.fd is not None:
            os.rename(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        else:  # pragma: no cover - Windows
            os.replace(os.path.join(self.path, src), os.path.join(self.path, dst))

    def unlink(self, name: str) -> None:
        if self.fd is not None:
            os.unlink(name, dir_fd=self.fd)
        else:  # pragma: no cover - Windows
            os.unlink(os.path.join(self.path, name))

    def lstat(self, name: str) -> os.stat_result:
        if self.fd is not None:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        return os.lstat(os.path.join(self.path, name))  # pragma: no cover - Windows

    def names(self) -> list[str]:
        if self.fd is not None:
            with os.scandir(self.fd) as it:
                return [entry.name for entry in it]
        return os.listdir(self.path)  # pragma: no cover - Windows

    def segments(self) -> list[tuple[str, int, int]]:
        """Sealed segments, oldest first: ``(name, lines, bytes)``."""
        found = []
        for name in self.names():
            count = segment_count(name)
            if count is None:
                continue
            try:
                size = self.lstat(name).st_size
            except OSError:
                continue
            found.append((name, count, size))
        found.sort()
        return found

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """Read a regular file of ours, at most ``limit`` bytes; ``None`` if it does not exist."""
        try:
            fd = self.open(name, _READ_FLAGS)
        except FileNotFoundError:
            return None
        try:
            if not _trusted_file(os.fstat(fd)):
                raise SpoolError(f"not a file of ours: {name}")
            chunks = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def segment_count(name: str) -> int | None:
    """The line count encoded in a segment name, or ``None`` if ``name`` is not a segment."""
    if not (name.startswith(SEGMENT_PREFIX) and name.endswith(SEGMENT_SUFFIX)):
        return None
    parts = name[len(SEGMENT_PREFIX) : -len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[2])


def segment_name(lines: int, now_ns: int | None = None) -> str:
    ns = time.time_ns() if now_ns is None else now_ns
    return f"{SEGMENT_PREFIX}{ns:020d}-{os.getpid()}-{lines}{SEGMENT_SUFFIX}"


# --- the OS lock (hook side; the cold path uses filelock on the same file) -------------------------------

if sys.platform == "win32":  # pragma: no cover - Windows
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True


def take_lock(fd: int, wait: float = LOCK_WAIT_SECONDS) -> bool:
    """Take the exclusive OS lock on ``fd``, waiting at most ``wait`` seconds (bounded, never forever)."""
    if _try_lock(fd):
        return True
    deadline = time.monotonic() + wait
    pause = 0.0002
    while time.monotonic() < deadline:
        time.sleep(pause)
        if _try_lock(fd):
            return True
        pause = min(pause * 2, 0.001)
    return False


def lock_fd(folder: Folder, wait: float = LOCK_WAIT_SECONDS) -> int | None:
    """Open ``spool.lock`` and take the exclusive lock, waiting at most ``wait`` seconds.

    Returns the descriptor (closing it releases the lock) or ``None`` when the lock is busy.
    """
    fd = folder.open(LOCK_NAME, _LOCK_FLAGS)
    try:
        if take_lock(fd, wait):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


# --- writing (caller holds the lock) -------------------------------------------------------------------


def add_counter(folder: Folder, key: str, amount: int) -> None:
    """Add ``amount`` to drop counter ``key`` in ``counters``. Caller holds the lock."""
    if amount <= 0:
        return
    counts = read_counters(folder)
    counts[key] = counts.get(key, 0) + amount
    data = "".join(f"{k}={v}\n" for k, v in sorted(counts.items())).encode("ascii")
    fd = folder.open(COUNTERS_NAME, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    try:
        if not _trusted_file(os.fstat(fd)):
            raise SpoolError("counters is not a file of ours")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0) if hasattr(os, "pwrite") else os.write(fd, data)
    finally:
        os.close(fd)


def read_counters(folder: Folder) -> dict[str, int]:
    """The drop counters; a damaged file reads as empty."""
    from . import _config

    try:
        data = folder.read_bytes(COUNTERS_NAME, 4096)
    except OSError:
        return {}
    values = _config.parse(data or b"") or {}
    return {k: int(v) for k, v in values.items() if v.isdigit()}


def seal_active(folder: Folder) -> tuple[str, int] | None:
    """Rename ``spool.jsonl`` to a new segment. Caller holds the lock. Returns ``(name, lines)``."""
    try:
        st = folder.lstat(ACTIVE_NAME)
    except FileNotFoundError:
        return None
    if not _trusted_file(st) or st.st_size > HUGE_ACTIVE_BYTES:
        # Not something we wrote: discard it rather than read or send it.
        folder.unlink(ACTIVE_NAME)
        add_counter(folder, "corrupt", 1)
        return None
    if st.st_size == 0:
        return None
    data = folder.read_bytes(ACTIVE_NAME, HUGE_ACTIVE_BYTES) or b""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    name = segment_name(lines)
    folder.rename(ACTIVE_NAME, name)
    return name, lines


def enforce_caps(folder: Folder, max_events: int, max_bytes: int) -> int:
    """Delete the oldest segments until the sealed ones fit the caps. Caller holds the lock.

    Returns the number of events dropped (added to the ``cap`` counter).
    """
    segments = folder.segments()
    events = sum(s[1] for s in segments)
    size = sum(s[2] for s in segments)
    dropped = 0
    for name, count, nbytes in segments:
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


def append(folder: Folder, line: bytes, *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> int:
    """Append one line under the lock (taken and released here). Returns the active file's new size.

    Raises :class:`OSError` (including :class:`SpoolError`) on any failure; the hook turns that into a no-op.
    """
    lfd = lock_fd(folder)
    if lfd is None:
        return append_aside(folder, line)
    try:
        fd = folder.open(ACTIVE_NAME, _APPEND_FLAGS)
        try:
            st = os.fstat(fd)
            if not _trusted_file(st) or st.st_size >= SEGMENT_BYTES:
                os.close(fd)
                fd = -1
                seal_active(folder)
                enforce_caps(folder, max_events, max_bytes)
                fd = folder.open(ACTIVE_NAME, _APPEND_FLAGS)
                st = os.fstat(fd)
                if not _trusted_file(st):
                    raise SpoolError("spool.jsonl is not a file of ours")
            if st.st_mode & 0o077:
                os.fchmod(fd, FILE_MODE)
            size = st.st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a torn last line stays alone: it costs that line only
            try:
                written = os.write(fd, line)
            except OSError:
                os.ftruncate(fd, size)
                raise
            if written != len(line):
                os.ftruncate(fd, size)
                raise OSError("short write")
            return size + written
        finally:
            if fd >= 0:
                os.close(fd)
    finally:
        os.close(lfd)


def append_aside(folder: Folder, line: bytes) -> int:
    """Keep the event without the lock: publish it as a one-line sealed segment.

    Used when the lock stays busy past :data:`LOCK_WAIT_SECONDS` (a preempted holder on a loaded machine, or
    a process holding it forever): the command must not wait, and the event must not be lost. The line is
    written to a private temporary name (``O_EXCL``) and renamed to a segment name in one step, so the
    flusher never sees it half-written. Beyond :data:`MAX_ASIDE` such files the event is dropped.
    Returns 0 (the active file was not touched).
    """
    names = folder.names()
    if sum(1 for n in names if n.endswith("-1" + SEGMENT_SUFFIX)) >= MAX_ASIDE:
        raise BlockingIOError("spool lock busy and too many aside segments")
    tmp = f".aside-{os.getpid()}-{os.urandom(4).hex()}.tmp"
    fd = folder.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY)
    try:
        written = os.write(fd, line)
    finally:
        os.close(fd)
    if written != len(line):
        folder.unlink(tmp)
        raise OSError("short write")
    folder.rename(tmp, segment_name(1))
    return 0


# --- reading (cold path) -------------------------------------------------------------------------------


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


def count_queued(folder: Folder) -> int:
    """Events waiting: sealed segments by their names, the active file by its lines."""
    total = sum(s[1] for s in folder.segments())
    try:
        data = folder.read_bytes(ACTIVE_NAME, HUGE_ACTIVE_BYTES)
    except OSError:
        data = None
    if data:
        total += sum(1 for _ in iter_lines(data))
    return total


def purge(folder: Folder) -> int:
    """Delete every queued event (active file and segments). Caller holds the lock. Returns the count."""
    deleted = 0
    try:
        data = folder.read_bytes(ACTIVE_NAME, HUGE_ACTIVE_BYTES)
    except OSError:
        data = None
    if data:
        deleted += sum(1 for _ in iter_lines(data))
    with contextlib.suppress(FileNotFoundError):
        folder.unlink(ACTIVE_NAME)
    for name, count, _ in folder.segments():
        try:
            folder.unlink(name)
            deleted += count
        except FileNotFoundError:
            continue
    return deleted
