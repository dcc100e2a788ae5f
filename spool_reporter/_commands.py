"""The management commands' work: ``status``, ``enable``, ``disable``, ``flush`` (and ``--dry-run``), ``sent``,
``purge``, ``reset-id`` and ``forget``, each a function of the parsed flags and a :class:`Context` (defined here,
below the command line; :mod:`spool_reporter.cli` publishes it).

:mod:`spool_reporter.cli` holds the table of these commands (:data:`~spool_reporter.cli.COMMANDS`) and the
argparse and Click front ends; this module holds what each command does and says. Results go to stdout, problems
to stderr (a :class:`CommandError` is one line and exit status 1). ``status``, ``flush --dry-run`` and ``sent``
read the spool folder without changing anything; only ``flush`` imports the sender (and urllib3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TextIO

from . import SpoolReporterError, _consent, _files, _hook, _plan, _redact, _settings, _spool, _state
from ._cli_common import EXIT_FAILED, EXIT_OK, print_error
from ._event import parse_time
from ._hook import App
from ._words import counted, plural

__all__ = [
    "CommandError",
    "Context",
    "cmd_disable",
    "cmd_enable",
    "cmd_flush",
    "cmd_forget",
    "cmd_purge",
    "cmd_reset_id",
    "cmd_sent",
    "cmd_status",
]

LOCK_TIMEOUT: Final = 10.0
"""Seconds ``disable``/``purge`` wait for the spool lock (a flusher holds it for a rename at a time)."""

PROGRESS_MIN_EVENTS: Final = 1000
"""``flush`` shows progress on a terminal when at least this many events are queued."""


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


def _out(text: str = "", *, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


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


def _check_readable(app: App, env: Mapping[str, str]) -> None:
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


def _spool_summary(app: App, env: Mapping[str, str]) -> dict[str, Any]:
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


def _inputs(ctx: Context) -> tuple[dict[str, str] | None, dict[str, str] | None, _hook.Decision]:
    user, policy = _hook.read_inputs(ctx.app, ctx.env)
    return user, policy, _hook.decide(ctx.app, ctx.env, user, policy)


def _mode_text(decision: _hook.Decision) -> str:
    if decision.local:
        why = " (the system policy's default)" if decision.reason == "policy:local" else ""
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
        _out(json.dumps(status.data, indent=2, sort_keys=True))
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
    user, policy, decision = _inputs(ctx)
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False, sending=False)
    dest = resolved.destination
    spool = _spool_summary(app, env)
    state = _state.read_state(app, environ=env)
    known = "problem" not in spool  # an unreadable folder hides the flusher's record too
    cannot_record = _files.record_problem(spool["spool"]) if known else None
    problem = spool["problem"] if not known else cannot_record if decision.enabled else None
    seen = _hook.seen_notice_version(None if _hook.is_broken(user) else user)
    seen_mode = _hook.seen_notice_mode(None if _hook.is_broken(user) else user)
    data: dict[str, Any] = {
        "enabled": decision.enabled,
        "reason": decision.reason,
        "reason_text": _consent.explain(decision.reason, environ=env, user=user, policy=policy),
        "mode": decision.mode,
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
    }
    return _Status(data, decision, resolved, state, known, cannot_record, problem, seen, seen_mode)


def _print_status(status: _Status, ctx: Context) -> None:
    app, data, decision, state = ctx.app, status.data, status.decision, status.state
    now = time.time()
    _out(f"reporting:     {'on' if decision.enabled else 'off'} - {data['reason_text']} [{decision.reason}]")
    if status.cannot_record is not None:
        lost = "every event is lost" if decision.enabled else "even once reporting is on"
        _out(f"recording:     impossible, {lost}: {status.cannot_record.partition(': ')[2]}")
    _out(f"mode:          {_mode_text(decision)}")
    local = "; not used in local mode" if decision.local and status.resolved.destination is not None else ""
    _out(f"destination:   {status.resolved.reason}{local}")
    wording = _hook.NOTICE_LOCAL if decision.local else _hook.NOTICE_SEND
    due = ""
    if decision.enabled and (status.seen < app.notice_version or status.seen_mode != wording):
        due = f" (the {wording} wording is shown with the next recorded event)"
    said = f"version {status.seen} seen ({status.seen_mode} wording)" if status.seen else "never shown"
    _out(f"notice:        {said}, current {app.notice_version}{due}")
    _out(f"config file:   {data['config_file']}")
    _out(f"policy file:   {data['policy_file']}")
    _out(f"spool:         {data['spool']}")
    if not status.known:
        for label in ("queued", "dropped", "refused", "last flush", "next retry"):
            _out(f"{label + ':':<15}unknown (the spool folder cannot be read)")
        return
    oldest = ""
    oldest_epoch = parse_time(data["oldest"]) if data["oldest"] else None
    if oldest_epoch is not None:
        oldest = f", oldest {_age(now - oldest_epoch)} old ({data['oldest']})"
    _out(f"queued:        {counted(data['queued'], 'event')}{oldest}")
    if data["kept_local"]:
        _out(
            f"kept local:    {counted(data['kept_local'], 'event')} recorded in local mode, never sent "
            f"unless you run '{ctx.prog} enable'"
        )
    breakdown = ", ".join(f"{k} {v}" for k, v in sorted(data["dropped_by_reason"].items()))
    _out(f"dropped:       {data['dropped']}" + (f" ({breakdown})" if breakdown else ""))
    by_destination = data["refused_by_destination"]
    if any(by_destination.values()):
        _out(f"refused:       {_spool.refused_text(by_destination, 'event')} by the destination")
    last = "never" if state.last_flush is None else f"{data['last_flush']} ({state.last_result})"
    _out(f"last flush:    {last}")
    if decision.local:
        _out("next retry:    none (local mode: nothing is sent)")
    elif state.next_retry is not None and state.next_retry > now:
        _out(f"next retry:    not before {data['next_retry']} (in {_age(state.next_retry - now)})")
    else:
        _out("next retry:    any time")


def cmd_enable(args: argparse.Namespace, ctx: Context) -> int:
    """Write disable=0 to your config file: your explicit yes. It also turns reporting on in
    opt-in mode and in CI. {env_disable}, DO_NOT_TRACK and a system policy that disables
    reporting still win. Events recorded in local mode, which are never sent otherwise, join
    the queue: it says how many, and where the next flusher sends them.
    With --local, write mode=local too: events are recorded on this machine and never sent.
    With --endpoint URL, write endpoint=URL too (replacing the one there), in the file this
    platform reads, creating its folder: where events go (with --local, once you send). A URL
    that 'status' would refuse is a usage error, and nothing is written. It says where events
    go, and when the environment's endpoint wins over the file's.
    Exit status 1 if reporting stays off.
    """
    from ._local import count_local, send_local
    from ._userconf import ConfigError, update

    app, env = ctx.app, ctx.env
    _, _, before = _inputs(ctx)
    if args.local:
        changes: dict[str, str | None] = {"disable": "0", "mode": "local"}
    else:
        changes = {"disable": "0", "mode": None}
    if args.endpoint is not None:
        changes["endpoint"] = args.endpoint  # valid: check_enable_args has refused any other
    try:
        path = update(app, changes, env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    user, policy, decision = _inputs(ctx)
    written = ", ".join(f"{k}={_redact.redact_url(v)}" for k, v in changes.items() if v is not None)
    _out(f"Wrote {written} to {path}" + (" and removed mode=local." if before.local and not args.local else "."))
    if args.endpoint is not None:
        _out(_destination_after_enable(ctx, user, policy, decision, path))
    if decision.enabled and decision.local:
        kept = count_local(app, env)
        _out(
            "Local mode: events are recorded on this machine and never sent"
            + (f" ({counted(kept, 'event')} so far)" if kept else "")
            + f". See them with: {ctx.prog} flush --dry-run"
        )
        if _flusher_running(app, env):
            _out(IN_FLIGHT)
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
            _out(
                f"{counted(moved.events, 'event')} recorded in local mode joined the queue{dropped}: "
                f"{counted(moved.queued, 'queued event')} will be sent{where} by the next flusher, or now with "
                f"'{ctx.prog} flush'. See exactly what with: {ctx.prog} flush --dry-run"
            )
        _out(f"Reporting is on. See what would be sent with: {ctx.prog} flush --dry-run")
        return EXIT_OK
    why = _consent.explain(decision.reason, environ=env, user=user, policy=policy)
    _out(f"Reporting stays off: {why} [{decision.reason}].")
    if decision.reason == "destination:none":
        _out(f"Destination: {_settings.no_destination_text(app, env)}.")
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
    """Write disable=1 to your config file (other settings and the client id are kept) and
    delete every queued event, saying how many, and the record of what was sent (see 'sent').
    A flusher that is sending stops before its next request; the one already on its way cannot
    be called back (it says so).
    """
    from ._userconf import ConfigError, update

    status = EXIT_OK
    try:
        path = update(ctx.app, {"disable": "1"}, ctx.env)
        _out(f"Wrote disable=1 to {path}. Reporting is off.")
    except ConfigError as exc:
        # Reporting is already off when the file cannot be read safely; still delete what is queued.
        print_error(ctx.prog, str(exc))
        status = EXIT_FAILED
    _out(_purge(ctx.app, ctx.env))
    if _flusher_running(ctx.app, ctx.env):
        _out(IN_FLIGHT)
    return status


def cmd_sent(args: argparse.Namespace, ctx: Context) -> int:
    """Show the requests the flusher actually sent, oldest first: when, where (secrets
    redacted), the answer (HTTP status and body, or the error when none came: the bytes may
    have left all the same), how many events, and the exact body, printed as flush --dry-run
    prints it. With --json, one object {"requests": [...], "damaged": n} with each body as
    the exact string that was sent (body_base64 if it was not ASCII).

    The record is sent.jsonl in the spool folder (0600), rotated to sent.jsonl.1 at 256 KiB:
    several hundred events at least. disable, purge and forget delete it. Reads without locking
    or changing anything; damaged lines are skipped and counted.
    """
    from . import _sent

    path = _hook.state_dir(ctx.app, ctx.env)
    try:
        record = _sent.read(path)
    except PermissionError as exc:
        if exc.filename in (_spool.SENT_NAME, _spool.SENT_OLD_NAME):
            raise CommandError(f"cannot read {os.path.join(path, exc.filename)}: permission denied") from exc
        raise CommandError(_files.folder_problem(path, exc)) from exc
    except OSError as exc:
        raise CommandError(_files.folder_problem(path, exc)) from exc
    if args.json:
        _out(json.dumps({"requests": list(record.requests), "damaged": record.damaged}, indent=2))
        return EXIT_OK
    damaged = f"; {counted(record.damaged, 'damaged line')} skipped" if record.damaged else ""
    if not record.requests:
        _out(
            "Nothing sent is on record: nothing was sent yet, or the record was deleted "
            f"(by disable, purge or forget, or when reporting was turned off){damaged}."
        )
        return EXIT_OK
    events = sum(int(str(r["events"])) for r in record.requests)
    _out(
        f"{counted(len(record.requests), 'request')} on record, oldest first ({counted(events, 'event')}){damaged}; "
        f"in {os.path.join(path, _spool.SENT_NAME)}."
    )
    for request in record.requests:
        body = _sent.body_bytes(request)
        headers = request.get("headers")
        headers = headers if isinstance(headers, dict) else {}
        if request.get("status") is not None:
            answer = f"HTTP {request['status']}"
            if request.get("retry_after") is not None:
                answer += f", Retry-After {request['retry_after']:g} s"
        else:
            answer = f"no answer ({request.get('error')})"
        _out(
            f"\n--- {request['time']} {request['method']} {request['destination']}: {answer}; "
            f"{counted(int(str(request['events'])), 'event')}, {len(body)} bytes"
        )
        shown = _body_for_display(headers, body)
        _out(json.dumps(shown, indent=2) if not isinstance(shown, str) else shown)
        if request.get("answer"):
            _out(f"answer: {request['answer']}")
    return EXIT_OK


def cmd_purge(args: argparse.Namespace, ctx: Context) -> int:
    """Delete every queued event and say how many; delete the record of what was sent too
    (see 'sent'). A flusher that is sending them stops before its next request; the one
    already on its way cannot be called back (it says so).
    """
    _out(_purge(ctx.app, ctx.env))
    if _flusher_running(ctx.app, ctx.env):
        _out(IN_FLIGHT)
    return EXIT_OK


def cmd_reset_id(args: argparse.Namespace, ctx: Context) -> int:
    """Replace the random client id (a uuid4 in your config file) with a new one."""
    from ._userconf import ConfigError, update

    new = _hook.uuid4()
    try:
        path = update(ctx.app, {"client_id": new}, ctx.env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    _out(f"New client id {new} written to {path}.")
    _out("Events already queued keep the id they were recorded with.")
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
    """
    from . import _forget
    from ._userconf import ConfigError

    _check_readable(ctx.app, ctx.env)
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


