"""Starting the flusher: the gate (destination, back-off, interval, one at a time), the process flags, and
real detached flushers (delivery, no zombie, no inherited pipe, no recursion, no user modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import filelock
import pytest

from spool_reporter import App, _hook, _spawn, _state

from support.commands import flusher_idle
from support.polling import wait_for
from support.sandbox import Sandbox
from support.servers import fill, serving, with_destination

POSIX = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process semantics")

PATIENT = {
    "SPOOL_REPORTER_FLUSH_DEADLINE": "20",
    "SPOOL_REPORTER_CONNECT_TIMEOUT": "5",
    "SPOOL_REPORTER_READ_TIMEOUT": "10",
}
"""The flusher's default timing: a flusher at the lowest priority on a busy shared machine can take seconds to
be scheduled, and these tests are about how it starts, not about short deadlines."""


# --- the pure process arguments ------------------------------------------------------------------------


def test_windows_flags(app: App) -> None:
    spec = _spawn.spawn_spec(app, executable=r"C:\Python\python.exe", environ={"A": "1"}, cwd=None, windows=True)
    assert spec.creationflags == 0x00000200 | 0x08000000 | 0x00004000
    assert spec.creationflags & _spawn.CREATE_NEW_PROCESS_GROUP
    assert spec.creationflags & _spawn.CREATE_NO_WINDOW
    assert spec.creationflags & _spawn.BELOW_NORMAL_PRIORITY_CLASS
    assert spec.start_new_session is False  # POSIX-only in subprocess
    if sys.platform == "win32":  # pragma: no cover - the constants agree with the platform's own
        assert subprocess.CREATE_NEW_PROCESS_GROUP == _spawn.CREATE_NEW_PROCESS_GROUP
        assert subprocess.CREATE_NO_WINDOW == _spawn.CREATE_NO_WINDOW
        assert subprocess.BELOW_NORMAL_PRIORITY_CLASS == _spawn.BELOW_NORMAL_PRIORITY_CLASS


def test_flusher_marker_is_the_hooks() -> None:
    assert _hook.FLUSHER_ENV == _hook.FLUSHER_ENV


def test_posix_flags_and_arguments(app: App) -> None:
    spec = _spawn.spawn_spec(
        app, executable="/usr/bin/python3", environ={"A": "1"}, cwd="/spool", windows=False, safe_path=True
    )
    assert spec.start_new_session is True
    assert spec.creationflags == 0
    assert spec.cwd == "/spool"
    assert spec.args[:4] == ["/usr/bin/python3", "-P", "-m", "spool_reporter._detached"]
    assert spec.args[4:6] == ["--app", "django"]
    assert spec.env == {"A": "1", _hook.FLUSHER_ENV: "1"}
    niced = _spawn.spawn_spec(
        app, executable="py", environ={}, cwd=None, windows=False, nice=["/usr/bin/nice", "-n", "19"]
    )
    assert niced.args[:5] == ["/usr/bin/nice", "-n", "19", "py", "-m"]


POSIX_SPAWN = pytest.mark.skipif(not hasattr(os, "posix_spawn"), reason="os.posix_spawn")


@POSIX_SPAWN
@pytest.mark.parametrize("lock", [7, 3, None], ids=["lock-7", "lock-3", "no-lock"])
@pytest.mark.parametrize("closefrom", [False, True], ids=["listed", "closefrom"])
def test_the_posix_spawn_plan(app: App, lock: int | None, closefrom: bool) -> None:
    """Stdio on the null device, every other inheritable descriptor closed, the lock dup2'd to a fixed number
    (never onto itself, which would keep close-on-exec), and a shell that changes to the spool folder."""
    spec = _spawn.spawn_spec(
        app, executable="/py", environ={"A": "1"}, cwd="/spool", windows=False, nice=["/nice"], lock_fd=lock
    )
    marker = object()  # stands for os.POSIX_SPAWN_CLOSEFROM
    plan = _spawn.posix_plan(spec, [3, 5, 9], closefrom=marker if closefrom else None)  # type: ignore[arg-type]
    assert plan is not None
    argv, env, actions = plan
    assert argv == ["/bin/sh", "-c", 'cd -- "$1" && shift && exec "$@"', "spool_reporter-flusher", "/spool", *spec.args]
    assert actions[:3] == [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    target = None if lock is None else (4 if lock == 3 else 3)
    assert env.get(_hook.FLUSHER_LOCK_FD_ENV) == (None if target is None else str(target))
    dup = [a for a in actions if a[0] == os.POSIX_SPAWN_DUP2]
    assert dup == ([] if lock is None else [(os.POSIX_SPAWN_DUP2, lock, target)])
    rest = [a for a in actions[3:] if a[0] != os.POSIX_SPAWN_DUP2]
    if closefrom:
        assert rest == [(marker, {None: 3, 3: 4, 4: 5}[target])]  # all from 3, or from just above the lock
        assert actions[-1][0] is marker  # after the dup2: the lock's new number survives it
    else:
        closed = {a[1] for a in rest}
        assert closed == {3, 5, 9} - {target}
    assert spec.env.get(_hook.FLUSHER_LOCK_FD_ENV) == (None if lock is None else str(lock))  # the spec is left alone
    assert _spawn.posix_plan(spec, None, closefrom=None) is None  # nothing listed, no closefrom: subprocess


# --- the gate ------------------------------------------------------------------------------------------


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[_spawn.SpawnSpec]:
    """Record what would be started instead of starting it (the real start is tested further down)."""
    specs: list[_spawn.SpawnSpec] = []

    def record(spec: _spawn.SpawnSpec) -> bool:
        specs.append(spec)
        return True

    monkeypatch.setattr(_spawn, "_start", record)
    return specs


def spawn(
    sandbox: Sandbox,
    app: App,
    env: dict[str, str],
    *,
    size: int = 100,
    long_lived: bool = False,
    user: dict[str, str] | None = None,
    policy: dict[str, str] | None = None,
) -> bool:
    """The hook's own gate and start (what record() runs after an append to a spool of ``size`` bytes)."""
    with _hook.Folder(str(sandbox.state_dir(app)), create=True) as folder:
        return _hook.start_flusher_if_due(app, folder, size, env=env, user=user, policy=policy, long_lived=long_lived)


