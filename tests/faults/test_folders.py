"""The state folder under a folder another user can write: symlinks planted above the spool folder, and the
race between creating a level and setting its mode.

The victim runs as an unprivileged user (``setpriv``), as does the attacker: root ignores file modes, so a
permission case run as root could pass for the wrong reason. The shared folder is writable by everyone and
*not* sticky (a group-shared project folder, say): its entries can be renamed and replaced by the attacker.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from typing import Any

import pytest

from ._helpers import ATTACKER, VICTIM, Figures, Victim, as_user, read_line, scale, tree, users_root

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: setpriv")]

RECORD = """
from spool_reporter import record
from spool_reporter._hook import django_app
print(record("startproject", app=django_app("5.2")), flush=True)
"""


LINKS: list[Any] = [
    pytest.param("spool_reporter", ATTACKER, id="app-level-attackers-link"),
    pytest.param("spool_reporter", VICTIM, id="app-level-own-link"),
    pytest.param("spool_reporter/django", VICTIM, id="last-level-own-link"),
    pytest.param("", ATTACKER, id="above-app-levels-attackers-link"),
]


@pytest.mark.parametrize(("where", "owner"), LINKS)
def test_symlink_above_the_last_folder(figures: Figures, where: str, owner: tuple[int, int]) -> None:
    with users_root() as root:
        users = Victim(root)
        if where:
            link = users.shared / where
            link.parent.mkdir(parents=True, exist_ok=True)
            os.lchown(link.parent, *VICTIM)
        else:  # the whole state base is a link: XDG_STATE_HOME=shared/state -> the victim's decoy folder
            link = users.shared / "state"
            users.env["XDG_STATE_HOME"] = str(link)
        link.symlink_to(users.decoy, target_is_directory=True)
        os.lchown(link, *owner)
        before = tree(users.decoy)
        started = time.monotonic()
        result = users.run(RECORD)
        took = time.monotonic() - started
        after = tree(users.decoy)
    assert (result.returncode, result.stdout, result.stderr) == (0, "False\n", ""), result
    assert after == before, f"the hook wrote through a planted link: {sorted(set(after) - set(before))}"
    who = "the attacker" if owner == ATTACKER else "the victim"
    figures.row(
        fault=f"symlink at {where or 'the state base'} (owned by {who})",
        injected="the victim (an unprivileged user) records with XDG_STATE_HOME in a folder every user can write; "
        f"{where or 'XDG_STATE_HOME itself'} is a symlink to another folder of the victim's",
        trials=1,
        recorded=0,
        worst_s=took,
        checked="record() returns False, prints nothing; nothing created or changed in the link's target",
    )


def test_a_root_owned_link_above_the_state_base_is_followed(figures: Figures) -> None:
    # /home -> /var/home (Fedora Silverblue), /tmp -> private/tmp (macOS): the system's links still work.
    with users_root() as root:
        users = Victim(root)
        real = users.shared / "real-state"
        real.mkdir()
        os.lchown(real, *VICTIM)
        (users.shared / "state").symlink_to(real, target_is_directory=True)  # owned by root
        users.env["XDG_STATE_HOME"] = str(users.shared / "state")
        result = users.run(RECORD)
        spooled = (real / "spool_reporter" / "django" / "spool.jsonl").read_bytes().count(b"\n")
        modes = [stat.S_IMODE(p.lstat().st_mode) for p in (real / "spool_reporter", real / "spool_reporter/django")]
    assert (result.returncode, result.stdout, result.stderr) == (0, "True\n", ""), result
    assert spooled == 1
    assert modes == [0o700, 0o700]
    figures.row(
        fault="root-owned symlink above the state base",
        injected="XDG_STATE_HOME is a symlink owned by root to a folder of the victim's (like /home -> /var/home)",
        trials=1,
        recorded=1,
        checked="followed: the event is spooled, both levels created 0700",
    )


VICTIM_LOOP = """
import os, stat, sys, time
from spool_reporter._hook import Folder
path, target, count, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
parent = os.path.dirname(path)
end = time.monotonic() + seconds
refused = 0
done = 0
while done < count:
    done += 1
    try:
        Folder(path, create=True).close()
    except OSError:
        refused += 1
    for level in (path, parent):
        try:
            os.rmdir(level)
        except OSError:
            pass
    if done % 64 == 0 and (stat.S_IMODE(os.stat(target).st_mode) != 0o644 or time.monotonic() > end):
        break
