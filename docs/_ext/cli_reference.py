"""The CLI reference, generated from ``spool_reporter.cli.build_parser()`` at build time.

A page holds::

    ```{spool-generated} cli
    :module: spool_reporter.cli
    :function: build_parser
    :prog: django-spool
    ```

and gets, for the parser and every subparser (recursively, so ``collector serve`` is included), a heading
and the exact ``--help`` text argparse prints, at a fixed width of 88 columns and without colour. Nothing is
typed by hand, so the reference cannot drift from the parser.

* ``spool_reporter.cli`` missing, or without ``build_parser``: a note saying the CLI has not landed yet.
* the module exists but fails to import, or ``build_parser()`` raises: a warning (``-W`` fails the build).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging
from spool_generated import REPO, fenced, note, register, table

logger = logging.getLogger(__name__)

WIDTH = "88"


@contextmanager
def _help_environment(prog: str) -> Iterator[None]:
    """A fixed width, no colour, and ``sys.argv[0]`` as the console script sets it (argparse's ``prog``)."""
    saved_env = {k: os.environ.get(k) for k in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "PYTHON_COLORS")}
    saved_argv0 = sys.argv[0] if sys.argv else None
    os.environ.update({"COLUMNS": WIDTH, "LINES": "50", "NO_COLOR": "1", "PYTHON_COLORS": "0"})
    os.environ.pop("FORCE_COLOR", None)
    if sys.argv:
        sys.argv[0] = prog
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if saved_argv0 is not None:
            sys.argv[0] = saved_argv0


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """``(command path, parser, one-line help)`` for ``parser`` and all its subparsers, depth first."""
    yield from _walk(parser, path, parser.description or "")


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...], summary: str
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    yield path, parser, summary
    for action in parser._actions:  # argparse has no public way to list subparsers
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) in seen:  # an alias
                continue
            seen.add(id(sub))
            yield from _walk(sub, (*path, name), helps.get(name, "") or sub.description or "")


def generate_cli(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    module_name = options.get("module", "spool_reporter.cli")
    function = options.get("function", "build_parser")
    prog = options.get("prog", "django-spool")
    app.env.note_dependency(REPO / "spool_reporter")  # a folder: re-read on every build
    missing = note(
        f"The command line `{prog}` has not landed yet: this reference is generated from "
        f"`{module_name}.{function}()` when the docs are built, and will appear here once that function "
        "exists (issue 5). Until then, the switches on {doc}`consent` (environment variables and the "
        "config file) are the way to control reporting."
    )
    try:
        spec = importlib.util.find_spec(module_name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return missing
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        logger.warning("cli_reference: importing %s failed: %r", module_name, exc, location=docname)
        return missing
    build = getattr(module, function, None)
    if build is None:
        return missing
    try:
        with _help_environment(prog):
            parser = build()
            commands = [(path, p, summary, p.format_help()) for path, p, summary in walk(parser, (prog,))]
    except Exception as exc:
        logger.warning("cli_reference: %s.%s() failed: %r", module_name, function, exc, location=docname)
        return missing
    level = "#" * int(options.get("level", "2"))
    out = []
    if len(commands) > 1:
        rows = [[f"{{ref}}`{' '.join(path)} <{_anchor(path)}>`", summary] for path, _, summary, _ in commands[1:]]
        out.append(table(["command", "what it does"], rows))
    for path, _, _, text in commands:
        out.append(f"\n({_anchor(path)})=\n{level} `{' '.join(path)}`\n")
        out.append(fenced(text, "text"))
    return "".join(out)


def _anchor(path: tuple[str, ...]) -> str:
    return "cli-" + "-".join(path)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("spool_generated")
    register("cli", generate_cli)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
