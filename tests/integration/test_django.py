"""Real Django commands, in a real virtual environment with the built wheel installed (MISSION feature 1).

Every test runs ``django-admin``, ``python manage.py`` or ``python -m django`` as a subprocess, in its own
home (``Sandbox``), with an environment cleaned of CI markers and opt-outs, and reads the spool afterwards.
``nox -s django`` runs this module once per Django series (4.2, 5.2, 6.0, 6.1) that the Python supports
(``SPOOL_REPORTER_TEST_DJANGO``).
"""

from __future__ import annotations

import contextlib
import getpass
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spool_reporter._event import FIELDS
from spool_reporter._firstrun import notice_text

from ._django_user import APP, COMMAND_TIMEOUT, NOTICE, SERIES, User
from ._django_venv import Venv, venv_env
from support import servers
from support.commands import flusher_idle
from support.polling import wait_for
from support.ports import free_port
from support.sandbox import Sandbox

pytestmark = pytest.mark.django

FORBIDDEN_ON_HOOK_PATH = ("filelock", "urllib3", "platformdirs", "uuid", "platform", "json")


def assert_private(u: User, *secrets: str) -> None:
    """Nothing the user typed or has ends up in the spool: names, paths, home, user and host names."""
    data = u.spool_bytes()
    assert data, "expected a spool"
    for secret in (*secrets, str(u.work), str(u.sandbox.home), getpass.getuser(), socket.gethostname()):
        if len(secret) >= 3:
            assert secret.encode() not in data, secret
    for event in u.events():
        assert tuple(event) == FIELDS
        assert event["app"] == "Django"
        assert event["app_version"] == SERIES


# --- the three commands, each recorded once -------------------------------------------------------------------


def test_startproject_records_once_with_a_notice_printed_once(user: User) -> None:
    first = user.ok("django-admin", "startproject", "secretproject")
    assert user.names() == ["startproject"]
    assert first.stderr.count(NOTICE) == 1
    assert NOTICE not in first.stdout
    second = user.ok("django-admin", "startproject", "otherproject")
    assert NOTICE not in second.stderr
    assert user.names() == ["startproject", "startproject"]
    assert (user.work / "secretproject" / "manage.py").is_file()
    assert_private(user, "secretproject", "otherproject")


def test_startapp_outside_a_project(user: User) -> None:
    user.ok("django-admin", "startapp", "secretapp")
    assert user.names() == ["startapp"]
    assert (user.work / "secretapp" / "models.py").is_file()
    assert_private(user, "secretapp")


def test_django_admin_startapp_inside_a_project(user: User) -> None:
    project = user.new_project()
    user.ok("django-admin", "startapp", "blog", cwd=project)
    assert user.names() == ["startapp"]


def test_manage_py_startapp_with_debug_settings(user: User) -> None:
    project = user.new_project()
    user.ok("python", "manage.py", "startapp", "secretapp", cwd=project)
    assert user.names() == ["startapp"]
    assert_private(user, "secretapp", "mysite")


def test_python_m_django_startproject(user: User) -> None:
    user.ok("python", "-m", "django", "startproject", "secretproject")
    assert user.names() == ["startproject"]
    assert_private(user, "secretproject")


def test_settings_flag_decides_the_debug_rule(user: User) -> None:
    on = user.new_project("debugon")
    off = user.new_project("debugoff", debug=False)
    user.ok("django-admin", "startapp", "a1", "--settings=debugoff.settings", "--pythonpath=.", cwd=off)
    assert user.names() == []
    user.ok("django-admin", "startapp", "a2", "--settings=debugon.settings", "--pythonpath=.", cwd=on)
    assert user.names() == ["startapp"]


def test_debug_false_records_nothing(user: User) -> None:
    project = user.new_project(debug=False)
    user.ok("python", "manage.py", "startapp", "blog", cwd=project)
    env = {**user.env, "DJANGO_SETTINGS_MODULE": "mysite.settings", "PYTHONPATH": str(project)}
    user.ok("django-admin", "startapp", "shop", cwd=project, env=env)
    assert user.names() == []
    assert not user.sandbox.user_file(APP).exists(), "no client id and no notice either"


