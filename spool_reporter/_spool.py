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

The hook owns the folder, the lock and the append (:mod:`spool_reporter._hook`, one module for the command's
sake); this module owns the rest: sealing, the caps, the aside path, recovery from planted files, clearing what
killed processes left, purging, the readers and the counters.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from ._hook import (
    ACTIVE_NAME,
    COUNTERS_NAME,
    DIR_FD,
    DIR_FLAGS,
    DIR_MODE,
    HUGE_ACTIVE_BYTES,
    LOCK_FLAGS,
    LOCK_WAIT_SECONDS,
    MAX_ASIDE,
    O_BINARY,
    O_CLOEXEC,
    O_NOFOLLOW,
    READ_FLAGS,
    SEGMENT_BYTES,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    UID,
    SpoolError,
    lock_fd,
    open_ours,
    parse,
    state_dir,
    take_lock,
    trusted_file,
)
from ._hook import Folder as HotFolder

REFUSED_NAME = "refused"
"""One byte per event refused beside a busy lock past :data:`MAX_ASIDE` (see :func:`append_aside`)."""

INTRUDER_PREFIX = ".intruder-"
"""A folder planted at one of our file names is renamed aside to ``.intruder-<ns>-<pid>-<name>`` (anything
else planted there is unlinked: that never touches what a link points to); the flusher logs and clears them."""

TMP_PREFIX = "tmp-"
"""Short-lived files written and renamed under the spool lock (or by the one flusher); one left by a killed
process is deleted by the next claim."""

ASIDE_PREFIX = ".aside-"
ASIDE_SUFFIX = ".tmp"
""":func:`append_aside` writes ``.aside-<pid>-<random>.tmp``, then renames it to a one-line segment."""

STALE_ASIDE_SECONDS = 60.0
"""An aside file is written and renamed within microseconds: one this old (or whose writer is gone) was left by
a process killed in between, and :func:`tidy` publishes or removes it."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._hook import App

__all__ = [
    "add_counter",
    "append_aside",
    "ASIDE_PREFIX",
    "ASIDE_SUFFIX",
    "count_queued",
    "enforce_caps",
    "Folder",
    "FolderLock",
    "in_flight",
    "INTRUDER_PREFIX",
    "iter_lines",
    "LockTimeout",
    "make_dirs",
    "names",
    "open_dirs",
    "parse_lines",
    "purge",
    "purge_if_present",
    "read_bytes",
    "read_counters",
    "recut",
    "REFUSED_NAME",
    "reopen",
    "replace_file",
    "SCAN_LIMIT",
    "seal_active",
    "segment_count",
    "segment_name",
    "segments",
    "Sending",
    "set_aside",
    "STALE_ASIDE_SECONDS",
    "tidy",
    "TMP_PREFIX",
    "write_new",
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


def count_queued(folder: HotFolder) -> int:
    """Events waiting: sealed segments by their names, the active file by its lines."""
    total = sum(s[1] for s in segments(folder))
    try:
        data = read_bytes(folder, ACTIVE_NAME, HUGE_ACTIVE_BYTES)
    except OSError:
        data = None
    if data:
        total += sum(1 for _ in iter_lines(data))
    return total


def purge(folder: HotFolder) -> int:
    """Delete every queued event (active file and segments). Caller holds the lock. Returns the count."""
    deleted = 0
    try:
        data = read_bytes(folder, ACTIVE_NAME, HUGE_ACTIVE_BYTES)
    except OSError:
        data = None
    if data:
        deleted += sum(1 for _ in iter_lines(data))
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
    return deleted


# --- the rare paths of the append, and the folder readers (imported lazily by the hook) ---


def names(folder: HotFolder) -> list[str]:
    if folder.fd is not None:
        with os.scandir(folder.fd) as it:
            return [entry.name for entry in it]
    return os.listdir(folder.path)  # pragma: no cover - Windows


def segments(folder: HotFolder) -> list[tuple[str, int, int]]:
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


def read_bytes(folder: HotFolder, name: str, limit: int) -> bytes | None:
    """Read a regular file of ours, at most ``limit`` bytes; ``None`` if it does not exist."""
    try:
        fd = folder.open(name, READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        if not trusted_file(os.fstat(fd)):
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
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return int(parts[2])


def segment_name(lines: int, now_ns: int | None = None) -> str:
    ns = time.time_ns() if now_ns is None else now_ns
    return f"{SEGMENT_PREFIX}{ns:020d}-{os.getpid()}-{lines}{SEGMENT_SUFFIX}"


# --- the state folder, level by level ---


def _trusted_link(name: str, fd: int) -> str | None:
    """The target of symlink ``name`` in folder ``fd`` if root or we own the link (checked twice, around the
    read, so a link swapped in meanwhile is not followed); else ``None``."""
    import stat

    before = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISLNK(before.st_mode) or before.st_uid not in (0, UID):
        return None
    target = os.readlink(name, dir_fd=fd)
    after = os.stat(name, dir_fd=fd, follow_symlinks=False)
    same = (after.st_ino, after.st_dev, after.st_uid) == (before.st_ino, before.st_dev, before.st_uid)
    return target if same else None


MAX_LINKS = 40
"""Symlinks followed at most while opening one folder: the kernel's own limit (``MAXSYMLINKS``)."""


