"""``django-spool forget``: ask the collector to delete every event of this machine's client id, then start over.

What :func:`forget` does, in order:

1. takes the flusher's lock (waiting as ``flush`` does), so that no flusher sends events of the old id while
   it works, and deletes every queued event (none of them will leave the machine) and the record of what was
   sent (:mod:`._sent`: it holds the old id);
2. sends ``POST /v1/forget`` with ``{"client_id": "<the id>"}`` to the collector of the configured ``json``
   destination (its endpoint's ``/batch`` becomes ``/forget``), with the flusher's own sender
   (:class:`spool_reporter._http.Sender`): its one deadline (DNS included), its timeouts, certificates always
   verified, plain HTTP only to loopback, ``HTTPS_PROXY``/``NO_PROXY`` honoured, no redirect followed, a
   small bounded answer read;
3. once the collector answered ``2xx`` (``{"deleted": n}``), replaces the client id in the config file with a
   new random one (as ``reset-id`` does) and deletes what the hook queued meanwhile under the old one.

A ``ga4`` destination that is Google's, or a ``ua`` one, cannot do step 2: the Measurement Protocol has no
deletion. GA4's User Deletion API (``userDeletionRequests:upsert``) deletes a ``CLIENT_ID``, but only for the
property's owner, authenticated with OAuth 2.0 (scope ``analytics.user.deletion``) -- not with the
Measurement Protocol's ``api_secret`` this machine has. :func:`forget` says so, prints the old id for the
property's owner, and still replaces the id and empties the queue. A ``ga4`` destination pointed at a
self-hosted collector (an endpoint ending in ``/mp/collect`` on a host that is not Google's) is asked at that
collector's ``/v1/forget``.

``disable`` sends the same request without waiting, from a detached run (:mod:`._withdraw`, which takes
:func:`forget_url`, :func:`forget_request` and :func:`cannot_text` from here); ``forget`` sends such a pending
forget first (``_commands.cmd_forget``).

When the request fails (no answer within the deadline, a refusal), or reporting is off (nothing leaves the
machine while it is off, unless ``send_while_off``), the queue is still emptied but the id is **kept**, so
that ``forget`` can be run again; the result says why.
"""

from __future__ import annotations

from ._redact import REDACTED
from ._words import counted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from . import _hook
    from ._hook import App
    from ._http import Answer
    from ._settings import Destination
    from .transports import Request

OUTCOMES: Final = ("forgotten", "cannot", "failed", "off", "no-id", "busy")
"""The values of :attr:`Result.outcome`: ``forgotten`` (the collector deleted the events: the id was replaced),
``cannot`` (the destination has no deletion, or none is configured: the id was replaced all the same),
``failed`` (the request failed: the id was kept), ``off`` (reporting is off, nothing was sent: the id was
kept), ``no-id`` (this machine has no client id: nothing to forget), ``busy`` (a flusher kept its lock)."""

FORGET_SUFFIX: Final = "/forget"
"""Replaces the ``/batch`` that ends a ``json`` endpoint (``/v1/batch`` -> ``/v1/forget``, the collector's path)."""

GA4_SUFFIX: Final = "/mp/collect"
"""The GA4 path; a self-hosted collector takes GA4 payloads there and forget requests at ``/v1/forget``."""

GOOGLE_HOSTS: Final = ("google-analytics.com", "analytics.google.com")
"""A ``ga4`` endpoint on one of these hosts (or a subdomain) is Google's own."""

USER_DELETION_API: Final = "https://developers.google.com/analytics/devguides/config/userdeletion/v3"


class Result:
    """What :func:`forget` did."""

    __slots__ = ("deleted", "message", "new_id", "old_id", "outcome", "purged", "record_deleted")

    def __init__(
        self,
        outcome: str,
        message: str,
        *,
        purged: int = 0,
        deleted: int | None = None,
        old_id: str | None = None,
        new_id: str | None = None,
    ) -> None:
        self.outcome = outcome
        """One of :data:`OUTCOMES`."""
        self.message = message
        """One or more lines for the user."""
        self.purged = purged
        """Queued events deleted on this machine."""
        self.deleted = deleted
        """Events the collector said it deleted (``None``: not asked, or it did not say)."""
        self.old_id = old_id
        self.new_id = new_id
        """The client id written in place of :attr:`old_id` (``None``: kept)."""
        self.record_deleted = False
        """Whether the record of what was sent (``django-spool sent``) was there and is gone."""