@pytest.mark.parametrize(
    ("settings_module", "files"),
    [
        pytest.param("no_such_settings", {}, id="missing-module"),
        pytest.param("badsettings", {"badsettings.py": "import no_such_dependency\n"}, id="settings-import-error"),
    ],
)
def test_broken_settings_count_as_no_settings_and_do_not_change_the_command(
    user: User, settings_module: str, files: dict[str, str]
) -> None:
    for name, text in files.items():
        (user.work / name).write_text(text)
    env = {**user.env, "DJANGO_SETTINGS_MODULE": settings_module, "PYTHONPATH": str(user.work)}
    user.ok("django-admin", "--version", env=env)  # nothing recorded, no notice: the client id comes later
    results = {}
    for mode in ("off", "on"):
        (user.work / mode).mkdir()
        results[mode] = user.run("django-admin", "startapp", "blog", cwd=user.work / mode, env=env, off=mode == "off")
    assert user.names() == ["startapp"]
    on, off = results["on"], results["off"]
    assert (on.returncode, on.stdout) == (off.returncode, off.stdout)
    assert on.stderr.replace(NOTICE, b"") == off.stderr
    assert (user.work / "on" / "blog").is_dir() == (user.work / "off" / "blog").is_dir()


# --- everything else records nothing --------------------------------------------------------------------------

QUIET = [
    pytest.param(("django-admin",), id="no-arguments"),
    pytest.param(("django-admin", "help"), id="help"),
    pytest.param(("django-admin", "help", "startproject"), id="help-startproject"),
    pytest.param(("django-admin", "help", "--commands"), id="help-commands"),
    pytest.param(("django-admin", "--help"), id="--help"),
    pytest.param(("django-admin", "--version"), id="--version"),
    pytest.param(("django-admin", "version"), id="version"),
    pytest.param(("django-admin", "startproject", "--help"), id="startproject--help"),
    pytest.param(("django-admin", "startapp", "-h"), id="startapp-h"),
    pytest.param(("django-admin", "startproject", "--version"), id="startproject--version"),
    pytest.param(("django-admin", "nosuchcommand"), id="unknown-command"),
    pytest.param(("django-admin", "startprojet"), id="misspelt-command"),
    pytest.param(("python", "manage.py", "check"), id="check"),
    pytest.param(("python", "manage.py", "migrate"), id="migrate"),
    pytest.param(("python", "manage.py", "shell", "-c", "pass"), id="shell"),
    pytest.param(("python", "manage.py", "runserver", "--help"), id="runserver--help"),
    pytest.param(("python", "manage.py", "diffsettings"), id="diffsettings"),
    pytest.param(("python", "-m", "django", "check", "--settings=mysite.settings", "--pythonpath=."), id="m-check"),
]


@pytest.fixture(scope="module")
def quiet_user(tmp_path_factory: pytest.TempPathFactory, dj: Venv) -> tuple[User, Path]:
    u = User(Sandbox(tmp_path_factory.mktemp("quiet")), dj)
    return u, u.new_project()


@pytest.mark.parametrize("command", QUIET)
def test_other_commands_record_nothing(quiet_user: tuple[User, Path], command: tuple[str, ...]) -> None:
    u, project = quiet_user
    proc = u.run(*command, cwd=project)
    assert b"Traceback" not in proc.stderr
    assert u.names() == []
    assert NOTICE not in proc.stderr


