"""The in-process record path: lock + append of one event, beside the raw ``flock + write`` floor.

Both are measured in the same run, interleaved in rounds, so machine noise hits them alike; the budget
(p50 <= 20 us, p99 <= 100 us on the development machine) is asserted on absolute figures *or* on the ratio to
the floor measured here, whichever is looser, so a slower or busier machine does not fail it spuriously.

    python benchmarks/bench_record.py [--rounds N] [--per-round N]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile, publish

from spool_reporter import record
from spool_reporter._hook import Folder, append, build_line, django_app

P50_BUDGET_US = 20.0  # MISSION.md: record() lock + append p50
P99_BUDGET_US = 100.0  # MISSION.md: record() lock + append p99
FLOOR_P50_US = 8.0  # DESIGN.md: raw flock + write p50 on the development machine
FLOOR_P99_US = 11.0  # DESIGN.md: raw flock + write p99 on the development machine
TOLERANCE = 1.5  # a noisy 2-core machine


def floor_once(lock_path: str, data_path: str, line: bytes) -> None:
    lfd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lfd, fcntl.LOCK_EX)
    fd = os.open(data_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, line)
    os.close(fd)
    os.close(lfd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=250)
    args = parser.parse_args()
    app = django_app("5.2")
    line = build_line(app, "startproject", "43325579-4ce9-4a2d-a152-0e993a4bb245", time.time())
    with tempfile.TemporaryDirectory() as tmp:
        floor_dir = Path(tmp, "floor")
        floor_dir.mkdir()
        lock_path, data_path = str(floor_dir / "lock"), str(floor_dir / "data")
        ours_dir = str(Path(tmp, "ours"))
        env = {
            "HOME": tmp,
            "XDG_CONFIG_HOME": f"{tmp}/cfg",
            "XDG_STATE_HOME": f"{tmp}/state",
            "XDG_CONFIG_DIRS": f"{tmp}/etc",
        }
        Path(tmp, "cfg").mkdir()
        # A destination (nothing is recorded without one) that starts no flusher: plain http to a named host.
        Path(tmp, "cfg", "djangoanalytics").write_text(
            "disable=0\nmax_events=100000000\nmax_bytes=1000000000\nendpoint=http://collector.invalid/v1/batch\n"
        )
        floor: list[float] = []
        ours: list[float] = []
        whole: list[float] = []
        clock = time.perf_counter
        for _ in range(args.rounds):
            for _ in range(args.per_round):
                t0 = clock()
                floor_once(lock_path, data_path, line)
                t1 = clock()
                with Folder(ours_dir, create=True) as folder:
                    append(folder, line, max_events=10**8, max_bytes=10**9)
                t2 = clock()
                record("startproject", app=app, environ=env)
                t3 = clock()
                floor.append((t1 - t0) * 1e6)
                ours.append((t2 - t1) * 1e6)
                whole.append((t3 - t2) * 1e6)
            # Keep files small and comparable: both sides start each round empty.
            os.unlink(data_path)
            for p in Path(ours_dir).glob("*.jsonl"):
                p.unlink()
            for p in Path(tmp, "state").rglob("*.jsonl"):
                p.unlink()
    fig = {
        "samples": len(floor),
        "floor_p50_us": round(percentile(floor, 50), 2),
        "floor_p99_us": round(percentile(floor, 99), 2),
        "append_p50_us": round(percentile(ours, 50), 2),
        "append_p99_us": round(percentile(ours, 99), 2),
        "record_p50_us": round(percentile(whole, 50), 2),
        "record_p99_us": round(percentile(whole, 99), 2),
    }
    fig["append_over_floor_p50"] = round(fig["append_p50_us"] / fig["floor_p50_us"], 2)
    fig["append_over_floor_p99"] = round(fig["append_p99_us"] / fig["floor_p99_us"], 2)
    print("record path (microseconds, interleaved, same run):")
    print(f"  raw flock+write floor  p50 {fig['floor_p50_us']:7.2f}  p99 {fig['floor_p99_us']:7.2f}")
    print(
        f"  lock + append (ours)   p50 {fig['append_p50_us']:7.2f}  p99 {fig['append_p99_us']:7.2f}"
        f"   ratio p50 {fig['append_over_floor_p50']:.2f}x  p99 {fig['append_over_floor_p99']:.2f}x"
    )
    print(
        f"  whole record() call    p50 {fig['record_p50_us']:7.2f}  p99 {fig['record_p99_us']:7.2f}"
        "   (consent files, client id, event, lock + append)"
    )
    # A budget holds if the absolute figure meets it, or if the ratio to the floor measured here meets the
    # ratio the budget implies on the development machine (budget / floor there), with the tolerance.
    p50_ratio_budget = P50_BUDGET_US / FLOOR_P50_US * TOLERANCE
    p99_ratio_budget = P99_BUDGET_US / FLOOR_P99_US * TOLERANCE
    budgets = [
        {
            "what": "lock + append p50",
            "measured": f"{fig['append_p50_us']} us ({fig['append_over_floor_p50']}x floor)",
            "budget": f"<= {P50_BUDGET_US} us or <= {p50_ratio_budget:.1f}x floor",
            "ok": fig["append_p50_us"] <= P50_BUDGET_US or fig["append_over_floor_p50"] <= p50_ratio_budget,
        },
        {
            "what": "lock + append p99",
            "measured": f"{fig['append_p99_us']} us ({fig['append_over_floor_p99']}x floor)",
            "budget": f"<= {P99_BUDGET_US} us or <= {p99_ratio_budget:.1f}x floor",
            "ok": fig["append_p99_us"] <= P99_BUDGET_US or fig["append_over_floor_p99"] <= p99_ratio_budget,
        },
    ]
    ok = publish("record", "python benchmarks/bench_record.py", fig, budgets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
