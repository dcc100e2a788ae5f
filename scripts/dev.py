"""Bootstrap for the README's two commands: needs only Python 3.10+ with venv and pip.

    python3 scripts/dev.py demo    # the main job: a real Django command reported end to end, offline
    python3 scripts/dev.py test    # the whole test suite (every installed Python 3.10-3.13, real Django 4.2-6.1)
    python3 scripts/dev.py check   # lint, typecheck, docs and benchmarks (what CI adds)
    python3 scripts/dev.py quick   # the tests a change touches, in parallel, in well under a minute

``quick`` runs, on one Python and without coverage, the test files named after it (``quick tests/client/test_spool.py
-x``), or else the ones the change touches: every test file changed since ``main`` or in the work tree, and every
test file that names a package module changed (``spool_reporter._spool`` changed: each test file that mentions
``spool_reporter._spool`` or imports ``_spool`` from its package).

It creates ``.dev-venv/`` with nox and uv in it (once; nox fills its sessions' environments with uv), puts every
installed ``python3.X`` on nox's path, and runs the matching nox sessions. Extra arguments go to nox. On Linux
``test`` runs the ``django`` sessions' parallel runs beside the ``tests`` sessions, at idle priority
(:func:`run_tests`; ``SPOOL_REPORTER_TEST_BESIDE=0`` runs them one after another). ``test`` ends
with one line that adds up every pytest run of every session and repeats the coverage figure of the one measured
run (``tests: 1234 passed, 0 failed, 5 skipped in 12 pytest runs; coverage 87.5% of lines and branches``), so that
the last line of a long log says how it went.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".dev-venv"
SESSIONS = {
    "demo": ["demo"],
    "test": ["tests", "django"],
    "check": ["lint", "typecheck", "docs", "bench"],
    "quick": ["quick"],
}
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s")
"""pytest's last line, with or without ``-q``: ``=== 12 passed, 1 skipped in 3.21s ===``."""
COUNTED = ("passed", "failed", "errors", "skipped")
COVERAGE_TOTAL = re.compile(r"^TOTAL\s.*\s(\d+(?:\.\d+)?%)$")
"""The TOTAL row of ``coverage report`` (the ``tests`` session on 3.11 measures lines and branches): its last column."""


def _changed_files() -> list[str]:
    """The files changed since ``main`` (committed on this branch, staged, unstaged or new), relative to the repo."""
    found: list[str] = []
    for cmd in (
        ["git", "diff", "--name-only", "main...HEAD"],
        ["git", "diff", "--name-only", "HEAD"],
        ["git", "ls-files", "--others", "--exclude-standard"],
    ):
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            found += done.stdout.split()
    return list(dict.fromkeys(found))


