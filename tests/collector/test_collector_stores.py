"""The store interface, one suite over both back ends: SQLite (a file) and PostgreSQL (a real server that the
tests start themselves, ``tests/support/pg.py``; skipped with the reason where it cannot be had)."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spool_reporter._redact import redact_url
from spool_reporter.collector import CollectorError, Limits, Policy, StoreClosed, make_app, open_store, stats
from spool_reporter.collector._common import COLUMNS, OVER_CAP, Row
from spool_reporter.collector._schema import SCHEMA_VERSION
from spool_reporter.collector._store import Store

from support.collector_server import call_wsgi
from support.events import CLOCK, POLICY, batch, event, rows_of, store_sample_events
from support.users import AS_NOBODY, ROOT_WITH_SETPRIV


@pytest.fixture
def opened() -> Iterator[list[Store]]:
    """Stores to close at the end of the test (PostgreSQL connections are not for the garbage collector)."""
    stores: list[Store] = []
    yield stores
    for store in stores:
        store.close()


def open_(db: str, opened: list[Store], **kwargs: object) -> Store:
    store = open_store(db, **kwargs)  # type: ignore[arg-type]
    opened.append(store)
    return store


def test_deduplicates_and_reports_new_rows(db_url: str, opened: list[Store]) -> None:
    store = open_(db_url, opened)
    assert store.schema_version() == SCHEMA_VERSION
    rows = rows_of(batch([event(client=i) for i in range(5)]))
    assert store.insert(rows).added == 5
    again = rows_of(batch([event(client="x")]))
    added, new, refused = store.insert([*rows[:2], *again, *again], want_new=True)
    assert (added, refused) == (1, {})
    assert [r[0] for r in new] == [again[0][0]]
    assert store.count() == (6, 6)
    store.close()
    assert open_(db_url, opened, create=False).count() == (6, 6)


def test_rows_have_names_and_plain_tuples_still_insert(db_url: str, opened: list[Store]) -> None:
    """A batch's rows are :class:`Row`: a field is read by its name, not by its place (``row[9]``); a caller of
    the public ``Store.insert`` with plain tuples in ``COLUMNS`` order gets the same result."""
    store = open_(db_url, opened)
    (row,) = rows_of(batch([event(client="named")]))
    assert isinstance(row, Row)
    assert row.client_id == row[COLUMNS.index("client_id")]
    assert row.week == "2026-W49"
    plain = tuple(rows_of(batch([event(client="plain")]))[0])
    inserted = store.insert([plain], want_new=True)  # type: ignore[list-item]
    assert inserted.added == 1
    assert inserted.new == [Row._make(plain)]
    assert inserted.new[0].client_id == plain[COLUMNS.index("client_id")]


def test_a_closed_store_says_so_by_its_type(db_url: str, opened: list[Store]) -> None:
    """Whoever uses a store after close() (a roll-up thread at shutdown) catches :class:`StoreClosed`, not a
    message that happens to contain "is closed"."""
    store = open_(db_url, opened)
    store.close()
    with pytest.raises(StoreClosed):
        store.count()
    with pytest.raises(StoreClosed):
        store.insert(rows_of(batch([event()])))
    with pytest.raises(StoreClosed):
        store.forget("11111111-1111-4111-8111-111111111111", until=CLOCK)
    assert issubclass(StoreClosed, CollectorError)


def test_a_store_must_implement_the_whole_interface() -> None:
    """Store is an abstract base class: a back end that forgets a method fails where it is made, not at the first
    request that needs the method."""

    class Half(Store):
        def reading(self, *, quick: bool = False):  # type: ignore[no-untyped-def]
            raise AssertionError

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


_FORKS = """
import os, sys, threading, time, uuid
from spool_reporter.collector import Limits, open_store
from spool_reporter.collector._store import Row

store = open_store(sys.argv[1], limits=Limits(per_client_week=0))
template = Row._make(sys.argv[2].split(","))
stop = threading.Event()


def fresh() -> list[Row]:
    return [template._replace(event_id=str(uuid.uuid4()))]


