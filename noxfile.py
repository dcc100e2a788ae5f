"""Development sessions: ``nox -l`` lists them. The README's two commands call ``scripts/dev.py``, which
runs these in a private virtual environment so that a fresh machine needs only Python and pip."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import nox
import nox.command
import nox.virtualenv

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False  # a user's machine has the Pythons it has
# uv creates and fills a session's environment in 3-4 s where virtualenv and pip take 17-18 s (docs/testing.md);
# without uv (nox installed alone), virtualenv and pip as before.
nox.options.default_venv_backend = "uv|virtualenv"
# Only the Pythons installed here: with uv, nox would otherwise download a missing one (or, offline, try for 5 s).
nox.options.download_python = "never"

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
REPO = Path(__file__).resolve().parent
TEST_DEPS = [
    "pytest>=8",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.6",
    "hypothesis>=6.100",
    "trustme>=1.1",
    "click>=8.1",
    "pillow>=10",
    "filelock>=3.16",
]
"""click: the optional Click group (``spool_reporter.click_group``) is tested; it is never a runtime dependency.
pillow reads the public page's screenshots in tests/collector/test_public_browser.py. filelock is the reference the lock
protocol is tested against (tests/client/test_lock_interop.py): another program holding spool.lock through filelock
excludes the hook, and the reverse; the package itself takes every lock through the folder's descriptor."""

DOCS_DEPS = ["sphinx>=7", "myst-parser>=3", "furo>=2024.8.6"]
"""The docs build's tools: the ``docs`` session, and the docs tests (``tests/test_docs.py``), which the ``tests``
session runs on ``FAULTS_PYTHON`` only (one Sphinx build of about 5 s; the docs do not depend on the Python)."""


COVERAGE_DEPS = ["coverage>=7.10.3"]
"""Coverage of the package across every process the tests start (``[tool.coverage.*]`` in pyproject.toml): 7.10
brought ``patch = subprocess``, ``fork`` and ``_exit``; 7.10.3 carries the whole configuration into the children."""


def _present(version: str) -> bool:
    return shutil.which(f"python{version}") is not None


DJANGO_SUPPORT: dict[str, tuple[str, ...]] = {
    # Django 4.2 LTS: paired with 3.10 and 3.11 only (it would run on 3.12, but 5.2 LTS covers the newer Pythons);
    # 6.0 and 6.1 need Python 3.12 or newer (6.1: 3.12-3.15). Python 3.10 and Django 4.2 reached their end of life
    # in 2026: kept while they cost nothing (docs/django.md).
    "4.2": ("3.10", "3.11"),
    "5.2": ("3.10", "3.11", "3.12", "3.13"),
    "6.0": ("3.12", "3.13"),
    "6.1": ("3.12", "3.13"),
}
"""The Pythons each Django series is tested with, oldest first."""


def _django_series(pythons: list[str], *, every_pair: bool = False) -> dict[str, tuple[str, ...]]:
    """The Django series the ``django`` session tests on each of ``pythons``: each series on the oldest and the
    newest of them that it supports, the ends of its range, where a difference between Pythons would show
    (docs/django.md); a series in the middle of its range repeats what its two ends test, and every Python runs
    the client tests (``every_python``) and at least one series. ``every_pair``: each series on each of them."""
    pairs: dict[str, list[str]] = {python: [] for python in pythons}
    for series, supported in DJANGO_SUPPORT.items():
        here = [python for python in supported if python in pairs]
        for python in here if every_pair else dict.fromkeys(here[:1] + here[-1:]):  # the ends, once if one
            pairs[python].append(series)
    return {python: tuple(found) for python, found in pairs.items()}


