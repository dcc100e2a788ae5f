"""One flusher run: consent, then the flusher lock, claim, send, settle -- and the outcome on disk.

Run in the background by the detached process (:mod:`._detached`, started by :mod:`._spawn`) or in the
foreground by ``django-spool flush``: :func:`run` returns a :class:`FlushResult`. docs/flusher.md explains the
whole life of a flusher.

**One deadline.** A run ends within :data:`~._settings.DEADLINE` seconds, whatever the network does: each
request is sent by :class:`._http.Sender`, which abandons it at the deadline (DNS look-ups and trickling servers
included, which no socket timeout bounds); the bookkeeping after it waits at most :data:`~._round.SETTLE_SECONDS` for
the spool lock, and only :data:`WATCHDOG_GRACE` after the deadline may the detached process's watchdog end it.

**Rounds.** After a round without a failure the run releases the flusher lock, then looks for events recorded
meanwhile and, if it can take the lock again at once, sends them in another round (:func:`_drain`), at most
:data:`DRAIN_ROUNDS` rounds within the one deadline.

**Delivery and counting.** At least once: :mod:`._round` says how a round claims, sends and settles the spool,
and how a 2xx that refuses some events is counted.

**A destination that retires itself.** Any ``410 Gone`` ends the run at once (:func:`_retired`): the endpoint, as
named, joins ``retired=`` in the user's config file (with ``retired_on=`` and ``notice_version=0``, so that another
destination shows the notice again), every queued event is deleted, and the outcome is ``retired``. From then on
the consent rule ``destination:retired`` records nothing and starts no flusher while that endpoint stays the
destination (docs/flusher.md, "A destination that retires itself").
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from . import _consent, _files, _hook, _settings, _spawn, _spool, _state, _userconf
from ._counters import refused_text
from ._hook import FLUSHER_LOCK_FD_ENV, FLUSHER_LOCK_NAME, GATE_NAME, App, iso_time
from ._http import Answer
from ._round import SETTLE_SECONDS, SPOOL_LOCK_TIMEOUT, Round
from ._state import Outcome, log, now
from ._words import counted

__all__ = ["FlushResult", "run"]

WATCHDOG_GRACE: Final = 2.0
"""A detached flusher still alive this long after its deadline is ended by :func:`os._exit`: later than any
bookkeeping (:data:`~._round.SETTLE_SECONDS`), measured from the same deadline, so a run that ends on time is never
killed while it settles."""

NO_ENDPOINT_RETRY: Final = 3600.0
"""A background flusher that finds the named destination invalid (outcome ``invalid-endpoint``) keeps the next one
away this long."""

UNUSABLE_FOLDER: Final = "cannot use the spool folder"
"""How the message of a run that could not use the spool folder begins (its path and the error follow): the
wording of ``purge`` and the other commands for the same trouble."""

DRAIN_ROUNDS: Final = 5
"""At most this many claim/send rounds in one run (:func:`_drain`): events recorded while a flusher runs leave in
that run, and a steady stream of them cannot keep one flusher going beyond this."""

MAX_RETIRED: Final = 8
"""``retired=`` keeps the last this many destinations that answered ``410 Gone`` (oldest dropped first)."""

MAX_RETIRED_CHARS: Final = 4096
"""... and at most this many characters of them: a quarter of the config file's cap (``_hook.MAX_CONFIG_BYTES``),
so that a list of long URLs can never make the file too large to read."""

DRAIN_SHARE: Final = 0.25
"""Another round starts only while at least this share of the deadline is left (and at least
:data:`~._round.SETTLE_SECONDS`): 5 s of the 20 s, so that a round started late does not run into the deadline,
count as a failure and back off."""


@dataclass(frozen=True, kw_only=True)
class FlushResult:
    """What one :func:`run` did."""

    outcome: Outcome
    """``delivered`` (something was sent or rejected, nothing failed), ``nothing`` (empty spool),
    ``disabled`` (reporting is off; see :attr:`purged`), ``local`` (local mode: nothing is sent),
    ``invalid-endpoint`` (the destination that is named is not valid, nothing is sent; :attr:`message` says
    why, as ``status`` does), ``retired`` (the destination answered ``410 Gone``: it is recorded as retired, and
    every queued event was deleted, :attr:`purged`), ``failed`` (a request failed or the back-off is pending;
    events kept) or ``busy`` (another flusher is running, or the spool lock is held), ``unusable-folder`` (the
    spool folder cannot be used: read-only, missing, or a link planted for it; nothing is read or sent, and
    :attr:`message` starts with :data:`UNUSABLE_FOLDER`)."""
    sent: int = 0
    """Events the destination acknowledged with a 2xx and that left the spool."""
    rejected: int = 0
    """Events dropped as refused: a 4xx answer, or checked locally against the destination's limits."""
    failed: int = 0
    """Events of the batch whose request failed (kept for the next run)."""
    remaining: int = 0
    """Events still queued when the run ended."""
    purged: int = 0
    """Events deleted because reporting is off, or because the destination retired itself."""
    refused: Mapping[str, int] = field(default_factory=dict)
    """Events the destination answered 2xx to but refused for good, by its reason (``{"over_cap": 500}``):
    they left the spool and are not counted in :attr:`sent`."""
    message: str = ""
    """One line for humans (no secrets)."""


