"""The commands that send or show requests: ``flush`` (and ``--dry-run``) and ``sent``, each a function of the
parsed flags and a :class:`~._commands.Context`, as the other commands of :mod:`spool_reporter._commands` are.

Each command gathers first and renders after, as ``status`` does: ``flush`` runs the flusher into a
:class:`_Flushed` that :func:`_print_flush` prints; ``--dry-run`` plans into a :class:`_DryRun` that
:func:`_print_dry_run` prints, or ``--json`` dumps. ``flush --dry-run`` and ``sent`` read the spool folder
without changing anything; only ``flush`` imports the sender (and urllib3), when it sends.
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
from typing import TYPE_CHECKING, Any, Final, TextIO

from . import _consent, _counters, _files, _hook, _plan, _settings, _spool
from ._cli_common import EXIT_FAILED, EXIT_OK
from ._commands import CommandError, Context, check_readable, inputs, say, spool_summary
from ._words import counted, plural

if TYPE_CHECKING:
    from ._flush import FlushResult

__all__ = ["check_flush_args", "cmd_flush", "cmd_sent"]

PROGRESS_MIN_EVENTS: Final = 1000
"""``flush`` shows progress on a terminal when at least this many events are queued."""


# --- flush ---------------------------------------------------------------------------------------------


def cmd_flush(args: argparse.Namespace, ctx: Context) -> int:
    """Send queued events now, in the foreground, ignoring the back-off, and print a summary.
    Exit status 0 when nothing is left to send (all delivered, nothing queued, or reporting
    off - which deletes the queue), 1 when something could not be sent. In local mode nothing
    is sent (and the status is 0): it says so.

    With --dry-run, print exactly the requests a flush would make now, batch by batch
    (method, URL with secrets redacted, headers, body); send nothing and change nothing.
    In local mode, the requests that would leave once sending is on.
    """
    check_readable(ctx.app, ctx.env)
    if args.dry_run:
        dry_run = _gather_dry_run(ctx)
        if args.json:
            say(json.dumps(dry_run.data, indent=2))
        else:
            _print_dry_run(dry_run, ctx)
        return EXIT_OK
    flushed = _gather_flush(ctx)
    _print_flush(flushed, ctx)
    return EXIT_OK if flushed.ok else EXIT_FAILED


def check_flush_args(args: argparse.Namespace) -> str | None:
    return (
        "--json goes with --dry-run (flush itself prints a one-line summary)"
        if args.json and not args.dry_run
        else None
    )


@dataclass(frozen=True)
class _Flushed:
    """What ``flush`` did, gathered for :func:`_print_flush` (its one rendering: ``--json`` goes with
    ``--dry-run``)."""

    result: FlushResult | None
    """The flusher's run; ``None`` in local mode, where nothing runs and nothing is sent."""
    remaining: int
    """Events still queued: the run's count, or, when it sent nothing because reporting is off or the destination
    is invalid, the events counted after it."""
    staying: int
    """Events that stay on this machine: in local mode, every one (queued or recorded in local mode); after a run,
    those recorded in local mode."""
    destination: str | None = None
    """After a delivery: the destination's URL, secrets redacted (``None``: none to name)."""
    reason: str = ""
    """When reporting is off: why (:func:`._consent.explain`, read after the run)."""

    @property
    def ok(self) -> bool:
        """Whether nothing is left to send (exit status 0)."""
        outcome = "local" if self.result is None else self.result.outcome
        # "0 when nothing is left to send": delivered, nothing queued, or everything deleted because reporting is off
        # or the destination retired itself. "local": local mode was chosen while this flush sent; what stays
        # queued stays by that choice.
        return outcome in ("delivered", "nothing", "local") or (
            outcome in ("disabled", "invalid-endpoint", "retired") and not self.remaining
        )


def _progress_printer(stream: TextIO) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        stream.write(f"\rsent {done}/{total} events")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show


