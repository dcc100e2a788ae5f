"""Shared helpers for the benchmarks: percentiles, a fixed-format table, and publishing figures for the docs.

Each ``bench_*.py`` prints its figures, writes them to ``docs/_generated/<name>.json`` (the docs'
Performance page renders those files; commit them after a local ``nox -s bench``), and exits non-zero when
a budget is exceeded.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

GENERATED = Path(__file__).resolve().parent.parent / "docs" / "_generated"


def throwaway_postgres() -> Any:
    """The tests' throw-away PostgreSQL (``tests/support/pg.py``: ``server(fsync=...)``, ``Unavailable``), loaded
    from its file: putting ``tests/`` on ``sys.path`` would make every module there importable by a bare name, and
    the repository itself would shadow the installed package ``nox -s bench`` measures."""
    import importlib.util

    name = "spool_tests_support_pg"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent.parent / "tests" / "support" / "pg.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # one server per process, however many callers
    spec.loader.exec_module(module)
    return module


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def publish(
    name: str,
    command: str,
    figures: Mapping[str, object] | Sequence[Mapping[str, object]],
    budgets: list[dict[str, object]],
) -> bool:
    """Write ``docs/_generated/<name>.json``; print budgets; return whether all asserted ones were met.

    ``figures`` is a mapping (one figure per key) or a list of rows (a table). A budget with
    ``"asserted": False`` is printed and published with its result but does not fail the run.
    """
    GENERATED.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "command": command, "machine": machine(), "figures": figures, "budgets": budgets}
    # Whole or not at all: the docs tests may read the file meanwhile (``scripts/dev.py test --with-check`` runs the
    # benchmarks that count instructions beside them).
    partial = GENERATED / f".{name}.json.{os.getpid()}"
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, GENERATED / f"{name}.json")
    return report(budgets)


def report(budgets: list[dict[str, object]]) -> bool:
    """Print budgets (what :func:`publish` prints, for a run that publishes nothing); whether all asserted ones were
    met."""
    # Asserted budgets and informational targets look different, so that a green run never shows "over".
    for b in budgets:
        if b.get("asserted", True):
            print(f"  budget {'OK  ' if b['ok'] else 'FAIL'} {b['what']}: {b['measured']} (budget {b['budget']})")
    for b in budgets:
        if not b.get("asserted", True):
            where = "within" if b["ok"] else "above"
            print(f"  info (not asserted) {b['what']}: {b['measured']}, {where} the target {b['budget']}")
    sys.stdout.flush()
    return all(bool(b["ok"]) for b in budgets if b.get("asserted", True))


def post_over_http(host: str, port: int, bodies: Sequence[bytes], who: str) -> int:
    """POST each of ``bodies`` to ``/v1/batch`` on its own connection, as a flusher's run does; the events
    accepted. Any answer but ``200`` ends the process, naming ``who``."""
    accepted = 0
    for body in bodies:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", "/v1/batch", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        conn.close()
        if response.status != 200:
            raise SystemExit(f"{who}: HTTP {response.status} {answer[:200]!r}")
        accepted += json.loads(answer)["accepted"]
    return accepted


def post_in_process(app: object, bodies: Sequence[bytes], who: str) -> float:
    """POST each of ``bodies`` to ``/v1/batch`` of the WSGI application ``app`` called directly, in this thread,
    no HTTP; the seconds taken. Any answer but ``200`` ends the process, naming ``who``."""
    started = time.perf_counter()
    for body in bodies:
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/v1/batch", "CONTENT_TYPE": "application/json",
                   "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}  # fmt: skip
        status: list[str] = []
        b"".join(app(environ, lambda s, h, seen=status: seen.append(s)))  # type: ignore[operator]
        if not status[0].startswith("200"):
            raise SystemExit(f"{who}: {status[0]}")
    return time.perf_counter() - started


UV_ENV = "SPOOL_REPORTER_UV"
"""The uv of nox's ``bench`` session (the noxfile sets it), which fills the benchmarks' throw-away environments."""


def pip(*args: str) -> None:
    """``python -m pip`` of this interpreter, quiet; ``--python X`` installs into another environment, with
    ``$SPOOL_REPORTER_UV`` when set (``uv pip install``: about 1 s where pip takes 5-10), compiling the bytecode
    as pip does, so that no measured run is the first to compile a module."""
    uv = os.environ.get(UV_ENV, "").strip()
    if uv and args[:1] == ("--python",) and len(args) > 2 and args[2] in ("install", "uninstall"):
        python, verb, *rest = args[1:]
        compiled = ["--compile-bytecode"] if verb == "install" else []
        cmd = [uv, "pip", verb, "--quiet", *compiled, "--python", python, *(a for a in rest if a != "-y")]
    else:
        cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", *args]
    subprocess.run(cmd, check=True, timeout=600)


def make_venv(root: Path, python: str = sys.executable) -> str:
    """A bare virtual environment (no pip; symlinks) of ``python`` at ``root``; returns its interpreter."""
    subprocess.run([python, "-m", "venv", "--without-pip", "--symlinks", "--clear", str(root)], check=True, timeout=120)
    return str(root / "bin" / "python")


def instructions(argv: list[str], env: dict[str, str], cwd: Path, out: Path) -> int:
    """Instructions executed by the process (not its children), from callgrind's ``summary:`` line."""
    cmd = ["valgrind", "--tool=callgrind", "--trace-children=no", f"--callgrind-out-file={out}", *argv]
    subprocess.run(cmd, cwd=cwd, env=env, check=True, timeout=300, capture_output=True)
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    msg = f"no summary in {out}"
    raise RuntimeError(msg)


def pct(a: int, b: int) -> float:
    """How much more ``a`` is than ``b``, in per cent."""
    return (a - b) / b * 100


class SilentDestination:
    """A loopback port that accepts connections and never answers (the worst destination there is); ``accepted``
    counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)  # read nothing, answer nothing, close nothing

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


def flusher_idle(spool: Path) -> bool:
    """No process holds ``flusher.lock`` in the spool folder ``spool`` (a non-blocking ``flock`` of our own, as the
    hook's try-lock; POSIX)."""
    import fcntl

    lock = spool / "flusher.lock"
    if not lock.exists():
        return True
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