def test_without_a_destination_nothing_is_recorded_and_no_notice_printed(user: User) -> None:
    """The reference integration ships no destination (Django core would ship the DSF's): until one is
    configured, a reported command records nothing, prints nothing and creates no file."""
    env = {k: v for k, v in user.env.items() if k != "DJANGO_ANALYTICS_ENDPOINT"}
    off = user.ok("django-admin", "startproject", "p0", env=env, off=True)
    on = user.ok("django-admin", "startproject", "p1", env=env)
    assert (on.stdout, on.stderr) == (off.stdout, off.stderr) == (b"", b"")
    assert not user.sandbox.config_dir.exists()
    assert not (user.sandbox.home / "state").exists()
    # DJANGO_ANALYTICS_DEBUG still shows what would be recorded, and still writes nothing.
    debug = user.ok("django-admin", "startproject", "p2", env={**env, "DJANGO_ANALYTICS_DEBUG": "1"})
    prefix, _, line = debug.stderr.decode().partition(" ")
    assert prefix == "[DJANGO_ANALYTICS_DEBUG]"
    assert json.loads(line)["event"] == "startproject"
    assert not user.sandbox.config_dir.exists()
    assert not (user.sandbox.home / "state").exists()
    # Configured: the next reported command records, and prints the notice then.
    user.sandbox.write_user(APP, "endpoint=http://configured.invalid/v1/batch\n")
    first = user.ok("django-admin", "startproject", "p3", env=env)
    assert first.stderr == NOTICE
    assert user.names() == ["startproject"]


CID = "43325579-4ce9-4a2d-a152-0e993a4bb245"


def test_an_older_notice_version_sees_the_notice_again_once(user: User) -> None:
    """A config written by a release whose notice was older: the next reported command prints the notice once,
    before it records, and records under the new version from then on; django-spool status says so."""
    user.sandbox.write_user(APP, f"client_id={CID}\nnotice_version=0\n")
    spool = [str(user.venv.bin / "django-spool"), "status"]
    assert "notice:        never shown, current 1 (the send wording is shown" in user.ok(*spool).stdout.decode()
    first = user.ok("django-admin", "startproject", "p1")
    assert first.stderr == NOTICE
    assert user.sandbox.user_file(APP).read_text() == (
        f"client_id={CID}\nnotice_version=0\nnotice_version=1\nnotice_mode=send\n"
    )
    second = user.ok("python", "-m", "django", "startapp", "blog")
    assert second.stderr == b""
    assert [e["client_id"] for e in user.events()] == [CID, CID]
    status = json.loads(user.ok(*spool, "--json").stdout)
    assert (status["notice_version_seen"], status["notice_mode_seen"], status["notice_version"]) == (1, "send", 1)