def purge(app: App, env: Mapping[str, str], *, busy_ok: bool = False) -> int:
    """What a run deletes when the user said no: the queue and the local folder, under the spool locks (waited
    for :data:`~._round.SPOOL_LOCK_TIMEOUT`); how many events. 0 when there is no folder of ours; a lock that stays busy
    raises :class:`~._files.LockTimeout`, or, with ``busy_ok`` (``forget``), is 0 too: the hook holds it for
    microseconds, a flusher for a rename, so only a stuck process keeps it."""
    from ._local import purge_app

    try:
        return purge_app(app, env, wait=SPOOL_LOCK_TIMEOUT)
    except (NotADirectoryError, _hook.SpoolError):
        return 0
    except _files.LockTimeout:
        if busy_ok:
            return 0
        raise


def run(
    app: App,
    *,
    foreground: bool,
    environ: Mapping[str, str] | None = None,
    ignore_backoff: bool = False,
    progress: Callable[[int, int], None] | None = None,
    deadline: float | None = None,
) -> FlushResult:
    """One flusher run: check consent, claim the spool, send it, record the outcome, and again for what was recorded
    meanwhile (:func:`_drain`; the counts are summed). Never raises for network
    or spool trouble (the result says what happened: an unusable spool folder is ``unusable-folder``); bounded by
    the deadline.

    :param app: whose spool to send.
    :param foreground: the command line's ``flush``: wait (bounded) for a running flusher to finish instead
        of giving up at once. A background run (the detached process) never waits.
    :param environ: the environment to read switches, destination and proxies from (default: ``os.environ``).
    :param ignore_backoff: send even if the back-off has not expired (``flush`` does).
    :param progress: called as ``progress(handled, total)`` after each batch, in the calling thread.
    :param deadline: the :func:`time.monotonic` time every round must end by: the detached process's, set when
        it armed its watchdog. By default the run's own, from the tuning, once the flusher lock is taken.
    """
    env = os.environ if environ is None else environ
    try:
        return _decide_and_drain(
            app, foreground=foreground, env=env, ignore_backoff=ignore_backoff, progress=progress, deadline=deadline
        )
    except OSError as exc:
        # A read-only or missing home, a symlink planted for the folder or a file of ours: nothing can be
        # claimed or recorded safely, so nothing is sent; the hook cannot append there either.
        reason = exc.strerror or str(exc) or type(exc).__name__
        path = _hook.state_dir(app, env)
        where = f"{UNUSABLE_FOLDER}: " if path in reason else f"{UNUSABLE_FOLDER} {path}: "  # the path, once
        return FlushResult(outcome="unusable-folder", message=where + reason)


