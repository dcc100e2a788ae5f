"""What a forget costs the other clients on SQLite: how long it holds the write lock, and what that does to a
normal client's batch latency, before (one delete per week) and after (chunks of ``FORGET_CHUNK`` rows).

A real SQLite store (``synchronous=FULL``, on this machine's temporary folder) is loaded with ``--events``
events of 20,000 client ids in two open ISO weeks. Then, in interleaved phases of ``--seconds`` each, one thread
sends a normal client's batches (5 events each, one store call each, as ``POST /v1/batch`` makes) back to back
and records each one's latency, while another thread does nothing (``none``), runs forgets of clients with
events the way the collector did before (``week``: one ``DELETE ... WHERE week = ? AND client_id = ?`` per week,
each one write transaction: the whole week is read through the index on week), or runs the collector's
``Store.forget`` (``chunked``). Each forget thread's write transactions are timed where they hold the lock.

Figures: per strategy, the batches' median, p99 and maximum latency, the forgets' median duration, and the
longest write transaction of a forget, and the batches that waited past the store's lock wait (2 s: answered
``503``). Budgets, asserted with a tolerance for a noisy 2-core machine: the
p99 chunked transaction stays under :data:`HOLD_BUDGET_MS`, and the batches' p99 under chunked forgets
stays within :data:`P99_SLACK_MS` of their p99 with no forget at all, measured side by side.

    python benchmarks/bench_forget.py [--events 500000] [--seconds 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
try:
    import spool_reporter.collector  # noqa: F401 - installed (nox -s bench)?
except ImportError:
    sys.path.insert(0, str(REPO))  # from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import percentile, publish  # noqa: E402

from spool_reporter.collector._common import COLUMNS, Unavailable  # noqa: E402
from spool_reporter.collector._sqlite import SQLiteStore  # noqa: E402
from spool_reporter.collector._weeks import week_of_valid  # noqa: E402

HOLD_BUDGET_MS = 10.0
"""The p99 write transaction of a chunked forget (a chunk examines FORGET_CHUNK rows: about a millisecond)."""
P99_SLACK_MS = 25.0
"""How much a stream of chunked forgets may add to a normal client's p99 batch latency."""
DAYS = ("2026-12-29", "2027-01-04")
CLIENTS = 20_000


def _row(client: str, day: str) -> tuple[str, ...]:
    values = {
        "event_id": str(uuid.uuid4()), "event": "runserver", "app": "Django", "app_version": "5.2",
        "python": "CPython", "python_version": "3.12", "os": "Linux", "os_release": "6.1", "arch": "x86_64",
        "client_id": client, "time": f"{day}T10:00:00Z", "week": week_of_valid(day),
    }  # fmt: skip
    return tuple(values[c] for c in COLUMNS)


def load(store: SQLiteStore, events: int) -> list[str]:
    """``events`` events of CLIENTS ids over two weeks, written in one transaction with the per-client rows the
    inserts would have made (``client_weeks``, ``client_apps``); the ids."""
    clients = [str(uuid.uuid4()) for _ in range(CLIENTS)]
    rows = [_row(clients[k % CLIENTS], DAYS[k % 2]) for k in range(events)]
    weeks: dict[tuple[str, str], int] = {}
    for row in rows:
        weeks[(row[9], row[11])] = weeks.get((row[9], row[11]), 0) + 1
    spans = [(c, "Django", week_of_valid(DAYS[0]), week_of_valid(DAYS[1])) for c in clients]
    with store.connection() as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", rows)
        conn.executemany(
            "INSERT INTO client_weeks (client_id, week, n) VALUES (?, ?, ?)", [(*k, n) for k, n in weeks.items()]
        )
        conn.executemany("INSERT INTO client_apps (client_id, app, first_week, last_week) VALUES (?, ?, ?, ?)", spans)
        conn.execute("COMMIT")
    return clients