def age_stamp(sandbox: Sandbox, app: App, seconds: float) -> None:
    """Pretend the last spawn happened ``seconds`` ago."""
    stamp = sandbox.state_dir(app) / _hook.STAMP_NAME
    then = time.time() - seconds
    os.utime(stamp, (then, then))


def unnamed(sandbox: Sandbox) -> dict[str, str]:
    """The sandbox's environment without its (refused) destination."""
    return {k: v for k, v in sandbox.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}


def test_no_destination_no_spawn(sandbox: Sandbox, app: App, started: list[object]) -> None:
    env = unnamed(sandbox)
    assert not spawn(sandbox, app, env)
    assert not spawn(sandbox, app, env, user={"endpoint": ""})
    assert spawn(sandbox, app, env, user={"endpoint": "https://x.example/"})
    assert len(started) == 1


def test_policy_endpoint_counts(sandbox: Sandbox, app: App, started: list[object]) -> None:
    assert spawn(sandbox, app, unnamed(sandbox), policy={"endpoint": "https://x.example/"})


REFUSED = [
    "http://collector.example/v1/batch",
    "http://Collector.Example:8000/v1/batch",
    "http://user@collector.example/v1",
    "http://sandbox.invalid/v1/batch",
]
LEFT_TO_THE_FLUSHER = [
    "https://collector.example/v1/batch",
    "http://127.0.0.1:8000/v1/batch",
    "http://localhost:8000/v1/batch",
    "http://dev.localhost/v1/batch",
    "http://[::1]:8000/v1/batch",
    "http://10.0.0.1/v1/batch",  # refused by the flusher, but an address is not for the hook to judge
    "ftp://collector.example/",
]


@pytest.mark.parametrize("url", REFUSED + LEFT_TO_THE_FLUSHER)
def test_the_hooks_refusal_agrees_with_the_settings(url: str) -> None:
    from spool_reporter._settings import endpoint_problem

    if _hook.refused_endpoint(url):
        assert url in REFUSED
        assert endpoint_problem(url) is not None  # never refuses a URL the flusher would accept
    else:
        assert url in LEFT_TO_THE_FLUSHER


