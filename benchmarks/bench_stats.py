"""The public statistics request (``GET /v1/stats``: the weeks, the threshold, the JSON) served from the roll-up,
next to the same from raw rows, on SQLite and PostgreSQL, as the weeks shown grow.

**From the roll-up, at full size: 100,000 developers a week.** One week of raw events is generated (~133,000
events: each developer sends one or two, on one of 11 Django, 6 Python and 5 OS values, 4 % of them on two
Django versions that week), bulk-loaded (``executemany`` in one transaction on SQLite, ``COPY`` on
PostgreSQL) and rolled up by the collector's own ``rollup()``, which is timed: the weekly job. Its roll-up rows
are then copied to the weeks before it: a closed week's numbers depend on that week's events alone, so a
year of weeks costs one week to generate, and each copy holds what a real week of that size holds. The
request is timed through the WSGI application (``GET /v1/stats``, its cache off) with 4, 13, 26 and 52 weeks
rolled up. The one raw week stays stored beside them, as raw events do for the retention.

**From raw rows, at a size that fits in CI: 5,000 developers a week**, the same mix, for 4, 13, 26 and 52
weeks. At each size the request is timed reading every week from the raw events (what every report cost
before roll-ups, and what each open week still costs), then the weeks are rolled up and it is timed from the
roll-up: the two side by side at equal size, interleaved. The one raw week of 100,000 developers is also timed
before its roll-up: what one open week adds to a request at full size.

Budget (issue 14): at most 200 ms for 52 weeks x 100,000 developers from the roll-up, on each back end (the
median of the runs; measured far below it, so a noisy neighbour does not fail the run). The request's cost
must not grow with the events stored: the table shows it growing with the weeks shown only. A raw point
slower than a second is timed once: its median would cost minutes and tell nothing more.

PostgreSQL is a real server started here (``tests/pg.py``), with ``fsync`` off: only reads are timed, and
the loads would otherwise dominate the run.

    python benchmarks/bench_stats.py [--runs 7] [--raw-developers 5000]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BUDGET_MS = 200.0
"""Issue 14: the public statistics over 52 weeks x 100,000 developers a week, from the roll-up."""
FULL_DEVELOPERS = 100_000
WEEKS = (4, 13, 26, 52)
DJANGO = (("5.2", 30), ("6.0", 22), ("4.2", 20), ("5.1", 10), ("5.0", 7), ("3.2", 5), ("4.1", 2), ("4.0", 1.5),
          ("3.1", 1), ("2.2", 1), ("1.11", 0.5))  # fmt: skip
PYTHON = (("CPython", "3.12", 32), ("CPython", "3.11", 25), ("CPython", "3.13", 20), ("CPython", "3.10", 15),
          ("CPython", "3.9", 6), ("PyPy", "3.10", 2))  # fmt: skip
OS = (("Linux", 48), ("macOS", 32), ("Windows", 18), ("FreeBSD", 1.5), ("other", 0.5))
COMMANDS = (("runserver", 70), ("startapp", 20), ("startproject", 10))
LAST_MONDAY = datetime.datetime(2026, 10, 5, tzinfo=datetime.timezone.utc)  # 2026-W41: all weeks long closed


def _pick(rng: random.Random, table: tuple[tuple[object, ...], ...]) -> tuple[object, ...]:
    return rng.choices(table, weights=[float(row[-1]) for row in table])[0]  # type: ignore[arg-type]


def _week(monday: datetime.datetime) -> str:
    year, num, _ = monday.isocalendar()
    return f"{year:04d}-W{num:02d}"


def week_rows(rng: random.Random, monday: datetime.datetime, developers: int) -> list[tuple[str, ...]]:
    """One week's raw rows (the store's columns) for ``developers`` distinct developers."""
    week = _week(monday)
    start = monday.timestamp()
    rows = []
    for _ in range(developers):
        client = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        django = str(_pick(rng, DJANGO)[0])
        impl, pyver, _w = _pick(rng, PYTHON)
        os_name = str(_pick(rng, OS)[0])
        versions = [django, "6.0"] if rng.random() < 0.04 and django != "6.0" else [django]  # upgraded that week
        for k in range(1 if rng.random() < 0.66 else 2):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + rng.randrange(7 * 86400)))
            rows.append((
                str(uuid.UUID(int=rng.getrandbits(128), version=4)), str(_pick(rng, COMMANDS)[0]), "Django",
                versions[min(k, len(versions) - 1)], str(impl), str(pyver), os_name, "6.1", "x86_64", client,
                when, week,
            ))  # fmt: skip
    return rows


_DERIVED = (
    "INSERT INTO client_weeks (client_id, week, n) SELECT client_id, week, COUNT(*) FROM events WHERE week = ? "
    "GROUP BY 1, 2",
    "INSERT INTO client_apps (client_id, app, first_week, last_week) SELECT client_id, app, MIN(week), MAX(week) "
    "FROM events WHERE week = ? GROUP BY 1, 2 "
    "ON CONFLICT (client_id, app) DO UPDATE SET last_week = excluded.last_week",
)
"""What the collector's insert keeps beside the events (the weekly cap's counts, each developer's weeks)."""


