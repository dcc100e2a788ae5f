"""Withdrawal: the forget that ``django-spool disable`` leaves to a detached run, so that a "no" reaches the collector.

``disable`` (:func:`plan`, then :func:`schedule`) writes ``forget.pending`` in the spool folder (``0600``, through
the folder's descriptor, replaced whole) and starts a detached run (``python -m spool_reporter._detached
--forget``) without waiting for it: ``disable`` never waits on the network. The run (:func:`run`) holds the
flusher's lock, and sends ``POST /v1/forget`` for each id the record holds, with the flusher's sender and its one
deadline (:func:`spool_reporter._forget.forget_request`), recording each request in ``sent`` (:mod:`._sent`: the
id cut to its first characters, since the record outlives it). Then, for an id:

* the collector answered ``2xx``: the id is removed from the user's config file (only if it is still that id:
  ``enable`` gives a new one) and from the record -- the id is kept only until the forget is delivered;
* ``410 Gone``: the destination retired itself; nothing is left to ask, so the same;
* anything else: kept for the next try, after an exponential back-off (:func:`._state.backoff_delay`, the
  flusher's, ``Retry-After`` honoured) written as the record's mtime (the hook's gate); after
  :data:`GIVE_UP_AFTER` from the first try the id is given up: removed from the config file and the record all
  the same, and the log says the forget was never confirmed. Keeping it longer would keep, on this machine, the
  one value that links it to the collector's rows, for a withdrawal that cannot be delivered.

The forget is the one request a ``disable`` sends, and it is sent while reporting is off by the user's own "no"
(``user:disable``), or after a later yes (``enable``: the old id is never reused, see
:func:`id_being_forgotten`). While ``DJANGO_NO_ANALYTICS``/``DO_NOT_TRACK`` is set, or a system policy says no, or
in local mode, nothing is sent and the record waits (:func:`may_send`; nor is anything given up meanwhile): a
shell's variable is a local switch, not a withdrawal, and never schedules a forget. A record that cannot be read
(damaged, planted, a URL the flusher would refuse) is deleted unsent.

Retries are started by the hook (``record_event``'s hard-off branch sees the record in the scandir it makes
anyway, then :func:`._spawn.start_forget_if_due` checks the gate) and by every detached flusher after its
events (:mod:`._detached`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from . import _consent, _files, _forget, _hook, _sent, _settings, _spawn, _state, _userconf
from ._hook import FLUSHER_LOCK_NAME, FORGET_PENDING_NAME, LOCK_NAME, App, Folder

__all__ = [
    "GIVE_UP_AFTER",
    "Entry",
    "Pending",
    "Plan",
    "RunResult",
    "carry_out",
    "forget_first",
    "id_being_forgotten",
    "keep_remote",
    "may_send",
    "plan",
    "read",
    "run",
    "schedule",
    "start",
    "status_data",
    "status_text",
]

GIVE_UP_AFTER: Final = 30 * 86400.0
"""Seconds from an id's first try after which its forget is given up (issue 31's bound: 30 days). A policy: long
enough for a laptop offline over a holiday, and with the back-off capped at a day, about 30 more tries."""

MAX_ENTRIES: Final = 16
"""Ids the record holds at most (each ``enable`` then ``disable`` before a delivery adds one); beyond it the
oldest is given up (logged; its id was replaced already). A bound on a file the hook's gate reads, never
reached by a person."""

MAX_RECORD_BYTES: Final = 16 * 1024
"""``forget.pending`` is read up to this size (16 entries take about 3 KiB): anything longer is damage."""

CLAIM_SECONDS: Final = _hook.SPAWN_INTERVAL
"""A run moves the gate this far ahead before it sends, so that a run ended half-way (its watchdog, a reboot)
does not let every following command start another: the flusher's own spacing of spawns."""

RECORD_LOCK_WAIT: Final = 2.0
"""Seconds to wait for the spool lock (``spool.lock``, held by a hook for microseconds), which guards the record
against ``disable`` and a run rewriting it at once; never held across a request."""