def open_dirs(path: str, *, create: bool, own: int = 0, tighten: bool = True) -> int:
    """Open folder ``path`` one level at a time from ``/`` and return its descriptor.

    Each level is opened relative to the descriptor of the one above it with ``O_DIRECTORY | O_NOFOLLOW``:
    nothing is looked up by path, so a symlink swapped in between two steps is never followed. ``create``
    makes missing levels (``mkdir`` relative to the parent's descriptor, then ``fchmod`` 0700 on the new
    folder's own descriptor, whatever the umask). The last ``own`` levels, and every level made here, must
    be folders we own; those of the last ``own`` are also tightened to 0700 unless ``tighten`` is false (a
    read-only view). Above the last ``own`` levels a symlink is followed only if root or we own it.

    Raises :class:`FileNotFoundError` for a missing level (``create`` false), :class:`SpoolError` for a level
    that is not a folder or not ours, or a symlink that may not be followed.
    """
    import stat

    names = path.split("/")[::-1]  # a stack: the next level is names.pop()
    if names.pop() != "":
        raise SpoolError(f"not an absolute path: {path}")
    fd = os.open("/", DIR_FLAGS)
    links = 0
    try:
        while names:
            name = names.pop()
            if name in ("", "."):
                continue
            mine = len(names) < own
            created = False
            try:
                new = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                    created = True
                except FileExistsError:
                    pass
                new = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP / ENOTDIR: a symlink, or something else that is not a folder
                target = None if mine else _trusted_link(name, fd)
                links += 1
                if target is None or links > MAX_LINKS:
                    raise SpoolError(f"not a folder: {path}") from exc
                names.extend(target.split("/")[::-1])
                if target.startswith("/"):
                    new = os.open("/", DIR_FLAGS)
                    os.close(fd)
                    fd = new
                continue
            os.close(fd)
            fd = new
            if mine or created:
                st = os.fstat(fd)
                if UID is not None and st.st_uid != UID:
                    raise SpoolError(f"not our folder: {path}")
                if tighten and (st.st_mode & 0o077 or (created and stat.S_IMODE(st.st_mode) != DIR_MODE)):
                    os.fchmod(fd, DIR_MODE)  # mkdir's mode is filtered by the umask; this one is not
        return fd
    except BaseException:
        os.close(fd)
        raise


def make_dirs(path: str) -> None:
    """Create ``path`` and missing parents with mode ``0700``, whatever the umask, by descriptors
    (:func:`open_dirs`)."""
    if DIR_FD:
        os.close(open_dirs(path, create=True))
        return
    missing = []  # pragma: no cover - Windows: no descriptor-relative calls
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
        os.chmod(directory, DIR_MODE)


# --- planted files: set aside, never followed ---


@contextlib.contextmanager
def _recovering(folder: HotFolder) -> Iterator[None]:
    """One recovery at a time: an exclusive ``flock`` on the folder's own descriptor (no file of ours is
    involved, so a planted one cannot stop it), bounded like the spool lock."""
    if folder.fd is None:  # pragma: no cover - Windows
        yield
        return
    if not take_lock(folder.fd, LOCK_WAIT_SECONDS):
        raise BlockingIOError("another process is recovering the spool folder")
    try:
        yield
    finally:
        import fcntl

        fcntl.flock(folder.fd, fcntl.LOCK_UN)


def _planted(folder: HotFolder, name: str) -> bool:
    """Whether something that is not a regular file of ours sits at ``name`` (``False`` if nothing does)."""
    try:
        return not trusted_file(folder.lstat(name))
    except OSError:
        return False


def set_aside(folder: HotFolder, name: str) -> None:
    """Get whatever sits at ``name`` out of the way: a folder is renamed to :data:`INTRUDER_PREFIX`..., anything
    else is unlinked (a symlink's target, a hard link's other names and a FIFO's writers are never touched)."""
    import stat

    try:
        st = folder.lstat(name)
    except FileNotFoundError:
        return
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(st.st_mode):
            folder.rename(name, f"{INTRUDER_PREFIX}{time.time_ns()}-{os.getpid()}-{name}")
        else:
            folder.unlink(name)


