"""The collector as real processes: ``python -m spool_reporter.collector serve --port 0`` on loopback,
several client processes posting at once, two server processes sharing one database, and the
``stats`` command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter.collector import MAX_BODY_BYTES, stats
from spool_reporter.collector._cli import register

from support.collector_server import Served, post, start_server
from support.events import assert_private, batch, db_bytes, event, probe_headers, recent, store_sample_events

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(tmp_path: Path, sandbox: object) -> Iterator[Served]:
    srv = start_server(tmp_path / "c.sqlite3", sandbox.env, tmp_path)  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(10)


def test_subprocess_server_end_to_end_and_private(served: Served, tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    events = [event(client=i % 4, when=recent(), valid=False) for i in range(500)]  # judged by the server's clock
    answer = b'{"accepted": 500, "duplicates": 0, "rejected": 0, "refused": {}}'
    assert post(served.url, batch(events), probe_headers()) == (200, answer)
    answer = b'{"accepted": 0, "duplicates": 500, "rejected": 0, "refused": {}}'
    assert post(served.url, batch(events), probe_headers()) == (200, answer)
    assert post(served.url, b"garbage", probe_headers())[0] == 400
    assert post(served.url, b"x" * (MAX_BODY_BYTES + 1), probe_headers())[0] == 413
    assert_private(db_bytes(db))
    out = served.stop()
    assert served.proc.returncode == 0
    assert out == "stopped after 4 requests: 500 events stored, 500 duplicates, 2 requests refused, 0 events refused\n"
    assert served.stderr.read_bytes() == b""  # no access log, no traceback, no address
    assert_private(db_bytes(db))
    assert stats(db).developers == 4


_CLIENT = r"""
import hashlib, http.client, json, sys, time
when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))  # inside the server's time window
host, port, who, batches, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def uid(*parts):
    b = bytearray(hashlib.sha256(repr(parts).encode()).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
accepted = duplicates = 0
for b in range(batches):
    events = [{"schema": 1, "event_id": uid("e", who, b, i), "event": "runserver", "app": "Django",
               "app_version": "5.2", "python": "CPython", "python_version": "3.12", "os": "Linux",
               "os_release": "6.1", "arch": "x86_64", "user_agent": "Django/5.2 CPython/3.12 (Linux; x86_64)",
               "client_id": uid("c", who, i % 10), "time": when} for i in range(size)]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("POST", "/v1/batch", body=json.dumps({"schema": 1, "events": events}),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read())
    doc = json.loads(r.read())
    accepted += doc["accepted"]
    duplicates += doc["duplicates"]
    conn.close()
print(json.dumps([accepted, duplicates]))
"""


def test_concurrent_client_processes_and_two_server_processes(tmp_path: Path, sandbox: object) -> None:
    env = sandbox.env  # type: ignore[attr-defined]
    db = tmp_path / "shared.sqlite3"
    servers = [start_server(db, env, tmp_path) for _ in range(2)]
    try:
        clients, batches, size = 6, 6, 200
        procs = []
        for k in range(clients):
            # Clients 2j and 2j+1 send the same events, each to a different server process, at the same time.
            host_port = servers[k % 2].url.split("/")[2]
            host, port = host_port.rsplit(":", 1)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CLIENT, host, port, str(k // 2), str(batches), str(size)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                )
            )
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
    finally:
        outs = [srv.stop() for srv in servers]
    distinct = clients // 2 * batches * size
    assert sum(a for a, _ in results) == distinct
    assert sum(d for _, d in results) == clients * batches * size - distinct
    assert [srv.proc.returncode for srv in servers] == [0, 0]
    assert sum(int(out.split()[4]) for out in outs) == distinct  # "... N events stored"
    result = stats(db)
    assert (result.events, result.developers) == (distinct, clients // 2 * 10)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_cli_stats(tmp_path: Path, sandbox: object) -> None:
    env = sandbox.env  # type: ignore[attr-defined]
    db = tmp_path / "c.sqlite3"
    store_sample_events(db)
    report = tmp_path / "report.html"
    done = _cli(env, "stats", "--db", str(db), "--json", "--html", str(report))
    assert done.returncode == 0
    assert done.stderr == ""
    doc = json.loads(done.stdout)
    assert doc == json.loads(json.dumps(stats(db).as_dict()))
    assert [(w["week"], w["developers"], w["events"]) for w in doc["weeks"]] == [
        ("2026-W49", 2, 3),
        ("2026-W50", 2, 3),
        ("2027-W01", 1, 1),
    ]
    assert set(doc["weeks"][0]) == {"week", "developers", "events", "by_django", "by_python", "by_os", "by_event"}
    page = report.read_text(encoding="utf-8")
    ET.fromstring(page)
    assert "4</strong> developers in all" in page
    text = _cli(env, "stats", "--db", str(db))
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0] == f"Django: 4 developers, 7 events, 3 weeks with events ({db})"
    assert lines[2].split()[:3] == ["2026-W49", "2", "3"]
    assert "5.2: 1, 4.2: 1" not in lines[2]
    assert "4.2: 1, 5.2: 1" in lines[2]
    mytool = _cli(env, "stats", "--db", str(db), "--app", "Nothing")
    assert "other applications in this database: Django (7 events), MyTool (1 event);" in mytool.stdout


def test_cli_errors(tmp_path: Path, sandbox: object) -> None:
    env = sandbox.env  # type: ignore[attr-defined]
    missing = tmp_path / "missing.sqlite3"
    done = _cli(env, "stats", "--db", str(missing))
    assert done.returncode == 1
    assert "no collector database" in done.stderr
    assert not missing.exists()
    assert _cli(env).returncode == 2
    assert _cli(env, "serve").returncode == 2  # --db is required
    done = _cli({k: v for k, v in env.items() if k != "SPOOL_REPORTER_GA4_API_SECRET"},
                "serve", "--db", str(tmp_path / "x.sqlite3"), "--forward-ga4", "G-1")  # fmt: skip
    assert done.returncode == 2
    assert "SPOOL_REPORTER_GA4_API_SECRET" in done.stderr
    done = _cli(env, "serve", "--db", str(tmp_path / "x.sqlite3"), "--port", "70000")
    assert done.returncode == 2
    # A database that cannot be opened: one line, exit 1, no traceback, no password (issue 13).
    nothing = tmp_path / "no-server"
    nothing.mkdir()
    url = f"postgresql://spool:hunter2@/spool?host={nothing}"
    for args in (
        ["stats", "--db", url],
        ["serve", "--port", "0", "--db", url],
        ["migrate", "--db", url],
        ["migrate", "--db", str(tmp_path)],  # a directory
        ["serve", "--port", "0", "--db", str(tmp_path / "missing-folder" / "c.sqlite3")],
    ):
        done = _cli(env, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1, (args, done.stderr)
        assert done.stderr.startswith(f"python -m spool_reporter.collector {args[0]}: "), done.stderr
        assert "hunter2" not in done.stderr
        assert done.stdout == ""
    done = _cli({**env, "SPOOL_REPORTER_COLLECTOR_DB": str(missing)}, "stats")  # the variable stands for --db
    assert (done.returncode, "no collector database" in done.stderr) == (1, True)


def test_register_contract(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="django-spool")
    sub = parser.add_subparsers(dest="command", required=True)
    collector = register(sub)
    assert collector.prog == "django-spool collector"
    args = parser.parse_args(["collector", "serve", "--port", "0", "--db", "x.sqlite3"])
    assert callable(args.func)
    assert (args.host, args.port, args.db) == ("127.0.0.1", 0, "x.sqlite3")
    args = parser.parse_args(["collector", "stats", "--db", str(tmp_path / "none"), "--json"])
    assert args.func(args) == 1  # a missing database is an error, and none is created
    assert not (tmp_path / "none").exists()
    with pytest.raises(SystemExit):
        parser.parse_args(["collector"])
