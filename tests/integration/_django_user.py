"""One isolated user running commands in a Django environment, and the constants of the series under test: what
``test_django.py`` and ``test_django_ask.py`` share (their fixtures ``wheel``, ``dj`` and ``user`` are in
``conftest.py``)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from spool_reporter._firstrun import notice_text
from spool_reporter._hook import django_app

from ._django_venv import Venv, django_series, venv_env
from support.sandbox import Sandbox

APP = django_app()
NOTICE = notice_text(APP).encode()
SERIES = django_series()
COMMAND_TIMEOUT = 120  # seconds for one Django command (a cold start under load takes ~1 s)


class User:
    """One isolated user (home, config, state) running commands in ``venv``."""

    def __init__(self, sandbox: Sandbox, venv_: Venv) -> None:
        self.sandbox = sandbox
        self.venv = venv_
        self.env = venv_env(sandbox.env, venv_)
        self.work = sandbox.root / "work"
        self.work.mkdir(exist_ok=True)

    def run(
        self,
        *args: str | Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        off: bool = False,
        python_args: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a command; ``"django-admin"`` and ``"python"`` as the first argument mean the venv's."""
        head, *rest = (str(a) for a in args)
        if head == "django-admin":
            argv = [str(self.venv.python), *python_args, str(self.venv.django_admin), *rest]
        elif head == "python":
            argv = [str(self.venv.python), *python_args, *rest]
        else:
            argv = [head, *rest]
        environ = dict(self.env if env is None else env)
        if off:
            environ["DJANGO_NO_ANALYTICS"] = "1"
        return subprocess.run(
            argv, cwd=cwd or self.work, env=environ, capture_output=True, timeout=COMMAND_TIMEOUT, check=False
        )

    def ok(self, *args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        proc = self.run(*args, **kwargs)  # type: ignore[arg-type]
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.sandbox.spool_lines(APP)]

    def names(self) -> list[str]:
        return [str(e["event"]) for e in self.events()]

    def local_names(self) -> list[str]:
        """The events kept in local mode (never sent unless ``enable``)."""
        return [str(json.loads(line)["event"]) for line in self.sandbox.local_lines(APP)]

    def new_project(self, name: str = "mysite", *, debug: bool = True) -> Path:
        """A project made with reporting off (so it records nothing), ``DEBUG`` as asked."""
        self.ok("django-admin", "startproject", name, off=True)
        root = self.work / name
        if not debug:
            settings = root / name / "settings.py"
            text = settings.read_text()
            assert "DEBUG = True" in text
            settings.write_text(text.replace("DEBUG = True", "DEBUG = False"))
        return root

    def spool_bytes(self) -> bytes:
        folder = self.sandbox.state_dir(APP)
        return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()) if folder.exists() else b""
