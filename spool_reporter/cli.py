"""``django-spool``: see, control and flush what spool_reporter records.

Results go to stdout, problems to stderr. Exit codes: 0 success, 1 failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TextIO

from . import _consent, _event, _hook, _spool
from ._app import App, django_app
from ._version import __version__

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2

LOCK_TIMEOUT: Final = 10.0
"""Seconds ``disable``/``purge`` wait for the spool lock (a flusher holds it for a rename at a time)."""

PROGRESS_MIN_EVENTS: Final = 1000
"""``flush`` shows progress on a terminal when at least this many events are queued."""

DESCRIPTION: Final = """\
See and control Django usage reporting (DEP 8), implemented by spool_reporter.

When reporting is on, `django-admin startproject`, `startapp` and `runserver` each queue one
anonymous event on this machine (the command name, Django/Python/OS versions, a random id);
a background process sends queued events later. Nothing is ever sent while reporting is off.
"""

EPILOG: Final = """\
exit status: 0 success, 1 failure, 2 usage error.
environment: DJANGO_NO_ANALYTICS=1 or DO_NOT_TRACK=1 turn reporting off;
DJANGO_ANALYTICS_DEBUG=1 prints events instead of queueing them.
docs: https://spool-reporter.readthedocs.io/
"""


class CommandError(Exception):
    """A failure to report on stderr with exit status 1."""


# --- helpers -------------------------------------------------------------------------------------------


def _out(text: str = "", *, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"django-spool: {text}\n")


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else _event.iso_time(epoch)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@contextlib.contextmanager
def _locked(app: App, env: Mapping[str, str]) -> Iterator[_spool.Folder | None]:
    """The spool folder under the spool lock (``filelock``: the same flock as the hook), or ``None``."""
    import filelock

    path = _hook.state_dir(app, env)
    try:
        folder = _spool.Folder(path, create=False)
    except FileNotFoundError:
        yield None
        return
    except OSError as exc:
        raise CommandError(f"the spool folder {path} is not safe to use: {exc}") from exc
    with folder:
        lock = filelock.FileLock(os.path.join(path, _spool.LOCK_NAME), mode=0o600)
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
    """Queued count, oldest event time and drop counters, read without writing anything."""
    path = _hook.state_dir(app, env)
    summary: dict[str, Any] = {"spool": path, "queued": 0, "oldest": None, "dropped": 0, "dropped_by_reason": {}}
    try:
        folder = _spool.Folder(path, create=False)
    except FileNotFoundError:
        return summary
    except OSError as exc:
        summary["problem"] = str(exc)
        return summary
    with folder:
        summary["queued"] = _spool.count_queued(folder)
        counters = _spool.read_counters(folder)
        summary["dropped_by_reason"] = counters
        summary["dropped"] = sum(counters.values())
        names = [name for name, _, _ in folder.segments()] + [_spool.ACTIVE_NAME]
        for name in names:
            try:
                data = folder.read_bytes(name, _spool.HUGE_ACTIVE_BYTES)
            except OSError:
                continue
            events, _ = _spool.parse_lines(data or b"")
            if events:
                summary["oldest"] = events[0]["time"]
                break
    return summary


def _flush_module() -> Any:
    from . import _flush

    return _flush


# --- commands ------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    from . import _settings

    decision = _consent.current(app, env)
    resolved = _settings.resolve(app, env)
    dest = resolved.destination
    spool = _spool_summary(app, env)
    state = _flush_module().read_state(app, environ=env)
    data: dict[str, Any] = {
        "enabled": decision.enabled,
        "reason": decision.reason,
        "reason_text": _consent.explain(decision.reason),
        "mode": decision.mode,
        "endpoint": None if dest is None else dest.redacted_url(),
        "transport": None if dest is None else dest.transport,
        "destination_text": resolved.reason,
        "config_file": _consent.user_config_path(app, env),
        "policy_file": _consent.policy_path(app, env),
        **spool,
        "last_flush": _iso(state.last_flush),
        "last_result": state.last_result,
        "next_retry": _iso(state.next_retry),
        "consecutive_failures": state.consecutive_failures,
    }
    if args.json:
        _out(json.dumps(data, indent=2, sort_keys=True))
        return EXIT_OK
    now = time.time()
    _out(f"reporting:     {'on' if decision.enabled else 'off'} - {data['reason_text']} [{decision.reason}]")
    _out(f"mode:          {decision.mode}")
    _out(f"destination:   {resolved.reason}")
    _out(f"config file:   {data['config_file']}")
    _out(f"policy file:   {data['policy_file']}")
    _out(f"spool:         {spool['spool']}")
    oldest = ""
    if spool["oldest"]:
        with contextlib.suppress(ValueError):
            oldest_epoch = time.mktime(time.strptime(spool["oldest"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            oldest = f", oldest {_age(now - oldest_epoch)} old ({spool['oldest']})"
    _out(f"queued:        {spool['queued']} event{'s' if spool['queued'] != 1 else ''}{oldest}")
    breakdown = ", ".join(f"{k} {v}" for k, v in sorted(spool["dropped_by_reason"].items()))
    _out(f"dropped:       {spool['dropped']}" + (f" ({breakdown})" if breakdown else ""))
    last = "never" if state.last_flush is None else f"{data['last_flush']} ({state.last_result})"
    _out(f"last flush:    {last}")
    if state.next_retry is not None and state.next_retry > now:
        _out(f"next retry:    not before {data['next_retry']} (in {_age(state.next_retry - now)})")
    else:
        _out("next retry:    any time")
    if "problem" in spool:
        _err(f"the spool folder is not usable: {spool['problem']}")
        return EXIT_FAILED
    return EXIT_OK


def cmd_enable(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    from ._userconf import ConfigError, update

    try:
        path = update(app, {"disable": "0"}, env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    decision = _consent.current(app, env)
    _out(f"Wrote disable=0 to {path}.")
    if decision.enabled:
        _out("Reporting is on. See what would be sent with: django-spool flush --dry-run")
        return EXIT_OK
    _out(f"Reporting stays off: {_consent.explain(decision.reason)} [{decision.reason}].")
    return EXIT_FAILED


def cmd_disable(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    from ._userconf import ConfigError, update

    status = EXIT_OK
    try:
        path = update(app, {"disable": "1"}, env)
        _out(f"Wrote disable=1 to {path}. Reporting is off.")
    except ConfigError as exc:
        # Reporting is already off when the file cannot be read safely; still delete what is queued.
        _err(str(exc))
        status = EXIT_FAILED
    deleted = _purge(app, env)
    _out(f"Deleted {deleted} queued event{'s' if deleted != 1 else ''}.")
    return status


def cmd_purge(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    deleted = _purge(app, env)
    _out(f"Deleted {deleted} queued event{'s' if deleted != 1 else ''}.")
    return EXIT_OK


def cmd_reset_id(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    from ._userconf import ConfigError, update

    new = _event.uuid4()
    try:
        path = update(app, {"client_id": new}, env)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    _out(f"New client id {new} written to {path}.")
    _out("Events already queued keep the id they were recorded with.")
    return EXIT_OK


def _progress_printer(stream: TextIO) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        stream.write(f"\rsent {done}/{total} events")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show


def cmd_flush(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    flush = _flush_module()
    if args.dry_run:
        return _dry_run(args, app, env)
    if args.json:
        raise CommandError("--json goes with --dry-run (flush itself prints a one-line summary)")
    progress = None
    if sys.stderr.isatty() and _spool_summary(app, env)["queued"] >= PROGRESS_MIN_EVENTS:
        progress = _progress_printer(sys.stderr)
    result = flush.run(app, foreground=True, environ=env, ignore_backoff=True, progress=progress)
    _out(
        f"{result.outcome}: sent {result.sent}, rejected {result.rejected}, failed {result.failed}, "
        f"still queued {result.remaining}" + (f", deleted {result.purged}" if result.purged else "")
    )
    if result.message:
        (sys.stdout if result.outcome in ("delivered", "nothing", "disabled") else sys.stderr).write(
            result.message + "\n"
        )
    return EXIT_OK if result.outcome in ("delivered", "nothing", "disabled") else EXIT_FAILED


def _body_for_display(headers: Mapping[str, str], body: bytes) -> Any:
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type", "")
    if "json" in ctype:
        with contextlib.suppress(ValueError):
            return json.loads(body)
    return body.decode("utf-8", "replace")


def _dry_run(args: argparse.Namespace, app: App, env: Mapping[str, str]) -> int:
    plan = _flush_module().plan(app, environ=env)
    requests = [
        {
            "method": r.method,
            "url": r.url_redacted,
            "headers": dict(r.headers),
            "body": _body_for_display(r.headers, r.body),
        }
        for r in plan.requests
    ]
    if args.json:
        doc = {"events": plan.events, "requests": requests, "reason": plan.reason}
        _out(json.dumps(doc, indent=2))
        return EXIT_OK
    _out(f"{len(plan.events)} queued event{'s' if len(plan.events) != 1 else ''}; nothing is sent by --dry-run.")
    if plan.reason:
        _out(f"No requests: {plan.reason}")
    for i, (req, shown) in enumerate(zip(plan.requests, requests, strict=True), 1):
        _out(f"\n--- request {i} of {len(requests)}: {len(req.body)} bytes")
        _out(f"{req.method} {req.url_redacted}")
        for k, v in req.headers.items():
            _out(f"{k}: {v}")
        _out()
        body = shown["body"]
        _out(json.dumps(body, indent=2) if not isinstance(body, str) else body)
    return EXIT_OK


# --- the parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; the docs' CLI reference is generated from it."""
    parser = argparse.ArgumentParser(
        prog="django-spool",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (spool_reporter) {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True

    def add(name: str, func: Callable[..., int], help_: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_,
            description=description,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    p = add(
        "status",
        cmd_status,
        "show whether reporting is on, why, and what is queued",
        "Show whether reporting is on and which rule decided it, the mode (opt-out or opt-in), the\n"
        "destination (secrets redacted), where the spool is, how many events are queued and how old\n"
        "the oldest is, how many were dropped, the last flush and when the next retry may happen.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    add(
        "enable",
        cmd_enable,
        "turn reporting on (your explicit yes)",
        "Write disable=0 to your config file: your explicit yes. It also turns reporting on in\n"
        "opt-in mode and in CI. DJANGO_NO_ANALYTICS, DO_NOT_TRACK and a system policy that\n"
        "disables reporting still win. Exit status 1 if reporting stays off.",
    )
    add(
        "disable",
        cmd_disable,
        "turn reporting off and delete everything queued",
        "Write disable=1 to your config file (other settings and the client id are kept) and\n"
        "delete every queued event, saying how many.",
    )
    p = add(
        "flush",
        cmd_flush,
        "send queued events now, or show what would be sent",
        "Send queued events now, in the foreground, ignoring the back-off, and print a summary.\n"
        "Exit status 0 when nothing is left to send (all delivered, nothing queued, or reporting\n"
        "off - which deletes the queue), 1 when something could not be sent.\n\n"
        "With --dry-run, print exactly the requests a flush would make now, batch by batch\n"
        "(method, URL with secrets redacted, headers, body); send nothing and change nothing.",
    )
    p.add_argument("--dry-run", action="store_true", help="print the requests; send and change nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: one JSON object {events, requests, reason}")
    add("purge", cmd_purge, "delete every queued event", "Delete every queued event and say how many.")
    add(
        "reset-id",
        cmd_reset_id,
        "start over with a new random client id",
        "Replace the random client id (a uuid4 in your config file) with a new one.",
    )
    try:
        from .collector import _cli as collector_cli
    except ImportError:  # pragma: no cover - the collector is part of the package
        pass
    else:
        collector_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, app: App | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    the_app = app or django_app()
    func = args.func
    try:
        if func in (cmd_status, cmd_enable, cmd_disable, cmd_flush, cmd_purge, cmd_reset_id):
            return int(func(args, the_app, os.environ))
        return int(func(args))
    except CommandError as exc:
        _err(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except OSError as exc:
        # The spool or config folders are unusable (read-only, missing, hostile): say so, never a traceback.
        _err(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_FAILED
    except BrokenPipeError:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