def startprojects_together(user: User, count: int = 4) -> list[tuple[bytes, bytes]]:
    """``count`` real ``django-admin startproject`` started at once; each one's stdout and stderr."""
    procs = [
        subprocess.Popen(
            [str(user.venv.python), str(user.venv.django_admin), "startproject", f"p{i}"],
            cwd=user.work,
            env=user.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(count)
    ]
    outputs = [p.communicate(timeout=COMMAND_TIMEOUT) for p in procs]
    assert [p.returncode for p in procs] == [0] * count
    return outputs


def test_several_commands_after_an_upgrade_print_the_new_notice_once(user: User) -> None:
    user.sandbox.write_user(APP, f"client_id={CID}\nnotice_version=0\n")
    outputs = startprojects_together(user)
    assert sum(err.count(NOTICE) for _, err in outputs) == 1
    assert user.names() == ["startproject"] * 4


def test_local_mode_records_and_never_starts_a_flusher(user: User) -> None:
    """django-spool enable --local with a healthy destination configured: real commands record, print the
    local notice, start no flusher; flush sends nothing and says why; enable moves to sending."""
    from support.servers import serving, with_destination

    spool = str(user.venv.bin / "django-spool")
    with serving() as server:
        env = with_destination(user.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20")
        assert b"Local mode" in user.ok(spool, "enable", "--local", env=env).stdout
        first = user.ok("django-admin", "startproject", "p1", env=env)
        assert first.stderr == notice_text(APP, local=True).encode()
        project = user.work / "p1"
        server_proc = Server(user, project)  # runserver: long-lived, and still no flusher
        try:
            server_proc.wait_serving()
        finally:
            server_proc.stop()
        assert user.local_names() == ["startproject", "runserver"]
        assert user.names() == []
        assert not (user.sandbox.state_dir(APP) / "flush.spawned").exists()
        flush = user.ok(spool, "flush", env=env)
        assert flush.stdout.startswith(b"local: nothing is sent in local mode; 2 events stay on this machine")
        assert not server.received
        status = user.ok(spool, "status", env=env).stdout.decode()
        assert "[user:local]" in status
        assert "mode:          local: events are recorded on this machine and never sent" in status
        assert "kept local:    2 events recorded in local mode" in status
        enable = user.ok(spool, "enable", env=env).stdout.decode()
        assert f"2 events recorded in local mode joined the queue: 2 queued events will be sent to {server.url()}" in (
            enable
        )
        assert user.ok(spool, "flush", env=env).stdout.startswith(b"delivered: sent 2")
        assert len(set(server.event_ids())) == 2


def test_events_recorded_under_the_local_notice_stay_local_when_the_policy_goes(user: User) -> None:
    """A distributor's default=local, then the policy file goes away (a package update, a container that
    shares the home folder but not /etc/xdg): the next command shows the sending notice before anything
    leaves, and what was recorded under "never sent" is never sent -- until the user runs enable, which says
    how many."""
    from support.servers import serving, with_destination

    spool = str(user.venv.bin / "django-spool")
    with serving() as server:
        env = with_destination(user.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20")
        env["SPOOL_REPORTER_SPAWN_INTERVAL"] = "0"
        policy = user.sandbox.write_policy(APP, "default=local\n")
        first = user.ok("django-admin", "startproject", "p1", env=env)
        assert first.stderr == notice_text(APP, local=True).encode()
        for name in ("p2", "p3"):
            assert user.ok("django-admin", "startproject", name, env=env).stderr == b""
        assert user.local_names() == ["startproject"] * 3
        policy.unlink()
        after = user.ok("django-admin", "startproject", "p4", env=env)
        assert after.stderr == notice_text(APP, after_local=True).encode()  # shown before anything leaves
        wait_for(lambda: len(server.event_ids()) >= 1, timeout=60, what="the flusher sends the new event")
        state = user.sandbox.state_dir(APP) / "state.json"
        wait_for(lambda: state.exists() and not _flusher_holds_its_lock(user), timeout=60, what="the flusher's end")
        assert len(server.event_ids()) == 1
        assert user.local_names() == ["startproject"] * 3
        assert user.run("django-admin", "startproject", "p5", env=env).stderr == b""  # the notice once
        status = user.ok(spool, "status", env=env).stdout.decode()
        assert "kept local:    3 events recorded in local mode, never sent unless you run 'django-spool enable'" in (
            status
        )
        enable = user.ok(spool, "enable", env=env).stdout.decode()
        assert "3 events recorded in local mode joined the queue" in enable
        user.ok(spool, "flush", env=env)
        assert len(set(server.event_ids())) == 5
        assert user.local_names() == []


def test_reporting_off_records_nothing_and_prints_nothing(user: User) -> None:
    for i, switch in enumerate(({"DJANGO_NO_ANALYTICS": "1"}, {"DO_NOT_TRACK": "1"}, {"CI": "true"})):
        proc = user.ok("django-admin", "startproject", f"p{i}", env={**user.env, **switch})
        assert proc.stderr == b""
    assert user.names() == []


# --- the same command, reporting on or off ----------------------------------------------------------------------


def test_stdout_is_byte_identical_with_reporting_on_or_off(sandbox: Sandbox, dj: Venv, tmp_path: Path) -> None:
    on = User(sandbox, dj)
    off_root = tmp_path / "off-user"
    off_root.mkdir()
    off = User(Sandbox(off_root), dj)
    commands: list[tuple[str, ...]] = [
        ("django-admin", "startproject", "mysite"),
        ("django-admin", "startapp", "blog"),
        ("python", "mysite/manage.py", "check"),
        ("django-admin", "--version"),
        ("django-admin", "help"),
        ("python", "-m", "django", "startproject", "other"),
    ]
    for command in commands:
        a = on.run(*command)
        b = off.run(*command, off=True)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout), command
        assert a.stderr.replace(NOTICE, b"") == b.stderr, command
    assert on.names() == ["startproject", "startapp", "startproject"]
    assert off.names() == []


def test_notice_printed_once_when_several_first_commands_start_together(user: User) -> None:
    outputs = startprojects_together(user)
    assert sum(err.count(NOTICE) for _, err in outputs) == 1
    assert all(out == b"" for out, _ in outputs)
    events = user.events()
    assert [e["event"] for e in events] == ["startproject"] * 4
    assert len({e["client_id"] for e in events}) == 1


def test_broken_reporting_never_changes_the_command(user: User) -> None:
    # The state folder cannot be created (a file stands where its parent should be), then the config file is
    # a folder (unreadable: reporting off). The command behaves exactly as with reporting off.
    (user.sandbox.home / "state").write_text("not a folder")
    a = user.run("django-admin", "startproject", "one")
    b = user.run("django-admin", "startproject", "two", off=True)
    assert (
        (a.returncode, a.stdout, a.stderr.replace(NOTICE, b"")) == (b.returncode, b.stdout, b.stderr) == (0, b"", b"")
    )
    user.sandbox.user_file(APP).unlink()
    user.sandbox.user_file(APP).mkdir()
    c = user.run("django-admin", "startproject", "three")
    assert (c.returncode, c.stdout, c.stderr) == (0, b"", b"")


# --- runserver and its autoreloader -----------------------------------------------------------------------------


def _serves(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status < 600
    except OSError:
        return False
    finally:
        conn.close()


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _open_paths(pid: int) -> list[str]:
    paths = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            paths.append(os.readlink(fd))
    return paths


class Server:
    """``runserver`` in its own process group, its output collected by threads."""

    def __init__(self, u: User, cwd: Path, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(u.venv.python), "manage.py", "runserver", *args, f"127.0.0.1:{self.port}"],
            cwd=cwd,
            env=u.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.stdout = bytearray()
        self.stderr = bytearray()
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: object, sink: bytearray) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            sink.extend(chunk)

    def wait_serving(self) -> None:
        wait_for(
            lambda: self.proc.poll() is None and _serves(self.port), timeout=60, what=f"runserver on port {self.port}"
        )

    def stop(self) -> int:
        """Ctrl-C, as a terminal sends it (to the process group); SIGKILL if that is not enough. The exit code."""
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGINT)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=30)
        finally:
            for t in self._threads:
                t.join(timeout=10)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return self.proc.returncode


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the reloader's child")
def test_runserver_records_once_across_reloads_and_holds_no_spool_descriptor(user: User) -> None:
    project = user.new_project()
    server = Server(user, project)
    try:
        server.wait_serving()
        assert user.names() == ["runserver"]
        (child,) = _children(server.proc.pid)
        state = str(user.sandbox.state_dir(APP))
        for pid in (server.proc.pid, child):
            assert not [p for p in _open_paths(pid) if p.startswith(state)], "a spool descriptor is held open"
        # A code change: the reloader's child exits and the parent starts a new one (RUN_MAIN=true). The
        # StatReloader takes its first snapshot of mtimes a moment after the server answers, so a change made
        # before that is not seen: keep moving the mtime forward until the child is replaced (bounded).
        settings = project / "mysite" / "settings.py"
        touches = iter(range(1, 61))

        def reloaded() -> bool:
            if _children(server.proc.pid) not in ([child], []):
                return True
            n = next(touches, None)
            if n is None:
                pytest.fail("runserver never reloaded")
            later = time.time() + 10 * n
            os.utime(settings, (later, later))
            return False

        wait_for(reloaded, timeout=60, what="the reloaded child", interval=1.0)
        server.wait_serving()
        assert re.search(rb"settings\.py changed, reloading", bytes(server.stderr)), bytes(server.stderr)
        assert user.names() == ["runserver"]
    finally:
        code = server.stop()
    assert code in (0, -signal.SIGINT), bytes(server.stderr)
    assert user.names() == ["runserver"]
    assert bytes(server.stderr).count(NOTICE) == 1
    assert NOTICE not in bytes(server.stdout)
    assert [e["event"] for e in user.events()] == ["runserver"]