DJANGO_SERIES = _django_series(
    [python for python in PYTHONS if _present(python)] or PYTHONS,
    every_pair=os.environ.get("SPOOL_REPORTER_DJANGO_PAIRS") == "all",
)
"""The Django series the ``django`` session tests on each installed Python (every Python when none is, so that
``nox -l`` still lists the sessions); ``tests/integration/test_django.py`` installs each one in a throw-away
virtual environment. With Python 3.10-3.13: 4.2 and 5.2 on 3.10, 4.2 on 3.11, 6.0 and 6.1 on 3.12, 5.2, 6.0 and
6.1 on 3.13 (8 series); with only 3.11, 4.2 and 5.2. ``SPOOL_REPORTER_DJANGO_PAIRS=all`` tests every supported
pair (10 series)."""


def _install(session: nox.Session, *args: str) -> None:
    """``session.install``, and with uv two things pip does by itself: the project reinstalled each time (uv keeps a
    reused environment's copy of a local package even when its source changed, nox's warning), and every module
    compiled to bytecode. uv compiles nothing unless asked, and where ``PYTHONDONTWRITEBYTECODE`` is set (it is on
    the machines the suite's figures come from) no process writes what it compiled either: every Python the tests
    start compiled coverage, pytest and the package from source again, about 90 ms a process (docs/testing.md)."""
    again = ["--reinstall-package", "spool-reporter", "--compile-bytecode"] if session.venv_backend == "uv" else []
    session.install(*args, *again)


def _installer_env(session: nox.Session) -> dict[str, str]:
    """``SPOOL_REPORTER_UV``: the uv that filled the session's environment, for the tests and benchmarks that fill
    throw-away ones (``uv pip install --python``); unset with pip, which they then use."""
    if session.venv_backend != "uv":
        return {}
    found = shutil.which(nox.virtualenv.UV)
    return {"SPOOL_REPORTER_UV": found} if found else {}


TOOLS_PYTHON = next((v for v in ("3.11", "3.12", "3.13", "3.10") if _present(v)), "3.11")
"""The Python of the single-Python sessions (lint, typecheck, docs, bench, demo): 3.11, which CI and the
benchmarks' recorded figures use, else the first other one installed, so that a machine with only one Python
3.10+ still runs the README's two commands."""


FAULTS_PYTHON = "3.11"
"""The suite's own Python: the ``tests`` session runs the whole suite here, under coverage, with the fault suite at
CI size and the docs tests; on every other Python only the tests marked ``every_python`` run (the rule is
``tests/conftest.py``'s, and docs/testing.md says why)."""

CORES = os.cpu_count() or 1
RUNS = os.environ.get("SPOOL_REPORTER_TEST_RUNS", "")
"""``serial`` or ``parallel``: only that run of each suite (``scripts/dev.py test`` runs the ``django`` sessions'
parallel runs apart, at idle priority, while the ``tests`` sessions run; docs/testing.md); unset, both."""
KEEP_SHARED_ENV = "SPOOL_REPORTER_TEST_KEEP_SHARED"
"""``1``: the ``django`` session keeps the wheel and the Django environments that its previous invocation built (for
the same checkout: ``scripts/dev.py test`` sets it for the parallel runs that follow the serial ones); unset, they
are built again."""
if RUNS not in ("", "serial", "parallel"):
    raise SystemExit(f"noxfile.py: SPOOL_REPORTER_TEST_RUNS={RUNS!r}: use serial or parallel, or leave it unset")
WORKERS = os.environ.get("SPOOL_REPORTER_TEST_WORKERS", "")
"""pytest-xdist workers of every parallel run when set (``0`` runs everything in one process); unset, one per core
(``_runs`` says why not more)."""


PYTEST_ENV: dict[str, str | None] = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": None}
"""The environment of every pytest run. ``PYTHONDONTWRITEBYTECODE`` unset (it is set on the machines the suite's
figures come from): pytest then keeps each test module it rewrote for its assertions (``__pycache__``, git-ignored)
instead of parsing and rewriting all of them again in every process, 4 s of each collection of the whole suite
(docs/testing.md). The processes the tests start get their environment from the tests (``support/sandbox.py`` sets
it again)."""