HOLDING_REASONS: Final = frozenset({"policy:disable", "policy:unreadable", "user:unreadable"})
"""Decisions under which the forget waits, beside ``env:*`` and local mode (:func:`may_send`)."""


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One id to forget."""

    client_id: str
    url: str
    """Where: the forget URL of the destination configured when ``disable`` ran (it holds that id's events)."""
    since: float
    """When ``disable`` scheduled it (seconds since the epoch): :data:`GIVE_UP_AFTER` counts from here."""


@dataclass(frozen=True, kw_only=True)
class Pending:
    """``forget.pending``: the ids still to forget, and the back-off."""

    entries: tuple[Entry, ...]
    attempts: int = 0
    """Consecutive runs that left an id unconfirmed."""
    next_try: float | None = None
    """The earliest time of the next background try (the file's mtime)."""
    last_error: str | None = None


def _parse(raw: bytes | None, mtime: float | None) -> Pending | None:
    """The record, or ``None`` for a missing, damaged or hostile file (then nothing is sent)."""
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        return None
    entries = []
    for item in doc["entries"][:MAX_ENTRIES]:
        if not isinstance(item, dict):
            continue
        cid, url, since = item.get("client_id"), item.get("url"), item.get("since")
        if not (isinstance(cid, str) and _hook.is_uuid4(cid) and isinstance(url, str)):
            continue
        if _settings.endpoint_problem(url) is not None or not isinstance(since, (int, float)):
            continue  # only a URL the flusher would send to; anything planted is never followed
        entries.append(Entry(client_id=cid, url=url, since=float(since)))
    if not entries:
        return None
    attempts = doc.get("attempts")
    error = doc.get("last_error")
    return Pending(
        entries=tuple(entries),
        attempts=attempts if type(attempts) is int and attempts >= 0 else 0,
        next_try=mtime,
        last_error=error[:500] if isinstance(error, str) else None,
    )


def _dump(pending: Pending) -> bytes:
    doc = {
        "entries": [{"client_id": e.client_id, "url": e.url, "since": e.since} for e in pending.entries],
        "attempts": pending.attempts,
        "last_error": pending.last_error,
    }
    return json.dumps(doc, sort_keys=True).encode("ascii") + b"\n"


def read(app: App, env: Mapping[str, str]) -> Pending | None:
    """The pending forget, read without locking, creating or changing anything (``status``, ``enable``)."""
    with _files.ReadOnlyFolder(_hook.state_dir(app, env)) as folder:
        raw = folder.read(FORGET_PENDING_NAME, MAX_RECORD_BYTES)
        when = None
        if raw and folder.fd is not None:
            with contextlib.suppress(OSError):
                when = os.stat(FORGET_PENDING_NAME, dir_fd=folder.fd, follow_symlinks=False).st_mtime
    return _parse(raw, when)


def _load(folder: Folder) -> Pending | None:
    try:
        raw = _files.read_bytes(folder, FORGET_PENDING_NAME, MAX_RECORD_BYTES)
    except OSError:
        return None
    return _parse(raw, _hook.mtime(folder, FORGET_PENDING_NAME))


def _save(folder: Folder, pending: Pending, next_try: float) -> None:
    """Replace the record whole, then set its mtime (the gate) to ``next_try``. Raises :class:`OSError`."""
    _files.replace_file(folder, FORGET_PENDING_NAME, _dump(pending))
    _spawn.touch(folder, FORGET_PENDING_NAME, next_try)


def _clear(folder: Folder) -> None:
    with contextlib.suppress(FileNotFoundError):
        folder.unlink(FORGET_PENDING_NAME)


def may_send(decision: _hook.Decision) -> bool:
    """Whether a pending forget may leave under ``decision``: after the user's own "no" or a later yes; never while
    an environment variable or a system policy says no, nor in local mode ("never sent")."""
    if decision.reason.startswith("env:") or decision.reason in HOLDING_REASONS:
        return False
    return not (decision.enabled and decision.local)


# --- disable: what to do, and the record ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What ``disable`` does at the destination (:func:`plan`)."""

    kind: str
    """``schedule`` (a forget to send), ``cannot`` (GA4 on Google's host, UA: the id is deleted at once),
    ``none`` (no valid destination: nobody to ask; the id is kept for ``forget``), ``no-id``, or ``kept``
    (``--keep-remote``)."""
    client_id: str | None = None
    url: str | None = None
    text: str = ""
    """For ``cannot`` and ``none``: why (the wording of ``forget``)."""


def plan(app: App, env: Mapping[str, str]) -> Plan:
    """Read the user's id and destination now, before ``disable`` changes anything."""
    user, policy = _hook.read_inputs(app, env)
    if _hook.is_broken(user):
        return Plan(kind="no-id")
    cid = None if user is None else user.get("client_id")
    if cid is None or not _hook.is_uuid4(cid):
        return Plan(kind="no-id")
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False, sending=False)
    destination = resolved.destination
    url = None if destination is None else _forget.forget_url(destination)
    if url is not None:
        return Plan(kind="schedule", client_id=cid, url=url)
    kind = "none" if destination is None else "cannot"
    return Plan(kind=kind, client_id=cid, text=_forget.cannot_text(destination, resolved.reason))


