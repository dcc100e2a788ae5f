"""The record of what left (``spool_reporter/_sent.py``) and ``django-spool sent``: real ``django-spool flush``
subprocesses sending to real loopback servers and to the real collector, then ``sent`` as a real subprocess."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter import App
from spool_reporter._sent import SENT_FILE_BYTES, body_bytes

from support.collector_server import Served, start_server
from support.commands import cli, snapshot, spool_command
from support.sandbox import run_py
from support.servers import RefusedPort, fill, serving, with_destination
from support.users import AS_NOBODY, ROOT_WITH_SETPRIV

TYPE_CHECKING = False
if TYPE_CHECKING:
    from support.sandbox import Sandbox

pytestmark = pytest.mark.timeout(180)

API_SECRET = "sent-probe-secret-7c1d9e"  # must appear nowhere in the record
MEASUREMENT_ID = "G-SENTPROBE1"


def flush(sandbox: Sandbox, env: dict[str, str], expect: int = 0) -> str:
    done = subprocess.run([*spool_command(), "flush"], env=env, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == expect, (done.stdout, done.stderr)
    return done.stdout


def sent_json(sandbox: Sandbox, env: dict[str, str] | None = None) -> dict[str, object]:
    done = cli(sandbox, "sent", "--json", env=env)
    assert (done.returncode, done.stderr) == (0, ""), done
    doc = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def requests_of(sandbox: Sandbox, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    requests = sent_json(sandbox, env)["requests"]
    assert isinstance(requests, list)
    return requests


def record_files(sandbox: Sandbox, app: App) -> list[Path]:
    folder = sandbox.state_dir(app)
    return [p for p in (folder / "sent.jsonl.1", folder / "sent.jsonl") if p.exists()]


@pytest.fixture
def collector(tmp_path: Path, sandbox: Sandbox) -> Iterator[Served]:
    served = start_server(tmp_path / "collector.sqlite3", sandbox.env, tmp_path)
    try:
        yield served
    finally:
        served.stop()


# --- what left, byte for byte --------------------------------------------------------------------------


def test_sent_shows_the_bodies_the_server_received_byte_for_byte(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 700)  # two requests: 500 events, then 200
    with serving("script", script=[200, 503, 200]) as server:
        env = with_destination(sandbox.env, server.url())
        flush(sandbox, env, expect=1)  # the first batch is acknowledged, the second answered 503
        flush(sandbox, env)  # the 200 left are sent again, and acknowledged
        received = list(server.received)
    requests = requests_of(sandbox, env)
    assert len(received) == len(requests) == 3
    for got, rec in zip(received, requests, strict=True):
        assert body_bytes(rec) == got.body  # the exact bytes, not a re-encoding
        assert isinstance(rec["body"], str)
        assert rec["body"].encode("ascii") == got.body
        assert rec["method"] == got.method == "POST"
        assert rec["destination"] == server.url()
        assert {k.lower(): v for k, v in rec["headers"].items()}.items() <= got.headers.items()  # type: ignore[attr-defined]
    assert [r["events"] for r in requests] == [500, 200, 200]
    assert [r["status"] for r in requests] == [200, 503, 200]
    assert requests[1]["answer"] == "nope"
    assert requests[0]["answer"] == json.dumps({"accepted": 500, "duplicates": 0})
    assert all(r["error"] is None for r in requests)
    files = record_files(sandbox, app)
    assert [p.name for p in files] == ["sent.jsonl.1", "sent.jsonl"]  # the 500-event request filled the first
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    # The human view: one header line per request, oldest first, then its body as flush --dry-run prints it.
    human = cli(sandbox, "sent", env=env)
    assert (human.returncode, human.stderr) == (0, "")
    headers = [line for line in human.stdout.splitlines() if line.startswith("--- ")]
    assert [h.split(": ", 1)[1] for h in headers] == [
        f"HTTP 200; 500 events, {len(received[0].body)} bytes",
        f"HTTP 503; 200 events, {len(received[1].body)} bytes",
        f"HTTP 200; 200 events, {len(received[2].body)} bytes",
    ]
    assert all(f"POST {server.url()}" in h for h in headers)
    assert human.stdout.startswith("3 requests on record, oldest first (900 events); in ")
    assert '      "event_id": ' in human.stdout  # the body, pretty-printed
    assert "answer: nope\n" in human.stdout


def test_sent_shows_the_collectors_real_answers(sandbox: Sandbox, app: App, collector: Served) -> None:
    fill(app, sandbox.env, 3)
    saved = sandbox.root / "saved"
    shutil.copytree(sandbox.state_dir(app), saved)
    env = with_destination(sandbox.env, collector.url)
    flush(sandbox, env)
    # A flusher killed after the answer, before deleting, sends the same events again: the collector says so.
    for seg in saved.iterdir():
        if seg.name.startswith(("seg-", "spool.jsonl")):
            shutil.copy(seg, sandbox.state_dir(app) / seg.name)
    flush(sandbox, env)
    requests = requests_of(sandbox, env)
    assert [(r["status"], r["answer"], r["events"]) for r in requests] == [
        (200, '{"accepted": 3, "duplicates": 0, "rejected": 0, "refused": {}}', 3),
        (200, '{"accepted": 0, "duplicates": 3, "rejected": 0, "refused": {}}', 3),
    ]
    assert requests[0]["body"] == requests[1]["body"]


def test_ga4_secret_is_never_recorded(sandbox: Sandbox, app: App, collector: Served) -> None:
    fill(app, sandbox.env, 2)
    sandbox.write_user(
        app, sandbox.user_file(app).read_text() + f"measurement_id={MEASUREMENT_ID}\napi_secret={API_SECRET}\n"
    )
    url = collector.url.replace("/v1/batch", "/mp/collect")
    env = with_destination(sandbox.env, url, DJANGO_ANALYTICS_TRANSPORT="ga4")
    flush(sandbox, env)
    (rec,) = requests_of(sandbox, env)
    assert (rec["status"], rec["answer"]) == (204, "")  # as Google's endpoint answers
    assert rec["destination"] == f"{url}?measurement_id={MEASUREMENT_ID}&api_secret=REDACTED"
    assert rec["events"] == 2
    for path in record_files(sandbox, app):
        assert API_SECRET.encode() not in path.read_bytes()


def test_a_request_without_an_answer_is_recorded_with_its_error(sandbox: Sandbox, app: App) -> None:
    """The server got the bytes and never answered: they left all the same, so they are on record."""
    fill(app, sandbox.env, 2)
    with serving("silent") as server:
        env = with_destination(sandbox.env, server.url())
        flush(sandbox, env, expect=1)
        received = list(server.received)
    (rec,) = requests_of(sandbox, env)
    assert body_bytes(rec) == received[0].body
    assert (rec["status"], rec["answer"]) == (None, None)
    error = str(rec["error"])
    assert error.startswith("ReadTimeoutError: ")
    assert "Read timed out" in error
    human = cli(sandbox, "sent", env=env).stdout
    assert f": no answer ({error}); 2 events, {len(received[0].body)} bytes\n" in human


def test_a_refused_connection_is_recorded(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    port = RefusedPort()
    try:
        env = with_destination(sandbox.env, port.url())
        flush(sandbox, env, expect=1)
    finally:
        port.close()
    (rec,) = requests_of(sandbox, env)
    assert rec["status"] is None
    assert "Connection refused" in str(rec["error"]) or "NewConnectionError" in str(rec["error"])


def test_retry_after_is_recorded(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    with serving("status", status=429, body=b"slow down", retry_after="7") as server:
        env = with_destination(sandbox.env, server.url())
        flush(sandbox, env, expect=1)
    (rec,) = requests_of(sandbox, env)
    assert (rec["status"], rec["answer"], rec["retry_after"]) == (429, "slow down", 7.0)
    assert ": HTTP 429, Retry-After 7 s; 1 event, " in cli(sandbox, "sent", env=env).stdout


# --- bounded ---------------------------------------------------------------------------------------------


def test_the_record_stays_bounded_after_many_flushes(sandbox: Sandbox, app: App) -> None:
    flushes = 9  # 250 events a flush, about 90 KiB a record: 770 KiB sent in all, more than both files hold
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        for _ in range(flushes):
            fill(app, sandbox.env, 250)
            flush(sandbox, env)
        received = list(server.received)
    assert len(received) == flushes
    assert sum(len(r.body) for r in received) > 2 * SENT_FILE_BYTES
    files = record_files(sandbox, app)
    assert [p.name for p in files] == ["sent.jsonl.1", "sent.jsonl"]
    for path in files:
        assert path.stat().st_size <= SENT_FILE_BYTES
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    requests = requests_of(sandbox, env)
    kept = len(requests)
    assert 2 <= kept < flushes  # the oldest are gone
    assert [body_bytes(r) for r in requests] == [r.body for r in received[-kept:]]  # the newest, oldest first


# --- deleted by disable, purge and forget ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["purge", "disable", "forget"])
def test_the_record_is_deleted(sandbox: Sandbox, app: App, collector: Served, command: str) -> None:
    fill(app, sandbox.env, 2)
    env = with_destination(sandbox.env, collector.url)
    flush(sandbox, env)
    assert len(record_files(sandbox, app)) == 1
    # `disable` without asking the collector: its forget is recorded anew (tests/client/test_disable_forget.py).
    done = cli(sandbox, *([command, "--keep-remote"] if command == "disable" else [command]), env=env)
    assert done.returncode == 0, done.stderr
    assert "Deleted 0 queued events and the record of what was sent.\n" in done.stdout
    assert record_files(sandbox, app) == []
    nothing = cli(sandbox, "sent", env=env)
    assert (nothing.returncode, nothing.stderr) == (0, "")
    assert nothing.stdout.startswith("Nothing sent is on record: nothing was sent yet, or the record was deleted")
    # With no record, the commands do not claim to delete one.
    again = cli(sandbox, "purge", env=env)
    assert again.stdout == "Deleted 0 queued events.\n"


# --- read only, and never the hook's business ----------------------------------------------------------


def test_sent_with_nothing_recorded_creates_nothing(sandbox: Sandbox) -> None:
    done = cli(sandbox, "sent")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "Nothing sent is on record: nothing was sent yet, or the record was deleted (by disable, purge or forget, "
        "or when reporting was turned off).\n"
    )
    assert json.loads(cli(sandbox, "sent", "--json").stdout) == {"requests": [], "damaged": 0}
    assert not (sandbox.home / "state").exists()


def test_sent_changes_nothing_and_counts_damaged_lines(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 2)
    with serving() as server:
        env = with_destination(sandbox.env, server.url())
        flush(sandbox, env)
    (path,) = record_files(sandbox, app)
    good = path.read_bytes()
    path.write_bytes(b'{"torn": \n' + good + b"[1, 2]\n" + good[: len(good) // 2])
    before = snapshot(sandbox.home)
    doc = sent_json(sandbox, env)
    assert doc["damaged"] == 3
    assert len(doc["requests"]) == 1  # type: ignore[arg-type]
    human = cli(sandbox, "sent", env=env).stdout
    assert human.startswith("1 request on record, oldest first (2 events); 3 damaged lines skipped; in ")
    assert snapshot(sandbox.home) == before


@pytest.mark.skipif(not ROOT_WITH_SETPRIV, reason="needs root, setpriv and a Python the unprivileged user can run")
@pytest.mark.parametrize("locked", ["sent.jsonl", "the spool folder"])
def test_an_unreadable_record_is_an_error_not_nothing(nobody_sandbox: Sandbox, app: App, locked: str) -> None:
    sb = nobody_sandbox
    fill(app, sb.env, 1)
    with serving() as server:
        flush(sb, with_destination(sb.env, server.url()))
    subprocess.run(["chown", "-R", "nobody:nogroup", str(sb.home)], check=True, timeout=30)
    folder = sb.state_dir(app)
    blocked = folder / "sent.jsonl" if locked == "sent.jsonl" else folder
    blocked.chmod(0)
    for args in (["sent"], ["sent", "--json"]):
        done = subprocess.run(
            [*AS_NOBODY, *spool_command(), *args], env=sb.env, capture_output=True, text=True, timeout=60, check=False
        )
        assert (done.returncode, done.stdout) == (1, "")
        what = blocked if locked == "sent.jsonl" else f"the spool folder {folder}"
        assert done.stderr == f"django-spool: cannot read {what}: permission denied\n"


def test_a_body_that_is_not_ascii_is_kept_as_base64(sandbox: Sandbox, app: App) -> None:
    """No transport sends non-ASCII bytes today; the record keeps any body exactly all the same."""
    from spool_reporter._http import Answer
    from spool_reporter._sent import line
    from spool_reporter.transports import Batch, Request

    body = "caf\u00e9 \u2603".encode()
    url = "http://127.0.0.1:1/x"
    request = Request(method="POST", url=url, url_redacted=url, headers={}, body=body)
    record = line(Batch(events=(), request=request), Answer(status=200, body=b"ok"), str, 0.0)
    fill(app, sandbox.env, 1)  # makes the folder
    (sandbox.state_dir(app) / "sent.jsonl").write_bytes(record)
    (sandbox.state_dir(app) / "sent.jsonl").chmod(0o600)
    (rec,) = requests_of(sandbox)
    assert "body" not in rec
    assert body_bytes(rec) == body
    assert record.isascii()


_HOOK_PROBE = """
import json, os, sys
opened = []
def audit(event, args):
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        opened.append(os.path.basename(os.fsdecode(args[0])))
sys.addaudithook(audit)
from spool_reporter import record
from spool_reporter._hook import django_app
ok = record("startproject", app=django_app("5.2.7"))
print(json.dumps({"ok": ok, "opened": opened, "sent_module": "spool_reporter._sent" in sys.modules}))
"""


def test_the_hook_never_opens_the_record(sandbox: Sandbox, app: App) -> None:
    fill(app, sandbox.env, 1)
    with serving() as server:
        flush(sandbox, with_destination(sandbox.env, server.url()))
    (path,) = record_files(sandbox, app)
    path.chmod(0o000)  # and an unreadable record does not stop recording either
    done = run_py(_HOOK_PROBE, sandbox.env)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert probe["ok"] is True
    assert "spool.jsonl" in probe["opened"]  # the audit hook sees the hook's own opens
    assert "sent.jsonl" not in probe["opened"]
    assert "sent.jsonl.1" not in probe["opened"]
    assert probe["sent_module"] is False
    assert len(sandbox.spool_lines(app)) == 1
    # Reporting turned off: the hook purges what is queued, and the record with it, still without opening it.
    done = run_py(_HOOK_PROBE, {**sandbox.env, "DO_NOT_TRACK": "1"})
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert probe["ok"] is False
    assert not {"sent.jsonl", "sent.jsonl.1"} & set(probe["opened"])
    assert probe["sent_module"] is False
    assert record_files(sandbox, app) == []
