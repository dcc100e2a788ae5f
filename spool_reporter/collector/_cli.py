"""``django-spool collector serve|stats|migrate|rollup``: the collector's commands.

:func:`register` adds them to the main command line (``spool_reporter/cli.py``); ``python -m
spool_reporter.collector`` runs them on their own. Either way they read like the client's commands, from the
same pieces (``spool_reporter/_cli_common.py``): the ``--help`` footer, "commands:", and errors that start with
the command the user typed (``django-spool collector stats: ...``). Exit codes: 0 success, 1 failure (a
database that cannot be opened or read, a port already in use), 2 usage errors (argparse's convention, and a
value the command refuses), 141 when the reader of the output went away.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import textwrap
from pathlib import Path

from spool_reporter._cli_common import EXIT_STATUS, EXIT_USAGE, Parser, docs_page, print_error, run_guarded, run_program
from spool_reporter._words import counted

# The collector's defaults only (standard library): the rest of the collector is imported when a command runs, so
# that building the parser (every django-spool command does) stays cheap.
from ._common import DEFAULT_APP, DEFAULT_MAX_AGE_DAYS, EPSILON, LICENCE, MIN_COUNT, Limits, Retention

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType, TracebackType
    from typing import Any, Final

    from ._common import Publishing
    from ._stats import Stats

DEFAULT_PORT: Final = 8765
"""The embedded server's default port: not Django's 8000, not a well-known service."""

API_SECRET_VARIABLE: Final = "SPOOL_REPORTER_GA4_API_SECRET"  # noqa: S105 - a variable name, not a secret
"""Where ``serve --forward-ga4`` reads the API secret: never on the command line, where ``ps`` shows it."""


DB_HELP: Final = "the SQLite file, or a postgresql:// URL (default: $SPOOL_REPORTER_COLLECTOR_DB)"

PROG: Final = "python -m spool_reporter.collector"
"""The program :func:`main` runs as; under ``django-spool`` it is ``django-spool collector``."""

EPILOG: Final = f"""\
{EXIT_STATUS}
environment: SPOOL_REPORTER_COLLECTOR_DB stands for --db;
{API_SECRET_VARIABLE} is serve --forward-ga4's API secret.
docs: {docs_page("collector")}
"""
"""The footer of every collector command's ``--help``: the exit statuses as the client's footer states them (the
same line), the variables the commands read (``_config.DB_VARIABLE``; ``_config`` is not imported to build a
parser), and the collector's docs page."""


STATS_JSON: Final = """\
--json prints one JSON document:
  "app": the application reported (--app)
  "developers": distinct client ids over all weeks (one who comes back after more than the retention counts \
again)
  "events": events over all weeks
  "weeks": one object per ISO week with events, oldest first: "week" (2026-W49), "developers", "events", \
"by_django", "by_python" and "by_os" (version or OS -> distinct client ids: a developer can count under \
several), and "by_event" (command -> events)
  "refused": week received -> reason -> events refused, of every application

With --public, --json prints the document GET /v1/stats serves:
  "app": the application (--app)
  "guarantee": the differential privacy guarantee, in words
  "epsilon", "min_count", "licence": the settings given (--epsilon, --min-count, --data-license)
  "made": when the newest release was made (null before the first)
  "first_week": the first ISO week released (2026-W41), set by the calendar or the operator, never by the \
data; null when none is set
  "downloads": the paths of every release as released, "json" and "csv"
  "weeks", "months", "quarters", "years": each period's newest release, oldest first: its name ("week", \
"month", "quarter" or "year"), "release" (provisional or final), "made", "first_day", "last_day", "epsilon" \
(what it spent), "margin" (the noise stays within +/-margin with 95 % probability) and "developers"; a week \
also has "week_epsilon" (what its releases spent together), "cell_threshold" (below it a breakdown's value is \
shown as fewer than it), and "by_django", "by_python", "by_os" (value -> number). A number is {"estimate", \
"low", "high"} (the estimate and its 95 % interval), with "fewer_than": N when the estimate is below N.
"""
"""The ``stats --json`` documents, key by key, for ``stats --help``. ``tests/collector/test_collector_cli.py``
checks that every key of real output is named here (``Stats.as_dict()`` in ``_stats.py``, ``document()`` in
``_public.py``)."""


