"""The first run: creating the client id and the one-time notice.

Imported by the hook only when the user's config file has no client id yet (once per user), so that the
hook's every-command path (:mod:`spool_reporter._hot`) does not carry this code.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Final

from ._hot import MAX_CONFIG_BYTES, App, is_uuid4, make_dirs, parse, take_lock, user_config_path, uuid4

_CONFIG_WRITE_FLAGS: Final = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)
"""Append-only, never through a symlink, and never blocking on a FIFO planted at the path."""


def create_client_id(app: App, environ: Mapping[str, str]) -> tuple[str, bool] | None:
    """Create the client id on first use: ``(id, created)``, or ``None`` if the config file cannot take it.

    Appends ``client_id=<uuid4>`` under an exclusive lock on the config file itself, re-reading it first, so
    several first commands started together agree on one id and exactly one of them creates it (and prints
    the notice). The file is never written through a symlink.
    """
    path = user_config_path(app, environ)
    make_dirs(os.path.dirname(path))
    fd = os.open(path, _CONFIG_WRITE_FLAGS, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            return None
        if not take_lock(fd):
            return None
        data = os.pread(fd, MAX_CONFIG_BYTES + 1, 0)
        values = parse(data)
        if values is None or len(data) > MAX_CONFIG_BYTES:
            return None
        cid = values.get("client_id")
        if cid is not None and is_uuid4(cid):
            return cid, False
        cid = uuid4()
        prefix = "\n" if data and not data.endswith(b"\n") else ""
        os.write(fd, f"{prefix}client_id={cid}\n".encode("ascii"))
        return cid, True
    finally:
        os.close(fd)  # releases the lock


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
