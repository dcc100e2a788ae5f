"""Starting the detached flusher from the hook: rarely, cheaply, and never waiting for it.

:func:`maybe_spawn` runs inside the user's command after a successful append (spool lock released). It
decides with a few ``stat`` calls and no imports beyond what a Django process already has:

1. a destination is configured (``<P>_ANALYTICS_ENDPOINT`` or an ``endpoint=`` key; the flusher validates
   it), and this is not a frozen executable (``python -m`` cannot relaunch one) nor a flusher itself;
2. the back-off has expired: :data:`GATE_NAME`'s mtime is the "not before" time the last failed flusher
   wrote (one ``stat``);
3. :data:`SPAWN_INTERVAL` has passed since the last spawn (:data:`STAMP_NAME`'s mtime, touched *before*
   spawning so concurrent commands do not all spawn) -- unless the active spool is larger than
   :data:`SPAWN_THRESHOLD_BYTES` or the caller is long-lived (``runserver``);
4. no flusher is running: a non-blocking ``flock`` on :data:`FLUSHER_LOCK_NAME` succeeds (and is released
   at once; the flusher takes it through :mod:`filelock`).

The child is ``python -m spool_reporter._flush`` in a new session, with stdio on the null device and no
inherited descriptors (so ``django-admin startproject x | cat`` ends with the command), its working
directory in the spool folder (``-m`` puts the working directory on ``sys.path``: the user's project must
never shadow a module), and :data:`~spool_reporter._hook.FLUSHER_ENV` set (nothing is recorded from inside
it). On Windows it gets ``CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW`` and below-normal priority; on POSIX
the flusher lowers its own priority first thing. A daemon thread ``wait()``\\ s for the child so that a
long-lived parent never keeps a zombie.

Stdlib only, and ``subprocess``/``threading`` are imported only when a flusher is actually started. Do not
log here.
"""

from __future__ import annotations

import os
import sys
import time

from . import _spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from ._app import App
    from ._spool import Folder

FLUSHER_LOCK_NAME: Final = "flusher.lock"
"""Held by the running flusher for its whole life (one at a time); like ``spool.lock``, never deleted."""

GATE_NAME: Final = "flush.notbefore"
"""Its mtime is the earliest time the next background flusher may start (the back-off, on disk)."""

STAMP_NAME: Final = "flush.spawned"
"""Its mtime is when the hook last started a flusher."""

SPAWN_INTERVAL: Final = 300.0
"""Seconds between spawns: a flusher costs ~100 ms of CPU that competes with the next command on a
2-core laptop (DESIGN constraint 5); events are not urgent."""

SPAWN_INTERVAL_ENV: Final = "SPOOL_REPORTER_SPAWN_INTERVAL"
"""Shortens :data:`SPAWN_INTERVAL` (tests); a larger or malformed value is ignored."""

SPAWN_THRESHOLD_BYTES: Final = 64 * 1024
"""An active spool this large (~150 events) starts a flusher regardless of the interval."""

CREATE_NEW_PROCESS_GROUP: Final = 0x00000200
CREATE_NO_WINDOW: Final = 0x08000000
BELOW_NORMAL_PRIORITY_CLASS: Final = 0x00004000
# Windows process creation flags (winbase.h); spelled out because subprocess defines them only on Windows.

_TOUCH_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
)
_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class SpawnSpec:
    """Everything :class:`subprocess.Popen` is given, computed by the pure :func:`spawn_spec`."""

    __slots__ = ("args", "creationflags", "cwd", "env", "start_new_session")

    def __init__(
        self, *, args: list[str], env: dict[str, str], cwd: str | None, start_new_session: bool, creationflags: int
    ) -> None:
        self.args = args
        self.env = env
        self.cwd = cwd
        self.start_new_session = start_new_session
        self.creationflags = creationflags


def flusher_args(app: App, executable: str, *, safe_path: bool) -> list[str]:
    """The flusher's command line (``-P``: Python 3.11+ does not put the working directory on sys.path)."""
    return [
        executable,
        *(["-P"] if safe_path else []),
        "-m",
        "spool_reporter._flush",
        "--app",
        app.slug,
        "--name",
        app.name,
        "--config-name",
        app.config_name,
        "--env-prefix",
        app.env_prefix,
    ]