def _decide_and_drain(
    app: App,
    *,
    foreground: bool,
    env: Mapping[str, str],
    ignore_backoff: bool,
    progress: Callable[[int, int], None] | None,
    deadline: float | None,
) -> FlushResult:
    tune = _settings.tuning(env)
    path = _hook.state_dir(app, env)
    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    named = _hook.effective_endpoint(app, env, user, policy)
    if not decision.enabled:
        purged = purge(app, env) if decision.hard_off else 0
        return FlushResult(
            outcome="disabled",
            purged=purged,
            message=f"reporting is off: {_consent.explain(decision.reason, user=user, endpoint=named)}"
            + (f"; deleted {counted(purged, 'queued event')}" if purged else ""),
        )
    if decision.local:
        # Local mode sends nothing, not even what was queued before it began; the hook starts no flusher then,
        # but one started just before the mode changed, or `flush` run by hand, ends here.
        return FlushResult(outcome="local", message="local mode: nothing is sent")
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False)
    # Consent needs a named destination (else the decision is destination:none), so one that does not resolve
    # is named but invalid: plain http to a remote host, a password in the URL, a missing api_secret...
    destination = resolved.destination
    invalid = f"the destination is invalid: {resolved.reason}"
    try:
        folder = _hook.Folder(path, create=False)
    except FileNotFoundError:
        if destination is None:
            return FlushResult(outcome="invalid-endpoint", message=invalid)
        return FlushResult(outcome="nothing", message="nothing is queued")
    with folder:
        if destination is None:
            remaining = _spool.count_queued(folder)
            if not foreground:
                # The hook started us because an endpoint is *named*: do not let every interval start another
                # flusher just to find that out again. Fixing the setting takes effect within the hour (or at
                # once with `django-spool flush`). The reason goes to the log once per such hour.
                retry = now() + min(NO_ENDPOINT_RETRY, tune.backoff_cap)
                with contextlib.suppress(OSError):
                    _spawn.touch(folder, GATE_NAME, retry)
                log(
                    folder,
                    f"invalid-endpoint: {resolved.reason}; kept {remaining}; next try after {iso_time(retry)}",
                )
            return FlushResult(outcome="invalid-endpoint", remaining=remaining, message=invalid)
        inherited = None if foreground else _inherited_lock(env, folder)
        if inherited is not None:  # started by the hook, which handed over flusher.lock already locked
            release: Callable[[], None] = functools.partial(os.close, inherited)
        else:
            wait = tune.deadline + WATCHDOG_GRACE + 1 if foreground else 0
            flusher_lock = _files.FolderLock(folder, FLUSHER_LOCK_NAME, wait)
            try:
                flusher_lock.acquire()
            except _files.LockTimeout:
                return FlushResult(outcome="busy", message="another flusher is running")
            release = flusher_lock.release
        # The detached process's deadline was set when it armed its watchdog; in the foreground the run starts
        # once the flusher lock is ours. Every round of the run shares it.
        until = time.monotonic() + tune.deadline if deadline is None else deadline
        job = functools.partial(
            Round,
            app=app,
            folder=folder,
            env=env,
            user=user,
            destination=destination,
            named=named,
            tune=tune,
            deadline=until,
            progress=progress,
        )
        results, queued = _drain(folder, job, release, ignore_backoff=ignore_backoff)
        return _summed(results, queued, destination.redacted_url())


def _drain(
    folder: _hook.Folder, job: Callable[[], Round], release: Callable[[], None], *, ignore_backoff: bool
) -> tuple[list[FlushResult], int | None]:
    """Claim/send rounds, the first with flusher.lock held (``release`` lets it go): each round's result, and the
    events found queued after the last one (``None`` if not looked at).

    A command that records an event while a flusher runs finds flusher.lock taken and starts none; its event was
    appended after the claim, so that round does not send it. So after a round that ended without a failure
    (``delivered``, or ``nothing``), the flusher first releases flusher.lock, *then* looks, under the spool lock,
    whether events are queued; if so, it takes flusher.lock again without waiting and runs another round. The
    order is what makes this complete: an event appended before the look is seen by it; an event appended after
    it finds flusher.lock already free, so its command can start a flusher (when its spawn gate is open: a
    long-lived command's is, unless the back-off holds). If another flusher took flusher.lock in between, that
    one sends them. It stops after :data:`DRAIN_ROUNDS` rounds, or when less than :data:`DRAIN_SHARE` of the
    deadline (at least :data:`~._round.SETTLE_SECONDS`) is left; then what came last waits for the next command.
    """
    results: list[FlushResult] = []
    while True:
        try:
            current = job()
            results.append(_send_round(current, ignore_backoff=ignore_backoff))
        finally:
            release()
        left = current.deadline - time.monotonic()
        if (
            results[-1].outcome not in ("delivered", "nothing")
            or len(results) >= DRAIN_ROUNDS
            or left < max(SETTLE_SECONDS, current.tune.deadline * DRAIN_SHARE)
        ):
            return results, None
        try:
            with current.spool_lock:  # after the release: see above
                queued = _spool.count_queued(folder)
        except (OSError, _files.LockTimeout):
            return results, None
        if not queued:
            return results, 0
        again = _files.FolderLock(folder, FLUSHER_LOCK_NAME, 0)
        try:
            again.acquire()
        except (OSError, _files.LockTimeout):  # another flusher runs: it sends them
            return results, queued
        release = again.release


def sent_text(sent: int, url: str | None, *, rejected: int = 0, refused: Mapping[str, int] | None = None) -> str:
    """The one sentence of a delivery: ``sent 3 events to URL, 1 rejected; the destination refused 2 events
    (over_cap 2)`` (``url`` already redacted; ``None``: no destination to name)."""
    text = f"sent {counted(sent, 'event')}" + (f" to {url}" if url is not None else "")
    text += f", {rejected} rejected" if rejected else ""
    if refused:
        text += f"; the destination refused {refused_text(refused, 'event')}"
    return text