def _progress_printer(stream: TextIO) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        stream.write(f"\rsent {done}/{total} events")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show


def cmd_flush(args: argparse.Namespace, ctx: Context) -> int:
    """Send queued events now, in the foreground, ignoring the back-off, and print a summary.
    Exit status 0 when nothing is left to send (all delivered, nothing queued, or reporting
    off - which deletes the queue), 1 when something could not be sent. In local mode nothing
    is sent (and the status is 0): it says so.

    With --dry-run, print exactly the requests a flush would make now, batch by batch
    (method, URL with secrets redacted, headers, body); send nothing and change nothing.
    In local mode, the requests that would leave once sending is on.
    """
    from ._local import count_local

    app, env = ctx.app, ctx.env
    _check_readable(app, env)
    if args.dry_run:
        return _dry_run(args, ctx)
    user, policy, decision = _inputs(ctx)
    if decision.enabled and decision.local:
        summary = _spool_summary(app, env)
        kept = (summary["queued"] or 0) + (summary["kept_local"] or 0)
        _out(
            f"local: nothing is sent in local mode; {counted(kept, 'event')} {plural(kept, 'stays', 'stay')} on this "
            "machine. "
            f"'{ctx.prog} enable' sends them, '{ctx.prog} flush --dry-run' shows what would leave."
        )
        return EXIT_OK
    progress = None
    if sys.stderr.isatty() and (_spool_summary(app, env)["queued"] or 0) >= PROGRESS_MIN_EVENTS:
        progress = _progress_printer(sys.stderr)
    from . import _flush  # the sender and urllib3: only when sending

    result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True, progress=progress)
    if result.outcome == "unusable-folder":
        raise CommandError(result.message)  # nothing was read, so there are no counts to show
    remaining = result.remaining
    if result.outcome in ("disabled", "invalid-endpoint"):
        remaining = _spool_summary(app, env)["queued"] or 0  # what is still there, counted here
    refused = f"refused {_spool.refused_text(result.refused)}, " if result.refused else ""
    _out(
        f"{result.outcome}: sent {result.sent}, {refused}rejected {result.rejected}, failed {result.failed}, "
        f"still queued {remaining}" + (f", deleted {result.purged}" if result.purged else "")
    )
    # "0 when nothing is left to send": delivered, nothing queued, or everything deleted because reporting is off.
    # "local": local mode was chosen while this flush sent; what stays queued stays by that choice.
    ok = result.outcome in ("delivered", "nothing", "local") or (
        result.outcome in ("disabled", "invalid-endpoint") and not remaining
    )
    if result.outcome == "delivered":
        dest = _settings.resolve(app, env).destination
        url = dest.redacted_url() if dest is not None else None
        sentence = _flush.sent_text(result.sent, url, rejected=result.rejected, refused=result.refused)
        message = sentence[:1].upper() + sentence[1:] + "."
    elif result.outcome == "disabled":
        user, policy, decision = _inputs(ctx)
        message = f"Reporting is off: {_consent.explain(decision.reason, environ=env, user=user, policy=policy)}"
        if result.purged:
            message += f"; deleted {counted(result.purged, 'queued event')}"
        elif remaining:
            message += f"; {counted(remaining, 'queued event')} kept, not sent"
        message += "."
    elif result.outcome == "invalid-endpoint":
        message = result.message[:1].upper() + result.message[1:]  # "The destination is invalid: <why>"
        if remaining:
            message += f"; {counted(remaining, 'queued event')} kept until it is fixed, not sent"
        message += "."
    else:
        message = result.message
    if message:
        (sys.stdout if ok else sys.stderr).write(message + "\n")
    kept = count_local(app, env)
    if kept:
        _out(
            f"{counted(kept, 'event')} recorded in local mode {plural(kept, 'stays', 'stay')} on this machine; "
            f"'{ctx.prog} enable' sends them."
        )
    return EXIT_OK if ok else EXIT_FAILED


