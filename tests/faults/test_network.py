"""Network faults against the detached flusher process: every misbehaving server of ``tests/support/servers.py``,
SYN dropped, DNS that never answers, bad certificates, a proxy -- each run's lifetime measured -- and a
storm of hundreds of commands against a dead destination: at most one flusher alive at a time, no zombie,
spawns bounded by the back-off."""

from __future__ import annotations

import contextlib
import math
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spool_reporter import _state
from spool_reporter._hook import django_app

from ._helpers import (
    Figures,
    SilentResolver,
    children,
    flusher_cmd,
    flushers_of,
    holds_open,
    ids_in,
    process_state,
    python_cmd,
    scale,
    silent_dns,
    spool_bytes,
)
from support.servers import Proxy, RefusedPort, Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.serial,  # commands' wall times asserted, load measured, 127.0.0.1:53 bound (docs/testing.md)
    pytest.mark.skipif(sys.platform != "linux", reason="Linux: /proc, mount namespaces"),
]

APP = django_app("5.2")
DEADLINE = 2.0  # with_destination()
STARTUP = 1.5  # interpreter start + imports on a loaded 2-core machine


@contextlib.contextmanager
def _syn_dropped() -> Iterator[str]:
    """A loopback listener whose accept queue is full: the kernel drops further SYNs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(16):
            s = socket.socket()
            s.settimeout(0.3)
            try:
                s.connect(("127.0.0.1", port))
            except (TimeoutError, OSError):
                s.close()
                break
            fillers.append(s)
        else:
            pytest.skip("the accept queue never filled")
        yield f"http://127.0.0.1:{port}/v1/batch"
    finally:
        for s in fillers:
            s.close()
        listener.close()


BEHAVIOURS: list[Any] = [
    pytest.param("healthy", {"behaviour": "healthy"}, "gone", id="healthy"),
    pytest.param("accepts, never answers", {"behaviour": "silent"}, "kept", id="silent"),
    pytest.param("answers after 5 s", {"behaviour": "slow", "delay": 5.0}, "kept", id="slow"),
    pytest.param("trickles its status line", {"behaviour": "trickle", "interval": 0.05}, "kept", id="trickle"),
    pytest.param("acknowledges, then stalls the body", {"behaviour": "ack-stall"}, "gone", id="ack-stall"),
    pytest.param("500", {"behaviour": "status", "status": 500}, "kept", id="500"),
    pytest.param("503 + Retry-After", {"behaviour": "status", "status": 503, "retry_after": "3"}, "kept", id="503"),
    pytest.param("429 + Retry-After", {"behaviour": "status", "status": 429, "retry_after": "3"}, "kept", id="429"),
    pytest.param("408", {"behaviour": "status", "status": 408}, "kept", id="408"),
    pytest.param("400 (batch refused)", {"behaviour": "status", "status": 400}, "rejected", id="400"),
    pytest.param("413 (batch refused)", {"behaviour": "status", "status": 413}, "rejected", id="413"),
    pytest.param("302 redirect", {"behaviour": "redirect"}, "kept", id="redirect"),
    pytest.param("1 GiB response body", {"behaviour": "huge"}, "gone", id="huge"),
    pytest.param("HTTPS, untrusted certificate", {"behaviour": "healthy", "untrusted": True}, "kept", id="bad-cert"),
    pytest.param("HTTPS through a CONNECT proxy", {"behaviour": "healthy", "proxy": True}, "gone", id="proxy"),
    pytest.param("connection refused", {"refused": True}, "kept", id="refused"),
    pytest.param("SYN dropped (accept queue full)", {"syn": True}, "kept", id="syn-dropped"),
    pytest.param("DNS never answers", {"dns": True}, "kept", id="dns"),
]


@pytest.mark.parametrize(("title", "kw", "spool"), BEHAVIOURS)
def test_server_behaviour(
    sandbox: Sandbox, tmp_path: Path, figures: Figures, title: str, kw: dict[str, Any], spool: str
) -> None:
    trials = scale("behaviour_trials")
    folder = sandbox.state_dir(APP)
    worst = 0.0
    recorded = delivered = kept = rejected = 0
    with contextlib.ExitStack() as stack:
        prefix: list[str] = []
        extra: dict[str, str] = {}
        server: Server | None = None
        resolver: SilentResolver | None = None
        if kw.get("refused"):
            port = RefusedPort()
            stack.callback(port.close)
            url = port.url()
        elif kw.get("syn"):
            url = stack.enter_context(_syn_dropped())
        elif kw.get("dns"):
            resolver = stack.enter_context(silent_dns(tmp_path))
            prefix = resolver.prefix
            url = "https://collector.invalid/v1/batch"
        else:
            tls = None
            if kw.get("untrusted") or kw.get("proxy"):
                import trustme

                tls = trustme.CA()
                ca_path = tmp_path / "ca.pem"
                tls.cert_pem.write_to_path(str(ca_path))
                extra["SSL_CERT_FILE"] = str(ca_path)
            args = {k: v for k, v in kw.items() if k not in ("proxy",)}
            server = stack.enter_context(Server(tls=tls, **args))
            url = server.url()
            if kw.get("proxy"):
                proxy = stack.enter_context(Proxy(("127.0.0.1", server.port)))
                url = "https://collector.example/v1/batch"
                extra["HTTPS_PROXY"] = proxy.url()
        env = with_destination(sandbox.env, url, **extra)
        for _ in range(trials):
            shutil.rmtree(folder, ignore_errors=True)  # a fresh spool, and no back-off from the last trial
            fill(APP, sandbox.env, 3)
            ids = set(ids_in(spool_bytes(folder)))
            recorded += len(ids)
            started = time.monotonic()
            proc = subprocess.run([*prefix, *flusher_cmd()], env=env, capture_output=True, timeout=60, check=False)
            took = time.monotonic() - started
            worst = max(worst, took)
            assert proc.returncode in (0, 2), proc  # 3 would mean the watchdog had to end it
            assert (proc.stdout, proc.stderr) == (b"", b"")
            assert took < DEADLINE + STARTUP, f"{took:.2f}s"
            left = set(ids_in(spool_bytes(folder)))
            if spool == "kept":
                assert left == ids
                state = _state.read_state(APP, environ=env)
                assert state.last_result == "failed"
                assert state.next_retry is not None
                kept += len(left)
            elif spool == "rejected":
                assert not left
                rejected += len(ids)
            else:
                assert not left
                delivered += len(ids)
        if server is not None and spool == "gone":
            assert len(set(server.event_ids())) == delivered
        if resolver is not None:
            assert resolver.queries, "the flusher never asked our silent resolver"
    figures.row(
        fault=f"collector: {title}",
        injected=f"loopback server ({kw}) against the detached flusher (deadline {DEADLINE:g} s)",
        trials=trials,
        recorded=recorded,
        delivered=delivered,
        lost=recorded - delivered - kept - rejected,
        worst_s=worst,
        checked=f"flusher lifetime < deadline + {STARTUP:g} s start-up; exit 0/2, silent; "
        + {"kept": f"{kept} events kept, back-off recorded", "gone": "spool empty"}.get(
            spool, f"{rejected} events refused by a 4xx, dropped and counted"
        ),
    )


KNOWN_SPAWN_RACE = False
"""Fixed: the hook's "is a flusher running?" probe (a try-lock on flusher.lock) cannot see a flusher that is
still starting (~0.2 s of interpreter start-up before it takes the lock), so commands that bypass the spawn
interval (a long-lived ``runserver``, or a spool past 64 KiB) each started another in that window. The gate
now waits ``SPAWN_GAP`` after any spawn. Kept as a switch so the figures say so if it ever regresses."""

STORM_COMMAND = """
from spool_reporter import record
from spool_reporter._hook import django_app
record("startproject", app=django_app("5.2"))
"""

LONG_LIVED = """
import sys, time
from spool_reporter import record
from spool_reporter._hook import django_app
app = django_app("5.2")
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    n += record("runserver", app=app, long_lived=True)
    time.sleep(0.1)
