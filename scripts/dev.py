"""Bootstrap for the README's two commands: needs only Python 3.10+ with venv and pip.

    python3 scripts/dev.py demo    # the main job: a real Django command reported end to end, offline
    python3 scripts/dev.py test    # the whole test suite (every installed Python 3.10-3.13, real Django 4.2-6.0)
    python3 scripts/dev.py check   # lint, typecheck, docs and benchmarks (what CI adds)

It creates ``.dev-venv/`` with nox in it (once), puts every installed ``python3.X`` on nox's path, and
runs the matching nox sessions. Extra arguments go to nox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".dev-venv"
SESSIONS = {
    "demo": ["demo"],
    "test": ["tests", "django"],
    "check": ["lint", "typecheck", "docs", "bench"],
}


def _bin(name: str) -> Path:
    return VENV / ("Scripts" if os.name == "nt" else "bin") / name


def _pyenv_path() -> dict[str, str]:
    """Make every pyenv-installed Python visible, as the project's CI does."""
    env = dict(os.environ)
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            current = subprocess.run([pyenv, "version-name"], capture_output=True, text=True, check=True)
            versions = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return env
        names = [current.stdout.strip(), *versions.stdout.split()]
        env["PYENV_VERSION"] = ":".join(dict.fromkeys(n for n in names if n))
    return env


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SESSIONS:
        print(__doc__, file=sys.stderr)
        return 2
    if not _bin("nox").exists():
        print("scripts/dev.py: creating .dev-venv with nox (once)", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        subprocess.run([str(_bin("python")), "-m", "pip", "install", "-q", "nox>=2024.10.9"], check=True)
    cmd = [str(_bin("nox")), "-s", *SESSIONS[argv[0]], *argv[1:]]
    return subprocess.run(cmd, cwd=REPO, env=_pyenv_path(), check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