def test_a_refused_endpoint_records_but_starts_no_flusher(sandbox: Sandbox, app: App, started: list[object]) -> None:
    env = {**unnamed(sandbox), "DJANGO_ANALYTICS_ENDPOINT": REFUSED[0]}
    assert _hook.record_event("runserver", app=app, environ=env, long_lived=True)
    assert not spawn(sandbox, app, env, long_lived=True)
    assert started == []
    assert len(sandbox.spool_lines(app)) == 1


def test_an_apps_default_destination_reaches_the_flusher(sandbox: Sandbox, started: list[_spawn.SpawnSpec]) -> None:
    tool = App(name="MyTool", version="1.0", endpoint="https://tool.example/v1/batch")
    env = unnamed(sandbox)
    assert _hook.record_event("build", app=tool, environ=env)
    (spec,) = started
    # The flusher rebuilds the App from its names: the default travels in its environment, with its transport.
    assert spec.env["MYTOOL_ANALYTICS_ENDPOINT"] == "https://tool.example/v1/batch"
    assert spec.env["MYTOOL_ANALYTICS_TRANSPORT"] == "json"
    # Named anywhere else, the App's default is not in effect, and the flusher resolves it itself.
    age_stamp(sandbox, tool, _hook.SPAWN_INTERVAL + 1)
    sandbox.write_user(tool, "endpoint=https://mine.example/v1/batch\n")
    assert _hook.record_event("build", app=tool, environ=env)
    assert "MYTOOL_ANALYTICS_ENDPOINT" not in started[1].env


def test_interval_threshold_and_long_lived(sandbox: Sandbox, app: App, started: list[object]) -> None:
    env = {**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "https://x.example/"}
    assert spawn(sandbox, app, env)
    assert not spawn(sandbox, app, env)  # within the interval
    # Right after a spawn a large spool starts none (SPAWN_GAP, insurance against the start-up race the fault
    # suite's storm found); runserver does, where the hook hands the locked flusher.lock over (POSIX): a free
    # lock means the last flusher has ended, so its event need not wait for some later command.
    if sys.platform == "win32":
        assert not spawn(sandbox, app, env, long_lived=True)
    else:
        assert spawn(sandbox, app, env, long_lived=True)
    assert not spawn(sandbox, app, env, size=_hook.SPAWN_THRESHOLD_BYTES)
    age_stamp(sandbox, app, _hook.SPAWN_GAP + 1)
    assert spawn(sandbox, app, env, long_lived=True)  # runserver
    age_stamp(sandbox, app, _hook.SPAWN_GAP + 1)
    assert spawn(sandbox, app, env, size=_hook.SPAWN_THRESHOLD_BYTES)  # a large spool
    stamp = sandbox.state_dir(app) / _hook.STAMP_NAME
    past = time.time() - _hook.SPAWN_INTERVAL - 1
    os.utime(stamp, (past, past))
    assert spawn(sandbox, app, env)
    assert not spawn(sandbox, app, {**env, _hook.SPAWN_INTERVAL_ENV: "100000"})  # can only shorten
    os.utime(stamp, (time.time() - 2, time.time() - 2))
    assert spawn(sandbox, app, {**env, _hook.SPAWN_INTERVAL_ENV: "1"})
    assert len(started) == (5 if sys.platform == "win32" else 6)
    assert oct(stamp.stat().st_mode & 0o777) == "0o600"


def test_backoff_gate_blocks_even_long_lived(sandbox: Sandbox, app: App, started: list[object]) -> None:
    env = {**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "https://x.example/"}
    spawn(sandbox, app, env)
    gate = sandbox.state_dir(app) / _hook.GATE_NAME
    gate.touch(mode=0o600)
    later = time.time() + 3600
    os.utime(gate, (later, later))
    assert not spawn(sandbox, app, env, long_lived=True)
    assert not spawn(sandbox, app, env, size=10**9)
    os.utime(gate, (time.time() - 1, time.time() - 1))
    age_stamp(sandbox, app, _hook.SPAWN_GAP + 1)
    assert spawn(sandbox, app, env, long_lived=True)