class _Formatter(argparse.HelpFormatter):
    """argparse's help, except that a description or a footer is wrapped line by line: its lines and blank lines
    stay, a long line is wrapped to the terminal, and an indented line continues under itself, indented."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            body = line.lstrip()
            lead = indent + line[: len(line) - len(body)]
            hang = lead + ("  " if lead != indent else "")
            lines.append(textwrap.fill(body, width, initial_indent=lead, subsequent_indent=hang) if body else "")
        return "\n".join(lines)


def _add_db(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--db", metavar="DB", default=None, help=f"{what}: {DB_HELP}")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``collector`` command (with ``serve``, ``stats``, ``migrate`` and ``rollup``) to ``subparsers``;
    return its parser.

    Each leaf command sets ``func``: a callable taking the parsed arguments and returning the exit code.
    """
    parser = subparsers.add_parser(
        "collector",
        help="run the self-hosted collector, or print its weekly statistics",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    add_commands(_subcommands(parser))
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The ``COMMAND`` of ``parser``, listed under "commands:" as the client's are."""
    return parser.add_subparsers(dest="collector_command", metavar="COMMAND", title="commands", required=True)


DESCRIPTION: Final = (
    "The self-hosted collector: receives batches at POST /v1/batch (and GA4-shaped payloads at POST "
    "/mp/collect), judges each event on its own, stores no IP address, de-duplicates by event id, and counts "
    "distinct developers per week. Its database is a SQLite file or a PostgreSQL URL."
)


_TEXTS: Final[dict[str, dict[str, str]]] = {
    "serve": {
        "db": "where to store (created if missing)",
        "help": "receive batches at POST /v1/batch (embedded server, for a laptop or a demo)",
        "description": "Serve the collector with the embedded server until interrupted (SIGINT or SIGTERM): "
        "batches at POST /v1/batch, the public page at GET / and its JSON at GET /v1/stats. With --port 0 a "
        "free port is picked. The first line on stdout is 'listening on URL'. For production, run the WSGI "
        "application spool_reporter.collector.wsgi:application under gunicorn behind a TLS proxy (see the "
        "self-hosting docs).",
    },
    "stats": {
        "db": "the collector's database",
        "help": "distinct developers per ISO week, by Django, Python and OS version",
        "description": "Print distinct client ids per ISO week, broken down by application (Django) version, "
        "Python version and OS, from a collector database, and the events it refused.\n\n" + STATS_JSON,
    },
    "migrate": {
        "db": "the database (a SQLite file is created if missing)",
        "help": "create the collector's tables, or bring an older schema up to date",
        "description": "Create the collector's tables in the database, or migrate an older schema, and print the "
        "schema version. serve and the WSGI application do the same when they start; run this once before "
        "starting several of them, or to check a database.",
    },
    "rollup": {
        "db": "the collector's database",
        "help": "roll closed weeks up, make the public releases due, delete raw events past the retention",
        "description": "Close the weeks that can take no more events (they ended more than --max-age-days ago), "
        "store their numbers in the roll-up tables, which hold no client id, make the public releases that are "
        "due (a week's provisional numbers once it has ended, its final ones once it is closed; months, quarters "
        "and years once closed: each made once, with differential privacy, and printed), and delete the raw "
        "events older than --retain-days. serve and the WSGI application do the same in the background, at "
        "most once per --rollup-every; run this from cron instead when that is off. Give it the --max-age-days "
        "and --epsilon of the collectors. Safe to run at any time, and from several hosts at once: one works, "
        "the others say so.",
    },
}
"""Each command's ``--help`` texts: what its database is for (``db``), its line in the list (``help``), and
its description."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve``, ``stats``, ``migrate`` and ``rollup`` to ``commands``."""
    _serve_options(_command(commands, "serve", cmd_serve, **_TEXTS["serve"]))
    _stats_options(_command(commands, "stats", cmd_stats, **_TEXTS["stats"]))
    _migrate_options(_command(commands, "migrate", cmd_migrate, **_TEXTS["migrate"]))
    _rollup_options(_command(commands, "rollup", cmd_rollup, **_TEXTS["rollup"]))


def _add_number(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: float,
    metavar: str,
    help: str,
    kind: Callable[[str], float] = float,
) -> None:
    """An option that takes a number, its default stated at the end of its help."""
    parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=f"{help} (default: %(default)g)")