def reopen(folder: HotFolder, name: str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`~._hook.open_ours`' rare path: set aside what sits at ``name`` if it is not a regular file of ours,
    then open (create) a fresh one; ``(descriptor, fstat)``.

    Recoveries take turns (:func:`_recovering`) and look again under that lock, so a good file that another
    process has just created is never set aside (which, for a lock file, would split its holders in two).
    """
    with _recovering(folder):
        if _planted(folder, name):
            set_aside(folder, name)
        fd = folder.open(name, flags | os.O_CREAT)
        try:
            st = os.fstat(fd)
            if not trusted_file(st):
                raise SpoolError(f"{name} is not a file of ours")
        except BaseException:
            os.close(fd)
            raise
        return fd, st


_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_BINARY


def write_new(folder: HotFolder, name: str, data: bytes) -> str:
    """Write ``data`` to a fresh temporary file (:data:`TMP_PREFIX`) for ``name``; returns its name."""
    tmp = f"{TMP_PREFIX}{os.getpid()}-{time.monotonic_ns()}-{name}"
    fd = folder.open(tmp, _NEW_FLAGS)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        folder.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def replace_file(folder: HotFolder, name: str, data: bytes) -> None:
    """Atomically replace ``name`` with ``data`` (temporary file + rename). The rename replaces a symlink, FIFO
    or foreign file planted at ``name`` without following it; a planted folder is set aside first."""
    import stat

    tmp = write_new(folder, name, data)
    try:
        try:
            folder.rename(tmp, name)
        except OSError:
            try:
                planted = stat.S_ISDIR(folder.lstat(name).st_mode)
            except OSError:
                planted = False
            if not planted:
                raise
            with _recovering(folder):
                set_aside(folder, name)
            folder.rename(tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        raise


def add_counter(folder: HotFolder, key: str, amount: int) -> None:
    """Add ``amount`` to drop counter ``key`` in ``counters``. Caller holds the lock."""
    if amount <= 0:
        return
    counts = _counters_file(folder)  # not read_counters: 'refused' lives in its own file
    counts[key] = counts.get(key, 0) + amount
    replace_file(folder, COUNTERS_NAME, "".join(f"{k}={v}\n" for k, v in sorted(counts.items())).encode("ascii"))


def _counters_file(folder: HotFolder) -> dict[str, int]:
    try:
        data = read_bytes(folder, COUNTERS_NAME, 4096)
    except OSError:
        data = None
    values = parse(data or b"") or {}
    return {k: int(v) for k, v in values.items() if v.isascii() and v.isdigit()}


def read_counters(folder: HotFolder) -> dict[str, int]:
    """The drop counters, with ``refused`` (events turned away beside a busy lock); damage reads as empty."""
    counts = _counters_file(folder)
    try:
        st = folder.lstat(REFUSED_NAME)
    except OSError:
        return counts
    if trusted_file(st) and st.st_size:
        counts["refused"] = counts.get("refused", 0) + st.st_size
    return counts


def seal_active(folder: HotFolder) -> tuple[str, int] | None:
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
        set_aside(folder, ACTIVE_NAME)
        return None
    if st.st_size == 0:
        return None
    if st.st_size > HUGE_ACTIVE_BYTES:
        recut(folder, ACTIVE_NAME)
        return None
    data = read_bytes(folder, ACTIVE_NAME, HUGE_ACTIVE_BYTES) or b""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    name = segment_name(lines)
    folder.rename(ACTIVE_NAME, name)
    return name, lines


SCAN_LIMIT = 64 * 1024 * 1024
""":func:`recut` reads at most this much of a damaged file (~30 ms): what lies beyond is one corrupt remainder."""


def recut(folder: HotFolder, name: str) -> tuple[int, int]:
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
                tmp = write_new(folder, SEGMENT_SUFFIX, b"".join(out))
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


def in_flight(folder: HotFolder, name: str) -> bool:
    """Whether a flusher is sending segment ``name`` right now (it holds a shared ``flock`` on it: see
    :class:`Sending`)."""
    if folder.fd is None:  # pragma: no cover - Windows: no shared locks; the caps may count a resend
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

    def __init__(self, folder: HotFolder, name: str) -> None:
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


def enforce_caps(folder: HotFolder, max_events: int, max_bytes: int) -> int:
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


def append_aside(folder: HotFolder, line: bytes) -> int:
    """Keep the event without the lock: publish it as a one-line sealed segment.

    Used when the lock stays busy past :data:`LOCK_WAIT_SECONDS` (a preempted holder on a loaded machine, or
    a process holding it forever): the command must not wait, and the event must not be lost. The line is
    written to a private temporary name (``O_EXCL``) and renamed to a segment name in one step, so the
    flusher never sees it half-written. Beyond :data:`MAX_ASIDE` such files the event is dropped, and
    counted without the lock: one byte appended to :data:`REFUSED_NAME` (``O_APPEND`` writes of one byte
    never interleave), whose size ``status`` shows as the ``refused`` drop count.
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


def _leftover_aside(folder: HotFolder, name: str, now: float) -> str | None:
    """Publish a complete line a killed appender left in an aside file as its own segment, or delete a torn one
    (counted as ``corrupt``: that line only). Returns a line for the log, or ``None`` if the writer may still
    be at work."""
    from ._event import MAX_LINE_BYTES

    try:
        st = folder.lstat(name)
    except FileNotFoundError:
        return None
    if not trusted_file(st):
        set_aside(folder, name)
        return f"removed {name}: not a file of ours"
    if now - st.st_mtime < STALE_ASIDE_SECONDS and not _writer_gone(name):
        return None
    data = read_bytes(folder, name, MAX_LINE_BYTES + 2) or b""
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


def tidy(folder: HotFolder, now: float) -> list[str]:
    """What killed processes and planted folders left behind, cleared at a claim (caller holds the lock):
    ``tmp-*`` files are deleted, stale aside files published or deleted (:func:`_leftover_aside`), and folders
    set aside at our file names removed if empty (a non-empty one is left, renamed ``.intruder-kept-*``, and
    reported once). Returns lines for the flusher's log."""
    notes = []
    for name in names(folder):
        if name.startswith(TMP_PREFIX):
            with contextlib.suppress(OSError):
                folder.unlink(name)
        elif name.startswith(ASIDE_PREFIX) and name.endswith(ASIDE_SUFFIX):
            note = _leftover_aside(folder, name, now)
            if note:
                notes.append(note)
        elif segment_count(name) is not None:
            if _planted(folder, name):
                set_aside(folder, name)
                notes.append(f"removed {name}: not a segment of ours")
        elif name.startswith(INTRUDER_PREFIX) and not name.startswith(INTRUDER_PREFIX + "kept-"):
            where = name[len(INTRUDER_PREFIX) :].split("-", 2)[-1]
            try:
                os.rmdir(name, dir_fd=folder.fd)
                notes.append(f"removed an empty folder planted at {where}")
            except OSError:
                with contextlib.suppress(OSError):
                    folder.rename(name, INTRUDER_PREFIX + "kept-" + name[len(INTRUDER_PREFIX) :])
                notes.append(f"a folder was planted at {where}; it is kept as {INTRUDER_PREFIX}kept-...")
    return notes


class LockTimeout(TimeoutError):
    """A :class:`FolderLock` was not free within its timeout."""


class FolderLock:
    """The exclusive OS lock on lock file ``name`` of ``folder``, as the hook takes it (:func:`~._hook.lock_fd`):
    opened relative to the folder's descriptor, never by path or through a symlink (anything planted at the name
    is set aside), and taken within ``timeout`` seconds (``0``: one try) or :class:`LockTimeout`. The same
    ``flock`` as :class:`filelock.FileLock` on that file, which the command line uses. Not re-entrant."""

    def __init__(self, folder: HotFolder, name: str, timeout: float) -> None:
        self.folder = folder
        self.name = name
        self.timeout = timeout
        self.fd: int | None = None

    def acquire(self) -> None:
        if self.fd is not None:
            raise RuntimeError(f"{self.name} is already held")
        fd = open_ours(self.folder, self.name, LOCK_FLAGS)[0]
        try:
            taken = take_lock(fd, self.timeout)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            raise LockTimeout(f"{self.name} is held by another process")
        self.fd = fd

    def release(self) -> None:
        """Closing the descriptor releases the lock; the file stays (never delete a lock file)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def purge_if_present(app: App, env: Mapping[str, str]) -> None:
    """ "Disabling also deletes everything queued": a stat is all this costs when there is nothing queued."""
    path = state_dir(app, env)
    if not os.path.isdir(path):
        return
    with Folder(path, create=False) as folder:
        lfd = lock_fd(folder)
        if lfd is None:
            return
        try:
            purge(folder)
        finally:
            os.close(lfd)


class Folder(HotFolder):
    """An open, verified spool folder (see :class:`spool_reporter._hook.Folder`), with the readers the cold
    path uses as methods."""

    __slots__ = ()

    def names(self) -> list[str]:
        """Every name in the folder."""
        return names(self)

    def segments(self) -> list[tuple[str, int, int]]:
        """Sealed segments, oldest first: ``(name, lines, bytes)``."""
        return segments(self)

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """Read a regular file of ours, at most ``limit`` bytes; ``None`` if it does not exist."""
        return read_bytes(self, name, limit)