def _summed(results: list[FlushResult], queued: int | None, url: str) -> FlushResult:
    """One result for the rounds of a run, their counts summed: ``failed`` if the last round failed, else
    ``delivered`` if any round sent or rejected something (a later round that found nothing, or the spool lock
    busy, leaves it so), else the last round's outcome. ``queued``: what the look after the last round found."""
    if len(results) == 1 and queued is None:
        return results[0]
    last = results[-1]
    sent = sum(r.sent for r in results)
    rejected = sum(r.rejected for r in results)
    failed = sum(r.failed for r in results)
    refused: dict[str, int] = {}
    for r in results:
        for reason, n in r.refused.items():
            refused[reason] = refused.get(reason, 0) + n
    refused = dict(sorted(refused.items()))
    remaining = last.remaining if queued is None else queued
    # A round that failed, that the user's "no" stopped, or whose destination retired itself, says how the run ended.
    if last.outcome in ("failed", "disabled", "local", "retired") or not (sent or rejected):
        outcome, message = last.outcome, last.message
        if sent > last.sent:
            message += f" (the run's earlier rounds sent {sent - last.sent})"
    else:
        outcome = "delivered"
        message = sent_text(sent, url, rejected=rejected, refused=refused)
        if len(results) > 1:
            message += f" in {len(results)} rounds"
    return FlushResult(
        outcome=outcome,
        sent=sent,
        rejected=rejected,
        failed=failed,
        remaining=remaining,
        purged=sum(r.purged for r in results),
        refused=refused,
        message=message,
    )


def _inherited_lock(env: Mapping[str, str], folder: _hook.Folder) -> int | None:
    """The locked ``flusher.lock`` descriptor the hook handed over, if it really is that (same file, still
    locked by this process); else ``None`` and the flusher takes the lock itself."""
    raw = env.get(FLUSHER_LOCK_FD_ENV, "")
    if not (raw.isascii() and raw.isdigit()):
        return None
    fd = int(raw)
    try:
        st = os.fstat(fd)
        ours = folder.lstat(FLUSHER_LOCK_NAME)
        if (st.st_dev, st.st_ino) != (ours.st_dev, ours.st_ino):
            return None
        # Re-locking through the same open file description succeeds only if we (the description) hold it.
        if not _hook.try_lock(fd):
            return None
    except OSError:
        return None
    return fd


def _stopped(job: Round, decision: _hook.Decision, refused: dict[str, int], turned: str) -> FlushResult:
    """The end of a run that the user's "no" stopped (:meth:`._round.Round.may_send`): what was deleted, and what was
    sent before it."""
    purged = purge(job.app, job.env) if decision.hard_off else 0
    outcome: Outcome = "disabled" if not decision.enabled else "local"
    why = _consent.explain(decision.reason, user=job.user, endpoint=job.named)
    message = (
        f"stopped ({why}): sent {counted(job.sent, 'event')} before, made no further request"
        + (f"; {turned}" if turned else "")
        + (f"; deleted {counted(purged, 'queued event')}" if purged else "")
    )
    _state.record_outcome(
        job.folder, outcome=outcome, error=None, retry_after=None, tune=job.tune, sent=job.sent, refused=refused
    )
    log(job.folder, f"{outcome}: {message}")
    return FlushResult(
        outcome=outcome,
        sent=job.sent,
        rejected=job.rejected,
        remaining=_spool.count_queued(job.folder),
        purged=purged,
        refused=refused,
        message=message,
    )


