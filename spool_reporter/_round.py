"""One round of a flusher run, once the flusher lock is held: claim, send batch by batch, settle.

:mod:`._flush` makes one :class:`Round` for each round of a run (its ``_drain``) and turns what the round did
into a :class:`~._flush.FlushResult`; this module claims the spool, sends its segments, settles each under the
spool lock, and reads what a 2xx answer says the destination refused.

**Delivery.** At least once: claim by rename under the spool lock, send sealed segments oldest first,
delete a segment's events only after their batch got a 2xx (a partly sent segment is rewritten with the
unsent lines, temporary file + rename, under the lock). 4xx other than 408/410/429 drop that batch (counted as
``rejected``); timeouts, connection errors, 3xx, 408, 429 and 5xx keep everything and back off
(:mod:`._state` writes the outcome, the back-off and the log). ``410 Gone`` stops the run at once
(:attr:`Round.gone`): the destination retired itself, and :mod:`._flush` retires it here for good.

**Counting.** A 2xx whose body is a JSON object with a ``refused`` mapping (the collector's answer,
``{"refused": {"over_cap": 500}}``) or, from an older collector, only a ``rejected`` count, says that some
events of the batch were refused for good: they leave the spool like the others but are counted as refused by
the destination, by reason (:func:`destination_refusals`), not as sent. Any other 2xx (GA4's ``204``, UA's
answer) means the whole batch was taken.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from . import _files, _hook, _sent, _settings, _spool
from ._counters import add_counter, add_destination_refusals, refused_text
from ._hook import App
from ._http import Answer, Sender
from ._redact import REDACTED
from ._state import log, now
from .transports import Event, transport_for

__all__ = ["Round", "SETTLE_SECONDS", "SPOOL_LOCK_TIMEOUT", "destination_refusals"]

SPOOL_LOCK_TIMEOUT: Final = 2.0
"""Seconds to wait for ``spool.lock``: every holder keeps it for microseconds to milliseconds."""

SETTLE_SECONDS: Final = 1.0
"""The bookkeeping after the deadline (deleting what was acknowledged, the counters, the state, the back-off)
waits at most this long for the spool lock in all; what it cannot delete in time stays queued and is sent
again, with the same ids."""

MAX_REASON_CHARS: Final = 24
"""A destination's refusal reason longer than this (the collector's longest is 14) is counted as ``other``."""

MAX_REASONS: Final = 32
"""Distinct reasons taken from one answer (the collector has 19); the rest are counted as ``other``."""


def _event_id(event: Event) -> str:
    return str(event["event_id"])


def _reason(value: str) -> str:
    """``value`` if it is a short ``[a-z_]`` word, else ``other`` (nothing else reaches a file or a screen)."""
    if 0 < len(value) <= MAX_REASON_CHARS and all(c == "_" or "a" <= c <= "z" for c in value):
        return value
    return "other"


def destination_refusals(body: bytes, size: int) -> dict[str, int]:
    """The events of a batch of ``size`` that a 2xx answer ``body`` says were refused, by reason; ``{}`` for a
    body that says nothing of the kind (all were taken).

    Nothing of the answer is trusted: a reason that is not a short ``[a-z_]`` word is ``other``, a count that is
    not an integer ``>= 0`` is ignored, and the total never exceeds ``size`` (the reasons in order take what is
    left). From a collector that answers a ``rejected`` count only, that count is the reason ``rejected``.
    """
    try:
        doc = json.loads(body) if body.lstrip()[:1] == b"{" else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    raw = doc.get("refused")
    if isinstance(raw, dict):
        items = list(raw.items())
    elif "refused" not in doc and "rejected" in doc:
        items = [("rejected", doc["rejected"])]
    else:
        return {}
    counts: dict[str, int] = {}
    for key, n in items:
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            continue
        reason = _reason(key)
        if reason not in counts and len(counts) >= MAX_REASONS:
            reason = "other"
        counts[reason] = counts.get(reason, 0) + n
    out: dict[str, int] = {}
    left = max(0, size)
    for reason in sorted(counts):
        take = min(counts[reason], left)
        if take:
            out[reason] = take
            left -= take
    return out


class Round:
    """One round of a run (:mod:`._flush`'s ``_drain`` makes one for each round), once the flusher lock is held:
    the folder, the destination, the deadline and what was sent."""

    def __init__(
        self,
        *,
        app: App,
        folder: _hook.Folder,
        env: Mapping[str, str],
        user: dict[str, str] | None,
        destination: _settings.Destination,
        named: str,
        tune: _settings.Tuning,
        deadline: float,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.app = app
        self.named = named
        """The endpoint exactly as named (``_hook.effective_endpoint``): what ``retired=`` records
        and the consent rule ``destination:retired`` compares."""
        self.env = env
        self.folder = folder
        self.user = user
        self.destination = destination
        self.tune = tune
        self.deadline = deadline
        self.progress = progress
        self.transport = transport_for(destination)
        self.sender = Sender(destination.request_url(), env, tune, deadline)
        self.sent = 0
        self.rejected = 0
        self.failed = 0
        self.refused: dict[str, int] = {}
        """Events the destination refused inside a 2xx this run, by reason."""
        self.sent_ids: set[str] = set()
        self.stopped: _hook.Decision | None = None
        """The decision that stopped this run: the user said no (or chose local mode) while it was sending."""
        self.gone: Answer | None = None
        """The ``410 Gone`` that stopped this run: the destination retired itself (no further request is made)."""

    @property
    def spool_lock(self) -> _files.FolderLock:
        """The spool lock, waited for at most :data:`SPOOL_LOCK_TIMEOUT` and never past the deadline plus
        :data:`SETTLE_SECONDS` (then :class:`~._files.LockTimeout`): the watchdog comes after that."""
        left = self.deadline + SETTLE_SECONDS - time.monotonic()
        return _files.FolderLock(self.folder, _hook.LOCK_NAME, max(0.0, min(SPOOL_LOCK_TIMEOUT, left)))

    def secretless(self, text: str) -> str:
        secret = self.destination.api_secret
        return text.replace(secret, REDACTED) if secret else text

    def claim(self) -> list[tuple[str, int, int]]:
        """Seal the active file and enforce the caps, under the spool lock; the sealed segments, oldest first."""
        with self.spool_lock:
            for note in _spool.tidy(self.folder, now()):  # what killed processes and planted folders left
                log(self.folder, note)
            _spool.seal_active(self.folder)
            for name, _, size in _spool.segments(self.folder):
                if size > _hook.HUGE_ACTIVE_BYTES:  # damaged: whole lines are kept, overlong ones counted
                    kept, bad = _spool.recut(self.folder, name)
                    log(self.folder, f"re-cut {name}: {kept} lines kept, {bad} bad")
            _spool.enforce_caps(
                self.folder,
                _hook.int_setting(self.user, "max_events", _hook.MAX_EVENTS),
                _hook.int_setting(self.user, "max_bytes", _hook.MAX_BYTES),
            )
            return _spool.segments(self.folder)

    def settle(
        self,
        name: str,
        events: Sequence[Event],
        done: set[str],
        bad: int,
        rejected: int,
        *,
        refused: Mapping[str, int] | None = None,
    ) -> None:
        """Under the lock: drop the done events (and bad lines) from segment ``name``, count what was lost and
        what the destination ``refused`` (by reason)."""
        keep = [e for e in events if _event_id(e) not in done]
        with self.spool_lock:
            add_destination_refusals(self.folder, refused or {})
            try:
                self.folder.lstat(name)
            except FileNotFoundError:
                # The caps (or a purge) removed it meanwhile and counted its lines already.
                add_counter(self.folder, "rejected", rejected)
                return
            if not keep:
                self.folder.unlink(name)
            elif len(keep) < len(events) or bad:
                data = b"".join(
                    json.dumps(e, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n" for e in keep
                )
                prefix = name[: -len(_hook.SEGMENT_SUFFIX)].rsplit("-", 2)[0]  # keeps its place in the order
                new = f"{prefix}-{os.getpid()}-{len(keep)}{_hook.SEGMENT_SUFFIX}"
                tmp = _files.write_new(self.folder, new, data)
                self.folder.rename(tmp, new)
                if new != name:
                    self.folder.unlink(name)
            add_counter(self.folder, "rejected", rejected)
            add_counter(self.folder, "corrupt", bad)

    def send_segment(self, name: str, total: int, done_before: int) -> tuple[Answer | None, int]:
        """Send one segment batch by batch, holding it as :class:`~._spool.Sending` (the caps leave it alone).
        Returns the failed answer (or ``None``) and the events handled."""
        with _spool.Sending(self.folder, name) as sending:
            if not sending.held:
                return None, 0  # the caps (which counted it) or a purge took it since the claim
            return self._send_segment(name, total, done_before)

    def _send_segment(self, name: str, total: int, done_before: int) -> tuple[Answer | None, int]:
        try:
            data = _files.read_bytes(self.folder, name, _hook.HUGE_ACTIVE_BYTES + 1)
        except FileNotFoundError:
            return None, 0
        except OSError:
            data = None
        if data is None or len(data) > _hook.HUGE_ACTIVE_BYTES:
            # Replaced since the claim by something that is not a segment of ours: it never leaves the machine.
            with self.spool_lock:
                _files.set_aside(self.folder, name)
            return None, 0
        events, bad = _spool.parse_lines(data)
        done = {_event_id(e) for e in events if _event_id(e) in self.sent_ids}  # duplicates of this run
        prepared = self.transport.prepare([e for e in events if _event_id(e) not in done], now=now())
        rejected = 0
        for event, reason in prepared.rejected:
            done.add(_event_id(event))
            rejected += 1
            self.rejected += 1
            log(self.folder, f"rejected {_event_id(event)}: {reason}")
        failure: Answer | None = None
        handled = len(done)
        refused: dict[str, int] = {}  # by the destination, in this segment
        for batch in prepared.batches:
            if not self.may_send(name):
                break
            answer = self.sender.send(batch.request)
            if answer.attempted:  # answered or not: it may have left
                _sent.append(self.folder, batch, answer, self.secretless)
            ids = {_event_id(e) for e in batch.events}
            if answer.kind == "ok":
                fresh = len(ids - self.sent_ids)
                turned = destination_refusals(answer.body, fresh)
                self.sent += fresh - sum(turned.values())
                self.sent_ids |= ids
                done |= ids
                for reason, n in turned.items():
                    refused[reason] = refused.get(reason, 0) + n
                    self.refused[reason] = self.refused.get(reason, 0) + n
                if turned:
                    log(
                        self.folder,
                        f"batch of {len(ids)}: the destination refused " + refused_text(turned),
                    )
            elif answer.kind == "gone":
                self.gone = answer  # the rest of the queue is deleted by _flush, not settled here
                break
            elif answer.kind == "drop":
                done |= ids
                rejected += len(ids)
                self.rejected += len(ids)
                log(
                    self.folder,
                    self.secretless(f"batch of {len(ids)} refused: {answer.describe()}"),
                )
            else:
                self.failed += len(ids)
                failure = answer
                break
            handled += len(ids)
            if self.progress is not None:
                self.progress(done_before + handled, total)
        self.settle(name, events, done, bad, rejected, refused=refused)
        return failure, handled

    def may_send(self, name: str) -> bool:
        """Whether the next request of segment ``name`` may leave. The user's choice is read again before each
        request (two small files): a ``disable``, ``enable --local`` or opt-out switch that lands while this run
        sends stops it (:attr:`stopped`), and only the request already on the wire can still arrive. A segment
        that ``purge`` deleted meanwhile sends nothing more either."""
        user, policy = _hook.read_inputs(self.app, self.env)
        decision = _hook.decide(self.app, self.env, user, policy)
        if not decision.enabled or decision.local:
            self.stopped = decision
            return False
        try:
            self.folder.lstat(name)
        except FileNotFoundError:
            return False
        return True

    def send_all(self, segments: list[tuple[str, int, int]]) -> Answer | None:
        total = sum(count for _, count, _ in segments)
        done = 0
        for name, _count, _size in segments:
            failure, handled = self.send_segment(name, total, done)
            done += handled
            if failure is not None:
                return failure
            if self.stopped is not None or self.gone is not None:
                break
        return None
