"""The record of what left: one JSON line per request the flusher sent, for ``django-spool sent``.

``flush --dry-run`` shows what *would* leave; this record keeps what *did*, so that it can be checked after
the fact. The flusher appends one line per request, right after the request was made, whatever the answer:
a request that got no answer (a timeout, a reset connection) may have reached the destination all the same,
so it is recorded too, with its ``error``.

Each line is an object with ``time`` (UTC), ``destination`` (the URL with secrets such as GA4's
``api_secret`` replaced by ``REDACTED``), ``method``, ``headers``, the exact ``body`` (``body_base64``
instead if its bytes are not ASCII), ``events`` (how many the request carried), and the answer: ``status``,
``answer`` (the response body as the flusher read it, at most :data:`~._http.MAX_RESPONSE_BYTES`, as text),
``retry_after`` (seconds), or ``error`` when there was no answer.

``sent.jsonl`` (``0600``, opened through the folder's descriptor as every file of ours is: nothing planted
there is followed) is rotated to ``sent.jsonl.1`` when an append would take it past :data:`SENT_FILE_BYTES`:
the two hold at most about twice that plus one request, and at least the last :data:`SENT_FILE_BYTES` of
requests: several hundred events. Only the flusher writes it (it holds the flusher's lock), and the detached
run that sends the forget a ``disable`` left (:mod:`._withdraw`, holding the same lock; :func:`forget_line`);
the hook never opens it nor imports this module. Every purge of the queue
deletes it (:func:`._spool.purge`): ``disable``, ``purge``, ``forget`` (the record holds the old client id),
and a hook or flusher that finds reporting turned off.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from . import _files, _hook
from ._spool import SENT_NAME, SENT_OLD_NAME
from ._state import now

if TYPE_CHECKING:
    from ._hook import Folder
    from ._http import Answer
    from .transports import Batch, Request

__all__ = [
    "FORGET_ID_CHARS",
    "SENT_FILE_BYTES",
    "SentRecord",
    "append",
    "body_bytes",
    "exists",
    "forget_line",
    "line",
    "read",
    "short_id",
    "write",
]

SENT_FILE_BYTES: Final = 256 * 1024
"""``sent.jsonl`` is rotated to ``sent.jsonl.1`` before an append would take it past this size. A policy: a
``json`` event takes about 400 bytes of record in a batch, a request of one event about 720, so each file holds
several hundred events; one request may be larger, up to its transport's body limit, and is kept whole."""

READ_LIMIT: Final = 4 * 1024 * 1024
"""Bytes read at most from each of the two files: more than :data:`SENT_FILE_BYTES` plus the largest request
of any transport (512 KiB, escaped), so only damage is ever cut (its last line is then counted as damaged)."""

_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _hook.O_NOFOLLOW | _hook.O_CLOEXEC | _hook.O_NONBLOCK

_FIELDS: Final = (
    "time",
    "destination",
    "method",
    "headers",
    "body",
    "body_base64",
    "events",
    "status",
    "answer",
    "retry_after",
    "error",
)
"""The keys of a record, in the order ``sent --json`` shows them."""


def line(batch: Batch, answer: Answer, redact: Callable[[str], str], when: float) -> bytes:
    """The record of one request as one ASCII line (with its newline)."""
    return _line(batch.request, batch.request.body, len(batch.events), answer, redact=redact, when=when)


def forget_line(request: Request, client_id: str, answer: Answer, redact: Callable[[str], str], when: float) -> bytes:
    """The record of a forget request (``POST /v1/forget``) that a ``disable`` left to a detached run
    (:mod:`._withdraw`): as any request's, except that its body keeps only the client id's first
    :data:`FORGET_ID_CHARS` characters. The id itself is deleted from this machine once the collector confirms
    the forget, and this record outlives it."""
    body = request.body.replace(client_id.encode("ascii"), short_id(client_id).encode("ascii"))
    return _line(request, body, 0, answer, redact=redact, when=when)


FORGET_ID_CHARS: Final = 8
"""How much of a forgotten client id the record of its forget keeps (and ``status`` shows): 32 of its 122 random
bits, enough to tell two forgets apart, too few to find the id among a collector's."""


def short_id(client_id: str) -> str:
    """``1b4e28ba...``: a client id as the record of its forget, the log and ``status`` show it."""
    return client_id[:FORGET_ID_CHARS] + "..."


