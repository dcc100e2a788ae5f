"""Starting the detached flusher from the hook: rarely, cheaply, never waiting for it (docs/flusher.md)."""

# This module is imported by the hook only when it starts a flusher, so -- like _hook -- it explains itself in
# comments (docstrings are part of the .pyc, and every byte of it costs the user's command), imports only
# what a Django process already has (os, sys, time; subprocess and threading only when actually spawning),
# and never logs. Do not log here.
#
# The hook decides whether a flusher is due (its spawn gate: a destination, the back-off, the interval, no flusher
# running; spool_reporter/_hook.py) and holds flusher.lock when it calls start(), which stamps the time and spawns.
# The child: `nice -n 19 python -P -m spool_reporter._detached --app <slug> ...` in a new session, stdio on the
# null device, no inherited descriptors but the locked flusher.lock (so `django-admin startproject x | cat`
# ends with the command), its working directory in the spool folder (`-m` puts the working directory on
# sys.path on Python < 3.11: the user's project must never shadow a module), and SPOOL_REPORTER_FLUSHER=1 in its
# environment. Windows: CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW | BELOW_NORMAL_PRIORITY_CLASS.
#
# How, on POSIX: os.posix_spawn, not subprocess. Importing subprocess costs a small command line ~12 ms (it pulls
# in signal, threading, selectors, contextlib...; Django has paid for it already, a plain tool has not), which was
# most of what a flusher-starting run added (benchmarks/bench_spawn.py). posix_spawn(setsid=True) starts the
# new session (Python 3.8+, so 3.10 too); file actions put stdio on the null device, close every other
# inheritable descriptor (POSIX_SPAWN_CLOSEFROM where Python 3.13 and the C library have it, else one close per
# inheritable descriptor listed in /proc/self/fd or /dev/fd) and dup2 the lock to a fixed low number, which also
# clears its close-on-exec flag. posix_spawn has no working-directory action, so the child is `/bin/sh -c
# 'cd -- "$1" && shift && exec "$@"'` followed by the command: the shell changes directory and execs `nice`,
# which execs Python, all in the same process (one session, one autogroup to renice). Where posix_spawn, its
# setsid or /bin/sh is missing, subprocess does it as before (and always on Windows).
#
# No zombie: a daemon thread waits for the child when the parent is long-lived (the caller said so; importing
# threading is then worth it) or has threading loaded already (Django, servers, most long-running programs).
# Otherwise the parent is a short command: importing threading would cost it ~3-5 ms, and when it exits its
# child goes to init, which reaps it; until then the ended flusher may show as a zombie, and the next start in
# the same process reaps earlier children (waitpid WNOHANG, never another process's children).

import os
import sys