print(n)
"""


class _Sampler(threading.Thread):
    """Samples the process table every few milliseconds: flushers alive, and zombies of a long-lived parent.

    A flusher *runs* from its start until it lets go of ``flusher.lock`` (it holds the descriptor the hook handed
    over from its first instruction, ``/bin/sh`` and ``nice`` included); after that it is only ending (the look
    for late events, ``os._exit``), and a new flusher may rightly start beside it (``_flush._drain``). Niced to 19
    on a loaded 2-core machine, that ending was once seen to outlast a new flusher's start: two processes alive,
    one running. ``max_running`` counts flushers running at once: alive and not yet seen to have held the lock and
    closed it (one that never held it counts too, as the start-up race of old would show); ``max_alive`` counts
    every live flusher process, for the figures."""

    def __init__(self, marker: str, lock: Path) -> None:
        super().__init__(daemon=True)
        self.marker = marker
        self.lock = lock
        self.stop = threading.Event()
        self.parent = 0
        self.samples = 0
        self.max_alive = 0
        self.max_running = 0
        self.pids: set[int] = set()
        self.held: set[int] = set()
        self.zombie_seen: dict[int, list[float]] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            alive = flushers_of(self.marker)
            self.samples += 1
            self.pids |= set(alive)
            live = [pid for pid, state in alive.items() if state not in ("Z", "gone")]
            holding = {pid for pid in live if holds_open(pid, self.lock)}
            self.held |= holding
            running = [pid for pid in live if pid in holding or pid not in self.held]
            self.max_alive = max(self.max_alive, len(live))
            self.max_running = max(self.max_running, len(running))
            if self.parent:
                for child in children(self.parent):
                    if process_state(child) == "Z":
                        self.zombie_seen.setdefault(child, []).append(time.monotonic())
            self.stop.wait(0.003)

    def lingering_zombies(self) -> list[int]:
        """Zombies seen across more than 0.5 s: a child nobody reaps (a zombie for an instant is normal)."""
        return [pid for pid, seen in self.zombie_seen.items() if seen[-1] - seen[0] > 0.5]


@pytest.mark.parametrize("dead", ["refused", "silent"])
def test_storm_of_commands_against_a_dead_destination(
    sandbox: Sandbox, tmp_path: Path, figures: Figures, dead: str
) -> None:
    commands, seconds, parallel = scale("storm_commands"), scale("storm_seconds"), scale("storm_parallel")
    sandbox.write_user(APP, "disable=0\n")
    base = 1.0
    with contextlib.ExitStack() as stack:
        if dead == "refused":
            port = RefusedPort()
            stack.callback(port.close)
            url = port.url()
        else:
            url = stack.enter_context(Server("silent")).url()
        env = with_destination(
            sandbox.env,
            url,
            SPOOL_REPORTER_BACKOFF_BASE=str(base),
            SPOOL_REPORTER_FLUSH_DEADLINE="1",
            # The production spawn interval (300 s): the long-lived process and a spool past 64 KiB bypass it.
        )
        sampler = _Sampler(str(sandbox.home), sandbox.state_dir(APP) / "flusher.lock")
        sampler.start()
        parent = subprocess.Popen([*python_cmd(LONG_LIVED), str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
        sampler.parent = parent.pid
        started = time.monotonic()
        running: list[subprocess.Popen[bytes]] = []
        slowest = 0.0
        launched: dict[int, float] = {}
        try:
            for i in range(commands):
                # Pace the storm evenly over the period, at most `parallel` commands at once.
                due = started + seconds * i / commands
                while time.monotonic() < due or len(running) >= parallel:
                    for proc in running[:]:
                        if proc.poll() is not None:
                            slowest = max(slowest, time.monotonic() - launched.pop(proc.pid))
                            assert proc.returncode == 0
                            running.remove(proc)
                    time.sleep(0.002)
                proc = subprocess.Popen(python_cmd(STORM_COMMAND), env=env)
                launched[proc.pid] = time.monotonic()
                running.append(proc)
            for proc in running:
                proc.wait(timeout=60)
                slowest = max(slowest, time.monotonic() - launched.pop(proc.pid))
            out, _ = parent.communicate(timeout=seconds + 60)
            elapsed = time.monotonic() - started
            deadline = time.monotonic() + 30
            while flushers_of(str(sandbox.home)) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            sampler.stop.set()
            sampler.join(10)
            if parent.poll() is None:
                parent.kill()
                parent.communicate(timeout=30)
    folder = sandbox.state_dir(APP)
    log = (folder / "flush.log").read_text() if (folder / "flush.log").exists() else ""
    attempts = log.count(" failed: ")
    spawns = len(sampler.pids)
    recorded = commands + int(out)
    queued = len(ids_in(spool_bytes(folder)))
    # Failed attempt k waits at least base * 2**(k-1) / 2 (jittered back-off) before attempt k+1 may start.
    bound = 1 + math.ceil(math.log2(2 * elapsed / base + 1))
    assert queued == recorded, "every command's event is kept for later"
    assert sampler.samples > 100
    assert attempts <= bound, (attempts, bound, log)
    assert not sampler.lingering_zombies(), sampler.zombie_seen
    known = ""
    if KNOWN_SPAWN_RACE:
        if sampler.max_running > 1 or spawns > bound + 2:
            known = (
                f"KNOWN BUG: {sampler.max_running} flusher processes running at once and {spawns} started for "
                f"{attempts} attempts (commands in a new flusher's start-up window start another; the extras "
                "exit busy). "
            )
    else:
        assert spawns <= bound + 2, (spawns, attempts, bound, sampler.max_running, log)
        assert sampler.max_running <= 1, f"{sampler.max_running} flushers running at once"
    figures.row(
        fault=f"storm of commands, destination {'refuses connections' if dead == 'refused' else 'never answers'}",
        injected=f"{commands} commands (separate processes calling record(), {parallel} at a time) and a long-lived "
        f"process recording every 0.1 s, over {elapsed:.0f} s; back-off base {base:g} s, production spawn interval",
        trials=commands,
        recorded=recorded,
        delivered=0,
        lost=recorded - queued,
        worst_s=slowest,
        checked=known + f"{spawns} flusher processes started, {attempts} send attempts (bound {bound}); at most "
        f"{sampler.max_running} flusher running"
        + (f" ({sampler.max_alive} alive: the others ending)" if sampler.max_alive > sampler.max_running else "")
        + f" in {sampler.samples} samples of /proc; 0 lingering zombies; "
        "worst case = slowest command",
    )
