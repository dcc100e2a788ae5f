"""Collector ingest throughput on loopback, and the server's peak memory.

The real command (``python -m spool_reporter.collector serve --port 0``) in its own process; several
client processes, each with its 500-event batches built beforehand, start together and post them as fast
as the server answers. Throughput is all events over the span from the first client's first request to
the last client's last answer. Peak RSS is the server's ``VmHWM`` (Linux), read before it stops.

Budget (issue 7): >= 20,000 events/s with batches. The best of a few rounds must meet it, and the
median must reach 75 % of it: a noisy 2-core machine running clients and server on the same cores can
lose a round to a neighbour, but not every round. Peak RSS budget: 64 MiB.

    python benchmarks/bench_collector.py [--clients 4] [--batches 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_EVENTS_PER_S = 20_000
"""Issue 7's ingest budget."""
MEDIAN_TOLERANCE = 0.75
"""The median round may fall this far below the budget on a noisy machine (the best round may not)."""
BUDGET_RSS_MIB = 64
"""Peak resident memory of the server process (Python + sqlite3 + wsgiref: ~25 MiB measured)."""
BATCH = 500
"""Events per request: the wire format's maximum, what the ``json`` transport sends."""
DEADLINE_S = 50.0
"""The whole benchmark gives up after this long (nox -s bench should stay under a minute)."""

REPO = Path(__file__).resolve().parent.parent


def _uid(*parts: object) -> str:
    b = bytearray(hashlib.blake2b(repr(parts).encode(), digest_size=16).digest())
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def client(host: str, port: int, who: str, batches: int) -> None:
    """Build the batches, say ready, wait for go, post them, print timings as JSON."""
    versions = ["4.2", "5.2", "6.0"]
    pythons = ["3.10", "3.11", "3.12", "3.13"]
    oses = [("Linux", "6.8"), ("macOS", "15"), ("Windows", "11")]
    bodies = []
    for b in range(batches):
        events = []
        for i in range(BATCH):
            dev = (hash(who) + i) % 997
            os_name, release = oses[dev % 3]
            version, py = versions[dev % 3], pythons[dev % 4]
            events.append(
                {
                    "schema": 1,
                    "event_id": _uid("event", who, b, i),
                    "event": ("startproject", "startapp", "runserver")[i % 3],
                    "app": "Django",
                    "app_version": version,
                    "python": "CPython",
                    "python_version": py,
                    "os": os_name,
                    "os_release": release,
                    "arch": "x86_64",
                    "user_agent": f"Django/{version} CPython/{py} ({os_name}; x86_64)",
                    "client_id": _uid("client", dev),
                    "time": f"2026-12-{1 + b % 28:02d}T08:15:48Z",
                }
            )
        bodies.append(json.dumps({"schema": 1, "events": events}, separators=(",", ":")).encode())
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    accepted = 0
    t0 = time.monotonic()
    for body in bodies:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("POST", "/v1/batch", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        conn.close()
        if response.status != 200:
            raise SystemExit(f"client {who}: HTTP {response.status} {answer[:200]!r}")
        accepted += json.loads(answer)["accepted"]
    t1 = time.monotonic()
    print(json.dumps({"t0": t0, "t1": t1, "accepted": accepted, "bytes": sum(map(len, bodies))}), flush=True)


def _readline(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            raise SystemExit("bench_collector: a process did not answer in time")
    return proc.stdout.readline()


def _peak_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _round(
    env: dict[str, str], host: str, port: int, *, clients: int, batches: int, tag: str, deadline: float
) -> dict[str, float]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--client", host, str(port), f"{tag}-{k}", str(batches)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for k in range(clients)
    ]
    try:
        for proc in procs:
            if _readline(proc, deadline).strip() != "ready":
                raise SystemExit("bench_collector: a client failed to start")
        for proc in procs:  # all clients are waiting on stdin: release them together
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(_readline(proc, deadline)) for proc in procs]
        for proc in procs:
            proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    span = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    events = clients * batches * BATCH
    accepted = sum(r["accepted"] for r in results)
    if accepted != events:
        raise SystemExit(f"bench_collector: {accepted} accepted of {events} sent")
    return {"events": events, "seconds": span, "rate": events / span, "mib": sum(r["bytes"] for r in results) / 2**20}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="concurrent client processes (default: 4)")
    parser.add_argument("--batches", type=int, default=20, help="500-event batches per client per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    deadline = time.monotonic() + DEADLINE_S

    env = dict(os.environ)
    try:
        import spool_reporter.collector  # noqa: F401 - installed (nox -s bench)?
    except ImportError:
        env["PYTHONPATH"] = str(REPO)  # from a checkout
        sys.path.insert(0, str(REPO))
    from spool_reporter.collector import stats

    with tempfile.TemporaryDirectory(prefix="bench-collector-") as tmp:
        db = Path(tmp) / "bench.sqlite3"
        server = subprocess.Popen(
            [sys.executable, "-m", "spool_reporter.collector", "serve", "--port", "0", "--db", str(db)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            line = _readline(server, deadline)
            url = line.split()[-1]  # "listening on http://127.0.0.1:PORT/v1/batch"
            host, port = url.split("/")[2].rsplit(":", 1)
            rounds = [
                _round(env, host, int(port), clients=args.clients, batches=args.batches, tag=f"r{r}", deadline=deadline)
                for r in range(args.rounds)
            ]
            rss = _peak_rss_mib(server.pid)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
            try:
                server.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
        stored = stats(db)
        total = sum(int(r["events"]) for r in rounds)
        if stored.events != total:
            raise SystemExit(f"bench_collector: {stored.events} events stored of {total}")

    rates = [r["rate"] for r in rounds]
    best, median = max(rates), statistics.median(rates)
    per_round = ", ".join(
        f"{r['rate']:,.0f}/s ({r['events']:,} events, {r['mib']:.1f} MiB in {r['seconds']:.2f} s)" for r in rounds
    )
    print(f"collector ingest, {args.clients} client processes x {args.batches} batches x {BATCH} events, loopback:")
    print(f"  rounds: {per_round}")
    print(f"  best {best:,.0f} events/s, median {median:,.0f} events/s (budget >= {BUDGET_EVENTS_PER_S:,}/s)")
    print(f"  stored {stored.events:,} events from {stored.developers:,} developers; cpus: {os.cpu_count()}")
    print(
        f"  server peak RSS: {'n/a (no /proc)' if rss is None else f'{rss:.1f} MiB'} (budget <= {BUDGET_RSS_MIB} MiB)"
    )
    ok = True
    if best < BUDGET_EVENTS_PER_S:
        print(f"FAIL: best round {best:,.0f}/s is under the budget {BUDGET_EVENTS_PER_S:,}/s")
        ok = False
    if median < BUDGET_EVENTS_PER_S * MEDIAN_TOLERANCE:
        print(f"FAIL: median {median:,.0f}/s is under {MEDIAN_TOLERANCE:.0%} of the budget")
        ok = False
    if rss is not None and rss > BUDGET_RSS_MIB:
        print(f"FAIL: peak RSS {rss:.1f} MiB is over {BUDGET_RSS_MIB} MiB")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
