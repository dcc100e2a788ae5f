"""What a hung destination costs ``django-spool disable``: nothing. ``disable`` leaves its forget to a detached run
(``spool_reporter/_withdraw.py``) and never waits on the network, so its wall time with a destination that accepts
connections and never answers equals its wall time with no destination at all (nothing to ask, nothing started).

Two modes, interleaved round by round (so that the machine's load hits both alike), each a real ``django-spool
disable`` process of this interpreter, from a user file with a client id and ``disable=0``:

* **none**: no destination is configured: ``disable`` writes ``disable=1``, empties the queue, and says that no
  collector can be asked;
* **hung**: the destination is a loopback listener that accepts and never answers: ``disable`` also writes
  ``forget.pending`` and starts the detached run, which waits for its deadline (3 s here: room for a detached
  interpreter at nice 19 to start on a busy machine) and backs off.

Each run is timed twice: wall time (start to exit), and the CPU time (user + system) of the reaped process from
the kernel's accounting (the detached run it starts is not its reaped child, so it is not counted). Before each
run the benchmark waits (untimed, bounded) for the previous detached run to end, so that none competes with a
measured process; it checks that every hung run did schedule the forget and that the listener saw it connect.

Budget (issue 31: "the same as with none"): the median wall time with the hung destination is at most
:data:`RATIO_BUDGET` times the median with none, a tolerance for a noisy 2-core machine and for what scheduling
costs (writing the record, one ``posix_spawn``: a few milliseconds of a ~150 ms command); the CPU-time ratio is
printed beside it.

    python benchmarks/bench_disable.py [--rounds 15] [--no-publish]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
try:
    import spool_reporter  # installed (nox -s bench)?
except ImportError:
    sys.path.insert(0, str(REPO))  # from a checkout
    import spool_reporter
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import SilentDestination, flusher_idle, percentile, publish, report  # noqa: E402

RATIO_BUDGET = 1.15
"""Median wall time of ``disable`` with a hung destination, over its median with none: "the same", within a
tolerance for the noise of a shared 2-core machine."""
DETACHED_WAIT_S = 30.0
"""How long the benchmark waits (untimed) for a detached run to end before the next measured run."""
MODES = ("none", "hung")


def _env(home: Path, endpoint: str | None) -> dict[str, str]:
    skip = ("DJANGO_ANALYTICS", "DJANGO_NO_ANALYTICS", "DO_NOT_TRACK", "CI", "SPOOL_REPORTER", "HTTP", "NO_PROXY")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(skip)}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_STATE_HOME=str(home / "state"),
        XDG_CONFIG_DIRS=str(home / "etc-xdg"),
        PYTHONPATH=str(Path(spool_reporter.__file__).resolve().parent.parent),
        SPOOL_REPORTER_FLUSH_DEADLINE="3",
        SPOOL_REPORTER_CONNECT_TIMEOUT="0.5",
        SPOOL_REPORTER_READ_TIMEOUT="0.5",
    )
    if endpoint is not None:
        env["DJANGO_ANALYTICS_ENDPOINT"] = endpoint
    return env


def _reset(home: Path) -> None:
    """A user who has reporting on and a client id, and no forget pending."""
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "djangoanalytics").write_text(f"client_id={uuid.uuid4()}\ndisable=0\n")
    (home / "state" / "spool_reporter" / "django" / "forget.pending").unlink(missing_ok=True)


def _wait_idle(home: Path) -> None:
    deadline = time.monotonic() + DETACHED_WAIT_S
    while not flusher_idle(home / "state" / "spool_reporter" / "django"):
        if time.monotonic() > deadline:
            raise SystemExit("a detached run did not end in time")
        time.sleep(0.05)


def _disable(env: dict[str, str]) -> tuple[float, str]:
    """One ``django-spool disable``: (wall ms, stdout)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spool_reporter.cli", "disable"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=60)
    wall = (time.perf_counter() - started) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"disable failed: {err.decode(errors='replace')}")
    return wall, out.decode()


def _run_once(env: dict[str, str]) -> tuple[float, float, str]:
    """One run: (wall ms, CPU ms of the reaped process, stdout). The CPU time is this process's children's
    accounting taken around the run: communicate() reaped it, and the detached run is not our child."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, out = _disable(env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-publish", action="store_true", help="print only; leave docs/_generated alone")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-disable-"))
    hung = SilentDestination()
    try:
        homes = {mode: root / mode for mode in MODES}
        envs = {
            "none": _env(homes["none"], None),
            "hung": _env(homes["hung"], f"http://127.0.0.1:{hung.port}/v1/batch"),
        }
        wall: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        for mode in MODES:  # warm-up, untimed: the first run of each compiles nothing twice
            _reset(homes[mode])
            _run_once(envs[mode])
            _wait_idle(homes[mode])
        for n in range(args.rounds):
            order = MODES if n % 2 == 0 else MODES[::-1]
            for mode in order:
                _wait_idle(homes["hung"])  # first: a detached run still starting would find its record deleted
                _reset(homes[mode])
                w, c, out = _run_once(envs[mode])
                if mode == "hung" and "a background process sends that one request now" not in out:
                    raise SystemExit(f"the hung run scheduled no forget: {out}")
                wall[mode].append(w)
                cpu[mode].append(c)
        _wait_idle(homes["hung"])
        if hung.accepted < args.rounds:
            raise SystemExit(f"the detached runs connected {hung.accepted} times, fewer than {args.rounds} rounds")
    finally:
        hung.close()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(root)
    med = {m: statistics.median(wall[m]) for m in MODES}
    cpu_med = {m: statistics.median(cpu[m]) for m in MODES}
    ratio = med["hung"] / med["none"]
    cpu_ratio = cpu_med["hung"] / cpu_med["none"] if cpu_med["none"] else float("nan")
    print(f"django-spool disable, {args.rounds} rounds interleaved (ms):")
    for m in MODES:
        print(f"  {m:5} wall median {med[m]:7.1f}  p90 {percentile(wall[m], 90):7.1f}  cpu median {cpu_med[m]:7.1f}")
    print(f"  ratio hung/none: wall {ratio:.3f}, cpu {cpu_ratio:.3f}")
    figures = {
        "rounds": args.rounds,
        "wall_median_ms": {m: round(med[m], 1) for m in MODES},
        "wall_p90_ms": {m: round(percentile(wall[m], 90), 1) for m in MODES},
        "cpu_median_ms": {m: round(cpu_med[m], 1) for m in MODES},
        "wall_ratio": round(ratio, 3),
        "cpu_ratio": round(cpu_ratio, 3),
    }
    budgets: list[dict[str, object]] = [
        {
            "what": "disable's median wall time, hung destination / none",
            "measured": round(ratio, 3),
            "budget": RATIO_BUDGET,
            "ok": ratio <= RATIO_BUDGET,
        }
    ]
    command = f"python benchmarks/bench_disable.py --rounds {args.rounds}"
    if args.no_publish:
        return 0 if report(budgets) else 1
    return 0 if publish("disable", command, figures, budgets) else 1


if __name__ == "__main__":
    sys.exit(main())