def forget_url(destination: Destination) -> str | None:
    """Where the collector behind ``destination`` takes forget requests; ``None`` where there is no such place."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(destination.endpoint)
    path = parts.path.rstrip("/")
    if destination.transport == "json" and path.endswith("/batch"):
        path = path[: -len("/batch")] + FORGET_SUFFIX
    elif destination.transport == "ga4" and path.endswith(GA4_SUFFIX) and not _is_google(parts.hostname or ""):
        path = path[: -len(GA4_SUFFIX)] + "/v1" + FORGET_SUFFIX
    else:
        return None
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _is_google(host: str) -> bool:
    host = host.lower().rstrip(".")
    return any(host == name or host.endswith("." + name) for name in GOOGLE_HOSTS)


def cannot_text(destination: Destination | None, reason: str) -> str:
    if destination is None:
        return f"no valid destination is configured ({reason}): there is no collector to ask"
    if destination.transport in ("ga4", "ua"):
        what = "GA4" if destination.transport == "ga4" else "Universal Analytics (retired by Google in July 2023)"
        return (
            f"{what} cannot delete events through the Measurement Protocol, which is all this machine can "
            "reach. The property's owner can, with GA4's User Deletion API (OAuth 2.0, scope "
            f"analytics.user.deletion; {USER_DELETION_API}), given the client id below"
        )
    return f"cannot tell where the collector at {destination.redacted_url()} takes forget requests"


def forget_request(url: str, client_id: str) -> Request:
    """The forget request for ``client_id`` to ``url`` (made from the endpoint alone: no secret in it)."""
    import json

    from ._version import __version__
    from .transports import Request

    return Request(
        method="POST",
        url=url,
        url_redacted=url,
        headers={"Content-Type": "application/json", "User-Agent": f"spool_reporter/{__version__}"},
        body=json.dumps({"client_id": client_id}).encode("ascii"),
    )


def deleted_count(answer: Answer) -> int | None:
    """The ``{"deleted": n}`` of a collector's 2xx answer to a forget, ``None`` if it did not say."""
    import json

    try:
        doc = json.loads(answer.body)
    except ValueError:
        return None
    return doc["deleted"] if isinstance(doc, dict) and type(doc.get("deleted")) is int else None


def _send(url: str, client_id: str, env: Mapping[str, str]) -> tuple[bool, int | None, str]:
    """POST the forget request with the flusher's sender: (confirmed, events deleted, what happened)."""
    import time

    from . import _http, _settings

    tune = _settings.tuning(env)
    sender = _http.Sender(url, env, tune, time.monotonic() + tune.deadline)
    try:
        answer = sender.send(forget_request(url, client_id))
    finally:
        sender.close()
    if answer.kind != "ok":
        return False, None, answer.describe()
    return True, deleted_count(answer), answer.describe()


def forget(app: App, *, environ: Mapping[str, str] | None = None, send_while_off: bool = False) -> Result:
    """Forget this machine's client id at the destination and here (see the module docstring). Never raises for
    network trouble; raises :class:`OSError` for an unusable spool folder and ``ConfigError`` (of
    :mod:`spool_reporter._userconf`) for a config file that cannot be changed."""
    import os

    from . import _hook, _sent

    path = _hook.state_dir(app, os.environ if environ is None else environ)
    had_record = _sent.exists(path)
    result = _run(app, environ=environ, send_while_off=send_while_off)
    result.record_deleted = had_record and not _sent.exists(path)  # every purge deletes it
    return result