def _runs(marks: str, posargs: list[str]) -> list[list[str]]:
    """The pytest arguments of one suite: the tests marked ``serial`` alone, so that nothing else loads the machine
    while they time or load it, then the others spread over the workers (docs/testing.md). The serial run comes
    first because it is one process: it rewrites the test modules once, and the workers read what it kept.
    ``worksteal``: a worker that runs out of tests takes some of another's, so that no core idles at the end of a
    run of long tests (the fault suite's, the collector's) queued on one worker. One worker per core: a third
    worker filled the time the ``tests`` sessions' tests wait on the processes they start (the whole suite's
    parallel run under coverage 198 s against 244 s with two), but it also left almost no gap for the detached
    flushers those tests wait on, which run at nice 19 by design: a clean-clone ``.ci/run`` with three workers
    failed on a fault test whose flusher had not delivered within its 20 s deadline (docs/testing.md). The idle CPU
    goes to the ``django`` sessions' parallel runs, at idle priority (``scripts/dev.py test``)."""
    both = {
        "serial": ["-p", "no:xdist", "-m", f"({marks}) and serial", *posargs],
        "parallel": ["-n", WORKERS or str(CORES), "--dist", "worksteal", "-m", f"({marks}) and not serial", *posargs],
    }
    return [both[RUNS]] if RUNS else list(both.values())


NO_TESTS = 5
"""pytest's exit status when a run selects no test (``nox -s tests-3.11 -- tests/client/test_spool.py``: the file
may have no serial test); not a failure."""


def _run_all(runs: list[list[str]], run: Callable[[list[str]], object]) -> int:
    """Every run, even after one failed (each says what failed); how many failed."""
    failed = 0
    for args in runs:
        try:
            run(args)
        except nox.command.CommandFailed:
            failed += 1
    return failed


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole test suite on ``FAULTS_PYTHON``, under coverage, with the fault suite (at CI size); on the other
    Pythons the tests whose outcome can depend on the Python (``every_python``). Django commands run in the
    ``django`` session. The ``collector`` extra (psycopg, gunicorn) is installed so that the PostgreSQL and
    gunicorn tests run: one PostgreSQL per worker (~3 s), a few gunicorn processes."""
    env = dict(PYTEST_ENV)
    if session.python == FAULTS_PYTHON:
        _install(session, ".[collector]", *TEST_DEPS, *DOCS_DEPS, *COVERAGE_DEPS)
        env["SPOOL_REPORTER_DOCS_TESTS"] = "required"
        _pytest_with_coverage(session, _runs("not django", session.posargs), env)
    else:
        _install(session, ".[collector]", *TEST_DEPS)
        runs = _runs("every_python and not django", session.posargs)
        failed = _run_all(runs, lambda args: session.run("pytest", *args, env=env, success_codes=[0, NO_TESTS]))
        if failed:
            session.error(f"{failed} of {len(runs)} pytest runs failed")


def _pytest_with_coverage(session: nox.Session, runs: list[list[str]], env: dict[str, str | None]) -> None:
    """The pytest runs under coverage, then the combined report of every measured process, which fails below the
    floor (``fail_under``). Its TOTAL line is what ``scripts/dev.py test`` repeats in its last line
    (docs/testing.md). pytest-xdist's workers are Python processes the run starts, measured like any other."""
    # Beside the session's environment, not in its temporary folder: session.create_tmp() would also point TMPDIR
    # there, and the tests' temporary paths would grow past the 108 bytes of a unix socket's path (nginx refuses
    # tests/collector/test_deploy_nginx.py's upstream socket in a checkout cloned under /tmp/tmp.XXXXXXXXXX).
    data = Path(session.virtualenv.location) / "coverage"
    shutil.rmtree(data, ignore_errors=True)  # the previous run's files, never combined into this one
    data.mkdir()
    data.chmod(0o1777)  # the permission tests' processes run as nobody and save their data here too
    env = {**env, "COVERAGE_FILE": str(data / ".coverage")}
    failed = _run_all(
        runs, lambda args: session.run("coverage", "run", "-m", "pytest", *args, env=env, success_codes=[0, NO_TESTS])
    )
    session.run("coverage", "combine", "--quiet", env=env)
    # The floor holds for the whole suite when it passed; the figure of a failed run, or of some tests
    # (nox -s tests-3.11 -- tests/client, or one of the two runs: RUNS), is only printed.
    session.run("coverage", "report", *(["--fail-under=0"] if failed or session.posargs or RUNS else []), env=env)
    if failed:
        session.error(f"{failed} of {len(runs)} pytest runs failed")