print(done, refused, flush=True)
"""

ATTACKER_LOOP = """
import ctypes, os, signal, sys, time
name, target = sys.argv[1], sys.argv[2]
base = os.path.dirname(name)
link = os.path.join(base, "link")
os.symlink(target, link)
libc = ctypes.CDLL(None, use_errno=True)
exchange = getattr(libc, "renameat2", None)
swaps = 0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while not stop:
    # One atomic step, as a real attacker would: swap the victim's new folder with a ready symlink
    # (renameat2 RENAME_EXCHANGE); fails with ENOENT until the victim has just made the folder.
    if exchange is not None:
        if exchange(-100, link.encode(), -100, name.encode(), 2) != 0:
            continue
        swaps += 1
        time.sleep(0.0002)
        try:
            os.unlink(name)
            os.rename(link, os.path.join(base, "moved-%d" % swaps))
            os.symlink(target, link)
        except OSError:
            pass
        continue
    try:
        os.rename(name, os.path.join(base, "moved-%d" % swaps))
        os.symlink(target, name)
    except OSError:
        continue
    swaps += 1
    time.sleep(0.0002)
    try:
        os.unlink(name)
    except OSError:
        pass
print(swaps, flush=True)
"""


def test_swap_between_mkdir_and_chmod(figures: Figures) -> None:
    seconds, count = scale("race_seconds"), scale("race_iterations")
    with users_root() as root:
        users = Victim(root)
        folder = users.shared / "spool_reporter" / "django"
        attacker = subprocess.Popen(
            [*as_user(ATTACKER), sys.executable, "-c", ATTACKER_LOOP, str(folder.parent), str(users.precious), "300"],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert read_line(attacker, 30) == "ready\n"
            started = time.monotonic()
            result = users.run(VICTIM_LOOP, str(folder), str(users.precious), str(count), str(seconds), timeout=300)
            took = time.monotonic() - started
        finally:
            attacker.terminate()
            out, _ = attacker.communicate(timeout=30)
        swaps = int(out.split()[-1]) if out.split() else 0
        mode = stat.S_IMODE(users.precious.stat().st_mode)
        content = users.precious.read_bytes()
    assert result.returncode == 0, result
    iterations, refused = map(int, result.stdout.split())
    assert (mode, content) == (0o644, b"the victim's own file\n"), (
        f"the attacker changed the victim's file to {oct(mode)} after {iterations} tries ({swaps} swaps)"
    )
    assert swaps > 0, "the attacker never swapped a level: the race was not exercised"
    figures.row(
        fault="symlink swapped in between mkdir and chmod",
        injected=f"an attacker (another user) renames each new spool_reporter/ away and plants a symlink to the "
        f"victim's file, racing {iterations} creations of the state folder by the victim over {took:.0f} s",
        trials=iterations,
        worst_s=took,
        checked=f"{swaps} swaps won by the attacker, {refused} creations refused; the victim's file kept its mode "
        "(0644) and content",
    )


def test_read_only_views_never_follow_a_planted_link(figures: Figures) -> None:
    # flush --dry-run and status read the spool folder too: through the same descriptors, never by path.
    from spool_reporter._hook import build_line, django_app, uuid4

    with users_root() as root:
        users = Victim(root)
        fake = users.root / "attackers" / "django"
        fake.mkdir(parents=True)
        planted_id = uuid4()  # the planted events' client id
        line = build_line(django_app("5.2"), "startproject", planted_id, time.time())
        (fake / "spool.jsonl").write_bytes(line)
        (fake / "state.json").write_text('{"last_result": "delivered", "last_error": "planted-by-the-attacker"}')
        (fake / "flush.log").write_text("planted-by-the-attacker\n")
        for path in (fake.parent, fake, *fake.iterdir()):
            os.lchown(path, *ATTACKER)
            path.chmod(0o755 if path.is_dir() else 0o644)
        link = users.shared / "spool_reporter"
        link.symlink_to(fake.parent, target_is_directory=True)
        os.lchown(link, *ATTACKER)
        env = {**users.env, "DJANGO_ANALYTICS_ENDPOINT": "http://127.0.0.1:9/v1/batch"}
        cli = (
            "import runpy, sys; sys.argv = ['django-spool', *sys.argv[1:]]; "
            "runpy.run_module('spool_reporter.cli', run_name='__main__')"
        )
        dry = users.run(cli, "flush", "--dry-run", "--json", env=env)
        status = users.run(cli, "status", "--json", env=env)
    assert dry.returncode in (0, 1), dry
    # status cannot read the victim's queue through the attacker's link: it says so, names the link, and fails.
    assert status.returncode == 1, status
    assert f"through the symbolic link {link}; refusing to follow it" in status.stderr, status
    for result in (dry, status):
        assert planted_id not in result.stdout, "a planted event was shown as ours"
        assert "planted-by-the-attacker" not in result.stdout, "a planted state was shown as ours"
    figures.row(
        fault="symlink at spool_reporter/ read by flush --dry-run and status",
        injected="the victim's spool_reporter/ is an attacker's symlink to a folder with a spool of planted events, "
        "a state.json and a log; the victim runs flush --dry-run --json and status --json",
        trials=2,
        checked="neither shows the planted events, state or log",
    )


AUDITED = """
import os, runpy, sys
state = os.path.join(os.environ["XDG_STATE_HOME"], "spool_reporter")
seen = []
PATH_EVENTS = {"open": 0, "os.mkdir": 0, "os.chmod": 0, "os.rename": 0, "os.replace": 0, "os.remove": 0,
               "os.rmdir": 0, "os.utime": 0, "os.listdir": 0, "os.scandir": 0, "os.link": 0, "os.truncate": 0}

