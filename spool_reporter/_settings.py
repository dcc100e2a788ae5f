"""Where events go: the destination settings, read from the environment, the user file and the policy.

Keys (``key=value`` in the user's config file, e.g. ``~/.config/djangoanalytics``, or in a distributor's
system policy file):

=================  =========================================================================================
``endpoint``       the full URL batches are POSTed to; ``https://`` (plain ``http://`` only to a loopback host)
``transport``      ``json`` (default: the self-hosted collector), ``ga4`` or ``ua``
``measurement_id`` GA4 measurement id (``G-…``), with ``transport=ga4``
``api_secret``     GA4 Measurement Protocol API secret, with ``transport=ga4``; never printed
``tracking_id``    Universal Analytics property (``UA-…``), with ``transport=ua``
=================  =========================================================================================

``<P>_ANALYTICS_ENDPOINT`` and ``<P>_ANALYTICS_TRANSPORT`` override the files.

**Precedence.** The endpoint comes from the environment, else the user file, else the policy, else the
integrator's default (:class:`~spool_reporter.App`'s ``endpoint``, a ``json`` collector). The other keys come
*from the same place as the endpoint*: a user who points ``endpoint`` at their own collector does not silently
inherit a distributor's ``api_secret`` (and send it there), and a policy's endpoint is used with the policy's
credentials. When the endpoint comes from the environment, the other keys are looked up in the user file, then
the policy. ``<P>_ANALYTICS_TRANSPORT`` always wins for ``transport``.

With no endpoint from any of them, nothing is recorded at all (the consent rule ``destination:none``). A
named but invalid setting is never "fixed up": it means *no destination*, with a reason that ``status``
prints, and events stay queued (bounded by the spool caps) until it is fixed.

This module also holds the flusher's tuning (:class:`Tuning`), whose environment variables exist so the
tests can use sub-second deadlines and back-offs; they can only shorten the defaults, never lengthen them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlsplit

from . import _hook
from ._hook import App
from ._net import is_loopback
from ._redact import REDACTED, redact_url

__all__ = [
    "Destination",
    "endpoint_problem",
    "local_text",
    "no_destination_text",
    "resolve",
    "Resolved",
    "Tuning",
    "tuning",
]

DEFAULT_TRANSPORT: Final = "json"
"""The self-hosted collector: the only destination that provably stores no IP address."""

TRANSPORTS: Final = ("json", "ga4", "ua")
"""The transports a ``transport=`` setting may name, each a module of :mod:`spool_reporter.transports`."""

MAX_URL_CHARS: Final = 2048
"""An endpoint longer than this is a mistake (or an attempt to smuggle data in the URL)."""

_KEYS: Final = ("transport", "measurement_id", "api_secret", "tracking_id")
"""The keys beside ``endpoint=`` that describe a destination in the user file or the policy."""
_ID_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
"""What a GA4 measurement id, API secret or UA tracking id may hold (at most 100 of them)."""


@dataclass(frozen=True, kw_only=True)
class Destination:
    """A validated destination. Immutable; build it with :func:`resolve`."""

    transport: str
    """``json``, ``ga4`` or ``ua``."""
    endpoint: str
    """The URL requests are POSTed to (GA4 adds ``measurement_id`` and ``api_secret`` to its query)."""
    source: str
    """Where the endpoint came from: ``env:<VAR>``, ``user``, ``policy`` or ``app`` (the App's default)."""
    measurement_id: str | None = None
    api_secret: str | None = None
    tracking_id: str | None = None

    def __repr__(self) -> str:
        # Never show the secret, not even in a traceback or a debugger.
        return (
            f"Destination(transport={self.transport!r}, endpoint={self.endpoint!r}, source={self.source!r}, "
            f"measurement_id={self.measurement_id!r}, api_secret={REDACTED if self.api_secret else None!r}, "
            f"tracking_id={self.tracking_id!r})"
        )

    def request_url(self) -> str:
        """The URL of every request, secrets included (GA4's query carries the API secret)."""
        if self.transport != "ga4":
            return self.endpoint
        sep = "&" if "?" in self.endpoint else "?"
        return (
            f"{self.endpoint}{sep}measurement_id={quote(self.measurement_id or '', safe='')}"
            f"&api_secret={quote(self.api_secret or '', safe='')}"
        )

    def redacted_url(self) -> str:
        """:meth:`request_url` through :func:`redact_url` (the API secret replaced by ``REDACTED``): safe to
        print and log."""
        return redact_url(self.request_url())


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """The outcome of :func:`resolve`: a destination, or ``None`` and the reason why not."""

    destination: Destination | None
    reason: str
    """Human wording: where the destination came from, or why there is none (for ``status``)."""
    source: str | None = None
    """Where the endpoint came from (as :attr:`Destination.source`), also when it was refused; ``None`` when
    nothing names one, or in local mode when sending."""


SHOWN_URL_CHARS: Final = 80
"""A refused endpoint is quoted in ``status`` up to this many characters."""


def _shown(url: str) -> str:
    url = redact_url(url)
    return repr(url if len(url) <= SHOWN_URL_CHARS else url[: SHOWN_URL_CHARS - 1] + "…")


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is not acceptable as an endpoint (quoting it, credentials redacted, saying what is wrong), or
    ``None`` when it is: the one check of ``status``, the flusher and ``enable --endpoint``."""
    shown = _shown(url)
    if len(url) > MAX_URL_CHARS:
        return f"the endpoint is {len(url)} characters long, more than {MAX_URL_CHARS}"
    if not url.isascii() or not url.isprintable():
        return f"the endpoint {shown} has characters a URL cannot hold (non-ASCII or control characters)"
    if " " in url:
        return f"the endpoint {shown} is not a URL: it contains a space"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        return f"the endpoint {shown} is not a valid URL ({exc})"
    del port
    if parts.scheme not in ("https", "http"):
        if not parts.scheme:
            return f"the endpoint {shown} is not a URL: it must start with https://"
        return f"the endpoint {shown} uses {parts.scheme}://; it must be an https:// URL"
    if not host:
        return f"the endpoint {shown} has no host"
    if parts.username is not None or parts.password is not None:
        return f"the endpoint {shown} carries a user name or password; it must not"
    if parts.fragment:
        return f"the endpoint {shown} has a #fragment; it must not"
    if parts.scheme == "http" and not is_loopback(host, localhost_names=True):
        return (
            f"the endpoint {shown} is plain http:// to {host}, which is only allowed to a loopback host "
            "(127.0.0.1, ::1, localhost); use https://"
        )
    return None


def _usable(values: dict[str, str] | None) -> dict[str, str]:
    return {} if values is None or _config_broken(values) else values


def _config_broken(values: dict[str, str]) -> bool:
    from . import _hook

    return _hook.is_broken(values)


def resolve(
    app: App,
    environ: Mapping[str, str] | None = None,
    *,
    user: dict[str, str] | None = None,
    policy: dict[str, str] | None = None,
    read_files: bool = True,
    sending: bool = True,
) -> Resolved:
    """Find and validate the destination for ``app``.

    Reads the user file and the policy unless ``read_files`` is false (then ``user`` and ``policy`` are the
    already-read mappings, ``None`` meaning "no such file"). Never raises for bad settings. In local mode
    (events are kept on this machine) there is nothing to send to: no destination, unless ``sending`` is false
    (``status`` and ``flush --dry-run`` ask where events *would* go).
    """
    env = os.environ if environ is None else environ
    if read_files:
        user, policy = _hook.read_inputs(app, env)
    if sending:
        decision = _hook.decide(app, env, user, policy)
        if decision.enabled and decision.local:
            return Resolved(destination=None, reason=local_text(app, decision))
    layers = (("user", _usable(user)), ("policy", _usable(policy)))
    endpoint = env.get(app.env_endpoint, "").strip()
    if endpoint:
        source = "env:" + app.env_endpoint
        values: dict[str, str] = {}
        for _, layer in reversed(layers):  # policy first, then the user file overrides
            values.update({k: layer[k] for k in _KEYS if layer.get(k)})
    else:
        for name, layer in layers:
            if layer.get("endpoint", "").strip():
                source = name
                endpoint = layer["endpoint"].strip()
                values = {k: layer[k] for k in _KEYS if layer.get(k)}
                break
        else:
            if app.endpoint is None:
                return Resolved(destination=None, reason=no_destination_text(app, env))
            source, endpoint, values = "app", app.endpoint, {"transport": app.transport}
    transport = env.get(app.env_transport, "").strip() or values.get("transport", "").strip() or DEFAULT_TRANSPORT
    transport = transport.lower()
    where = {
        "user": "the user config file",
        "policy": "the system policy",
        "app": f"{app.name}'s default destination",
    }.get(source, app.env_endpoint)
    if transport not in TRANSPORTS:
        return Resolved(
            destination=None,
            reason=f"unknown transport {transport!r} (use {', '.join(TRANSPORTS)}; from {where})",
            source=source,
        )
    problem = endpoint_problem(endpoint)
    if problem is not None:
        return Resolved(destination=None, reason=f"{problem} (from {where})", source=source)
    creds = {k: values.get(k, "").strip() for k in ("measurement_id", "api_secret", "tracking_id")}
    for key, value in creds.items():
        if value and (len(value) > 100 or not set(value) <= _ID_CHARS):
            return Resolved(destination=None, reason=f"{key} has unexpected characters", source=source)
    if transport == "ga4" and not (creds["measurement_id"] and creds["api_secret"]):
        return Resolved(destination=None, reason="transport ga4 needs measurement_id and api_secret", source=source)
    if transport == "ua" and not creds["tracking_id"]:
        return Resolved(destination=None, reason="transport ua needs tracking_id", source=source)
    destination = Destination(
        transport=transport,
        endpoint=endpoint,
        source=source,
        measurement_id=creds["measurement_id"] or None if transport == "ga4" else None,
        api_secret=creds["api_secret"] or None if transport == "ga4" else None,
        tracking_id=creds["tracking_id"] or None if transport == "ua" else None,
    )
    return Resolved(
        destination=destination, reason=f"{transport} to {destination.redacted_url()} (from {where})", source=source
    )


def local_text(app: App, decision: _hook.Decision) -> str:
    """Why nothing is sent in local mode, and how to send."""
    why = "you chose it" if decision.reason == "user:local" else "the system policy's default"
    return f"local mode ({why}): events stay on this machine and are never sent; '{app.cli_name} enable' sends them"


def no_destination_text(app: App, environ: Mapping[str, str] | None = None) -> str:
    """What ``status`` says when nothing names a destination: nothing is recorded, and how to name one."""
    path = _hook.user_config_path(app, environ)
    return f"none configured: nothing is recorded until one is set (endpoint= in {path}, or {app.env_endpoint})"


# --- tuning --------------------------------------------------------------------------------------------

DEADLINE: Final = 20.0
"""Seconds a flusher run may take in all, DNS included (DESIGN constraint 4); a watchdog enforces it."""

CONNECT_TIMEOUT: Final = 5.0
"""Per-request TCP + TLS connect timeout: a healthy collector answers a SYN in well under a second."""

READ_TIMEOUT: Final = 10.0
"""Per-request inactivity timeout while reading the response (per recv, hence also the deadline)."""

BACKOFF_BASE: Final = 60.0
"""First retry delay after a failure; doubles with each consecutive failure."""

BACKOFF_CAP: Final = _hook.MAX_BACKOFF
"""Longest back-off (and the clamp on Retry-After): an offline laptop tries about once a day at worst. The hook
counts a back-off time further ahead than this as expired (a wrong clock wrote it)."""


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """The flusher's timing; :func:`tuning` reads it. All values in seconds."""

    deadline: float = DEADLINE
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    backoff_base: float = BACKOFF_BASE
    backoff_cap: float = BACKOFF_CAP


TUNING_ENV: Final = {
    "deadline": "SPOOL_REPORTER_FLUSH_DEADLINE",
    "connect_timeout": "SPOOL_REPORTER_CONNECT_TIMEOUT",
    "read_timeout": "SPOOL_REPORTER_READ_TIMEOUT",
    "backoff_base": "SPOOL_REPORTER_BACKOFF_BASE",
    "backoff_cap": "SPOOL_REPORTER_BACKOFF_CAP",
}
"""Environment variables that shorten the tuning (for tests); larger or malformed values are ignored."""

_MINIMUM: Final = 0.05
"""No tuning value goes below this: a zero timeout would mean "no timeout" to some layers."""


def _shorter(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    if math.isnan(value):
        return default
    return min(default, max(_MINIMUM, value))


def tuning(environ: Mapping[str, str] | None = None) -> Tuning:
    """The flusher's timing, shortened by :data:`TUNING_ENV` variables when set."""
    env = os.environ if environ is None else environ
    base = Tuning()
    return Tuning(**{key: _shorter(env, var, getattr(base, key)) for key, var in TUNING_ENV.items()})