@nox.session(python=PYTHONS)
def django(session: nox.Session) -> None:
    """Real Django commands in throw-away virtual environments with the built wheel (and an editable install),
    once per Django series of ``DJANGO_SERIES`` on this Python; every series runs even after one failed. The wheel
    is built once for the session and each series' environment once for its two pytest runs (serial, then parallel;
    ``scripts/dev.py test`` runs them in two invocations, the second keeping what the first built: ``RUNS``,
    ``KEEP_SHARED_ENV``)."""
    if not DJANGO_SERIES.get(str(session.python)):
        session.skip(f"no Django series is paired with Python {session.python} here (DJANGO_SUPPORT)")
    # hatchling and editables: the tests build the wheel and the editable install without build isolation, with
    # pip (which a uv environment lacks); the throw-away environments are filled by uv when the session's was.
    _install(
        session,
        ".",
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.6",
        "hatchling>=1.25",
        "editables>=0.5",
        "pip",
    )
    shared = Path(session.virtualenv.location) / "shared"  # not session.create_tmp(): see _pytest_with_coverage
    if os.environ.get(KEEP_SHARED_ENV) != "1":
        shutil.rmtree(shared, ignore_errors=True)  # never a previous session's wheel
    shared.mkdir(exist_ok=True)
    failed = []
    for i, series in enumerate(DJANGO_SERIES[str(session.python)]):
        # An editable install does not depend on the Django version: test it with the first series only.
        env = {
            **PYTEST_ENV,
            "SPOOL_REPORTER_TEST_DJANGO": series,
            "SPOOL_REPORTER_TEST_EDITABLE": str(int(i == 0)),
            "SPOOL_REPORTER_TEST_SHARED": str(shared),
            **_installer_env(session),
        }
        runs = _runs("django", ["tests/integration", *session.posargs])
        if _run_all(runs, lambda args, env=env: session.run("pytest", *args, env=env, success_codes=[0, NO_TESTS])):
            failed.append(series)
    if failed:
        session.error(f"Django {', '.join(failed)} failed on Python {session.python}")


@nox.session(python=TOOLS_PYTHON)
def quick(session: nox.Session) -> None:
    """The test files named (``nox -s quick -- tests/client/test_spool.py``; ``scripts/dev.py quick`` names the
    ones a change touches): on one Python, without coverage, the serial run then the parallel one; real Django
    tests are left to the ``django`` session."""
    _install(session, ".[collector]", *TEST_DEPS)
    runs = _runs("not django", session.posargs)
    failed = _run_all(
        runs, lambda args: session.run("pytest", "-q", *args, env=PYTEST_ENV, success_codes=[0, NO_TESTS])
    )
    if failed:
        session.error(f"{failed} of {len(runs)} pytest runs failed")