from ._hook import (
    FLUSHER_ENV,
    FLUSHER_LOCK_FD_ENV,
    O_CLOEXEC,
    O_NOFOLLOW,
    O_NONBLOCK,
    STAMP_NAME,
    open_ours,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping
    from typing import Final

    from ._hook import App, Folder

__all__ = [
    "BELOW_NORMAL_PRIORITY_CLASS",
    "CREATE_NEW_PROCESS_GROUP",
    "CREATE_NO_WINDOW",
    "flusher_args",
    "nice_command",
    "posix_plan",
    "spawn_spec",
    "SpawnSpec",
    "start",
    "start_forget_if_due",
]

# Windows process creation flags (winbase.h), spelled out: subprocess defines them only on Windows.
CREATE_NEW_PROCESS_GROUP: "Final" = 0x00000200
CREATE_NO_WINDOW: "Final" = 0x08000000
BELOW_NORMAL_PRIORITY_CLASS: "Final" = 0x00004000

# POSIX nice lowers the priority before the interpreter starts. Measured on a busy 2-core machine, a flusher
# started at normal priority slowed the next `django -m --version` by ~95 ms (its interpreter start and
# imports alone), one started under `nice -n 19` by ~4 ms; the flusher also calls os.nice.
NICE_PATHS: "Final" = ("/usr/bin/nice", "/bin/nice")


# The shell's script between posix_spawn and `nice`: change to the spool folder ("$1"), then become the command.
_CD_THEN_EXEC: "Final" = 'cd -- "$1" && shift && exec "$@"'
_SH: "Final" = "/bin/sh"
# The descriptor number flusher.lock has in the child (announced in SPOOL_REPORTER_FLUSHER_LOCK_FD); 4 when the
# parent's copy is 3 already, so that dup2 always changes the number (dup2 onto itself would keep close-on-exec).
_LOCK_TARGET: "Final" = 3
# Children started without a reaper thread; the next start in this process reaps those that ended.
_UNREAPED: "list[int]" = []


class SpawnSpec:
    # Everything the child is started with, computed by the pure spawn_spec() so tests check every platform.
    # long_lived: the parent lives long, so a thread reaps the child even if threading is not loaded yet.
    __slots__ = ("args", "creationflags", "cwd", "env", "long_lived", "pass_fds", "start_new_session")

    def __init__(
        self,
        *,
        args: "list[str]",
        env: "dict[str, str]",
        cwd: "str | None",
        start_new_session: bool,
        creationflags: int,
        pass_fds: "tuple[int, ...]" = (),
        long_lived: bool = False,
    ) -> None:
        self.args = args
        self.env = env
        self.cwd = cwd
        self.start_new_session = start_new_session
        self.creationflags = creationflags
        self.pass_fds = pass_fds
        self.long_lived = long_lived


def nice_command() -> "list[str]":
    # [nice, "-n", "19"] when POSIX nice exists, else [] (the flusher still lowers its own priority).
    for path in NICE_PATHS:
        if os.path.exists(path):
            return [path, "-n", "19"]
    return []


def flusher_args(
    app: "App", executable: str, *, safe_path: bool, nice: "list[str] | None" = None, forget: bool = False
) -> "list[str]":
    # The flusher's command line. safe_path adds -P (Python 3.11+: the working directory is not on sys.path);
    # forget: a run that only sends the forget a `disable` left (spool_reporter/_withdraw.py), no events.
    return [
        *(nice or []),
        executable,
        *(["-P"] if safe_path else []),
        "-m",
        "spool_reporter._detached",
        "--app",
        app.slug,
        "--name",
        app.name,
        "--config-name",
        app.config_name,
        "--env-prefix",
        app.env_prefix,
        *(["--forget"] if forget else []),
    ]


def spawn_spec(
    app: "App",
    *,
    executable: str,
    environ: "Mapping[str, str]",
    cwd: "str | None",
    windows: bool,
    safe_path: bool = False,
    nice: "list[str] | None" = None,
    lock_fd: "int | None" = None,
    default_endpoint: "str | None" = None,
    long_lived: bool = False,
    forget: bool = False,
) -> "SpawnSpec":
    # How to start the flusher, as Popen arguments. On POSIX the already-locked flusher.lock descriptor is
    # passed on (the only descriptor the child inherits); Windows locks are not inherited that way.
    # default_endpoint: the App's own default destination, in effect because nothing else names one. The
    # flusher rebuilds the App from its names alone, so the default travels as <P>_ANALYTICS_ENDPOINT (with the
    # App's transport unless the environment names one): the destination the flusher resolves is the one
    # this process would.
    args = flusher_args(app, executable, safe_path=safe_path, nice=nice, forget=forget)
    env = dict(environ)
    env[FLUSHER_ENV] = "1"
    env.pop(FLUSHER_LOCK_FD_ENV, None)
    if default_endpoint is not None:
        env[app.env_endpoint] = default_endpoint
        if not env.get(app.env_transport, "").strip():
            env[app.env_transport] = app.transport
    if windows:
        flags = CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW | BELOW_NORMAL_PRIORITY_CLASS
        return SpawnSpec(
            args=args, env=env, cwd=cwd, start_new_session=False, creationflags=flags, long_lived=long_lived
        )
    if lock_fd is not None:
        env[FLUSHER_LOCK_FD_ENV] = str(lock_fd)
    pass_fds = () if lock_fd is None else (lock_fd,)
    return SpawnSpec(
        args=args,
        env=env,
        cwd=cwd,
        start_new_session=True,
        creationflags=0,
        pass_fds=pass_fds,
        long_lived=long_lived,
    )


_TOUCH_FLAGS: "Final" = os.O_WRONLY | os.O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK


def touch(folder: "Folder", name: str, when: float) -> None:
    # Create file ``name`` of the spool folder if needed (setting aside anything planted there) and set its mtime
    # to ``when``: the files of the spawn gate, flush.spawned (the hook's stamp) and flush.notbefore (the
    # flusher's back-off).
    fd = open_ours(folder, name, _TOUCH_FLAGS)[0]
    try:
        if os.utime in os.supports_fd:
            os.utime(fd, (when, when))
        else:  # pragma: no cover windows
            os.utime(os.path.join(folder.path, name), (when, when))
    finally:
        os.close(fd)


def start(
    app: "App",
    folder: "Folder",
    env: "Mapping[str, str]",
    now: float,
    *,
    lock_fd: "int | None" = None,
    default_endpoint: "str | None" = None,
    long_lived: bool = False,
    forget: bool = False,
) -> bool:
    # Start a flusher now (the gate said yes): stamp the time, then spawn. The hook calls this directly, holding
    # flusher.lock as lock_fd, which the child inherits (the caller closes its copy); default_endpoint is the
    # App's default destination when nothing else names one; long_lived: the caller lives long (runserver).
    # forget: a run that sends only the pending forget; it has a gate of its own (forget.pending's mtime), so
    # it leaves flush.spawned, the events' gate, alone.
    if not forget:
        touch(folder, STAMP_NAME, now)
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
        default_endpoint=default_endpoint,
        long_lived=long_lived,
        forget=forget,
    )
    return _start(spec)