def busy() -> None:  # the parent's threads use the store all the time, as a server's do
    while not stop.is_set():
        store.insert(fresh())


store.insert(fresh())  # the parent has its connections (its pool) open when it forks
threads = [threading.Thread(target=busy) for _ in range(int(sys.argv[3]))]
for t in threads:
    t.start()
locks = [v for v in vars(store).values() if isinstance(v, type(threading.Lock()))]
assert locks
bad = 0
for _ in range(5):
    for lock in locks:  # a fork while a thread holds the store's locks (a parent never knows when it forks)
        lock.acquire()
    pid = os.fork()
    if pid == 0:  # the child goes on with the store it inherited, as a gunicorn worker forked after --preload
        try:
            assert store.insert(fresh()).added == 1
            store.count()
        except BaseException as exc:
            os.write(2, f"child: {exc!r}\\n".encode())
            os._exit(1)
        os._exit(0)
    for lock in locks:
        lock.release()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            bad += status != 0
            break
        time.sleep(0.01)
    else:  # stuck on a lock that the parent held at the fork
        bad += 1
        os.kill(pid, 9)
        os.waitpid(pid, 0)
stop.set()
for t in threads:
    t.join()
store.close()
print("bad", bad)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_goes_on_with_the_store_it_inherited(db_url: str, opened: list[Store]) -> None:
    """A fork while a thread of the parent holds the store's locks: the child starts with fresh locks and its own
    connections (on PostgreSQL, its own pool, while the parent's threads use theirs), so its first request does
    not wait forever for a lock no thread of the child will release.

    Not while a thread of the parent is inside a SQLite transaction: SQLite itself forbids using a database in a
    child forked then (its locks are bookkept per process), which no store can mend; a pre-forking server forks
    before it serves."""
    open_(db_url, opened)  # created and migrated before the child process starts
    (row,) = rows_of(batch([event(client="forks")]))
    threads = "0" if db_url.endswith(".sqlite3") else "3"
    done = subprocess.run(
        [sys.executable, "-c", _FORKS, db_url, ",".join(row), threads],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "bad 0", done.stdout + done.stderr[-2000:]


def test_statistics_are_the_same_on_both(db_url: str, opened: list[Store], tmp_path: Path) -> None:
    reference = tmp_path / "reference.sqlite3"
    store_sample_events(reference)
    store = open_(db_url, opened)
    ref = open_(str(reference), opened)
    with ref.reading() as reader:
        rows = reader.query(f"SELECT {', '.join(COLUMNS)} FROM events")
    store.insert([tuple(str(v) for v in row) for row in rows])  # type: ignore[misc]
    assert stats(store).as_dict() == stats(ref).as_dict()
    assert stats(store, app="MyTool").as_dict() == stats(ref, app="MyTool").as_dict()


def test_cap_per_client_per_week_is_counted(db_url: str, opened: list[Store]) -> None:
    store = open_(db_url, opened, limits=Limits(per_client_week=3))
    week49 = [event(client="busy", when=f"2026-12-0{d}T10:00:00Z") for d in range(1, 6)]  # 2026-W49, five events
    week50 = [event(client="busy", when="2026-12-08T10:00:00Z")]
    other = [event(client="calm")]
    rows = rows_of(batch(week49[:2] + other))
    assert store.insert(rows, now=CLOCK) == (3, [], {})
    # Two more for "busy" in W49: one fits, one is over the cap; a re-sent one is a duplicate, not over it.
    rows = rows_of(batch([week49[0], *week49[2:4], *week50]))
    assert store.insert(rows, now=CLOCK)[::2] == (2, {OVER_CAP: 1})
    rows = rows_of(batch(week49[4:]))
    assert store.insert(rows, now=CLOCK)[::2] == (0, {OVER_CAP: 1})
    assert store.count() == (5, 2)
    assert store.refusals() == {"2027-W01": {OVER_CAP: 2}}  # counted in the week they were refused
    weeks = {w.week: w.events for w in stats(store).weeks}
    assert weeks == {"2026-W49": 4, "2026-W50": 1}  # 3 of busy's + calm's


def test_no_cap(db_url: str, opened: list[Store]) -> None:
    store = open_(db_url, opened, limits=Limits(per_client_week=0))
    rows = rows_of(batch([event(client="busy") for _ in range(50)]))
    assert store.insert(rows).added == 50


def test_refusals_are_counted_in_the_same_transaction(db_url: str, opened: list[Store]) -> None:
    store = open_(db_url, opened)
    store.insert([], refused={"too_old": 2, "os": 1}, now=CLOCK)
    store.insert(rows_of(batch([event()])), refused={"os": 4}, now=CLOCK + 7 * 86400)
    assert store.refusals() == {"2027-W01": {"os": 1, "too_old": 2}, "2027-W02": {"os": 4}}
    assert stats(store).refused == store.refusals()


def test_threads_count_each_event_once(db_url: str, opened: list[Store]) -> None:
    store = open_(db_url, opened)
    events = [event(client=i % 40) for i in range(400)]
    errors: list[BaseException] = []
    added: list[int] = []

    def work(k: int) -> None:
        try:
            # Every thread sends every event, in its own order and batch size.
            order = events[k:] + events[:k]
            size = 50 + 25 * k
            for start in range(0, len(order), size):
                added.append(store.insert(rows_of(batch(order[start : start + size]))).added)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sum(added) == 400
    assert store.count() == (400, 40)


def test_migrates_schema_1(db_url: str, opened: list[Store]) -> None:
    rows = rows_of(batch([event(client="old", when="2026-12-03T10:00:00Z") for _ in range(3)]))
    if db_url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            from spool_reporter.collector._schema import POSTGRES_MIGRATIONS as MIGRATIONS

            conn.execute(MIGRATIONS[1][0])
            for row in rows:
                conn.execute(f"INSERT INTO events VALUES ({', '.join(['%s'] * len(row))})", row)
    else:
        from spool_reporter.collector._schema import SQLITE_MIGRATIONS as MIGRATIONS

        conn = sqlite3.connect(db_url)
        conn.execute(MIGRATIONS[1][0])
        conn.executemany(f"INSERT INTO events VALUES ({', '.join('?' * len(COLUMNS))})", rows)
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
        conn.close()
    reader = open_(db_url, opened, create=False)  # reading an old schema needs no migration
    assert (reader.count(), reader.refusals(), stats(reader).events) == ((3, 1), {}, 3)
    reader.close()
    store = open_(db_url, opened, limits=Limits(per_client_week=4))
    assert store.schema_version() == SCHEMA_VERSION
    # The cap counts the history that was there before the migration: one more fits, the next does not.
    more = rows_of(batch([event(client="old", when="2026-12-04T10:00:00Z") for _ in range(2)]))
    assert store.insert(more)[::2] == (1, {OVER_CAP: 1})


def test_refuses_a_newer_schema(db_url: str, opened: list[Store]) -> None:
    open_(db_url, opened).close()
    if db_url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE spool_reporter_schema SET version = 99")
    else:
        conn = sqlite3.connect(db_url)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
    for create in (True, False):
        with pytest.raises(
            CollectorError, match=rf"has schema 99, newer than this collector's {SCHEMA_VERSION}: upgrade"
        ):
            open_store(db_url, create=create)


def test_reading_an_empty_database_is_an_error(db_url: str) -> None:
    with pytest.raises(CollectorError, match="no collector"):
        stats(db_url)


def test_the_wsgi_app_runs_on_both(db_url: str) -> None:
    app = make_app(db_url, policy=POLICY)
    try:
        body = batch([event(), event(name="migrate", valid=False)])
        headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))}
        status, out = call_wsgi(app, "POST", "/v1/batch", body, headers)
        assert (status, out) == (
            "200 OK",
            b'{"accepted": 1, "duplicates": 0, "rejected": 1, "refused": {"command": 1}}',
        )
        assert app.store.refusals() == {"2027-W01": {"command": 1}}
    finally:
        app.store.close()


