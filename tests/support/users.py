"""An unprivileged user, for tests of file permissions: root ignores file modes, so a permission test run as
root could pass for the wrong reason; such tests run their commands as ``nobody`` through ``setpriv``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from .sandbox import PACKAGE_FROM_CHECKOUT, REPO

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
"""The command prefix that runs a process as ``nobody``/``nogroup`` with no supplementary groups."""


def _nobody_can_run_python() -> bool:
    """Root with setpriv, and an interpreter (with this package) that an unprivileged user can start: a pyenv
    build under /root may load its libpython from a folder only root can enter."""
    if not (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("setpriv")):
        return False
    env = {"PATH": os.environ.get("PATH", ""), **({"PYTHONPATH": str(REPO)} if PACKAGE_FROM_CHECKOUT else {})}
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import spool_reporter"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


ROOT_WITH_SETPRIV = _nobody_can_run_python()
"""Whether the permission tests can run their commands as ``nobody`` (:data:`AS_NOBODY`) with this
interpreter and this package; the one probe every such test asks (they skip where it is false)."""
