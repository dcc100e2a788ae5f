"""The management commands as a Click group, for Click programs (docs/cli-embedding.md).

Click is an optional extra (``pip install 'spool_reporter[click]'``), never a dependency of the package: this
module is the only one that imports it. The group is built from the same table as the argparse commands
(:data:`spool_reporter.cli.COMMANDS`) and runs the same code (:func:`spool_reporter.cli.execute`), so the
output, the exit statuses and the handling of a closed pipe are the same::

    import click
    from spool_reporter import App
    from spool_reporter.click_group import reporting_group

    MYTOOL = App(name="MyTool", version="1.4", cli_name="mytool analytics", endpoint="https://...")

    @click.group()
    def cli() -> None: ...

    cli.add_command(reporting_group(MYTOOL), name="analytics")   # mytool analytics status, flush --dry-run, ...
"""

from __future__ import annotations

import argparse
import os

import click

from ._commands import Context
from ._hook import App
from .cli import COMMANDS, Command, execute, fill_words, help_words

__all__ = ["reporting_group"]


def reporting_group(app: App, *, name: str = "analytics") -> click.Group:
    """A Click group with the management commands for ``app`` (``status``, ``enable``, ``disable``, ``flush``,
    ``purge``, ``reset-id``). Messages name the group's command path (``mytool analytics``); give the same to
    ``App(cli_name=...)`` so that the first-run notice names it too."""
    words = help_words(app, app.cli_name)
    group = click.Group(
        name=name,
        help=f"See and control {app.name} usage reporting (spool_reporter).",
        epilog=f"Exit status: 0 success, 1 failure, 2 usage error. {app.env_disable}=1 or DO_NOT_TRACK=1 turn "
        f"reporting off; docs: {app.docs_url}",
    )
    for command in COMMANDS:
        group.add_command(_click_command(app, command, words))
    return group


def _click_command(app: App, command: Command, words: dict[str, str]) -> click.Command:
    def callback(**flags: bool | str | None) -> None:
        ctx = click.get_current_context()
        args = argparse.Namespace(**flags)
        problem = command.check(args) if command.check is not None else None
        if problem:
            raise click.UsageError(problem, ctx)
        prog = ctx.parent.command_path if ctx.parent is not None else ctx.command_path
        ctx.exit(execute(command, args, Context(app=app, env=os.environ, prog=prog)))

    params: list[click.Parameter] = [
        click.Option(list(option.flags), is_flag=True, default=False, help=option.help)
        if option.metavar is None
        else click.Option(list(option.flags), metavar=option.metavar, default=None, help=option.help)
        for option in command.options
    ]
    return click.Command(
        command.name,
        callback=callback,
        params=params,
        help=fill_words(command.help_text(), words),
        short_help=command.help,
    )
