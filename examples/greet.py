"""greet: a tiny command line that reports its own commands with spool_reporter.

The worked example of docs/cli-embedding.md ("Use it in your own command-line tool"). It has one command of
its own, ``hello``, records one event per run of it (the command's name, never its argument), and mounts the
management commands under ``greet analytics``::

    python examples/greet.py hello World        # Hello, World!  (the first run prints the notice on stderr)
    python examples/greet.py analytics status   # on or off, why, where events go, what is queued
    python examples/greet.py analytics flush --dry-run
    python examples/greet.py analytics disable  # or GREET_NO_ANALYTICS=1, or DO_NOT_TRACK=1

Its default destination is the self-hosted collector on this machine (``django-spool collector serve --db
greet.sqlite3 --commands Greet=hello`` listens on 127.0.0.1:8765), so trying it sends nothing anywhere else; a
user, the environment (``GREET_ANALYTICS_ENDPOINT``) or a distributor's policy can point it elsewhere or turn it
off.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spool_reporter import App, record
from spool_reporter.cli import add_commands, run_command

GREET = App(
    name="Greet",
    version="1.0",
    cli_name="greet analytics",  # where the management commands are mounted: the notice names them
    endpoint="http://127.0.0.1:8765/v1/batch",  # the tool's own collector; here, the local one
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="greet", description="Greet someone, and report that you did.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    hello = commands.add_parser("hello", help="greet someone")
    hello.add_argument("name", help="who to greet (never recorded)")
    analytics = commands.add_parser("analytics", help="see and control usage reporting")
    add_commands(analytics, GREET)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status = run_command(args)  # greet analytics ...: the management commands
    if status is not None:
        return status
    # One event per command, named after it; record() takes microseconds, never raises and never waits.
    record(args.command, app=GREET, notice=True)
    print(f"Hello, {args.name}!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
