"""A command on a real pseudo-terminal (the ``pty`` module's ``openpty``), for the ask mode's question.

The child leads a new session whose controlling terminal is the pty (``TIOCSCTTY``), so it is the terminal's
foreground process group: Ctrl-C typed at the master (``\\x03``) is a real SIGINT from the line discipline, and
Ctrl-D at the start of a line (``\\x04``) a real end of file.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

QUESTION = b"Send usage events?"
"""The prompt's words (spool_reporter._ask.question)."""

CTRL_C = b"\x03"
CTRL_D = b"\x04"


@dataclass
class Run:
    returncode: int
    output: bytes
    asked: bool
    """Whether the question appeared."""
    seen_at_question: object = None
    """What ``at_question`` returned when the question appeared (e.g. whether the command's work was done)."""


_LEAD = (
    "import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)
"""Run in the child before the command (no ``preexec_fn``: the test process may run threads): a new session, the
pty as its controlling terminal, then ``exec`` of the command itself."""


def on_terminal(
    argv: Sequence[str | Path],
    *,
    env: dict[str, str],
    cwd: Path,
    answer: bytes | None = None,
    before: Sequence[tuple[bytes, bytes]] = (),
    at_question: object = None,
    timeout: float = 90.0,
) -> Run:
    """Run ``argv`` with stdin, stdout and stderr on one pty; type ``answer`` once the question appears (``None``:
    type nothing). ``before``: pairs (text to wait for, keys to type) handled before the question, in order.
    ``at_question``: a callable run the moment the question appears. Bounded by ``timeout`` seconds."""
    if sys.platform == "win32":  # pragma: no cover
        msg = "POSIX terminals only"
        raise RuntimeError(msg)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LEAD, *(str(a) for a in argv)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env,
        )
    finally:
        os.close(slave)
    output = b""
    pending = list(before)
    asked = False
    seen: object = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every descriptor of the slave is closed
                    break
                if not chunk:
                    break
                output += chunk
            if pending and pending[0][0] in output:
                os.write(master, pending.pop(0)[1])
            if not asked and QUESTION in output:
                asked = True
                if callable(at_question):
                    seen = at_question()
                if answer is not None:
                    os.write(master, answer)
            if not ready and proc.poll() is not None:
                break
        else:
            proc.kill()
            msg = f"{argv} did not end within {timeout} s; output so far: {output!r}"
            raise AssertionError(msg)
        returncode = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    return Run(returncode, output, asked, seen)
