"""``django-spool collector serve|stats|migrate|rollup``: the collector's commands, their parsers and help (what
each command does once parsed is :mod:`._commands`).

:func:`register` adds them to the main command line (``spool_reporter/cli.py``); ``python -m
spool_reporter.collector`` runs them on their own. Either way they read like the client's commands, from the
same pieces (``spool_reporter/_cli_common.py``): the ``--help`` footer, "commands:", and errors that start with
the command the user typed (``django-spool collector stats: ...``). Exit codes: 0 success, 1 failure (a
database that cannot be opened or read, a port already in use), 2 usage errors (argparse's convention, and a
value the command refuses), 141 when the reader of the output went away.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from spool_reporter._cli_common import EXIT_STATUS, Parser, docs_page, run_guarded, run_program

# The collector's defaults only (standard library): the rest of the collector, the commands' bodies
# (``_commands``) first, is imported when a command runs, so that building the parser (every django-spool command
# does) stays cheap.
from ._common import DEFAULT_APP, DEFAULT_MAX_AGE_DAYS, EPSILON, LICENCE, MIN_COUNT, VARIABLES, Limits, Retention

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final

DEFAULT_PORT: Final = 8765
"""The embedded server's default port: not Django's 8000, not a well-known service."""

DB_HELP: Final = f"the SQLite file, or a postgresql:// URL (default: ${VARIABLES.db})"

PROG: Final = "python -m spool_reporter.collector"
"""The program :func:`main` runs as; under ``django-spool`` it is ``django-spool collector``."""

EPILOG: Final = f"""\
{EXIT_STATUS}
environment: {VARIABLES.db} stands for --db;
{VARIABLES.ga4_api_secret} is serve --forward-ga4's API secret.
docs: {docs_page("collector")}
"""
"""The footer of every collector command's ``--help``: the exit statuses as the client's footer states them (the
same line), the variables the commands read (``_common.VARIABLES``), and the collector's docs page."""


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
    _serve_options(_command(commands, "serve", **_TEXTS["serve"]))
    _stats_options(_command(commands, "stats", **_TEXTS["stats"]))
    _migrate_options(_command(commands, "migrate", **_TEXTS["migrate"]))
    _rollup_options(_command(commands, "rollup", **_TEXTS["rollup"]))


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
        help=f"also forward new events to this GA4 stream; the API secret is read from ${VARIABLES.ga4_api_secret}",
    )
    serve.add_argument("--ga4-endpoint", default=None, help=argparse.SUPPRESS)  # tests: a loopback fake
    serve.add_argument(
        "--retired",
        action="store_true",
        help="retire this collector: answer every batch (POST /v1/batch, POST /mp/collect) 410 Gone, so that "
        "each client that receives it stops reporting here for good and deletes its queue; POST /v1/forget and "
        f"the public numbers keep working (the WSGI application: {VARIABLES.retired}=1)",
    )
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
    *,
    db: str,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """Add command ``name``, run by its body (``_commands.BODIES[name]``), with its ``--db`` option (``db`` says
    what the database is for).

    ``args.collector_prog`` is the command the user typed (``django-spool collector stats``): the start of every
    error line. ``args.func`` runs the body as the client's commands run: an unusable file, an unexpected
    :exc:`~spool_reporter.collector.CollectorError` or ``Ctrl-C`` is one line and a status, never a traceback."""
    parser = commands.add_parser(name, help=help, description=description, epilog=EPILOG, formatter_class=_Formatter)
    _add_db(parser, db)
    parser.set_defaults(func=_guarded(name), collector_prog=parser.prog)
    return parser


def _guarded(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from ._common import CollectorError

        return run_guarded(lambda: _body(name)(args), args.collector_prog, failures=(CollectorError,))

    return run


def _body(name: str) -> Callable[[argparse.Namespace], int]:
    """Command ``name``'s body, its module imported only now that it runs."""
    from ._commands import BODIES

    return BODIES[name]


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
