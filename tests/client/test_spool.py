"""The spool with real processes and files: concurrency, damage, caps, permissions, hostile paths."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spool_reporter import App, record
from spool_reporter._counters import read_counters
from spool_reporter._hook import SEGMENT_BYTES, Folder
from spool_reporter._spool import count_queued, parse_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file semantics")

RECORD_LOOP = """
import sys
from spool_reporter import record
from spool_reporter._hook import django_app
app = django_app("5.2")
n = int(sys.argv[1]) if len(sys.argv) > 1 else {n}
ok = sum(record("startproject", app=app) for _ in range(n))
print(ok)
"""


def enable(sandbox: Sandbox, app: App, extra: str = "") -> None:
    sandbox.write_user(app, "disable=0\n" + extra)


def events_in(sandbox: Sandbox, app: App) -> list[dict[str, object]]:
    events, bad = parse_lines(b"\n".join(sandbox.spool_lines(app)))
    assert bad == 0
    return events


def test_many_concurrent_writers_lose_nothing_and_never_interleave(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    writers, each = 8, 250
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RECORD_LOOP.format(n=each)],
            env=sandbox.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(writers)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [int(o) for o in outs] == [each] * writers
    lines = sandbox.spool_lines(app)
    events, bad = parse_lines(b"\n".join(lines))
    assert bad == 0
    assert len(events) == len(lines) == writers * each
    assert len({e["event_id"] for e in events}) == writers * each
    assert len({e["client_id"] for e in events}) == 1
    # 2,000 lines of ~350 bytes cross SEGMENT_BYTES: sealing happened under contention too.
    assert list(sandbox.state_dir(app).glob("seg-*.jsonl"))


KILLED_MID_LINE = """
import os, resource, signal, sys
from spool_reporter import record
from spool_reporter._hook import django_app

# The file may grow by {room} bytes only: the kernel writes that much of the line and returns a short count.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))


def die_before_taking_it_back(event, args):
    # The append truncates a short write away; a writer killed first leaves the torn line in the file.
    if event == "os.truncate":
        os.kill(os.getpid(), signal.SIGKILL)