def load(store: object, rows: list[tuple[str, ...]]) -> float:
    """Bulk-load one week's ``rows`` as the collector would have stored them; returns seconds."""
    from spool_reporter.collector._sqlite import SQLiteStore

    week = rows[0][11]
    t0 = time.perf_counter()
    if isinstance(store, SQLiteStore):
        with store.connection() as conn:
            conn.execute("BEGIN")
            conn.executemany(f"INSERT INTO events VALUES ({', '.join('?' * 12)})", rows)
            for statement in _DERIVED:
                conn.execute(statement, (week,))
            conn.execute("COMMIT")
    else:
        import psycopg

        from spool_reporter.collector._store import COLUMNS

        with psycopg.connect(store.url) as conn:  # type: ignore[attr-defined]
            with conn.cursor().copy(f"COPY events ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            for statement in _DERIVED:
                conn.execute(statement.replace("?", "%s"), (week,))
            conn.execute("ANALYZE events")  # what autovacuum does after a load this size
    return time.perf_counter() - t0


def copy_rollup(store: object, source: str, weeks: list[str]) -> None:
    """Give each of ``weeks`` the roll-up rows of the rolled-up week ``source``."""
    with store.reading() as reader:  # type: ignore[attr-defined]
        totals = reader.query(
            "SELECT app, developers, events, new_developers FROM rollup_weeks WHERE week = ?", (source,)
        )
        cells = reader.query("SELECT app, breakdown, value, n FROM rollup_cells WHERE week = ?", (source,))
    for week in weeks:
        # save_rollup() takes only the next closed week: write the copies as the roll-up writes its rows.
        from spool_reporter.collector._sqlite import SQLiteStore

        if isinstance(store, SQLiteStore):
            with store.connection() as conn:
                conn.execute("BEGIN")
                conn.executemany("INSERT INTO rollup_weeks VALUES (?, ?, ?, ?, ?)",
                                 [(a, week, d, n, f) for a, d, n, f in totals])  # fmt: skip
                conn.executemany("INSERT INTO rollup_cells VALUES (?, ?, ?, ?, ?)",
                                 [(a, week, b, v, n) for a, b, v, n in cells])  # fmt: skip
                conn.execute("COMMIT")
        else:
            import psycopg

            with psycopg.connect(store.url) as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
                cur.executemany("INSERT INTO rollup_weeks VALUES (%s, %s, %s, %s, %s)",
                                [(a, week, d, n, f) for a, d, n, f in totals])  # fmt: skip
                cur.executemany("INSERT INTO rollup_cells VALUES (%s, %s, %s, %s, %s)",
                                [(a, week, b, v, n) for a, b, v, n in cells])  # fmt: skip


def time_request(app: object, runs: int) -> list[float]:
    """``GET /v1/stats`` through the WSGI application, ``runs`` times; seconds each."""
    out = []
    seen: list[str] = []
    for _ in range(runs):
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/v1/stats", "wsgi.input": io.BytesIO(b"")}
        t0 = time.perf_counter()
        body = b"".join(app(environ, lambda status, headers: seen.append(status)))  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
        if seen[-1] != "200 OK" or not body.startswith(b"{"):
            raise AssertionError(seen[-1])
    return out


SLOW_S = 1.0
"""A raw request slower than this is timed once: its median would cost the run minutes and tell nothing more."""


def time_raw(store: object, runs: int) -> list[float]:
    """The same request's work (the weeks, the threshold, the JSON) reading every week from the raw events."""
    from spool_reporter.collector._public import publish_weeks
    from spool_reporter.collector._stats import weeks_of

    out: list[float] = []
    for _ in range(runs):
        if out and out[0] > SLOW_S:
            break
        t0 = time.perf_counter()
        with store.reading() as reader:  # type: ignore[attr-defined]
            weeks = weeks_of(reader, store, "Django", rollups=False)  # type: ignore[arg-type]
        json.dumps(publish_weeks("Django", weeks).as_dict()).encode("ascii")
        out.append(time.perf_counter() - t0)
    return out


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def p90(values: list[float]) -> float:
    return round(sorted(values)[int(0.9 * (len(values) - 1))] * 1000, 1)


def run_backend(backend: str, url: str, args: argparse.Namespace) -> tuple[list[dict[str, object]], dict[str, object]]:
    from spool_reporter.collector import Retention, make_app, open_store
    from spool_reporter.collector._rollup import rollup
    from spool_reporter.collector._wire import Policy

    rng = random.Random(14)
    mondays = [LAST_MONDAY - datetime.timedelta(weeks=k) for k in range(max(WEEKS) - 1, -1, -1)]  # oldest first
    rows_out: list[dict[str, object]] = []
    extra: dict[str, object] = {"backend": backend}

    # -- full size, from the roll-up --------------------------------------------------------------------------
    store = open_store(url)
    app = make_app(url, policy=Policy(clock=time.time), retention=Retention(rollup_every=0))
    app.public.ttl = 0.0  # every request computes: nothing cached
    try:
        full = week_rows(rng, mondays[-1], FULL_DEVELOPERS)
        extra["full_week_events"] = len(full)
        extra["full_week_load_s"] = round(load(store, full), 2)
        raw_week = time_raw(store, max(3, args.runs // 2))
        extra["full_week_raw_ms"] = ms(raw_week)
        rows_out.append({"backend": backend, "source": "raw", "developers_per_week": FULL_DEVELOPERS, "weeks": 1,
                         "events_stored": len(full), "ms": ms(raw_week), "p90_ms": p90(raw_week),
                         "runs": len(raw_week)})  # fmt: skip
        t0 = time.perf_counter()
        done = rollup(store, now=LAST_MONDAY.timestamp() + 60 * 86400, max_age=30 * 86400)
        extra["rollup_one_full_week_s"] = round(time.perf_counter() - t0, 2)
        assert done.rolled == (_week(mondays[-1]),), done
        shown = 1
        for weeks in WEEKS:
            copy_rollup(store, _week(mondays[-1]), [_week(m) for m in mondays[-weeks:-shown]])
            shown = weeks
            times = time_request(app, args.runs)
            rows_out.append({"backend": backend, "source": "roll-up", "developers_per_week": FULL_DEVELOPERS,
                             "weeks": weeks, "events_stored": len(full), "ms": ms(times), "p90_ms": p90(times),
                             "runs": len(times)})  # fmt: skip
    finally:
        app.store.close()
        store.close()

    # -- equal size, raw and rolled up, side by side -----------------------------------------------------------
    url2 = url if backend == "postgresql" else url.replace(".sqlite3", "-raw.sqlite3")
    if backend == "postgresql":
        url2 = args.pg.url("raw")
    store = open_store(url2)
    app = make_app(url2, policy=Policy(clock=time.time), retention=Retention(rollup_every=0))
    app.public.ttl = 0.0
    try:
        loaded = 0
        stored = 0
        for weeks in WEEKS:
            for monday in mondays[loaded:weeks]:
                rows = week_rows(rng, monday, args.raw_developers)
                load(store, rows)
                stored += len(rows)
            loaded = weeks
            raw = time_raw(store, 3)
            rollup(store, now=mondays[weeks - 1].timestamp() + 7 * 86400 + 30 * 86400 + 1, max_age=30 * 86400)
            rolled = time_request(app, args.runs)
            for source, times in (("raw", raw), ("roll-up", rolled)):
                rows_out.append({"backend": backend, "source": source, "developers_per_week": args.raw_developers,
                                 "weeks": weeks, "events_stored": stored, "ms": ms(times), "p90_ms": p90(times),
                                 "runs": len(times)})  # fmt: skip
    finally:
        app.store.close()
        store.close()
    return rows_out, extra


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed requests per point (median reported)")
    parser.add_argument("--raw-developers", type=int, default=5_000, help="developers a week of the raw series")
    args = parser.parse_args()
    try:
        import spool_reporter.collector  # noqa: F401 - installed (nox -s bench)?
    except ImportError:
        sys.path.insert(0, str(REPO))  # from a checkout
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "benchmarks"))
    import pg
    from _common import publish

    started = time.perf_counter()
    rows: list[dict[str, object]] = []
    extras: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="spool-bench-stats-") as tmp:
        backends = [("sqlite", os.path.join(tmp, "stats.sqlite3"))]
        try:
            args.pg = pg.server(fsync=False)
            backends.append(("postgresql", args.pg.url("stats")))
        except pg.Unavailable as exc:
            print(f"bench_stats: PostgreSQL skipped: {exc}", file=sys.stderr)
        for backend, url in backends:
            got, extra = run_backend(backend, url, args)
            rows += got
            extras.append(extra)
    wall = round(time.perf_counter() - started, 1)

    print("\nGET /v1/stats (weeks + threshold + JSON), in process; median of the runs, in ms")
    head = (
        ("backend", 11, "<"),
        ("from", 9, "<"),
        ("developers/week", 16, ">"),
        ("weeks", 7, ">"),
    )
    head += ("events stored", 15, ">"), ("ms", 9, ">"), ("p90 ms", 9, ">"), ("runs", 6, ">")
    print("".join(f"{name:{align}{width}}" for name, width, align in head))
    for r in rows:
        print(f"{r['backend']:<11}{r['source']:<9}{r['developers_per_week']:>16,}{r['weeks']:>7}"
              f"{r['events_stored']:>15,}{r['ms']:>9}{r['p90_ms']:>9}{r['runs']:>6}")  # fmt: skip
    for e in extras:
        print(f"{e['backend']}: one week of {FULL_DEVELOPERS:,} developers ({e['full_week_events']:,} events): "
              f"loaded in {e['full_week_load_s']} s, read raw in {e['full_week_raw_ms']} ms (what each open week "
              f"adds), rolled up in {e['rollup_one_full_week_s']} s (the weekly job)")  # fmt: skip
    print(f"wall time: {wall} s")
    budgets = []
    for backend in sorted({str(r["backend"]) for r in rows}):
        (point,) = [r for r in rows if r["backend"] == backend and r["source"] == "roll-up"
                    and r["developers_per_week"] == FULL_DEVELOPERS and r["weeks"] == max(WEEKS)]  # fmt: skip
        budgets.append({"what": f"GET /v1/stats, 52 weeks x 100,000 developers from the roll-up ({backend})",
                        "measured": f"{point['ms']} ms", "budget": f"<= {BUDGET_MS:g} ms",
                        "ok": float(point["ms"]) <= BUDGET_MS})  # type: ignore[arg-type]  # fmt: skip
    for e in extras:
        budgets.append({"what": f"roll-up of one week of 100,000 developers, the weekly job ({e['backend']})",
                        "measured": f"{e['rollup_one_full_week_s']} s", "budget": "not asserted", "ok": True,
                        "asserted": False})  # fmt: skip
    command = ("python benchmarks/bench_stats.py " + " ".join(sys.argv[1:])).strip()
    ok = publish("stats", command, rows, budgets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
