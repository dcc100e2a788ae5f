"""The main job (placeholder until the collector lands): record a real event in a throw-away home and
show it. Never touches the user's real config or spool."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="spool-demo-") as tmp:
        home = Path(tmp)
        env = {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_STATE_HOME": str(home / "state"),
            "XDG_CONFIG_DIRS": str(home / "etc-xdg"),
        }
        (home / "config").mkdir()
        # The demo opts in explicitly, as a user would with `django-spool enable` (CI runs have CI=true).
        (home / "config" / "djangoanalytics").write_text("disable=0\n")
        from spool_reporter import record
        from spool_reporter._app import django_app
        from spool_reporter._hook import state_dir

        app = django_app("5.2")
        ok = record("startproject", app=app, notice=True, environ={**os.environ, **env})
        spool = Path(state_dir(app, env)) / "spool.jsonl"
        print(f"recorded: {ok}")
        print(f"spool: {spool.relative_to(home)} in a temporary home")
        print(spool.read_text() if spool.exists() else "(empty)", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
