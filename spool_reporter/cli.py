"""The management commands: ``django-spool``, and the same commands for any :class:`~spool_reporter.App`.

Results go to stdout, problems to stderr. Exit codes: 0 success, 1 failure, 2 usage error, 141 when the
reader of the output went away (``django-spool status | head -1``), as for a command ended by SIGPIPE.

**Public** (docs/cli-embedding.md): :func:`main` (a whole program for an App), :func:`add_commands` and
:func:`run_command` (the commands as subcommands of any argparse program), :class:`Command` and
:data:`COMMANDS` (the one table that argparse and the optional Click group, :mod:`spool_reporter.click_group`, are
both built from: one more command is one more row and its function). Everything else here is private.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from ._cli_common import EXIT_STATUS, EXIT_USAGE, pipe_closed, run_guarded, run_program
from ._cli_common import Parser as _Parser
from ._commands import (
    CommandError,
    Context,
    check_enable_args,
    cmd_disable,
    cmd_enable,
    cmd_forget,
    cmd_purge,
    cmd_reset_id,
    cmd_status,
)
from ._commands_flush import check_flush_args, cmd_flush, cmd_sent
from ._hook import App, django_app
from ._version import __version__

__all__ = ["COMMANDS", "Command", "Context", "Option", "add_commands", "build_parser", "main", "run_command"]

DESCRIPTION: Final = """\
See and control {name} usage reporting{dep8}, implemented by spool_reporter.

When reporting is on, {what} each queue one
anonymous event on this machine (the command name, {name}/Python/OS versions, a random id);
a background process sends queued events later, except in local mode. Nothing is ever sent
while reporting is off.
"""

EPILOG: Final = (
    EXIT_STATUS
    + """
environment: {env_disable}=1 or DO_NOT_TRACK=1 turn reporting off;
{env_debug}=1 prints events instead of queueing them.
docs: {docs_url}
"""
)
"""The footer of every ``--help``; its first line is :data:`~spool_reporter._cli_common.EXIT_STATUS`, as for the
collector's commands."""


@dataclass(frozen=True)
class Option:
    """An option of a command: an on/off flag, or, with a :attr:`metavar`, an option that takes a value."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    """``None``: an on/off flag (``False`` unless given). A name (``"URL"``): the option takes one value, shown
    under that name in ``--help``; its attribute is the string given, or ``None`` when the option is absent."""


@dataclass(frozen=True)
class Command:
    """One management command: the same row builds the argparse subcommand and the Click command."""

    name: str
    run: Callable[[argparse.Namespace, Context], int]
    """Runs it with the parsed flags (attribute names as argparse derives them: ``dry_run``); the exit status."""
    help: str
    options: tuple[Option, ...] = ()
    check: Callable[[argparse.Namespace], str | None] | None = None
    """A usage error in the flags (exit status 2), or ``None``."""
    description: str = ""
    """Its ``--help`` text; the words of :func:`help_words` (``{prog}``, ``{name}``, ``{env_disable}``,
    ``{env_debug}``...) are filled in by :func:`fill_words`, and any other brace is shown as written. Empty: the
    docstring of :attr:`run` (the built-in commands describe themselves there, beside their code)."""

    def help_text(self) -> str:
        """The ``--help`` text, before its ``{...}`` words are filled in."""
        return self.description or inspect.cleandoc(self.run.__doc__ or "")


# --- the table ----------------------------------------------------------------------------------------

COMMANDS: Final[tuple[Command, ...]] = (
    Command(
        name="status",
        run=cmd_status,
        help="show whether reporting is on, why, and what is queued",
        options=(Option(("--json",), "print one JSON object (for scripts)"),),
    ),
    Command(
        name="enable",
        run=cmd_enable,
        help="turn reporting on (your explicit yes), or keep events local",
        options=(
            Option(("--local",), "record events on this machine only; never send them"),
            Option(
                ("--endpoint",),
                "also write endpoint=URL to your config file: where events go (https://, or http:// to this machine)",
                metavar="URL",
            ),
        ),
        check=check_enable_args,
    ),
    Command(
        name="disable",
        run=cmd_disable,
        help="turn reporting off, delete everything queued, and ask the collector to forget your client id",
        options=(
            Option(
                ("--keep-remote",),
                "do not ask the collector to forget your client id (what it received stays; the id is kept)",
            ),
        ),
    ),
    Command(
        name="flush",
        run=cmd_flush,
        help="send queued events now, or show what would be sent",
        options=(
            Option(("--dry-run",), "print the requests; send and change nothing"),
            Option(("--json",), "with --dry-run: one JSON object {events, requests, reason, local}"),
        ),
        check=check_flush_args,
    ),
    Command(
        name="sent",
        run=cmd_sent,
        help="show the requests that were sent, with their answers",
        options=(Option(("--json",), 'print one JSON object {"requests": [...], "damaged": n}'),),
    ),
    Command(
        name="purge",
        run=cmd_purge,
        help="delete every queued event",
    ),
    Command(
        name="reset-id",
        run=cmd_reset_id,
        help="start over with a new random client id",
    ),
    Command(
        name="forget",
        run=cmd_forget,
        help="ask the collector to delete your events, then start over with a new client id",
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


def fill_words(text: str, words: Mapping[str, str]) -> str:
    """``text`` with each ``{word}`` of ``words`` (:func:`help_words`) filled in; any other brace stays as it is,
    so that a help text may show JSON (``{"requests": [...]}``) as it is written."""
    return re.sub(r"\{(\w+)\}", lambda m: words.get(m.group(1), m.group(0)), text)


def help_words(app: App, prog: str) -> dict[str, str]:
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
    words = help_words(app, prog)
    epilog = fill_words(EPILOG, words)
    sub = parser.add_subparsers(dest="spool_reporter_subcommand", metavar="COMMAND", title="commands")
    sub.required = True
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=fill_words(command.help_text(), words),
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for option in command.options:
            if option.metavar is None:
                p.add_argument(*option.flags, action="store_true", help=option.help)
            else:
                p.add_argument(*option.flags, metavar=option.metavar, default=None, help=option.help)
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
        return run_guarded(lambda: command.run(args, ctx), ctx.prog, failures=(CommandError,))
    except BrokenPipeError:
        return pipe_closed()


def build_parser(app: App | None = None) -> argparse.ArgumentParser:
    """The whole command line for ``app`` (default: ``django-spool`` for Django, with the collector's
    commands); its program name is ``app.cli_name``. The docs' CLI reference is generated from it."""
    the_app = app or django_app()
    words = help_words(the_app, the_app.cli_name)
    parser = _Parser(
        prog=the_app.cli_name,
        description=fill_words(DESCRIPTION, words),
        epilog=fill_words(EPILOG, words),
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


def main(argv: Sequence[str] | None = None, *, app: App | None = None) -> int:
    """Run the command line for ``app`` (default: ``django-spool``) on ``argv`` (default: ``sys.argv[1:]``) and
    return its exit status; it never raises for a failure nor calls :func:`sys.exit`."""

    def run(args: argparse.Namespace) -> int:
        status = run_command(args)
        if status is not None:
            return status
        return int(args.func(args))  # the collector's commands, which report their own failures

    return run_program(lambda: build_parser(app), argv, run)


if __name__ == "__main__":
    sys.exit(main())