def _line(
    request: Request, body: bytes, events: int, answer: Answer, *, redact: Callable[[str], str], when: float
) -> bytes:
    doc: dict[str, object] = {
        "time": _hook.iso_time(when),
        "destination": request.url_redacted,
        "method": request.method,
        "headers": {k: redact(v) for k, v in request.headers.items()},
    }
    if body.isascii():
        doc["body"] = body.decode("ascii")
    else:
        doc["body_base64"] = base64.b64encode(body).decode("ascii")
    doc["events"] = events
    doc["status"] = answer.status
    doc["answer"] = None if answer.status is None else redact(answer.body.decode("utf-8", "replace"))
    doc["retry_after"] = answer.retry_after
    doc["error"] = None if answer.status is not None else redact(answer.error or "no answer")
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def append(folder: Folder, batch: Batch, answer: Answer, redact: Callable[[str], str]) -> None:
    """Record one request the flusher made (``answer``: what came back, or the error). Never raises: a record
    that cannot be written (a full disk, a file made unwritable) costs that record only."""
    try:
        write(folder, line(batch, answer, redact, now()))
    except Exception:
        return  # a record, never a reason for the flusher to stop


def write(folder: Folder, data: bytes) -> None:
    """Append the record line ``data``, rotating first when it would take the file past :data:`SENT_FILE_BYTES`.
    The caller holds the flusher's lock. Raises :class:`OSError`."""
    fd, st = _hook.open_ours(folder, SENT_NAME, _APPEND_FLAGS)
    if st.st_size and st.st_size + len(data) > SENT_FILE_BYTES:
        os.close(fd)
        _files.set_aside(folder, SENT_OLD_NAME)  # a folder planted there would stop the rotation for good
        folder.rename(SENT_NAME, SENT_OLD_NAME)
        fd = _hook.open_ours(folder, SENT_NAME, _APPEND_FLAGS)[0]
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


@dataclass(frozen=True, kw_only=True)
class SentRecord:
    """What :func:`read` found."""

    requests: tuple[dict[str, object], ...] = ()
    """The recorded requests, oldest first, each with the keys of :data:`_FIELDS` (``body`` or
    ``body_base64``)."""
    damaged: int = 0
    """Lines that were not a record (torn by a crash, cut, or edited): skipped."""


def _parse(data: bytes) -> tuple[list[dict[str, object]], int]:
    requests: list[dict[str, object]] = []
    damaged = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            damaged += 1
            continue
        if not _valid(doc):
            damaged += 1
            continue
        requests.append({key: doc[key] for key in _FIELDS if key in doc})
    return requests, damaged


def _valid(doc: object) -> bool:
    if not isinstance(doc, dict):
        return False
    texts = all(isinstance(doc.get(key), str) for key in ("time", "destination", "method"))
    body = isinstance(doc.get("body"), str) or isinstance(doc.get("body_base64"), str)
    events = type(doc.get("events")) is int
    headers = isinstance(doc.get("headers"), dict)
    if body and "body_base64" in doc:
        try:
            base64.b64decode(doc["body_base64"], validate=True)
        except ValueError:
            return False
    return texts and body and events and headers


def body_bytes(request: dict[str, object]) -> bytes:
    """The exact bytes of a recorded request's body."""
    body = request.get("body")
    if isinstance(body, str):
        return body.encode("utf-8")
    return base64.b64decode(str(request.get("body_base64", "")))


def _read_file(fd: int, name: str) -> bytes:
    """File ``name`` of the folder ``fd``; ``b""`` if missing or not a regular file of ours. Raises
    :class:`PermissionError` when it is there and cannot be read (an empty answer would be a lie)."""
    try:
        file_fd = os.open(name, _hook.READ_FLAGS, dir_fd=fd)
    except PermissionError:
        raise
    except OSError:
        return b""  # missing, or planted (a symlink): never followed
    try:
        return _files.read_open(file_fd, name, READ_LIMIT)
    except PermissionError:
        raise
    except OSError:
        return b""
    finally:
        os.close(file_fd)


def read(path: str) -> SentRecord:
    """The record in the spool folder at ``path``, oldest first, read without locking, creating or changing
    anything (not even a mode). Raises :class:`OSError` when the folder or a file of the record is there but
    cannot be read, so that nothing unreadable is shown as "nothing sent"."""
    chunks: list[bytes] = []
    if _hook.DIR_FD:
        try:
            fd = _files.open_dirs(path, create=False, own=_hook.OWN_LEVELS, tighten=False)
        except FileNotFoundError:
            return SentRecord()
        try:
            chunks = [_read_file(fd, SENT_OLD_NAME), _read_file(fd, SENT_NAME)]
        finally:
            os.close(fd)
    else:  # pragma: no cover windows - no descriptor-relative calls
        with _files.ReadOnlyFolder(path) as folder:
            chunks = [folder.read(SENT_OLD_NAME, READ_LIMIT), folder.read(SENT_NAME, READ_LIMIT)]
    requests: list[dict[str, object]] = []
    damaged = 0
    for chunk in chunks:  # parsed apart: a torn last line of the old file must not swallow the first new one
        found, bad = _parse(chunk)
        requests += found
        damaged += bad
    return SentRecord(requests=tuple(requests), damaged=damaged)


def exists(path: str) -> bool:
    """Whether the spool folder at ``path`` holds a record (read only, never raises)."""
    with _files.ReadOnlyFolder(path) as folder:
        names = folder.names()
    return SENT_NAME in names or SENT_OLD_NAME in names