def _send_round(job: Round, *, ignore_backoff: bool) -> FlushResult:
    folder, tune = job.folder, job.tune
    if not ignore_backoff:
        gate = _hook.mtime(folder, GATE_NAME)
        if gate is not None and _hook.backing_off(gate, now()):
            return FlushResult(
                outcome="failed",
                remaining=_spool.count_queued(folder),
                message=f"backing off until {iso_time(gate)}",
            )
    try:
        segments = job.claim()
    except _files.LockTimeout:
        return FlushResult(outcome="busy", remaining=_spool.count_queued(folder), message="the spool lock is busy")
    if not segments:
        _state.record_outcome(folder, outcome="nothing", error=None, retry_after=None, tune=tune, sent=0)
        return FlushResult(outcome="nothing", message="nothing is queued")
    try:
        failure = job.send_all(segments)
    except _files.LockTimeout:
        failure = Answer(error="the spool lock is busy")
    finally:
        job.sender.close()
    refused = dict(sorted(job.refused.items()))
    turned = f"the destination refused {refused_text(refused, 'event')}" if refused else ""
    if job.gone is not None and failure is None:
        return _retired(job, job.gone, refused)
    if job.stopped is not None and failure is None:
        return _stopped(job, job.stopped, refused, turned)
    remaining = _spool.count_queued(folder)
    if failure is not None:
        error = job.secretless(failure.describe())
        retry = _state.record_outcome(
            folder,
            outcome="failed",
            error=error,
            retry_after=failure.retry_after,
            tune=tune,
            sent=job.sent,
            refused=refused,
        )
        when = f"; next try after {iso_time(retry)}" if retry is not None else ""
        message = f"sent {job.sent}" + (f" ({turned})" if turned else "") + f", kept {remaining}: {error}{when}"
        log(folder, f"failed: {message}")
        return FlushResult(
            outcome="failed",
            sent=job.sent,
            rejected=job.rejected,
            failed=job.failed,
            remaining=remaining,
            refused=refused,
            message=message,
        )
    _state.record_outcome(
        folder, outcome="delivered", error=None, retry_after=None, tune=tune, sent=job.sent, refused=refused
    )
    message = sent_text(job.sent, job.destination.redacted_url(), rejected=job.rejected, refused=refused)
    log(folder, f"delivered: {message}")
    return FlushResult(
        outcome="delivered",
        sent=job.sent,
        rejected=job.rejected,
        remaining=remaining,
        refused=refused,
        message=message,
    )


def retired_list(user: Mapping[str, str] | None, endpoint: str) -> str:
    """``retired=`` with ``endpoint`` added last (once): at most the last :data:`MAX_RETIRED` destinations and
    :data:`MAX_RETIRED_CHARS` characters, space-separated (an endpoint holds no space: ``_settings``)."""
    old = [url for url in ("" if user is None else user.get(_hook.RETIRED_KEY, "")).split() if url != endpoint]
    kept = [*old, endpoint][-MAX_RETIRED:]
    while len(kept) > 1 and len(" ".join(kept)) > MAX_RETIRED_CHARS:
        kept.pop(0)
    return " ".join(kept)


def _retired(job: Round, gone: Answer, refused: dict[str, int]) -> FlushResult:
    """The end of a run whose destination answered ``410 Gone``: record it as retired in the user's config file
    (``retired=``, ``retired_on=``, ``notice_version=0``), delete every queued event, log it and write the outcome.

    The queue goes even when the config file cannot be changed; then the message says so, and the next
    background flusher waits :data:`NO_ENDPOINT_RETRY` (it would be answered 410 again)."""
    folder, url = job.folder, job.destination.redacted_url()
    day = time.strftime("%Y-%m-%d", time.gmtime(now()))
    changes = {_hook.RETIRED_KEY: retired_list(job.user, job.named), "retired_on": day, "notice_version": "0"}
    unrecorded = ""
    try:
        path = _userconf.update(job.app, changes, job.env)
    except _userconf.ConfigError as exc:
        unrecorded = str(exc)
    try:
        purged = purge(job.app, job.env)
    except _files.LockTimeout:
        purged = -1  # a stuck process holds the spool lock: the hook deletes them once it sees the rule
    message = f"the destination {url} retired itself (HTTP {gone.status} Gone)"
    message += f"; sent {counted(job.sent, 'event')} before it" if job.sent else ""
    message += f"; the destination refused {refused_text(refused, 'event')}" if refused else ""
    message += "; the queue could not be deleted now (the spool lock is busy)" if purged < 0 else ""
    message += f"; deleted {counted(purged, 'queued event')}" if purged > 0 else ""
    if unrecorded:
        message += (
            f"; but it could not be recorded as retired ({unrecorded}): events are recorded again, and the next "
            "flusher will find it gone again"
        )
    else:
        message += (
            f"; nothing more is recorded or sent while it stays the destination (retired= in {path}); "
            "configuring another destination starts afresh"
        )
    _state.record_outcome(
        folder, outcome="retired", error=None, retry_after=None, tune=job.tune, sent=job.sent, refused=refused
    )
    if unrecorded:
        with contextlib.suppress(OSError):
            _spawn.touch(folder, GATE_NAME, now() + min(NO_ENDPOINT_RETRY, job.tune.backoff_cap))
    log(folder, job.secretless(f"retired: {message}"))
    return FlushResult(
        outcome="retired",
        sent=job.sent,
        rejected=job.rejected,
        remaining=_spool.count_queued(folder),
        purged=max(0, purged),
        refused=refused,
        message=message,
    )
