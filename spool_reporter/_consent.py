"""Consent: one pure decision, with the rule that made it.

The order, first match wins (docs/consent.md explains each rule):

1. ``<P>_NO_ANALYTICS`` set (not empty, not ``0``)            -> off  ``env:<P>_NO_ANALYTICS``
2. ``DO_NOT_TRACK`` set (not empty, not ``0``)                 -> off  ``env:DO_NOT_TRACK``
3. the system policy cannot be trusted                          -> off  ``policy:unreadable``
4. the system policy says ``disable=1``                         -> off  ``policy:disable``
5. the user file cannot be trusted                              -> off  ``user:unreadable``
6. the user file says ``disable=1``                             -> off  ``user:disable``
7. the user file says ``disable=0`` (``enable`` writes it)      -> on   ``user:enable``
   ... and ``mode=local`` (``enable --local`` writes both)      -> on, local  ``user:local``
8. a CI environment                                             -> off  ``ci:<VAR>``
9. the system policy says ``default=off`` (opt-in mode)         -> off  ``policy:opt-in``
10. the user file says ``mode=local``                           -> on, local  ``user:local``
11. the system policy says ``default=local``                    -> on, local  ``policy:local``
12. otherwise (DEP 8's opt-out)                                 -> on   ``default``

"Local" means recorded and kept on this machine, never sent: no flusher starts, ``flush`` sends nothing, and
:func:`~._settings.resolve` finds no destination to send to. A sending "on" (rules 7 and 12) needs a
destination: when neither ``<P>_ANALYTICS_ENDPOINT``, the user file, the policy nor the
:class:`~spool_reporter.App` names an endpoint, nothing could ever be sent, so nothing is recorded -> off
``destination:none``.

The system policy is the first ``<config_name>`` file found in the system configuration folders, in order
(Linux: every entry of ``$XDG_CONFIG_DIRS``, default ``/etc/xdg``). ``disable=`` with an empty value or ``0``
does not disable, in the policy as in the user file.

The code lives in :mod:`spool_reporter._hot`, the one module the hook path imports; this module names it.
It adds the wording ``status`` prints.
"""

from __future__ import annotations

from ._hot import (
    CI_VARIABLES,
    HARD_OFF_REASONS,
    MODE_LOCAL,
    MODE_OPT_IN,
    MODE_OPT_OUT,
    NOTICE_VERSION,
    Decision,
    current,
    decide,
    policy_path,
    policy_paths,
    read_inputs,
    read_policy,
    seen_notice_version,
    user_config_path,
)
from ._hot import _truthy as _truthy  # noqa: PLC0414 - re-exported for the cold path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

__all__ = [
    "policy_paths",
    "read_policy",
    "CI_VARIABLES",
    "Decision",
    "HARD_OFF_REASONS",
    "MODE_LOCAL",
    "MODE_OPT_IN",
    "MODE_OPT_OUT",
    "NOTICE_VERSION",
    "REASON_TEXT",
    "current",
    "decide",
    "explain",
    "policy_path",
    "read_inputs",
    "seen_notice_version",
    "user_config_path",
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
) -> str:
    """A sentence for a reason code; given the inputs :func:`decide` read, it quotes the value that decided
    (``disable=maybe``, ``DO_NOT_TRACK=yes``), so that a surprising value is seen for what it is."""
    kind, _, detail = reason.partition(":")
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