folder = os.path.join(state, "django")
own = (folder, os.path.join(folder, "local"))  # the queue's folder and local mode's

def hook(event, args):
    if event in PATH_EVENTS and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        # The one exception: a folder of ours itself, opened in one step and used only if it is the very folder
        # a walk verified before (its inode named by the marker inside it).
        if path.startswith(state) and not (event == "open" and path in own):
            seen.append(f"{event} {path}")

sys.addaudithook(hook)
mode, rest = sys.argv[1], sys.argv[2:]
real_exit = os._exit

def report_then_exit(code):
    sys.stderr.write("".join(line + "\\n" for line in seen))
    sys.stderr.flush()
    real_exit(code)

os._exit = report_then_exit  # the flusher ends with os._exit (a worker may still sit in getaddrinfo)
try:
    if mode == "record":
        from spool_reporter import record
        from spool_reporter._hook import django_app
        record("startproject", app=django_app("5.2"))
    else:
        sys.argv = [mode, *rest]
        runpy.run_module(mode, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    sys.stderr.write("".join(line + "\\n" for line in seen))
"""


def _audited(env: dict[str, str], mode: str, *rest: str) -> list[str]:
    """Paths under the state folder that ``mode`` (``record`` or a module run as ``__main__``) handed over."""
    command = [sys.executable, "-c", AUDITED, mode, *rest]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in result.stderr, result
    return [f"{mode} {' '.join(rest)}: {line}" for line in result.stderr.splitlines() if line.strip()]


def test_nothing_in_the_state_folder_is_reached_by_path(sandbox: Any, figures: Figures) -> None:
    # Python's audit events show every path the processes hand to the kernel: under the state folder, none may
    # be a path (everything there is reached relative to a folder's descriptor, so no swap can redirect it).
    from support.servers import Server, with_destination

    sandbox.write_user(django_app_52(), "disable=0\n")
    found = _audited(sandbox.env, "record") + _audited(sandbox.env, "record")  # the first creates the folders
    runs = [("spool_reporter.cli", ["status"]), ("spool_reporter.cli", ["flush", "--dry-run"])]
    runs += [("spool_reporter._detached", ["--app", "django"]), ("spool_reporter.cli", ["flush"])]
    runs += [("spool_reporter.cli", ["purge"]), ("spool_reporter.cli", ["disable"])]
    with Server() as server:
        env = with_destination(sandbox.env, server.url())
        for mode, rest in runs:
            found += _audited(env, mode, *rest)
        # Local mode's folder: recorded there (created by the first), seen, moved to the queue by enable, sent.
        sandbox.write_user(django_app_52(), "disable=0\nmode=local\n")
        found += _audited(sandbox.env, "record") + _audited(sandbox.env, "record")
        local_runs = [("spool_reporter.cli", ["status"]), ("spool_reporter.cli", ["flush", "--dry-run"])]
        local_runs += [("spool_reporter.cli", ["enable"]), ("spool_reporter.cli", ["flush"])]
        local_runs += [("spool_reporter.cli", ["enable", "--local"]), ("spool_reporter.cli", ["purge"])]
        for mode, rest in local_runs:
            found += _audited(env, mode, *rest)
        delivered = len(server.event_ids())
    assert delivered == 4
    assert not found, "\n".join(found)
    figures.row(
        fault="any path handed to the kernel under the state folder",
        injected="Python audit hooks (open, mkdir, chmod, rename, remove, rmdir, utime, listdir, scandir, link, "
        "truncate) in a first record(), a second, status, flush --dry-run, the detached flusher, flush, purge, "
        "disable; then in local mode two record()s, status, flush --dry-run, enable, flush, enable --local, purge",
        trials=4 + len(runs) + len(local_runs),
        recorded=4,
        delivered=delivered,
        checked="0 paths but the folder's own (compared with the folder a walk verified before): every level and "
        "file reached relative to a folder descriptor",
    )


def django_app_52() -> Any:
    from spool_reporter._hook import django_app

    return django_app("5.2")
