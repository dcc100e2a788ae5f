"""Secrets out of a URL before it is shown or logged: the one redaction of the client and the collector alike.

Standard library only (nothing at all, in fact), so that the collector can use it without importing the client's
modules.
"""

from __future__ import annotations

from typing import Final

__all__ = ["REDACTED", "redact_url"]

REDACTED: Final = "REDACTED"
"""What :func:`redact_url` shows instead of a secret."""

_SECRET_PARAMS: Final = ("secret", "password", "passwd", "token", "key", "auth", "signature")
"""A query (or fragment) parameter whose name contains one of these has its value redacted: GA4's
``api_secret`` and the usual names of credentials put in a URL."""


def _redact_params(text: str) -> str:
    pairs = text.split("&")
    for i, pair in enumerate(pairs):
        name, eq, _ = pair.partition("=")
        if eq and any(word in name.lower() for word in _SECRET_PARAMS):
            pairs[i] = f"{name}={REDACTED}"
    return "&".join(pairs)


def redact_url(url: str) -> str:
    """``url`` safe to print and log: the user name and password before a host (``https://user:pw@host``:
    either may be a token) become ``REDACTED@``, and so do the values of query and fragment parameters named
    like a secret (GA4's ``api_secret``, ``password``, ``token``...). The one redaction of the package, for every
    URL it shows: the client's ``status``, ``flush`` and its ``--dry-run``, the record of what was sent,
    ``flush.log``, and the collector's messages about its ``--db`` (``postgresql://REDACTED@db.internal/spool``).

    Works on any text, a URL or not (an invalid endpoint is quoted in messages too): it splits on characters
    only, never raises, and leaves a string without credentials as it is.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    tail, hash_, fragment = tail.partition("#")
    path, question, query = tail.partition("?")
    if question:
        query = _redact_params(query)
    if hash_:
        fragment = _redact_params(fragment)
    return f"{scheme}{sep}{authority}{path}{question}{query}{hash_}{fragment}"
