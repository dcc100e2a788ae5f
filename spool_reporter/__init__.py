"""spool_reporter: usage events that never make a command wait.

The public doorway. Importing it costs one small module: :class:`App`, :class:`Decision`, :func:`decide` and
``__version__`` load on first use (PEP 562), so a Django command that records nothing pays almost nothing.

>>> from spool_reporter import App, record
>>> MYTOOL = App(name="MyTool", version="1.4.2")
>>> record("build", app=MYTOOL)  # doctest: +SKIP
True
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._hook import App, Decision

__all__ = [
    "App",
    "Decision",
    "SpoolReporterError",
    "__version__",
    "decide",
    "record",
]


class SpoolReporterError(Exception):
    """The root of the exceptions raised by the cold path (command line, flusher, collector).

    :func:`record` never raises at all.
    """


def record(
    event: "str",
    *,
    app: "App",
    notice: "bool" = False,
    long_lived: "bool" = False,
    environ: "Mapping[str, str] | None" = None,
) -> "bool":
    """Append one event named ``event`` for ``app`` to the local spool, in microseconds.

    Returns ``True`` if the event was recorded (or echoed, with ``<P>_ANALYTICS_DEBUG=1``), ``False`` if
    reporting is off or anything went wrong. It never raises and never touches the network; it prints only
    the one-time notice on stderr when ``notice`` is true, and the debug echo when asked for.

    :param event: the event name, ``[A-Za-z][A-Za-z0-9_]*``, at most 40 characters.
    :param app: who is reporting (see :class:`App`).
    :param notice: print the one-time first-run notice on stderr if this call creates the client id.
    :param long_lived: the caller lives long (a server): a flusher may start now rather than later.
    :param environ: the environment to read switches from (default: :data:`os.environ`).
    """
    try:
        from ._hook import record_event

        return record_event(event, app=app, notice=notice, long_lived=long_lived, environ=environ)
    except Exception:
        return False


def decide(app: "App", environ: "Mapping[str, str] | None" = None) -> "Decision":
    """Whether reporting is on for ``app`` here and now, and which rule decided it. Reads two small files."""
    import os

    from ._hook import decide as decide_from
    from ._hook import read_inputs

    env = os.environ if environ is None else environ
    return decide_from(app, env, *read_inputs(app, env))


def __getattr__(name: "str") -> "object":
    # PEP 562: load the rest of the doorway on first use.
    if name == "App":
        from ._hook import App

        return App
    if name == "Decision":
        from ._hook import Decision

        return Decision
    if name == "__version__":
        from ._version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> "list[str]":
    return sorted([*globals(), "App", "Decision", "__version__"])
