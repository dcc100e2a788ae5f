"""The management commands: ``django-spool``, and the same commands for any :class:`~spool_reporter.App`.

Results go to stdout, problems to stderr. Exit codes: 0 success, 1 failure, 2 usage error, 141 when the
reader of the output went away (``django-spool status | head -1``), as for a command ended by SIGPIPE.

**Public** (docs/cli-embedding.md): :func:`main` (a whole program for an App), :func:`add_commands` and
:func:`run_command` (the commands as subcommands of any argparse program), :class:`Command` and
:data:`COMMANDS` (the one table that argparse and the optional Click group, :mod:`spool_reporter.click`, are
both built from: one more command is one more row and its function). Everything else here is private.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TextIO, cast

from . import _consent, _hook, _plan, _settings, _spool, _state
from ._hook import App, django_app
from ._version import __version__

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["COMMANDS", "Command", "Context", "Option", "add_commands", "build_parser", "main", "run_command"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_PIPE: Final = 128 + 13
"""128 + SIGPIPE: what a shell reports for a command ended by a closed pipe (``yes | head -1``)."""

LOCK_TIMEOUT: Final = 10.0
"""Seconds ``disable``/``purge`` wait for the spool lock (a flusher holds it for a rename at a time)."""

PROGRESS_MIN_EVENTS: Final = 1000
"""``flush`` shows progress on a terminal when at least this many events are queued."""

DESCRIPTION: Final = """\
See and control {name} usage reporting{dep8}, implemented by spool_reporter.

When reporting is on, {what} each queue one
anonymous event on this machine (the command name, {name}/Python/OS versions, a random id);
a background process sends queued events later, except in local mode. Nothing is ever sent
while reporting is off.
"""

EPILOG: Final = """\
exit status: 0 success, 1 failure, 2 usage error (141: the output pipe closed early).
environment: {env_disable}=1 or DO_NOT_TRACK=1 turn reporting off;
{env_debug}=1 prints events instead of queueing them.
docs: {docs_url}
"""


class CommandError(Exception):
    """A failure to report on stderr with exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, except that a closed pipe under ``--help`` is reported to :func:`main` like any other output
    (argparse ignores ``OSError`` there, so ``--help | head -1`` would exit 0 or 141 depending on buffering)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


@dataclass(frozen=True)
class Context:
    """Who a command runs for: the App, the environment it reads, and the command line that runs it."""

    app: App
    env: Mapping[str, str]
    prog: str
    """``django-spool``, or ``mytool analytics``: named in messages such as "see it with ... flush --dry-run"."""


@dataclass(frozen=True)
class Option:
    """A flag of a command (every option today is an on/off flag)."""

    flags: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Command:
    """One management command: the same row builds the argparse subcommand and the Click command."""

    name: str
    run: Callable[[argparse.Namespace, Context], int]
    """Runs it with the parsed flags (attribute names as argparse derives them: ``dry_run``); the exit status."""
    help: str
    description: str
    """Its ``--help`` text; ``{prog}``, ``{name}``, ``{env_disable}`` and ``{env_debug}`` are filled in."""
    options: tuple[Option, ...] = ()
    check: Callable[[argparse.Namespace], str | None] | None = None
    """A usage error in the flags (exit status 2), or ``None``."""


# --- helpers -------------------------------------------------------------------------------------------


