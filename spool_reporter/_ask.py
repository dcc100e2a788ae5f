"""Ask mode (``default=ask``): one question at a terminal, asked after the command's own output.

The hook calls :func:`ask_later` when the decision is ``policy:ask`` or ``app:ask`` (nobody has answered yet) and
both stdin and stderr are terminals; without a terminal, in CI, in the reloader's child and under the debug switch
it never gets here, and nothing is recorded. :func:`ask_later` counts the run (``ask_after=N``: only the Nth asks)
and registers :func:`ask` with :mod:`atexit`, so that the command does its work first and the question comes after
its output: the command never waits on it (docs/design-notes.md, "Ask after the command"). The answer is written
to the user file (``disable=0`` or ``disable=1``, with the notice version it answered), and a yes records the
command's event then. No answer within :data:`ASK_SECONDS`, Ctrl-C or end of file is no answer: nothing is
written, nothing recorded, the question comes again at the next run, and the exit status stays the command's.
"""

# Imported inside the user's command (once, at a terminal), like _firstrun: no `from __future__ import annotations`;
# typing only for the type checker.

import atexit
import contextlib
import os
import sys
import time

from . import _hook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

    from ._hook import App

ASK_SECONDS: "Final" = 30.0
"""How long the question waits for an answer; then it counts as no answer."""

ASK_SECONDS_ENV: "Final" = "SPOOL_REPORTER_ASK_SECONDS"
"""Shortens :data:`ASK_SECONDS` (tests); never lengthens it."""

RUNS_SUFFIX: "Final" = ".runs"
"""The count of ``ask_after=``: ``<config folder>/<config_name>.runs`` (``~/.config/djangoanalytics.runs``), one
number, deleted once the question is answered."""

MAX_TRIES: "Final" = 3
"""Lines that are neither yes nor no before the question gives up (within the same :data:`ASK_SECONDS`)."""

_YES: "Final" = frozenset({"y", "yes"})
_NO: "Final" = frozenset({"n", "no"})


def ask_settings(app: "App", policy: "Mapping[str, str] | None") -> "tuple[str, int]":
    """What Enter means (``yes`` or ``no``) and the terminal run that asks: the policy's ``ask_default=`` and
    ``ask_after=`` where it names them, else the App's."""
    enter = app.ask_default
    after = app.ask_after
    if policy is not None:
        said = policy.get("ask_default", "").strip().lower()
        if said in ("yes", "no"):
            enter = said
        raw = policy.get("ask_after", "").strip()
        if raw.isascii() and raw.isdigit():
            after = min(_hook.MAX_ASK_AFTER, max(1, int(raw)))
    return enter, after


def runs_path(app: "App", environ: "Mapping[str, str]") -> str:
    """The ``ask_after=`` count's file, beside the user file."""
    return _hook.user_config_path(app, environ) + RUNS_SUFFIX


def read_runs(path: str) -> int:
    """The terminal runs counted so far (0 when there is no file, or it is not a small number)."""
    try:
        fd = os.open(path, os.O_RDONLY | _hook.O_NOFOLLOW | _hook.O_CLOEXEC | _hook.O_NONBLOCK)
    except OSError:
        return 0
    try:
        raw = os.read(fd, 16).strip()
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int(raw) if raw.isdigit() and len(raw) <= 3 else 0


