"""What spool_reporter's command lines share: ``django-spool`` (:mod:`spool_reporter.cli`) and the collector's
commands (:mod:`spool_reporter.collector._cli`, also run as ``python -m spool_reporter.collector``).

The parser class, the exit statuses and the footer line that states them, the one-line error, and how a run
ends. It imports the standard library only, so that the collector's command line reads like the client's
without importing the client's modules (the hook among them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Final

    from _typeshed import SupportsWrite

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
"""argparse's status for a usage error."""
EXIT_INTERRUPTED: Final = 128 + 2
"""128 + SIGINT, as a shell reports a command ended by ``Ctrl-C``."""
EXIT_PIPE: Final = 128 + 13
"""128 + SIGPIPE: what a shell reports for a command ended by a closed pipe (``yes | head -1``)."""

EXIT_STATUS: Final = "exit status: 0 success, 1 failure, 2 usage error (141: the output pipe closed early)."
"""The first line of every command's ``--help`` footer."""

DOCS_URL: Final = "https://spool-reporter.readthedocs.io/"
"""The project's documentation (``pyproject.toml``'s ``Documentation``, and :class:`~spool_reporter.App`'s
default ``docs_url``)."""


def docs_page(name: str) -> str:
    """The address of the docs page ``docs/{name}.md``, as Read the Docs serves the latest build."""
    return f"{DOCS_URL}en/latest/{name}.html"


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """argparse's subcommands, except that arguments a subcommand does not know are reported by that subcommand
    (``django-spool collector stats: error: unrecognized arguments: --bogus``, with its usage) instead of by the
    top-level program, which would name neither the subcommand nor its options."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        extras = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            chosen: argparse.ArgumentParser = self.choices[values[0]]
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")


class Parser(argparse.ArgumentParser):
    """argparse, except that a closed pipe under ``--help`` is reported like any other output (argparse ignores
    ``OSError`` there, so ``--help | head -1`` would exit 0 or 141 depending on buffering), and that a
    subcommand reports the arguments it does not know."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def print_error(prog: str, text: str) -> None:
    """One line on stderr that starts with the command the user typed: ``django-spool collector stats: ...``."""
    sys.stderr.write(f"{prog}: {text}\n")


def run_guarded(run: Callable[[], int], prog: str, *, failures: tuple[type[Exception], ...] = ()) -> int:
    """``run()``'s exit status, flushed to stdout; an exception of ``failures`` or an unusable file (``OSError``)
    is one line naming ``prog`` and status 1, ``Ctrl-C`` is "interrupted" and 130: never a traceback. A closed
    output pipe (:exc:`BrokenPipeError`) is raised for :func:`run_program` to end quietly."""
    try:
        status = int(run())
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        raise
    except failures as exc:
        print_error(prog, str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        print_error(prog, "interrupted")
        return EXIT_INTERRUPTED
    except OSError as exc:
        # A folder or file is unusable (read-only, missing, hostile): say so, never a traceback.
        print_error(prog, f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_FAILED


def run_program(
    build: Callable[[], argparse.ArgumentParser],
    argv: Sequence[str] | None,
    run: Callable[[argparse.Namespace], int],
) -> int:
    """Build a parser, parse ``argv`` (default: ``sys.argv[1:]``) and return ``run(args)``: ``--help``,
    ``--version`` and usage errors return argparse's status (it has printed), and a reader of the output that
    went away ends the program silently with status 141, whatever the command and the buffering."""
    try:
        parser = build()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            sys.stdout.flush()
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        return run(args)
    except BrokenPipeError:
        return pipe_closed()


def pipe_closed() -> int:
    """The Python docs' SIGPIPE recipe: the reader is gone, so say nothing more; point stdout at the null
    device so that the interpreter's final flush does not fail again at exit."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_PIPE
