"""Consent in words: why reporting is on or off, as ``status``, ``enable``, ``flush`` and ``forget`` say it.

The decision itself is :func:`spool_reporter._hook.decide`, one pure function the hook runs in every reported
command; its rules, first match wins, are listed beside it and explained on docs/consent.md. Each rule has a
reason code (``env:DO_NOT_TRACK``, ``user:disable``, ``destination:none``...), and :data:`REASON_TEXT` words it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

__all__ = [
    "explain",
    "REASON_TEXT",
]


REASON_TEXT: Final = {
    "env": "the environment variable {detail} is set",
    "policy:unreadable": "the system policy file cannot be read safely",
    "policy:disable": "the system policy turns reporting off",
    "user:unreadable": "your config file cannot be read safely",
    "user:disable": "you turned it off (disable=1 in your config file)",
    "user:enable": "you turned it on (disable=0 in your config file)",
    "ci": "this looks like a CI run ({detail} is set); 'enable' overrides",
    "policy:opt-in": "the system policy makes reporting opt-in; run 'enable' to opt in",
    "destination:none": "no destination configured: nothing is recorded until an endpoint is set",
    "user:local": "you chose local mode (mode=local in your config file): events stay on this machine, never sent",
    "policy:local": "the system policy's default is local mode: events stay on this machine, never sent; "
    "'enable' sends them",
    "policy:ask": "the system policy asks first: nothing is recorded until you answer the question a reported "
    "command asks at a terminal (or run 'enable' or 'disable')",
    "app:opt-in": "this application makes reporting opt-in; run 'enable' to opt in",
    "app:local": "this application's default is local mode: events stay on this machine, never sent; "
    "'enable' sends them",
    "app:ask": "this application asks first: nothing is recorded until you answer the question a reported command "
    "asks at a terminal (or run 'enable' or 'disable')",
    "destination:retired": "the destination retired itself (it answered HTTP 410 Gone): nothing is recorded or sent "
    "while it stays the destination; configuring another one starts afresh",
    "default": "on by default (opt-out), as DEP 8 proposes",
}
"""Human wording of each reason, for ``status``; :func:`explain` adds the value that decided, when given."""

_ANY_VALUE: Final = "any value but empty or 0 means off"


def explain(
    reason: str,
    *,
    environ: Mapping[str, str] | None = None,
    user: Mapping[str, str] | None = None,
    policy: Mapping[str, str] | None = None,
    endpoint: str | None = None,
) -> str:
    """A sentence for a reason code; given the inputs :func:`decide` read, it quotes the value that decided
    (``disable=maybe``, ``DO_NOT_TRACK=yes``), so that a surprising value is seen for what it is.

    ``endpoint``: the endpoint as named (``_hook.effective_endpoint``), for
    ``destination:retired``: ``<url, secrets redacted> retired itself on <retired_on=> (HTTP 410)``; the day is
    said only for the destination that retired last (the one ``retired_on=`` dates)."""
    kind, _, detail = reason.partition(":")
    if reason == "destination:retired" and endpoint:
        from ._redact import redact_url

        listed = [] if user is None else user.get("retired", "").split()
        day = "" if user is None else user.get("retired_on", "").strip()
        digits = day.replace("-", "")
        dated = listed[-1:] == [endpoint] and len(day) == 10 and day[4] == day[7] == "-" and len(digits) == 8
        dated = dated and digits.isascii() and digits.isdigit()  # YYYY-MM-DD, as the flusher writes it
        return f"{redact_url(endpoint)} retired itself" + (f" on {day}" if dated else "") + " (HTTP 410)"
    if kind == "env" and environ is not None and detail in environ:
        value = environ[detail].strip()
        said = f"the environment variable {detail} is set ({detail}={value}"
        return said + (")" if value == "1" else f"; {_ANY_VALUE})")
    if kind == "ci" and environ is not None and detail in environ:
        return f"this looks like a CI run ({detail}={environ[detail].strip()}); 'enable' overrides"
    if reason == "user:disable" and user is not None and "disable" in user:
        value = user["disable"].strip()
        return f"you turned it off (disable={value} in your config file" + (")" if value == "1" else f"; {_ANY_VALUE})")
    if reason == "policy:disable" and policy is not None and "disable" in policy:
        value = policy["disable"].strip()
        return f"the system policy turns reporting off (disable={value})"
    if reason == "policy:opt-in" and policy is not None and "default" in policy:
        return f"the system policy makes reporting opt-in (default={policy['default'].strip()}); run 'enable' to opt in"
    if reason in REASON_TEXT:
        return REASON_TEXT[reason]
    return REASON_TEXT.get(kind, reason).format(detail=detail)