@nox.session(python=TOOLS_PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and the import contracts of ``pyproject.toml`` (``lint-imports``)."""
    _install(session, "ruff>=0.8", "import-linter>=2.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # Reads the source where it stands (the current folder is on its path): no install of the package needed.
    session.run("lint-imports")


@nox.session(python=TOOLS_PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    # psycopg's types for the PostgreSQL store; click for the Click group.
    _install(session, "mypy>=1.13", ".[collector,click]")
    session.run("mypy", "--strict", "spool_reporter")


@nox.session(python=TOOLS_PYTHON)
def docs(session: nox.Session) -> None:
    """Build the Sphinx site with warnings as errors."""
    _install(session, ".[click]", *DOCS_DEPS)  # click: the Click group's API page
    out = session.posargs[0] if session.posargs else "docs/_build/html"
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", out)


BENCH_PART_ENV = "SPOOL_REPORTER_BENCH"
"""``timed``: the ``bench`` session runs only what measures time, which must run alone; ``counted``: only what
counts instructions, which no other load changes (``scripts/dev.py check --timed`` and ``test --with-check``
split it so; docs/testing.md); unset, everything."""
BENCH_PARTS: dict[str, tuple[str, ...]] = {
    "bench_startup.py": ("counted",),
    "bench_django.py": ("timed", "counted"),
}
"""What each benchmark measures, where it is not only time: instructions counted by callgrind (``counted``), or both,
run as two halves (``--part``). Every other benchmark times, and runs in the ``timed`` part."""


def _bench_runs(part: str) -> list[list[str]]:
    """The benchmark scripts the ``bench`` session runs for ``part`` (``timed``, ``counted`` or ``""``: all), each
    with its arguments: a script with both halves runs whole, or with ``--part`` when only one is wanted."""
    runs = []
    for script in sorted((REPO / "benchmarks").glob("bench_*.py")):
        parts = BENCH_PARTS.get(script.name, ("timed",))
        if not part:
            runs.append([str(script)])
        elif part in parts:
            runs.append([str(script), *(["--part", part] if len(parts) > 1 else [])])
    return runs


@nox.session(python=TOOLS_PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: print the figures and assert the budgets (with a tolerance for a noisy 2-core machine); only the
    timed or only the counted ones with ``SPOOL_REPORTER_BENCH`` (``BENCH_PART_ENV``)."""
    part = os.environ.get(BENCH_PART_ENV, "")
    if part not in ("", "timed", "counted"):
        session.error(f"{BENCH_PART_ENV}={part!r}: use timed or counted, or leave it unset")
    # pip and hatchling: the benchmarks build the wheel with them, without build isolation (a uv environment has no
    # pip); uv fills their throw-away environments when it filled this one.
    _install(session, ".[django,collector]", "pip", "hatchling>=1.25")
    # Never measured: coverage settings from the outer environment (a shell under `coverage run`) are dropped.
    env: dict[str, str | None] = {"PYTHONHASHSEED": "0", **_installer_env(session)}
    env.update(dict.fromkeys(("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")))
    failed = []
    for script, *args in _bench_runs(part):
        # Every benchmark runs and prints its figures, even after one failed: a failed budget is only one line.
        try:
            session.run("python", script, *args, *session.posargs, env=env)
        except nox.command.CommandFailed:
            failed.append(Path(script).name)
    if failed:
        session.error(f"budgets failed in {', '.join(failed)}")


if sys.platform != "win32" and not os.environ.get("SPOOL_REPORTER_NOX_QUIET"):
    missing = [v for v in PYTHONS if not _present(v)]
    if missing:
        print(f"noxfile: Python {', '.join(missing)} not found; their sessions will be skipped", file=sys.stderr)


@nox.session(python=TOOLS_PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: a real Django command reported end to end, offline, in a temporary home."""
    _install(session, ".[django]")
    session.run("python", "scripts/demo.py", *session.posargs)


@nox.session(python="3.11")
def faults(session: nox.Session) -> None:
    """The fault and load suite at the published trial counts (``SPOOL_FAULTS_SCALE=full``, ~15 min); when it
    passes in full it rewrites ``docs/_generated/reliability.json``. The ``tests`` session runs it at CI size."""
    _install(session, ".", *TEST_DEPS)
    env = {"PYTHONHASHSEED": "0", "SPOOL_FAULTS_SCALE": "full"}
    session.run("pytest", "tests/faults", *session.posargs, env=env)