sys.addaudithook(die_before_taking_it_back)
record("startapp", app=django_app("5.2"))
"""


def test_writer_killed_mid_append_costs_only_that_line(sandbox: Sandbox, app: App) -> None:
    """A real writer dies in the middle of its line: the kernel wrote part of it (a short write), and SIGKILL
    came before the append could take the part back. The next appends start on a new line, so the torn line
    costs itself only. (A SIGKILL sent from outside almost never lands inside the one ``write`` of a line, so
    a loop of random kills passes without ever making a torn line: see the fault suite's figures.)"""
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    active = sandbox.state_dir(app) / "spool.jsonl"
    before = active.read_bytes()
    room = 100
    code = KILLED_MID_LINE.format(room=room, limit=len(before) + room)
    writer = subprocess.run([sys.executable, "-c", code], env=sandbox.env, capture_output=True, timeout=60, check=False)
    assert writer.returncode == -signal.SIGKILL, writer.stderr
    torn = active.read_bytes()
    assert torn.startswith(before)
    assert len(torn) == len(before) + room  # part of a line, no newline: what a writer killed mid-line leaves
    assert b"\n" not in torn[len(before) :]
    assert record("runserver", app=app, environ=sandbox.env)
    assert record("check", app=app, environ=sandbox.env)
    events, bad = parse_lines(active.read_bytes())
    assert bad == 1
    assert [e["event"] for e in events] == ["startproject", "runserver", "check"]


def test_torn_tail_is_isolated_by_the_next_append(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    active = sandbox.state_dir(app) / "spool.jsonl"
    with active.open("ab") as f:
        f.write(b'{"schema":1,"event_id":"torn')  # a writer died here
    assert record("startapp", app=app, environ=sandbox.env)
    assert record("runserver", app=app, environ=sandbox.env)
    events, bad = parse_lines(active.read_bytes())
    assert bad == 1
    assert [e["event"] for e in events] == ["startproject", "startapp", "runserver"]


def test_corrupt_lines_cost_only_themselves(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    active = sandbox.state_dir(app) / "spool.jsonl"
    good = active.read_bytes()
    hostile = [
        b"not json",
        b"\xff\xfe\x00garbage",
        b'{"schema":1}',
        json.dumps({**json.loads(good), "path": "/home/me/secret"}).encode(),
        b"[" * 100000,
        b"{}" * 2000,
    ]
    active.write_bytes(good + b"\n".join(hostile) + b"\n" + good)
    events, bad = parse_lines(active.read_bytes())
    assert len(events) == 2
    assert bad == len(hostile)


def test_count_cap_drops_oldest_first_and_counts_them(sandbox: Sandbox, app: App, run_py: object) -> None:
    enable(sandbox, app, "max_events=1000\n")
    total = 3000
    out = subprocess.run(
        [sys.executable, "-c", RECORD_LOOP.format(n=total)],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(out.stdout) == total
    events = events_in(sandbox, app)
    with Folder(str(sandbox.state_dir(app)), create=False) as folder:
        dropped = read_counters(folder).get("cap", 0)
        assert count_queued(folder) == len(events)
    assert dropped > 0
    assert len(events) + dropped == total  # nothing vanishes uncounted
    sealed = sum(1 for p in sandbox.state_dir(app).glob("seg-*.jsonl") for _ in p.read_bytes().splitlines())
    assert sealed <= 1000  # the cap holds for sealed segments; the active file adds at most one segment
    times = [str(e["time"]) for e in events]
    assert times == sorted(times)  # what is left is the newest, in order


def test_byte_cap(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app, f"max_bytes={SEGMENT_BYTES}\n")
    subprocess.run([sys.executable, "-c", RECORD_LOOP.format(n=3000)], env=sandbox.env, check=True, timeout=120)
    sealed = sum(p.stat().st_size for p in sandbox.state_dir(app).glob("seg-*.jsonl"))
    assert sealed <= SEGMENT_BYTES
    with Folder(str(sandbox.state_dir(app)), create=False) as folder:
        assert read_counters(folder)["cap"] + len(events_in(sandbox, app)) == 3000


def test_permissions_under_umask_000(sandbox: Sandbox, app: App, run_py: object) -> None:
    code = """
    import os
    os.umask(0)
    from spool_reporter import record
    from spool_reporter._hook import django_app
    print(record("startproject", app=django_app("5.2")))
    """
    result = run_py(code, sandbox.env)  # type: ignore[operator]
    assert result.stdout.strip() == "True", result.stderr
    state = sandbox.home / "state"
    created = [state, *state.rglob("*"), sandbox.config_dir, sandbox.user_file(app)]
    for path in created:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_wide_existing_folder_is_tightened(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    folder = sandbox.state_dir(app)
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert record("startproject", app=app, environ=sandbox.env)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize("name", ["spool.jsonl", "spool.lock"])
def test_symlink_planted_at_a_spool_file_is_removed_never_followed(
    sandbox: Sandbox, app: App, tmp_path: Path, name: str
) -> None:
    enable(sandbox, app)
    folder = sandbox.state_dir(app)
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    victim.chmod(0o644)
    (folder / name).symlink_to(victim)
    assert record("startproject", app=app, environ=sandbox.env)
    assert victim.read_bytes() == b"precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not (folder / name).is_symlink()
    assert [e["event"] for e in events_in(sandbox, app)] == ["startproject"]


def test_symlink_planted_at_the_folder_is_refused(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    enable(sandbox, app)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sandbox.state_dir(app).parent.mkdir(parents=True)
    sandbox.state_dir(app).symlink_to(elsewhere)
    assert not record("startproject", app=app, environ=sandbox.env)
    assert list(elsewhere.iterdir()) == []


def test_hard_link_planted_at_the_spool_is_refused(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    enable(sandbox, app)
    folder = sandbox.state_dir(app)
    folder.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.link(victim, folder / "spool.jsonl")
    # The planted name is unlinked (the victim keeps its other name) and a fresh file of ours takes its place;
    # no event of ours was in it, so nothing is counted as dropped.
    assert record("startproject", app=app, environ=sandbox.env)
    assert victim.read_bytes() == b"precious\n"
    assert victim.stat().st_nlink == 1
    assert [e["event"] for e in events_in(sandbox, app)] == ["startproject"]
    with Folder(str(folder), create=False) as f:
        assert read_counters(f) == {}


def test_symlink_planted_at_the_user_config_is_never_written(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    sandbox.config_dir.mkdir(parents=True)
    sandbox.user_file(app).symlink_to(victim)
    # Reading follows the link (no client id in it), writing the new client id must not.
    assert not record("startproject", app=app, environ=sandbox.env)
    assert victim.read_bytes() == b"precious\n"


def test_read_only_state_folder_is_a_silent_no_op(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    folder = sandbox.state_dir(app)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code = (
        "from spool_reporter import record; from spool_reporter._hook import django_app;"
        "import sys; r = record('startapp', app=django_app('5.2')); sys.stdout.write(str(r))"
    )
    if os.geteuid() == 0:  # root ignores modes: make the folder truly read-only in a private mount namespace
        cmd = [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount --bind -r "{folder}" "{folder}" && exec "$0" -c "$1"',
            sys.executable,
            code,
        ]
    else:
        folder.chmod(0o500)
        cmd = [sys.executable, "-c", code]
    try:
        result = subprocess.run(cmd, env=sandbox.env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        folder.chmod(0o700)
    if os.geteuid() == 0 and "mount" in result.stderr:
        pytest.skip(f"cannot make a read-only mount here: {result.stderr.strip()}")
    assert (result.returncode, result.stdout, result.stderr) == (0, "False", "")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.pristine  # under the file-size limit, coverage could not save its data (and would say so on stderr)
def test_full_disk_truncates_the_partial_line(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    active = sandbox.state_dir(app) / "spool.jsonl"
    size = active.stat().st_size
    code = """
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    from spool_reporter import record
    from spool_reporter._hook import django_app
    sys.stdout.write(str(record("startapp", app=django_app("5.2"))))
    """.replace("{limit}", str(size + 100))
    import textwrap

    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "False", "")
    assert active.stat().st_size == size  # the partial write was taken back
    assert record("runserver", app=app, environ=sandbox.env)
    assert [e["event"] for e in events_in(sandbox, app)] == ["startproject", "runserver"]
    assert resource.RLIMIT_FSIZE  # (the limit applied to the child only)


def test_missing_home_is_a_silent_no_op(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**sandbox.env, "HOME": str(blocker / "home")}
    for key in ("XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        env.pop(key)
    code = """
    import sys
    from spool_reporter import record
    from spool_reporter._hook import django_app
    sys.stdout.write(str(record("startproject", app=django_app("5.2"))))
    """
    import textwrap

    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "False", "")


@pytest.mark.serial
def test_lock_held_forever_costs_milliseconds_and_keeps_the_event(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX);"
            "print('held', flush=True); sys.stdin.read()",
            str(sandbox.state_dir(app) / "spool.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        assert record("startapp", app=app, environ=sandbox.env)
        elapsed = time.monotonic() - started
        # Kept beside the lock as a one-line sealed segment, with no temporary file left behind.
        aside = list(sandbox.state_dir(app).glob("seg-*-1.jsonl"))
        assert len(aside) == 1
        assert not list(sandbox.state_dir(app).glob(".aside-*"))
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    assert elapsed < 0.5  # LOCK_WAIT_SECONDS is 5 ms; the margin is for a loaded CI machine
    assert sorted(str(e["event"]) for e in events_in(sandbox, app)) == ["startapp", "startproject"]


def test_fifo_planted_at_the_spool_never_blocks(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    folder = sandbox.state_dir(app)
    folder.mkdir(parents=True, mode=0o700)
    os.mkfifo(folder / "spool.jsonl")
    assert record("startproject", app=app, environ=sandbox.env)  # O_NONBLOCK: no reader needed
    assert stat.S_ISREG((folder / "spool.jsonl").stat().st_mode)
    assert [e["event"] for e in events_in(sandbox, app)] == ["startproject"]


def test_refused_events_are_counted_without_the_lock(sandbox: Sandbox, app: App) -> None:
    enable(sandbox, app)
    assert record("startproject", app=app, environ=sandbox.env)
    folder = sandbox.state_dir(app)
    from spool_reporter._hook import MAX_ASIDE

    for i in range(MAX_ASIDE):  # as many one-line segments as a lock held forever lets pile up
        (folder / f"seg-{i:020d}-1-1.jsonl").write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX);"
         "print('held', flush=True); sys.stdin.read()",
         str(folder / "spool.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        assert not record("startapp", app=app, environ=sandbox.env)
        assert not record("startapp", app=app, environ=sandbox.env)
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    with Folder(str(folder), create=False) as f:
        assert read_counters(f) == {"refused": 2}
        from spool_reporter._counters import add_counter

        add_counter(f, "cap", 3)  # other counters never absorb (and so double) the refused count
        assert read_counters(f) == {"cap": 3, "refused": 2}
