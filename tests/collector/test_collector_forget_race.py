"""Forget against batches in flight and later deliveries, on both stores, many rounds: nothing survives.

Each round, one client id's batches are sent from two threads while a third forgets that id at a moment drawn
from the round's seed; once the forget answered, the batches are delivered again (a spool that still held
them, a flusher that had one in flight). Before the forget marked the id first (``forgotten``), a batch that
arrived during the delete was stored after it and found by no later forget: PostgreSQL left events behind in
40 rounds of 40, SQLite in 16. Here every round must end with no event, no ``client_weeks`` and no
``client_apps`` row of the id, and the refused events counted as ``forgotten``.

The forget's chunks (:data:`~spool_reporter.collector._store.FORGET_CHUNK`) are checked too: a forget of many
events runs as many short write transactions, each examining at most one chunk of a week, so that ingest waits
for one chunk, not for the whole deletion (``benchmarks/bench_forget.py`` measures the wait).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator

import pytest

from spool_reporter.collector import FORGET_PATH, Collector, Retention, make_app
from spool_reporter.collector._common import FORGOTTEN
from spool_reporter.collector._sqlite import SQLiteStore
from spool_reporter.collector._store import FORGET_CHUNK

from support.collector_server import call_wsgi
from support.events import POLICY, batch, det_uuid4, event

ROUNDS = 200
BATCHES = 4
"""Batches per sending thread per round (two threads)."""
PER_BATCH = 5
DAYS = ("2026-12-29T10:00:00Z", "2027-01-04T10:00:00Z")
"""Two ISO weeks (2026-W53 and 2027-W01), so that the forget deletes week by week."""
JSON = {"CONTENT_TYPE": "application/json"}


@pytest.fixture
def app(db_url: str) -> Iterator[Collector]:
    application = make_app(db_url, policy=POLICY, retention=Retention(rollup_every=0))
    try:
        yield application
    finally:
        application.store.close()


def _post(app: Collector, path: str, body: bytes) -> tuple[str, bytes]:
    return call_wsgi(app, "POST", path, body, {**JSON, "CONTENT_LENGTH": str(len(body))})


def _left(app: Collector, client_id: str) -> tuple[int, int, int]:
    with app.store.reading() as reader:
        ((events,),) = reader.query("SELECT COUNT(*) FROM events WHERE client_id = ?", (client_id,))
        ((weeks,),) = reader.query("SELECT COUNT(*) FROM client_weeks WHERE client_id = ?", (client_id,))
        ((apps,),) = reader.query("SELECT COUNT(*) FROM client_apps WHERE client_id = ?", (client_id,))
    return int(events), int(weeks), int(apps)  # type: ignore[call-overload]


def _race(app: Collector, client_id: str, first: list[bytes], second: list[bytes], delay: float, no: int) -> None:
    """Two threads send ``first`` and ``second`` while a third forgets ``client_id`` after ``delay`` seconds."""
    start = threading.Barrier(3)
    errors: list[BaseException] = []

    def send(mine: list[bytes]) -> None:
        try:
            start.wait(10)
            for body in mine:
                status, _ = _post(app, "/v1/batch", body)
                assert status == "200 OK", status
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    def forget() -> None:
        try:
            start.wait(10)
            time.sleep(delay)
            status, answer = _post(app, FORGET_PATH, json.dumps({"client_id": client_id}).encode())
            assert status == "200 OK", (status, answer)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=send, args=(first,)),
        threading.Thread(target=send, args=(second,)),
        threading.Thread(target=forget),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), f"round {no} hung"
    assert not errors, errors


def test_forget_leaves_nothing_against_batches_in_flight(app: Collector) -> None:
    """200 rounds: the id's batches race its forget, then arrive again; not one event of the id survives."""
    bystander = [event(client="bystander", when=DAYS[k % 2]) for k in range(10)]
    assert _post(app, "/v1/batch", batch(bystander))[0] == "200 OK"
    survivors: list[tuple[int, tuple[int, int, int]]] = []
    sent_after = 0
    deadline = time.monotonic() + 240
    for round_no in range(ROUNDS):
        assert time.monotonic() < deadline, f"too slow: {round_no} rounds in 240 s"
        rng = random.Random(round_no)
        client = ("race", round_no)
        client_id = det_uuid4("client", client)
        bodies = [
            [
                batch([event(client=client, when=DAYS[(s + b + k) % 2]) for k in range(PER_BATCH)])
                for b in range(BATCHES)
            ]
            for s in range(2)
        ]
        # One batch before the race, so that the forget always has something to delete.
        assert _post(app, "/v1/batch", bodies[0][0])[0] == "200 OK"
        _race(app, client_id, bodies[0][1:], bodies[1], rng.uniform(0, 0.006), round_no)
        # Later deliveries: every batch again, as a spool that still held them would send them.
        for body in (b for mine in bodies for b in mine):
            status, answer = _post(app, "/v1/batch", body)
            assert status == "200 OK", status
            assert json.loads(answer)["accepted"] == 0, (round_no, answer)
            sent_after += PER_BATCH
        left = _left(app, client_id)
        if left != (0, 0, 0):
            survivors.append((round_no, left))
    assert survivors == [], f"events survived their forget in {len(survivors)} of {ROUNDS} rounds: {survivors[:5]}"
    refused = sum(week.get(FORGOTTEN, 0) for week in app.store.refusals().values())
    assert refused >= sent_after  # every later delivery was refused as forgotten (and some of the race's too)
    assert _left(app, det_uuid4("client", "bystander")) == (10, 2, 1)  # nobody else's events were touched


def test_forget_deletes_in_short_transactions(tmp_path: object) -> None:
    """SQLite: a forget of a client among many events of one week runs one write transaction per chunk of the
    week's rows, never one transaction for the whole week (which held ingest up for half a second)."""
    from pathlib import Path

    db = Path(str(tmp_path)) / "c.sqlite3"
    app = make_app(db, policy=POLICY, retention=Retention(rollup_every=0))
    try:
        store = app.store
        assert isinstance(store, SQLiteStore)
        rows = 3 * FORGET_CHUNK + 17
        others = [event(client=("other", k % 50), when=DAYS[1]) for k in range(rows)]
        mine = [event(client="leaving", when=DAYS[1]) for _ in range(40)]
        mixed = others[:FORGET_CHUNK] + mine[:20] + others[FORGET_CHUNK:] + mine[20:]
        for start in range(0, len(mixed), 500):
            assert _post(app, "/v1/batch", batch(mixed[start : start + 500]))[0] == "200 OK"
        statements: list[str] = []
        conn = store._writing_connection()
        conn.set_trace_callback(statements.append)
        try:
            status, answer = _post(app, FORGET_PATH, json.dumps({"client_id": det_uuid4("client", "leaving")}).encode())
        finally:
            conn.set_trace_callback(None)
        assert (status, json.loads(answer)) == ("200 OK", {"deleted": 40})
        chunks = [s for s in statements if "INDEXED BY events_week" in s]
        # Four chunks hold the week's rows (3 full ones, then the rest), a fifth finds none; each its own BEGIN.
        assert len(chunks) == 5, chunks
        begins = sum(1 for s in statements if s.startswith("BEGIN"))
        assert begins == len(chunks) + 2  # and the mark before them, the client's rows after them
        assert store.count() == (rows, 50)
    finally:
        app.store.close()