def test_running_flusher_blocks(sandbox: Sandbox, app: App, started: list[object]) -> None:
    env = {**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "https://x.example/"}
    spawn(sandbox, app, env, long_lived=True)
    age_stamp(sandbox, app, _hook.SPAWN_GAP + 1)
    with filelock.FileLock(str(sandbox.state_dir(app) / _hook.FLUSHER_LOCK_NAME)):
        assert not spawn(sandbox, app, env, long_lived=True)
    assert spawn(sandbox, app, env, long_lived=True)


def test_no_recursion_and_no_frozen_relaunch(
    sandbox: Sandbox, app: App, started: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**sandbox.env, "DJANGO_ANALYTICS_ENDPOINT": "https://x.example/"}
    assert not spawn(sandbox, app, {**env, _hook.FLUSHER_ENV: "1"}, long_lived=True)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert not spawn(sandbox, app, env, long_lived=True)
    assert started == []


def test_record_passes_the_config_to_the_gate(sandbox: Sandbox, app: App, started: list[_spawn.SpawnSpec]) -> None:
    sandbox.write_user(app, "endpoint=https://x.example/v1/batch\n")
    assert _hook.record_event("startproject", app=app, environ=unnamed(sandbox))
    assert len(started) == 1
    assert started[0].env[_hook.FLUSHER_ENV] == "1"
    assert started[0].cwd == str(sandbox.state_dir(app))


def test_offline_laptop_a_day_of_commands_starts_few_flushers(sandbox: Sandbox, app: App) -> None:
    """A command every minute for 24 hours against a dead network, with the default interval and back-off:
    the real gate (:func:`_hook.gate_open`; no flusher runs) on a real folder, the clock moved by the test."""
    import random

    from spool_reporter import _settings

    random.seed(8)
    tune = _settings.Tuning()
    env = dict(sandbox.env)
    path = sandbox.state_dir(app)
    t0 = time.time()
    spawned = []
    failures = 0
    with _hook.Folder(str(path), create=True) as folder:
        for minute in range(24 * 60):
            now = t0 + 60 * minute
            if _hook.gate_open(folder, 1000, long_lived=False, env=env, now=now):
                spawned.append(minute)
                _spawn.touch(folder, _hook.STAMP_NAME, now)
                failures += 1  # the flusher fails and writes its back-off
                _spawn.touch(folder, _hook.GATE_NAME, now + _state.backoff_delay(failures, None, tune))
    # 60 s doubling to 24 h: 0, 5, 10, 15, ~23, ~35 min, ... then hours apart.
    # With this seed: 11 flushers, at minutes 0, 5, 10, 15, 22, 31, 51, 115, 193, 404 and 778.
    assert 8 <= len(spawned) <= 14, spawned


# --- real detached flushers ----------------------------------------------------------------------------


def zombies() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry.name))
    return found


@POSIX
def test_spawned_flusher_delivers_and_leaves_no_zombie(sandbox: Sandbox, app: App) -> None:
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), **PATIENT)
        assert _hook.record_event("runserver", app=app, environ=env, long_lived=True)
        wait_for(lambda: len(server.event_ids()) == 1, timeout=60, what="the detached flusher's delivery")
        wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the flusher to exit")
    assert sandbox.spool_lines(app) == []
    if Path("/proc/self/stat").exists():
        # The reaper thread waits for the child: a long-lived parent (runserver) keeps no zombie.
        wait_for(lambda: not zombies(), timeout=5, what="no zombie child")
    state = _state.read_state(app, environ=env)
    assert state.last_result == "delivered"


@pytest.mark.serial
@POSIX
def test_pipeline_ends_with_the_command_not_the_flusher(sandbox: Sandbox, app: App) -> None:
    """`django-admin startproject x | cat` against a destination that never answers: the pipe closes when
    the command ends, while the flusher (stdio on /dev/null, own session) keeps waiting on its own."""
    script = textwrap.dedent(
        """
        import sys
        from spool_reporter import record
        from spool_reporter._hook import django_app
        assert record("startproject", app=django_app("5.2"), long_lived=True)
        print("project created")
        """
    )
    with serving("silent") as server:
        env = with_destination(
            sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="15", SPOOL_REPORTER_READ_TIMEOUT="15"
        )
        command = f"{sys.executable} -c '{script}' | cat"
        start = time.monotonic()
        out = subprocess.run(["sh", "-c", command], env=env, capture_output=True, timeout=30, check=True)
        took = time.monotonic() - start
        assert out.stdout == b"project created\n"
        wait_for(lambda: len(server.received) == 1, timeout=60, what="the flusher's request")
        assert not flusher_idle(sandbox, app)  # still waiting for an answer...
        assert took < 1.5  # ...but the pipeline did not wait for it
    # Closing the server ends the flusher's request; it records the failure and exits.
    wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the flusher to exit")
    assert len(sandbox.spool_lines(app)) == 1


