"""``django-spool collector serve|stats``: the collector's commands.

:func:`register` adds them to the main command line (``spool_reporter/cli.py``); ``python -m
spool_reporter.collector`` runs them on their own. Exit codes: 0 success, 1 failure (a database that
cannot be read, a port already in use), 2 usage errors (argparse's convention).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType
    from typing import Final

    from ._public import Published
    from ._stats import Stats

DEFAULT_PORT: Final = 8765
"""The embedded server's default port: not Django's 8000, not a well-known service."""

API_SECRET_VARIABLE: Final = "SPOOL_REPORTER_GA4_API_SECRET"  # noqa: S105 - a variable name, not a secret
"""Where ``serve --forward-ga4`` reads the API secret: never on the command line, where ``ps`` shows it."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``collector`` command (with ``serve`` and ``stats``) to ``subparsers``; return its parser.

    Each leaf command sets ``func``: a callable taking the parsed arguments and returning the exit code.
    """
    parser = subparsers.add_parser(
        "collector",
        help="run the self-hosted collector, or print its weekly statistics",
        description="The self-hosted collector: receives batches at POST /v1/batch (and GA4-shaped payloads at "
        "POST /mp/collect), stores no IP address, de-duplicates by event id, and counts distinct developers "
        "per week.",
    )
    commands = parser.add_subparsers(dest="collector_command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="receive batches at POST /v1/batch (embedded server, for a laptop or a demo)",
        description="Serve the collector with the embedded server until interrupted: batches at POST "
        "/v1/batch, the public page at GET / and its JSON at GET /v1/stats. With --port 0 a free "
        "port is picked. The first line on stdout is 'listening on URL'. For production, run the WSGI "
        "application under gunicorn or uWSGI behind a TLS proxy (see the self-hosting docs).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port; 0 picks a free one (default: %(default)s)")
    serve.add_argument("--db", required=True, type=Path, metavar="PATH", help="SQLite file (created if missing)")
    serve.add_argument(
        "--forward-ga4",
        metavar="MEASUREMENT_ID",
        help=f"also forward new events to this GA4 stream; the API secret is read from ${API_SECRET_VARIABLE}",
    )
    serve.add_argument("--ga4-endpoint", default=None, help=argparse.SUPPRESS)  # tests: a loopback fake
    serve.add_argument(
        "--min-count",
        type=_min_count,
        default=10,  # _public.MIN_COUNT, not imported here: it would load the store for every django-spool command
        metavar="N",
        help="the public page (GET /) and GET /v1/stats publish no number that counts fewer than N distinct "
        "developers; smaller groups are merged into 'other' or not shown (default: %(default)s)",
    )
    serve.set_defaults(func=cmd_serve)

    stats = commands.add_parser(
        "stats",
        help="distinct developers per ISO week, by Django, Python and OS version",
        description="Print distinct client ids per ISO week, broken down by application (Django) version, "
        "Python version and OS, from a collector database.",
    )
    stats.add_argument("--db", required=True, type=Path, metavar="PATH", help="the collector's SQLite file")
    stats.add_argument("--json", action="store_true", help='print {"weeks": [...]} as JSON')
    stats.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write the page that GET / serves, as one self-contained file: with the full numbers, "
        "unless --min-count is given",
    )
    stats.add_argument(
        "--min-count",
        type=_min_count,
        default=None,
        metavar="N",
        help="apply the public threshold to the text, --json and --html: show exactly what GET / and "
        "GET /v1/stats publish with --min-count N (default: the full numbers, for the operator only)",
    )
    stats.add_argument("--app", default="Django", help="the application to report (default: %(default)s)")
    stats.set_defaults(func=cmd_stats)
    return parser


def _min_count(text: str) -> int:
    from ._public import parse_min_count

    try:
        return parse_min_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Stop(Exception):
    """Raised by the SIGTERM handler to leave serve_forever()."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGTERM, _raise_stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_serve(args: argparse.Namespace) -> int:
    from . import CollectorError, GA4Forwarder, serve
    from ._forward import GA4_ENDPOINT
    from ._server import is_loopback

    if not 0 <= args.port <= 65535:
        print(f"collector serve: port must be 0-65535, got {args.port}", file=sys.stderr)
        return 2
    forward = None
    try:
        if args.forward_ga4:
            secret = os.environ.get(API_SECRET_VARIABLE, "")
            if not secret:
                print(f"collector serve: --forward-ga4 needs ${API_SECRET_VARIABLE}", file=sys.stderr)
                return 2
            forward = GA4Forwarder(
                measurement_id=args.forward_ga4, api_secret=secret, endpoint=args.ga4_endpoint or GA4_ENDPOINT
            )
        server = serve(args.db, host=args.host, port=args.port, forward=forward, min_count=args.min_count)
    except (CollectorError, OSError) as exc:
        print(f"collector serve: {exc}", file=sys.stderr)
        return 1
    if not is_loopback(args.host):
        print(
            "collector serve: the embedded server speaks plain HTTP and clients send to other machines over "
            "HTTPS only; put a TLS proxy in front of it (without access logs, which would record addresses).",
            file=sys.stderr,
        )
    print(f"listening on {server.url}", flush=True)
    try:
        with _sigterm_stops():
            server.serve_forever()
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        server.stop()
    counts = server.app.counters.as_dict()
    print(
        f"stopped after {counts['requests']} requests: {counts['accepted']} events stored, "
        f"{counts['duplicates']} duplicates, {counts['rejected']} requests refused",
        flush=True,
    )
    return 0


