"""The hot path: consent, the event line, lock + append, the one-time notice, maybe a flusher.

Everything here runs inside the user's command, so (docs/how-it-works.md):

* it imports only the standard library modules a Django process already has (``os``, ``sys``, ``time``,
  ``stat``, ``fcntl``) and our own small modules: no ``filelock``, ``urllib3``, ``platformdirs``, ``uuid``,
  ``platform`` or ``json``;
* it never touches the network, never resolves a name, never calls ``fsync``;
* it never raises and never prints, except the one-time notice and the ``<P>_ANALYTICS_DEBUG`` echo.
  Do not log here.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from . import _config, _consent, _event, _paths, _spool
from ._app import STATE_APPNAME

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from ._app import App

FLUSHER_ENV: Final = "SPOOL_REPORTER_FLUSHER"
"""Set in the flusher's environment: nothing is recorded from inside it or its children (no recursion)."""

_CONFIG_WRITE_FLAGS: Final = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)


def state_dir(app: App, environ: Mapping[str, str] | None = None) -> str:
    """The app's spool folder: ``<user state dir>/spool_reporter/<slug>``."""
    return os.path.join(_paths.user_state_dir(STATE_APPNAME, environ), app.slug)


def notice_text(app: App) -> str:
    """The one-time notice printed on stderr with the first recorded event."""
    cli = app.cli_name
    return (
        f"\n{app.name} usage reporting is on (DEP 8). Commands such as startproject record one anonymous event:\n"
        f"the command name, {app.name}/Python/OS versions and a random id; never paths, names or arguments.\n"
        f"Events are sent later in the background; a command never waits for the network.\n"
        f"  See exactly what would be sent:  {cli} flush --dry-run\n"
        f"  Turn it off:                     {cli} disable   (or set {app.env_disable}=1 or DO_NOT_TRACK=1)\n"
        f"  Details:                         {app.docs_url}\n"
        f"This notice is shown once.\n\n"
    )


def ensure_client_id(app: App, user: dict[str, str] | None, environ: Mapping[str, str]) -> tuple[str, bool] | None:
    """The client id from the user file, creating it on first use. ``(id, created)`` or ``None``.

    Creation appends ``client_id=<uuid4>`` under an exclusive lock on the config file itself, re-reading it
    first, so several first commands started together agree on one id and exactly one of them creates it
    (and prints the notice).
    """
    cid = None if user is None else user.get("client_id")
    if cid is not None and _event.is_uuid4(cid):
        return cid, False
    path = _consent.user_config_path(app, environ)
    _spool.make_dirs(os.path.dirname(path))
    fd = os.open(path, _CONFIG_WRITE_FLAGS, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _config.MAX_CONFIG_BYTES:
            return None
        if not _spool.take_lock(fd):
            return None
        data = os.pread(fd, _config.MAX_CONFIG_BYTES + 1, 0)
        values = _config.parse(data)
        if values is None or len(data) > _config.MAX_CONFIG_BYTES:
            return None
        cid = values.get("client_id")
        if cid is not None and _event.is_uuid4(cid):
            return cid, False
        cid = _event.uuid4()
        prefix = "\n" if data and not data.endswith(b"\n") else ""
        os.write(fd, f"{prefix}client_id={cid}\n".encode("ascii"))
        return cid, True
    finally:
        os.close(fd)  # releases the lock


def _int_setting(values: dict[str, str] | None, key: str, default: int) -> int:
    raw = None if values is None else values.get(key)
    if raw is None or not raw.isdigit():
        return default
    return max(1, int(raw))


def record_event(
    event: str,
    *,
    app: App,
    notice: bool = False,
    long_lived: bool = False,
    environ: Mapping[str, str] | None = None,
    now: float | None = None,
) -> bool:
    """Record one event; see :func:`spool_reporter.record`. Raises on failure (the caller swallows)."""
    env = os.environ if environ is None else environ
    if env.get(FLUSHER_ENV) or not _event.is_event_name(event):
        return False
    user, policy = _consent.read_inputs(app, env)
    decision = _consent.decide(app, env, user, policy)
    if not decision.enabled:
        if decision.hard_off:
            _purge_if_present(app, env)
        return False
    got = ensure_client_id(app, user, env)
    if got is None:
        return False
    client_id, created = got
    line = _event.build_line(app, event, client_id, time.time() if now is None else now)
    if created and notice:
        sys.stderr.write(notice_text(app))
        sys.stderr.flush()
    if _consent._truthy(env.get(app.env_debug)):
        sys.stderr.write(f"[{app.env_debug}] {line.decode('ascii')}")
        sys.stderr.flush()
        return True
    with _spool.Folder(state_dir(app, env), create=True) as folder:
        size = _spool.append(
            folder,
            line,
            max_events=_int_setting(user, "max_events", _spool.MAX_EVENTS),
            max_bytes=_int_setting(user, "max_bytes", _spool.MAX_BYTES),
        )
        from . import _spawn

        _spawn.maybe_spawn(app, folder, size, long_lived=long_lived, environ=env, user=user, policy=policy)
    return True


def _purge_if_present(app: App, env: Mapping[str, str]) -> None:
    # "Disabling also deletes everything queued": a stat is all this costs when there is nothing queued.
    path = state_dir(app, env)
    if not os.path.isdir(path):
        return
    with _spool.Folder(path, create=False) as folder:
        lfd = _spool.lock_fd(folder)
        if lfd is None:
            return
        try:
            _spool.purge(folder)
        finally:
            os.close(lfd)
