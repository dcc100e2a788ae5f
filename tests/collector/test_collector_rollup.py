"""Retention and roll-ups (``collector/_rollup.py``) on both back ends: a closed week's numbers come from the
roll-up exactly as they came from the raw events, the roll-up holds no client id, a closed week takes no more
events, old events go, and several roll-ups at once do the work once."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spool_reporter._hook import iso_time
from spool_reporter.collector import CollectorError, Retention, open_store, stats
from spool_reporter.collector._common import TOO_OLD, Row
from spool_reporter.collector._rollup import check_retention, closing_week, rollup
from spool_reporter.collector._schema import SCHEMA_VERSION
from spool_reporter.collector._store import Store
from spool_reporter.collector._weeks import this_week, week_before, week_of_valid

from support import pg
from support.events import DAY, ROLLUP_MAX_AGE, ROLLUP_NOW, row
from support.fixtures import BACKENDS
from support.polling import wait_for

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = open_store(db_url, limits=None)
    try:
        yield opened
    finally:
        opened.close()


def history() -> list[Row]:
    """Ten weeks before :data:`ROLLUP_NOW`: developers coming and going, upgrading mid-week, two applications."""
    rows: list[Row] = []
    for back in range(10):
        when = ROLLUP_NOW - (back * 7 + 1) * DAY
        for dev in range(12 + back):
            version = "4.2" if dev % 5 == 0 else "6.0" if dev % 7 == 0 else "5.2"
            os_name = "macOS" if dev % 3 == 0 else "Windows" if dev % 11 == 0 else "Linux"
            python = "3.10" if dev % 13 == 0 else "3.11" if dev % 2 else "3.12"
            rows.append(row(("dev", dev), when, version=version, os_name=os_name, python=python))
            if dev % 4 == 0:  # upgrades that week: counted under both versions
                rows.append(row(("dev", dev), when + 3600, version="6.0", os_name=os_name, python=python, n=1))
            if dev % 6 == 0:
                rows.append(row(("dev", dev), when + 7200, name="startapp", os_name=os_name, python=python))
        rows.append(row(("tool", back), when, app="MyTool", version="1.4", name="build"))
    return rows


def both_ways(store: Store, app: str = "Django") -> tuple[dict[str, object], dict[str, object]]:
    return stats(store, app=app).as_dict(), stats(store, app=app, rollups=False).as_dict()


# -- the calendar -------------------------------------------------------------------------------------------


def test_weeks_close_when_their_last_event_is_too_old() -> None:
    monday = datetime.datetime(2027, 3, 1, tzinfo=datetime.timezone.utc).timestamp()  # 2027-W09 starts
    # 2027-W04 ends on Monday 2027-02-01 00:00; with a 28-day window it closes exactly 28 days later.
    assert closing_week(monday, 28 * DAY) == "2027-W04"
    assert closing_week(monday - 1, 28 * DAY) == "2027-W03"
    assert closing_week(ROLLUP_NOW, ROLLUP_MAX_AGE) == "2027-W04"  # 30 days before Wednesday of W09 is in W05
    assert week_before("2027-W01") == "2026-W53"
    assert week_before("2026-W01") == "2025-W52"


def test_retention_must_outlast_the_window() -> None:
    assert check_retention(Retention(), ROLLUP_MAX_AGE) == Retention()
    with pytest.raises(CollectorError, match="at least a week longer than the maximum event age"):
        check_retention(Retention(retain_days=36), ROLLUP_MAX_AGE)
    for bad in (Retention(retain_days=float("nan")), Retention(rollup_every=-1), Retention(retain_days=1e9)):
        with pytest.raises(CollectorError, match="not usable numbers"):
            check_retention(bad, ROLLUP_MAX_AGE)


# -- the numbers ------------------------------------------------------------------------------------------------


def test_rollup_gives_the_numbers_of_the_raw_events(store: Store) -> None:
    store.insert(history())
    store.set_first_week("2026-W50")  # releases from a fixed week, whatever the day the tests run
    before = both_ways(store)
    assert before[0] == before[1]
    done = rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    assert done.ran
    assert done.closed_through == "2027-W04"
    assert done.rolled == ("2026-W53", "2027-W01", "2027-W02", "2027-W03", "2027-W04")
    assert done.deleted == 0
    assert store.rollup_state() == ("2027-W04", "2027-W04")
    after = both_ways(store)
    assert after[0] == after[1] == before[0]  # the operator's full numbers, week by week and all-time
    assert stats(store, app="MyTool").as_dict() == stats(store, app="MyTool", rollups=False).as_dict()
    # The closed weeks got their final release, made before anything could be deleted; the weeks that ended
    # but are open, a provisional one.
    finals = {r.period for r in done.released if r.kind == "final" and "-W" in r.period}
    provisional = {r.period for r in done.released if r.kind == "provisional"}
    assert set(done.rolled) <= finals
    assert provisional == {"2027-W05", "2027-W06", "2027-W07", "2027-W08"}
    assert done.release_error == ""
    # Again: nothing left to do, nothing changes, and no release is made twice.
    again = rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    assert (again.ran, again.rolled, again.deleted, again.released) == (True, (), 0, ())
    assert both_ways(store)[0] == before[0]


def test_the_rollup_holds_no_client_id(store: Store) -> None:
    rows = history()
    store.insert(rows)
    rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    ids = {r[9] for r in rows} | {r[0] for r in rows}
    with store.reading() as reader:
        text = json.dumps(
            [
                reader.query("SELECT * FROM rollup_weeks"),
                reader.query("SELECT * FROM rollup_cells"),
                reader.query("SELECT * FROM rollup_state"),
            ],
            default=str,
        )
    assert UUID.search(text) is None
    assert not any(i in text for i in ids)


@pytest.fixture(params=BACKENDS)
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """A new empty database of each back end, each call (for hypothesis, whose examples share a fixture)."""
    counter = iter(range(10**6))
    if request.param == "sqlite":
        return lambda: str(tmp_path / f"h{next(counter)}.sqlite3")
    server: pg.Server = request.getfixturevalue("pg_server")
    return server.url


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(
        st.tuples(
            st.integers(0, 14),  # developer
            st.integers(0, 9 * 7 * 24),  # hours before ROLLUP_NOW
            st.sampled_from(["4.2", "5.2", "6.0"]),
            st.sampled_from(["3.10", "3.11", "3.12"]),
            st.sampled_from(["Linux", "macOS", "Windows"]),
            st.sampled_from(["startproject", "runserver"]),
        ),
        max_size=120,
    ),
    cuts=st.lists(st.integers(0, 9 * 7 * 24), max_size=3),
)
def test_rolled_up_equals_raw_for_any_history(
    fresh: Callable[[], str], events: list[tuple[int, int, str, str, str, str]], cuts: list[int]
) -> None:
    """Histories arrive in slices, oldest first; a roll-up runs after each, at a clock that keeps the newest
    week of the slice open (as the time window would), and a last one closes every week."""
    store = open_store(fresh())
    try:
        rows = sorted(
            (
                row(("d", d), ROLLUP_NOW - hours * 3600, version=v, python=py, os_name=o, name=name, n=k)
                for k, (d, hours, v, py, o, name) in enumerate(events)
            ),
            key=lambda r: r[10],
        )
        done = 0
        for cut in [*sorted(set(cuts), reverse=True), 0]:
            upto = sum(1 for r in rows if r[10] <= iso_time(ROLLUP_NOW - cut * 3600))
            store.insert(rows[done:upto])
            done = upto
            if upto:
                last = datetime.datetime.strptime(rows[upto - 1][10], "%Y-%m-%dT%H:%M:%SZ")
                clock = last.replace(tzinfo=datetime.timezone.utc).timestamp() + ROLLUP_MAX_AGE - 1
                rollup(store, now=clock, max_age=ROLLUP_MAX_AGE)
                assert both_ways(store)[0] == both_ways(store)[1]
        rollup(store, now=ROLLUP_NOW + 9 * 7 * DAY, max_age=ROLLUP_MAX_AGE)
        rolled, raw = both_ways(store)
        assert rolled == raw
        assert store.rollup_state().rolled_through >= (rows[-1][11] if rows else "")
    finally:
        store.close()


def test_a_closed_week_takes_no_more_events(store: Store) -> None:
    old = [row(("dev", i), ROLLUP_NOW - 40 * DAY) for i in range(3)]  # 2027-W04, closed at ROLLUP_NOW
    store.insert(old)
    rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    numbers = both_ways(store)[0]
    late = [row(("late", i), ROLLUP_NOW - 40 * DAY) for i in range(4)]
    inserted = store.insert([*late, old[0], late[0]], now=ROLLUP_NOW)  # a re-sent event is a duplicate, not a refusal
    assert (inserted.added, inserted.limited) == (0, 4)
    assert store.refusals()[week_of_valid(iso_time(ROLLUP_NOW))] == {TOO_OLD: 4}
    assert both_ways(store)[0]["weeks"] == numbers["weeks"]
    assert store.count()[0] == 3
    fresh = store.insert([row(("new", 1), ROLLUP_NOW - DAY)])  # an open week still takes events
    assert fresh.added == 1


def test_closing_waits_for_the_inserts_in_flight(store: Store) -> None:
    """Batches of a week keep arriving while that week closes: each is stored before the close and counted in
    the roll-up, or refused after it; none is stored and left out of the numbers."""
    week_start = ROLLUP_NOW - 40 * DAY
    stop = threading.Event()
    errors: list[BaseException] = []
    stored = [0, 0, 0]  # per feeding thread

    def feed(k: int) -> None:
        try:
            for i in range(2000):
                if stop.is_set():
                    return
                rows = [row(("feed", k, i, j), week_start + j, n=(k, i, j)) for j in range(5)]
                stored[k] += store.insert(rows, now=ROLLUP_NOW).added
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=feed, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: sum(stored) >= 30 or errors, timeout=60)  # the close happens while they insert
        done = rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
        refused_before = store.refusals().get(week_of_valid(iso_time(ROLLUP_NOW)), {}).get(TOO_OLD, 0)
        wait_for(
            lambda: (
                store.refusals().get(week_of_valid(iso_time(ROLLUP_NOW)), {}).get(TOO_OLD, 0) > refused_before or errors
            )
        )
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors
    assert done.closed_through >= week_of_valid(iso_time(week_start))
    rolled, raw = both_ways(store)
    assert rolled == raw
    assert sum(w["events"] for w in rolled["weeks"]) == sum(stored) == store.count()[0]  # type: ignore[attr-defined]


def test_retention_deletes_old_events_and_keeps_their_numbers(store: Store) -> None:
    store.insert(history())
    rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
    numbers = both_ways(store)[0]
    total = store.count()[0]
    keep = Retention().retain_days * DAY
    later = ROLLUP_NOW + keep - 8 * 7 * DAY  # the oldest weeks are now past the default retention
    done = rollup(store, now=later, max_age=ROLLUP_MAX_AGE)
    assert done.deleted > 0
    assert store.count()[0] == total - done.deleted
    with store.reading() as reader:
        (oldest,) = reader.query("SELECT MIN(time) FROM events")
    assert str(oldest[0]) >= iso_time(later - keep)[:10]  # events keep their day only
    # The client ids kept beside the events go with them: the weeks wholly before the cutoff keep none.
    cutoff_week = week_of_valid(iso_time(later - keep))
    with store.reading() as reader:
        weeks = reader.query("SELECT COUNT(*) FROM client_weeks WHERE week < ?", (cutoff_week,))
        apps = reader.query("SELECT COUNT(*) FROM client_apps WHERE last_week < ?", (cutoff_week,))
        kept = reader.query("SELECT COUNT(*) FROM client_weeks")
    assert (weeks, apps) == ([(0,)], [(0,)])
    assert kept[0][0] > 0
    # The weeks keep their numbers (and the all-time count its developers): they come from the roll-up.
    assert both_ways(store)[0] == numbers
    assert stats(store, rollups=False).as_dict() != numbers  # the raw events are gone


def test_a_short_retention_is_refused() -> None:
    with pytest.raises(CollectorError, match="at least a week longer"):
        rollup(None, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE, retention=Retention(retain_days=20))  # type: ignore[arg-type]


def test_one_rollup_at_a_time(store: Store, db_url: str) -> None:
    store.insert(history())
    other = open_store(db_url)  # as another process would
    try:
        with other.rollup_lock() as held:
            assert held
            assert rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE).ran is False
        assert rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE).ran is True
    finally:
        other.close()


def test_rollup_from_an_old_schema(tmp_path: Path) -> None:
    """A schema 2 database (no roll-up tables, no indexes) migrates and rolls up."""
    import sqlite3

    from spool_reporter.collector._schema import SQLITE_MIGRATIONS as MIGRATIONS

    db = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(db)
    for version in (1, 2):
        for statement in MIGRATIONS[version]:
            conn.execute(statement)
    rows = history()
    conn.executemany(f"INSERT INTO events VALUES ({', '.join('?' * 12)})", rows)
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    reader = open_store(db, create=False)  # read as it is: no roll-ups yet
    try:
        raw = stats(reader).as_dict()
        assert reader.rollup_state() == ("", "")
    finally:
        reader.close()
    store = open_store(db)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        with store.reading() as view:  # schema 4 keeps the day of an event, never its second
            assert view.query("SELECT DISTINCT length(time) FROM events") == [(10,)]
        rollup(store, now=ROLLUP_NOW, max_age=ROLLUP_MAX_AGE)
        assert stats(store).as_dict() == raw
    finally:
        store.close()


# -- the command ------------------------------------------------------------------------------------------------


def _rollup_cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", "rollup", "--db", db, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_rollup_command(db_url: str) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    store = open_store(db_url)
    try:
        store.insert([row(("dev", i), now - back * 7 * DAY) for i in range(5) for back in range(8)])
    finally:
        store.close()
    done = _rollup_cli(db_url)
    assert (done.returncode, done.stderr) == (0, "")
    closed = closing_week(now, ROLLUP_MAX_AGE)
    assert re.fullmatch(
        rf".*: closed through {closed}; \d weeks? rolled up \(\d{{4}}-W\d\d to \d{{4}}-W\d\d\); 0 events older "
        r"than 430 days deleted\n",
        done.stdout,
    ), done.stdout
    again = _rollup_cli(db_url)
    assert again.stdout.endswith(f"closed through {closed}; 0 weeks rolled up; 0 events older than 430 days deleted\n")
    short = _rollup_cli(db_url, "--retain-days", "10")
    assert short.returncode == 2
    assert short.stderr.startswith(
        "python -m spool_reporter.collector rollup: the retention (10 days) must be at least a week longer"
    )
    assert len(short.stderr.splitlines()) == 1


def test_rollup_commands_at_once_on_postgresql(pg_server: pg.Server) -> None:
    """Several hosts' cron jobs at the same moment: one works, the others say so, and the numbers are right."""
    url = pg_server.url()
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    store = open_store(url)
    try:
        store.insert([row(("dev", i), now - back * 7 * DAY) for i in range(30) for back in range(10)])
        raw = stats(store, rollups=False).as_dict()
    finally:
        store.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "spool_reporter.collector", "rollup", "--db", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all(err == "" for _, err in outs), outs
    worked = [out for out, _ in outs if "rolled up" in out]
    assert len(worked) >= 1
    assert all("rolled up" in out or "another process is rolling up" in out for out, _ in outs)
    assert sum(1 for out in worked if " 0 weeks rolled up" not in out) == 1  # the weeks were rolled once
    store = open_store(url, create=False)
    try:
        assert stats(store).as_dict() == raw
    finally:
        store.close()


