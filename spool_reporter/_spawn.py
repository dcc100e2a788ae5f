"""Starting the detached flusher from the hook: rarely, cheaply, never waiting for it (docs/flusher.md)."""

# This module is imported by the hook after every recorded event, so -- like _hot -- it explains itself in
# comments (docstrings are part of the .pyc, and every byte of it costs the user's command), imports only
# what a Django process already has (os, sys, time; subprocess and threading only when actually spawning),
# and never logs. Do not log here.
#
# maybe_spawn() decides with a few stat calls:
# 1. a destination is named (<P>_ANALYTICS_ENDPOINT, or endpoint= in the user file or the policy; the flusher
#    validates it), this is not a flusher (no recursion), and not a frozen executable (`-m` cannot relaunch it);
# 2. the back-off has expired: GATE_NAME's mtime is the "not before" time the last failed flusher wrote;
# 3. SPAWN_INTERVAL has passed since the last spawn (STAMP_NAME's mtime, touched *before* spawning so that
#    concurrent commands do not all spawn) -- unless the active spool passed SPAWN_THRESHOLD_BYTES or the
#    caller is long-lived (runserver);
# 4. no flusher is running: a non-blocking flock on FLUSHER_LOCK_NAME succeeds (released at once; the flusher
#    takes the same lock through filelock for its whole life).
# The child: `nice -n 19 python -P -m spool_reporter._flush --app <slug> ...` in a new session, stdio on the
# null device, no inherited descriptors (so `django-admin startproject x | cat` ends with the command), its
# working directory in the spool folder (`-m` puts the working directory on sys.path on Python < 3.11: the
# user's project must never shadow a module), and SPOOL_REPORTER_FLUSHER=1 in its environment. Windows:
# CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW | BELOW_NORMAL_PRIORITY_CLASS. A daemon thread wait()s for the
# child, so a long-lived parent keeps no zombie and a short-lived one does not wait for it.

from __future__ import annotations

import os
import sys
import time

# The gate runs in the hook, so it lives in _hot (no second module to import for a "no"); named here too.
from ._hot import (
    FLUSHER_ENV,
    FLUSHER_LOCK_FD_ENV,
    FLUSHER_LOCK_NAME,
    GATE_NAME,
    SPAWN_GAP,
    SPAWN_INTERVAL,
    SPAWN_INTERVAL_ENV,
    SPAWN_THRESHOLD_BYTES,
    STAMP_NAME,
    claim_flusher_lock,
    due,
    gate_open,
    has_destination,
    open_ours,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from typing import Final

    from ._app import App
    from ._hot import Folder

__all__ = [
    "BELOW_NORMAL_PRIORITY_CLASS",
    "CREATE_NEW_PROCESS_GROUP",
    "CREATE_NO_WINDOW",
    "FLUSHER_ENV",
    "FLUSHER_LOCK_FD_ENV",
    "FLUSHER_LOCK_NAME",
    "GATE_NAME",
    "SPAWN_INTERVAL",
    "SPAWN_GAP",
    "SPAWN_INTERVAL_ENV",
    "SPAWN_THRESHOLD_BYTES",
    "STAMP_NAME",
    "SpawnSpec",
    "due",
    "flusher_args",
    "has_destination",
    "maybe_spawn",
    "nice_command",
    "spawn_spec",
    "start",
]

# Windows process creation flags (winbase.h), spelled out: subprocess defines them only on Windows.
CREATE_NEW_PROCESS_GROUP: Final = 0x00000200
CREATE_NO_WINDOW: Final = 0x08000000
BELOW_NORMAL_PRIORITY_CLASS: Final = 0x00004000

# POSIX nice lowers the priority before the interpreter starts. Measured on a busy 2-core machine, a flusher
# started at normal priority slowed the next `django -m --version` by ~95 ms (its interpreter start and
# urllib3/filelock imports alone), one started under `nice -n 19` by ~4 ms; the flusher also calls os.nice.
NICE_PATHS: Final = ("/usr/bin/nice", "/bin/nice")

_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_TOUCH_FLAGS: Final = os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)


