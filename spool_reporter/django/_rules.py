"""The one table that says which Django commands are reported, and when.

DEP 8 counts developers, not deployments, so only three developer commands are reported, each at most once
per invocation (docs/django.md has the reasons):

================  ==============  ========================================================================
command           ``long_lived``  why it is counted
================  ==============  ========================================================================
``startproject``  no              a new project: the clearest sign of a developer
``startapp``      no              work on a project (inside one, or outside with Django's default settings)
``runserver``     yes             the development server; lives long, so a flusher may start from it
================  ==============  ========================================================================

And the conditions that apply to every row, checked in this order (first match says "do not record"):

1. the subcommand (``argv[1]``) is not in the table: ``check``, ``migrate``, ``help``, ``--version``, ...;
2. the command is only asked for its help or version (``--help``, ``-h``, ``--version`` among its arguments);
3. shell completion is running (``DJANGO_AUTO_COMPLETE`` set): nothing is executed;
4. this process is ``runserver``'s autoreloader child (``RUN_MAIN=true``): the parent already recorded,
   and a reload restarts only the child;
5. the project's settings loaded and say ``DEBUG = False``: a production-like configuration. Settings that
   were never configured (``startproject``, ``startapp`` outside a project) or failed to load count as "no
   settings" and do not stop the event.

Pure and standard-library only: imported by the hook inside the user's command, and unit-tested without
Django. No ``from __future__ import annotations`` (importing ``__future__`` costs ~0.7 M instructions inside
the command): annotations that name typing-only types are quoted.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Final


class CommandRule:
    """One row of :data:`COMMANDS`. Immutable; keyword-only."""

    __slots__ = ("debug_only", "long_lived", "name", "skip_in_reloader_child")

    name: str
    """The subcommand, which is also the event name."""
    long_lived: bool
    """The process serves until stopped: a flusher may start now rather than after a later command."""
    debug_only: bool
    """With loaded settings, record only if ``settings.DEBUG`` is true."""
    skip_in_reloader_child: bool
    """Record nothing in the autoreloader's child process (``RUN_MAIN=true``)."""

    def __init__(
        self, *, name: str, long_lived: bool = False, debug_only: bool = True, skip_in_reloader_child: bool = True
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "long_lived", long_lived)
        object.__setattr__(self, "debug_only", debug_only)
        object.__setattr__(self, "skip_in_reloader_child", skip_in_reloader_child)

    def __setattr__(self, key: str, value: object) -> None:
        msg = "CommandRule is immutable"
        raise AttributeError(msg)

    def __repr__(self) -> str:
        return (
            f"CommandRule(name={self.name!r}, long_lived={self.long_lived!r}, debug_only={self.debug_only!r}, "
            f"skip_in_reloader_child={self.skip_in_reloader_child!r})"
        )


COMMANDS: "Final[Mapping[str, CommandRule]]" = {
    rule.name: rule
    for rule in (
        CommandRule(name="startproject"),
        CommandRule(name="startapp"),
        CommandRule(name="runserver", long_lived=True),
    )
}
"""The table: DEP 8's three developer commands. Nothing else is ever recorded."""

INFO_FLAGS: "Final" = frozenset({"--help", "-h", "--version"})
"""Arguments that make any command print its help or Django's version and do nothing else (``BaseCommand``)."""

RELOADER_ENV: "Final" = "RUN_MAIN"
"""``django.utils.autoreload.DJANGO_AUTORELOAD_ENV``: set to ``"true"`` in the autoreloader's child."""

AUTOCOMPLETE_ENV: "Final" = "DJANGO_AUTO_COMPLETE"
"""Set by Django's bash completion script; ``ManagementUtility.autocomplete()`` then exits early."""


def match(argv: "Sequence[str]", *, debug: "bool | None", environ: "Mapping[str, str]") -> "CommandRule | None":
    """The rule that says to record this invocation, or ``None``.

    :param argv: the full command line as ``ManagementUtility`` holds it (``argv[0]`` is the program);
        only ``argv[1]`` and the presence of :data:`INFO_FLAGS` are looked at, and nothing of it is ever recorded.
    :param debug: ``settings.DEBUG`` if the project's settings loaded, ``None`` if there are none.
    :param environ: the process environment.
    """
    if len(argv) < 2:
        return None
    rule = COMMANDS.get(argv[1])
    if rule is None:
        return None
    if any(arg in INFO_FLAGS for arg in argv[2:]):
        return None
    if environ.get(AUTOCOMPLETE_ENV):
        return None
    if rule.skip_in_reloader_child and environ.get(RELOADER_ENV) == "true":
        return None
    if rule.debug_only and debug is False:
        return None
    return rule
