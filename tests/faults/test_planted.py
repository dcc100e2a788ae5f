"""Planted files at every file the hook and the flusher open: recording and delivery recover, or count.

A symlink (to a file of the user's), a non-empty folder, a FIFO or another user's file is planted at each of the
spool folder's file names at once; then real commands record events (each may start the detached flusher) and
a detached flusher runs. Everything runs as an unprivileged user (``setpriv``): root ignores file modes, so
another user's file would open for root and the case would pass for the wrong reason.

With a healthy collector every event must arrive (and a cap drop planned by the test be counted exactly); with
a collector answering 500 every event must stay queued, and the back-off, the state and the log be recorded.
"""

from __future__ import annotations

import os
import stat
import sys
import time

import pytest

from ._helpers import (
    ATTACKER,
    ROOT,
    VICTIM,
    Figures,
    Victim,
    counters,
    flusher_idle,
    ids_in,
    scale_name,
    spool_bytes,
    tree,
    users_root,
)
from support.polling import wait_for
from support.sandbox import SANDBOX_ENDPOINT
from support.servers import Server

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: setpriv")]

OPENED = (
    "spool.jsonl",
    "spool.lock",
    "counters",
    "flusher.lock",
    "flush.spawned",
    "flush.notbefore",
    "state.json",
    "flush.log",
)
"""Files the scenario makes the hook and the flusher open (each planted entry must be replaced)."""

PASSIVE = ("refused", "flush.log.1")
"""Files opened only beside a lock busy for long, or at log rotation: planted too, and must never be followed."""

NAMES = OPENED + PASSIVE

COMMANDS = 3

RECORD = """
import sys
from spool_reporter import record
from spool_reporter._hook import django_app
print("hello", flush=True)
record("startproject", app=django_app("5.2"))
print("bye", flush=True)
sys.exit(7)
"""

FLUSH = """
import runpy, sys
sys.argv = ["spool_reporter._detached", "--app", "django"]
runpy.run_module("spool_reporter._detached", run_name="__main__", alter_sys=True)
"""

OLD_SEGMENT_EVENTS = 5
MAX_EVENTS = COMMANDS
"""The user's cap: the old segment the test seals beforehand must be dropped (and counted) at the claim."""


def _plant(victim: Victim, name: str, kind: str) -> None:
    path = victim.state_dir() / name
    if path.exists() or path.is_symlink():  # spool.lock, left by the recording of the old segment
        path.unlink()
    if kind == "symlink":
        path.symlink_to(victim.precious)
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_bytes(b"not ours\n")
        os.lchown(path / "inside", *victim.user)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "foreign":
        path.write_bytes(b"another user's file\n")
        path.chmod(0o600)
        os.lchown(path, *ATTACKER)
        return
    else:
        raise ValueError(kind)
    os.lchown(path, *victim.user)


def _old_segment(victim: Victim) -> None:
    """A sealed segment of ``OLD_SEGMENT_EVENTS`` valid events, older than anything recorded later."""
    result = victim.run(
        f"""
        import os
        from spool_reporter._hook import record_event
        from spool_reporter._hook import django_app
        from spool_reporter._hook import Folder
        # A named but refused destination: recorded (with no destination nothing is), and no flusher starts.
        env = {{**os.environ, "DJANGO_ANALYTICS_ENDPOINT": {SANDBOX_ENDPOINT!r}}}
        for _ in range({OLD_SEGMENT_EVENTS}):
            assert record_event("startapp", app=django_app("5.2"), environ=env)
        with Folder({str(victim.state_dir())!r}, create=False) as f:
            f.rename("spool.jsonl", "seg-00000000000000000001-1-{OLD_SEGMENT_EVENTS}.jsonl")
        """
    )
    assert result.returncode == 0, result


KINDS = ("symlink", "folder", "fifo", "foreign")
CASES = [
    pytest.param(kind, destination, user, id=f"{kind}-{destination}-{name}")
    for user, name in ((VICTIM, "unprivileged"), (ROOT, "root"))
    for destination in ("healthy", "failing")
    for kind in KINDS
    # As root, only the hook's own flusher start is new (an unprivileged user cannot start an interpreter that
    # lives under /root): the healthy destination is enough. At CI size, every kind against a healthy
    # destination as the unprivileged user, and two kinds for the rest.
    if (user == VICTIM or destination == "healthy")
    and (scale_name() == "full" or (user == VICTIM and destination == "healthy") or kind in ("symlink", "foreign"))
]