def _add_max_age(parser: argparse.ArgumentParser, what: str) -> None:
    _add_number(parser, "--max-age-days", default=DEFAULT_MAX_AGE_DAYS, metavar="DAYS", help=what)


def _add_epsilon(parser: argparse.ArgumentParser) -> None:
    _add_number(
        parser,
        "--epsilon",
        default=EPSILON,
        metavar="EPS",
        help="the privacy budget of the public releases, per developer: for each week (its provisional and "
        "final releases together), and for each month, quarter and year",
        kind=_epsilon,
    )


def _add_publishing(parser: argparse.ArgumentParser) -> None:
    _add_epsilon(parser)
    parser.add_argument(
        "--data-license",
        default=LICENCE,
        metavar="LICENCE",
        help="the licence the public numbers and their downloads state (default: %(default)s)",
    )


def _add_retain(parser: argparse.ArgumentParser) -> None:
    _add_number(
        parser,
        "--retain-days",
        default=Retention().retain_days,
        metavar="DAYS",
        help="delete raw events older than this once their week is rolled up; the roll-ups, which hold no "
        "client id, are kept",
    )


def _serve_options(serve: argparse.ArgumentParser) -> None:
    """``collector serve``: the embedded server and every setting of the collector it runs."""
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="port; 0 picks a free one (default: %(default)s)")
    _add_max_age(serve, "refuse events older than this; at most one day ahead is accepted")
    _add_retain(serve)
    _add_number(
        serve,
        "--rollup-every",
        default=Retention().rollup_every,
        metavar="SECONDS",
        help="start a roll-up in the background at most this often, when a batch arrives; 0: only with 'collector "
        "rollup'",
    )
    serve.add_argument(
        "--max-per-client-week",
        type=int,
        default=Limits().per_client_week,
        metavar="N",
        help="store at most N events per client id per ISO week, count the rest (default: %(default)s; 0: no cap)",
    )
    serve.add_argument(
        "--commands",
        action="append",
        default=[],
        metavar="APP=CMD,CMD",
        help="also accept this application with these event names, or * for any (repeat for more; Django's "
        "three commands are accepted by default, and replaced by a --commands Django=...)",
    )
    serve.add_argument(
        "--forward-ga4",
        metavar="MEASUREMENT_ID",
        help=f"also forward new events to this GA4 stream; the API secret is read from ${API_SECRET_VARIABLE}",
    )
    serve.add_argument("--ga4-endpoint", default=None, help=argparse.SUPPRESS)  # tests: a loopback fake
    serve.add_argument(
        "--min-count",
        type=_min_count,
        default=MIN_COUNT,
        metavar="N",
        help="the display threshold of the public numbers: a released count below N is shown as 'fewer than N' "
        "(default: %(default)s)",
    )
    _add_publishing(serve)


def _stats_options(stats: argparse.ArgumentParser) -> None:
    """``collector stats``: the operator's numbers, or with ``--public`` what was released."""
    stats.add_argument("--json", action="store_true", help="print one JSON document instead (described above)")
    stats.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write the page as one self-contained file: the operator's page with the full numbers, or with "
        "--public the page GET / serves",
    )
    stats.add_argument(
        "--public",
        action="store_true",
        help="show exactly what has been released publicly (GET /, GET /v1/stats and the downloads serve only "
        "these stored releases), instead of the exact numbers, which are for the operator only",
    )
    stats.add_argument(
        "--min-count",
        type=_min_count,
        default=MIN_COUNT,
        metavar="N",
        help="with --public: the display threshold, as serve's (default: %(default)s)",
    )
    _add_publishing(stats)  # with --public: the settings the page and the document state, as serve's
    stats.add_argument("--app", default=DEFAULT_APP, help="the application to report (default: %(default)s)")