def _text(stats: Stats | Published, db: Path) -> str:
    weeks = len(stats.weeks)
    if stats.developers is None:  # the public numbers, which have no all-time count (rule 7 of _public.py)
        head = f"{stats.app}: {weeks} weeks published, no number under {stats.min_count} developers ({db})"
    else:
        head = f"{stats.app}: {stats.developers} developers, {stats.events} events, {weeks} weeks with events ({db})"
    lines = [head]
    if not stats.weeks:
        return lines[0]

    empty = "withheld" if stats.developers is None else "-"  # a published week's breakdown is empty if withheld

    def fmt(counts: dict[str, int]) -> str:
        return ", ".join(f"{name}: {n}" for name, n in counts.items()) or empty

    rows = [("week", "developers", "events", stats.app, "Python", "OS")]
    rows += [
        (w.week, str(w.developers), str(w.events), fmt(w.by_django), fmt(w.by_python), fmt(w.by_os))
        for w in stats.weeks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in (1, 2) else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    folder = path.parent if str(path.parent) else Path()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # a report is for sharing; mkstemp's 0600 would surprise a web server
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_stats(args: argparse.Namespace) -> int:
    from . import CollectorError, publish, render_html, stats
    from ._stats import apps

    try:
        full = stats(args.db, app=args.app)
        others = {} if full.events else {k: v for k, v in apps(args.db).items() if k != args.app}
    except CollectorError as exc:
        print(f"collector stats: {exc}", file=sys.stderr)
        return 1
    result = full if args.min_count is None else publish(full, min_count=args.min_count)
    if args.html is not None:
        try:
            _write_atomic(args.html, render_html(result))
        except OSError as exc:
            print(f"collector stats: cannot write {args.html}: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    else:
        print(_text(result, args.db))
        if others:
            names = ", ".join(f"{name} ({n} events)" for name, n in others.items())
            print(f"other applications in this database: {names}; choose one with --app")
        if args.html is not None:
            print(f"report written to {args.html}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m spool_reporter.collector serve|stats ...``."""
    parser = argparse.ArgumentParser(prog="python -m spool_reporter.collector", description=__doc__)
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    # Skip the "collector" word: `python -m spool_reporter.collector serve ...`.
    args = parser.parse_args(["collector", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.func(args)
    return code