def test_runserver_noreload_records_once(user: User) -> None:
    project = user.new_project()
    server = Server(user, project, "--noreload")
    try:
        server.wait_serving()
        assert user.names() == ["runserver"]
    finally:
        code = server.stop()
    assert code in (0, -signal.SIGINT), bytes(server.stderr)
    assert user.names() == ["runserver"]


@pytest.mark.serial
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipelines")
def test_django_admin_startproject_piped_to_cat_ends_with_the_command(user: User) -> None:
    """`django-admin startproject x | cat`, armed by the installed .pth, with a destination that never answers:
    the pipeline ends with the command; the flusher (stdio on the null device, its own session) waits alone."""
    from support.servers import serving, with_destination

    with serving("silent") as server:
        env = with_destination(
            user.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="15", SPOOL_REPORTER_READ_TIMEOUT="15"
        )
        start = time.monotonic()
        out = user.run("sh", "-c", f"{user.venv.django_admin} startproject mysite | cat", env=env)
        took = time.monotonic() - start
        assert out.returncode == 0, out.stderr
        assert (user.work / "mysite" / "manage.py").exists()
        wait_for(lambda: len(server.received) == 1, timeout=30, what="the flusher's request")
        assert _flusher_holds_its_lock(user)  # the flusher still waits for an answer...
        assert took < 3.0  # ...the pipeline did not (django-admin startproject alone takes ~0.15-1 s)
    wait_for(lambda: not _flusher_holds_its_lock(user), timeout=30, what="the flusher to exit")
    assert user.names() == ["startproject"]  # kept: the request got no answer


