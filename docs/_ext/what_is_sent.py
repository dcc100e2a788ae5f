""" "What is sent", generated from the code at build time.

Five generators (``ci-variables``, the list of CI markers from ``_hook.CI_VARIABLES``, lives here too):

``notice``
    The one-time first-run notice, exactly as ``spool_reporter._firstrun.notice_text`` prints it for Django.

``event-fields``
    The allowlist table: every name in ``spool_reporter._event.FIELDS``, in order, with its meaning and
    example from the ``_event`` module docstring and the value this very build machine produces. A field
    in one place but not the other is a warning (the build fails under ``-W``).
``event-example``
    One real spool line, built by the same function the hook uses, pretty-printed.
``dry-run``
    The exact requests each destination would send. For each transport (``json``, ``ga4``, ``ua``) it
    writes a user config and a spool of three events into a throw-away home, runs the real console-script
    entry point ``django-spool flush --dry-run --json`` in a subprocess confined to that home, and renders
    the requests it prints. Until ``spool_reporter.cli`` exists (issue 5) it renders a note instead;
    once it exists, a failure is a warning, never a silent fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging
from spool_generated import REPO, fenced, note, register, table

logger = logging.getLogger(__name__)

CLIENT_ID = "5d1c0a4e-3b7f-4c2a-9e61-0f8d2b7a4c19"
"""A fixed, valid uuid4 for the examples (the real one is random per user)."""

EVENTS = ("startproject", "startapp", "runserver")

DESTINATIONS: tuple[tuple[str, str, dict[str, str]], ...] = (
    (
        "json",
        "the self-hosted collector ({doc}`collector`)",
        {"transport": "json", "endpoint": "https://collector.example.org/v1/batch"},
    ),
    (
        "ga4",
        "GA4 Measurement Protocol",
        {
            "transport": "ga4",
            "endpoint": "https://www.google-analytics.com/mp/collect",
            "measurement_id": "G-DOCS123456",
            "api_secret": "docs-example-secret",
        },
    ),
    (
        "ua",
        "DEP 8's Measurement Protocol v1 field set (retired by Google in July 2023)",
        {"transport": "ua", "endpoint": "https://www.google-analytics.com/batch", "tracking_id": "UA-12345678-1"},
    ),
)
"""The example configurations, one per transport. Secrets are fake; the build checks they never show."""

SECRETS = ("docs-example-secret",)

DRY_RUN_ARGS = ("flush", "--dry-run", "--json")


def _docstring_table() -> dict[str, tuple[str, str]]:
    """``field -> (meaning, example)`` from the simple table in ``spool_reporter._event.__doc__``."""
    from spool_reporter import _event

    lines = (_event.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=") and set(line.strip()) <= {"=", " "}]
    if len(rules) < 3:
        return {}
    rule = lines[rules[0]]
    spans, start = [], None
    for i, ch in enumerate(rule + " "):
        if ch == "=" and start is None:
            start = i
        elif ch != "=" and start is not None:
            spans.append((start, i))
            start = None
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[rules[1] + 1 : rules[2]]:
        cols = [
            line[a : (spans[k + 1][0] if k + 1 < len(spans) else len(line))].strip() for k, (a, _) in enumerate(spans)
        ]
        if len(cols) >= 3 and cols[0]:
            rows[cols[0].strip("`")] = (cols[1], cols[2])
    return rows


def _example_line() -> dict[str, Any]:
    from spool_reporter import _hook
    from spool_reporter._hook import django_app

    line = _hook.build_line(django_app("5.2.7"), "startproject", CLIENT_ID, time.time())
    return json.loads(line)


def generate_fields(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    from spool_reporter import _event

    app.env.note_dependency(REPO / "spool_reporter" / "_event.py")
    documented = _docstring_table()
    fields = list(_event.FIELDS)
    for name in fields:
        if name not in documented:
            logger.warning(
                "what_is_sent: field %r is in _event.FIELDS but not in its docstring table", name, location=docname
            )
    for name in documented:
        if name not in fields:
            logger.warning(
                "what_is_sent: the _event docstring documents %r, which is not in FIELDS", name, location=docname
            )
    example = _example_line()
    rows = []
    for name in fields:
        meaning, sample = documented.get(name, ("", ""))
        rows.append([f"`{name}`", meaning, sample, f"`{json.dumps(example.get(name))}`"])
    # In a container of its own class: on a phone, docs/_static/spool.css stacks each row into a card, so
    # "this build machine" -- the column the table is for -- is on screen, not past a sideways scroll.
    header = ["field", "meaning", "example (docstring)", "this build machine"]
    return "\n:::{container} spool-fields\n" + table(header, rows) + ":::\n"


def generate_example(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    app.env.note_dependency(REPO / "spool_reporter" / "_event.py")
    return fenced(json.dumps(_example_line(), indent=2), "json")


# --- dry run ---------------------------------------------------------------------------------------------


def _clean_environ(home: Path) -> dict[str, str]:
    """This process's environment without anything that could change the outcome or reach a real home."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (
            k.startswith(("DJANGO_", "XDG_", "SPOOL_REPORTER", "PYTHON"))
            or k in ("DO_NOT_TRACK", "HOME", "USERPROFILE", "APPDATA", "LOCALAPPDATA", "PROGRAMDATA")
        )
    }
    env.update(
        {
            "HOME": str(home),
            "USERPROFILE": str(home),
            "LOCALAPPDATA": str(home / "localappdata"),
            "APPDATA": str(home / "appdata"),
            "PROGRAMDATA": str(home / "programdata"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_STATE_HOME": str(home / "state"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_DIRS": str(home / "etc-xdg"),
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
            "NO_COLOR": "1",
            "COLUMNS": "100",
            # Nothing may leave the machine while the docs build, even if a dry run forgot to be dry.
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "",
        }
    )
    return env


def _prepare_home(home: Path, settings: dict[str, str]) -> dict[str, str]:
    """A user config (opted in explicitly, so a CI build is not treated as CI) and a spool of three events."""
    from spool_reporter import _hook
    from spool_reporter._hook import django_app, state_dir, user_config_path

    env = _clean_environ(home)
    app = django_app("5.2.7")
    config = Path(user_config_path(app, env))
    config.parent.mkdir(parents=True, exist_ok=True)
    lines = ["disable=0", f"client_id={CLIENT_ID}", *(f"{k}={v}" for k, v in settings.items())]
    config.write_text("\n".join(lines) + "\n", encoding="ascii")
    now = time.time()
    # Written with the spool's own append (the hook's code path, minus the flusher spawn).
    with _hook.Folder(state_dir(app, env), create=True) as folder:
        for i, event in enumerate(EVENTS):
            _hook.append(folder, _hook.build_line(app, event, CLIENT_ID, now - 60 * (len(EVENTS) - i)))
    return env


def _run_dry_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Exactly what the `django-spool` console script does: set argv, call main(), exit with its result.
    code = "import sys; sys.argv[0] = 'django-spool'; from spool_reporter.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *DRY_RUN_ARGS],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _body_block(body: Any) -> str:
    if isinstance(body, (dict, list)):
        return fenced(json.dumps(body, indent=2), "json")
    text = str(body)
    try:
        return fenced(json.dumps(json.loads(text), indent=2), "json")
    except ValueError:
        return fenced(text, "text")


def _render_request(number: int, total: int, request: Any) -> str:
    if not isinstance(request, dict):
        return f"\nRequest {number} of {total}:\n" + fenced(json.dumps(request, indent=2), "json")
    method = request.get("method", "POST")
    url = request.get("url_redacted") or request.get("url", "")
    events = request.get("events")
    count = f" ({len(events)} events)" if isinstance(events, list) else ""
    if isinstance(request.get("event_count"), int):
        count = f" ({request['event_count']} events)"
    head = [f"{method} {url}"]
    headers = request.get("headers") or {}
    if isinstance(headers, dict):
        head += [f"{k}: {v}" for k, v in headers.items()]
    elif isinstance(headers, list):
        head += [": ".join(map(str, h)) if isinstance(h, (list, tuple)) else str(h) for h in headers]
    out = [f"\nRequest {number} of {total}{count}:\n", fenced("\n".join(head), "text")]
    body = next((request[k] for k in ("body_json", "json", "body", "body_text") if k in request), None)
    if body is not None:
        out.append("\nBody:\n" + _body_block(body))
    known = {
        "method",
        "url",
        "url_redacted",
        "headers",
        "body",
        "body_json",
        "json",
        "body_text",
        "events",
        "event_count",
    }
    rest = {k: v for k, v in request.items() if k not in known}
    if rest:
        out.append("\nAlso reported by the dry run:\n" + fenced(json.dumps(rest, indent=2), "json"))
    return "".join(out)


def _render_destination(name: str, what: str, settings: dict[str, str], result: Any) -> str:
    config = "\n".join(f"{k}={v}" for k, v in settings.items())
    out = [f"\n### `transport={name}`: {what}\n", "\nWith this in the user config file:\n", fenced(config, "ini")]
    if not isinstance(result, dict):
        return "".join([*out, fenced(json.dumps(result, indent=2), "json")])
    events = result.get("events")
    if isinstance(events, list):
        names = ", ".join(
            f"`{e.get('name', e.get('event', '?'))}`" if isinstance(e, dict) else f"`{e}`" for e in events
        )
        out.append(f"\nthe dry run found {len(events)} queued events ({names}) and would make these requests:\n")
    requests = result.get("requests")
    if isinstance(requests, list) and requests:
        for i, request in enumerate(requests, 1):
            out.append(_render_request(i, len(requests), request))
    else:
        reason = result.get("reason") or result.get("requests_reason") or "no reason given"
        out.append(f"\nNo request would be made: {reason}\n")
    rest = {k: v for k, v in result.items() if k not in ("events", "requests", "reason", "requests_reason")}
    if rest:
        out.append("\nThe rest of the dry run's report:\n" + fenced(json.dumps(rest, indent=2), "json"))
    return "".join(out)


def generate_dry_run(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    import importlib.util

    app.env.note_dependency(REPO / "spool_reporter")  # a folder: re-read on every build
    command = "django-spool " + " ".join(DRY_RUN_ARGS)
    try:
        spec = importlib.util.find_spec("spool_reporter.cli")
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return note(
            "**Generated at build time, once the command line exists.** This section will show the exact "
            f"requests of each destination, produced by running `{command}` against a spool of three "
            "events in a throw-away home while the docs are built (see `docs/_ext/what_is_sent.py`). "
            "`spool_reporter.cli` has not landed yet (issue 5), so there is nothing real to show; "
            "no example is typed by hand in its place.",
            "important",
        )
    out = [
        f"\nEach block below is the real output of `{command}`, run while these docs were built, against "
        "the three events `startproject`, `startapp` and `runserver` queued a few minutes earlier by the "
        "same code the hook uses. Event ids are random on every build; the client id is a fixed example.\n"
    ]
    for name, what, settings in DESTINATIONS:
        with tempfile.TemporaryDirectory(prefix="spool-docs-") as tmp:
            env = _prepare_home(Path(tmp), settings)
            try:
                proc = _run_dry_run(env)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "what_is_sent: %s (transport=%s) did not finish in 60 s", command, name, location=docname
                )
                continue
        if proc.returncode == 2 and ("invalid choice" in proc.stderr or "unrecognized arguments" in proc.stderr):
            return note(
                f"`spool_reporter.cli` exists but does not accept `{command}` yet, so the requests cannot "
                f"be shown. It said:\n" + fenced(proc.stderr.strip(), "text"),
                "important",
            )
        if proc.returncode != 0:
            logger.warning(
                "what_is_sent: %s (transport=%s) exited %s: %s",
                command,
                name,
                proc.returncode,
                proc.stderr.strip()[-2000:],
                location=docname,
            )
            continue
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            logger.warning(
                "what_is_sent: %s (transport=%s) did not print JSON: %r",
                command,
                name,
                proc.stdout[:500],
                location=docname,
            )
            continue
        leaked = [s for s in SECRETS if s in proc.stdout]
        if leaked:
            logger.warning(
                "what_is_sent: %s printed a secret unredacted (transport=%s)", command, name, location=docname
            )
            continue
        out.append(_render_destination(name, what, settings, result))
    return "".join(out)


def generate_notice(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    from spool_reporter._firstrun import notice_text
    from spool_reporter._hook import django_app

    app.env.note_dependency(REPO / "spool_reporter" / "_firstrun.py")
    app.env.note_dependency(REPO / "spool_reporter" / "_hook.py")
    return fenced(notice_text(django_app()).strip("\n"), "text")


def generate_ci_variables(app: Sphinx, docname: str, options: dict[str, str]) -> str:
    from spool_reporter._hook import CI_VARIABLES

    app.env.note_dependency(REPO / "spool_reporter" / "_hook.py")
    return "\n" + ", ".join(f"`{name}`" for name in CI_VARIABLES) + "\n"


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("spool_generated")
    register("ci-variables", generate_ci_variables)
    register("notice", generate_notice)
    register("event-fields", generate_fields)
    register("event-example", generate_example)
    register("dry-run", generate_dry_run)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