def _migrate_options(migrate: argparse.ArgumentParser) -> None:
    """``collector migrate``: create or bring up to date the tables."""
    migrate.add_argument(
        "--first-week",
        type=_first_week,
        metavar="WEEK",
        help="the first ISO week (2026-W49) whose numbers are released publicly: by default the week the database "
        "was created; never chosen from the data, so that when publishing starts says nothing about anyone",
    )


def _rollup_options(rollup: argparse.ArgumentParser) -> None:
    """``collector rollup``: close weeks, make the releases due, apply the retention."""
    _add_max_age(rollup, "the collectors' maximum event age: weeks that ended longer ago are closed")
    _add_retain(rollup)
    _add_epsilon(rollup)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    func: Callable[[argparse.Namespace], int],
    *,
    db: str,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """Add command ``name``, run by ``func``, with its ``--db`` option (``db`` says what the database is for).

    ``args.collector_prog`` is the command the user typed (``django-spool collector stats``): the start of every
    error line. ``args.func`` runs ``func`` as the client's commands run: an unusable file, an unexpected
    :exc:`~spool_reporter.collector.CollectorError` or ``Ctrl-C`` is one line and a status, never a traceback."""
    parser = commands.add_parser(name, help=help, description=description, epilog=EPILOG, formatter_class=_Formatter)
    _add_db(parser, db)
    parser.set_defaults(func=_guarded(func), collector_prog=parser.prog)
    return parser


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from ._common import CollectorError

        return run_guarded(lambda: func(args), args.collector_prog, failures=(CollectorError,))

    return run


