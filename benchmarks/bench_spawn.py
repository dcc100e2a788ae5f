"""What recording costs a plain Python command line (not Django), and what starting the flusher adds.

A tool that embeds spool_reporter calls ``record()`` once per command. Django has already imported
``subprocess``, ``threading`` and the rest by then; a small command line has not, so whatever the hook imports
to start the detached flusher is paid by the tool's user. This measures, in one bare virtual environment with the
built wheel, the wall time of one process running::

    from spool_reporter import App, record
    record("build", app=App(name="BenchTool", version="1.0", endpoint=URL), notice=True)

against ``python -c pass`` in the same environment, in four modes interleaved round by round (so that the
machine's load hits every mode alike), each round's difference to that round's ``python -c pass`` (paired):

* **steady**: the user's config exists and a flusher started less than a minute ago (no flusher is due);
* **start**: the same, but the spawn interval has passed: this run starts the detached flusher;
* **first**: a user's first run: no config file (the client id is created, the notice printed), no spool
  folder, and the flusher starts.

The destination is the App's default, a loopback sink answering 200; the benchmark waits for each started
flusher to finish (untimed) before the next run, so that no flusher competes with a measured process. Each run
is timed twice: wall time, and the CPU time (user + system) the process used, from the kernel's accounting of
the reaped child (the flusher it starts is not its reaped child, so it is not counted). On a shared machine the
wall time of a 12 ms process varies by more than the budgets; its CPU time much less. It also counts the
instructions of each mode's process (callgrind, the process only, ``PYTHONHASHSEED=0``), which repeat exactly.

Budgets (MISSION.md): a flusher-starting run <= 5 ms added, a first run <= 10 ms added, asserted on the paired
medians of CPU time with :data:`TOLERANCE_MS`, scaled by how much slower than :data:`PASS_REFERENCE_CPU_MS` this
machine ran ``python -c pass`` (never below 1); wall-time medians and the steady run's ~1 ms are printed.

    python benchmarks/bench_spawn.py [--rounds N] [--tree DIR]

``--tree`` builds the wheel from another source tree (e.g. a ``git archive`` of an older commit), to measure
before and after a change. About a minute, plus valgrind.
"""

from __future__ import annotations

import argparse
import http.server
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import flusher_idle, instructions, make_venv, percentile, pip, publish, report

REPO = Path(__file__).resolve().parent.parent
START_BUDGET_MS = 5.0  # MISSION.md: a run that starts the flusher, vs python -c pass
FIRST_BUDGET_MS = 10.0  # MISSION.md: a user's first run, vs python -c pass
STEADY_TARGET_MS = 1.0  # MISSION.md: "the steady-state run stays ~1 ms" (printed)
TOLERANCE_MS = 2.0  # paired medians of 41 rounds on the shared 2-core machine moved by up to ~1.5 ms
PASS_REFERENCE_CPU_MS = 15.0
"""``python -c pass``'s median CPU time in the benchmark's environment where the budgets are set (14.7 ms in a
clean-clone CI run on 2026-12-07). The same shared machine ran it at 20.4 ms hours later, with the same instruction
counts to 0.001 % and every added time about a third longer (a first run +13.85 ms against +9.40 ms): the asserted
allowances scale by how much slower ``python -c pass`` ran, never below the budgets themselves."""
FLUSHER_WAIT = 60.0  # seconds a started flusher may take to finish (it runs at the lowest priority)
STRIP = ("DJANGO_", "SPOOL_REPORTER_", "XDG_", "PYTHON", "VIRTUAL_ENV", "BENCHTOOL_")
CI_MARKERS = ("CI", "CONTINUOUS_INTEGRATION", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "TF_BUILD", "JENKINS_URL")
MODES = ("pass", "steady", "start", "first")


