"""Helpers of the fault suite: trial counts, the figures table, processes, the collector, /proc scans.

Every loop here is bounded by a count and a time; nothing talks to anything but loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
GENERATED = REPO / "docs" / "_generated"
FIGURES_NAME = "reliability.json"

SCALE_ENV = "SPOOL_FAULTS_SCALE"
OUT_ENV = "SPOOL_FAULTS_OUT"

SCALES: dict[str, dict[str, int]] = {
    # Small but real: every fault injected, a few trials each (the CI step).
    "ci": {
        "load_writers": 6,
        "load_events": 60,
        "writer_kills": 25,
        "flusher_kills": 25,
        "point_kills": 3,
        "behaviour_trials": 1,
        "storm_commands": 60,
        "storm_seconds": 8,
        "storm_parallel": 3,
        "fuzz_examples": 150,
        "storage_reps": 1,
        "race_seconds": 4,
        "race_iterations": 40_000,
    },
    # The published figures (docs/_generated/reliability.json).
    "full": {
        "load_writers": 40,
        "load_events": 500,
        "writer_kills": 300,
        "flusher_kills": 300,
        "point_kills": 25,
        "behaviour_trials": 5,
        "storm_commands": 400,
        "storm_seconds": 60,
        "storm_parallel": 4,
        "fuzz_examples": 2000,
        "storage_reps": 3,
        "race_seconds": 40,
        "race_iterations": 400_000,
    },
}


def scale_name() -> str:
    name = os.environ.get(SCALE_ENV, "ci").strip().lower() or "ci"
    if name not in SCALES:
        raise ValueError(f"{SCALE_ENV} must be one of {', '.join(SCALES)}, got {name!r}")
    return name


def scale(key: str) -> int:
    return SCALES[scale_name()][key]


# --- the figures table ---------------------------------------------------------------------------------


NA = "-"


@dataclass
class Figures:
    """Rows of the reliability table, one per fault; written at the end of the session (see conftest)."""

    rows: list[dict[str, object]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def row(
        self,
        *,
        fault: str,
        injected: str,
        trials: int,
        recorded: int | None = None,
        delivered: int | None = None,
        lost: int | None = None,
        duplicated: int | None = None,
        worst_s: float | None = None,
        checked: str = "",
    ) -> None:
        def n(value: int | None) -> object:
            return NA if value is None else value

        self.rows.append(
            {
                "fault": fault,
                "how injected": injected,
                "trials": trials,
                "recorded": n(recorded),
                "delivered": n(delivered),
                "lost": n(lost),
                "duplicated": n(duplicated),
                "worst case": NA if worst_s is None else f"{worst_s:.3f} s",
                "checked": checked,
            }
        )

    def document(self, *, scale: str, elapsed: float) -> dict[str, object]:
        return {
            "name": "reliability",
            "title": f"Fault suite: {len(self.rows)} faults, scale {scale!r}, {elapsed:.0f} s",
            "command": "nox -s faults (SPOOL_FAULTS_SCALE=full pytest tests/faults)"
            if scale == "full"
            else f"SPOOL_FAULTS_SCALE={scale} pytest tests/faults",
            "machine": machine(),
            "figures": self.rows,
        }


def machine() -> dict[str, object]:
    """The benchmarks' machine description (``benchmarks/_common.py``), so both pages read alike."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_spool_bench_common", REPO / "benchmarks" / "_common.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.machine())


# --- processes -----------------------------------------------------------------------------------------


def python_cmd(code: str) -> list[str]:
    import textwrap

    return [sys.executable, "-c", textwrap.dedent(code)]


def flusher_cmd() -> list[str]:
    """The detached flusher as the hook starts it (``-P``: no working directory on ``sys.path``), for Django."""
    return [
        sys.executable,
        *(["-P"] if sys.version_info >= (3, 11) else []),
        "-m",
        "spool_reporter._detached",
        "--app",
        "django",
    ]


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "spool_reporter.cli", *args]


