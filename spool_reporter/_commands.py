"""The management commands' work: ``status``, ``enable``, ``disable``, ``purge``, ``reset-id`` and ``forget``,
each a function of the parsed flags and a :class:`Context` (defined here, below the command line;
:mod:`spool_reporter.cli` publishes it). ``flush`` and ``sent``, the commands that send or show requests, are in
:mod:`spool_reporter._commands_flush`, the layer above, which takes :func:`say`, :func:`inputs`,
:func:`spool_summary` and :func:`check_readable` from here.

:mod:`spool_reporter.cli` holds the table of these commands (:data:`~spool_reporter.cli.COMMANDS`) and the
argparse and Click front ends; this module holds what each command does and says. Results go to stdout, problems
to stderr (a :class:`CommandError` is one line and exit status 1). ``status`` reads the spool folder without
changing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from . import SpoolReporterError, _ask, _consent, _counters, _files, _hook, _redact, _settings, _spool, _state
from ._cli_common import EXIT_FAILED, EXIT_OK, print_error
from ._event import parse_time
from ._hook import App
from ._words import counted, plural

__all__ = [
    "CommandError",
    "Context",
    "cmd_disable",
    "cmd_enable",
    "cmd_forget",
    "cmd_purge",
    "cmd_reset_id",
    "cmd_status",
]

LOCK_TIMEOUT: Final = 10.0
"""Seconds ``disable``/``purge`` wait for the spool lock (a flusher holds it for a rename at a time)."""


class CommandError(SpoolReporterError):
    """A failure to report on stderr with exit status 1."""


@dataclass(frozen=True)
class Context:
    """Who a command runs for: the App, the environment it reads, and the command line that runs it."""

    app: App
    env: Mapping[str, str]
    prog: str
    """``django-spool``, or ``mytool analytics``: named in messages such as "see it with ... flush --dry-run"."""


# --- helpers -------------------------------------------------------------------------------------------


def say(text: str = "") -> None:
    """Write one line of a command's output to stdout."""
    sys.stdout.write(text + "\n")


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else _hook.iso_time(epoch)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _open_folder(path: str) -> _hook.Folder | None:
    """The spool folder, ``None`` if there is none yet; :class:`CommandError` (the real cause) if unusable."""
    try:
        return _hook.Folder(path, create=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CommandError(_files.folder_problem(path, exc)) from exc


def check_readable(app: App, env: Mapping[str, str]) -> None:
    """Raise :class:`CommandError` if the spool folder or one of its event files cannot be read: an answer
    built on the files that could be read would be a lie (``flush --dry-run`` saying "0 events")."""
    path = _hook.state_dir(app, env)
    folder = _open_folder(path)
    if folder is None:
        return
    with folder:
        name = _spool.unreadable_file(folder)
    if name is not None:
        raise CommandError(f"cannot read {os.path.join(path, name)}: permission denied")


def _purge(app: App, env: Mapping[str, str]) -> str:
    """Delete every queued event, those kept in local mode and the record of what was sent, under the spool
    locks (waiting :data:`LOCK_TIMEOUT` for each); the sentence that says what was deleted."""
    from . import _sent
    from ._local import purge_app

    path = _hook.state_dir(app, env)
    try:
        had_record = _sent.exists(path)
        deleted = purge_app(app, env, wait=LOCK_TIMEOUT)
    except _files.LockTimeout as exc:
        raise CommandError(f"the spool is locked by another process (waited {LOCK_TIMEOUT:.0f} s); try again") from exc
    except OSError as exc:
        raise CommandError(_files.folder_problem(path, exc)) from exc
    return f"Deleted {counted(deleted, 'queued event')}" + (" and the record of what was sent." if had_record else ".")


def spool_summary(app: App, env: Mapping[str, str]) -> dict[str, Any]:
    """Queued count, oldest event time and drop counters, read without writing anything. When the folder
    cannot be read, the counts are ``None`` (unknown) and ``problem`` says why."""
    from ._local import count_local

    path = _hook.state_dir(app, env)
    summary: dict[str, Any] = {
        "spool": path,
        "queued": 0,
        "oldest": None,
        "dropped": 0,
        "dropped_by_reason": {},
        "refused_by_destination": {},
        "kept_local": 0,
    }
    try:
        folder = _hook.Folder(path, create=False)
    except FileNotFoundError:
        return summary
    except OSError as exc:
        summary.update(
            queued=None,
            dropped=None,
            dropped_by_reason=None,
            refused_by_destination=None,
            kept_local=None,
            problem=_files.folder_problem(path, exc),
        )
        return summary
    summary["kept_local"] = count_local(app, env)
    with folder:
        summary.update(_spool.summary(folder))
    return summary


def inputs(ctx: Context) -> tuple[dict[str, str] | None, dict[str, str] | None, _hook.Decision]:
    """The user file and the policy, as read now, and the decision they make."""
    user, policy = _hook.read_inputs(ctx.app, ctx.env)
    return user, policy, _hook.decide(ctx.app, ctx.env, user, policy)


def _mode_text(decision: _hook.Decision) -> str:
    if decision.local:
        why = " (the system policy's default)" if decision.reason in ("policy:local", "app:local") else ""
        return f"local: events are recorded on this machine and never sent{why}"
    return {
        _hook.MODE_OPT_IN: "opt-in: the system policy keeps reporting off until you run 'enable'",
        _hook.MODE_LOCAL: "the system policy's default is local mode; you chose to send",
    }.get(decision.mode, "opt-out: on until someone says no, as DEP 8 proposes")


# --- commands ------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    """Show whether reporting is on and which rule decided it, the mode (opt-out, opt-in or
    local), the destination (secrets redacted), the version of the notice you have seen, where the
    spool is, how many events are queued and how old the oldest is, how many were dropped, how many
    the destination refused (by reason), the last flush and when the next retry may happen.
    It also says when no event can be recorded at all (a read-only home, a spool folder this user
    may not write): which folder, and why.

    Exit status 1 when the spool folder cannot be read, and when reporting is on but no event can
    be recorded; 0 otherwise.
    """
    status = _gather_status(ctx)
    if args.json:
        say(json.dumps(status.data, indent=2, sort_keys=True))
    else:
        _print_status(status, ctx)
    if status.problem is not None:
        print_error(ctx.prog, status.problem)
    return EXIT_FAILED if status.problem is not None else EXIT_OK


@dataclass(frozen=True)
class _Status:
    """What ``status`` found, gathered once for its two renderings (text and ``--json``)."""

    data: dict[str, Any]
    """The ``--json`` document."""
    decision: _hook.Decision
    resolved: _settings.Resolved
    state: _state.FlushState
    known: bool
    """Whether the spool folder could be read (an unreadable folder hides the flusher's record too)."""
    cannot_record: str | None
    """Why no event can be recorded (:func:`._files.record_problem`), or ``None``."""
    problem: str | None
    """The one line for stderr when the exit status is 1: the folder cannot be read, or reporting is on and no
    event can be recorded."""
    seen: int
    seen_mode: str | None


def _gather_status(ctx: Context) -> _Status:
    app, env = ctx.app, ctx.env
    user, policy, decision = inputs(ctx)
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False, sending=False)
    dest = resolved.destination
    spool = spool_summary(app, env)
    state = _state.read_state(app, environ=env)
    known = "problem" not in spool  # an unreadable folder hides the flusher's record too
    cannot_record = _files.record_problem(spool["spool"]) if known else None
    problem = spool["problem"] if not known else cannot_record if decision.enabled else None
    seen = _hook.seen_notice_version(None if _hook.is_broken(user) else user)
    seen_mode = _hook.seen_notice_mode(None if _hook.is_broken(user) else user)
    data: dict[str, Any] = {
        "enabled": decision.enabled,
        "reason": decision.reason,
        "reason_text": _consent.explain(
            decision.reason,
            environ=env,
            user=user,
            policy=policy,
            endpoint=_hook.effective_endpoint(app, env, user, policy),
        ),
        "mode": decision.mode,
        "ask": _ask.status_facts(app, env, user, policy) if decision.mode == _hook.MODE_ASK else None,
        "local": decision.local,
        "notice_version_seen": seen,
        "notice_mode_seen": seen_mode if seen else None,
        "notice_version": app.notice_version,
        "endpoint": None if dest is None else dest.redacted_url(),
        "transport": None if dest is None else dest.transport,
        "destination_text": resolved.reason,
        "config_file": _hook.user_config_path(app, env),
        "policy_file": _hook.read_policy(app, env)[0],
        **spool,
        "last_flush": _iso(state.last_flush) if known else None,
        "last_result": state.last_result if known else None,
        "next_retry": _iso(state.next_retry) if known else None,
        "consecutive_failures": state.consecutive_failures if known else None,
        "record_problem": cannot_record,
        "forget_pending": _forget_pending_data(app, env) if known else None,
    }
    return _Status(data, decision, resolved, state, known, cannot_record, problem, seen, seen_mode)


