"""What ``collector serve``, ``stats``, ``migrate`` and ``rollup`` do once their command line is parsed: a body
for each, a function of the parsed arguments that returns the exit status.

:mod:`._cli` builds the parsers and imports this module only when a command runs, so that building them (every
``django-spool`` command does) stays cheap; for the same reason each body imports the parts of the collector it
needs (the server, the store, the releases) when it runs. Results go to stdout, errors to stderr as one line that
starts with the command typed (``args.collector_prog``); the exit statuses are :mod:`._cli`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
from pathlib import Path

from spool_reporter._cli_common import EXIT_USAGE, print_error
from spool_reporter._words import counted

from ._common import VARIABLES, CollectorError, NotACollectorDatabase, Publishing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from types import FrameType, TracebackType
    from typing import Any, Final

    from ._stats import Stats


def _publishing(args: argparse.Namespace) -> Publishing:
    return Publishing(epsilon=args.epsilon, min_count=args.min_count, licence=args.data_license)


def _db(args: argparse.Namespace) -> str | None:
    """The ``--db`` value, or its environment variable's (``VARIABLES.db``); ``None`` after printing why not."""
    db = args.db if args.db is not None else os.environ.get(VARIABLES.db, "")
    if not db:
        print_error(args.collector_prog, f"give --db or set ${VARIABLES.db}")
        return None
    return str(db)