def schedule(app: App, env: Mapping[str, str], client_id: str, url: str) -> tuple[Pending, bool]:
    """Add ``client_id`` to the record (due now), or make an id already there due now: the record, and whether the
    id was there already (``disable`` twice). Raises :class:`OSError` for a folder that cannot be used."""
    now = _state.now()
    with Folder(_hook.state_dir(app, env), create=True) as folder:
        lock = _files.FolderLock(folder, LOCK_NAME, RECORD_LOCK_WAIT)  # against a run rewriting it
        with lock:
            current = _load(folder) or Pending(entries=())
            had = any(e.client_id == client_id for e in current.entries)
            entries = current.entries if had else (*current.entries, Entry(client_id=client_id, url=url, since=now))
            pending = replace(current, entries=entries[-MAX_ENTRIES:], next_try=now)
            _save(folder, pending, now)
        for dropped in entries[:-MAX_ENTRIES]:
            _state.log(folder, f"forget: gave up the forget of {_sent.short_id(dropped.client_id)}: too many pending")
    return pending, had


def start(app: App, env: Mapping[str, str]) -> bool:
    """Start the detached run now (unless a flusher runs: its detached process sends the forget after its events)."""
    return _spawn.start_forget_if_due(app, env)


def id_being_forgotten(app: App, env: Mapping[str, str]) -> str | None:
    """The user file's client id if a pending forget holds it, else ``None``. ``enable`` before the forget was
    delivered must not reuse it (its events would be refused as forgotten, or deleted with it): it writes a new
    one, and the record keeps forgetting the old one."""
    pending = read(app, env)
    if pending is None:
        return None
    user = _hook.read(_hook.user_config_path(app, env))
    cid = None if user is None or _hook.is_broken(user) else user.get("client_id")
    return cid if cid is not None and any(e.client_id == cid for e in pending.entries) else None


def keep_remote() -> Plan:
    """``disable --keep-remote``: the collector is not asked; the id is kept."""
    return Plan(kind="kept")


def carry_out(app: App, env: Mapping[str, str], remote: Plan, *, prog: str) -> list[str]:
    """After ``disable`` wrote ``disable=1`` and emptied the queue: schedule the forget and start the detached run
    (never waiting for it), or delete the id at once where no forget can be sent; the lines ``disable`` says.
    Raises :class:`~._userconf.ConfigError` when the id cannot be deleted from the config file."""
    cid = remote.client_id or ""
    if remote.kind == "kept":
        return ["The collector was not asked to forget your client id (--keep-remote); the id is kept."]
    if remote.kind == "cannot":
        _userconf.remove_client_id(app, cid, env)
        return [f"{remote.text}. Your old client id {cid} is deleted from this machine."]
    if remote.kind == "none":
        text = remote.text[:1].upper() + remote.text[1:]
        return [f"{text}; your client id is kept, so that '{prog} forget' can ask once there is one."]
    if remote.kind != "schedule" or remote.url is None:
        return []
    try:
        pending, had = schedule(app, env, cid, remote.url)
    except OSError as exc:
        return [
            f"Could not leave the forget of your client id to a background process ({exc.strerror or exc}); "
            f"ask with '{prog} forget --send-while-off'."
        ]
    start(app, env)
    shown = _sent.short_id(cid)
    if had:
        since = next(e.since for e in pending.entries if e.client_id == cid)
        return [f"The forget of client id {shown}, pending since {_hook.iso_time(since)}, is tried again now."]
    return [
        f"Asking {remote.url} to forget client id {shown}: a background process sends that one request now, "
        "and tries again for up to 30 days if it fails; the id is deleted from this machine once the collector "
        f"confirms. See it with '{prog} status'."
    ]