def test_serve_and_the_wsgi_module_take_the_retention(tmp_path: Path) -> None:
    from spool_reporter.collector import wsgi

    db = str(tmp_path / "c.sqlite3")
    done = subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", "serve", "--port", "0", "--db", db, "--retain-days", "30"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "python -m spool_reporter.collector serve: the retention (30 days) must be at least a week longer"
    )
    env = {wsgi.DB_VARIABLE: db}
    app = wsgi.from_environ(
        {**env, "SPOOL_REPORTER_COLLECTOR_RETAIN_DAYS": "90", "SPOOL_REPORTER_COLLECTOR_ROLLUP_EVERY": "0"}
    )
    app.store.close()
    assert app.retention == Retention(retain_days=90, rollup_every=0)
    with pytest.raises(CollectorError, match="at least a week longer"):
        wsgi.from_environ(
            {**env, "SPOOL_REPORTER_COLLECTOR_RETAIN_DAYS": "90", "SPOOL_REPORTER_COLLECTOR_MAX_AGE_DAYS": "85"}
        )
    with pytest.raises(CollectorError, match="must be a number"):
        wsgi.from_environ({**env, "SPOOL_REPORTER_COLLECTOR_ROLLUP_EVERY": "hourly"})


# -- the public releases, from the command line ---------------------------------------------------------------


