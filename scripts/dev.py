"""Bootstrap for the README's two commands: needs only Python 3.10+ with venv and pip.

    python3 scripts/dev.py demo    # the main job: a real Django command reported end to end, offline
    python3 scripts/dev.py test    # the whole test suite (every installed Python 3.10-3.13, real Django 4.2-6.1)
    python3 scripts/dev.py check   # lint, typecheck, docs and benchmarks (what CI adds)
    python3 scripts/dev.py quick   # the tests a change touches, in parallel, in well under a minute

CI splits ``check`` in two: ``check --timed`` runs only the benchmarks that measure time, which must run alone, and
``test --with-check`` runs the rest of it (lint, typecheck, docs and the benchmarks that count instructions) beside
the tests at idle priority, its verdict in the last line.

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


def summary_line(totals: dict[str, int], status: int, coverage: str | None = None, check: str | None = None) -> str:
    """``test``'s last line; ``check``: the verdict of the check's sessions run beside (``--with-check``)."""
    counts = ", ".join(f"{totals[k]} {k}" for k in COUNTED if totals[k] or k in ("passed", "failed"))
    measured = "" if coverage is None else f"; coverage {coverage} of lines and branches"
    verdict = "" if status == 0 else f" (nox exited {status})"
    beside = "" if check is None else f"; check beside them {check}"
    return f"tests: {counts} in {totals['runs']} pytest runs{measured}{verdict}{beside}"


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


class _Beside:
    """A command run in the background at idle priority (:func:`_at_idle_priority`), its output kept in a temporary
    file and printed by :meth:`finish`; where the idle class is refused, it runs in the foreground at :meth:`finish`
    instead, after what it was to run beside."""

    def __init__(self, what: str, cmd: list[str], env: dict[str, str]) -> None:
        self.what, self.cmd, self.env = what, cmd, env
        self.out = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - close()
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdout=self.out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # an autogroup of its own (_at_idle_priority)
                preexec_fn=_at_idle_priority,  # noqa: PLW1509 - this script starts no thread
            )
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"scripts/dev.py: cannot run {what} at idle priority ({exc}); they run after the tests sessions")

    def finish(self, tests_ended: float) -> tuple[int, list[str]]:
        """Wait for it and print its output: its exit status and lines."""
        if self.proc is None:
            return _tee(self.cmd, self.env)
        status = self.proc.wait()
        # Its last line was written when it ended: whether the tests sessions waited on it, and how long.
        late = os.fstat(self.out.fileno()).st_mtime - tests_ended
        self.out.seek(0)
        print(
            f"scripts/dev.py: {self.what}, which ran beside the tests sessions at idle priority and ended"
            f" {abs(late):.0f} s {'after' if late > 0 else 'before'} them:",
            flush=True,
        )
        lines = self.out.readlines()
        sys.stdout.writelines(lines)
        sys.stdout.flush()
        return status, lines

    def close(self) -> None:
        """Stop it if it still runs (interrupted: its own session, so Ctrl-C does not reach it), and drop its output."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self.out.close()


CHECK_BESIDE = ["lint", "typecheck", "docs", "bench"]
"""What ``test --with-check`` runs beside the tests: the ``check`` sessions, with only the benchmarks that count
instructions (``BENCH_PART_ENV``); ``check --timed`` runs the others, alone."""
BENCH_PART_ENV = "SPOOL_REPORTER_BENCH"
"""The noxfile's ``bench`` session runs only its ``timed`` or only its ``counted`` benchmarks when it is set."""


def run_tests(nox: str, rest: list[str], *, with_check: bool = False) -> tuple[int, int, list[str]]:
    """The ``tests`` and ``django`` sessions, and with ``with_check`` the check's sessions that measure no time
    (``CHECK_BESIDE``); the exit status of the first that failed among the tests and Django, the check's exit
    status (0 without it), and every line they printed.

    Where it can (:func:`can_run_beside`) it spends on the Django commands the CPU that the ``tests`` sessions'
    serial runs leave idle (about half of it: they wait on deadlines, timeouts and servers): first the ``django``
    sessions' serial runs, alone; then their parallel runs in the background at idle priority, which take only the
    CPU that nothing else wants, while the ``tests`` sessions run as before; their output follows the ``tests``
    sessions'. The ``tests`` sessions' serial runs passed as alone beside them (docs/testing.md). The check's
    sessions start at once, beside all of them, at idle priority too: a lint, a type check, a docs build and
    instruction counts do not depend on the load, and the tests' serial runs lose nothing to a process that yields."""
    env = _pyenv_path()
    check = [nox, "-s", *CHECK_BESIDE]
    check_env = {**env, BENCH_PART_ENV: "counted"}
    if not can_run_beside(env):
        status, lines = _tee([nox, "-s", *SESSIONS["test"], *rest], env)
        check_status, later = _tee(check, check_env) if with_check else (0, [])
        return status, check_status, [*lines, *later]
    # The wheel and the Django environments that the serial runs built, of this same checkout, are kept.
    beside_env = {
        **env,
        RUNS_ENV: "parallel",
        KEEP_SHARED_ENV: "1",
        PORT_BLOCK_ENV: BESIDE_PORT_BLOCK,
    }
    besides: list[_Beside] = []
    try:
        if with_check:
            besides.append(_Beside("the check's sessions that measure no time", check, check_env))
        status, lines = _tee([nox, "-s", "django", *rest], {**env, RUNS_ENV: "serial"})
        django = _Beside("the django sessions' parallel runs", [nox, "-s", "django", *rest], beside_env)
        besides.insert(0, django)
        tests_status, seen = _tee([nox, "-s", "tests", *rest], env)
        tests_ended = time.time()
        lines += seen
        statuses = []
        for beside in besides:
            beside_status, later = beside.finish(tests_ended)
            statuses.append(beside_status)
            lines += later
    finally:
        for beside in besides:
            beside.close()
    check_status = statuses[1] if with_check else 0
    return _first_failure(status, tests_status, statuses[0]), check_status, lines


TIMED_FLAG = "--timed"
"""``check --timed``: only the benchmarks that measure time (``BENCH_PART_ENV``), the part of ``check`` that must run
alone; ``test --with-check`` runs the rest."""
WITH_CHECK_FLAG = "--with-check"
"""``test --with-check``: the check's sessions that measure no time run beside the tests (:func:`run_tests`)."""


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
    if argv[0] != "test":
        sessions, env = SESSIONS[argv[0]], _pyenv_path()
        if argv[0] == "check" and TIMED_FLAG in rest:
            rest = [arg for arg in rest if arg != TIMED_FLAG]
            sessions, env = ["bench"], {**env, BENCH_PART_ENV: "timed"}
        return subprocess.run([str(_bin("nox")), "-s", *sessions, *rest], cwd=REPO, env=env, check=False).returncode
    with_check = WITH_CHECK_FLAG in rest
    rest = [arg for arg in rest if arg != WITH_CHECK_FLAG]
    status, check_status, lines = run_tests(str(_bin("nox")), rest, with_check=with_check)
    totals = add_up(lines)
    check = None if not with_check else ("passed" if check_status == 0 else f"failed (nox exited {check_status})")
    print(summary_line(totals, status, coverage_total(lines), check), flush=True)
    return status or int(bool(totals["failed"] or totals["errors"] or not totals["runs"] or check_status))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
