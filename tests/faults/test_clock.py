"""Stored times far in the future (a flusher that ran while the clock was a year ahead, or a planted file):
no stored time keeps the flusher away longer than the longest back-off the code can write.

Real commands record events with a destination; the hook starts the detached flusher when the gate is open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from spool_reporter import _hook, _settings, _state
from spool_reporter._hook import django_app

from ._helpers import Figures, flusher_idle, ids_in, python_cmd, spool_bytes
from support.polling import wait_for
from support.servers import Server, fill, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(sys.platform != "linux", reason="Linux: /proc")]

APP = django_app("5.2")
YEAR = 365 * 24 * 3600.0
COMMANDS = 3

RECORD = """
from spool_reporter import record
from spool_reporter._hook import django_app
record("startproject", app=django_app("5.2"))
"""


def test_the_hook_and_the_flusher_share_the_longest_back_off() -> None:
    assert _hook.MAX_BACKOFF == _settings.BACKOFF_CAP


@pytest.mark.parametrize(
    ("ahead", "sent"),
    [
        pytest.param(YEAR, True, id="a-year-ahead"),
        pytest.param(_settings.BACKOFF_CAP + 3600, True, id="cap-plus-an-hour"),
        pytest.param(3600.0, False, id="an-hour-ahead-is-honoured"),
    ],
)
def test_back_off_in_the_far_future(sandbox: Sandbox, figures: Figures, ahead: float, sent: bool) -> None:
    sandbox.write_user(APP, "disable=0\n")
    fill(APP, sandbox.env, 1)
    folder = sandbox.state_dir(APP)
    when = time.time() + ahead
    gate = folder / "flush.notbefore"
    gate.write_bytes(b"")
    os.utime(gate, (when, when))
    (folder / "state.json").write_text(
        json.dumps({"last_result": "failed", "next_retry": when, "consecutive_failures": 3, "last_flush": when})
    )
    with Server() as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_SPAWN_INTERVAL="0")
        env["SPOOL_REPORTER_FLUSH_DEADLINE"] = "10"  # the hook's flusher runs at the lowest priority
        queued = set(ids_in(spool_bytes(folder)))
        started = time.monotonic()
        for _ in range(COMMANDS):
            result = subprocess.run(python_cmd(RECORD), env=env, capture_output=True, timeout=60, check=False)
            assert (result.returncode, result.stdout, result.stderr) == (0, b"", b""), result
            wait_for(
                lambda: flusher_idle(folder, str(sandbox.home)), timeout=60, what="background flushers", interval=0.02
            )
        took = time.monotonic() - started
        recorded = queued | set(ids_in(spool_bytes(folder))) | set(server.event_ids())
        left = set(ids_in(spool_bytes(folder)))
        delivered = set(server.event_ids())
        state = _state.read_state(APP, environ=env)
        log = (folder / "flush.log").read_text() if (folder / "flush.log").exists() else ""
    if sent:
        assert not left, (f"{len(left)} of {len(recorded)} events still queued behind a gate {ahead:.0f} s ahead", log)
        assert delivered == recorded
        assert state.next_retry is None or state.next_retry <= time.time() + _settings.BACKOFF_CAP
    else:
        assert not delivered, "a back-off within the cap was not honoured"
        assert left == recorded
    figures.row(
        fault=f"back-off {ahead / 3600:.0f} h in the future",
        injected=f"flush.notbefore and state.json's next_retry set {ahead:.0f} s ahead; {COMMANDS} commands "
        "recording with a healthy destination, each allowed to start the flusher",
        trials=COMMANDS,
        recorded=len(recorded),
        delivered=len(delivered),
        lost=len(recorded - delivered - left),
        worst_s=took,
        checked=(
            "beyond the longest back-off (24 h): treated as expired, every event delivered"
            if sent
            else "within the longest back-off: honoured, nothing sent, every event kept"
        ),
    )