def cmd_serve(args: argparse.Namespace) -> int:
    from spool_reporter._net import is_loopback

    from . import GA4Forwarder, serve
    from ._config import limits, policy, retention
    from ._forward import GA4_ENDPOINT

    if not 0 <= args.port <= 65535:
        print_error(args.collector_prog, f"port must be 0-65535, got {args.port}")
        return EXIT_USAGE
    db = _db(args)
    if db is None:
        return EXIT_USAGE
    forward = None
    try:
        accept = policy(max_age_days=args.max_age_days, commands=args.commands)
        keep = limits(per_client_week=args.max_per_client_week)
        retain = retention(retain_days=args.retain_days, rollup_every=args.rollup_every, max_age_days=args.max_age_days)
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return EXIT_USAGE
    try:
        if args.forward_ga4:
            secret = os.environ.get(VARIABLES.ga4_api_secret, "")
            if not secret:
                print_error(args.collector_prog, f"--forward-ga4 needs ${VARIABLES.ga4_api_secret}")
                return EXIT_USAGE
            forward = GA4Forwarder(
                measurement_id=args.forward_ga4, api_secret=secret, endpoint=args.ga4_endpoint or GA4_ENDPOINT
            )
        server = serve(
            db,
            host=args.host,
            port=args.port,
            forward=forward,
            policy=accept,
            limits=keep,
            publishing=_publishing(args),
            retention=retain,
            retired=args.retired,
        )
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return 1
    except OSError as exc:
        print_error(args.collector_prog, f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    if not is_loopback(args.host):
        print_error(
            args.collector_prog,
            "the embedded server speaks plain HTTP and clients send to other machines over "
            "HTTPS only; put a TLS proxy in front of it (without access logs, which would record addresses).",
        )
    if args.retired:
        print_error(
            args.collector_prog,
            "retired: every batch is answered 410 Gone, and each client that receives it stops reporting here "
            "for good and deletes its queue; POST /v1/forget and the public numbers keep working.",
        )
    try:
        print(f"listening on {server.url}", flush=True)  # a closed pipe here still stops the server
        with _signals_stop(server.request_stop):
            server.serve_forever()
    except KeyboardInterrupt:  # before the handler was installed, or not the main thread
        pass
    finally:
        server.stop()
    counts = server.app.counters.as_dict()
    print(
        f"stopped after {counted(counts['requests'], 'request')}: {counted(counts['accepted'], 'event')} stored, "
        f"{counted(counts['duplicates'], 'duplicate')}, {counted(counts['rejected'], 'request')} refused, "
        f"{counted(counts['refused'], 'event')} refused",
        flush=True,
    )
    return 0


@contextlib.contextmanager
def _signals_stop(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop`` (which only sets a flag) while the block runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _Failure:
    """A ``with`` block of a command whose :class:`~._common.CollectorError` (a database that cannot be opened, read
    or written) is the command's error line: printed, then :attr:`failed`, and the command exits 1. Entered as
    ``with failure, contextlib.closing(open_store(...)) as store:``, it also takes the error of the opening."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.failed = False

    def __enter__(self) -> _Failure:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if not isinstance(exc, CollectorError):
            return False
        print_error(self.args.collector_prog, f"{exc}")
        self.failed = True
        return True


def cmd_migrate(args: argparse.Namespace) -> int:
    from . import open_store

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    failure = _Failure(args)
    with failure:
        before = _existing_version(db)
        with contextlib.closing(open_store(db, create=True)) as store:
            after = store.schema_version()
            where = store.display
            if args.first_week:
                store.set_first_week(args.first_week)
            first = store.first_week()
    if failure.failed:
        return 1
    if before == after:
        print(f"{where}: schema {after}, up to date")
    elif before is None:
        print(f"{where}: created, schema {after}")
    else:
        print(f"{where}: migrated from schema {before} to {after}")
    print(f"public releases start with week {first}")
    return 0


def cmd_rollup(args: argparse.Namespace) -> int:
    import time

    from . import open_store
    from ._config import policy, retention
    from ._rollup import rollup

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    try:
        accept = policy(max_age_days=args.max_age_days)
        keep = retention(retain_days=args.retain_days, max_age_days=args.max_age_days)
    except CollectorError as exc:
        print_error(args.collector_prog, f"{exc}")
        return EXIT_USAGE
    failure = _Failure(args)
    # create: the roll-up tables are schema 3, so an older database is migrated
    with failure, contextlib.closing(open_store(db, create=True)) as store:
        publishing = Publishing(epsilon=args.epsilon)
        done = rollup(store, now=time.time(), max_age=accept.max_age, retention=keep, publishing=publishing)
        where = store.display
    if failure.failed:
        return 1
    if not done.ran:
        print(f"{where}: another process is rolling up; nothing done here")
        return 0
    closed = done.closed_through or "none yet"
    rolled = f" ({done.rolled[0]} to {done.rolled[-1]})" if done.rolled else ""
    print(
        f"{where}: closed through {closed}; {counted(len(done.rolled), 'week')} rolled up{rolled}; "
        f"{counted(done.deleted, 'event')} older than {args.retain_days:g} days deleted"
    )
    if done.released:
        print(done.released_publicly())
    if done.release_error:
        print_error(args.collector_prog, f"no public release made: {done.release_error}")
        return 1
    return 0


def _existing_version(db: str) -> int | None:
    """The schema version of an existing database, or ``None`` if it has no collector tables yet."""
    from . import open_store

    try:
        store = open_store(db, create=False)
    except NotACollectorDatabase:
        return None
    try:
        return store.schema_version() or 1
    finally:
        store.close()


def _public_text(doc: Mapping[str, Any]) -> str:
    """The released numbers as text: estimate ± margin per period, "<N" below the display threshold."""

    def show(number: dict[str, int]) -> str:
        if "fewer_than" in number:
            return f"<{number['fewer_than']}"
        return str(number["estimate"])

    lines = [
        f"{doc['app']}: released with differential privacy, epsilon {doc['epsilon']:g} per developer per period; "
        f"licence {doc['licence']}"
    ]
    for _unit, key in (("week", "weeks"), ("month", "months"), ("quarter", "quarters"), ("year", "years")):
        items = doc[key]
        if not items:
            continue
        lines.append(f"{key}:")
        for item in items:
            name = item[key[:-1]]
            line = f"  {name}  {item['release']:<11}  {show(item['developers'])} developers (±{item['margin']})"
            if key == "weeks":
                for breakdown in ("by_django", "by_python", "by_os"):
                    shown = [f"{v}: {show(n)}" for v, n in item[breakdown].items() if "fewer_than" not in n]
                    line += f"; {', '.join(shown) or '-'}"
            lines.append(line)
    if len(lines) == 1:
        lines.append("nothing released yet: a week is released once it has ended (see the self-hosting docs)")
    return "\n".join(lines)


def _text(stats: Stats, db: str) -> str:
    weeks = len(stats.weeks)
    head = (
        f"{stats.app}: {counted(stats.developers, 'developer')}, {counted(stats.events, 'event')}, "
        f"{counted(weeks, 'week')} with events ({db})"
    )
    lines = [head]
    if not stats.weeks:
        return lines[0]

    def fmt(counts: dict[str, int]) -> str:
        return ", ".join(f"{name}: {n}" for name, n in counts.items()) or "-"

    rows = [("week", "developers", "events", stats.app, "Python", "OS")]
    rows += [
        (w.week, str(w.developers), str(w.events), fmt(w.by_django), fmt(w.by_python), fmt(w.by_os))
        for w in stats.weeks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in (1, 2) else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    folder = path.parent if str(path.parent) else Path()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # a report is for sharing; mkstemp's 0600 would surprise a web server
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_page(args: argparse.Namespace, path: Path, text: str) -> bool:
    """Write ``stats --html``'s page; say why not (``False``) when it cannot be written."""
    try:
        _write_atomic(path, text)
    except OSError as exc:
        print_error(args.collector_prog, f"cannot write {path}: {exc}")
        return False
    return True


def cmd_stats(args: argparse.Namespace) -> int:
    from . import open_store, public, render_html, stats
    from ._public_page import render_public
    from ._stats import apps

    db = _db(args)
    if db is None:
        return EXIT_USAGE
    if args.public:
        failure = _Failure(args)
        with failure:
            doc = public(db, publishing=_publishing(args)._replace(app=args.app))
        if failure.failed:
            return 1
        if args.html is not None and not _write_page(args, args.html, render_public(doc)):
            return 1
        print(json.dumps(doc, indent=2, ensure_ascii=False) if args.json else _public_text(doc))
        if args.html is not None and not args.json:
            print(f"page written to {args.html}")
        return 0
    failure = _Failure(args)
    with failure, contextlib.closing(open_store(db, create=False)) as store:
        full = stats(store, app=args.app)
        others = {} if full.events else {k: v for k, v in apps(store).items() if k != args.app}
        where = store.display
    if failure.failed:
        return 1
    result = full
    if args.html is not None and not _write_page(args, args.html, render_html(result)):
        return 1
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    else:
        print(_text(result, where))
        if others:
            names = ", ".join(f"{name} ({counted(n, 'event')})" for name, n in others.items())
            print(f"other applications in this database: {names}; choose one with --app")
        if full.refused:
            total = sum(sum(r.values()) for r in full.refused.values())
            print(f"refused: {counted(total, 'event')}")
            for week, reasons in full.refused.items():
                print(f"  {week}  " + ", ".join(f"{reason}: {n}" for reason, n in reasons.items()))
        if args.html is not None:
            print(f"report written to {args.html}")
    return 0


BODIES: Final[Mapping[str, Callable[[argparse.Namespace], int]]] = {
    "serve": cmd_serve,
    "stats": cmd_stats,
    "migrate": cmd_migrate,
    "rollup": cmd_rollup,
}
"""Each command's body, by its name: what ``args.func`` (set by :mod:`._cli`) runs."""