def _gather_flush(ctx: Context) -> _Flushed:
    """Run the flusher in the foreground, ignoring the back-off (progress on a terminal for a long queue), and
    read what its sentences need after it; in local mode, only count what stays. :class:`CommandError` when the
    spool folder cannot be used."""
    from ._local import count_local

    app, env = ctx.app, ctx.env
    _, _, decision = inputs(ctx)
    if decision.enabled and decision.local:
        summary = spool_summary(app, env)
        kept = (summary["queued"] or 0) + (summary["kept_local"] or 0)
        return _Flushed(result=None, remaining=summary["queued"] or 0, staying=kept)
    progress = None
    if sys.stderr.isatty() and (spool_summary(app, env)["queued"] or 0) >= PROGRESS_MIN_EVENTS:
        progress = _progress_printer(sys.stderr)
    from . import _flush  # the sender and urllib3: only when sending

    result = _flush.run(app, foreground=True, environ=env, ignore_backoff=True, progress=progress)
    if result.outcome == "unusable-folder":
        raise CommandError(result.message)  # nothing was read, so there are no counts to show
    remaining = result.remaining
    if result.outcome in ("disabled", "invalid-endpoint"):
        remaining = spool_summary(app, env)["queued"] or 0  # what is still there, counted here
    destination, reason = None, ""
    if result.outcome == "delivered":
        dest = _settings.resolve(app, env).destination
        destination = dest.redacted_url() if dest is not None else None
    elif result.outcome == "disabled":
        user, policy, decision = inputs(ctx)
        named = _hook.effective_endpoint(app, env, user, policy)
        reason = _consent.explain(decision.reason, environ=env, user=user, policy=policy, endpoint=named)
    return _Flushed(result, remaining, count_local(app, env), destination=destination, reason=reason)


def _print_flush(flushed: _Flushed, ctx: Context) -> None:
    result, remaining, kept = flushed.result, flushed.remaining, flushed.staying
    if result is None:
        say(
            f"local: nothing is sent in local mode; {counted(kept, 'event')} {plural(kept, 'stays', 'stay')} on this "
            "machine. "
            f"'{ctx.prog} enable' sends them, '{ctx.prog} flush --dry-run' shows what would leave."
        )
        return
    refused = f"refused {_counters.refused_text(result.refused)}, " if result.refused else ""
    say(
        f"{result.outcome}: sent {result.sent}, {refused}rejected {result.rejected}, failed {result.failed}, "
        f"still queued {remaining}" + (f", deleted {result.purged}" if result.purged else "")
    )
    message = _flush_message(flushed, result)
    if message:
        (sys.stdout if flushed.ok else sys.stderr).write(message + "\n")
    if kept:
        say(
            f"{counted(kept, 'event')} recorded in local mode {plural(kept, 'stays', 'stay')} on this machine; "
            f"'{ctx.prog} enable' sends them."
        )


def _flush_message(flushed: _Flushed, result: FlushResult) -> str:
    """The sentence after the summary line (stdout when :attr:`_Flushed.ok`, else stderr); empty: none."""
    from ._flush import sent_text  # loaded already: the run imported it

    remaining = flushed.remaining
    if result.outcome == "delivered":
        sentence = sent_text(result.sent, flushed.destination, rejected=result.rejected, refused=result.refused)
        return sentence[:1].upper() + sentence[1:] + "."
    if result.outcome == "disabled":
        message = f"Reporting is off: {flushed.reason}"
        if result.purged:
            message += f"; deleted {counted(result.purged, 'queued event')}"
        elif remaining:
            message += f"; {counted(remaining, 'queued event')} kept, not sent"
        return message + "."
    if result.outcome == "retired":
        return result.message[:1].upper() + result.message[1:] + "."  # "The destination <url> retired itself ..."
    if result.outcome == "invalid-endpoint":
        message = result.message[:1].upper() + result.message[1:]  # "The destination is invalid: <why>"
        if remaining:
            message += f"; {counted(remaining, 'queued event')} kept until it is fixed, not sent"
        return message + "."
    return result.message