@pytest.mark.parametrize(("kind", "destination", "user"), CASES)
def test_planted_at_every_file(figures: Figures, kind: str, destination: str, user: tuple[int, int]) -> None:
    with users_root() as root, Server("healthy" if destination == "healthy" else "status", status=500) as server:
        victim = Victim(root, config_extra=f"max_events={MAX_EVENTS}\n", user=user)
        spawns = victim.can_start_python()
        env = dict(victim.env)
        env.update(
            DJANGO_ANALYTICS_ENDPOINT=server.url(),
            SPOOL_REPORTER_SPAWN_INTERVAL="0",
            # Generous: the hook starts its flushers at the lowest priority, which a loaded 2-core machine starves.
            SPOOL_REPORTER_FLUSH_DEADLINE="10",
        )
        folder = victim.state_dir()
        _old_segment(victim)
        old = set(ids_in(spool_bytes(folder)))
        for name in NAMES:
            _plant(victim, name, kind)
        outside = tree(victim.home)
        started = time.monotonic()
        worst = 0.0
        for _ in range(COMMANDS):
            t0 = time.monotonic()
            result = victim.run(RECORD, env=env)
            worst = max(worst, time.monotonic() - t0)
            assert (result.returncode, result.stdout, result.stderr) == (7, "hello\nbye\n", ""), result
            wait_for(
                lambda: flusher_idle(folder, str(victim.home)), timeout=60, what="background flushers", interval=0.02
            )
        # The commands' own flushers (the hook started them) must have delivered already.
        before_final = set(ids_in(spool_bytes(folder)))
        flushed = victim.run(FLUSH, env={**env, "SPOOL_REPORTER_FLUSHER": "1"})
        expected_exit = 0 if destination == "healthy" else 2  # 2: failed (here: backing off)
        log = (folder / "flush.log").read_text() if (folder / "flush.log").is_file() else ""
        assert (flushed.returncode, flushed.stdout, flushed.stderr) == (expected_exit, "", ""), (flushed, log)
        took = time.monotonic() - started
        queued = set(ids_in(spool_bytes(folder)))
        received = set(server.event_ids()) if destination == "healthy" else set()  # a 500 stores nothing
        entries = {p.name: p.lstat() for p in folder.iterdir()}
        dropped = counters(folder)
        log = (folder / "flush.log").read_text() if (folder / "flush.log").is_file() else ""
        gate = (folder / "flush.notbefore").lstat()
        state = (folder / "state.json").read_text() if (folder / "state.json").is_file() else ""
        after = tree(victim.home)
    assert after == outside, (
        f"a file outside the state folder changed: {sorted(set(after.items()) ^ set(outside.items()))}"
    )
    for name in OPENED:
        if name in entries:
            st = entries[name]
            assert stat.S_ISREG(st.st_mode), f"{name} is still the planted {kind}"
            assert st.st_uid == user[0], f"{name} is still the planted {kind}"
    recorded = len(queued | received) - len(old & (queued | received))
    assert dropped == {"cap": OLD_SEGMENT_EVENTS}, dropped  # the old segment, dropped by the cap
    if destination == "healthy":
        assert len(received) == COMMANDS, (f"{len(received)} of {COMMANDS} delivered; {len(queued)} queued", log)
        assert not queued
        if spawns:
            assert not before_final, "the flushers the commands started did not deliver"
        assert "delivered" in log
    else:
        assert len(queued) == COMMANDS, f"{len(queued)} of {COMMANDS} events kept"
        assert stat.S_ISREG(gate.st_mode), "no back-off was recorded"
        assert gate.st_mtime > time.time(), "no back-off was recorded"
        assert '"last_result": "failed"' in state, state
        assert "failed" in log
    figures.row(
        fault=f"{kind} planted at every file of the spool folder, destination {destination}, "
        f"{'root' if user == ROOT else 'unprivileged user'}",
        injected=f"a {'symlink to a file of the user' if kind == 'symlink' else kind} at {', '.join(NAMES)}; "
        f"{COMMANDS} commands recording (each {'starts' if spawns else 'would start'} the flusher), then a "
        "detached flusher",
        trials=COMMANDS,
        recorded=recorded,
        delivered=len(received),
        lost=recorded - len(received) - len(queued - old),
        worst_s=worst,
        checked=(
            "every event delivered"
            if destination == "healthy"
            else "every event kept; back-off, state.json and flush.log written"
        )
        + f"; the old segment's {OLD_SEGMENT_EVENTS} events dropped by the cap and counted exactly"
        + f"; every planted entry replaced by a regular file of the user's; nothing outside touched ({took:.1f} s)",
    )