def forget_first(app: App, env: Mapping[str, str]) -> tuple[list[str], bool]:
    """``forget`` while a forget is pending: send it now, in the foreground (it is the user's own withdrawal, so
    also while reporting is off). The lines to say, and whether ``forget`` should go on with the id in use (one
    that ``enable`` made since); ``([], True)`` when nothing is pending."""
    pending = read(app, env)
    if pending is None:
        return [], True
    done = run(app, env, deadline=None, foreground=True)
    lines = [
        f"Forgotten at the collector: client id {_sent.short_id(c)}, deleted from this machine." for c in done.confirmed
    ]
    lines += [
        f"Not confirmed: the forget of {_sent.short_id(c)} ({done.message}); it stays pending." for c in done.kept
    ]
    if done.outcome in ("held", "busy"):
        lines.append(f"The pending forget was not sent ({done.message}).")
    user = _hook.read(_hook.user_config_path(app, env))
    cid = None if user is None or _hook.is_broken(user) else user.get("client_id")
    left = read(app, env)
    in_use = cid is not None and (left is None or all(e.client_id != cid for e in left.entries))
    return lines, in_use


# --- the detached run -------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What one :func:`run` did."""

    outcome: str
    """``delivered`` (every id confirmed or given up), ``failed`` (some kept for later), ``held`` (not sent:
    see :func:`may_send`), ``later`` (the back-off holds), ``busy`` (a flusher holds its lock), ``nothing``."""
    confirmed: tuple[str, ...] = ()
    given_up: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    message: str = ""


def run(
    app: App, env: Mapping[str, str], *, deadline: float | None, foreground: bool = False, inherited: bool = False
) -> RunResult:
    """Send the pending forget (see the module docstring). ``deadline``: the :func:`time.monotonic` time every
    request ends by (the detached process's, its watchdog's); ``None``: the tuning's deadline from when the
    flusher's lock is taken. ``foreground``: the ``forget`` command, which waits (bounded, as ``forget`` does) for
    a running flusher and ignores the back-off. ``inherited``: started by :mod:`._spawn`, which handed over the
    flusher's lock. Never raises for network or folder trouble."""
    from ._flush import WATCHDOG_GRACE

    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    if not may_send(decision):
        return RunResult(outcome="held", message=f"{_consent.explain(decision.reason)}: it waits")
    try:
        folder = Folder(_hook.state_dir(app, env), create=False)
    except OSError:
        return RunResult(outcome="nothing", message="no spool folder")
    tune = _settings.tuning(env)
    with folder:
        release = _take_lock(folder, env if inherited else {}, tune.deadline + WATCHDOG_GRACE + 1 if foreground else 0)
        if release is None:
            return RunResult(outcome="busy", message="a flusher kept its lock")
        until = time.monotonic() + tune.deadline if deadline is None else deadline
        try:
            return _run_locked(app, env, folder, deadline=until, foreground=foreground)
        except OSError as exc:
            return RunResult(outcome="failed", message=f"cannot use the spool folder: {exc.strerror or exc}")
        finally:
            release()


def _take_lock(folder: Folder, env: Mapping[str, str], wait: float) -> Callable[[], None] | None:
    """The flusher's lock: the one the hook handed over (``--forget`` started by it), else taken (waiting ``wait``
    seconds); a function that releases it, or ``None`` if a flusher keeps it."""
    from ._flush import _inherited_lock

    inherited = _inherited_lock(env, folder)
    if inherited is not None:
        return lambda: os.close(inherited)
    lock = _files.FolderLock(folder, FLUSHER_LOCK_NAME, wait)
    try:
        lock.acquire()
    except (OSError, _files.LockTimeout):
        return None
    return lock.release


