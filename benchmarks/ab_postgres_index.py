"""What schema 5's index on ``events (week, client_id)`` costs PostgreSQL ingest, against the index on ``week``
alone that it replaced, side by side: not part of ``nox -s bench`` (a one-off measurement for the design notes).

A throw-away PostgreSQL with ``fsync`` on (``tests/support/pg.py``); each round, for each index in turn, a fresh schema
takes ``--batches`` batches of 500 events of 2,000 client ids through the WSGI application in one thread (the
path of ``bench_collector.py``'s in-process figure). Prints each round's events per second and the ratio of
the medians.

    python benchmarks/ab_postgres_index.py [--rounds 7] [--batches 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(url: str, batches: int, index: str) -> int:
    """One measurement in this process: events per second."""
    import psycopg
    from _common import post_in_process

    from spool_reporter.collector import make_app

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    clients = [str(uuid.uuid4()) for _ in range(2000)]

    def event(client: str) -> dict[str, object]:
        return {
            "schema": 1, "event_id": str(uuid.uuid4()), "event": "runserver", "app": "Django", "app_version": "5.2",
            "python": "CPython", "python_version": "3.12", "os": "Linux", "os_release": "6.1", "arch": "x86_64",
            "user_agent": "Django/5.2 CPython/3.12 (Linux; x86_64)", "client_id": client, "time": stamp,
        }  # fmt: skip

    bodies = [
        json.dumps({"schema": 1, "events": [event(clients[(b * 500 + k) % 2000]) for k in range(500)]}).encode()
        for b in range(batches)
    ]
    app = make_app(url)
    try:
        if index == "week":  # the index schema 4 had
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE INDEX events_week ON events (week)")
                conn.execute("DROP INDEX events_week_client")
        return round(batches * 500 / post_in_process(app, bodies, "ab_postgres_index"))
    finally:
        app.store.close()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(child(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    from _common import throwaway_postgres

    pg = throwaway_postgres()

    server = pg.server(fsync=True)
    rates: dict[str, list[int]] = {"week": [], "week_client": []}
    for _ in range(args.rounds):  # interleaved: the machine's noise falls on both alike
        for index, values in rates.items():
            done = subprocess.run(
                [sys.executable, __file__, "--child", server.url(), str(args.batches), index],
                capture_output=True, text=True, check=False, timeout=600,
            )  # fmt: skip
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            values.append(int(done.stdout.strip()))
    for index, values in rates.items():
        print(f"  events (week{', client_id' if index == 'week_client' else ''}): {values} events/s")
    ratio = statistics.median(rates["week_client"]) / statistics.median(rates["week"])
    print(f"  median ratio, (week, client_id) over (week): {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
