"""Changing the user's config file (``enable``, ``disable``, ``reset-id``, and the removal of a forgotten client
id, :func:`remove_client_id`) without losing anything in it.

The file is rewritten *in place* under the same exclusive OS lock the hook takes on it when it appends a new
``client_id`` (see ``_hook.ensure_client_id``): a rename-based rewrite would let a hook that opened the old
file append to an inode nobody reads any more. Comments, unknown keys and their order are kept; a key that
is set replaces its last occurrence (the one that wins) and drops earlier duplicates. The file is never
written through a symlink (``O_NOFOLLOW``), and is created ``0600``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Final

from . import SpoolReporterError, _files, _hook
from ._hook import App

CONFIG_LOCK_WAIT: Final = 2.0
"""Seconds to wait for the config file's lock (held by a hook for microseconds)."""


class ConfigError(SpoolReporterError):
    """The user's config file cannot be changed safely; the message says why and what to do."""


def _render(lines: list[str], changes: Mapping[str, str | None]) -> str:
    out: list[str] = []
    last_index: dict[str, int] = {}
    for i, raw in enumerate(lines):
        key, sep, _ = raw.strip().partition("=")
        k = key.strip().lower().replace("-", "_")
        if sep and k in changes:
            last_index[k] = i
    for i, raw in enumerate(lines):
        key, sep, _ = raw.strip().partition("=")
        k = key.strip().lower().replace("-", "_")
        if sep and k in changes:
            if last_index[k] == i and changes[k] is not None:
                out.append(f"{k}={changes[k]}")
            continue
        out.append(raw)
    for k, v in changes.items():
        if k not in last_index and v is not None:
            out.append(f"{k}={v}")
    return "".join(line + "\n" for line in out)


def update(app: App, changes: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> str:
    """Set (or, with ``None``, remove) keys in the user's config file. Returns the file's path.

    Raises :class:`ConfigError` when the file cannot be changed safely.
    """
    return _update(app, changes, environ, None)[0]


def remove_client_id(app: App, client_id: str, environ: Mapping[str, str] | None = None) -> bool:
    """Remove ``client_id=`` from the user's config file if it still holds ``client_id``: whether it did. A newer
    id (``enable`` or ``reset-id`` wrote it meanwhile) is kept; the check and the write happen under the file's
    lock. Used once the collector confirmed the forget a ``disable`` left (:mod:`._withdraw`). No file: ``False``.

    Raises :class:`ConfigError` when the file cannot be changed safely.
    """
    if not os.path.lexists(_hook.user_config_path(app, environ)):
        return False
    return _update(app, {"client_id": None}, environ, {"client_id": client_id})[1]


def _update(
    app: App,
    changes: Mapping[str, str | None],
    environ: Mapping[str, str] | None,
    only_if: Mapping[str, str] | None,
) -> tuple[str, bool]:
    """:func:`update`, and only if the file's values (those that win) are ``only_if``'s: (path, whether written)."""
    path = _hook.user_config_path(app, environ)
    try:
        _files.make_dirs(os.path.dirname(path))
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(f"{path} is a symbolic link; refusing to write through it") from exc
        raise ConfigError(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path} is not a regular file")
        if not _hook.take_lock(fd, CONFIG_LOCK_WAIT):
            raise ConfigError(f"{path} is locked by another process; try again")
        data = os.pread(fd, _hook.MAX_CONFIG_BYTES + 1, 0)
        values = _hook.parse(data) if len(data) <= _hook.MAX_CONFIG_BYTES else None
        if values is None:
            raise ConfigError(
                f"{path} cannot be read safely (too large, not UTF-8, or a line without '='); "
                "fix or delete it, then run this command again"
            )
        if only_if is not None and any(values.get(k) != v for k, v in only_if.items()):
            return path, False
        text = _render(data.decode("utf-8").splitlines(), changes).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return path, True
