"""The first run: creating the client id and the one-time notice.

Imported by the hook only when the user's config file has no client id yet (once per user), so that the
hook's every-command path (:mod:`spool_reporter._hook`) does not carry this code.
"""

# Like _hook, this runs inside the user's command (its first one): no `from __future__ import annotations`, and
# typing, collections.abc and the App type only for the type checker -- a plain command line has not imported
# them, and together they cost it several milliseconds.

import os
import stat

from ._files import make_dirs
from ._hook import (
    MAX_CONFIG_BYTES,
    NOTICE_LOCAL,
    NOTICE_SEND,
    is_uuid4,
    parse,
    seen_notice_mode,
    seen_notice_version,
    take_lock,
    user_config_path,
    uuid4,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from ._hook import App

_CONFIG_WRITE_FLAGS: "Final" = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)
"""Append-only, never through a symlink, and never blocking on a FIFO planted at the path."""

CONFIG_LOCK_WAIT_SECONDS: "Final" = 0.1
"""How long a first run waits for another command's lock on the config file. The holder reads and appends a
line (microseconds), but on a busy machine it can be descheduled for longer than the spool's 5 ms, and a
first run that gives up records nothing. This is paid at most on a user's first run or a new notice, never
on the every-command path."""


def create_client_id(
    app: "App", environ: "Mapping[str, str]", *, notice: bool = False, local: bool = False
) -> "tuple[str, bool] | None":
    """The client id, created on first use, and whether the notice is due now: ``(id, show)``, or ``None`` if the
    config file cannot take them (then nothing is recorded: never an event without the notice it needs).

    Under an exclusive lock on the config file itself, re-reading it first: appends ``client_id=<uuid4>`` if there
    is none, and, with ``notice``, ``notice_version=<the App's>`` and ``notice_mode=<send or local>`` if the user
    has seen an older version or the other wording (``local``: the event about to be recorded stays on this
    machine). The last occurrence of a key wins, so the file stays append-only here. Several commands started
    together agree on one id, and exactly one of them is told to show the notice. A new id created without
    ``notice`` records ``notice_version=0``: nothing was shown. The file is never written through a symlink.
    """
    path = user_config_path(app, environ)
    make_dirs(os.path.dirname(path))
    fd = os.open(path, _CONFIG_WRITE_FLAGS, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            return None
        if not take_lock(fd, CONFIG_LOCK_WAIT_SECONDS):
            return None
        data = os.pread(fd, MAX_CONFIG_BYTES + 1, 0)
        values = parse(data)
        if values is None or len(data) > MAX_CONFIG_BYTES:
            return None
        stored = values.get("client_id")
        created = stored is None or not is_uuid4(stored)
        cid = uuid4() if created or stored is None else stored
        seen = 0 if created else seen_notice_version(values)
        wording = NOTICE_LOCAL if local else NOTICE_SEND
        show = notice and (seen < app.notice_version or seen_notice_mode(values) != wording)
        lines = [f"client_id={cid}"] if created else []
        if show or (created and not notice):
            lines.append(f"notice_version={app.notice_version if show else 0}")
        if show:
            lines.append(f"notice_mode={wording}")
        if lines:
            prefix = "\n" if data and not data.endswith(b"\n") else ""
            os.write(fd, (prefix + "".join(line + "\n" for line in lines)).encode("ascii"))
        return cid, show
    finally:
        os.close(fd)  # releases the lock


def notice_text(app: "App", *, local: bool = False, after_local: bool = False) -> str:
    """The notice printed on stderr before the first event is recorded (and again, once, when its version
    or its wording changes); ``local``: the local-mode wording (recorded, never sent); ``after_local``: the
    sending wording for a user who saw the local one (what was recorded then stays on this machine)."""
    cli = app.cli_name
    django = app.slug == "django"
    head = f"{app.name} usage reporting is on" + (", in local mode" if local else "") + (" (DEP 8)" if django else "")
    if local:
        where = (
            f"Events stay in a file on this machine and are never sent (local mode).\n"
            f"  Send them:                       {cli} enable\n"
        )
    else:
        where = "Events are sent later in the background; a command never waits for the network.\n"
        if after_local:
            where = (
                "Local mode has ended (a setting or the system policy changed). From now on:\n"
                + where
                + "Events recorded in local mode stay on this machine, never sent.\n"
                f"  Send those too:                  {cli} enable\n"
                f"  Stay in local mode:              {cli} enable --local\n"
            )
    what = "Commands such as startproject record" if django else "Each command records"
    return (
        f"\n{head}. {what} one anonymous event:\n"
        f"the command name, {app.name}/Python/OS versions and a random id; never paths, names or arguments.\n"
        f"{where}"
        f"  See exactly what would be sent:  {cli} flush --dry-run\n"
        f"  Turn it off:                     {cli} disable   (or set {app.env_disable}=1 or DO_NOT_TRACK=1)\n"
        f"  Details:                         {app.docs_url}\n"
        f"This notice (version {app.notice_version}) is shown once, and again only if what is collected or where it\n"
        "goes changes.\n\n"
    )