def _print_status(status: _Status, ctx: Context) -> None:
    app, data, decision, state = ctx.app, status.data, status.decision, status.state
    now = time.time()
    say(f"reporting:     {'on' if decision.enabled else 'off'} - {data['reason_text']} [{decision.reason}]")
    if status.cannot_record is not None:
        lost = "every event is lost" if decision.enabled else "even once reporting is on"
        say(f"recording:     impossible, {lost}: {status.cannot_record.partition(': ')[2]}")
    say(f"mode:          {_mode_text(decision) if data['ask'] is None else _ask.status_text(data['ask'])}")
    local = "; not used in local mode" if decision.local and status.resolved.destination is not None else ""
    say(f"destination:   {status.resolved.reason}{local}")
    wording = _hook.NOTICE_LOCAL if decision.local else _hook.NOTICE_SEND
    due = ""
    if decision.enabled and (status.seen < app.notice_version or status.seen_mode != wording):
        due = f" (the {wording} wording is shown with the next recorded event)"
    said = f"version {status.seen} seen ({status.seen_mode} wording)" if status.seen else "never shown"
    say(f"notice:        {said}, current {app.notice_version}{due}")
    say(f"config file:   {data['config_file']}")
    say(f"policy file:   {data['policy_file']}")
    say(f"spool:         {data['spool']}")
    if not status.known:
        for label in ("queued", "dropped", "refused", "last flush", "next retry"):
            say(f"{label + ':':<15}unknown (the spool folder cannot be read)")
        return
    oldest = ""
    oldest_epoch = parse_time(data["oldest"]) if data["oldest"] else None
    if oldest_epoch is not None:
        oldest = f", oldest {_age(now - oldest_epoch)} old ({data['oldest']})"
    say(f"queued:        {counted(data['queued'], 'event')}{oldest}")
    if data["kept_local"]:
        say(
            f"kept local:    {counted(data['kept_local'], 'event')} recorded in local mode, never sent "
            f"unless you run '{ctx.prog} enable'"
        )
    breakdown = ", ".join(f"{k} {v}" for k, v in sorted(data["dropped_by_reason"].items()))
    say(f"dropped:       {data['dropped']}" + (f" ({breakdown})" if breakdown else ""))
    by_destination = data["refused_by_destination"]
    if any(by_destination.values()):
        say(f"refused:       {_counters.refused_text(by_destination, 'event')} by the destination")
    last = "never" if state.last_flush is None else f"{data['last_flush']} ({state.last_result})"
    say(f"last flush:    {last}")
    if decision.local:
        say("next retry:    none (local mode: nothing is sent)")
    elif decision.reason == "destination:retired":
        say("next retry:    none (the destination retired itself: nothing is sent to it)")
    elif state.next_retry is not None and state.next_retry > now:
        say(f"next retry:    not before {data['next_retry']} (in {_age(state.next_retry - now)})")
    else:
        say("next retry:    any time")
    from . import _withdraw

    pending = _withdraw.read(app, ctx.env)  # the forget a `disable` left
    for line in [] if pending is None else _withdraw.status_text(pending, now):
        say(f"forget:        {line}")