def _flusher_holds_its_lock(u: User) -> bool:
    """A flusher holds flusher.lock (probed with the hook's own try-lock)."""
    return not flusher_idle(u.sandbox, APP)


# --- the installation: .pth arming, cost, imports -----------------------------------------------------------------


def test_the_pth_file_is_installed_at_the_site_packages_root(dj: Venv) -> None:
    site = dj.site_packages()
    assert (site / "spool_reporter.pth").read_text() == (Path(__file__).parents[2] / "spool_reporter.pth").read_text()


PROBE = """\
import site, sys, sysconfig
mark = lambda: len([f for f in sys.meta_path if getattr(f, "spool_reporter_finder", False)])
armed_at_start = mark()
site.addsitedir(sysconfig.get_paths()["purelib"])  # process the .pth files once more
import django.core.management as m
ex = m.ManagementUtility.execute
inner = getattr(ex, "__wrapped__", None)
print(armed_at_start, mark(), getattr(ex, "__spool_reporter_wrapped__", False),
      getattr(inner, "__spool_reporter_wrapped__", False), "spool_reporter._arm" in sys.modules,
      "spool_reporter._hook" in sys.modules)
"""


def test_arming_is_idempotent_and_imports_no_hook_code(user: User) -> None:
    # A script named manage.py is armed; its .pth runs twice in a venv (site.venv() and site.main()) and a
    # third time here; the finder is installed once, removes itself, and execute is wrapped once.
    script = user.work / "manage.py"
    script.write_text(PROBE)
    out = user.ok("python", script).stdout.split()
    assert out == [b"1", b"0", b"True", b"False", b"True", b"False"]


@pytest.mark.parametrize(
    ("argv", "module_loaded"),
    [
        pytest.param(("-c", "pass"), False, id="-c"),
        pytest.param(("other.py",), False, id="script"),
        pytest.param(("-m", "probe"), True, id="-m-other"),  # '-m' passes the .pth's check; arm() says no
    ],
)
def test_other_python_processes_are_not_armed(user: User, argv: tuple[str, ...], module_loaded: bool) -> None:
    code = (
        "import sys\n"
        "print('spool_reporter._arm' in sys.modules, "
        "[f for f in sys.meta_path if getattr(f, 'spool_reporter_finder', False)], "
        "'spool_reporter._hook' in sys.modules)\n"
    )
    (user.work / "other.py").write_text(code)
    (user.work / "probe.py").write_text(code)
    if argv[0] == "-c":
        argv = ("-c", code)
    out = user.ok("python", *argv).stdout.decode().split()
    assert out == [str(module_loaded), "[]", "False"]


def _imported(stderr: bytes) -> set[str]:
    names = set()
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


