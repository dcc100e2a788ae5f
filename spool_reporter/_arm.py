"""Arms spool_reporter's Django hook: wraps ``ManagementUtility.execute`` when Django's management is imported.

Imported by ``spool_reporter.pth`` at interpreter start; see docs/django.md.
"""

# How it works. spool_reporter.pth checks sys.argv[0] (the only cost for Python processes that are not
# django-admin, manage.py or python -m) and imports this module, which arms itself on import: arm() confirms
# with wanted() and puts this module at the front of sys.meta_path, as a finder that answers for exactly one
# name, django.core.management. It asks the other finders for the real spec, lets the real loader execute the
# module, wraps ManagementUtility.execute and takes itself out of sys.meta_path. No other import is touched and
# nothing of Django is imported early.
#
# The wrapper, for the reported commands only, shadows fetch_command on the instance for the duration of
# execute(); when Django fetches the subcommand it was started with (argv[1], so `help startproject` does not
# count), the settings have been loaded, and spool_reporter.django.record_command() decides and records, before
# the command runs (so no spool descriptor is open when runserver's autoreloader spawns its child).
#
# Cost. Every Django command imports this module and its parent (spool_reporter/__init__.py loads its names
# lazily for this reason), and `django-admin --version` may cost at most 1 % more instructions. So both import
# nothing at module level but sys and os, do not use `from __future__ import annotations` (importing
# __future__ alone costs ~0.7 M instructions; annotations that name typing-only types are quoted), and
# explain themselves in comments, which do not enlarge the .pyc. This module lives at the top of the package,
# not in spool_reporter.django, so that neither the arming nor a process that only passes the .pth's coarse
# check (every `python -m ...`, and code read from stdin, whose sys.argv[0] is '' or '-') imports that package
# and reads its folder: about 0.5 M instructions less for each (benchmarks/bench_django.py). The recording
# code is imported only when a reported command runs.
#
# Rules: never change Django's behaviour, whether reporting is on, off or broken. Every step catches its own
# exceptions and falls back to doing nothing; exceptions raised by Django itself pass through untouched.
# Idempotent: the .pth runs twice in a virtual environment (site.venv() and site.main() both process it), and
# the finder and the wrapper are recognised by attributes, not identity. Do not log here.

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Final

TARGET: "Final" = "django.core.management"
"""The one module whose import arms the wrapper."""

MARK: "Final" = "__spool_reporter_wrapped__"
"""Attribute set on our wrapper of ``execute``: never wrap twice."""

FINDER_MARK: "Final" = "spool_reporter_finder"
"""Attribute that identifies this module in :data:`sys.meta_path`."""

spool_reporter_finder: "Final" = True  # this module is the finder: see FINDER_MARK

SCRIPT_NAMES: "Final" = frozenset({"django-admin", "django-admin.exe", "manage.py"})
"""``os.path.basename(sys.argv[0])``, lower-cased, of the processes that are Django commands.

``django-admin`` is the console script on POSIX and ``django-admin.exe`` pip's launcher on Windows (the old
setuptools ``django-admin-script.py`` is not armed: its 9-character suffix, ``script.py``, is too common for the
``.pth`` check); ``manage.py`` is the project's script however it is started.
"""

MODULE_NAMES: "Final" = frozenset({"django", "django.__main__"})
"""The ``python -m`` module names that are Django commands."""

REPORTED: "Final" = frozenset({"startproject", "startapp", "runserver"})
"""A pre-filter: the names in ``_rules.COMMANDS``, so that every other command runs without importing more of
ours. The table is the authority; a unit test keeps the two equal."""