def _out(text: str = "", *, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def _err(prog: str, text: str) -> None:
    sys.stderr.write(f"{prog}: {text}\n")


def _n(count: int, noun: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else _hook.iso_time(epoch)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _denied(path: str) -> str:
    """The folder that refuses access on the way to ``path``: the first one this user cannot enter, else
    ``path`` itself (which it cannot read)."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts)):
        ancestor = os.sep.join(parts[:i]) or os.sep
        if os.path.isdir(ancestor) and not os.access(ancestor, os.X_OK):
            return ancestor
    return path


def _blocker(path: str) -> tuple[str, str]:
    """The first component of ``path`` that the spool code refuses to follow (``"link"``: another user's link,
    or a link at one of the last two levels, ``spool_reporter/`` and the application's folder) or that is not a
    folder (``"file"``), read with ``lstat``: a description for the message, never a decision (the spool code
    decides through descriptors)."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        here = os.sep.join(parts[:i])
        try:
            st = os.lstat(here)
        except OSError:
            break
        if stat.S_ISLNK(st.st_mode):
            if i >= len(parts) - 1 or st.st_uid not in (0, os.geteuid() if hasattr(os, "geteuid") else 0):
                return here, "link"
            continue
        if not stat.S_ISDIR(st.st_mode):
            return here, "file"
    return path, ""


def folder_problem(path: str, exc: OSError) -> str:
    """The real reason the spool folder at ``path`` cannot be used, naming the path once."""
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    if isinstance(cause, PermissionError):
        denied = _denied(path)
        where = "" if denied == path else f" ({denied} cannot be entered)"
        return f"cannot read the spool folder {path}: permission denied{where}"
    if cause.errno in (errno.ELOOP, errno.ENOTDIR):
        blocker, what = _blocker(path)
        if what == "link":
            return f"the spool folder {path} is reached through the symbolic link {blocker}; refusing to follow it"
        if what == "file":
            return f"the spool folder {path} cannot be made: {blocker} is not a folder"
        return f"the spool folder {path} is not a folder (or a file stands in its path)"
    if str(exc).startswith("not our folder"):
        return f"the spool folder {path} belongs to another user; refusing to use it"
    return f"cannot use the spool folder {path}: {cause.strerror or cause}"


def _open_folder(path: str) -> _hook.Folder | None:
    """The spool folder, ``None`` if there is none yet; :class:`CommandError` (the real cause) if unusable."""
    try:
        return _hook.Folder(path, create=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CommandError(folder_problem(path, exc)) from exc


def _check_readable(app: App, env: Mapping[str, str]) -> None:
    """Raise :class:`CommandError` if the spool folder or one of its event files cannot be read: an answer
    built on the files that could be read would be a lie (``flush --dry-run`` saying "0 events")."""
    path = _hook.state_dir(app, env)
    folder = _open_folder(path)
    if folder is None:
        return
    with folder:
        names = [name for name, _, _ in _spool.segments(folder)] + [_hook.ACTIVE_NAME]
        for name in names:
            try:
                os.close(folder.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)))
            except PermissionError as exc:
                raise CommandError(f"cannot read {os.path.join(path, name)}: permission denied") from exc
            except OSError:
                continue  # missing, or planted (a symlink, a FIFO): skipped by the reader, as by the flusher


@contextlib.contextmanager
def _locked(app: App, env: Mapping[str, str]) -> Iterator[_hook.Folder | None]:
    """The spool folder under the spool lock (``filelock``: the same flock as the hook), or ``None``."""
    import filelock

    path = _hook.state_dir(app, env)
    folder = _open_folder(path)
    if folder is None:
        yield None
        return
    with folder:
        lock = filelock.FileLock(os.path.join(path, _hook.LOCK_NAME), mode=0o600)
        try:
            lock.acquire(timeout=LOCK_TIMEOUT)
        except filelock.Timeout as exc:
            raise CommandError(
                f"the spool is locked by another process (waited {LOCK_TIMEOUT:.0f} s); try again"
            ) from exc
        except OSError as exc:  # a read-only file system, a planted symlink at the lock file, ...
            raise CommandError(f"cannot lock the spool in {path}: {exc.strerror or exc}") from exc
        try:
            yield folder
        finally:
            lock.release()


def _purge(app: App, env: Mapping[str, str]) -> int:
    with _locked(app, env) as folder:
        if folder is None:
            return 0
        try:
            return _spool.purge(folder)
        except OSError as exc:
            raise CommandError(f"cannot delete the queued events in {folder.path}: {exc.strerror or exc}") from exc


def _spool_summary(app: App, env: Mapping[str, str]) -> dict[str, Any]:
    """Queued count, oldest event time and drop counters, read without writing anything. When the folder
    cannot be read, the counts are ``None`` (unknown) and ``problem`` says why."""
    path = _hook.state_dir(app, env)
    summary: dict[str, Any] = {"spool": path, "queued": 0, "oldest": None, "dropped": 0, "dropped_by_reason": {}}
    try:
        folder = _hook.Folder(path, create=False)
    except FileNotFoundError:
        return summary
    except OSError as exc:
        summary.update(queued=None, dropped=None, dropped_by_reason=None, problem=folder_problem(path, exc))
        return summary
    with folder:
        summary["queued"] = _spool.count_queued(folder)
        counters = _spool.read_counters(folder)
        summary["dropped_by_reason"] = counters
        summary["dropped"] = sum(counters.values())
        names = [name for name, _, _ in _spool.segments(folder)] + [_hook.ACTIVE_NAME]
        for name in names:
            try:
                data = _spool.read_bytes(folder, name, _hook.HUGE_ACTIVE_BYTES)
            except OSError:
                continue
            events, _ = _spool.parse_lines(data or b"")
            if events:
                summary["oldest"] = events[0]["time"]
                break
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
    app, env = ctx.app, ctx.env
    user, policy, decision = _inputs(ctx)
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False, sending=False)
    dest = resolved.destination
    spool = _spool_summary(app, env)
    state = _state.read_state(app, environ=env)
    known = "problem" not in spool  # an unreadable folder hides the flusher's record too
    seen = _hook.seen_notice_version(None if _hook.is_broken(user) else user)
    data: dict[str, Any] = {
        "enabled": decision.enabled,
        "reason": decision.reason,
        "reason_text": _consent.explain(decision.reason, environ=env, user=user, policy=policy),
        "mode": decision.mode,
        "local": decision.local,
        "notice_version_seen": seen,
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
    }
    if args.json:
        _out(json.dumps(data, indent=2, sort_keys=True))
        if not known:
            _err(ctx.prog, spool["problem"])
        return EXIT_OK if known else EXIT_FAILED
    now = time.time()
    _out(f"reporting:     {'on' if decision.enabled else 'off'} - {data['reason_text']} [{decision.reason}]")
    _out(f"mode:          {_mode_text(decision)}")
    local = "; not used in local mode" if decision.local and dest is not None else ""
    _out(f"destination:   {resolved.reason}{local}")
    due = " (shown again with the next recorded event)" if decision.enabled and seen < app.notice_version else ""
    _out(f"notice:        version {seen} seen, current {app.notice_version}{due}")
    _out(f"config file:   {data['config_file']}")
    _out(f"policy file:   {data['policy_file']}")
    _out(f"spool:         {spool['spool']}")
    if not known:
        for label in ("queued", "dropped", "last flush", "next retry"):
            _out(f"{label + ':':<15}unknown (the spool folder cannot be read)")
        _err(ctx.prog, spool["problem"])
        return EXIT_FAILED
    oldest = ""
    if spool["oldest"]:
        with contextlib.suppress(ValueError):
            oldest_epoch = time.mktime(time.strptime(spool["oldest"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            oldest = f", oldest {_age(now - oldest_epoch)} old ({spool['oldest']})"
    _out(f"queued:        {_n(spool['queued'], 'event')}{oldest}")
    breakdown = ", ".join(f"{k} {v}" for k, v in sorted(spool["dropped_by_reason"].items()))
    _out(f"dropped:       {spool['dropped']}" + (f" ({breakdown})" if breakdown else ""))
    last = "never" if state.last_flush is None else f"{data['last_flush']} ({state.last_result})"
    _out(f"last flush:    {last}")
    if decision.local:
        _out("next retry:    none (local mode: nothing is sent)")
    elif state.next_retry is not None and state.next_retry > now:
        _out(f"next retry:    not before {data['next_retry']} (in {_age(state.next_retry - now)})")
    else:
        _out("next retry:    any time")
    return EXIT_OK


def cmd_enable(args: argparse.Namespace, ctx: Context) -> int:
    from ._userconf import ConfigError, update

    app, env = ctx.app, ctx.env
    _, _, before = _inputs(ctx)
    if args.local:
        changes: dict[str, str | None] = {"disable": "0", "mode": "local"}
    else:
        changes = {"disable": "0", "mode": None}
        if before.local:  # local -> sending: say what is about to leave first
            queued = _spool_summary(app, env)["queued"] or 0
            dest = _settings.resolve(app, env, sending=False).destination
            where = f" to {dest.redacted_url()}" if dest is not None else ""
            _out(
                f"Leaving local mode: {_n(queued, 'queued event')} will be sent{where} by the next flusher; "
                f"see exactly what with: {ctx.prog} flush --dry-run"
            )
    try:
        path = update(app, changes, env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    user, policy, decision = _inputs(ctx)
    written = ", ".join(f"{k}={v}" for k, v in changes.items() if v is not None)
    _out(f"Wrote {written} to {path}" + (" and removed mode=local." if before.local and not args.local else "."))
    if decision.enabled and decision.local:
        _out(
            f"Local mode: events are recorded on this machine and never sent. See them with: {ctx.prog} flush --dry-run"
        )
        return EXIT_OK
    if decision.enabled:
        _out(f"Reporting is on. See what would be sent with: {ctx.prog} flush --dry-run")
        return EXIT_OK
    why = _consent.explain(decision.reason, environ=env, user=user, policy=policy)
    _out(f"Reporting stays off: {why} [{decision.reason}].")
    if decision.reason == "destination:none":
        _out(f"Destination: {_settings.no_destination_text(app, env)}.")
    return EXIT_FAILED


def cmd_disable(args: argparse.Namespace, ctx: Context) -> int:
    from ._userconf import ConfigError, update

    status = EXIT_OK
    try:
        path = update(ctx.app, {"disable": "1"}, ctx.env)
        _out(f"Wrote disable=1 to {path}. Reporting is off.")
    except ConfigError as exc:
        # Reporting is already off when the file cannot be read safely; still delete what is queued.
        _err(ctx.prog, str(exc))
        status = EXIT_FAILED
    deleted = _purge(ctx.app, ctx.env)
    _out(f"Deleted {_n(deleted, 'queued event')}.")
    return status


def cmd_purge(args: argparse.Namespace, ctx: Context) -> int:
    deleted = _purge(ctx.app, ctx.env)
    _out(f"Deleted {_n(deleted, 'queued event')}.")
    return EXIT_OK


def cmd_reset_id(args: argparse.Namespace, ctx: Context) -> int:
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
        _err(ctx.prog, err)
    return status


def _progress_printer(stream: TextIO) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        stream.write(f"\rsent {done}/{total} events")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show


def cmd_flush(args: argparse.Namespace, ctx: Context) -> int:
    app, env = ctx.app, ctx.env
    _check_readable(app, env)
    if args.dry_run:
        return _dry_run(args, ctx)
    user, policy, decision = _inputs(ctx)
    if decision.enabled and decision.local:
        queued = _spool_summary(app, env)["queued"] or 0
        _out(
            f"local: nothing is sent in local mode; {_n(queued, 'queued event')} stay on this machine. "
            f"'{ctx.prog} enable' sends them, '{ctx.prog} flush --dry-run' shows what would leave."
        )
        return EXIT_OK
    progress = None
    if sys.stderr.isatty() and (_spool_summary(app, env)["queued"] or 0) >= PROGRESS_MIN_EVENTS:
        progress = _progress_printer(sys.stderr)
    from . import _flush  # the sender and urllib3: only when sending

    result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True, progress=progress)
    if result.outcome == "failed" and result.message.startswith("the spool folder is not usable"):
        raise CommandError(result.message)  # nothing was read, so there are no counts to show
    remaining = result.remaining
    if result.outcome in ("disabled", "no-endpoint"):
        remaining = _spool_summary(app, env)["queued"] or 0  # what is still there, counted here
    _out(
        f"{result.outcome}: sent {result.sent}, rejected {result.rejected}, failed {result.failed}, "
        f"still queued {remaining}" + (f", deleted {result.purged}" if result.purged else "")
    )
    # "0 when nothing is left to send": delivered, nothing queued, or everything deleted because reporting is off.
    ok = result.outcome in ("delivered", "nothing") or (result.outcome in ("disabled", "no-endpoint") and not remaining)
    if result.outcome == "delivered":
        message = f"Sent {_n(result.sent, 'event')}" + (f", rejected {result.rejected}" if result.rejected else "")
        dest = _settings.resolve(app, env).destination
        message += f" to {dest.redacted_url()}." if dest is not None else "."
    elif result.outcome == "disabled":
        user, policy, decision = _inputs(ctx)
        message = f"Reporting is off: {_consent.explain(decision.reason, environ=env, user=user, policy=policy)}"
        if result.purged:
            message += f"; deleted {_n(result.purged, 'queued event')}"
        elif remaining:
            message += f"; {_n(remaining, 'queued event')} kept, not sent"
        message += "."
    else:
        message = result.message
    if message:
        (sys.stdout if ok else sys.stderr).write(message + "\n")
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
    shown_requests = _local_requests(ctx, plan.events) if local else plan.requests
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
        doc = {"events": plan.events, "requests": requests, "reason": plan.reason, "local": local}
        _out(json.dumps(doc, indent=2))
        return EXIT_OK
    _out(f"{_n(len(plan.events), 'queued event')}; nothing is sent by --dry-run.")
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


def _check_flush_args(args: argparse.Namespace) -> str | None:
    return (
        "--json goes with --dry-run (flush itself prints a one-line summary)"
        if args.json and not args.dry_run
        else None
    )


# --- the table ----------------------------------------------------------------------------------------

COMMANDS: Final[tuple[Command, ...]] = (
    Command(
        name="status",
        run=cmd_status,
        help="show whether reporting is on, why, and what is queued",
        description="Show whether reporting is on and which rule decided it, the mode (opt-out, opt-in or\n"
        "local), the destination (secrets redacted), the version of the notice you have seen, where the\n"
        "spool is, how many events are queued and how old the oldest is, how many were dropped, the last\n"
        "flush and when the next retry may happen.",
        options=(Option(("--json",), "print one JSON object (for scripts)"),),
    ),
    Command(
        name="enable",
        run=cmd_enable,
        help="turn reporting on (your explicit yes), or keep events local",
        description="Write disable=0 to your config file: your explicit yes. It also turns reporting on in\n"
        "opt-in mode and in CI. {env_disable}, DO_NOT_TRACK and a system policy that disables\n"
        "reporting still win. Coming from local mode, it says what is queued and will now be sent.\n"
        "With --local, write mode=local too: events are recorded on this machine and never sent.\n"
        "Exit status 1 if reporting stays off.",
        options=(Option(("--local",), "record events on this machine only; never send them"),),
    ),
    Command(
        name="disable",
        run=cmd_disable,
        help="turn reporting off and delete everything queued",
        description="Write disable=1 to your config file (other settings and the client id are kept) and\n"
        "delete every queued event, saying how many.",
    ),
    Command(
        name="flush",
        run=cmd_flush,
        help="send queued events now, or show what would be sent",
        description="Send queued events now, in the foreground, ignoring the back-off, and print a summary.\n"
        "Exit status 0 when nothing is left to send (all delivered, nothing queued, or reporting\n"
        "off - which deletes the queue), 1 when something could not be sent. In local mode nothing\n"
        "is sent (and the status is 0): it says so.\n\n"
        "With --dry-run, print exactly the requests a flush would make now, batch by batch\n"
        "(method, URL with secrets redacted, headers, body); send nothing and change nothing.\n"
        "In local mode, the requests that would leave once sending is on.",
        options=(
            Option(("--dry-run",), "print the requests; send and change nothing"),
            Option(("--json",), "with --dry-run: one JSON object {events, requests, reason, local}"),
        ),
        check=_check_flush_args,
    ),
    Command(
        name="purge",
        run=cmd_purge,
        help="delete every queued event",
        description="Delete every queued event and say how many.",
    ),
    Command(
        name="reset-id",
        run=cmd_reset_id,
        help="start over with a new random client id",
        description="Replace the random client id (a uuid4 in your config file) with a new one.",
    ),
    Command(
        name="forget",
        run=cmd_forget,
        help="ask the collector to delete your events, then start over with a new client id",
        description="Ask the configured collector to delete every event stored under this machine's client\n"
        "id (POST /v1/forget), then replace the id with a new random one. Queued events are deleted\n"
        "first, so none of them leaves the machine. The request follows the flusher's rules: one\n"
        "deadline, verified HTTPS (plain HTTP only to loopback), proxies honoured. It is not sent\n"
        "while reporting is off, unless --send-while-off.\n\n"
        "A collector keeps numbers of closed weeks that hold no client id (its roll-ups): those stay.\n"
        "GA4 and Universal Analytics offer no deletion through the Measurement Protocol: for them the\n"
        "id is replaced and the queue emptied, and the old id is printed for the property's owner, who\n"
        "can delete it with GA4's User Deletion API.\n\n"
        "Exit status 0 when the collector confirmed the deletion (or there is no client id to forget);\n"
        "1 when it did not: the destination cannot delete, the request failed, reporting is off, a\n"
        "flusher kept its lock. After a failed request the id is kept, so that forget can be run again.",
        options=(
            Option(
                ("--send-while-off",),
                "send the deletion request even though reporting is off (it carries your client id only)",
            ),
        ),
    ),
)
"""The management commands, in ``--help`` order."""


# --- argparse -----------------------------------------------------------------------------------------


def _words(app: App, prog: str) -> dict[str, str]:
    django = app.slug == "django"
    return {
        "prog": prog,
        "name": app.name,
        "dep8": " (DEP 8)" if django else "",
        "what": "`django-admin startproject`, `startapp` and `runserver`" if django else f"{app.name}'s commands",
        "env_disable": app.env_disable,
        "env_debug": app.env_debug,
        "docs_url": app.docs_url,
    }


def add_commands(
    parser: argparse.ArgumentParser, app: App, *, prog: str | None = None
) -> argparse._SubParsersAction[Any]:
    """Add the management commands for ``app`` as subcommands of ``parser`` (any argparse parser, e.g. the
    one of ``mytool analytics``); returns the subparsers action. ``prog`` (default: ``parser.prog``) is the
    command line named in messages; give the same to ``App(cli_name=...)`` so that the notice names it too.
    Run a parsed command with :func:`run_command`."""
    prog = prog or parser.prog
    words = _words(app, prog)
    epilog = EPILOG.format(**words)
    sub = parser.add_subparsers(dest="spool_reporter_subcommand", metavar="COMMAND", title="commands")
    sub.required = True
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description.format(**words),
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for option in command.options:
            p.add_argument(*option.flags, action="store_true", help=option.help)
        p.set_defaults(
            spool_reporter_command=command, spool_reporter_app=app, spool_reporter_prog=prog, spool_reporter_parser=p
        )
    return sub


def run_command(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> int | None:
    """Run the management command :func:`add_commands` parsed into ``args`` and return its exit status
    (never raising for a failure, never printing a traceback); ``None`` if ``args`` holds no such command."""
    command: Command | None = getattr(args, "spool_reporter_command", None)
    if command is None:
        return None
    ctx = Context(
        app=args.spool_reporter_app, env=os.environ if environ is None else environ, prog=args.spool_reporter_prog
    )
    problem = command.check(args) if command.check is not None else None
    if problem:
        try:
            args.spool_reporter_parser.error(problem)  # usage, "prog: error: ..." and status 2, as argparse does
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return execute(command, args, ctx)


def execute(command: Command, args: argparse.Namespace, ctx: Context) -> int:
    """Run ``command`` for ``ctx`` and return its exit status: failures are one line on stderr (status 1), a
    closed output pipe is silent (status 141). The argparse and the Click front ends both end here."""
    try:
        return _run_guarded(lambda: command.run(args, ctx), ctx.prog)
    except BrokenPipeError:
        return _pipe_closed()


def _run_guarded(run: Callable[[], int], prog: str) -> int:
    try:
        status = int(run())
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        raise
    except CommandError as exc:
        _err(prog, str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _err(prog, "interrupted")
        return 130
    except OSError as exc:
        # The spool or config folders are unusable (read-only, missing, hostile): say so, never a traceback.
        _err(prog, f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_FAILED


def build_parser(app: App | None = None) -> argparse.ArgumentParser:
    """The whole command line for ``app`` (default: ``django-spool`` for Django, with the collector's
    commands); its program name is ``app.cli_name``. The docs' CLI reference is generated from it."""
    the_app = app or django_app()
    words = _words(the_app, the_app.cli_name)
    parser = _Parser(
        prog=the_app.cli_name,
        description=DESCRIPTION.format(**words),
        epilog=EPILOG.format(**words),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (spool_reporter) {__version__}")
    sub = add_commands(parser, the_app)
    if app is None:
        try:
            from .collector import _cli as collector_cli
        except ImportError:  # pragma: no cover - the collector is part of the package
            pass
        else:
            collector_cli.register(cast("argparse._SubParsersAction[argparse.ArgumentParser]", sub))
    return parser


def _pipe_closed() -> int:
    """The Python docs' SIGPIPE recipe: the reader is gone, so say nothing more; point stdout at the null
    device so that the interpreter's final flush does not fail again at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_PIPE


def main(argv: Sequence[str] | None = None, *, app: App | None = None) -> int:
    """Run the command line for ``app`` (default: ``django-spool``) on ``argv`` (default: ``sys.argv[1:]``) and
    return its exit status; it never raises for a failure nor calls :func:`sys.exit`."""
    try:
        parser = build_parser(app)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version and usage errors: argparse has printed; its status
            sys.stdout.flush()
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        status = run_command(args)
        if status is not None:
            return status
        prog = parser.prog
        return _run_guarded(lambda: int(args.func(args)), prog)  # the collector's commands
    except BrokenPipeError:
        return _pipe_closed()


if __name__ == "__main__":
    sys.exit(main())