def run_phase(store: SQLiteStore, strategy: str, victims: list[str], seconds: float) -> dict[str, list[float]]:
    latencies: list[float] = []
    forgets: list[float] = []
    holds: list[float] = []
    unavailable: list[float] = []
    stop = threading.Event()
    forget_thread_ident: list[int] = []
    original = store._in_transaction

    def timed(work):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return original(work)
        finally:
            if forget_thread_ident and threading.get_ident() == forget_thread_ident[0]:
                holds.append(time.perf_counter() - started)

    store._in_transaction = timed  # type: ignore[method-assign]

    def forgetting() -> None:
        forget_thread_ident.append(threading.get_ident())
        while not stop.is_set() and victims:
            client = victims.pop()
            started = time.perf_counter()
            if strategy == "chunked":
                store.forget(client, until=time.time() + 86400)
            else:
                for day in DAYS:
                    week = week_of_valid(day)
                    store._write(
                        lambda conn, week=week, client=client: conn.execute(
                            "DELETE FROM events WHERE week = ? AND client_id = ?", (week, client)
                        )
                    )
            forgets.append(time.perf_counter() - started)

    normal = str(uuid.uuid4())
    thread = threading.Thread(target=forgetting) if strategy != "none" else None
    if thread:
        thread.start()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        rows = [_row(normal, DAYS[1]) for _ in range(5)]
        started = time.perf_counter()
        try:
            store.insert(rows)
        except Unavailable:  # waited past the lock wait: what the client gets is a 503
            unavailable.append(time.perf_counter() - started)
        latencies.append(time.perf_counter() - started)
    stop.set()
    if thread:
        thread.join(120)
    store._in_transaction = original  # type: ignore[method-assign]
    return {"latency": latencies, "forget": forgets, "hold": holds, "503": unavailable}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-forget-") as tmp:
        store = SQLiteStore(Path(tmp) / "c.sqlite3")
        try:
            started = time.perf_counter()
            victims = load(store, args.events)
            print(f"loaded {args.events} events of {CLIENTS} clients in {time.perf_counter() - started:.1f} s")
            kinds = ("latency", "forget", "hold", "503")
            results = {s: {k: list[float]() for k in kinds} for s in ("none", "week", "chunked")}
            for _ in range(args.rounds):  # interleaved: the machine's noise falls on every strategy alike
                for strategy in ("none", "week", "chunked"):
                    got = run_phase(store, strategy, victims, args.seconds)
                    for key, values in got.items():
                        results[strategy][key].extend(values)
        finally:
            store.close()
    rows = []
    for strategy, got in results.items():
        lat = [v * 1000 for v in got["latency"]]
        row = {
            "forget": strategy,
            "batches": len(lat),
            "batch p50 ms": round(statistics.median(lat), 2),
            "batch p99 ms": round(percentile(lat, 99), 2),
            "batch max ms": round(max(lat), 2),
            "batches answered 503": len(got["503"]),
            "forgets": len(got["forget"]),
            "forget p50 ms": round(statistics.median(got["forget"]) * 1000, 1) if got["forget"] else None,
            "hold p99 ms": round(percentile([v * 1000 for v in got["hold"]], 99), 2) if got["hold"] else None,
            "longest hold ms": round(max(got["hold"]) * 1000, 1) if got["hold"] else None,
        }
        rows.append(row)
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()))
    by = {r["forget"]: r for r in rows}
    hold = float(by["chunked"]["hold p99 ms"] or 0.0)
    slack = float(by["chunked"]["batch p99 ms"]) - float(by["none"]["batch p99 ms"])
    budgets = [
        {
            "what": f"p99 write transaction of a chunked forget ({args.events} events; longest: "
            f"{by['chunked']['longest hold ms']} ms, per-week delete {by['week']['longest hold ms']} ms)",
            "measured": f"{hold:.1f} ms",
            "budget": f"<= {HOLD_BUDGET_MS:g} ms",
            "ok": hold <= HOLD_BUDGET_MS,
        },
        {
            "what": "a normal client's p99 batch latency: chunked forgets minus none, side by side",
            "measured": f"{slack:+.1f} ms",
            "budget": f"<= {P99_SLACK_MS:g} ms",
            "ok": slack <= P99_SLACK_MS,
        },
    ]
    command = (
        f"python benchmarks/bench_forget.py --events {args.events} --seconds {args.seconds:g} --rounds {args.rounds}"
    )
    return 0 if publish("forget", command, rows, budgets) else 1


if __name__ == "__main__":
    sys.exit(main())
