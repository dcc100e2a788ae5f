"""The event: exactly the allowlisted fields, serialised as one JSON line without importing :mod:`json`.

The allowlist (MISSION feature 2, docs/what-is-sent.md):

=====================  ==========================================  ==========================
field                  meaning                                     example
=====================  ==========================================  ==========================
``schema``             version of this layout                      ``1``
``event_id``           random uuid4, for de-duplication            ``"0b6f…"``
``event``              the command name                            ``"startproject"``
``app``                application name                            ``"Django"``
``app_version``        application major.minor                     ``"5.2"``
``python``             implementation                              ``"CPython"``
``python_version``     major.minor                                 ``"3.11"``
``os``                 OS family                                   ``"Linux"``
``os_release``         coarse release                              ``"6.1"``
``arch``               machine architecture                        ``"x86_64"``
``user_agent``         DEP 8's User-Agent                          ``"Django/5.2 CPython/3.11 (Linux; x86_64)"``
``client_id``          random uuid4 kept in the user config file   ``"5d1c…"``
``time``               when it happened, UTC, whole seconds         ``"2026-12-03T08:15:48Z"``
=====================  ==========================================  ==========================

Nothing else is ever recorded: no argument, path, host name, user name or environment value.
``uuid`` and ``platform`` cost ~1 ms to import, more than the hook's whole budget, so uuid4 and the OS facts
are computed here with :func:`os.urandom`, :func:`os.uname` and :data:`sys.implementation`; the tests check
them against :mod:`uuid` and :mod:`platform`.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

    from ._app import App

SCHEMA_VERSION: Final = 1
"""Bumped when a field is added, removed or changes meaning."""

FIELDS: Final = (
    "schema",
    "event_id",
    "event",
    "app",
    "app_version",
    "python",
    "python_version",
    "os",
    "os_release",
    "arch",
    "user_agent",
    "client_id",
    "time",
)
"""The allowlist, in serialisation order."""

MAX_LINE_BYTES: Final = 1024
"""A spooled line longer than this is not one of ours (ours are about 420 bytes)."""

_EVENT_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_HEX: Final = frozenset("0123456789abcdef")


def uuid4() -> str:
    """A random RFC 4122 version-4 UUID in canonical text form (never uuid1: no MAC address)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid4(text: str) -> bool:
    """Whether ``text`` is a canonical lower-case version-4 UUID."""
    return (
        isinstance(text, str)
        and len(text) == 36
        and text[8] == text[13] == text[18] == text[23] == "-"
        and text[14] == "4"
        and text[19] in "89ab"
        and set(text.replace("-", "")) <= _HEX
        and len(text.replace("-", "")) == 32
    )


def is_event_name(name: str) -> bool:
    """GA4's rule for names: ``[A-Za-z][A-Za-z0-9_]*``, at most 40 characters."""
    return isinstance(name, str) and 0 < len(name) <= 40 and name[0].isalpha() and set(name) <= _EVENT_CHARS


def _python() -> tuple[str, str]:
    impl = sys.implementation.name
    names = {"cpython": "CPython", "pypy": "PyPy", "graalpy": "GraalPy"}
    return names.get(impl, impl[:16].capitalize() or "Python"), f"{sys.version_info[0]}.{sys.version_info[1]}"


def _major_minor(release: str) -> str:
    parts = []
    for part in release.split(".")[:2]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(str(int(digits)))
    return ".".join(parts) or "unknown"


_ARCH: Final = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "x64": "x86_64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv8l": "arm64",
    "i386": "x86",
    "i486": "x86",
    "i586": "x86",
    "i686": "x86",
    "x86": "x86",
    "armv7l": "arm",
    "armv6l": "arm",
    "arm": "arm",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loongarch64": "loongarch64",
}
"""Machine names folded to a small, fixed vocabulary (anything else is ``"other"``)."""