def test_the_public_routes_run_on_both(db_url: str, tmp_path: Path) -> None:
    """``GET /v1/stats`` and ``GET /`` serve the stored releases, the same way from either back end: nothing
    before a release is made, then exactly what :func:`~spool_reporter.collector.public` reads back."""
    import json

    from spool_reporter.collector import public

    events = []
    for w, when in enumerate(("2026-12-01T10:00:00Z", "2026-12-08T10:00:00Z", "2026-12-15T10:00:00Z")):
        for i in range(6 if w == 1 else 45):
            os_name = "Linux" if i < 30 else "macOS" if i < 42 else "FreeBSD"
            version = "5.2" if i < 25 else "4.2" if i < 43 else "3.2"
            events.append(event(client=("dev", w, i), when=when, app_version=version, os_name=os_name))
    body = batch(events)
    shapes = {}
    for name, db in (("reference", str(tmp_path / "reference.sqlite3")), ("tested", db_url)):
        app = make_app(db, policy=POLICY)
        try:
            app.store.set_first_week("2026-W49")
            headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))}
            assert call_wsgi(app, "POST", "/v1/batch", body, headers)[0] == "200 OK"
            status, out = call_wsgi(app, "GET", "/v1/stats", b"", {})
            assert status == "200 OK"
            assert json.loads(out)["weeks"] == []  # nothing released yet: no week has ended by POLICY's clock
            assert app.wait_rollup(30)  # the batch started one (with the old clock): let it finish
            later = Policy(commands=POLICY.commands, max_age=POLICY.max_age, clock=lambda: CLOCK + 60 * 86400)
            fresh = make_app(db, policy=later)  # a new process: no answer built before the releases
            try:
                assert fresh.rollup().ran
                status, out = call_wsgi(fresh, "GET", "/v1/stats", b"", {})
                assert status == "200 OK"
                doc = json.loads(out)
                assert doc == json.loads(json.dumps(public(app.store)))
                assert call_wsgi(fresh, "GET", "/", b"", {})[0] == "200 OK"
            finally:
                fresh.store.close()
            shapes[name] = [(w["week"], w["release"], sorted(w["by_os"])) for w in doc["weeks"]]
        finally:
            app.store.close()
    assert shapes["tested"] == shapes["reference"]
    # Every week from the first one, with or without events, each over the whole vocabulary (FreeBSD's 3
    # developers are a noisy cell like any other, zero or not).
    assert [week for week, _, _ in shapes["tested"]][:3] == ["2026-W49", "2026-W50", "2026-W51"]
    assert all("FreeBSD" in cells and "other" in cells for _, _, cells in shapes["tested"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://spool:hunter2@db.example/spool", "postgresql://REDACTED@db.example/spool"),
        ("postgresql://db.example/spool?password=hunter2", "postgresql://db.example/spool?password=REDACTED"),
        (
            "postgresql://db.example/spool?sslmode=require&password=x",
            "postgresql://db.example/spool?sslmode=require&password=REDACTED",
        ),
        ("postgresql://spool@db.example/spool", "postgresql://REDACTED@db.example/spool"),
    ],
)
def test_messages_never_show_a_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_an_unreachable_postgres_is_one_line(tmp_path: Path) -> None:
    sock_dir = tmp_path / "nothing-here"
    sock_dir.mkdir()
    url = f"postgresql://spool:hunter2@/spool?host={sock_dir}"
    with pytest.raises(CollectorError) as info:
        open_store(url)
    text = str(info.value)
    assert "hunter2" not in text
    assert "\n" not in text
    assert text.startswith("cannot connect to the collector database postgresql://REDACTED@/spool")


