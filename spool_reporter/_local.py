"""Local mode's own folder: the events recorded under the notice's local wording ("never sent").

The hook records them in ``<spool folder>/local/`` (:func:`~._hook.local_dir`), a spool of its own (the same
files, lock and caps) that no flusher reads. So what was recorded under "never sent" stays on this machine
whatever happens later (a distributor's policy removed, a second tool sharing the home folder, an environment
variable): only ``enable`` moves it into the queue (:func:`send_local`), after saying how many events will
leave. ``disable``, ``purge``, ``forget`` and a hook or flusher that finds reporting turned off delete it with
the folder (:func:`purge_app`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass

from . import _files, _hook, _spool
from ._hook import LOCAL_FOLDER, LOCAL_OWN_LEVELS, LOCK_NAME, App, Folder

__all__ = ["Moved", "count_local", "local_events", "purge_app", "remove_local", "send_local"]


def _open(app: App, env: Mapping[str, str]) -> Folder | None:
    """The local folder, or ``None`` when there is none (raises :class:`OSError` for one that cannot be used)."""
    try:
        return Folder(_hook.local_dir(app, env), create=False, own=LOCAL_OWN_LEVELS)
    except FileNotFoundError:
        return None


def local_events(app: App, env: Mapping[str, str]) -> list[dict[str, object]]:
    """The events recorded in local mode, oldest first, read without writing, locking or creating anything."""
    return _spool.read_queued(_hook.local_dir(app, env), own=LOCAL_OWN_LEVELS)[0]


def count_local(app: App, env: Mapping[str, str]) -> int:
    """How many events recorded in local mode are kept on this machine (read-only)."""
    return len(local_events(app, env))


@dataclass(frozen=True)
class Moved:
    """What :func:`send_local` did."""

    events: int
    """Valid events moved into the queue (the next flusher sends them)."""
    dropped: int = 0
    """Queued events the caps then dropped, oldest first (``max_events``, ``max_bytes``)."""
    queued: int = 0
    """Events queued afterwards, these included: what the next flusher sends."""


def send_local(app: App, env: Mapping[str, str], *, wait: float) -> Moved:
    """Move every event recorded in local mode into the queue, under both spool locks: ``enable``'s explicit
    yes. Segments are renamed whole (their names keep their place in the order); the caps then apply to the
    queue as at any claim. Raises :class:`~._files.LockTimeout` when a lock stays busy for ``wait`` seconds,
    :class:`OSError` for a folder that cannot be used."""
    local = _open(app, env)
    if local is None:
        return Moved(0)
    user = _hook.read(_hook.user_config_path(app, env))
    user = None if _hook.is_broken(user) else user
    # Local first, then the queue: the hook and the flusher take one of them at a time, so no cycle.
    with (
        local,
        Folder(_hook.state_dir(app, env), create=True) as main,
        _files.FolderLock(local, LOCK_NAME, wait),
        _files.FolderLock(main, LOCK_NAME, wait),
    ):
        _spool.tidy(local, time.time())  # lines a busy lock left aside become segments
        _spool.seal_active(local)
        moved = 0
        taken = set(_spool.names(main))
        for name, count, _ in _spool.segments(local):
            events, _ = _spool.parse_lines(_files.read_bytes(local, name, _spool.SCAN_LIMIT) or b"")
            target = name
            while target in taken:  # another segment of the queue has this name: a fresh one, in order
                target = _spool.segment_name(count)
            _rename_between(local, name, main, target)
            taken.add(target)
            moved += len(events)
        dropped = _spool.enforce_caps(
            main,
            _hook.int_setting(user, "max_events", _hook.MAX_EVENTS),
            _hook.int_setting(user, "max_bytes", _hook.MAX_BYTES),
        )
        queued = _spool.count_queued(main)
    return Moved(moved, dropped, queued)


def _rename_between(src: Folder, name: str, dst: Folder, target: str) -> None:
    if src.fd is not None and dst.fd is not None:
        os.rename(name, target, src_dir_fd=src.fd, dst_dir_fd=dst.fd)
    else:  # pragma: no cover windows
        os.replace(os.path.join(src.path, name), os.path.join(dst.path, target))


def remove_local(app: App, env: Mapping[str, str], *, wait: float) -> int:
    """Delete the events recorded in local mode and the local folder itself; how many events. A hook that
    finds reporting off checks for the folder by name, so an emptied folder must not stay behind."""
    local = _open(app, env)
    if local is None:
        return 0
    with local, _files.FolderLock(local, LOCK_NAME, wait):
        deleted = _spool.purge(local)
        for name in _spool.names(local):
            with contextlib.suppress(OSError):
                if not stat.S_ISDIR(local.lstat(name).st_mode):
                    local.unlink(name)
    with contextlib.suppress(OSError), Folder(_hook.state_dir(app, env), create=False) as main:
        if main.fd is not None:
            os.rmdir(LOCAL_FOLDER, dir_fd=main.fd)
        else:  # pragma: no cover windows
            os.rmdir(os.path.join(main.path, LOCAL_FOLDER))
    return deleted


def purge_app(app: App, env: Mapping[str, str], *, wait: float) -> int:
    """Delete everything queued for ``app``, in the queue and in the local folder; how many events. Raises as
    :func:`~._spool.purge_folder` does."""
    return _spool.purge_folder(_hook.state_dir(app, env), wait=wait) + remove_local(app, env, wait=wait)