def _run_locked(app: App, env: Mapping[str, str], folder: Folder, *, deadline: float, foreground: bool) -> RunResult:
    from . import _http

    lock = _files.FolderLock(folder, LOCK_NAME, RECORD_LOCK_WAIT)
    with lock:
        pending = _load(folder)
        if pending is None:
            _clear(folder)  # damaged or emptied: nothing to send
            return RunResult(outcome="nothing", message="no forget is pending")
        now = _state.now()
        if not foreground and _hook.backing_off(pending.next_try, now):
            return RunResult(outcome="later", message=f"backing off until {_hook.iso_time(pending.next_try or now)}")
        _spawn.touch(folder, FORGET_PENDING_NAME, now + CLAIM_SECONDS)  # claimed (see CLAIM_SECONDS)
    tune = _settings.tuning(env)
    confirmed: list[Entry] = []
    given_up: list[Entry] = []
    kept: list[Entry] = []
    retry_after: float | None = None
    errors: list[str] = []
    for entry in pending.entries:
        request = _forget.forget_request(entry.url, entry.client_id)
        sender = _http.Sender(entry.url, env, tune, deadline)
        try:
            answer = sender.send(request)
        finally:
            sender.close()
        if answer.attempted:
            with contextlib.suppress(Exception):  # a record, never a reason to stop
                _sent.write(folder, _sent.forget_line(request, entry.client_id, answer, str, _state.now()))
        shown = _sent.short_id(entry.client_id)
        if answer.kind == "ok" or answer.status == 410:
            confirmed.append(entry)
            what = "gone (410)" if answer.status == 410 else f"deleted {_forget.deleted_count(answer)} events"
            _state.log(folder, f"forget: {entry.url} confirmed the forget of {shown}: {what}")
            continue
        errors.append(answer.describe())
        retry_after = answer.retry_after if answer.retry_after is not None else retry_after
        if now - entry.since >= GIVE_UP_AFTER:
            given_up.append(entry)
            _state.log(folder, f"forget: gave up the forget of {shown} at {entry.url} after 30 days: {errors[-1]}")
        else:
            kept.append(entry)
    for entry in (*confirmed, *given_up):
        # The id first, then the record: a run ended in between sends the forget again (harmless), never the
        # other way round (an id left on disk with no record to delete it).
        with contextlib.suppress(_userconf.ConfigError):
            _userconf.remove_client_id(app, entry.client_id, env)
    return _settle(
        folder,
        pending,
        confirmed=confirmed,
        given_up=given_up,
        kept=kept,
        errors=errors,
        retry_after=retry_after,
        tune=tune,
    )


def _settle(
    folder: Folder,
    pending: Pending,
    *,
    confirmed: list[Entry],
    given_up: list[Entry],
    kept: list[Entry],
    errors: list[str],
    retry_after: float | None,
    tune: _settings.Tuning,
) -> RunResult:
    """Write what is left of the record (or delete it) and the back-off."""
    ids = {
        "confirmed": tuple(e.client_id for e in confirmed),
        "given_up": tuple(e.client_id for e in given_up),
        "kept": tuple(e.client_id for e in kept),
    }
    with _files.FolderLock(folder, LOCK_NAME, RECORD_LOCK_WAIT):
        current = _load(folder) or Pending(entries=())
        done = {e.client_id for e in (*confirmed, *given_up)}
        # `disable` may have added an id while this run sent: keep whatever is not settled.
        left = tuple(e for e in current.entries if e.client_id not in done)
        if not left:
            _clear(folder)
            return RunResult(outcome="delivered", message="every forget was confirmed or given up", **ids)
        fresh = any(e.client_id not in ids["kept"] for e in left)
        attempts = pending.attempts + 1 if kept else 0
        when = _state.now()
        next_try = when if fresh else when + _state.backoff_delay(max(1, attempts), retry_after, tune)
        error = errors[-1] if errors else None
        _save(folder, Pending(entries=left, attempts=attempts, last_error=error), next_try)
    _state.log(folder, f"forget: {len(left)} pending; next try after {_hook.iso_time(next_try)}; {error}")
    return RunResult(outcome="failed" if kept else "delivered", message=error or "", **ids)


# --- status ------------------------------------------------------------------------------------------------------


def status_text(pending: Pending, now: float) -> list[str]:
    """``status``'s lines: ``forget of 1b4e28ba... pending since ..., next try ...``."""
    lines = []
    for entry in pending.entries:
        nxt = pending.next_try
        when = "any time" if nxt is None or nxt <= now else _hook.iso_time(nxt)
        text = (
            f"forget of {_sent.short_id(entry.client_id)} pending since {_hook.iso_time(entry.since)}, next try {when}"
        )
        text += f" (at {entry.url}; gives up {_hook.iso_time(entry.since + GIVE_UP_AFTER)})"
        lines.append(text)
    if pending.attempts and pending.last_error:
        lines.append(f"last try failed ({pending.attempts} in a row): {pending.last_error}")
    return lines


def status_data(pending: Pending | None) -> list[dict[str, object]] | None:
    """``status --json``'s ``forget_pending``."""
    if pending is None:
        return None
    return [
        {
            "client_id": _sent.short_id(e.client_id),
            "url": e.url,
            "since": _hook.iso_time(e.since),
            "next_try": None if pending.next_try is None else _hook.iso_time(pending.next_try),
            "attempts": pending.attempts,
            "last_error": pending.last_error,
        }
        for e in pending.entries
    ]