# --- flush --dry-run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DryRun:
    """What ``flush --dry-run`` found, gathered once for its two renderings (text and ``--json``)."""

    data: dict[str, Any]
    """The ``--json`` document: the events, those kept in local mode, the requests, the reason, local mode."""
    plan: _plan.Plan
    local: bool
    """Local mode: the requests shown are those that would leave once sending is on (``enable``)."""
    shown: list[Any]
    """The requests shown (method, redacted URL, headers, body), as :attr:`data` lists them."""


def _gather_dry_run(ctx: Context) -> _DryRun:
    plan = _plan.plan(ctx.app, environ=ctx.env)
    _, _, decision = inputs(ctx)
    local = decision.enabled and decision.local
    shown = _local_requests(ctx, plan.events + plan.local_events) if local else plan.requests
    requests = [
        {
            "method": r.method,
            "url": r.url_redacted,
            "headers": dict(r.headers),
            "body": _body_for_display(r.headers, r.body),
        }
        for r in shown
    ]
    data = {
        "events": plan.events,
        "local_events": plan.local_events,
        "requests": requests,
        "reason": plan.reason,
        "local": local,
    }
    return _DryRun(data, plan, local, shown)


def _local_requests(ctx: Context, events: list[dict[str, object]]) -> list[Any]:
    """In local mode: the requests that would leave if sending were on (``enable``), for ``--dry-run``."""
    from .transports import transport_for

    dest = _settings.resolve(ctx.app, ctx.env, sending=False).destination
    if dest is None or not events:
        return []
    return [batch.request for batch in transport_for(dest).prepare(events, now=time.time()).batches]


def _print_dry_run(dry_run: _DryRun, ctx: Context) -> None:
    plan, local, requests = dry_run.plan, dry_run.local, dry_run.data["requests"]
    say(f"{counted(len(plan.events), 'queued event')}; nothing is sent by --dry-run.")
    if plan.local_events:
        say(
            f"{counted(len(plan.local_events), 'event')} recorded in local mode "
            f"{plural(len(plan.local_events), 'is', 'are')} kept on this machine"
            + (", shown below with the queue." if local else f"; only '{ctx.prog} enable' sends them.")
        )
    if local:
        say(f"Local mode: nothing leaves this machine. With sending on ('{ctx.prog} enable'), these would:")
    elif plan.reason:
        say(f"No requests: {plan.reason}")
    for i, (req, shown) in enumerate(zip(dry_run.shown, requests, strict=True), 1):
        say(f"\n--- request {i} of {len(requests)}: {len(req.body)} bytes")
        say(f"{req.method} {req.url_redacted}")
        for k, v in req.headers.items():
            say(f"{k}: {v}")
        say()
        body = shown["body"]
        say(json.dumps(body, indent=2) if not isinstance(body, str) else body)


def _body_for_display(headers: Mapping[str, str], body: bytes) -> Any:
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    if "json" in ctype:
        with contextlib.suppress(ValueError):
            return json.loads(body)
    return body.decode("utf-8", "replace")


# --- sent ----------------------------------------------------------------------------------------------


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
        say(json.dumps({"requests": list(record.requests), "damaged": record.damaged}, indent=2))
        return EXIT_OK
    damaged = f"; {counted(record.damaged, 'damaged line')} skipped" if record.damaged else ""
    if not record.requests:
        say(
            "Nothing sent is on record: nothing was sent yet, or the record was deleted "
            f"(by disable, purge or forget, or when reporting was turned off){damaged}."
        )
        return EXIT_OK
    events = sum(int(str(r["events"])) for r in record.requests)
    say(
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
        say(
            f"\n--- {request['time']} {request['method']} {request['destination']}: {answer}; "
            f"{counted(int(str(request['events'])), 'event')}, {len(body)} bytes"
        )
        shown = _body_for_display(headers, body)
        say(json.dumps(shown, indent=2) if not isinstance(shown, str) else shown)
        if request.get("answer"):
            say(f"answer: {request['answer']}")
    return EXIT_OK