def start_forget_if_due(app: "App", env: "Mapping[str, str]") -> bool:
    # Start a detached run that sends the forget `disable` left (forget.pending), if its gate is open and no
    # flusher runs: whether one was started. Called by the hook when reporting is off by the user's own "no"
    # and the scandir saw the record, and by `disable` itself (which has just set the gate to now). The
    # gate is forget.pending's mtime (the record's next try, written by _withdraw), clamped like the flusher's
    # back-off. The child inherits flusher.lock, already locked, as a flusher the hook starts does: no second run
    # starts while it starts up. Never raises for a folder that cannot be used (the hook's callers swallow the
    # rest).
    from ._hook import FORGET_PENDING_NAME, Folder, backing_off, claim_flusher_lock, mtime, state_dir

    if env.get(FLUSHER_ENV) or getattr(sys, "frozen", False) or not sys.executable:
        return False
    import time

    now = time.time()
    try:
        folder = Folder(state_dir(app, env), create=False)
    except OSError:
        return False
    with folder:
        gate = mtime(folder, FORGET_PENDING_NAME)
        if gate is None or backing_off(gate, now):
            return False
        lock = claim_flusher_lock(folder)
        if lock is None:  # a flusher is running: its detached process sends the forget after its events
            return False
        try:
            return start(app, folder, env, now, lock_fd=lock, forget=True)
        finally:
            os.close(lock)


def _renice_autogroup(pid: int) -> None:
    # Linux autogroups share the CPU between sessions before nice values count, so a new session at nice 19 still
    # takes a full share from the user's next command while Python starts (measured +50-90 ms on a busy 2-core
    # machine). Renice the child's new group now, before its interpreter starts (the spawn returns once the
    # first program is exec'd); the flusher does it again itself. A kernel without autogroups has no file.
    if not sys.platform.startswith("linux"):
        return
    try:
        fd = os.open(f"/proc/{pid}/autogroup", os.O_WRONLY | O_CLOEXEC)
        try:
            os.write(fd, b"19")
        finally:
            os.close(fd)
    except OSError:
        pass


