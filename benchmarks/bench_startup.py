"""What installing spool_reporter costs every Python process, on every Python 3.10-3.13 present here.

``spool_reporter.pth`` runs one line at the start of *every* Python process of the environment it is
installed in, Django command or not. This counts the instructions of ``python -c pass`` (callgrind, the
process only, ``PYTHONHASHSEED=0``) in one bare virtual environment per Python, in four states:

* **Django alone**: Django 5.2 and nothing else (the baseline of the mission's budget);
* **installed**: plus the spool_reporter wheel and its three dependencies;
* **uninstalled**: after ``pip uninstall spool_reporter`` (the dependencies stay);
* **any import line**: uninstalled plus a ``.pth`` file holding only ``import sys`` -- what CPython's ``site``
  charges for the smallest executable ``.pth`` line, whoever ships it.

It also counts ``python - /dev/null`` installed and uninstalled: a process whose ``sys.argv[0]`` passes the
``.pth`` line's coarse check (``-``, ``''``, ``-m``) without being a Django command pays the arming module's
import before it declines; the last column prints that price.

So *installed vs Django alone* splits into the dependencies' ``site-packages`` entries, CPython's own price
for a ``.pth`` import line (reading the file, compiling the line; on 3.13 also importing
``encodings.utf_8_sig`` to decode the first non-empty ``.pth`` file of the environment), and the part that
is spool_reporter's own: the ``sys.argv`` check after ``import sys``. Only that last part is asserted here
(``HOOK_BUDGET``); the mission's 1.5 % for the whole is printed per Python with its result, and
``bench_django.py`` asserts it for the Python that runs the benchmarks, against the uninstalled state.

    python benchmarks/bench_startup.py

Needs valgrind and pip's cache (Django, the dependencies); about 20 s per Python, the Pythons measured side by
side (one per core).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import instructions, make_venv, pct, pip, publish

REPO = Path(__file__).resolve().parent.parent
DJANGO = "Django==5.2.*"  # the one series that supports every Python from 3.10 to 3.13
MINORS = (10, 11, 12, 13)
PASS_BUDGET = 1.5  # % more instructions for `python -c pass`, installed vs Django alone (MISSION.md): printed
HOOK_BUDGET = 0.75  # % of `python -c pass` for the check itself, beyond CPython's smallest import line: asserted
STATES = ("Django alone", "installed", "uninstalled", "any import line")
STRIP = ("PYTHON", "VIRTUAL_ENV", "DJANGO_", "SPOOL_REPORTER_")


def pythons() -> list[tuple[str, str]]:
    """``(X.Y, executable)`` of every Python 3.10-3.13 that runs here (a pyenv shim that refuses is absent)."""
    found = []
    for minor in MINORS:
        exe = sys.executable if sys.version_info[:2] == (3, minor) else shutil.which(f"python3.{minor}")
        if exe is None:
            continue
        probe = subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            found.append((f"3.{minor}", exe))
    return found


def measure(exe: str, wheel: Path, root: Path, env: dict[str, str], work: Path) -> tuple[str, dict[str, int]]:
    """The Python's full version, and the instructions of ``python -c pass`` in each state."""
    python = make_venv(root / "venv", exe)
    where = "import platform, sysconfig; print(sysconfig.get_paths()['purelib'], platform.python_version())"
    purelib, version = subprocess.run(
        [python, "-c", where],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.rsplit(maxsplit=1)

    def count(*argv: str) -> int:
        return instructions([python, *(argv or ("-c", "pass"))], env, work, root / "callgrind.out")

    pip("--python", python, "install", DJANGO)
    alone = count()
    pip("--python", python, "install", str(wheel))
    if not (Path(purelib) / "spool_reporter.pth").is_file():
        msg = f"the wheel installed no spool_reporter.pth into {purelib}"
        raise RuntimeError(msg)
    installed = count()
    stdin_installed = count("-", "/dev/null")  # sys.argv[0] is '-': passes the coarse check, then declined
    pip("--python", python, "uninstall", "-y", "spool_reporter")
    uninstalled = count()
    stdin_uninstalled = count("-", "/dev/null")
    probe = Path(purelib) / "zz_probe.pth"
    probe.write_text("import sys\n")
    any_line = count()
    probe.unlink()
    return version, {
        "Django alone": alone,
        "installed": installed,
        "uninstalled": uninstalled,
        "any import line": any_line,
        "stdin installed": stdin_installed,
        "stdin uninstalled": stdin_uninstalled,
    }


def main() -> int:
    if shutil.which("valgrind") is None:
        print("bench_startup: valgrind is required (apt-get install valgrind)", file=sys.stderr)
        return 2
    started = time.monotonic()
    found = pythons()
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIP)}
    env["PYTHONHASHSEED"] = "0"
    rows: list[dict[str, object]] = []
    budgets: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp_name:
        tmp = Path(tmp_name)
        isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
        pip("wheel", "--no-deps", *isolation, "-w", str(tmp / "wheel"), str(REPO))
        (wheel,) = (tmp / "wheel").glob("spool_reporter-*.whl")
        work = tmp / "work"  # an empty working directory: the same for every run
        work.mkdir()
        # Instructions do not depend on what else the machine runs: the Pythons are measured side by side, one per
        # core, each in its own folder (the shared working directory is only read).
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(found), os.cpu_count() or 1))) as pool:
            measured = list(pool.map(lambda found_: measure(found_[1], wheel, tmp / found_[0], env, work), found))
        for version, c in measured:
            alone, installed, uninstalled, any_line = (c[k] for k in STATES)
            declined = c["stdin installed"] - c["stdin uninstalled"]
            declined_pct = pct(c["stdin installed"], c["stdin uninstalled"])
            whole = pct(installed, alone)
            deps = pct(uninstalled, alone)
            cpython = (any_line - uninstalled) / alone * 100
            ours = (installed - any_line) / alone * 100
            rows.append(
                {
                    "Python": version,
                    "Django alone": f"{alone:,}",
                    "installed": f"{installed:,}",
                    "installed vs Django alone": f"{whole:+.3f} %",
                    "dependencies' entries": f"{deps:+.3f} %",
                    "CPython, any .pth import line": f"{cpython:+.3f} %",
                    "spool_reporter's check": f"{ours:+.3f} %",
                    "python - (coarse check passed, declined)": f"{declined:+,} ({declined_pct:+.2f} %)",
                }
            )
            budgets.append(
                {
                    "what": f"Python {version}: python -c pass, installed vs Django alone",
                    "measured": f"{whole:+.3f} %",
                    "budget": f"<= {PASS_BUDGET} %",
                    "ok": whole <= PASS_BUDGET,
                    "asserted": False,
                }
            )
            budgets.append(
                {
                    "what": f"Python {version}: the .pth line's own check, beyond CPython's smallest import line",
                    "measured": f"{ours:+.3f} %",
                    "budget": f"<= {HOOK_BUDGET} %",
                    "ok": ours <= HOOK_BUDGET,
                    "asserted": True,
                }
            )
    elapsed = time.monotonic() - started
    print(f"bench_startup: python -c pass instructions, {DJANGO}, {len(found)} Pythons, {elapsed:.0f} s")
    header = list(rows[0]) if rows else []
    for row in rows:
        print("  " + "; ".join(f"{k}: {row[k]}" for k in header))
    ok = publish("startup", "python benchmarks/bench_startup.py", rows, budgets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
