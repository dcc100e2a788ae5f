"""A "no" said while a flusher is sending stops it: no request starts after ``disable`` or ``enable --local``.

Real processes: a foreground ``django-spool flush`` sends to a loopback server that holds each answer, and the
user says no from a second ``django-spool`` meanwhile. The request already on the wire cannot be called back
(``disable`` says so); the flusher reads the user's choice again before each request and makes no other.
"""

from __future__ import annotations

import subprocess

import pytest

from spool_reporter._hook import django_app

from support.commands import cli, spool_command
from support.polling import wait_for
from support.sandbox import run_py
from support.servers import fill, serving, with_destination

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

APP = django_app()
HOLD = 3.0
"""Seconds the server holds each answer: the user's "no" lands while the first request waits."""


def _say_no_with_do_not_track(sandbox: Sandbox) -> None:
    """Another shell, with DO_NOT_TRACK=1, runs a reported command: its hook deletes the queue. The flusher's
    own environment has no DO_NOT_TRACK: it stops because the segment it sends is gone."""
    proc = run_py(
        """
        from spool_reporter import record
        from spool_reporter._hook import django_app
        assert not record("startproject", app=django_app("5.2"))
        """,
        {**sandbox.env, "DO_NOT_TRACK": "1"},
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "no", [("disable",), ("enable", "--local"), ("DO_NOT_TRACK",)], ids=["disable", "enable-local", "do-not-track"]
)
def test_no_request_starts_after_the_user_says_no(sandbox: Sandbox, no: tuple[str, ...]) -> None:
    fill(APP, sandbox.env, 1500)  # three segments, four requests of at most 500 events
    with serving("slow", delay=HOLD) as server:
        env = with_destination(sandbox.env, server.url(), SPOOL_REPORTER_FLUSH_DEADLINE="30")
        env["SPOOL_REPORTER_READ_TIMEOUT"] = "10"
        flush = subprocess.Popen(
            [*spool_command(), "flush"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for(lambda: len(server.received) >= 1, timeout=30, what="the first request")
            if no == ("DO_NOT_TRACK",):
                _say_no_with_do_not_track(sandbox)
                assert sandbox.spool_lines(APP) == []
            else:
                said = cli(sandbox, *no, env=env)
                assert said.returncode == 0, said.stderr
                if no == ("disable",):
                    assert "a request already on its way cannot be called back" in said.stdout
            at_no = len(server.received)
            out, err = flush.communicate(timeout=60)
        finally:
            if flush.poll() is None:
                flush.kill()
                flush.wait(10)
        assert at_no == 1, "the no landed while the first request waited for its answer"
        assert len(server.received) == at_no, (out, err)