def wanted(argv: "Sequence[str]", orig_argv: "Sequence[str]") -> bool:
    """Whether this process is a Django command, from ``sys.argv`` as it is while ``.pth`` files run.

    At that point ``sys.argv[0]`` is the script (``…/django-admin``, ``manage.py``) or ``'-m'``, in which case
    the module name is the element of ``sys.orig_argv`` just before the script's own arguments (either
    ``django`` after ``-m``, or glued as ``-mdjango``).
    """
    if not argv:
        return False
    first = str(argv[0])
    if first == "-m":
        index = len(orig_argv) - len(argv)
        if index < 1:
            return False
        token = str(orig_argv[index])
        if token.startswith("-"):  # glued: -mdjango, or after other one-letter flags: -Imdjango
            flags, sep, token = token[1:].partition("m")
            if not sep or not (flags.isalpha() or not flags):
                return False
        return token in MODULE_NAMES
    return first.replace("\\", "/").rpartition("/")[2].lower() in SCRIPT_NAMES


def find_spec(
    fullname: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
) -> "ModuleSpec | None":
    """The meta path finder protocol (this module is the finder): only for :data:`TARGET`, once."""
    if fullname != TARGET:
        return None
    try:
        disarm()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: "ModuleType") -> None:
            try:  # noqa: SIM105 - contextlib is not imported yet at this point of a Django start
                del loader.exec_module  # back to the class's method: the loader is as it was
            except Exception:  # noqa: S110 - do not log here
                pass
            real_exec(module)  # Django's own errors propagate unchanged
            patch(module)

        loader.exec_module = exec_module
        return spec
    except Exception:
        # Returning None lets the import system search again, exactly as if we were not here.
        return None


def disarm() -> None:
    """Take this finder out of :data:`sys.meta_path`."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, FINDER_MARK, False)]


def arm() -> bool:
    """Arm the hook for this process if it is a Django command. Idempotent, never raises.

    Returns whether the hook is (now) armed or already applied.
    """
    try:
        if not wanted(sys.argv, getattr(sys, "orig_argv", ())):
            return False
        module = sys.modules.get(TARGET)
        if module is not None:
            return patch(module)
        if not any(getattr(f, FINDER_MARK, False) for f in sys.meta_path):
            sys.meta_path.insert(0, sys.modules[__name__])
        return True
    except Exception:
        return False


def patch(module: "ModuleType") -> bool:
    """Wrap ``module.ManagementUtility.execute`` once. Returns whether it is wrapped. Never raises."""
    try:
        cls: Any = module.ManagementUtility
        original = cls.__dict__["execute"]
        if getattr(original, MARK, False):
            return True
        import functools

        @functools.wraps(original)
        def execute(self: "Any", *args: "Any", **kwargs: "Any") -> "Any":
            shadow = _watch(self)
            try:
                return original(self, *args, **kwargs)
            finally:
                if shadow is not None:
                    _unwatch(self, shadow)

        setattr(execute, MARK, True)
        cls.execute = execute
        return True
    except Exception:
        return False


def _watch(utility: "Any") -> "object | None":
    """Shadow ``utility.fetch_command`` so the first fetch of ``argv[1]`` records. Returns the shadow or None."""
    try:
        argv = utility.argv
        if len(argv) < 2 or argv[1] not in REPORTED or "fetch_command" in vars(utility):
            return None  # not a reported command: Django runs exactly as without us
        subcommand = argv[1]
        fetch = utility.fetch_command
        fired = False

        def fetch_command(name: str) -> "Any":
            nonlocal fired
            command = fetch(name)
            if not fired and name == subcommand:
                fired = True
                _record(utility)
            return command

        utility.fetch_command = fetch_command
        return fetch_command
    except Exception:
        return None


def _unwatch(utility: "Any", shadow: object) -> None:
    try:
        if vars(utility).get("fetch_command") is shadow:
            del utility.fetch_command
    except Exception:  # noqa: S110 - do not log here
        pass


def _record(utility: "Any") -> None:
    try:
        from spool_reporter.django import record_command, settings_debug

        record_command(utility.argv, debug=settings_debug())
    except Exception:  # noqa: S110 - do not log here
        pass


arm()