BASELINE = """\
import sys
sys.argv = ["django-admin", "startproject", "p0"]
from django.core.management import execute_from_command_line
execute_from_command_line()
"""


def test_the_hook_path_imports_no_heavy_module(user: User) -> None:
    # The baseline is the same command unarmed (the .pth saw `-c`); the difference is what the hook imports.
    base = user.ok("python", "-X", "importtime", "-c", BASELINE)
    on = user.ok("django-admin", "startproject", "p1", python_args=("-X", "importtime"))
    assert user.names() == ["startproject"]
    baseline = _imported(base.stderr)
    assert "django.core.management" in baseline, "the importtime output was not parsed"
    added = _imported(on.stderr) - baseline
    assert {n for n in added if not n.startswith("spool_reporter")} <= {"__future__"}
    assert not set(FORBIDDEN_ON_HOOK_PATH) & added
    quiet = user.ok("django-admin", "--version", python_args=("-X", "importtime"))
    ours = {n for n in _imported(quiet.stderr) if "spool_reporter" in n or n == "__future__"}
    assert ours == {"spool_reporter", "spool_reporter._arm"}, ours  # not spool_reporter.django: see _arm.py


# --- an editable install -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def editable(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    if os.environ.get("SPOOL_REPORTER_TEST_EDITABLE", "1") == "0":
        pytest.skip("SPOOL_REPORTER_TEST_EDITABLE=0: nox tests the editable install with one Django per Python")
    return Venv.create(tmp_path_factory.mktemp("editable") / "venv", f"Django=={SERIES}.*", editable=True)


def test_editable_install_is_armed_too(sandbox: Sandbox, editable: Venv) -> None:
    u = User(sandbox, editable)
    site = editable.site_packages()
    assert (site / "spool_reporter.pth").is_file()
    assert not (site / "spool_reporter").exists(), "an editable install imports the checkout"
    u.ok("django-admin", "startproject", "secretproject")
    u.ok("python", "-m", "django", "startapp", "secretapp")
    assert u.names() == ["startproject", "startapp"]
    assert_private(u, "secretproject", "secretapp")


