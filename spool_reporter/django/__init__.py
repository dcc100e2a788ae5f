"""Django integration: DEP 8's three developer commands, recorded from inside ``ManagementUtility.execute``.

Two ways in, one function:

* **Installed means armed.** ``spool_reporter.pth`` (installed beside the package) checks ``sys.argv`` at
  interpreter start and, only for ``django-admin``, ``manage.py`` and ``python -m django``, imports
  ``spool_reporter._arm``, an import hook that wraps ``ManagementUtility.execute`` when Django's
  management package is imported. The wrapper calls :func:`record_command`.
* **In Django itself**, if DEP 8 landed in core, ``ManagementUtility.execute`` would call
  :func:`record_command` directly, just before running the command (docs/django.md shows the lines).

Which commands count, and when, is decided by the one table in ``spool_reporter/django/_rules.py``.
Importing this package is cheap and never imports Django. The hook imports it only when a reported command
runs (``spool_reporter/_arm.py`` explains the cost rules; hence no ``from __future__ import annotations``).
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["record_command", "settings_debug"]


def settings_debug() -> "bool | None":
    """``settings.DEBUG`` if the project's settings are loaded, else ``None``; never loads them, never raises.

    Settings that were never configured (``startproject``, ``startapp`` outside a project) and settings that
    failed to load both leave Django's lazy settings unconfigured, so both count as "no settings".
    """
    try:
        # Django is untyped; and if django.conf was never imported, no settings can have been loaded.
        conf: Any = sys.modules.get("django.conf")
        if conf is None or not conf.settings.configured:
            return None
        return bool(conf.settings.DEBUG)
    except Exception:
        return None


def record_command(argv: "Sequence[str]", *, debug: "bool | None", environ: "Mapping[str, str] | None" = None) -> bool:
    """Record one event for this management command if the rules say so. Never raises.

    Call it once per ``ManagementUtility.execute``, after the settings were loaded and the subcommand was found,
    and before the command runs (so that no spool descriptor is open when ``runserver``'s autoreloader spawns
    its child: :func:`spool_reporter.record` closes everything it opens).

    :param argv: ``ManagementUtility.argv``; only the subcommand (``argv[1]``) is recorded, as the event name,
        and only if it is one of the commands in the rules table. No argument, path or name is recorded.
    :param debug: ``settings.DEBUG`` if the project's settings loaded, ``None`` if there are none
        (see :func:`settings_debug`).
    :param environ: the environment to read switches from (default: :data:`os.environ`).
    :returns: whether an event was recorded (or echoed with ``DJANGO_ANALYTICS_DEBUG=1``).
    """
    try:
        from . import _rules

        rule = _rules.match(argv, debug=debug, environ=os.environ if environ is None else environ)
        if rule is None:
            return False
        from spool_reporter import record
        from spool_reporter._hook import django_app  # as spool_reporter/__init__.py does: the lean hot-path module

        # django.VERSION, not django.get_version(): on a development checkout the latter runs `git log`.
        django: Any = sys.modules["django"]
        version = f"{django.VERSION[0]}.{django.VERSION[1]}"
        return record(rule.name, app=django_app(version), notice=True, long_lived=rule.long_lived, environ=environ)
    except Exception:
        return False