class SpawnSpec:
    # Everything subprocess.Popen is given, computed by the pure spawn_spec() so tests check every platform.
    __slots__ = ("args", "creationflags", "cwd", "env", "pass_fds", "start_new_session")

    def __init__(
        self,
        *,
        args: list[str],
        env: dict[str, str],
        cwd: str | None,
        start_new_session: bool,
        creationflags: int,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.args = args
        self.env = env
        self.cwd = cwd
        self.start_new_session = start_new_session
        self.creationflags = creationflags
        self.pass_fds = pass_fds


def nice_command() -> list[str]:
    # [nice, "-n", "19"] when POSIX nice exists, else [] (the flusher still lowers its own priority).
    for path in NICE_PATHS:
        if os.path.exists(path):
            return [path, "-n", "19"]
    return []


def flusher_args(app: App, executable: str, *, safe_path: bool, nice: list[str] | None = None) -> list[str]:
    # The flusher's command line. safe_path adds -P (Python 3.11+: the working directory is not on sys.path).
    return [
        *(nice or []),
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
    nice: list[str] | None = None,
    lock_fd: int | None = None,
) -> SpawnSpec:
    # How to start the flusher, as Popen arguments. On POSIX the already-locked flusher.lock descriptor is
    # passed on (the only descriptor the child inherits); Windows locks are not inherited that way.
    args = flusher_args(app, executable, safe_path=safe_path, nice=nice)
    env = dict(environ)
    env[FLUSHER_ENV] = "1"
    env.pop(FLUSHER_LOCK_FD_ENV, None)
    if windows:
        flags = CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW | BELOW_NORMAL_PRIORITY_CLASS
        return SpawnSpec(args=args, env=env, cwd=cwd, start_new_session=False, creationflags=flags)
    if lock_fd is not None:
        env[FLUSHER_LOCK_FD_ENV] = str(lock_fd)
    pass_fds = () if lock_fd is None else (lock_fd,)
    return SpawnSpec(args=args, env=env, cwd=cwd, start_new_session=True, creationflags=0, pass_fds=pass_fds)


def _touch(folder: Folder, name: str, when: float) -> None:
    fd = open_ours(folder, name, _TOUCH_FLAGS)[0]  # anything planted at the name is set aside, never followed
    try:
        if os.utime in os.supports_fd:
            os.utime(fd, (when, when))
        else:  # pragma: no cover - Windows
            os.utime(os.path.join(folder.path, name), (when, when))
    finally:
        os.close(fd)


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
    """Start a flusher if one is due; whether one was started. The hook catches anything raised here."""
    env = os.environ if environ is None else environ
    if env.get(FLUSHER_ENV) or getattr(sys, "frozen", False) or not sys.executable:
        return False
    if not has_destination(app, env, user, policy):
        return False
    now = time.time()
    if not gate_open(folder, active_size, long_lived=long_lived, env=env, now=now):
        return False
    lock = claim_flusher_lock(folder)
    if lock is None:  # a flusher is running
        return False
    try:
        return start(app, folder, env, now, lock_fd=lock)
    finally:
        os.close(lock)


def start(app: App, folder: Folder, env: Mapping[str, str], now: float, *, lock_fd: int | None = None) -> bool:
    """Start a flusher now (the gate said yes): stamp the time, then spawn. The hook calls this directly,
    holding ``flusher.lock`` as ``lock_fd``, which the child inherits (the caller closes its copy)."""
    _touch(folder, STAMP_NAME, now)
    windows = sys.platform == "win32"
    spec = spawn_spec(
        app,
        executable=sys.executable,
        environ=env,
        cwd=folder.path,
        windows=windows,
        safe_path=sys.version_info >= (3, 11),
        nice=None if windows else nice_command(),
        lock_fd=None if windows else lock_fd,
    )
    return _start(spec)


def _popen(spec: SpawnSpec) -> subprocess.Popen[bytes]:
    import subprocess

    child = subprocess.Popen(
        spec.args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        pass_fds=spec.pass_fds,
        cwd=spec.cwd,
        env=spec.env,
        start_new_session=spec.start_new_session,
        creationflags=spec.creationflags,
    )
    if spec.start_new_session and sys.platform.startswith("linux"):
        # Linux autogroups share the CPU between sessions before nice values count, so a new session at nice 19
        # still takes a full share from the user's next command while Python starts (measured +50-90 ms on a
        # busy 2-core machine). Renice the child's new group now, before its interpreter starts (Popen returns
        # once `nice` is exec'd); the flusher does it again itself. A kernel without autogroups has no file.
        try:
            fd = os.open(f"/proc/{child.pid}/autogroup", os.O_WRONLY | _O_CLOEXEC)
            try:
                os.write(fd, b"19")
            finally:
                os.close(fd)
        except OSError:
            pass
    return child


def _start(spec: SpawnSpec) -> bool:
    import threading

    try:
        child = _popen(spec)
    except OSError:
        return False
    # Reap the child whenever it ends (no zombie under runserver); a daemon thread never delays the exit.
    threading.Thread(target=child.wait, name="spool_reporter-reaper", daemon=True).start()
    return True
