"""The main job: a real Django command reported end to end, offline, in throw-away folders.

Run it with ``python3 scripts/dev.py demo`` (which installs ``spool_reporter[django]`` into a nox virtual
environment, so the ``.pth`` hook is armed exactly as for a user). Step by step it:

1. makes a temporary home with its own config and state folders (the user's real ones are never read or
   touched) and starts the self-hosted collector on a free loopback port with a temporary SQLite file;
2. shows ``django-spool status`` there: off, because no destination is configured (the reference
   integration ships none; nothing is recorded until one is set), then points reporting at the collector
   and opts in locally with ``django-spool enable --local --endpoint URL`` (which writes the config file and
   its missing folder): events are recorded, nothing is sent;
3. runs real ``django-admin startproject`` and ``python manage.py startapp``: each records one event, kept
   in local mode's own folder, and the first prints the one-time notice (local mode's) on stderr; no
   flusher starts;
4. shows ``django-spool status`` and ``django-spool flush --dry-run``: what is queued, and exactly what would
   leave once sending is on;
5. moves to sending with ``django-spool enable`` (which moves the events recorded in local mode into the
   queue and says how many will leave, and where), runs a short
   ``python manage.py runserver`` (long-lived, so it starts the detached flusher), waits until it serves a
   page, and stops it with SIGINT;
6. waits (bounded) for the detached flusher to deliver, then prints ``django-spool status`` and the
   collector's weekly statistics; stops the collector and deletes everything.

Nothing leaves 127.0.0.1. The whole run is bounded by :data:`DEMO_DEADLINE` seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Final

DEMO_DEADLINE: Final = 120.0
"""The demo ends by itself within this many seconds, whatever happens."""

BIN: Final = Path(sys.executable).parent
STRIP_PREFIXES: Final = ("DJANGO_", "XDG_", "SPOOL_REPORTER_")
STRIP: Final = {"DO_NOT_TRACK", "RUN_MAIN", "PYTHONPATH", "HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"}

_started = time.monotonic()


def left() -> float:
    return max(1.0, DEMO_DEADLINE - (time.monotonic() - _started))


def title(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


def show(cmd: Sequence[str], env: dict[str, str], cwd: Path, *, shown: str | None = None) -> str:
    """Run a command, echo it and its stdout/stderr (stderr marked), return stdout."""
    print(f"$ {shown or ' '.join(cmd)}", flush=True)
    result = subprocess.run(
        list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=min(60.0, left()), check=False
    )
    for line in result.stdout.splitlines():
        print(f"  {line}")
    for line in result.stderr.splitlines():
        print(f"  [stderr] {line}")
    if result.returncode not in (0, 1):
        raise SystemExit(f"demo: {shown or cmd[0]} exited {result.returncode}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[str], sig: int) -> None:
    """Send ``sig`` to ``proc``'s process group (POSIX; ``start_new_session`` made one), or to ``proc`` alone."""
    with contextlib.suppress(ProcessLookupError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def wait_for(predicate: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + min(timeout, left())
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise SystemExit(f"demo: timed out waiting for {what}")


def main() -> int:
    if shutil.which("django-admin", path=str(BIN)) is None:
        print("demo: run it through `python3 scripts/dev.py demo` (needs spool_reporter[django])", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="spool-demo-"))
    collector: subprocess.Popen[str] | None = None
    try:
        home = tmp / "home"
        work = tmp / "work"
        home.mkdir()
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in STRIP and not k.startswith(STRIP_PREFIXES)}
        env.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_STATE_HOME=str(home / ".local" / "state"),
            XDG_CONFIG_DIRS=str(home / "etc-xdg"),
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        spool = [str(BIN / "django-spool")]
        print(f"demo: a temporary home in {home} (your own config and spool are not touched)")

        title("1. start the self-hosted collector on loopback")
        db = tmp / "collector.sqlite3"
        collector = subprocess.Popen(
            [*spool, "collector", "serve", "--host", "127.0.0.1", "--port", "0", "--db", str(db)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert collector.stdout is not None
        first = collector.stdout.readline().strip()
        if not first.startswith("listening on "):
            raise SystemExit(f"demo: the collector did not start ({first!r})")
        url = first.removeprefix("listening on ")
        print(f"  collector: {url}")

        title("2. nothing is recorded until a destination is set; point it at the collector, opt in locally")
        show([*spool, "status"], env, work, shown="django-spool status")
        # The demo's home is new (no config folder yet), and CI machines are off unless the user says yes: name
        # the collector and opt in explicitly in one command, locally first (recorded, never sent), to look
        # before anything leaves. enable writes the file this platform reads and creates its folder.
        enable = [*spool, "enable", "--local", "--endpoint", url]
        show(enable, env, work, shown=f"django-spool enable --local --endpoint {url}")
        if not (home / ".config" / "djangoanalytics").is_file():
            raise SystemExit("demo: enable --endpoint did not write the config file")

        title("3. real Django commands (the first prints the one-time notice; local mode: no flusher)")
        show(["django-admin", "startproject", "demo_site"], env, work, shown="django-admin startproject demo_site")
        site = work / "demo_site"
        show([sys.executable, "manage.py", "startapp", "polls"], env, site, shown="python manage.py startapp polls")

        title("4. look before anything leaves")
        show([*spool, "status"], env, work, shown="django-spool status")
        show([*spool, "flush", "--dry-run"], env, work, shown="django-spool flush --dry-run")

        title("5. start sending, and a short runserver: long-lived, so it starts the detached flusher")
        show([*spool, "enable"], env, work, shown="django-spool enable")
        port = free_port()
        print(f"$ python manage.py runserver 127.0.0.1:{port}   (stopped with Ctrl-C once it serves a page)")
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}"],
            env=env,
            cwd=site,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            # A process group of its own, as a terminal gives it: Ctrl-C reaches the autoreloader and the server it
            # runs as its child, which a signal to the parent alone left serving after the demo ended.
            start_new_session=True,
        )
        try:

            def serves() -> bool:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                        return r.status == 200
                except OSError as exc:
                    return getattr(exc, "code", None) is not None  # an HTTP error page is still serving

            wait_for(serves, "runserver to serve a page", 30)
            print(f"  runserver answered http://127.0.0.1:{port}/")
        finally:
            stop(server, signal.SIGINT)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop(server, getattr(signal, "SIGKILL", signal.SIGTERM))
                server.wait(timeout=10)

        title("6. the detached flusher delivers; the collector counts developers")

        def delivered() -> bool:
            out = subprocess.run(
                [*spool, "collector", "stats", "--db", str(db), "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
            try:
                weeks = json.loads(out)["weeks"]
            except (ValueError, KeyError):
                return False
            return sum(int(w["events"]) for w in weeks) >= 3

        wait_for(delivered, "the detached flusher to deliver 3 events", 60)
        show([*spool, "status"], env, work, shown="django-spool status")
        show(
            [*spool, "collector", "stats", "--db", str(db)],
            env,
            work,
            shown=f"django-spool collector stats --db {db.name}",
        )
        # The public side: only stored releases, made with differential privacy once a week has ended.
        show(
            [*spool, "collector", "stats", "--db", str(db), "--public"],
            env,
            work,
            shown=f"django-spool collector stats --db {db.name} --public",
        )
        print("\ndemo: done - 3 real commands recorded, inspected, delivered and counted, all on this machine.")
        return 0
    finally:
        if collector is not None:
            collector.terminate()
            try:
                collector.wait(timeout=10)
            except subprocess.TimeoutExpired:
                collector.kill()
            if collector.stdout is not None:
                collector.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