def touched_tests(changed: list[str], tests: dict[str, str]) -> list[str]:
    """The test files (keys of ``tests``, their text the values) that the ``changed`` files touch: a changed test
    file itself, and each one that names a changed package module, by its dotted name or by an import of it from
    its package (``from spool_reporter import _spool``, ``from spool_reporter.collector import _sqlite``)."""
    picked = [name for name in changed if name in tests]
    for name in changed:
        if not (name.startswith("spool_reporter/") and name.endswith(".py")):
            continue
        dotted = name[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        package, _, leaf = dotted.rpartition(".")
        pattern = re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{re.escape(leaf)}\b")
        picked += [test for test, text in tests.items() if pattern.search(text)]
    return sorted(dict.fromkeys(picked))


def _quick_args(argv: list[str]) -> list[str] | None:
    """nox's arguments for ``quick``: the test files named, else the ones the change touches; None if none."""
    if any(not arg.startswith("-") for arg in argv):
        return argv
    tests = {
        str(path.relative_to(REPO)): path.read_text(encoding="utf-8", errors="replace")
        for path in sorted((REPO / "tests").rglob("test_*.py"))
    }
    picked = touched_tests(_changed_files(), tests)
    return [*picked, *argv] if picked else None


def _bin(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _pyenv_path() -> dict[str, str]:
    """Make every pyenv-installed Python visible, as the project's CI does."""
    env = dict(os.environ)
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            current = subprocess.run([pyenv, "version-name"], capture_output=True, text=True, check=True)
            versions = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return env
        names = [current.stdout.strip(), *versions.stdout.split()]
        env["PYENV_VERSION"] = ":".join(dict.fromkeys(n for n in names if n))
    return env


def add_up(lines: list[str]) -> dict[str, int]:
    """The counts of every pytest summary line in ``lines`` (``error`` counted as ``errors``)."""
    totals = dict.fromkeys((*COUNTED, "runs"), 0)
    for line in lines:
        match = SUMMARY.match(line.strip())
        if not match:
            continue
        totals["runs"] += 1
        for part in match.group(1).split(", "):
            count, _, what = part.partition(" ")
            what = "errors" if what == "error" else what
            if what in totals:
                totals[what] += int(count)
    return totals


def coverage_total(lines: list[str]) -> str | None:
    """The last coverage figure in ``lines`` (``87.5%``), or None when no session measured coverage."""
    found = [match.group(1) for match in map(COVERAGE_TOTAL.match, (line.strip() for line in lines)) if match]
    return found[-1] if found else None


def summary_line(totals: dict[str, int], status: int, coverage: str | None = None) -> str:
    counts = ", ".join(f"{totals[k]} {k}" for k in COUNTED if totals[k] or k in ("passed", "failed"))
    measured = "" if coverage is None else f"; coverage {coverage} of lines and branches"
    verdict = "" if status == 0 else f" (nox exited {status})"
    return f"tests: {counts} in {totals['runs']} pytest runs{measured}{verdict}"


def _tee(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run ``cmd`` with its output passed through line by line; its exit status and the lines."""
    seen: list[str] = []
    with subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_pyenv_path() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            seen.append(line)
    return proc.returncode, seen


RUNS_ENV = "SPOOL_REPORTER_TEST_RUNS"
"""The noxfile runs only the ``serial`` or the ``parallel`` run of each suite when it is set."""
BESIDE_ENV = "SPOOL_REPORTER_TEST_BESIDE"
"""``0``: ``test`` runs its sessions one after another, as on a system without an idle scheduling class."""
KEEP_SHARED_ENV = "SPOOL_REPORTER_TEST_KEEP_SHARED"
"""``1``: the noxfile's ``django`` session keeps the wheel and Django environments its previous invocation built."""
PORT_BLOCK_ENV = "SPOOL_REPORTER_TEST_PORT_BLOCK"
"""The first block of ports of a test run's own (``tests/support/ports.py``)."""
BESIDE_PORT_BLOCK = "15"
"""The first block of ports (``tests/support/ports.py``) of the runs started beside the ``tests`` sessions, far past
the blocks of the ``tests`` sessions' workers (one block each, from the second)."""


def _at_idle_priority() -> None:
    """In the child, before it runs nox (``start_new_session``: its own session): scheduled only when no other
    process wants the CPU (Linux's ``SCHED_IDLE``; every process it starts inherits it). With autogroups (Linux's
    default) the kernel first shares the CPU between sessions by their autogroup's nice, whatever the policy of the
    processes inside: the session's autogroup is set to nice 19 too, as low as a detached flusher's own (the
    ``tests`` sessions wait on those: one waited out its 60 s while the Django runs shared the tests' autogroup)."""
    try:
        with open("/proc/self/autogroup", "w", encoding="ascii") as group:
            group.write("19")
    except OSError:  # no autogroups here: the idle class alone
        pass
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def can_run_beside(env: dict[str, str]) -> bool:
    """Whether ``test`` may run the ``django`` sessions' parallel runs beside the ``tests`` sessions: an idle
    scheduling class exists here (Linux) and ``SPOOL_REPORTER_TEST_BESIDE`` is not ``0``."""
    return hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setscheduler") and env.get(BESIDE_ENV, "1") != "0"


def run_tests(nox: str, rest: list[str]) -> tuple[int, list[str]]:
    """The ``tests`` and ``django`` sessions; their exit status (the first that failed) and every line they printed.

    Where it can (:func:`can_run_beside`) it spends on the Django commands the CPU that the ``tests`` sessions'
    serial runs leave idle (about half of it: they wait on deadlines, timeouts and servers): first the ``django``
    sessions' serial runs, alone; then their parallel runs in the background at idle priority, which take only the
    CPU that nothing else wants, while the ``tests`` sessions run as before; their output follows the ``tests``
    sessions'. The ``tests`` sessions' serial runs passed as alone beside them (docs/testing.md)."""
    env = _pyenv_path()
    if not can_run_beside(env):
        return _tee([nox, "-s", *SESSIONS["test"], *rest], env)
    status, lines = _tee([nox, "-s", "django", *rest], {**env, RUNS_ENV: "serial"})
    # The wheel and the Django environments that the serial runs built, of this same checkout, are kept.
    beside_env = {
        **env,
        RUNS_ENV: "parallel",
        KEEP_SHARED_ENV: "1",
        PORT_BLOCK_ENV: BESIDE_PORT_BLOCK,
    }
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out:
        try:
            beside = subprocess.Popen(
                [nox, "-s", "django", *rest],
                cwd=REPO,
                env=beside_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # an autogroup of its own (above)
                preexec_fn=_at_idle_priority,  # noqa: PLW1509 - this script starts no thread
            )
        except (OSError, subprocess.SubprocessError) as exc:  # the idle class refused here: one after another
            print(f"scripts/dev.py: cannot run at idle priority ({exc}); the sessions run one after another")
            tests_status, seen = _tee([nox, "-s", "tests", *rest], env)
            beside_status, later = _tee([nox, "-s", "django", *rest], beside_env)
            return _first_failure(status, tests_status, beside_status), [*lines, *seen, *later]
        try:
            tests_status, seen = _tee([nox, "-s", "tests", *rest], env)
            tests_ended = time.time()
            beside_status = beside.wait()
        finally:
            if beside.poll() is None:  # interrupted: stop it too (its own session: Ctrl-C does not reach it)
                with contextlib.suppress(OSError):
                    os.killpg(beside.pid, signal.SIGTERM)
                try:
                    beside.wait(60)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(OSError):
                        os.killpg(beside.pid, signal.SIGKILL)
        # Their last line was written when they ended: whether the tests sessions waited on them, and how long.
        late = os.fstat(out.fileno()).st_mtime - tests_ended
        out.seek(0)
        print(
            "scripts/dev.py: the django sessions' parallel runs, which ran beside the tests sessions at idle priority"
            f" and ended {abs(late):.0f} s {'after' if late > 0 else 'before'} them:",
            flush=True,
        )
        later = out.readlines()
        sys.stdout.writelines(later)
        sys.stdout.flush()
    return _first_failure(status, tests_status, beside_status), [*lines, *seen, *later]


def _first_failure(*statuses: int) -> int:
    """The first exit status that is not 0, else 0."""
    return next((s for s in statuses if s), 0)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SESSIONS:
        print(__doc__, file=sys.stderr)
        return 2
    if not _bin("nox").exists():
        print("scripts/dev.py: creating .dev-venv with nox and uv (once)", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        subprocess.run([str(_bin("python")), "-m", "pip", "install", "-q", "nox>=2024.10.9"], check=True)
    no_uv = VENV / "no-uv"  # tried once and failed: not tried again (remove the file to try again)
    if not _bin("uv").exists() and not no_uv.exists():
        # nox fills its environments with uv when it finds it beside itself (3-4 s a session instead of 17-18 s with
        # virtualenv and pip, docs/testing.md); without it (no wheel for this platform, no index), pip as before.
        pip = [str(_bin("python")), "-m", "pip", "install", "-q", "uv>=0.5"]
        if subprocess.run(pip, check=False).returncode != 0:
            no_uv.touch()
            print("scripts/dev.py: uv could not be installed; nox uses virtualenv and pip", file=sys.stderr)
    rest = argv[1:]
    if argv[0] == "quick":
        quick = _quick_args(rest)
        if quick is None:
            print(
                "scripts/dev.py quick: no test file is touched by a change since main; name some (quick tests/client)"
            )
            return 0
        print(f"scripts/dev.py quick: {' '.join(quick)}", file=sys.stderr)
        rest = ["--", *quick]
    cmd = [str(_bin("nox")), "-s", *SESSIONS[argv[0]], *rest]
    if argv[0] != "test":
        return subprocess.run(cmd, cwd=REPO, env=_pyenv_path(), check=False).returncode
    status, lines = run_tests(str(_bin("nox")), rest)
    totals = add_up(lines)
    print(summary_line(totals, status, coverage_total(lines)), flush=True)
    return status if status else (1 if totals["failed"] or totals["errors"] or not totals["runs"] else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
