"""The state folder and its files, opened so that nothing another user plants there is ever followed.

* :func:`open_dirs` walks to the spool folder one level at a time from ``/`` through directory descriptors
  (``O_DIRECTORY | O_NOFOLLOW``), creating missing levels ``0700`` whatever the umask and checking the owner of
  each; the hook's :class:`~._hook.Folder` takes this walk once, then a one-step path it has verified.
* Whatever sits at one of our file names and is not a regular file of ours -- a symlink, a folder, a FIFO, a hard
  link, another user's file -- is set aside (:func:`set_aside`: a folder renamed, anything else unlinked; a
  link's target is never touched) and replaced by a fresh file (:func:`reopen`), one recovery at a time.
* New files are written under a private temporary name and renamed into place (:func:`write_new`,
  :func:`replace_file`).
* :class:`FolderLock` is the ``flock`` on a lock file of the folder, taken through the folder's descriptor within
  a timeout; :class:`ReadOnlyFolder` reads the folder for ``status`` and ``flush --dry-run`` without creating,
  locking or changing anything, not even a mode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Iterator

from . import SpoolReporterError
from ._hook import (
    DIR_FD,
    DIR_FLAGS,
    DIR_MODE,
    LOCK_FLAGS,
    LOCK_WAIT_SECONDS,
    O_BINARY,
    O_CLOEXEC,
    O_NOFOLLOW,
    OWN_LEVELS,
    READ_FLAGS,
    UID,
    Folder,
    SpoolError,
    open_ours,
    take_lock,
    trusted_file,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "INTRUDER_PREFIX",
    "TMP_PREFIX",
    "FolderLock",
    "LockTimeout",
    "NotOurFolder",
    "ReadOnlyFolder",
    "folder_problem",
    "make_dirs",
    "read_open",
    "record_problem",
    "open_dirs",
    "reopen",
    "replace_file",
    "set_aside",
    "write_new",
]

INTRUDER_PREFIX: Final = ".intruder-"
"""A folder planted at one of our file names is renamed aside to ``.intruder-<ns>-<pid>-<name>`` (anything
else planted there is unlinked: that never touches what a link points to); the flusher logs and clears them."""

TMP_PREFIX: Final = "tmp-"
"""Short-lived files written and renamed under the spool lock (or by the one flusher); one left by a killed
process is deleted by the next claim."""


# --- the state folder, level by level ---


def _trusted_link(name: str, fd: int) -> str | None:
    """The target of symlink ``name`` in folder ``fd`` if root or we own the link (checked twice, around the
    read, so a link swapped in meanwhile is not followed); else ``None``."""

    before = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISLNK(before.st_mode) or before.st_uid not in (0, UID):
        return None
    target = os.readlink(name, dir_fd=fd)
    after = os.stat(name, dir_fd=fd, follow_symlinks=False)
    same = (after.st_ino, after.st_dev, after.st_uid) == (before.st_ino, before.st_dev, before.st_uid)
    return target if same else None


MAX_LINKS: Final = 40
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
                    raise NotOurFolder(f"not our folder: {path}")
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
    else:  # pragma: no cover windows
        _make_dirs_by_path(path)


def _make_dirs_by_path(path: str) -> None:  # pragma: no cover windows - no descriptor-relative calls
    """:func:`make_dirs` where the platform has no descriptor-relative calls: by path, then ``chmod``."""
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
        os.chmod(directory, DIR_MODE)


# --- planted files: set aside, never followed ---


@contextlib.contextmanager
def _recovering(folder: Folder) -> Iterator[None]:
    """One recovery at a time: an exclusive ``flock`` on the folder's own descriptor (no file of ours is
    involved, so a planted one cannot stop it), bounded like the spool lock."""
    if folder.fd is None:  # pragma: no cover windows
        yield
        return
    if not take_lock(folder.fd, LOCK_WAIT_SECONDS):
        raise BlockingIOError("another process is recovering the spool folder")
    try:
        yield
    finally:
        import fcntl

        fcntl.flock(folder.fd, fcntl.LOCK_UN)


def planted(folder: Folder, name: str) -> bool:
    """Whether something that is not a regular file of ours sits at ``name`` (``False`` if nothing does)."""
    try:
        return not trusted_file(folder.lstat(name))
    except OSError:
        return False


def set_aside(folder: Folder, name: str) -> None:
    """Get whatever sits at ``name`` out of the way: a folder is renamed to :data:`INTRUDER_PREFIX`..., anything
    else is unlinked (a symlink's target, a hard link's other names and a FIFO's writers are never touched)."""

    try:
        st = folder.lstat(name)
    except FileNotFoundError:
        return
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(st.st_mode):
            folder.rename(name, f"{INTRUDER_PREFIX}{time.time_ns()}-{os.getpid()}-{name}")
        else:
            folder.unlink(name)


def reopen(folder: Folder, name: str, flags: int) -> tuple[int, os.stat_result]:
    """:func:`~._hook.open_ours`' rare path: set aside what sits at ``name`` if it is not a regular file of ours,
    then open (create) a fresh one; ``(descriptor, fstat)``.

    Recoveries take turns (:func:`_recovering`) and look again under that lock, so a good file that another
    process has just created is never set aside (which, for a lock file, would split its holders in two).
    """
    with _recovering(folder):
        if planted(folder, name):
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


_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_BINARY


def write_new(folder: Folder, name: str, data: bytes) -> str:
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


def replace_file(folder: Folder, name: str, data: bytes) -> None:
    """Atomically replace ``name`` with ``data`` (temporary file + rename). The rename replaces a symlink, FIFO
    or foreign file planted at ``name`` without following it; a planted folder is set aside first."""

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


class LockTimeout(SpoolReporterError, TimeoutError):
    """A :class:`FolderLock` was not free within its timeout."""


class FolderLock:
    """The exclusive OS lock on lock file ``name`` of ``folder``, as the hook takes it (:func:`~._hook.lock_fd`):
    opened relative to the folder's descriptor, never by path or through a symlink (anything planted at the name
    is set aside), and taken within ``timeout`` seconds (``0``: one try) or :class:`LockTimeout`. The same
    ``flock`` as :class:`filelock.FileLock` takes on that file (``tests/client/test_lock_interop.py``). Not
    re-entrant."""

    def __init__(self, folder: Folder, name: str, timeout: float) -> None:
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


def read_open(fd: int, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the open file ``fd`` (named ``name``), if it is a regular file of ours; else
    :class:`~._hook.SpoolError`."""
    if not trusted_file(os.fstat(fd)):
        raise SpoolError(f"not a file of ours: {name}")
    chunks = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


class ReadOnlyFolder:
    """The spool folder opened for reading only (``flush --dry-run``, ``status``): level by level through
    descriptors as every writer opens it (a symlink planted at ``spool_reporter/`` or above is never followed
    into someone else's folder), changing nothing, not even a mode. :attr:`usable` is false when there is no
    such folder of ours."""

    def __init__(self, path: str, *, own: int = OWN_LEVELS) -> None:
        self.path = path
        self.fd: int | None = None
        if DIR_FD:
            try:
                self.fd = open_dirs(path, create=False, own=own, tighten=False)
            except OSError:
                self.usable = False
                return
            self.usable = True
        else:  # pragma: no cover windows
            self.usable = os.path.isdir(path) and not os.path.islink(path)

    def __enter__(self) -> ReadOnlyFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def names(self) -> list[str]:
        if not self.usable:
            return []
        try:
            return os.listdir(self.fd if self.fd is not None else self.path)
        except OSError:
            return []

    def read(self, name: str, limit: int) -> bytes:
        """A regular file of ours, at most ``limit`` bytes; ``b""`` for anything else."""
        if not self.usable:
            return b""
        try:
            if self.fd is not None:
                fd = os.open(name, READ_FLAGS, dir_fd=self.fd)
            else:  # pragma: no cover windows
                fd = os.open(os.path.join(self.path, name), READ_FLAGS)
        except OSError:
            return b""
        try:
            return read_open(fd, name, limit)
        except OSError:
            return b""
        finally:
            os.close(fd)


# -- why a folder cannot be used, in words ----------------------------------------------------------------------
#
# The walk above decides through descriptors; these only describe, for the command line's messages, what stood in
# the way, looked at with ``lstat``/``access`` and never acted upon.


class NotOurFolder(SpoolError):
    """A level of the spool folder that must be this user's (:data:`~._hook.OWN_LEVELS`) belongs to another."""


def read_bytes(folder: Folder, name: str, limit: int) -> bytes | None:
    """Read a regular file of ours, at most ``limit`` bytes; ``None`` if it does not exist."""
    try:
        fd = folder.open(name, READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        return read_open(fd, name, limit)
    finally:
        os.close(fd)


def _denied(path: str) -> str:
    """The folder that refuses access on the way to ``path``: the first one this user cannot enter, else
    ``path`` itself (which it cannot read)."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts)):
        ancestor = os.sep.join(parts[:i]) or os.sep
        if os.path.isdir(ancestor) and not os.access(ancestor, os.X_OK):
            return ancestor
    return path


def _blocker(path: str) -> tuple[str, str]:
    """The first component of ``path`` that the spool code refuses to follow (``"link"``: another user's link,
    or a link at one of the last two levels, ``spool_reporter/`` and the application's folder) or that is not a
    folder (``"file"``), read with ``lstat``: a description for the message, never a decision (the spool code
    decides through descriptors)."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        here = os.sep.join(parts[:i])
        try:
            st = os.lstat(here)
        except OSError:
            break
        if stat.S_ISLNK(st.st_mode):
            if i >= len(parts) - 1 or st.st_uid not in (0, os.geteuid() if hasattr(os, "geteuid") else 0):
                return here, "link"
            continue
        if not stat.S_ISDIR(st.st_mode):
            return here, "file"
    return path, ""


def folder_problem(path: str, exc: OSError) -> str:
    """The real reason the spool folder at ``path`` cannot be used, naming the path once."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if isinstance(cause, PermissionError):
        denied = _denied(path)
        where = "" if denied == path else f" ({denied} cannot be entered)"
        return f"cannot read the spool folder {path}: permission denied{where}"
    if cause.errno in (errno.ELOOP, errno.ENOTDIR):
        blocker, what = _blocker(path)
        if what == "link":
            return f"the spool folder {path} is reached through the symbolic link {blocker}; refusing to follow it"
        if what == "file":
            return f"the spool folder {path} cannot be made: {blocker} is not a folder"
        return f"the spool folder {path} is not a folder (or a file stands in its path)"
    if isinstance(exc, NotOurFolder):
        return f"the spool folder {path} belongs to another user; refusing to use it"
    return f"cannot use the spool folder {path}: {cause.strerror or cause}"


def record_problem(path: str) -> str | None:
    """Why no event can be recorded in the spool folder at ``path``, or ``None``; looked at, never tried (nothing
    is created). The hook makes the folder and its parents as it records, and says nothing when it cannot (it
    must never disturb the command it runs in): a read-only home, or a folder this user may not write, would lose
    every event unseen. The first folder of the path that exists must let this user add entries."""
    here = path
    for _ in range(path.count(os.sep) + 1):
        try:
            st = os.stat(here)
            break
        except FileNotFoundError:
            here = os.path.dirname(here)
        except OSError:
            return None  # unreadable: folder_problem says why
    else:
        return None
    made = "" if here == path else f"cannot be created: {here} "
    if not stat.S_ISDIR(st.st_mode):
        return f"events cannot be recorded: the spool folder {path} {made}is not a folder"
    if os.access(here, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return None
    read_only = False
    with contextlib.suppress(AttributeError, OSError):
        read_only = bool(os.ST_RDONLY & os.statvfs(here).f_flag)
    why = os.strerror(errno.EROFS if read_only else errno.EACCES)
    return f"events cannot be recorded: the spool folder {path} {made}cannot be written ({why})"
