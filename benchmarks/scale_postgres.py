"""What one PostgreSQL costs per request, per event and per week: the figures behind "where one PostgreSQL gives
out" in ``docs/design-notes.md``. Run by hand, one part at a time; not part of ``nox -s bench`` (it loads
millions of rows and asserts nothing).

``ingest``: gunicorn (2 workers x 4 threads, as ``bench_collector.py``) on a real PostgreSQL (``tests/support/pg.py``,
``fsync`` on), four client processes posting batches of ``--events`` events, **one client id per request and a
new connection per request**, as a flusher does. Besides requests/s and events/s it reads what each request cost
whom: CPU seconds of the PostgreSQL server's processes and of gunicorn's (``/proc``, children included), WAL
bytes (``pg_current_wal_lsn``), WAL syncs (``pg_stat_wal``) and commits, and the table's bytes per event after
the load (``pg_total_relation_size``). A first round warms up and is followed by ``ANALYZE``: before its first
statistics a fresh ``events`` table gets a cached generic plan that scans it for every "which ids are known"
query, which made the first rounds many times as costly (``--cold`` shows it). ``--preload N`` stores an older week of N
developers first (``bench_stats.load``), to see whether a request costs more in a larger table.

``week``: one ISO week of ``--developers`` developers with ``--per-developer`` events each (``0``: the mix of
``bench_stats.py``, one or two), bulk-loaded with ``bench_stats.load``; then, each in a child process (its peak
RSS is its own ``VmHWM``): the roll-up that makes the week's provisional release, and the one a month later that
closes it (roll-up rows, final release); the parts of the closing timed alone; a ``forget`` of one client id;
the retention's ``delete_expired`` loop over the whole week and the ``VACUUM`` after it, against ``DETACH
PARTITION ... CONCURRENTLY`` + ``DROP TABLE`` of the same week as a partition (primary key ``(event_id,
week)``); and the bytes per event of both layouts.

``plan``: ``EXPLAIN ANALYZE`` of one retention chunk (``delete_expired``'s statement, 20,000 events) on four
weeks of ``--developers`` developers, the oldest expired and rolled up.

    python benchmarks/scale_postgres.py ingest --events 1 --requests 1500 [--preload 1000000] [--cold]
    python benchmarks/scale_postgres.py week --developers 100000 [--per-developer 20]
    python benchmarks/scale_postgres.py plan --developers 200000
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import spool_reporter.collector  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO))

TICK = os.sysconf("SC_CLK_TCK")
MAX_AGE = 30 * 86400.0


# -- CPU of a process tree, WAL ------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` (with its reaped children) and of its live children."""
    fields = _stat(root)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    try:
        with open(f"/proc/{root}/task/{root}/children", encoding="ascii") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        kids = []
    for pid in kids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return total / TICK


def postmaster(server: object) -> int:
    return int((Path(server.root) / "data" / "postmaster.pid").read_text().split()[0])  # type: ignore[attr-defined]


def wal(url: str) -> dict[str, float]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        lsn, syncs, writes, fpi = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), wal_sync, wal_write, wal_fpi FROM pg_stat_wal"
        ).fetchone()
        (commits,) = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return {
        "bytes": float(lsn),
        "syncs": float(syncs),
        "writes": float(writes),
        "fpi": float(fpi),
        "commits": float(commits),
    }


def sizes(url: str, table: str = "events") -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT COUNT(*), pg_total_relation_size('{table}'), pg_relation_size('{table}'), "
            f"pg_indexes_size('{table}') FROM {table}"
        ).fetchone()
        out = {"rows": row[0], "total": row[1], "heap": row[2], "indexes": row[3]}
        indexes = (
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = %s::regclass"
        )
        for name, size in conn.execute(indexes, (table,)):
            out[f"index {name.rsplit('.', 1)[-1]}"] = size
        for other in ("client_weeks", "client_apps"):
            n, size = conn.execute(f"SELECT COUNT(*), pg_total_relation_size('{other}') FROM {other}").fetchone()
            out[f"{other}_rows"], out[f"{other}_total"] = n, size
    return out