def _min_count(text: str) -> int:
    from ._common import parse_min_count

    try:
        return parse_min_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _epsilon(text: str) -> float:
    from ._common import parse_epsilon

    try:
        return parse_epsilon(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _first_week(text: str) -> str:
    from ._weeks import first_week_of

    try:
        return first_week_of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _publishing(args: argparse.Namespace) -> Publishing:
    from ._common import Publishing

    return Publishing(epsilon=args.epsilon, min_count=args.min_count, licence=args.data_license)


def _db(args: argparse.Namespace) -> str | None:
    """The ``--db`` value, or ``$SPOOL_REPORTER_COLLECTOR_DB``; ``None`` after printing why not."""
    from ._config import DB_VARIABLE

    db = args.db if args.db is not None else os.environ.get(DB_VARIABLE, "")
    if not db:
        print_error(args.collector_prog, f"give --db or set ${DB_VARIABLE}")
        return None
    return str(db)


def cmd_serve(args: argparse.Namespace) -> int:
    from spool_reporter._net import is_loopback

    from . import CollectorError, GA4Forwarder, serve
    from ._config import limits, policy, retention
    from ._forward import GA4_ENDPOINT

    if not 0 <= args.port <= 65535:
        print_error(args.collector_prog, f"port must be 0-65535, got {args.port}")
        return EXIT_USAGE
    db = _db(args)
    if db is None:
        return EXIT_USAGE
    forward = None
    try:
        accept = policy(max_age_days=args.max_age_days, commands=args.commands)
        keep = limits(per_client_week=args.max_per_client_week)
        retain = retention(retain_days=args.retain_days, rollup_every=args.rollup_every, max_age_days=args.max_age_days)
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return EXIT_USAGE
    try:
        if args.forward_ga4:
            secret = os.environ.get(API_SECRET_VARIABLE, "")
            if not secret:
                print_error(args.collector_prog, f"--forward-ga4 needs ${API_SECRET_VARIABLE}")
                return EXIT_USAGE
            forward = GA4Forwarder(
                measurement_id=args.forward_ga4, api_secret=secret, endpoint=args.ga4_endpoint or GA4_ENDPOINT
            )
        server = serve(
            db,
            host=args.host,
            port=args.port,
            forward=forward,
            policy=accept,
            limits=keep,
            publishing=_publishing(args),
            retention=retain,
        )
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return 1
    except OSError as exc:
        print_error(args.collector_prog, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    if not is_loopback(args.host):
        print_error(
            args.collector_prog,
            "the embedded server speaks plain HTTP and clients send to other machines over "
            "HTTPS only; put a TLS proxy in front of it (without access logs, which would record addresses).",
        )
    try:
        print(f"listening on {server.url}", flush=True)  # a closed pipe here still stops the server
        with _signals_stop(server.request_stop):
            server.serve_forever()
    except KeyboardInterrupt:  # before the handler was installed, or not the main thread
        pass
    finally:
        server.stop()
    counts = server.app.counters.as_dict()
    print(
        f"stopped after {counted(counts['requests'], 'request')}: {counted(counts['accepted'], 'event')} stored, "
        f"{counted(counts['duplicates'], 'duplicate')}, {counted(counts['rejected'], 'request')} refused, "
        f"{counted(counts['refused'], 'event')} refused",
        flush=True,
    )
    return 0


@contextlib.contextmanager
def _signals_stop(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` (which only sets a flag) while the block runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Failure:
    """A ``with`` block of a command whose :class:`~._common.CollectorError` (a database that cannot be opened, read
    or written) is the command's error line: printed, then :attr:`failed`, and the command exits 1. Entered as
    ``with failure, contextlib.closing(open_store(...)) as store:``, it also takes the error of the opening."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.failed = False

    def __enter__(self) -> _Failure:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        from ._common import CollectorError

        if not isinstance(exc, CollectorError):
            return False
        print_error(self.args.collector_prog, f"{exc}")
        self.failed = True
        return True


def cmd_migrate(args: argparse.Namespace) -> int:
    from . import open_store

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    failure = _Failure(args)
    with failure:
        before = _existing_version(db)
        with contextlib.closing(open_store(db, create=True)) as store:
            after = store.schema_version()
            where = store.display
            if args.first_week:
                store.set_first_week(args.first_week)
            first = store.first_week()
    if failure.failed:
        return 1
    if before == after:
        print(f"{where}: schema {after}, up to date")
    elif before is None:
        print(f"{where}: created, schema {after}")
    else:
        print(f"{where}: migrated from schema {before} to {after}")
    print(f"public releases start with week {first}")
    return 0


def cmd_rollup(args: argparse.Namespace) -> int:
    import time

    from . import CollectorError, open_store
    from ._common import Publishing
    from ._config import policy, retention
    from ._rollup import rollup

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    try:
        accept = policy(max_age_days=args.max_age_days)
        keep = retention(retain_days=args.retain_days, max_age_days=args.max_age_days)
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return EXIT_USAGE
    failure = _Failure(args)
    # create: the roll-up tables are schema 3, so an older database is migrated
    with failure, contextlib.closing(open_store(db, create=True)) as store:
        publishing = Publishing(epsilon=args.epsilon)
        done = rollup(store, now=time.time(), max_age=accept.max_age, retention=keep, publishing=publishing)
        where = store.display
    if failure.failed:
        return 1
    if not done.ran:
        print(f"{where}: another process is rolling up; nothing done here")
        return 0
    closed = done.closed_through or "none yet"
    rolled = f" ({done.rolled[0]} to {done.rolled[-1]})" if done.rolled else ""
    print(
        f"{where}: closed through {closed}; {counted(len(done.rolled), 'week')} rolled up{rolled}; "
        f"{counted(done.deleted, 'event')} older than {args.retain_days:g} days deleted"
    )
    if done.released:
        print(done.released_publicly())
    if done.release_error:
        print_error(args.collector_prog, f"no public release made: {done.release_error}")
        return 1
    return 0


def _existing_version(db: str) -> int | None:
    """The schema version of an existing database, or ``None`` if it has no collector tables yet."""
    from . import open_store
    from ._common import NotACollectorDatabase

    try:
        store = open_store(db, create=False)
    except NotACollectorDatabase:
        return None
    try:
        return store.schema_version() or 1
    finally:
        store.close()


def _public_text(doc: dict[str, Any]) -> str:
    """The released numbers as text: estimate ± margin per period, "<N" below the display threshold."""

    def show(number: dict[str, int]) -> str:
        if "fewer_than" in number:
            return f"<{number['fewer_than']}"
        return str(number["estimate"])

    lines = [
        f"{doc['app']}: released with differential privacy, epsilon {doc['epsilon']:g} per developer per period; "
        f"licence {doc['licence']}"
    ]
    for _unit, key in (("week", "weeks"), ("month", "months"), ("quarter", "quarters"), ("year", "years")):
        items = doc[key]
        if not items:
            continue
        lines.append(f"{key}:")
        for item in items:
            name = item[key[:-1]]
            line = f"  {name}  {item['release']:<11}  {show(item['developers'])} developers (±{item['margin']})"
            if key == "weeks":
                for breakdown in ("by_django", "by_python", "by_os"):
                    shown = [f"{v}: {show(n)}" for v, n in item[breakdown].items() if "fewer_than" not in n]
                    line += f"; {', '.join(shown) or '-'}"
            lines.append(line)
    if len(lines) == 1:
        lines.append("nothing released yet: a week is released once it has ended (see the self-hosting docs)")
    return "\n".join(lines)


def _text(stats: Stats, db: str) -> str:
    weeks = len(stats.weeks)
    head = (
        f"{stats.app}: {counted(stats.developers, 'developer')}, {counted(stats.events, 'event')}, "
        f"{counted(weeks, 'week')} with events ({db})"
    )
    lines = [head]
    if not stats.weeks:
        return lines[0]

    def fmt(counts: dict[str, int]) -> str:
        return ", ".join(f"{name}: {n}" for name, n in counts.items()) or "-"

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


def _write_page(args: argparse.Namespace, path: Path, text: str) -> bool:
    """Write ``stats --html``'s page; say why not (``False``) when it cannot be written."""
    try:
        _write_atomic(path, text)
    except OSError as exc:
        print_error(args.collector_prog, f"cannot write {path}: {exc}")
        return False
    return True


def cmd_stats(args: argparse.Namespace) -> int:
    from . import open_store, public, render_html, stats
    from ._report import render_public
    from ._stats import apps

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    if args.public:
        failure = _Failure(args)
        with failure:
            doc = public(db, publishing=_publishing(args)._replace(app=args.app))
        if failure.failed:
            return 1
        if args.html is not None and not _write_page(args, args.html, render_public(doc)):
            return 1
        print(json.dumps(doc, indent=2, ensure_ascii=False) if args.json else _public_text(doc))
        if args.html is not None and not args.json:
            print(f"page written to {args.html}")
        return 0
    failure = _Failure(args)
    with failure, contextlib.closing(open_store(db, create=False)) as store:
        full = stats(store, app=args.app)
        others = {} if full.events else {k: v for k, v in apps(store).items() if k != args.app}
        where = store.display
    if failure.failed:
        return 1
    result = full
    if args.html is not None and not _write_page(args, args.html, render_html(result)):
        return 1
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    else:
        print(_text(result, where))
        if others:
            names = ", ".join(f"{name} ({counted(n, 'event')})" for name, n in others.items())
            print(f"other applications in this database: {names}; choose one with --app")
        if full.refused:
            total = sum(sum(r.values()) for r in full.refused.values())
            print(f"refused: {counted(total, 'event')}")
            for week, reasons in full.refused.items():
                print(f"  {week}  " + ", ".join(f"{reason}: {n}" for reason, n in reasons.items()))
        if args.html is not None:
            print(f"report written to {args.html}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m spool_reporter.collector``: the same commands as ``django-spool
    collector``, with the same footer."""
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter)
    add_commands(_subcommands(parser))
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m spool_reporter.collector serve|stats|migrate|rollup ...``: the exit status, as
    ``django-spool collector ...`` would return it."""

    def run(args: argparse.Namespace) -> int:
        code: int = args.func(args)
        return code

    return run_program(build_parser, argv, run)
