"""What an insert decides in Python, the same way in both back ends: which of a batch's rows are new, which are
refused (over a client's weekly cap, of a closed week, of a forgotten client id) and how the refusals are counted;
the spans that ``client_apps`` takes; and the keyed hash a forget leaves in ``forgotten``, with how long it stays.

Plain functions over :class:`~._common.Row` values and counts, with no SQL and no connection: each back end reads
what they need inside its own write transaction (:mod:`._sqlite`, :mod:`._postgres`) and writes what they decide,
so a rule of the cap or of a forget is written once for both; :meth:`~._store.Store.forget` and the collector's
``/forget`` handler (:mod:`._wsgi`) take the hash and its time from here. :mod:`._store` keeps the interface and the
SQL the back ends share.
"""

from __future__ import annotations

import hashlib
import hmac

from spool_reporter._event import MAX_FUTURE_SECONDS

from ._common import FORGOTTEN, OVER_CAP, TOO_OLD

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._common import Row


def forget_until(now: float, max_age: float) -> float:
    """Until when a client id forgotten at ``now`` stays refused: the newest event recorded before the forget
    (at most :data:`~spool_reporter._event.MAX_FUTURE_SECONDS` ahead of the collector's clock) is then older than
    ``max_age`` (the collector's ``--max-age-days``), so it would be refused as ``too_old`` anyway."""
    return now + max_age + MAX_FUTURE_SECONDS + 86400  # and a day for the clocks


def forget_digest(key: str, client_id: str) -> str:
    """The keyed hash of ``client_id`` kept in ``forgotten`` (hex; the key is the database's ``forget_key``)."""
    return hmac.new(key.encode("ascii"), client_id.encode("ascii"), hashlib.sha256).hexdigest()[:32]


def client_digests(rows: Sequence[Row], key: str) -> dict[str, str]:
    """The keyed hash (:func:`forget_digest`) of each client id of ``rows`` -> that id."""
    return {forget_digest(key, client): client for client in {row.client_id for row in rows}}


def merge_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    """Reason -> events, summed over ``counts``, without the reasons that count nothing (sorted by reason)."""
    out: dict[str, int] = {}
    for one in counts:
        for reason, n in one.items():
            out[reason] = out.get(reason, 0) + n
    return {reason: out[reason] for reason in sorted(out) if out[reason]}


def refused_here(*, forgotten: int, late: int, over_cap: int) -> dict[str, int]:
    """:attr:`~._store.Inserted.refused` of an insert that refused these rows: reason -> rows, without a reason of
    none."""
    return {reason: n for reason, n in ((FORGOTTEN, forgotten), (TOO_OLD, late), (OVER_CAP, over_cap)) if n}


def without_clients(rows: Sequence[Row], clients: set[str]) -> tuple[Sequence[Row], int]:
    """(``rows`` without those of ``clients``, how many were dropped)."""
    if not clients:
        return rows, 0
    kept = [row for row in rows if row.client_id not in clients]
    return kept, len(rows) - len(kept)


def group_new(rows: Sequence[Row], known: set[str]) -> tuple[list[Row], dict[tuple[str, str], int]]:
    """The rows whose id is neither in ``known`` nor earlier in ``rows``, and their count per (client, week)."""
    new: list[Row] = []
    seen = set(known)
    groups: dict[tuple[str, str], int] = {}
    for row in rows:
        if row.event_id in seen:
            continue
        seen.add(row.event_id)
        new.append(row)
        key = (row.client_id, row.week)
        groups[key] = groups.get(key, 0) + 1
    return new, groups


def apply_cap(
    new: list[Row], groups: dict[tuple[str, str], int], used: Mapping[tuple[str, str], int], cap: int
) -> tuple[list[Row], dict[tuple[str, str], int], int]:
    """(rows to store, stored per group, rows over the cap): each group gets what its client has left."""
    if cap <= 0:
        return new, groups, 0
    room = {key: max(0, cap - used.get(key, 0)) for key in groups}
    if all(room[key] >= n for key, n in groups.items()):
        return new, groups, 0
    kept: list[Row] = []
    taken: dict[tuple[str, str], int] = {}
    for row in new:
        key = (row.client_id, row.week)
        if taken.get(key, 0) < room[key]:
            taken[key] = taken.get(key, 0) + 1
            kept.append(row)
    return kept, taken, len(new) - len(kept)


def drop_closed(
    new: list[Row], groups: dict[tuple[str, str], int], closed_through: str
) -> tuple[list[Row], dict[tuple[str, str], int], int]:
    """(rows of open weeks, their count per (client, week), rows of closed weeks): the latter are refused."""
    if not closed_through or all(week > closed_through for _, week in groups):
        return new, groups, 0
    kept = [row for row in new if row.week > closed_through]
    return kept, {key: n for key, n in groups.items() if key[1] > closed_through}, len(new) - len(kept)


def client_apps(rows: Sequence[Row]) -> list[tuple[str, str, str, str]]:
    """(client id, app, first week, last week) of ``rows``, one per client and application, in key order."""
    span: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        key, week = (row.client_id, row.app), row.week
        seen = span.get(key)
        if seen is None:
            span[key] = [week, week]
        elif week < seen[0]:
            seen[0] = week
        elif week > seen[1]:
            seen[1] = week
    return [(client, app, first, last) for (client, app), (first, last) in sorted(span.items())]