def test_installed_console_script_works(dj: Venv, sandbox: Sandbox) -> None:
    # `pip install .` gives a working `django-spool` (here: the built wheel in a fresh venv, not PYTHONPATH).
    from spool_reporter._version import __version__

    env = venv_env(sandbox.env, dj)
    script = dj.bin / ("django-spool.exe" if os.name == "nt" else "django-spool")
    version = subprocess.run(
        [str(script), "--version"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert (version.returncode, version.stdout, version.stderr) == (
        0, f"django-spool (spool_reporter) {__version__}\n", ""
    )  # fmt: skip
    status = subprocess.run(
        [str(script), "status", "--json"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["reason"] == "default"


# --- a long-lived command's event leaves within one flusher run ------------------------------------------------

DELIVERY_BOUND = 40.0
"""Seconds a ``runserver``'s event may take to reach the collector in the tests below, polled: one flusher run
(the 20 s deadline, docs/flusher.md) plus the flusher's start-up and settling on a loaded machine, twice over.
Without the drain and the long-lived gate it never arrives while runserver runs and no other command is run."""


class HeldCollector(servers.Server):
    """A healthy loopback collector that holds its first answer until :attr:`release` is set (at most
    :attr:`hold` seconds): a flusher is mid-send for as long as the test needs."""

    def __init__(self, hold: float = 60.0) -> None:
        self.release = threading.Event()
        self.hold = hold
        super().__init__("healthy")

    def respond(self, conn: socket.socket, request: servers.Received) -> bool:
        if len(self.received) == 1:
            self.release.wait(self.hold)
        return super().respond(conn, request)

    def close(self) -> None:
        self.release.set()
        super().close()


def _received_events(collector: servers.Server) -> list[str]:
    """The names of the events the collector received, in order."""
    return [str(event["event"]) for request in list(collector.received) for event in request.json()["events"]]


def _stamp(u: User) -> float:
    """When the last flusher was started (flush.spawned)."""
    return (u.sandbox.state_dir(APP) / "flush.spawned").stat().st_mtime


def _pids_delivered(u: User) -> list[str]:
    """The pid of each flusher round that delivered, from flush.log."""
    log = (u.sandbox.state_dir(APP) / "flush.log").read_text().splitlines()
    return [line.split(" pid=")[1].split()[0] for line in log if " delivered: " in line]


def _runserver_event_arrives(server: Server, collector: servers.Server) -> None:
    """runserver's event reaches the collector within DELIVERY_BOUND, with no other command run, while
    runserver keeps serving."""
    wait_for(
        lambda: "runserver" in _received_events(collector), timeout=DELIVERY_BOUND, what="runserver's event to be sent"
    )
    assert server.proc.poll() is None, bytes(server.stderr)  # still serving
    server.wait_serving()


@pytest.mark.skipif(sys.platform == "win32", reason="the hook hands flusher.lock over on POSIX only")
def test_runserver_started_while_a_flusher_sends_has_its_event_sent_by_that_flusher(user: User) -> None:
    """startproject starts a flusher; runserver, started while that flusher waits for its first answer, finds
    flusher.lock taken and starts none. With no other command run, its event reaches the collector within
    DELIVERY_BOUND, sent by the same flusher in a second round, while runserver keeps running."""
    with HeldCollector() as collector:
        user.env = servers.with_destination(
            user.env, collector.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20", SPOOL_REPORTER_READ_TIMEOUT="20"
        )  # the real spawn interval (5 minutes): no second command could start a flusher
        user.ok("django-admin", "startproject", "mysite")
        spawned = _stamp(user)
        wait_for(lambda: len(collector.received) == 1, timeout=30, what="the flusher's first request")
        server = Server(user, user.work / "mysite")
        try:
            wait_for(lambda: "runserver" in user.names(), timeout=60, what="runserver's event in the spool")
            assert len(collector.received) == 1  # recorded while the first round waits for its answer...
            assert _flusher_holds_its_lock(user)  # ...so runserver found the lock taken
            collector.release.set()
            _runserver_event_arrives(server, collector)
            wait_for(lambda: not _flusher_holds_its_lock(user), timeout=30, what="the flusher to exit")
        finally:
            code = server.stop()
    assert code in (0, -signal.SIGINT), bytes(server.stderr)
    assert _received_events(collector) == ["startproject", "runserver"]
    assert _stamp(user) == spawned  # one spawn...
    assert len(set(_pids_delivered(user))) == 1  # ...and one flusher process, in two rounds
    assert user.names() == []


@pytest.mark.skipif(sys.platform == "win32", reason="the hook hands flusher.lock over on POSIX only")
def test_runserver_started_right_after_a_flusher_ended_starts_one(user: User) -> None:
    """startproject starts a flusher, which delivers and ends; runserver, started within SPAWN_GAP (10 s) of that
    start, starts a flusher of its own. With no other command run, its event reaches the collector within
    DELIVERY_BOUND while runserver keeps running."""
    from spool_reporter._hook import SPAWN_GAP

    with servers.serving() as collector:
        user.env = servers.with_destination(user.env, collector.url(), SPOOL_REPORTER_FLUSH_DEADLINE="20")
        user.ok("django-admin", "startproject", "mysite")
        first = _stamp(user)
        wait_for(lambda: len(collector.received) == 1, timeout=30, what="the startproject event")
        wait_for(lambda: not _flusher_holds_its_lock(user), timeout=30, what="the first flusher to exit")
        server = Server(user, user.work / "mysite")
        try:
            _runserver_event_arrives(server, collector)
            # What is tested: runserver recorded (and started its flusher) within SPAWN_GAP of the first start.
            assert first < _stamp(user) < first + SPAWN_GAP
            wait_for(lambda: not _flusher_holds_its_lock(user), timeout=30, what="the second flusher to exit")
        finally:
            code = server.stop()
    assert code in (0, -signal.SIGINT), bytes(server.stderr)
    assert _received_events(collector) == ["startproject", "runserver"]
    assert len(set(_pids_delivered(user))) == 2
    assert user.names() == []
