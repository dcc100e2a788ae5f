"""Reading the small ``key=value`` files: the user's ``djangoanalytics`` and a distributor's policy.

DEP 8 keeps the user's choice in ``~/.config/djangoanalytics``; we keep its shape: one ``key=value`` a line,
``#`` or ``;`` comments, blank lines, and ``[section]`` headers ignored (so an INI-style file is read too).
Reading never follows a FIFO into a block, never reads more than :data:`MAX_CONFIG_BYTES`, and reports a
file it cannot trust as :data:`BROKEN`, which the consent rules treat as "off".

Stdlib only: this module is on the hook path.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

MAX_CONFIG_BYTES: Final = 16 * 1024
"""A config or policy file larger than this is not ours to trust (ours stay well under 1 KiB)."""

_OPEN_FLAGS: Final = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
# O_NONBLOCK: a FIFO planted at the path must not block the command waiting for a writer.


class _Broken(dict[str, str]):
    """The marker type of an unreadable, oversized, non-regular or malformed file."""

    def __repr__(self) -> str:
        return "BROKEN"


BROKEN: Final[dict[str, str]] = _Broken()
"""Returned instead of a mapping when a file exists but cannot be trusted."""


def parse(data: bytes) -> dict[str, str] | None:
    """Parse file contents; ``None`` when they are malformed. The last occurrence of a key wins."""
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or (line[0] == "[" and line[-1] == "]"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if not sep or not key or not key.replace("_", "").replace("-", "").isalnum() or not key.isascii():
            return None
        values[key.replace("-", "_")] = value.strip()
    return values


def read(path: str) -> dict[str, str] | None:
    """Read ``path``: a mapping, ``None`` when it does not exist, :data:`BROKEN` when it cannot be trusted."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError:
        return BROKEN
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CONFIG_BYTES:
            return BROKEN
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError:
        return BROKEN
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        return BROKEN
    values = parse(data)
    return BROKEN if values is None else values


def is_broken(values: dict[str, str] | None) -> bool:
    """Whether :func:`read` found a file it could not trust."""
    return values is BROKEN