# -- SQLite only: durability and file modes -------------------------------------------------------------------


def test_sqlite_is_wal_and_fully_synchronous(tmp_path: Path, opened: list[Store]) -> None:
    store = open_(str(tmp_path / "c.sqlite3"), opened)
    store.insert(rows_of(batch([event()])))
    from spool_reporter.collector._sqlite import SQLiteStore

    assert isinstance(store, SQLiteStore)
    conn = store._writing_connection()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: every commit is fsynced
    with store.connection() as reader:
        assert reader.execute("PRAGMA synchronous").fetchone()[0] == 2


_OPEN_AT_ONCE = r"""
import sys, time
from spool_reporter.collector import CollectorError, open_store
db, start = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # both processes open the new file at the same moment
try:
    open_store(db, create=True).close()
except CollectorError as exc:
    sys.exit(str(exc))
"""


def test_two_processes_opening_a_new_sqlite_file_at_once_both_succeed(tmp_path: Path) -> None:
    # Two gunicorn workers create and migrate the same new file when the collector first starts; switching it to
    # WAL answered "database is locked" to one of them, without waiting, about one time in three.
    rounds = 30
    for k in range(rounds):
        db = str(tmp_path / f"c{k}.sqlite3")
        start = time.time() + 0.3
        procs = [
            subprocess.Popen([sys.executable, "-c", _OPEN_AT_ONCE, db, repr(start)], stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        errors = [proc.communicate(timeout=60)[1] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], (k, errors)
    stats(str(tmp_path / "c0.sqlite3"))  # a collector database, migrated once


_PRIVATE = r"""
import os, stat, sys
os.umask(0)
sys.path[:0] = sys.argv[2:]
from spool_reporter.collector import open_store
from spool_reporter.collector._wire import parse_batch
db = sys.argv[1]
store = open_store(db)
store.insert([("0b6fc0ae-83e8-4a5c-9d9e-12e1d2d1c2c3", "startproject", "Django", "5.2", "CPython", "3.11", "Linux",
               "6.1", "x86_64", "5d1c0c8e-7c53-4a35-9a3e-a5b0d7e0e1f2", "2026-12-03T08:15:48Z", "2026-W49")])
with store.reading() as r:  # readers keep the -wal and -shm files in place
    print(" ".join(oct(stat.S_IMODE(os.stat(db + s).st_mode)) for s in ("", "-wal", "-shm")))
store.close()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_sqlite_files_are_private_whatever_the_umask() -> None:
    # pytest's own temporary folders are 0700 root's: an unprivileged user needs one it can reach.
    with tempfile.TemporaryDirectory(prefix="spool-umask-") as tmp:
        os.chmod(tmp, 0o755)
        folder = Path(tmp) / "shared"
        folder.mkdir()
        os.chmod(folder, 0o777)  # anyone may create files here: only the modes protect them
        db = folder / "c.sqlite3"
        paths = [p for p in sys.path if p]
        cmd = [sys.executable, "-c", _PRIVATE, str(db), *paths]
        if os.geteuid() == 0:  # root ignores file modes: run as an unprivileged user, as an operator would
            if not ROOT_WITH_SETPRIV:
                pytest.skip("the unprivileged user cannot run this interpreter with the package")
            cmd = [*AS_NOBODY, *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["0o600", "0o600", "0o600"]
        assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_only_the_day_of_an_event_is_stored(db_url: str) -> None:
    """The collector needs the day of an event, never its second: whatever time a batch carries, the stored
    ``time`` is the day (and the new rows handed to a forwarder keep the time they came with)."""
    app = make_app(db_url, policy=POLICY)
    try:
        events = [event(client=("dev", i), when=f"2026-12-0{1 + i}T{10 + i}:3{i}:5{i}Z") for i in range(3)]
        body = batch(events)
        headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body))}
        assert call_wsgi(app, "POST", "/v1/batch", body, headers)[0] == "200 OK"
        with app.store.reading() as reader:
            stored = sorted(str(t) for (t,) in reader.query("SELECT time FROM events"))
        assert stored == ["2026-12-01", "2026-12-02", "2026-12-03"]
        inserted = app.store.insert(rows_of(batch([event(client="other", when="2026-12-04T23:59:59Z")])), want_new=True)
        assert [r[10] for r in inserted.new] == ["2026-12-04T23:59:59Z"]
        with app.store.reading() as reader:
            assert reader.query("SELECT time FROM events WHERE time > '2026-12-03'") == [("2026-12-04",)]
    finally:
        app.store.close()
