"""The detached flusher process: ``python -m spool_reporter._detached --app django`` (started by :mod:`._spawn`).

It lowers its own priority (nice 19, and its session's autogroup), arms a watchdog that ends the process
:data:`~._flush.WATCHDOG_GRACE` seconds after the run's deadline whatever it is doing (and, on POSIX, a
``SIGALRM`` whose default action ends it even if the interpreter hangs), then runs one :func:`._flush.run` in
the background mode -- then sends the forget a ``disable`` left, if one is pending (:mod:`._withdraw`); with
``--forget``, only that -- and exits. It never imports the user's project or settings; its exit status is for tests.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Final

from . import _flush, _settings
from ._hook import O_CLOEXEC, App

__all__ = ["main"]

ALARM_GRACE: Final = 5
"""On POSIX, the default action of ``SIGALRM`` ends the process this long after the watchdog should have (the
last resort, should the interpreter itself hang)."""

EXIT_DEADLINE: Final = 3
"""Exit status of a flusher ended by its watchdog."""


def _lower_priority() -> None:
    """Lowest CPU priority; on Linux the I/O priority follows the nice value when no I/O class is set.

    The hook starts the flusher in a new session, and Linux's autogroup scheduling (on by default on desktop
    kernels) shares CPU between *sessions* before nice values count: a session-leading flusher at nice 19
    still took a full share from the user's next command (measured: +100 ms on a busy 2-core machine, +35 ms
    with the autogroup's own nice set too). So a flusher that leads its own session also sets its autogroup's
    nice -- never anyone else's (a flusher started from a terminal shares the terminal's group). A kernel
    without autogroups has no file, and a process still in the root group (never moved by a ``setsid``, as in
    some containers) shows an empty one and refuses the write; both are ignored.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.nice(19)
    with contextlib.suppress(AttributeError, OSError):
        if os.getsid(0) == os.getpid():
            fd = os.open("/proc/self/autogroup", os.O_WRONLY | O_CLOEXEC)
            try:
                os.write(fd, b"19")
            finally:
                os.close(fd)


def _arm_watchdog(deadline: float) -> None:
    """End the process :data:`_flush.WATCHDOG_GRACE` after ``deadline`` (a :func:`time.monotonic` time: the run's own)
    whatever it is doing (DNS, a stuck lock)."""
    seconds = max(0.0, deadline - time.monotonic())

    def bite() -> None:
        while (left := deadline + _flush.WATCHDOG_GRACE - time.monotonic()) > 0:
            time.sleep(left)
        os._exit(EXIT_DEADLINE)

    threading.Thread(target=bite, name="spool_reporter-watchdog", daemon=True).start()
    if hasattr(os, "fork"):
        import signal

        # SIG_DFL for SIGALRM terminates the process in the kernel: the last resort if the interpreter hangs.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(seconds + _flush.WATCHDOG_GRACE) + ALARM_GRACE)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spool_reporter._detached --app django``: one detached run; the exit status is for tests."""
    import argparse

    _lower_priority()
    parser = argparse.ArgumentParser(prog="python -m spool_reporter._detached")
    parser.add_argument("--app", required=True, help="the application's slug (its spool folder)")
    parser.add_argument("--name", help="the application's name (default: from the slug)")
    parser.add_argument("--config-name", help="its config/policy file name")
    parser.add_argument("--env-prefix", help="its environment variable prefix")
    parser.add_argument("--forget", action="store_true", help="send only the forget a `disable` left (_withdraw)")
    args = parser.parse_args(argv)
    # One deadline for the run and its watchdog, taken now: the sends end by it, the bookkeeping within
    # _round.SETTLE_SECONDS after it, and only then (_flush.WATCHDOG_GRACE) may the watchdog end the process.
    deadline = time.monotonic() + _settings.tuning().deadline
    _arm_watchdog(deadline)
    if args.app == "django" and not (args.name or args.config_name or args.env_prefix):
        from ._hook import django_app

        app = django_app()
    else:
        app = App(
            name=args.name or args.app,
            version="0",
            slug=args.app,
            config_name=args.config_name,
            env_prefix=args.env_prefix,
        )
    if args.forget:
        return _forget_pending(app, deadline, inherited=True)
    try:
        result = _flush.run(app, foreground=False, environ=os.environ, deadline=deadline)
    except Exception:
        return 1
    ended = ("delivered", "nothing", "disabled", "local", "invalid-endpoint", "retired", "busy")
    code = 0 if result.outcome in ended else 2
    # Then the forget a `disable` left, if any (after `enable`, the flushers the hook starts for events send it):
    # within the same deadline, the flusher's lock taken again (the run above closed the one the hook handed over).
    if _has_pending(app):
        _forget_pending(app, deadline, inherited=False)
    return code


def _has_pending(app: App) -> bool:
    """Whether ``forget.pending`` is there (one ``stat`` through the folder's descriptor, as every file of ours)."""
    from ._hook import FORGET_PENDING_NAME, Folder, mtime, state_dir

    try:
        folder = Folder(state_dir(app, os.environ), create=False)
    except OSError:
        return False
    with folder:
        return mtime(folder, FORGET_PENDING_NAME) is not None


def _forget_pending(app: App, deadline: float, *, inherited: bool) -> int:
    """The ``--forget`` run (:func:`spool_reporter._withdraw.run`): 0 when nothing is left to send or it waits by
    rule, 2 when a forget failed (kept for a later try), 1 on an unexpected error. ``inherited``: the hook handed
    over the flusher's lock (``--forget``)."""
    from . import _withdraw

    try:
        result = _withdraw.run(app, os.environ, deadline=deadline, inherited=inherited)
    except Exception:
        return 1
    return 2 if result.outcome == "failed" else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # A worker may still sit in getaddrinfo(); do not wait for the interpreter to tear down around it.
    os._exit(code)
