"""A "no" said while a flusher is sending stops it: no request starts after ``disable`` or ``enable --local``.

Real processes: a foreground ``django-spool flush`` sends to a loopback server that holds each answer, and the
user says no from a second ``django-spool`` meanwhile. The request already on the wire cannot be called back
(``disable`` says so); the flusher reads the user's choice again before each request and makes no other.
"""

from __future__ import annotations

import subprocess

import pytest
from polling import wait_for
from servers import fill, serving, with_destination
from test_cli import cli, spool_command

from spool_reporter._hook import django_app

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conftest import Sandbox

APP = django_app()
HOLD = 3.0
"""Seconds the server holds each answer: the user's "no" lands while the first request waits."""


@pytest.mark.parametrize("no", [("disable",), ("enable", "--local")], ids=["disable", "enable-local"])
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
            said = cli(sandbox, *no, env=env)
            assert said.returncode == 0, said.stderr
            at_no = len(server.received)
            out, err = flush.communicate(timeout=60)
        finally:
            if flush.poll() is None:
                flush.kill()
                flush.wait(10)
        assert at_no == 1, "the no landed while the first request waited for its answer"
        assert len(server.received) == at_no, (out, err)
        if no == ("disable",):
            assert "a request already on its way cannot be called back" in said.stdout
