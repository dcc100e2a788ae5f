"""A real PostgreSQL server for the tests: ``initdb`` and ``pg_ctl`` into a temporary folder, reached over a
unix socket in that folder (nothing listens on the network), one server per test process.

Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``; ``.ci/run`` installs it where it is
missing). ``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user, through
``setpriv``. Each test gets its own schema (``search_path`` in the URL), so tests never see each other's rows
and need no ``CREATE DATABASE``. Where PostgreSQL or psycopg cannot be had, :func:`server` says why, and
the tests skip with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import quote

START_TIMEOUT_S = 60
"""initdb and the first start take a few seconds on a loaded 2-core machine."""


class Unavailable(Exception):
    """PostgreSQL cannot be had here; the message says why (the skip reason)."""


class Server:
    """A running server; :meth:`url` hands out a fresh schema each call."""

    def __init__(self, root: Path, bindir: Path, run_as: list[str]) -> None:
        self.root = root
        self.bindir = bindir
        self._run_as = run_as
        self._schemas = itertools.count()

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@/postgres?host={quote(str(self.root), safe='')}"

    def url(self, prefix: str = "t") -> str:
        """A URL whose ``search_path`` is a new, empty schema."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._schemas)}"
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.base_url}&options={quote(f'-csearch_path={name}', safe='')}"

    def stop(self) -> None:
        subprocess.run(
            [*self._run_as, str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


_lock = threading.Lock()
_server: Server | None = None
_failure: str | None = None


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise Unavailable("PostgreSQL is not installed (no initdb; Debian: apt-get install postgresql)")


def _start(*, fsync: bool) -> Server:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise Unavailable("psycopg 3 is not installed (pip install 'spool_reporter[collector]')") from exc
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="spool-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise Unavailable("running as root and there is no postgres user to run PostgreSQL as") from exc
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
    os.chmod(root, 0o700)
    data = root / "data"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
    steps = [
        [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C",
         "--no-sync"],
        [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-t", str(START_TIMEOUT_S),
         "-o", f"-c listen_addresses='' -c unix_socket_directories='{root}' -c fsync={'on' if fsync else 'off'} "
               "-c max_connections=200 -c shared_buffers=64MB", "start"],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(
            [*run_as, *step], capture_output=True, text=True, env=env, timeout=START_TIMEOUT_S + 30, check=False
        )
        if done.returncode != 0:
            log = (root / "log").read_text(errors="replace")[-2000:] if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"{Path(step[0]).name} failed: {(done.stderr or done.stdout).strip()[-500:]} {log}")
    return Server(root, bindir, run_as)


def server(*, fsync: bool = False) -> Server:
    """The test process's one server (started on first use, stopped at exit); :class:`Unavailable` if none.

    ``fsync=False`` for the tests (durability is PostgreSQL's, not under test; the benchmark turns it on).
    """
    global _server, _failure
    with _lock:
        if _server is not None:
            return _server
        if _failure is not None:
            raise Unavailable(_failure)
        try:
            _server = _start(fsync=fsync)
        except Unavailable as exc:
            _failure = str(exc)
            raise
        atexit.register(_stop)
        return _server


def _stop() -> None:
    global _server
    if _server is not None:
        with contextlib.suppress(Exception):
            _server.stop()
        _server = None