class Sink(http.server.BaseHTTPRequestHandler):
    """A collector that accepts every batch (the flusher's job is not what is measured here)."""

    received = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        events = len(json.loads(body).get("events", []))
        with Sink.lock:
            Sink.received += events
        answer = json.dumps({"accepted": events, "duplicates": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Home:
    """One user: a home with its own config and state folders."""

    def __init__(self, root: Path, base_env: dict[str, str]) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.config = root / "config"
        self.state = root / "state"
        self.spool = self.state / "spool_reporter" / "benchtool"
        self.env = dict(base_env)
        self.env.update(
            HOME=str(root),
            XDG_CONFIG_HOME=str(self.config),
            XDG_STATE_HOME=str(self.state),
            XDG_CONFIG_DIRS=str(root / "etc-xdg"),
        )

    def wait_flusher(self) -> None:
        deadline = time.monotonic() + FLUSHER_WAIT
        while not flusher_idle(self.spool):
            if time.monotonic() > deadline:
                msg = f"a flusher in {self.spool} did not finish within {FLUSHER_WAIT:.0f} s"
                raise RuntimeError(msg)
            time.sleep(0.02)

    def prepare(self, mode: str) -> None:
        """Put the home in the state ``mode`` measures (untimed)."""
        self.wait_flusher()
        stamp = self.spool / "flush.spawned"
        if mode == "steady":
            stamp.touch(mode=0o600)  # a flusher started just now: none is due
        elif mode == "start":
            stamp.unlink(missing_ok=True)
            (self.spool / "flush.notbefore").unlink(missing_ok=True)
        elif mode == "first":
            shutil.rmtree(self.config, ignore_errors=True)
            shutil.rmtree(self.state, ignore_errors=True)

    def started(self) -> bool:
        return (self.spool / "flush.spawned").exists()


def run(python: str, code: str, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one process, in ms."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [python, "-c", code], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds (each runs every mode once)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree to build the wheel from")
    parser.add_argument("--no-publish", action="store_true", help="print only; leave docs/_generated alone")
    args = parser.parse_args()
    have_valgrind = shutil.which("valgrind") is not None
    started = time.monotonic()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/batch"
    code = (
        "from spool_reporter import App, record\n"
        f"record('build', app=App(name='BenchTool', version='1.0', endpoint={url!r}), notice=True)\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(STRIP) and k not in CI_MARKERS}
    base = {k: v for k, v in base.items() if "proxy" not in k.lower() and k != "DO_NOT_TRACK"}
    base["PYTHONHASHSEED"] = "0"
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as tmp_name:
        tmp = Path(tmp_name)
        isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
        pip("wheel", "--no-deps", *isolation, "-w", str(tmp / "wheel"), str(args.tree))
        (wheel,) = (tmp / "wheel").glob("spool_reporter-*.whl")
        python = make_venv(tmp / "venv")
        pip("--python", python, "install", str(wheel))
        work = tmp / "work"
        work.mkdir()
        homes = {mode: Home(tmp / f"home-{mode}", base) for mode in MODES}
        for mode in ("steady", "start"):  # warm-up: client id, notice, folders, .pyc files
            run(python, code, homes[mode].env, work)
            homes[mode].wait_flusher()
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
        not_started: dict[str, int] = {"start": 0, "first": 0}
        for i in range(args.rounds):
            order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
            if i % 2:
                order = tuple(reversed(order))
            for mode in order:
                home = homes[mode]
                if mode != "pass":
                    home.prepare(mode)
                wall, used = run(python, "pass" if mode == "pass" else code, home.env, work)
                times[mode].append(wall)
                cpu[mode].append(used)
                if mode in not_started and not home.started():
                    not_started[mode] += 1
        for home in homes.values():
            home.wait_flusher()
        count: dict[str, int] = {}
        if have_valgrind:
            cg = tmp / "cg"
            cg.mkdir()
            for mode in MODES:
                home = homes[mode]
                if mode != "pass":
                    home.prepare(mode)
                argv = [python, "-c", "pass" if mode == "pass" else code]
                count[mode] = instructions(argv, home.env, work, cg / "x")
                home.wait_flusher()
    server.shutdown()
    elapsed = time.monotonic() - started

    def paired(series: dict[str, list[float]]) -> dict[str, list[float]]:
        return {m: [series[m][i] - series["pass"][i] for i in range(args.rounds)] for m in MODES if m != "pass"}

    added, added_cpu = paired(times), paired(cpu)
    median = {mode: statistics.median(values) for mode, values in added.items()}
    median_cpu = {mode: statistics.median(values) for mode, values in added_cpu.items()}
    print(
        f"bench_spawn: Python {sys.version.split()[0]}, {args.rounds} interleaved rounds, tree {args.tree}, "
        f"{elapsed:.0f} s"
    )
    print(
        f"  python -c pass: median {statistics.median(times['pass']):.2f} ms wall, "
        f"{statistics.median(cpu['pass']):.2f} ms CPU"
    )
    for mode in added:
        print(
            f"  {mode:<7} added vs python -c pass (paired medians): CPU {median_cpu[mode]:+.2f} ms "
            f"(p25 {percentile(added_cpu[mode], 25):+.2f}, p75 {percentile(added_cpu[mode], 75):+.2f}); "
            f"wall {median[mode]:+.2f} ms (p25 {percentile(added[mode], 25):+.2f}, "
            f"p75 {percentile(added[mode], 75):+.2f})"
        )
    for mode, value in count.items():
        extra = "" if mode == "pass" else f" ({value - count['pass']:+,} vs pass)"
        print(f"  instructions {mode:<7} {value:>14,}{extra}")
    print(f"  flushers delivered {Sink.received} events; runs that started none: {not_started}")
    slower = max(1.0, statistics.median(cpu["pass"]) / PASS_REFERENCE_CPU_MS)
    print(f"  this machine ran python -c pass {slower:.2f}x as long as the reference ({PASS_REFERENCE_CPU_MS} ms CPU)")
    budgets = [
        {"what": "a run that starts the flusher, CPU time added vs python -c pass (median, paired)",
         "measured": f"{median_cpu['start']:+.2f} ms",
         "budget": f"<= {START_BUDGET_MS} ms (+{TOLERANCE_MS} ms noise) x {slower:.2f} (this machine's slowdown)",
         "ok": median_cpu["start"] <= (START_BUDGET_MS + TOLERANCE_MS) * slower},
        {"what": "a user's first run, CPU time added vs python -c pass (median, paired)",
         "measured": f"{median_cpu['first']:+.2f} ms",
         "budget": f"<= {FIRST_BUDGET_MS} ms (+{TOLERANCE_MS} ms noise) x {slower:.2f} (this machine's slowdown)",
         "ok": median_cpu["first"] <= (FIRST_BUDGET_MS + TOLERANCE_MS) * slower},
        {"what": "a run that starts the flusher, wall time added (median, paired)",
         "measured": f"{median['start']:+.2f} ms", "budget": f"<= {START_BUDGET_MS} ms",
         "ok": median["start"] <= START_BUDGET_MS, "asserted": False},
        {"what": "a user's first run, wall time added (median, paired)",
         "measured": f"{median['first']:+.2f} ms", "budget": f"<= {FIRST_BUDGET_MS} ms",
         "ok": median["first"] <= FIRST_BUDGET_MS, "asserted": False},
        {"what": "every start and first run started a flusher (what is measured is what is claimed)",
         "measured": f"{sum(not_started.values())} runs started none", "budget": "0",
         "ok": not any(not_started.values())},
        {"what": "the steady run (no flusher due), CPU time added (median, paired)",
         "measured": f"{median_cpu['steady']:+.2f} ms", "budget": f"about {STEADY_TARGET_MS} ms",
         "ok": median_cpu["steady"] <= STEADY_TARGET_MS + TOLERANCE_MS, "asserted": False},
    ]  # fmt: skip
    figures = {
        "rounds": args.rounds,
        "python_c_pass_ms": round(statistics.median(times["pass"]), 3),
        "python_c_pass_cpu_ms": round(statistics.median(cpu["pass"]), 3),
        "added_cpu_ms": {mode: round(value, 3) for mode, value in median_cpu.items()},
        "added_ms": {mode: round(value, 3) for mode, value in median.items()},
        "instructions": count,
        "instructions_added": {mode: count[mode] - count["pass"] for mode in count if mode != "pass"},
    }
    if args.no_publish:
        return 0 if report(budgets) else 1
    ok = publish("spawn", "python benchmarks/bench_spawn.py", figures, budgets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