def _os() -> tuple[str, str, str]:
    if sys.platform == "win32":  # pragma: no cover - Windows
        ver = sys.getwindowsversion()
        release = "11" if ver.major == 10 and ver.build >= 22000 else f"{ver.major}.{ver.minor}"
        # Like platform.machine(): the native architecture, even in a 32-bit process on a 64-bit OS.
        machine = os.environ.get("PROCESSOR_ARCHITEW6432") or os.environ.get("PROCESSOR_ARCHITECTURE", "")
        return "Windows", release if release != "10.0" else "10", _ARCH.get(machine.lower(), "other")
    u = os.uname()
    arch = _ARCH.get(u.machine.lower(), "other")
    if sys.platform == "darwin":  # pragma: no cover - macOS
        darwin = int(_major_minor(u.release).split(".")[0] or 0)
        # Darwin 20-24 are macOS 11-15; Darwin 25 is macOS 26 (the year-based numbering).
        macos = str(darwin + 1) if darwin >= 25 else str(darwin - 9) if darwin >= 20 else f"10.{darwin - 4}"
        return "macOS", macos, arch
    family = {"linux": "Linux", "freebsd": "FreeBSD", "openbsd": "OpenBSD", "netbsd": "NetBSD"}.get(
        u.sysname.lower(), "other"
    )
    return family, _major_minor(u.release), arch


_STATIC: tuple[str, str, str, str, str] | None = None


def platform_facts() -> tuple[str, str, str, str, str]:
    """(python, python_version, os, os_release, arch), computed once per process."""
    global _STATIC
    if _STATIC is None:
        impl, pyver = _python()
        family, release, arch = _os()
        _STATIC = (impl, pyver, family, release, arch)
    return _STATIC


def user_agent(app: App) -> str:
    """DEP 8's User-Agent: ``Django/5.2 CPython/3.11 (Linux; x86_64)``."""
    impl, pyver, family, _, arch = platform_facts()
    return f"{app.name}/{app.version} {impl}/{pyver} ({family}; {arch})"


def _quote(value: str) -> str:
    # The values are built from fixed vocabularies and validated names; escape anyway, like json.dumps would
    # with ensure_ascii=True, so that a surprising value can never break the line.
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return '"' + value + '"'
    out = []
    for ch in value:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code > 0x7E:
            if code > 0xFFFF:
                code -= 0x10000
                out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def iso_time(epoch: float) -> str:
    """UTC ISO 8601 with whole seconds: ``2026-12-03T08:15:48Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


_MIDDLE: dict[App, str] = {}


def _middle(app: App) -> str:
    # The fields that do not change within a process, serialised once.
    cached = _MIDDLE.get(app)
    if cached is None:
        impl, pyver, family, release, arch = platform_facts()
        q = _quote
        cached = (
            f'"app":{q(app.name)},"app_version":{q(app.version)},"python":{q(impl)},'
            f'"python_version":{q(pyver)},"os":{q(family)},"os_release":{q(release)},"arch":{q(arch)},'
            f'"user_agent":{q(user_agent(app))},'
        )
        _MIDDLE[app] = cached
    return cached


def build_line(app: App, event: str, client_id: str, now: float) -> bytes:
    """One spool line (JSON object + newline) holding exactly :data:`FIELDS`, in that order."""
    q = _quote
    return (
        f'{{"schema":{SCHEMA_VERSION},"event_id":"{uuid4()}","event":{q(event)},{_middle(app)}'
        f'"client_id":{q(client_id)},"time":"{iso_time(now)}"}}\n'
    ).encode("ascii")


def validate(obj: object) -> dict[str, object] | None:
    """Check a parsed spool line: exactly the allowlisted fields with sane types, or ``None``.

    Used by the flusher (cold path) so that a planted or corrupt line never leaves the machine.
    """
    if not isinstance(obj, dict) or set(obj) != set(FIELDS):
        return None
    if obj["schema"] != SCHEMA_VERSION:
        return None
    for key in FIELDS[1:]:
        value = obj[key]
        if not isinstance(value, str) or not value or len(value) > 100 or not value.isprintable():
            return None
    if not (is_uuid4(obj["event_id"]) and is_uuid4(obj["client_id"]) and is_event_name(obj["event"])):
        return None
    t = obj["time"]
    if len(t) != 20 or t[4] != "-" or t[10] != "T" or t[-1] != "Z":
        return None
    return obj
