"""``flush --dry-run``: exactly what the next flusher run would send, batch by batch, without sending anything.

:func:`plan` reads the spool without writing, locking, creating or connecting anything (the spool folder may not
exist), applies the same consent rules, destination and transport limits as a run, and returns the requests a
run would make (secrets redacted), the events the destination's limits would reject, and the lines that are not
valid events.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import _consent, _hook, _settings, _spool, _state
from ._local import local_events
from .transports import Batch, transport_for

if TYPE_CHECKING:
    from ._hook import App

__all__ = ["Plan", "PlannedRequest", "plan"]


@dataclass(frozen=True, kw_only=True)
class PlannedRequest:
    """One request :func:`plan` says would be sent (the URL with secrets redacted)."""

    method: str
    url_redacted: str
    headers: Mapping[str, str]
    body: bytes
    event_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the next run would send; see :func:`plan`."""

    events: list[dict[str, object]]
    """The queued events, oldest first, each once."""
    requests: list[PlannedRequest]
    """The requests, batch by batch; empty when :attr:`reason` is set."""
    reason: str | None = None
    """Why nothing would be sent (reporting off, no endpoint), or ``None``."""
    destination: str | None = None
    """``<transport> to <redacted url>`` when a destination is configured."""
    rejected: list[tuple[dict[str, object], str]] = field(default_factory=list)
    """Events the destination's limits exclude, with the reason (they would be counted, not sent)."""
    invalid: int = 0
    """Spool lines that are not valid events (they would be counted as corrupt, never sent)."""
    local_events: list[dict[str, object]] = field(default_factory=list)
    """The events recorded in local mode (kept on this machine; only ``enable`` sends them), oldest first."""


def plan(app: App, *, environ: Mapping[str, str] | None = None) -> Plan:
    """What a run would send now, batch by batch, for ``flush --dry-run``.

    Reads the spool without writing, locking, creating or connecting anything (the spool folder may not
    exist). A line being appended while this reads may be skipped (and counted in :attr:`Plan.invalid`).
    """
    env = os.environ if environ is None else environ
    events, invalid = _spool.read_queued(_hook.state_dir(app, env))
    kept = local_events(app, env)
    user, policy = _hook.read_inputs(app, env)
    decision = _hook.decide(app, env, user, policy)
    if not decision.enabled:
        what = "queued events would be deleted" if decision.hard_off else "nothing would be sent"
        named = _hook.effective_endpoint(app, env, user, policy)
        why = _consent.explain(decision.reason, user=user, endpoint=named)
        return Plan(
            events=events,
            requests=[],
            reason=f"reporting is off ({why}); {what}",
            invalid=invalid,
            local_events=kept,
        )
    if decision.local:
        return Plan(events=events, requests=[], reason="local mode: nothing is sent", local_events=kept)
    resolved = _settings.resolve(app, env, user=user, policy=policy, read_files=False)
    if resolved.destination is None:
        return Plan(events=events, requests=[], reason=resolved.reason, invalid=invalid, local_events=kept)
    prepared = transport_for(resolved.destination).prepare(events, now=_state.now())
    return Plan(
        events=events,
        requests=[_planned(batch) for batch in prepared.batches],
        destination=resolved.reason,
        rejected=[(dict(e), reason) for e, reason in prepared.rejected],
        invalid=invalid,
        local_events=kept,
    )


def _planned(batch: Batch) -> PlannedRequest:
    r = batch.request
    return PlannedRequest(
        method=r.method,
        url_redacted=r.url_redacted,
        headers=dict(r.headers),
        body=r.body,
        event_ids=tuple(str(e["event_id"]) for e in batch.events),
    )
