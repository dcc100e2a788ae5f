"""greet, as a Click program: the same tool as ``greet.py``, with the management commands as a Click group.

Needs Click (``pip install 'spool_reporter[click]'``)::

    python examples/greet_click.py hello World
    python examples/greet_click.py analytics status
"""

from __future__ import annotations

import click

from spool_reporter import App, record
from spool_reporter.click_group import reporting_group

GREET = App(
    name="Greet",
    version="1.0",
    cli_name="greet analytics",
    endpoint="http://127.0.0.1:8765/v1/batch",
)


@click.group()
def cli() -> None:
    """Greet someone, and report that you did."""


@cli.command()
@click.argument("name")
def hello(name: str) -> None:
    """Greet someone (the name is never recorded)."""
    record("hello", app=GREET, notice=True)
    click.echo(f"Hello, {name}!")


cli.add_command(reporting_group(GREET), name="analytics")

if __name__ == "__main__":
    cli(prog_name="greet")