def _inheritable_fds() -> "list[int] | None":
    # This process's open inheritable descriptors above stderr, or None when they cannot be listed.
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(listing)
        except OSError:
            continue
        found = []
        for name in names:
            fd = int(name) if name.isdigit() else -1
            if fd > 2:
                try:
                    if os.get_inheritable(fd):
                        found.append(fd)
                except OSError:  # the listing's own descriptor, closed by now
                    continue
        return found
    return None


def posix_plan(
    spec: "SpawnSpec", inheritable: "list[int] | None", *, closefrom: "int | None"
) -> "tuple[list[str], dict[str, str], list[tuple[object, ...]]] | None":
    # What os.posix_spawn is given for spec, or None if it cannot give the same guarantees (then subprocess does):
    # (argv, env, file actions). inheritable: the descriptors _inheritable_fds() found; closefrom: the value of
    # os.POSIX_SPAWN_CLOSEFROM where Python and the C library have it. Pure, for the tests.
    actions: list[tuple[object, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    env = dict(spec.env)
    keep = -1
    if spec.pass_fds:
        (lock,) = spec.pass_fds
        keep = _LOCK_TARGET if lock != _LOCK_TARGET else _LOCK_TARGET + 1
        env[FLUSHER_LOCK_FD_ENV] = str(keep)
    if closefrom is not None:
        if keep >= 0:
            actions.append((os.POSIX_SPAWN_DUP2, spec.pass_fds[0], keep))
        # Below keep there is at most fd 3: the parent's own lock, opened close-on-exec.
        actions.append((closefrom, max(keep, _LOCK_TARGET - 1) + 1))
    elif inheritable is None:
        return None
    else:
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inheritable if fd != keep]
        if keep >= 0:
            actions.append((os.POSIX_SPAWN_DUP2, spec.pass_fds[0], keep))
    argv = [_SH, "-c", _CD_THEN_EXEC, "spool_reporter-flusher", spec.cwd, *spec.args] if spec.cwd else spec.args
    return argv, env, actions


def _reap_ended() -> None:
    for pid in list(_UNREAPED):
        try:
            done = os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            done = True
        if done:
            _UNREAPED.remove(pid)


def _reap_later(pid: int, long_lived: bool) -> None:
    # A daemon thread waits for the child if threading is loaded already or the parent lives long; otherwise the
    # short command's exit hands the child to init (see the top of this module).
    threading = sys.modules.get("threading")
    if threading is None and long_lived:
        import threading
    if threading is None:
        _UNREAPED.append(pid)
        return
    threading.Thread(target=os.waitpid, args=(pid, 0), name="spool_reporter-reaper", daemon=True).start()


def _posix_spawn(spec: "SpawnSpec") -> "bool | None":
    # Start the child with os.posix_spawn: True, False on failure, None where posix_spawn cannot do it here.
    spawn = getattr(os, "posix_spawn", None)
    if spawn is None or not spec.start_new_session or not os.path.exists(_SH):
        return None
    closefrom = getattr(os, "POSIX_SPAWN_CLOSEFROM", None)
    plan = posix_plan(spec, None if closefrom is not None else _inheritable_fds(), closefrom=closefrom)
    if plan is None:
        return None
    argv, env, actions = plan
    _reap_ended()
    try:
        pid = spawn(argv[0], argv, env, file_actions=actions, setsid=True)
    except NotImplementedError:  # no POSIX_SPAWN_SETSID in this C library
        return None
    except OSError:
        return False
    _renice_autogroup(pid)
    _reap_later(pid, spec.long_lived)
    return True


def _popen(spec: "SpawnSpec") -> "subprocess.Popen[bytes]":
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
    if spec.start_new_session:
        _renice_autogroup(child.pid)
    return child


def _start(spec: "SpawnSpec") -> bool:
    if sys.platform != "win32":
        started = _posix_spawn(spec)
        if started is not None:
            return started
    import threading

    try:
        child = _popen(spec)
    except OSError:
        return False
    # Reap the child whenever it ends (no zombie under runserver); a daemon thread never delays the exit.
    threading.Thread(target=child.wait, name="spool_reporter-reaper", daemon=True).start()
    return True