def _body_for_display(headers: Mapping[str, str], body: bytes) -> Any:
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    if "json" in ctype:
        with contextlib.suppress(ValueError):
            return json.loads(body)
    return body.decode("utf-8", "replace")


def _local_requests(ctx: Context, events: list[dict[str, object]]) -> list[Any]:
    """In local mode: the requests that would leave if sending were on (``enable``), for ``--dry-run``."""
    from .transports import transport_for

    dest = _settings.resolve(ctx.app, ctx.env, sending=False).destination
    if dest is None or not events:
        return []
    return [batch.request for batch in transport_for(dest).prepare(events, now=time.time()).batches]


def _dry_run(args: argparse.Namespace, ctx: Context) -> int:
    plan = _plan.plan(ctx.app, environ=ctx.env)
    _, _, decision = _inputs(ctx)
    local = decision.enabled and decision.local
    shown_requests = _local_requests(ctx, plan.events + plan.local_events) if local else plan.requests
    requests = [
        {
            "method": r.method,
            "url": r.url_redacted,
            "headers": dict(r.headers),
            "body": _body_for_display(r.headers, r.body),
        }
        for r in shown_requests
    ]
    if args.json:
        doc = {
            "events": plan.events,
            "local_events": plan.local_events,
            "requests": requests,
            "reason": plan.reason,
            "local": local,
        }
        _out(json.dumps(doc, indent=2))
        return EXIT_OK
    _out(f"{counted(len(plan.events), 'queued event')}; nothing is sent by --dry-run.")
    if plan.local_events:
        _out(
            f"{counted(len(plan.local_events), 'event')} recorded in local mode "
            f"{plural(len(plan.local_events), 'is', 'are')} kept on this machine"
            + (", shown below with the queue." if local else f"; only '{ctx.prog} enable' sends them.")
        )
    if local:
        _out(f"Local mode: nothing leaves this machine. With sending on ('{ctx.prog} enable'), these would:")
    elif plan.reason:
        _out(f"No requests: {plan.reason}")
    for i, (req, shown) in enumerate(zip(shown_requests, requests, strict=True), 1):
        _out(f"\n--- request {i} of {len(requests)}: {len(req.body)} bytes")
        _out(f"{req.method} {req.url_redacted}")
        for k, v in req.headers.items():
            _out(f"{k}: {v}")
        _out()
        body = shown["body"]
        _out(json.dumps(body, indent=2) if not isinstance(body, str) else body)
    return EXIT_OK


def check_flush_args(args: argparse.Namespace) -> str | None:
    return (
        "--json goes with --dry-run (flush itself prints a one-line summary)"
        if args.json and not args.dry_run
        else None
    )