def _write_runs(path: str, runs: int) -> None:
    from ._files import make_dirs

    make_dirs(os.path.dirname(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _hook.O_NOFOLLOW | _hook.O_CLOEXEC | _hook.O_NONBLOCK
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, f"{runs}\n".encode("ascii"))
    finally:
        os.close(fd)


def forget_runs(app: "App", environ: "Mapping[str, str]") -> None:
    """Delete the count (the question was answered, here or by ``enable``/``disable``)."""
    with contextlib.suppress(OSError):
        os.unlink(runs_path(app, environ))


def count_run(app: "App", environ: "Mapping[str, str]", after: int) -> bool:
    """Count this terminal run; whether it is the one that asks (the ``after``-th, or any later one)."""
    if after <= 1:
        return True
    path = runs_path(app, environ)
    runs = read_runs(path) + 1
    if runs >= after:
        return True
    with contextlib.suppress(OSError):  # not counted: asked one run later
        _write_runs(path, runs)
    return False


def ask_later(
    app: "App", event: str, environ: "Mapping[str, str]", policy: "Mapping[str, str] | None", long_lived: bool
) -> bool:
    """Count the run and, if it is the one that asks, ask when the command has done its work. Whether it will."""
    enter, after = ask_settings(app, policy)
    if not count_run(app, environ, after):
        return False
    atexit.register(_at_exit, app, event, environ, long_lived, enter)
    return True


def _at_exit(app: "App", event: str, environ: "Mapping[str, str]", long_lived: bool, enter: str) -> None:
    # The command has ended: nothing of ours may change how it ends (its output, its exit status).
    with contextlib.suppress(BaseException):
        ask(app, event, environ, long_lived=long_lived, enter=enter)


def question(app: "App", endpoint: str, enter: str) -> str:
    """The question, as printed on stderr: what is sent, in two lines, how to change the answer, and the prompt."""
    cli = app.cli_name
    which = "each startproject, startapp and runserver" if app.slug == "django" else "each reported command"
    return (
        f"\n{app.name} may report usage: {which} sends one anonymous event to {_host(endpoint)},\n"
        f"with the command's name, {app.name}/Python/OS versions and a random id; never paths, names or arguments.\n"
        f"Change your answer any time with: {cli} enable, {cli} disable ({cli} status shows it).\n"
        f"Send usage events? {'[Y/n]' if enter == 'yes' else '[y/N]'} "
    )


def _host(endpoint: str) -> str:
    # Where the events go, as a person reads it: the host (and a port that is not the scheme's), no path or secret.
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        host = parts.hostname or "?"
        port = parts.port
    except ValueError:
        return "?"
    host = f"[{host}]" if ":" in host else host
    return host if port is None else f"{host}:{port}"


def _foreground() -> bool:
    # Both ends are terminals and this process is in the terminal's foreground: a background job that reads the
    # terminal is stopped by SIGTTIN, which would hang the command that just ended.
    if sys.platform == "win32":  # pragma: no cover - POSIX terminals only, for now: never asked, nothing recorded
        return False
    try:
        return os.isatty(0) and os.isatty(2) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _read_line(deadline: float) -> "bytes | None":
    # One line from the terminal by ``deadline`` (time.monotonic), or None: end of file, or no whole line in time.
    import select

    data = b""
    while b"\n" not in data and len(data) < 256:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([0], [], [], left)
        if not ready:
            return None
        chunk = os.read(0, 256)
        if not chunk:
            return None
        data += chunk
    return data.partition(b"\n")[0]


def read_answer(enter: str, seconds: float) -> "str | None":
    """``yes``, ``no``, or ``None`` (no answer in ``seconds``, end of file, or :data:`MAX_TRIES` other lines)."""
    deadline = time.monotonic() + seconds
    for _ in range(MAX_TRIES):
        line = _read_line(deadline)
        if line is None:
            return None
        said = line.decode("utf-8", "replace").strip().lower()
        if not said:
            return enter
        if said in _YES:
            return "yes"
        if said in _NO:
            return "no"
        _say("Please answer y or n: ")
    return None


def _say(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _flush_typeahead() -> None:
    # What was typed while the command ran (an Enter pressed to wait) is not an answer to a question not yet asked.
    try:
        import termios
    except ImportError:  # pragma: no cover - not POSIX
        return
    with contextlib.suppress(termios.error, OSError):  # termios.error is not an OSError
        termios.tcflush(0, termios.TCIFLUSH)


def ask(app: "App", event: str, environ: "Mapping[str, str]", *, long_lived: bool = False, enter: str = "yes") -> str:
    """Ask now, if nobody answered meanwhile; write the answer and, for yes, record ``event``.

    Returns ``yes``, ``no`` or ``none`` (not asked, or no answer: nothing written)."""
    if not _foreground():
        return "none"
    user, policy = _hook.read_inputs(app, environ)
    decision = _hook.decide(app, environ, user, policy)
    if decision.reason not in _hook.ASK_REASONS:
        return "none"  # answered by another command, or by enable/disable, since this one started
    text = question(app, _hook.effective_endpoint(app, environ, user, policy), enter)
    answer = _answer_or_none(text, enter, _hook.shortened(environ, ASK_SECONDS_ENV, ASK_SECONDS))
    if answer is None:
        _say(f"\nNo answer: nothing was recorded; {app.name} will ask again next time.\n")
        return "none"
    return _keep(app, event, environ, answer, long_lived=long_lived)


def _answer_or_none(text: str, enter: str, seconds: float) -> "str | None":
    # Print the question and read its answer. Ctrl-C at the question is no answer, whatever SIGINT did before (a
    # SIG_DFL would end the process, and so change its exit status): from before the question is printed until
    # it stops waiting, SIGINT raises KeyboardInterrupt here.
    import signal

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, interrupted)
    except (ValueError, OSError):  # pragma: no cover - not the main thread
        previous = None
    try:
        _flush_typeahead()
        _say(text)
        return read_answer(enter, seconds)
    except KeyboardInterrupt:
        return None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _keep(app: "App", event: str, environ: "Mapping[str, str]", answer: str, *, long_lived: bool) -> str:
    # Write the answer; a yes records the event the question was about, under the notice it answered.
    from . import _userconf

    changes = {"disable": "0" if answer == "yes" else "1", "notice_version": str(app.notice_version)}
    if answer == "yes":
        # The question said what the notice says: it counts as seen, for this wording, and the id it promised.
        changes["notice_mode"] = _hook.NOTICE_SEND
        user = _hook.read(_hook.user_config_path(app, environ))
        cid = None if user is None else user.get("client_id")
        if cid is None or not _hook.is_uuid4(cid):
            changes["client_id"] = _hook.uuid4()
    try:
        _userconf.update(app, changes, environ)
    except Exception as exc:  # said; then it is no answer, asked again next time
        _say(f"Your answer could not be saved ({exc}); {app.name} will ask again next time.\n")
        return "none"
    forget_runs(app, environ)
    cli = app.cli_name
    if answer == "no":
        _say(f"Usage reporting is off; nothing was recorded. Turn it on later with: {cli} enable\n")
        return "no"
    try:
        recorded = _hook.record_event(event, app=app, notice=True, long_lived=long_lived, environ=environ)
    except Exception:  # as record() does: the answer stands, this one event is lost
        recorded = False
    said = "this command's event is recorded" if recorded else "nothing could be recorded for this command"
    _say(f"Thank you: usage reporting is on ({said}). Turn it off any time with: {cli} disable\n")
    return "yes"


def status_facts(
    app: "App",
    environ: "Mapping[str, str]",
    user: "Mapping[str, str] | None",
    policy: "Mapping[str, str] | None",
) -> "dict[str, object]":
    """What ``status`` says of the ask mode: what Enter means, the run that asks, the runs counted, the answer."""
    enter, after = ask_settings(app, policy)
    said = None if user is None or user is _hook.BROKEN else user.get("disable")
    answered = None if said is None else "yes" if said.strip() == "0" else "no"
    return {"enter": enter, "ask_after": after, "runs": read_runs(runs_path(app, environ)), "answered": answered}


def status_text(facts: "Mapping[str, object]") -> str:
    """``status``'s mode line in ask mode."""
    if facts["answered"] is not None:
        value = "0" if facts["answered"] == "yes" else "1"
        return f"ask: answered {facts['answered']} (disable={value} in your config file)"
    after = facts["ask_after"]
    when = "the next run of a reported command at a terminal"
    if isinstance(after, int) and after > 1:
        when = f"terminal run {after} of a reported command ({facts['runs']} counted so far)"
    return f"ask: not answered yet; asked after {when}, where Enter means {facts['enter']}"