@POSIX
def test_flusher_never_imports_the_users_project(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    """The flusher starts in the spool folder with -P: modules in the user's working directory (a project
    that happens to contain ``urllib3.py``) and DJANGO_SETTINGS_MODULE are never imported."""
    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "imported"
    for name in ("urllib3", "filelock", "settings", "django"):
        (project / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ')\n")
    fill(app, sandbox.env, 1)
    with serving() as server:
        env = with_destination(sandbox.env, server.url(), DJANGO_SETTINGS_MODULE="settings", **PATIENT)
        script = textwrap.dedent(
            f"""
            import os, sys
            os.chdir({str(project)!r})
            sys.path.insert(0, {str(project)!r})  # as manage.py's directory is
            from spool_reporter import _hook, _spawn, _spool
            from spool_reporter._hook import django_app
            app = django_app("5.2")
            with _hook.Folder({str(sandbox.state_dir(app))!r}, create=False) as folder:
                assert _hook.start_flusher_if_due(
                    app, folder, 0, env=os.environ, user=None, policy=None, long_lived=True
                )
            """
        )
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=30, cwd=project)
        wait_for(lambda: len(server.event_ids()) == 1, timeout=60, what="delivery")
        wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the flusher to exit")
    assert not marker.exists(), marker.read_text()


def _autogroup_nice(text: str) -> str:
    """The nice value in ``/proc/<pid>/autogroup``'s text (``/autogroup-42 nice 19``), or "-" for none.

    Empty text: no file (a kernel without autogroups), or a process still in the root group, never moved by a
    ``setsid`` (seen on CI machines whose process tree runs in a container)."""
    parts = text.split()
    return parts[-1] if parts else "-"


@POSIX
@pytest.mark.parametrize("own_session", [True, False])
def test_flusher_runs_at_the_lowest_priority(sandbox: Sandbox, own_session: bool) -> None:
    script = textwrap.dedent(
        """
        import os
        from spool_reporter import _detached, _flush, _state
        _detached._lower_priority()
        text = open("/proc/self/autogroup").read() if os.path.exists("/proc/self/autogroup") else ""
        print(os.nice(0), text, end="")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=sandbox.env,
        capture_output=True,
        check=True,
        timeout=30,
        start_new_session=own_session,
    )
    nice, _, text = out.stdout.decode().partition(" ")
    assert nice == "19"
    group = _autogroup_nice(text)
    if own_session and group != "-":
        # Linux autogroups: a session-leading flusher renices its own new group...
        assert group == "19"
    elif not own_session:
        # ... and never the group it shares with the terminal (or the root group, which shows no line).
        own = Path("/proc/self/autogroup")
        assert group == _autogroup_nice(own.read_text() if own.exists() else "")


@POSIX
@pytest.mark.skipif(not _spawn.nice_command(), reason="no POSIX nice here")
def test_spawned_flusher_starts_niced(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    """The priority is lowered before the interpreter starts, not after its imports."""
    out = tmp_path / "nice"
    spec = _spawn.spawn_spec(
        app,
        executable=sys.executable,
        environ=sandbox.env,
        cwd=str(tmp_path),
        windows=False,
        nice=_spawn.nice_command(),
    )
    child = textwrap.dedent(
        f"""
        import os, time
        group = "-"
        if os.path.exists("/proc/self/autogroup"):
            # The parent renices the new session's autogroup right after Popen returns (bounded wait).
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                parts = open("/proc/self/autogroup").read().split()
                group = parts[-1] if parts else "-"
                if group == "19":
                    break
                time.sleep(0.01)
        open({str(out)!r} + ".tmp", "w").write(f"{{os.nice(0)}} {{group}}")
        os.rename({str(out)!r} + ".tmp", {str(out)!r})
        """
    )
    spec.args[spec.args.index("-m") :] = ["-c", child]
    assert _spawn._start(spec)
    wait_for(out.exists, timeout=60, what="the child")
    nice, group = out.read_text().split()
    assert nice == "19"
    assert group in ("19", "-")


@pytest.mark.skipif(sys.platform == "win32", reason="flock descriptors are handed over on POSIX")
def test_the_child_holds_the_flusher_lock_from_birth(sandbox: Sandbox, app: App) -> None:
    # No start-up window: the moment the hook's start returns, before the child has run a line of Python, the lock
    # is held (by the inherited descriptor), so no second flusher can be started or take it.
    with serving("silent") as server:
        env = with_destination(sandbox.env, server.url())
        fill(app, sandbox.env, 1)
        with _hook.Folder(str(sandbox.state_dir(app)), create=True) as folder:
            assert spawn(sandbox, app, env, long_lived=True)
            assert _hook.claim_flusher_lock(folder) is None
            lock = filelock.FileLock(str(sandbox.state_dir(app) / _hook.FLUSHER_LOCK_NAME))
            with pytest.raises(filelock.Timeout):
                lock.acquire(timeout=0.1)
        wait_for(lambda: server.received, timeout=60, what="the flusher's request")  # it sends under that lock
    wait_for(lambda: flusher_idle(sandbox, app), timeout=60, what="the flusher to finish")


PLAIN_COMMAND = """
import json, os, sys
fd = os.open(os.devnull, os.O_RDONLY)
os.set_inheritable(fd, True)  # a descriptor the host leaves inheritable: the flusher must not get it
from spool_reporter import App, record
app = App(name="MyTool", version="1.0", endpoint=sys.argv[1])
ok = record("build", app=app, notice=True, long_lived=sys.argv[2] == "1")
print(json.dumps([ok, "subprocess" in sys.modules, "threading" in sys.modules]))
"""


@POSIX
@pytest.mark.pristine  # threading loaded or not is the point
@pytest.mark.parametrize("long_lived", [False, True], ids=["short", "long-lived"])
def test_a_plain_command_starts_the_flusher_without_subprocess(sandbox: Sandbox, long_lived: bool) -> None:
    """A tool's first run, in a process that has not imported subprocess or threading: the flusher starts
    through posix_spawn (no subprocess), and delivers; threading only for a long-lived caller (its reaper)."""
    with serving() as server:
        env = with_destination(unnamed(sandbox), server.url(), **PATIENT)
        del env["DJANGO_ANALYTICS_ENDPOINT"]
        result = subprocess.run(
            [sys.executable, "-c", PLAIN_COMMAND, server.url(), "1" if long_lived else "0"],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert json.loads(result.stdout) == [True, False, long_lived]
        tool = App(name="MyTool", version="1.0")
        wait_for(lambda: len(server.event_ids()) == 1, timeout=60, what="the detached flusher's delivery")
        wait_for(lambda: flusher_idle(sandbox, tool), timeout=60, what="the flusher to exit")


CHILD_FACTS = """
import json, os, sys
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[name] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass
out = {"cwd": os.getcwd(), "leader": os.getsid(0) == os.getpid(), "fds": fds, "nice": os.nice(0),
       "lock_env": os.environ.get("SPOOL_REPORTER_FLUSHER_LOCK_FD")}
open(sys.argv[1] + ".tmp", "w").write(json.dumps(out))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""

PARENT = """
import os, sys, threading, json
sys.path.insert(0, {tests!r})
from spool_reporter import _hook, _spawn, _spool
from spool_reporter._hook import django_app
extra = os.open(os.devnull, os.O_RDONLY)
os.set_inheritable(extra, True)
r, w = os.pipe()
os.set_inheritable(w, True)  # a pipe end the host leaves inheritable: the flusher must not keep it open
with _hook.Folder({folder!r}, create=True) as folder:
    lock = _hook.claim_flusher_lock(folder)
    spec = _spawn.spawn_spec(django_app(), executable=sys.executable, environ=os.environ, cwd=folder.path,
                             windows=False, nice=_spawn.nice_command(), lock_fd=lock)
    spec.args[spec.args.index("-m"):] = ["-c", {child!r}, {out!r}]
    assert _spawn._posix_spawn(spec) is True
    os.close(lock)
print(json.dumps({{"extra": extra, "pipe": w}}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_flusher_process_as_it_starts(sandbox: Sandbox, app: App, tmp_path: Path) -> None:
    """What the child has from its first instruction: its own session, the spool folder as working directory,
    stdio on the null device, no descriptor but the lock (at the number announced), the lowest priority."""
    from support.sandbox import REPO

    out = tmp_path / "facts.json"
    folder = sandbox.state_dir(app)
    code = PARENT.format(tests=str(REPO / "tests"), folder=str(folder), child=CHILD_FACTS, out=str(out))
    parent = subprocess.run(
        [sys.executable, "-c", code], env=sandbox.env, capture_output=True, text=True, timeout=60, check=False
    )
    assert parent.returncode == 0, parent.stderr
    wait_for(out.exists, timeout=60, what="the child's facts")
    facts = json.loads(out.read_text())
    assert facts["cwd"] == str(folder)
    assert facts["leader"] is True
    assert facts["nice"] == 19
    fds = facts["fds"]
    assert {fds[n] for n in ("0", "1", "2")} == {os.devnull}
    lock = facts["lock_env"]
    assert lock == "3"
    assert fds[lock] == str(folder / _hook.FLUSHER_LOCK_NAME)
    others = {n: target for n, target in fds.items() if n not in ("0", "1", "2", lock)}
    assert all(target.startswith("/proc/") for target in others.values()), others  # only the child's own listing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.pristine  # threading loaded or not is the point
@pytest.mark.parametrize("long_lived", [False, True], ids=["short", "long-lived"])
def test_no_zombie_is_left_to_a_long_lived_parent(sandbox: Sandbox, app: App, long_lived: bool) -> None:
    """A parent without threading: long-lived, a reaper thread waits for the child; short-lived, the next start
    reaps the ended one (and its own exit would hand it to init)."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from spool_reporter import _hook, _spawn

        def zombies():
            found = []
            for pid in os.listdir("/proc"):
                try:
                    stat = open(f"/proc/{{pid}}/stat").read()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[1].split()
                if fields[0] == "Z" and int(fields[1]) == os.getpid():
                    found.append(int(pid))
            return found

        def start():
            spec = _spawn.SpawnSpec(args=[sys.executable, "-c", "pass"], env=dict(os.environ),
                                    cwd={str(sandbox.root)!r}, start_new_session=True, creationflags=0,
                                    long_lived={long_lived})
            assert _spawn._posix_spawn(spec) is True

        def wait(predicate):
            deadline = time.monotonic() + 30
            while not predicate() and time.monotonic() < deadline:
                time.sleep(0.01)
            return predicate()

        assert "threading" not in sys.modules
        start()
        if {long_lived}:
            assert "threading" in sys.modules
            assert wait(lambda: not zombies() and not _spawn._UNREAPED)
        else:
            assert wait(lambda: len(zombies()) == 1)  # ended, and waiting for this short command to exit
            start()
            assert wait(lambda: len(zombies()) <= 1)  # the first one was reaped by this start
            assert len(_spawn._UNREAPED) == 1
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=sandbox.env, capture_output=True, text=True, timeout=90, check=False
    )
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr


@POSIX
def test_a_detached_flusher_delivers_to_the_apps_default(sandbox: Sandbox) -> None:
    """A tool that ships its destination: no config anywhere, the detached flusher sends to the App's default."""
    with serving() as server:
        tool = App(name="MyTool", version="1.0", endpoint=server.url())
        env = with_destination(unnamed(sandbox), server.url(), **PATIENT)
        del env["DJANGO_ANALYTICS_ENDPOINT"]
        assert _hook.record_event("build", app=tool, environ=env, long_lived=True)
        wait_for(lambda: len(server.event_ids()) == 1, timeout=60, what="the detached flusher's delivery")
        wait_for(lambda: flusher_idle(sandbox, tool), timeout=60, what="the flusher to exit")
    assert sandbox.spool_lines(tool) == []
