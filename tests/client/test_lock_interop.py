"""One lock protocol, two implementations: a filelock holder excludes the hook, and the reverse."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import pytest

from spool_reporter import App
from spool_reporter._hook import Folder, lock_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX; Windows uses msvcrt.locking")


@contextmanager
def holder(code: str, env: dict[str, str]) -> Iterator[None]:
    """A real process that takes the lock, says so, and holds it until we close its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "held\n"
        yield
    finally:
        proc.communicate(input="", timeout=30)
    assert proc.returncode == 0


def folder_of(sandbox: Sandbox, app: App) -> Path:
    path = sandbox.state_dir(app)
    path.mkdir(parents=True, mode=0o700)
    return path


def test_filelock_holder_excludes_the_hook(sandbox: Sandbox, app: App) -> None:
    path = folder_of(sandbox, app)
    code = f"""
    import sys, filelock
    with filelock.FileLock({str(path / "spool.lock")!r}, mode=0o600):
        print("held", flush=True)
        sys.stdin.read()
    """
    with Folder(str(path), create=False) as folder:
        with holder(code, sandbox.env):
            assert lock_fd(folder) is None
        fd = lock_fd(folder)  # released: the hook gets it at once
        assert fd is not None
        import os

        os.close(fd)


def test_hook_holder_excludes_filelock(sandbox: Sandbox, app: App) -> None:
    path = folder_of(sandbox, app)
    code = f"""
    import os, sys
    from spool_reporter._hook import Folder
    from spool_reporter._hook import lock_fd
    folder = Folder({str(path)!r}, create=False)
    fd = lock_fd(folder)
    assert fd is not None
    print("held", flush=True)
    sys.stdin.read()
    os.close(fd)
    """
    lock = filelock.FileLock(str(path / "spool.lock"), mode=0o600)
    with holder(code, sandbox.env), pytest.raises(filelock.Timeout):
        lock.acquire(timeout=0.2)
    with lock.acquire(timeout=5):
        assert lock.is_locked