def kill(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` if it still runs, and reap it (bounded)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"no output from {proc.args!r} within {timeout}s")
        return proc.stdout.readline()
    finally:
        sel.close()


class Collector:
    """``python -m spool_reporter.collector serve --port 0 --db PATH`` as a real process."""

    def __init__(self, db: Path, env: dict[str, str]) -> None:
        self.db = db
        self.proc = subprocess.Popen(
            # No per-client weekly cap (a trial sends thousands of events from one client id), and any event
            # name for Django (the trials name their events to find each one again).
            [
                sys.executable,
                "-m",
                "spool_reporter.collector",
                "serve",
                "--port",
                "0",
                "--db",
                str(db),
                "--max-per-client-week",
                "0",
                "--commands",
                "Django=*",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        line = read_line(self.proc, 30)
        assert line.startswith("listening on http://127.0.0.1:"), line
        self.url = line.split()[-1]
        self.counts: dict[str, int] = {}

    def stop(self) -> dict[str, int]:
        """SIGTERM; the server prints its counters on the way out."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        m = re.search(
            r"stopped after (\d+) requests?: (\d+) events? stored, (\d+) duplicates?, (\d+) requests? refused", out
        )
        assert m, (out, err)
        self.counts = dict(zip(("requests", "stored", "duplicates", "refused"), map(int, m.groups()), strict=True))
        return self.counts

    def close(self) -> None:
        if self.proc.poll() is None:
            kill(self.proc)
        else:
            self.proc.communicate(timeout=30)

    def rows(self) -> list[tuple[str, str]]:
        """``(event_id, event)`` of every stored row."""
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            return list(conn.execute("SELECT event_id, event FROM events"))
        finally:
            conn.close()


@contextlib.contextmanager
def collector(db: Path, env: dict[str, str]) -> Iterator[Collector]:
    c = Collector(db, env)
    try:
        yield c
    finally:
        c.close()


# --- /proc ---------------------------------------------------------------------------------------------


def _read(path: str, limit: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def flushers_of(marker: str) -> dict[int, str]:
    """Flusher processes (``spool_reporter._detached`` on the command line) whose environment holds ``marker``
    (our sandbox's HOME): ``{pid: state}``, with the one-letter state from ``/proc/<pid>/stat``."""
    found = {}
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        cmdline = _read(f"/proc/{entry}/cmdline", 4096)
        if b"spool_reporter._detached" not in cmdline:
            continue
        if needle not in _read(f"/proc/{entry}/environ"):
            continue
        found[int(entry)] = process_state(int(entry))
    return found


def flusher_idle(folder: Path, marker: str) -> bool:
    """No flusher of this sandbox runs: none in the process table (``marker`` in its environment) and
    ``flusher.lock`` free (a flusher holds it from its first instruction; a process in the middle of an exec
    can briefly show no command line)."""
    import fcntl

    if flushers_of(marker):
        return False
    try:
        fd = os.open(folder / "flusher.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (one of its descriptors in ``/proc/<pid>/fd`` points at it)."""
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def process_state(pid: int) -> str:
    raw = _read(f"/proc/{pid}/stat", 4096)
    if not raw:
        return "gone"
    return raw.rpartition(b")")[2].split()[0].decode()


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        out += [int(c) for c in _read(f"/proc/{pid}/task/{task}/children").split()]
    return out


SLEEP_SYSCALLS = {"x86_64": {"35", "230"}, "aarch64": {"101", "115"}}
"""``nanosleep`` / ``clock_nanosleep`` numbers: where a thread sits in ``time.sleep`` (filelock's retry)."""


def main_thread_syscall(pid: int) -> str:
    """The system call the main thread of ``pid`` is blocked in (a number), ``running`` or ``gone``."""
    raw = _read(f"/proc/{pid}/task/{pid}/syscall", 256).split()
    return raw[0].decode() if raw else "gone"


# --- files ---------------------------------------------------------------------------------------------


def tree(root: Path, *, skip: Path | None = None) -> dict[str, str]:
    """Every entry under ``root`` (not following links) with type, mode, size, mtime and content hash."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if skip is not None and Path(dirpath) == skip:
            dirnames[:] = []
            continue
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if skip is not None and path == skip:
                continue
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read(1 << 24)).hexdigest()[:16]
            elif stat.S_ISLNK(st.st_mode):
                digest = "-> " + os.readlink(path)
            else:
                digest = stat.filemode(st.st_mode)[0]
            out[str(path.relative_to(root))] = f"{stat.filemode(st.st_mode)} {st.st_size} {st.st_mtime_ns} {digest}"
    return out


def event_names(data: bytes) -> list[str]:
    """``event`` of every valid spooled event in ``data``."""
    from spool_reporter._spool import parse_lines

    events, _ = parse_lines(data)
    return [str(e["event"]) for e in events]


def spool_bytes(folder: Path) -> bytes:
    if not folder.is_dir():
        return b""
    parts = []
    for path in [*sorted(folder.glob("seg-*.jsonl")), folder / "spool.jsonl"]:
        if path.is_file() and not path.is_symlink():
            parts.append(path.read_bytes())
            if not parts[-1].endswith(b"\n"):
                parts.append(b"\n")
    return b"".join(parts)


def counters(folder: Path) -> dict[str, int]:
    path = folder / "counters"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().split():
        k, _, v = line.partition("=")
        if v.isascii() and v.isdigit():
            out[k] = int(v)
    return out


def ids_in(data: bytes) -> list[str]:
    from spool_reporter._spool import parse_lines

    events, _ = parse_lines(data)
    return [str(e["event_id"]) for e in events]


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


# --- a resolver that never answers -----------------------------------------------------------------------


@dataclass
class SilentResolver:
    """What :func:`silent_dns` yields: the command prefix that runs a process with it, and what it was asked."""

    prefix: list[str]
    queries: list[bytes]


@contextlib.contextmanager
def silent_dns(root: Path) -> Iterator[SilentResolver]:
    """A resolver on 127.0.0.1:53 that reads queries and never answers, made the only one in a private mount
    namespace (``/etc/resolv.conf`` bind-mounted) for processes started with the yielded prefix."""
    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs root and unshare")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a parallel test would find the port taken and skip
        pytest.fail("silent_dns binds 127.0.0.1:53, which one test at a time can have: mark the test serial")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind(("127.0.0.1", 53))
    except OSError as exc:
        udp.close()
        pytest.skip(f"cannot bind 127.0.0.1:53: {exc}")
    resolv = root / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:3\n")
    stop = threading.Event()
    bind = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    resolver = SilentResolver(prefix=["unshare", "-m", "sh", "-c", bind, "sh", str(resolv)], queries=[])

    def swallow() -> None:
        udp.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                resolver.queries.append(udp.recv(4096))

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    try:
        yield resolver
    finally:
        stop.set()
        thread.join(5)
        udp.close()


# --- other users -----------------------------------------------------------------------------------------

VICTIM = (65534, 65534)
"""The user whose events are recorded (``nobody``/``nogroup``): root ignores file modes, so a permission case
run as root could pass for the wrong reason."""

ATTACKER = (65533, 65533)
"""Another local user, who can write a folder above the victim's state folder."""

ROOT = (0, 0)


def as_user(user: tuple[int, int]) -> list[str]:
    """The command prefix that runs a process as ``user`` (no supplementary groups)."""
    return ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]


@contextlib.contextmanager
def users_root() -> Iterator[Path]:
    """A fresh folder every user can enter (pytest's own temporary folders are root's alone); skips unless root
    with ``setpriv``."""
    from support.users import ROOT_WITH_SETPRIV

    if not ROOT_WITH_SETPRIV:
        pytest.skip(f"needs root, setpriv, and {sys.executable} with spool_reporter runnable by an unprivileged user")
    root = Path(tempfile.mkdtemp(prefix="spool-faults-users-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Victim:
    """An unprivileged user's home under ``root`` (config with a client id, reporting on), a folder every user can
    write holding the user's state (``XDG_STATE_HOME``), and a precious file and a folder of the user's outside
    both. :meth:`run` runs Python code as that user."""

    def __init__(self, root: Path, config_extra: str = "", *, user: tuple[int, int] = VICTIM) -> None:
        from spool_reporter._hook import uuid4

        self.user = user

        self.root = root
        self.home = root / "victim"
        config = self.home / "config"
        config.mkdir(parents=True)
        (config / "djangoanalytics").write_text(f"disable=0\nclient_id={uuid4()}\n{config_extra}")
        self.precious = self.home / "precious"
        self.precious.write_bytes(b"the victim's own file\n")
        self.decoy = self.home / "decoy"  # a folder of the victim's, where a planted link points
        self.decoy.mkdir()
        self.shared = root / "shared"
        self.shared.mkdir()
        self.shared.chmod(0o777)  # anyone may create, rename and delete entries (no sticky bit)
        for path in (self.home, *self.home.rglob("*")):
            os.lchown(path, *user)
        self.precious.chmod(0o644)
        from support.sandbox import clean_environ

        self.env = clean_environ(self.home)
        self.env["XDG_STATE_HOME"] = str(self.shared)

    def state_dir(self) -> Path:
        return Path(self.env["XDG_STATE_HOME"]) / "spool_reporter" / "django"

    def prefix(self) -> list[str]:
        """The command prefix that runs a process as this user (none for root)."""
        return as_user(self.user) if self.user != ROOT else []

    def can_start_python(self) -> bool:
        """Whether a process of this user can start ``sys.executable`` itself (as the hook starts the flusher):
        not where the interpreter lives in a folder only root may enter (``/root/.pyenv``)."""
        probe = [
            *self.prefix(),
            sys.executable,
            "-c",
            "import os, sys; os.execv(sys.executable, [sys.executable, '-c', ''])",
        ]
        return subprocess.run(probe, capture_output=True, timeout=60, check=False).returncode == 0

    def run(
        self, code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix(), sys.executable, "-c", textwrap.dedent(code), *args],
            env=self.env if env is None else env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