def spawn_spec(
    app: App,
    *,
    executable: str,
    environ: Mapping[str, str],
    cwd: str | None,
    windows: bool,
    safe_path: bool = False,
) -> SpawnSpec:
    """How to start the flusher: pure, so the platform-specific flags are unit-tested everywhere."""
    from ._hook import FLUSHER_ENV

    env = dict(environ)
    env[FLUSHER_ENV] = "1"
    if windows:
        flags = CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW | BELOW_NORMAL_PRIORITY_CLASS
        return SpawnSpec(
            args=flusher_args(app, executable, safe_path=safe_path),
            env=env,
            cwd=cwd,
            start_new_session=False,
            creationflags=flags,
        )
    return SpawnSpec(
        args=flusher_args(app, executable, safe_path=safe_path),
        env=env,
        cwd=cwd,
        start_new_session=True,
        creationflags=0,
    )


def has_destination(
    app: App, env: Mapping[str, str], user: dict[str, str] | None, policy: dict[str, str] | None
) -> bool:
    """The cheap check: something names an endpoint (the flusher validates it)."""
    if env.get(app.env_endpoint, "").strip():
        return True
    return any(values is not None and values.get("endpoint", "").strip() for values in (user, policy))


def _interval(env: Mapping[str, str]) -> float:
    raw = env.get(SPAWN_INTERVAL_ENV)
    if raw:
        try:
            return min(SPAWN_INTERVAL, max(0.0, float(raw)))
        except ValueError:
            pass
    return SPAWN_INTERVAL


def _mtime(folder: Folder, name: str) -> float | None:
    try:
        return folder.lstat(name).st_mtime
    except OSError:
        return None


def _flusher_running(folder: Folder) -> bool:
    fd = folder.open(FLUSHER_LOCK_NAME, _LOCK_FLAGS)
    try:
        return not _spool._try_lock(fd)
    finally:
        os.close(fd)  # releases the probe's lock at once


def _touch(folder: Folder, name: str, when: float) -> None:
    fd = folder.open(name, _TOUCH_FLAGS)
    try:
        if os.utime in os.supports_fd:
            os.utime(fd, (when, when))
        else:  # pragma: no cover - Windows
            os.utime(os.path.join(folder.path, name), (when, when))
    finally:
        os.close(fd)


def due(
    folder: Folder,
    active_size: int,
    *,
    long_lived: bool,
    env: Mapping[str, str],
    now: float,
) -> bool:
    """Steps 2-4 of the module docstring: back-off expired, interval passed, no flusher running."""
    gate = _mtime(folder, GATE_NAME)
    if gate is not None and gate > now:
        return False
    if not long_lived and active_size < SPAWN_THRESHOLD_BYTES:
        stamp = _mtime(folder, STAMP_NAME)
        interval = _interval(env)
        # A stamp in the future (the clock was set back) counts as expired rather than blocking for long.
        if stamp is not None and now - interval < stamp <= now + 60:
            return False
    return not _flusher_running(folder)


def maybe_spawn(
    app: App,
    folder: Folder,
    active_size: int,
    *,
    long_lived: bool,
    environ: Mapping[str, str] | None = None,
    user: dict[str, str] | None = None,
    policy: dict[str, str] | None = None,
) -> bool:
    """Start a flusher if one is due. Returns whether one was started. Never raises (the hook catches)."""
    env = os.environ if environ is None else environ
    from ._hook import FLUSHER_ENV

    if env.get(FLUSHER_ENV) or getattr(sys, "frozen", False) or not sys.executable:
        return False
    if not has_destination(app, env, user, policy):
        return False
    now = time.time()
    if not due(folder, active_size, long_lived=long_lived, env=env, now=now):
        return False
    _touch(folder, STAMP_NAME, now)
    return _start(
        spawn_spec(
            app,
            executable=sys.executable,
            environ=env,
            cwd=folder.path,
            windows=sys.platform == "win32",
            safe_path=sys.version_info >= (3, 11),
        )
    )


def _start(spec: SpawnSpec) -> bool:
    import subprocess
    import threading

    try:
        child = subprocess.Popen(
            spec.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            cwd=spec.cwd,
            env=spec.env,
            start_new_session=spec.start_new_session,
            creationflags=spec.creationflags,
        )
    except OSError:
        return False
    # Reap the child whenever it ends, so a long-lived parent (runserver) keeps no zombie; a daemon thread
    # never delays the parent's exit.
    threading.Thread(target=child.wait, name="spool_reporter-reaper", daemon=True).start()
    return True
