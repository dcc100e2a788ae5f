"""A command killed while it keeps its event beside a busy lock leaves ``.aside-*.tmp``: the next flusher keeps a
complete line (as its own segment), and removes an empty or torn one (a torn line counted as ``corrupt``).

Another process holds ``spool.lock`` for the whole command, so ``record()`` takes the lock-free path; the command
is then SIGKILLed by itself at the chosen instant (its ``os.rename`` or ``os.write`` replaced by a ``SIGKILL`` of
its own process for the aside file only), a real kill at an exact point.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from spool_reporter._hook import django_app

from ._helpers import Figures, counters, flusher_cmd, ids_in, python_cmd, spool_bytes
from support.servers import Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: flock, signals")]

APP = django_app("5.2")

KILLED = """
import os, signal, sys
from spool_reporter import record
from spool_reporter._hook import django_app
point = sys.argv[1]
real_write, real_rename = os.write, os.rename
aside = []

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def write(fd, data):
    if aside and point == "before-write":
        die()
    if aside and point == "mid-line":
        real_write(fd, bytes(data)[: len(data) // 2])
        die()
    return real_write(fd, data)

def rename(src, dst, **kw):
    if str(src).startswith(".aside-") and point == "before-rename":
        die()
    return real_rename(src, dst, **kw)

real_open = os.open

def open_(path, flags, mode=0o777, **kw):
    if str(path).startswith(".aside-"):
        aside.append(path)
    return real_open(path, flags, mode, **kw)

os.write, os.rename, os.open = write, rename, open_
record("startapp", app=django_app("5.2"))
print("not killed", flush=True)
"""

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""

POINTS = {
    "before-rename": ("the whole line written, killed before the rename", 1, {}),
    "mid-line": ("half the line written, then killed", 0, {"corrupt": 1}),
    "before-write": ("killed between open and write", 0, {}),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_killed_beside_a_busy_lock(sandbox: Sandbox, figures: Figures, point: str) -> None:
    title, kept, expected_counts = POINTS[point]
    sandbox.write_user(APP, "disable=0\n")
    fill(APP, sandbox.env, 2)  # creates the folder and the client id; two events queued normally
    folder = sandbox.state_dir(APP)
    queued = set(ids_in(spool_bytes(folder)))
    holder = subprocess.Popen(
        [*python_cmd(HOLD), str(folder / "spool.lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        killed = subprocess.run(
            [*python_cmd(KILLED), point], env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        holder.communicate(input="", timeout=30)
    assert killed.returncode == -9, killed
    leftovers = sorted(p.name for p in folder.glob(".aside-*.tmp"))
    assert len(leftovers) == 1, leftovers
    with Server() as server:
        started = time.monotonic()
        result = subprocess.run(
            flusher_cmd(), env=with_destination(sandbox.env, server.url()), capture_output=True, timeout=60, check=False
        )
        took = time.monotonic() - started
        received = set(server.event_ids())
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b""), result
    assert not list(folder.glob(".aside-*")), "the leftover is still there"
    assert len(received - queued) == kept, (received, queued)
    assert received >= queued
    assert counters(folder) == expected_counts
    log = (folder / "flush.log").read_text()
    assert ".aside-" in log
    figures.row(
        fault=f"command killed beside a busy lock: {title}",
        injected="another process holds spool.lock; record() writes .aside-<pid>-<random>.tmp and is SIGKILLed "
        f"({point}); then a detached flusher runs",
        trials=1,
        recorded=len(queued) + kept,
        delivered=len(received),
        lost=len(queued) + kept - len(received),
        worst_s=took,
        checked="the leftover is gone; "
        + ("its complete line was delivered" if kept else f"nothing invented; counters {expected_counts or '{}'}")
        + "; the log names it",
    )


def test_a_fresh_aside_file_of_a_live_writer_is_left_alone(sandbox: Sandbox) -> None:
    # A writer that is still alive and wrote it a moment ago may rename it any microsecond now.
    sandbox.write_user(APP, "disable=0\n")
    fill(APP, sandbox.env, 1)
    folder = sandbox.state_dir(APP)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        name = folder / f".aside-{live.pid}-00000000.tmp"
        name.write_bytes(b"")
        name.chmod(0o600)
        with Server() as server:
            env = with_destination(sandbox.env, server.url())
            result = subprocess.run(flusher_cmd(), env=env, capture_output=True, timeout=60, check=False)
        assert result.returncode == 0, result
        assert name.exists()
    finally:
        live.communicate(input=b"", timeout=30)