# -- ingest ------------------------------------------------------------------------------------------------


def _events(n: int, now: float, rng: random.Random) -> list[dict[str, object]]:
    client = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    version, py = rng.choice(["4.2", "5.2", "6.0"]), rng.choice(["3.10", "3.11", "3.12", "3.13"])
    os_name, release = rng.choice([("Linux", "6.8"), ("macOS", "15"), ("Windows", "11")])
    return [
        {"schema": 1, "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
         "event": rng.choices(("runserver", "startapp", "startproject"), (70, 20, 10))[0], "app": "Django",
         "app_version": version, "python": "CPython", "python_version": py, "os": os_name, "os_release": release,
         "arch": "x86_64", "user_agent": f"Django/{version} CPython/{py} ({os_name}; x86_64)", "client_id": client,
         "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - rng.randrange(86_000)))}
        for _ in range(n)
    ]  # fmt: skip


def client(port: int, seed: str, requests: int, per_request: int) -> None:
    rng = random.Random(seed)
    now = time.time()
    bodies = [json.dumps({"schema": 1, "events": _events(per_request, now, rng)}).encode() for _ in range(requests)]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    from _common import post_over_http

    t0 = time.monotonic()
    accepted = post_over_http("127.0.0.1", port, bodies, "scale_postgres client")  # a flusher's requests
    print(json.dumps({"t0": t0, "t1": time.monotonic(), "accepted": accepted}), flush=True)


def ingest(args: argparse.Namespace) -> dict[str, object]:
    from _common import throwaway_postgres
    from bench_collector import Collector, _readline

    server = throwaway_postgres().server(fsync=True)
    url = server.url("ingest")
    deadline = time.monotonic() + 900
    env = dict(os.environ)
    if args.preload:  # an older week already stored, as the collector's insert would have left it
        import bench_stats

        from spool_reporter.collector import open_store

        store = open_store(url)
        monday = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(weeks=3)
        bench_stats.load(store, bench_stats.week_rows(random.Random(7), monday, args.preload))
        store.close()
    c = Collector("pg gunicorn", backend="postgresql", server="gunicorn", db=url, env=env, deadline=deadline)
    rounds = []
    try:
        # Round -1 warms up, then ANALYZE: no plan made for an empty table (--cold: neither).
        for r in range(0 if args.cold else -1, args.rounds):
            if r == 0 and not args.cold:
                import psycopg

                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("ANALYZE")
            procs = [
                subprocess.Popen([sys.executable, __file__, "client", str(c.port), f"{r}-{k}", str(args.requests),
                                  str(args.events)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for k in range(args.clients)
            ]  # fmt: skip
            for p in procs:
                assert _readline(p, deadline).strip() == "ready"
            pg0, gu0, wal0 = tree_cpu(postmaster(server)), tree_cpu(c.proc.pid), wal(url)
            for p in procs:
                p.stdin.write("go\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
            results = [json.loads(_readline(p, deadline)) for p in procs]
            cl = 0.0
            for p in procs:
                _, _, usage = os.wait4(p.pid, 0)
                cl += usage.ru_utime + usage.ru_stime
            pg1, gu1 = tree_cpu(postmaster(server)), tree_cpu(c.proc.pid)
            time.sleep(11)  # an idle backend flushes its statistics within 10 s (pg_stat_wal, pg_stat_database)
            wal1 = wal(url)
            span = max(x["t1"] for x in results) - min(x["t0"] for x in results)
            n = args.clients * args.requests
            assert sum(x["accepted"] for x in results) == n * args.events
            if r < 0:
                continue
            rounds.append({
                "requests_per_s": n / span, "events_per_s": n * args.events / span,
                "pg_cpu_ms_per_request": (pg1 - pg0) / n * 1000, "gunicorn_cpu_ms_per_request": (gu1 - gu0) / n * 1000,
                "client_cpu_ms_per_request": cl / n * 1000,
                "wal_bytes_per_request": (wal1["bytes"] - wal0["bytes"]) / n,
                "wal_syncs_per_request": (wal1["syncs"] - wal0["syncs"]) / n,
                "commits_per_request": (wal1["commits"] - wal0["commits"]) / n,
            })  # fmt: skip
    finally:
        c.stop()
    out: dict[str, object] = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    out["rounds"] = [{k: round(v, 2) for k, v in r.items()} for r in rounds]
    s = sizes(url)
    out["sizes"] = s
    out["bytes_per_event"] = round(s["total"] / s["rows"], 1)
    return out


# -- one week ----------------------------------------------------------------------------------------------


def week_rows(rng: random.Random, monday: datetime.datetime, developers: int, per: int) -> list[tuple[str, ...]]:
    import bench_stats

    if not per:
        return bench_stats.week_rows(rng, monday, developers)
    week = bench_stats.week_name(monday)
    days = [(monday + datetime.timedelta(days=d)).strftime("%Y-%m-%d") for d in range(7)]
    tables = [bench_stats.DJANGO, bench_stats.PYTHON, bench_stats.OS]
    draws = [rng.choices(t, weights=[float(x[-1]) for x in t], k=developers) for t in tables]
    commands = [str(c[0]) for c in bench_stats.COMMANDS]
    weights = [float(c[1]) for c in bench_stats.COMMANDS]
    rows = []
    for (django, _), (impl, pyver, _), (os_name, _) in zip(*draws, strict=True):
        client = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        for event in rng.choices(commands, weights=weights, k=per):
            rows.append((str(uuid.UUID(int=rng.getrandbits(128), version=4)), event, "Django", str(django), str(impl),
                         str(pyver), str(os_name), "6.1", "x86_64", client, rng.choice(days), week))  # fmt: skip
    return rows


CHILD_ROLLUP = """
import json, sys, time
from spool_reporter.collector import open_store
from spool_reporter.collector._rollup import rollup
from spool_reporter.collector._common import Retention
store = open_store(sys.argv[1])
t0 = time.perf_counter()
done = rollup(store, now=float(sys.argv[2]), max_age=30 * 86400.0, retention=Retention())
print(json.dumps({"seconds": time.perf_counter() - t0, "rolled": done.rolled,
                  "released": [[r.period, r.kind] for r in done.released], "error": done.release_error,
                  "hwm": [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]}))
store.close()
"""

CHILD_PARTS = """
import datetime, json, sys, time
from spool_reporter.collector import open_store, _release, _rollup
store = open_store(sys.argv[1])
week = sys.argv[2]
monday = datetime.date.fromisocalendar(int(week[:4]), int(week[6:]), 1)
out = {}
def timed(name, call):
    with store.reading() as reader:
        t0 = time.perf_counter()
        call(reader)
        out[name] = time.perf_counter() - t0
timed("distinct_weeks", lambda r: r.query("SELECT DISTINCT week FROM events WHERE week > ? AND week <= ?", ("", week)))
timed("aggregate", lambda r: _rollup._aggregate(r, week))
timed("week_counts", lambda r: _release.week_counts(r, "Django", week))
timed("period_developers", lambda r: _release.period_developers(r, "Django", monday, monday + datetime.timedelta(6)))
out["hwm"] = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps(out))
store.close()
"""


def child(code: str, *argv: str, server: object) -> tuple[dict[str, object], float, float, float]:
    """Run ``code``; (its JSON, wall seconds, its peak RSS in MiB, the PostgreSQL server's CPU seconds meanwhile).

    The peak RSS is the child's own ``VmHWM`` (``wait4``'s ``ru_maxrss`` would include the parent's pages it
    shared between the fork and the exec)."""
    pg0 = tree_cpu(postmaster(server))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()  # type: ignore[union-attr]
    status = proc.wait()
    wall = time.perf_counter() - t0
    if status:
        raise SystemExit(f"child failed: {status}")
    result = json.loads(out)
    return result, wall, int(result.pop("hwm")) / 1024, tree_cpu(postmaster(server)) - pg0


def one_week(args: argparse.Namespace) -> dict[str, object]:
    import bench_stats
    import psycopg
    from _common import throwaway_postgres

    from spool_reporter.collector import open_store
    from spool_reporter.collector._intake import forget_until
    from spool_reporter.collector._rollup import DELETE_CHUNK

    server = throwaway_postgres().server(fsync=True)
    url = server.url("week")
    monday = datetime.datetime(2026, 10, 5, tzinfo=datetime.timezone.utc)
    week = bench_stats.week_name(monday)
    nxt = bench_stats.week_name(monday + datetime.timedelta(days=7))
    out: dict[str, object] = {"developers": args.developers, "per_developer": args.per_developer or "1-2"}
    rows = week_rows(random.Random(20), monday, args.developers, args.per_developer)
    clients = [rows[i][9] for i in (0, len(rows) // 3, 2 * len(rows) // 3)]
    store = open_store(url)
    store.set_first_week(week)
    out["load_s"] = round(bench_stats.load(store, rows), 2)
    out["events"] = len(rows)
    del rows
    store.close()
    out["sizes"] = sizes(url)
    s = out["sizes"]
    out["bytes_per_event"] = round(s["total"] / s["rows"], 1)  # type: ignore[index]

    now = (monday + datetime.timedelta(days=7, hours=1)).timestamp()
    for name, when in (("provisional", now), ("closing", now + MAX_AGE)):
        done, _, rss, pg_cpu = child(CHILD_ROLLUP, url, str(when), server=server)
        out[f"rollup_{name}"] = {
            "seconds": round(float(done["seconds"]), 2),  # type: ignore[arg-type]
            "peak_rss_mib": round(rss, 1),
            "pg_cpu_s": round(pg_cpu, 2),
            "released": done["released"],
            "rolled": done["rolled"],
        }
    parts, _, rss, _ = child(CHILD_PARTS, url, week, server=server)
    out["parts_s"] = {k: round(float(v), 2) for k, v in parts.items()}  # type: ignore[arg-type]
    out["parts_peak_rss_mib"] = round(rss, 1)

    with psycopg.connect(url, autocommit=True) as conn:  # the same week as a partition of a partitioned table
        conn.execute("CREATE TABLE ev_part (LIKE events INCLUDING DEFAULTS) PARTITION BY RANGE (week)")
        conn.execute("ALTER TABLE ev_part ADD PRIMARY KEY (event_id, week)")
        conn.execute("CREATE INDEX ON ev_part (client_id)")  # what a forget needs, in each partition
        conn.execute(f"CREATE TABLE ev_w PARTITION OF ev_part FOR VALUES FROM ('{week}') TO ('{nxt}')")
        conn.execute("INSERT INTO ev_part SELECT * FROM events")
        conn.execute("VACUUM ANALYZE ev_part")
        out["partition_sizes"] = sizes(url, "ev_w")

    store = open_store(url)
    took = []
    for cid in clients:
        t0 = time.perf_counter()
        store.forget(cid, until=forget_until(time.time(), MAX_AGE))
        took.append(time.perf_counter() - t0)
    out["forget_s"] = round(statistics.median(took), 3)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE ev_part")
        took = []
        for cid in clients:
            t0 = time.perf_counter()
            conn.execute("DELETE FROM ev_part WHERE week = %s AND client_id = %s::uuid", (week, cid))
            took.append(time.perf_counter() - t0)
        out["forget_partition_indexed_s"] = round(statistics.median(took), 4)

    before = (monday + datetime.timedelta(days=7)).strftime("%Y-%m-%d")
    w0, chunks = wal(url), []
    t0 = time.perf_counter()
    while True:
        t1 = time.perf_counter()
        n = store.delete_expired(through_week=week, before=before, limit=DELETE_CHUNK)
        chunks.append(time.perf_counter() - t1)
        if n < DELETE_CHUNK:
            break
    delete_s = time.perf_counter() - t0
    store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        t1 = time.perf_counter()
        conn.execute("VACUUM events")
        vacuum_s = time.perf_counter() - t1
    time.sleep(11)
    w1 = wal(url)
    out["delete"] = {
        "seconds": round(delete_s, 2),
        "chunks": len(chunks),
        "first_chunk_s": round(chunks[0], 3),
        "median_chunk_s": round(statistics.median(chunks), 3),
        "last_full_chunk_s": round(chunks[-2] if len(chunks) > 1 else chunks[0], 3),
        "vacuum_s": round(vacuum_s, 2),
        "wal_bytes_per_event": round((w1["bytes"] - w0["bytes"]) / int(out["events"]), 1),  # type: ignore[call-overload]
    }
    w0 = wal(url)
    with psycopg.connect(url, autocommit=True) as conn:
        t1 = time.perf_counter()
        conn.execute("ALTER TABLE ev_part DETACH PARTITION ev_w CONCURRENTLY")
        conn.execute("DROP TABLE ev_w")
        drop_s = time.perf_counter() - t1
    time.sleep(11)
    w1 = wal(url)
    out["drop_partition"] = {"seconds": round(drop_s, 3), "wal_bytes": round(w1["bytes"] - w0["bytes"])}
    return out


def plan(args: argparse.Namespace) -> dict[str, object]:
    """The plan of one retention chunk (``delete_expired``'s statement) on four weeks, the oldest expired."""
    import bench_stats
    import psycopg
    from _common import throwaway_postgres

    from spool_reporter.collector import open_store

    server = throwaway_postgres().server(fsync=True)
    url = server.url("plan")
    store = open_store(url)
    rng = random.Random(1)
    monday = datetime.datetime(2026, 10, 5, tzinfo=datetime.timezone.utc)
    for k in range(4):
        bench_stats.load(store, bench_stats.week_rows(rng, monday + datetime.timedelta(weeks=k), args.developers))
    store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE rollup_state SET closed_through = '2026-W44', rolled_through = '2026-W44'")
        conn.execute("ANALYZE")
        (events,) = conn.execute("SELECT COUNT(*) FROM events").fetchone()  # type: ignore[misc]
        conn.execute("BEGIN")
        explained = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM events WHERE event_id IN (SELECT event_id FROM events "
            "WHERE week <= %s AND time < %s AND week <= (SELECT rolled_through FROM rollup_state) LIMIT %s)",
            ("2026-W41", "2026-10-12", 20_000),
        )
        lines = [str(row[0]) for row in explained]
        conn.execute("ROLLBACK")
    print("\n".join(lines))
    return {"developers_per_week": args.developers, "events": events, "plan": lines}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("ingest")
    p.add_argument("--events", type=int, default=1, help="events per request (default 1)")
    p.add_argument("--requests", type=int, default=1500, help="requests per client process per round")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preload", type=int, default=0, help="developers of an older week stored first (1-2 events each)")
    p.add_argument("--cold", action="store_true", help="no warm-up round and no ANALYZE before the rounds")
    e = sub.add_parser("plan")
    e.add_argument("--developers", type=int, default=200_000, help="developers in each of the four weeks")
    w = sub.add_parser("week")
    w.add_argument("--developers", type=int, default=100_000)
    w.add_argument("--per-developer", type=int, default=0, help="events per developer (0: bench_stats' 1-2)")
    args = parser.parse_args()
    result = {"ingest": ingest, "plan": plan, "week": one_week}[args.part](args)
    result["command"] = "python benchmarks/scale_postgres.py " + " ".join(sys.argv[1:])
    result["cpus"] = os.cpu_count()
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