def _collector(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spool_reporter.collector", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_release_commands(db_url: str) -> None:
    """``migrate --first-week`` chooses the first week released, ``rollup`` makes the releases due and says which,
    ``stats --public`` shows exactly what was released; bad values are usage errors that say why."""
    from spool_reporter.collector import public

    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    first = this_week(now - 9 * 7 * DAY)
    store = open_store(db_url)
    try:
        store.insert([row(("dev", i), now - back * 7 * DAY) for i in range(5) for back in range(8)])
    finally:
        store.close()
    bad = _collector("migrate", "--db", db_url, "--first-week", "2026-W54")
    assert bad.returncode == 2  # argparse's usage line, then the reason
    assert bad.stderr.splitlines()[-1].endswith("not an ISO week like 2026-W49: '2026-W54'")
    chosen = _collector("migrate", "--db", db_url, "--first-week", first)
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.endswith(f"public releases start with week {first}\n")
    for epsilon in ("0", "11", "nan", "lots"):
        refused = _collector("rollup", "--db", db_url, "--epsilon", epsilon)
        assert refused.returncode == 2
        assert "epsilon must be a number above 0 and at most 10" in refused.stderr
    nothing = _collector("stats", "--db", db_url, "--public")
    assert nothing.returncode == 0
    assert "nothing released yet" in nothing.stdout
    done = _collector("rollup", "--db", db_url, "--epsilon", "0.5")
    assert (done.returncode, done.stderr) == (0, "")
    made = re.search(r"^released publicly: (.*)$", done.stdout, re.MULTILINE)
    assert made is not None, done.stdout
    assert f"{first} final" in made.group(1)
    assert f"{week_before(this_week(now))} provisional" in made.group(1)
    again = _collector("rollup", "--db", db_url)
    assert "released publicly" not in again.stdout  # made once: nothing is due a second time
    shown = _collector("stats", "--db", db_url, "--public", "--json")
    assert shown.returncode == 0
    doc = json.loads(shown.stdout)
    store = open_store(db_url, create=False)
    try:
        assert doc == json.loads(json.dumps(public(store)))
        releases = store.releases("Django")
    finally:
        store.close()
    weeks = [r for r in releases if "-W" in r.period]
    assert weeks
    assert all(r.epsilon <= 0.25 + 1e-9 for r in weeks)  # --epsilon 0.5 per week, half per release
    assert doc["weeks"][0]["week"] == first
    text = _collector("stats", "--db", db_url, "--public", "--data-license", "CC0-1.0").stdout
    assert f"  {first}  final" in text
    # The settings stated are the ones given (as serve's); each release keeps its own ε.
    assert "epsilon 1 per developer per period; licence CC0-1.0" in text


def test_the_default_retention_releases_every_year() -> None:
    """A year is released once the week of its 31 December is closed, and only while the retention still holds
    its 1 January: with the defaults that holds for every year (31 December on any weekday), with weeks of
    slack (the old 400 days left a year ending on a Monday or a Tuesday unreleased)."""
    from spool_reporter.collector._release import due

    retain = Retention().retain_days
    for year in range(2026, 2061):
        last = datetime.date(year, 12, 31)
        closing = last + datetime.timedelta(days=6 - last.weekday())  # the Sunday that ends its ISO week
        when = datetime.datetime.combine(closing, datetime.time(), datetime.timezone.utc).timestamp()
        released = []
        for slack in (1, 28):  # the first roll-up after the week closed, and one four weeks late
            now = when + ROLLUP_MAX_AGE + slack * DAY
            plans = due(
                now=now,
                first_week=f"{year - 1}-W40",
                closed_through=closing_week(now, ROLLUP_MAX_AGE),
                retain_days=retain,
                epsilon=1.0,
                made=set(),
            )
            released.append(str(year) in {plan.period.name for plan in plans})
        assert released == [True, True], year