def _forget_pending_data(app: App, env: Mapping[str, str]) -> list[dict[str, object]] | None:
    from . import _withdraw

    return _withdraw.status_data(_withdraw.read(app, env))


def cmd_enable(args: argparse.Namespace, ctx: Context) -> int:
    """Write disable=0 to your config file: your explicit yes. It also turns reporting on in
    opt-in mode and in CI. {env_disable}, DO_NOT_TRACK and a system policy that disables
    reporting still win. Events recorded in local mode, which are never sent otherwise, join
    the queue: it says how many, and where the next flusher sends them.
    With --local, write mode=local too: events are recorded on this machine and never sent.
    With --endpoint URL, write endpoint=URL too (replacing the one there), in the file this
    platform reads, creating its folder: where events go (with --local, once you send). A URL
    that 'status' would refuse is a usage error, and nothing is written. It says where events
    go, and when the environment's endpoint wins over the file's. Before the forget 'disable'
    asked for is delivered, it writes a new client id too: the old one is never reused.
    Exit status 1 if reporting stays off.
    """
    from ._local import count_local, send_local
    from ._userconf import ConfigError, update
    from ._withdraw import id_being_forgotten

    app, env = ctx.app, ctx.env
    _, _, before = inputs(ctx)
    if args.local:
        changes: dict[str, str | None] = {"disable": "0", "mode": "local"}
    else:
        changes = {"disable": "0", "mode": None}
    if args.endpoint is not None:
        changes["endpoint"] = args.endpoint  # valid: check_enable_args has refused any other
    forgotten = id_being_forgotten(app, env)  # a `disable`'s forget not delivered yet: that id is never reused
    try:
        path = update(app, {**changes, "client_id": _hook.uuid4()} if forgotten else changes, env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    _ask.forget_runs(app, env)  # answered: ask mode's count of runs goes
    user, policy, decision = inputs(ctx)
    written = ", ".join(f"{k}={_redact.redact_url(v)}" for k, v in changes.items() if v is not None)
    say(f"Wrote {written} to {path}" + (" and removed mode=local." if before.local and not args.local else "."))
    if forgotten:
        say(f"Your old client id {forgotten[:8]}... is still being forgotten at the collector: a new one replaces it.")
    if args.endpoint is not None:
        say(_destination_after_enable(ctx, user, policy, decision, path))
    if decision.enabled and decision.local:
        kept = count_local(app, env)
        say(
            "Local mode: events are recorded on this machine and never sent"
            + (f" ({counted(kept, 'event')} so far)" if kept else "")
            + f". See them with: {ctx.prog} flush --dry-run"
        )
        if _flusher_running(app, env):
            say(IN_FLIGHT)
        return EXIT_OK
    if decision.enabled:
        # Sending: the user's explicit yes also sends what was recorded under the "never sent" wording.
        try:
            moved = send_local(app, env, wait=LOCK_TIMEOUT)
        except _files.LockTimeout as exc:
            kept = count_local(app, env)
            raise CommandError(
                f"reporting is on, but the {counted(kept, 'event')} recorded in local mode "
                f"{plural(kept, 'stays', 'stay')} on this machine: the spool is locked by another process "
                f"(waited {LOCK_TIMEOUT:.0f} s); run '{ctx.prog} enable' again to send them"
            ) from exc
        except OSError as exc:
            raise CommandError(_files.folder_problem(_hook.local_dir(app, env), exc)) from exc
        if moved.events:
            dest = _settings.resolve(app, env, user=user, policy=policy, read_files=False, sending=False).destination
            where = f" to {dest.redacted_url()}" if dest is not None else ""
            dropped = f" (the caps dropped the oldest {counted(moved.dropped, 'event')})" if moved.dropped else ""
            say(
                f"{counted(moved.events, 'event')} recorded in local mode joined the queue{dropped}: "
                f"{counted(moved.queued, 'queued event')} will be sent{where} by the next flusher, or now with "
                f"'{ctx.prog} flush'. See exactly what with: {ctx.prog} flush --dry-run"
            )
        say(f"Reporting is on. See what would be sent with: {ctx.prog} flush --dry-run")
        return EXIT_OK
    named = _hook.effective_endpoint(app, env, user, policy)
    why = _consent.explain(decision.reason, environ=env, user=user, policy=policy, endpoint=named)
    say(f"Reporting stays off: {why} [{decision.reason}].")
    if decision.reason == "destination:retired":
        say(f"Another destination starts afresh: {ctx.prog} enable --endpoint URL.")
    if decision.reason == "destination:none":
        say(f"Destination: {_settings.no_destination_text(app, env)}.")
    return EXIT_FAILED


def check_enable_args(args: argparse.Namespace) -> str | None:
    """``enable --endpoint URL``: the reason ``status`` would give for refusing the URL (a usage error, so nothing
    is written), or ``None``."""
    if args.endpoint is None:
        return None
    return _settings.endpoint_problem(args.endpoint)


def _destination_after_enable(
    ctx: Context, user: dict[str, str] | None, policy: dict[str, str] | None, decision: _hook.Decision, path: str
) -> str:
    """Where events go now, as ``status`` says it; and, when the environment's endpoint wins over the one just
    written (it always does, docs/configuration.md), which variable to unset."""
    resolved = _settings.resolve(ctx.app, ctx.env, user=user, policy=policy, read_files=False, sending=False)
    text = f"Destination: {resolved.reason}"
    if decision.local:
        text += "; not used in local mode"
    if resolved.source is not None and resolved.source.startswith("env:"):
        variable = resolved.source.removeprefix("env:")
        text += f". {variable} is set and wins over the endpoint in {path}: unset it to use that one"
    return text + "."


IN_FLIGHT: Final = (
    "A flusher is sending right now: a request already on its way cannot be called back; it makes no further request."
)
"""What ``disable``, ``enable --local`` and ``purge`` say when a flusher holds its lock (:func:`_flusher_running`)."""


def _flusher_running(app: App, env: Mapping[str, str]) -> bool:
    """Whether a flusher holds ``flusher.lock`` now (one try of the lock; nothing is created)."""
    try:
        folder = _hook.Folder(_hook.state_dir(app, env), create=False)
    except OSError:
        return False
    with folder:
        try:
            folder.lstat(_hook.FLUSHER_LOCK_NAME)
        except OSError:
            return False
        try:
            fd = _hook.claim_flusher_lock(folder)  # the hook's own probe: one try of the lock
        except OSError:
            return False
        if fd is None:
            return True
        os.close(fd)
        return False


def cmd_disable(args: argparse.Namespace, ctx: Context) -> int:
    """Write disable=1 to your config file (other settings are kept), delete every queued event,
    saying how many, and the record of what was sent (see 'sent'), and ask the collector to
    forget your client id, as 'forget' does, without waiting: a background process sends that
    one request (POST /v1/forget) and tries again, with a growing delay, for up to 30 days. The
    id is deleted from this machine once the collector confirms; 'status' shows the pending
    forget. With --keep-remote the collector is not asked, and the id is kept. GA4 and Universal
    Analytics cannot forget (it says why): the id is deleted at once. With no valid destination
    nobody can be asked: the id is kept, for a later 'forget'. {env_disable} and DO_NOT_TRACK
    are local switches: while one is set the forget waits, and setting one never asks for one.
    A flusher that is sending stops before its next request; the one already on its way cannot
    be called back (it says so).
    """
    from . import _withdraw
    from ._userconf import ConfigError, update

    status = EXIT_OK
    remote = _withdraw.keep_remote() if args.keep_remote else _withdraw.plan(ctx.app, ctx.env)  # before any change
    try:
        path = update(ctx.app, {"disable": "1"}, ctx.env)
        _ask.forget_runs(ctx.app, ctx.env)  # answered: ask mode's count of runs goes
        say(f"Wrote disable=1 to {path}. Reporting is off.")
    except ConfigError as exc:
        # Reporting is already off when the file cannot be read safely; still delete what is queued. The "no"
        # was not written, so no forget is asked for.
        print_error(ctx.prog, str(exc))
        status = EXIT_FAILED
        remote = _withdraw.Plan(kind="no-id")
    say(_purge(ctx.app, ctx.env))
    running = _flusher_running(ctx.app, ctx.env)  # before the forget's own run takes the lock
    try:
        for line in _withdraw.carry_out(ctx.app, ctx.env, remote, prog=ctx.prog):
            say(line)
    except ConfigError as exc:
        print_error(ctx.prog, str(exc))
        status = EXIT_FAILED
    if running:
        say(IN_FLIGHT)
    return status


def cmd_purge(args: argparse.Namespace, ctx: Context) -> int:
    """Delete every queued event and say how many; delete the record of what was sent too
    (see 'sent'). A flusher that is sending them stops before its next request; the one
    already on its way cannot be called back (it says so).
    """
    say(_purge(ctx.app, ctx.env))
    if _flusher_running(ctx.app, ctx.env):
        say(IN_FLIGHT)
    return EXIT_OK


def cmd_reset_id(args: argparse.Namespace, ctx: Context) -> int:
    """Replace the random client id (a uuid4 in your config file) with a new one."""
    from ._userconf import ConfigError, update
    from ._withdraw import id_being_forgotten

    new = _hook.uuid4()
    forgotten = id_being_forgotten(ctx.app, ctx.env)
    try:
        path = update(ctx.app, {"client_id": new}, ctx.env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    say(f"New client id {new} written to {path}.")
    say("Events already queued keep the id they were recorded with.")
    if forgotten:
        say(f"The forget of the old id {forgotten[:8]}... that 'disable' asked for stays pending.")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace, ctx: Context) -> int:
    """Ask the configured collector to delete every event stored under this machine's client
    id (POST /v1/forget), then replace the id with a new random one. Queued events are deleted
    first, so none of them leaves the machine, and so is the record of what was sent (it holds
    the old id). The request follows the flusher's rules: one
    deadline, verified HTTPS (plain HTTP only to loopback), proxies honoured. It is not sent
    while reporting is off, unless --send-while-off.

    A collector keeps numbers of closed weeks that hold no client id (its roll-ups): those stay.
    GA4 and Universal Analytics offer no deletion through the Measurement Protocol: for them the
    id is replaced and the queue emptied, and the old id is printed for the property's owner, who
    can delete it with GA4's User Deletion API.

    Exit status 0 when the collector confirmed the deletion (or there is no client id to forget);
    1 when it did not: the destination cannot delete, the request failed, reporting is off, a
    flusher kept its lock. After a failed request the id is kept, so that forget can be run again.
    A forget that 'disable' left pending is sent first, now.
    """
    from . import _forget, _withdraw
    from ._userconf import ConfigError

    check_readable(ctx.app, ctx.env)
    # A forget `disable` left goes first, now (the user's own withdrawal: also while reporting is off); then the id
    # in use, if `enable` made a new one since.
    lines, go_on = _withdraw.forget_first(ctx.app, ctx.env)
    for line in lines:
        say(line)
    if not go_on:
        return EXIT_OK if _withdraw.read(ctx.app, ctx.env) is None else EXIT_FAILED
    try:
        result = _forget.forget(ctx.app, environ=ctx.env, send_while_off=args.send_while_off)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    out, err, status = _forget.report(result)
    sys.stdout.write(out)
    if err is not None:
        sys.stdout.flush()
        print_error(ctx.prog, err)
    return status
