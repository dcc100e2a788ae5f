"""The tests' one way to wait for something another process or thread does: poll, bounded in time and count."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], object], *, timeout: float = 10.0, what: str = "the condition", interval: float = 0.02
) -> None:
    """Poll ``predicate`` until it is true: at most ``timeout`` seconds and ``timeout / interval`` polls (never a
    bare sleep-and-hope); a test that waits longer fails, naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 2):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def stop_process(proc: subprocess.Popen[bytes], *, grace: float) -> int | None:
    """Stop ``proc`` as a service manager does: ``SIGTERM``, then at most ``grace`` seconds for it to exit; its
    exit status, or ``None`` if it had to be killed (``SIGKILL``, then waited for, bounded)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return None
