"""The client's command line and processes as the tests run them: ``django-spool`` as a real subprocess
(:func:`cli`), an environment without a destination (:func:`unnamed`), processes recording at the same moment
(:func:`record_together`), the files under a folder (:func:`snapshot`), whether a flusher runs
(:func:`flusher_idle`) and how many this process starts (:func:`count_starts`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spool_reporter import App, _hook, _spawn

from .polling import wait_for
from .sandbox import PACKAGE_FROM_CHECKOUT, Sandbox


def spool_command() -> list[str]:
    script = Path(sys.executable).parent / ("django-spool.exe" if os.name == "nt" else "django-spool")
    if script.exists():
        return [str(script)]
    assert PACKAGE_FROM_CHECKOUT, "the installed package must provide the django-spool console script"
    return [sys.executable, "-m", "spool_reporter.cli"]


def cli(sandbox: Sandbox, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*spool_command(), *args], env=env or sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )


def unnamed(sandbox: Sandbox, **extra: str) -> dict[str, str]:
    """The sandbox's environment without its destination (and with ``extra``)."""
    return {**{k: v for k, v in sandbox.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}, **extra}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its mode and content hash: "changes nothing" made checkable."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = f"{oct(st.st_mode)} {st.st_size} {st.st_mtime_ns} {digest}"
    return out


def record_together(sandbox: Sandbox, count: int = 6) -> list[tuple[str, str]]:
    """``count`` processes each calling ``record(..., notice=True)`` at the same moment: their stdout and stderr.

    A barrier of files: each process imports what it needs, says it is ready (``ready-<n>``) and waits for ``go``;
    ``go`` is written once every one is ready."""
    go = sandbox.root / "go"
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from spool_reporter import record
        from spool_reporter._hook import django_app
        open(os.path.join({str(sandbox.root)!r}, "ready-" + sys.argv[1]), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
            time.sleep(0.001)
        print(record("startproject", app=django_app("5.2"), notice=True))
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(n)],
            env=sandbox.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(count)
    ]
    ready = [sandbox.root / f"ready-{n}" for n in range(count)]
    wait_for(lambda: all(path.exists() for path in ready), timeout=60, what="every process at the start line")
    go.write_text("")
    return [p.communicate(timeout=60) for p in procs]


def flusher_idle(sandbox: Sandbox, app: App) -> bool:
    """No flusher holds flusher.lock (probed with the hook's own try-lock)."""
    path = sandbox.state_dir(app) / _hook.FLUSHER_LOCK_NAME
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        return _hook.try_lock(fd)
    finally:
        os.close(fd)


def count_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time this process starts a flusher (the real detached process)."""
    starts: list[int] = []
    real_start = _spawn._start

    def counting_start(spec: _spawn.SpawnSpec) -> bool:
        starts.append(1)
        return real_start(spec)

    monkeypatch.setattr(_spawn, "_start", counting_start)
    return starts