def _run(app: App, *, environ: Mapping[str, str] | None, send_while_off: bool) -> Result:
    import os

    from . import _files, _flush, _hook, _settings
    from ._hook import FLUSHER_LOCK_NAME

    env = os.environ if environ is None else environ
    tune = _settings.tuning(env)
    path = _hook.state_dir(app, env)
    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    old = (user or {}).get("client_id")
    old = old if old is not None and _hook.is_uuid4(old) else None

    lock = None
    try:
        folder: _hook.Folder | None = _hook.Folder(path, create=False)
    except (FileNotFoundError, NotADirectoryError):
        folder = None  # no spool folder yet: nothing queued, no flusher to wait for
    if folder is not None:
        # As `flush` waits for a running flusher: none may send events of the old id while this runs. The
        # same descriptor-relative lock as the flusher's: nothing planted at the name is followed.
        lock = _files.FolderLock(folder, FLUSHER_LOCK_NAME, tune.deadline + _flush.WATCHDOG_GRACE + 1)
        try:
            lock.acquire()
        except _files.LockTimeout:
            folder.close()
            return Result("busy", "a flusher is still running (it kept its lock); try again")
    try:
        return _ask(app, env, user=user, policy=policy, decision=decision, old=old, send_while_off=send_while_off)
    finally:
        if lock is not None:
            lock.release()
        if folder is not None:
            folder.close()


def _ask(
    app: App,
    env: Mapping[str, str],
    *,
    user: dict[str, str] | None,
    policy: dict[str, str] | None,
    decision: _hook.Decision,
    old: str | None,
    send_while_off: bool,
) -> Result:
    """The forget itself, with no flusher running: the queue deleted, then the collector asked (or why not)."""
    from . import _consent, _flush, _settings

    purged = _flush.purge(app, env, busy_ok=True)
    if old is None:
        return Result("no-id", "this machine has no client id: nothing was ever sent under one", purged=purged)
    if not decision.enabled and not send_while_off:
        return Result(
            "off",
            f"reporting is off ({_consent.explain(decision.reason)}), so nothing was sent; your client id is "
            "kept. To ask the collector anyway, run forget again with --send-while-off",
            purged=purged,
            old_id=old,
        )
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False)
    destination = resolved.destination
    url = None if destination is None else forget_url(destination)
    if url is None:
        new = _replace(app, env)
        purged += _flush.purge(app, env, busy_ok=True)
        return Result(
            "cannot",
            f"{cannot_text(destination, resolved.reason)}. Your old client id: {old}",
            purged=purged,
            old_id=old,
            new_id=new,
        )
    assert destination is not None
    confirmed, deleted, what = _send(url, old, env)
    where = url  # made from the endpoint alone: no secret in it
    if not confirmed:
        secret = destination.api_secret
        what = what.replace(secret, REDACTED) if secret else what
        return Result(
            "failed",
            f"the collector at {where} did not confirm the deletion ({what}); your client id is kept, so "
            "that forget can be run again",
            purged=purged,
            old_id=old,
        )
    new = _replace(app, env)
    purged += _flush.purge(app, env, busy_ok=True)  # what the hook queued under the old id meanwhile
    count = "its events" if deleted is None else counted(deleted, "event")
    return Result(
        "forgotten",
        f"the collector at {where} deleted {count} of your client id; it keeps only numbers of closed weeks, "
        "which hold no client id",
        purged=purged,
        deleted=deleted,
        old_id=old,
        new_id=new,
    )


def _replace(app: App, env: Mapping[str, str]) -> str:
    """A new random client id in the config file, as ``reset-id`` writes it."""
    from ._hook import uuid4
    from ._userconf import update

    new = uuid4()
    update(app, {"client_id": new}, env)
    return new


# --- the command line: ``django-spool forget`` (spool_reporter/cli.py's ``cmd_forget``) -------------------------


def report(result: Result) -> tuple[str, str | None, int]:
    """What ``forget`` prints for ``result``: (stdout text, stderr message or ``None``, exit status). Status 0
    when the collector confirmed the deletion or there is no client id to forget, else 1."""
    queued = f"Deleted {counted(result.purged, 'queued event')}" + (
        " and the record of what was sent." if result.record_deleted else "."
    )
    if result.outcome == "forgotten":
        return f"Forgotten: {result.message}.\n{queued}\nNew client id {result.new_id}.\n", None, 0
    out = queued + "\n"
    if result.new_id is not None:
        out += f"New client id {result.new_id}.\n"
    return out, f"forget: {result.message}.", 0 if result.outcome == "no-id" else 1
