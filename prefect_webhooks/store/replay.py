"""Replay: failed (or filtered) messages back to pending, due now, with a fresh deadline, in bounded chunks.

A selection names one or more destinations and narrows them by a time window, creation times and a reason prefix.
The window is Svix's ``recover {since, until}``: the failed messages that were being attempted during it, from
their first attempt (or, never attempted, their failure) to the time their last attempt was due
(``next_attempt_at`` of a failed row). A replay of a million messages runs as chunks of ``chunk`` rows, each its
own short transaction, so it neither holds locks for long nor stalls claims; ``on_chunk`` reports progress.

Attempt counter and first attempt time are reset, so each message gets a full ``max_retry_age`` from its next
attempt; the ``delivery_attempts`` log keeps the history. A row whose body a deletion request purged stays failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import FAILED, FILTERED, PENDING
from prefect_webhooks.store.engines import get_engine
from prefect_webhooks.store.tables import OutboxMessage, store_now, to_store_time

OUTBOX = OutboxMessage.__table__
DEFAULT_CHUNK = 10_000


@dataclass(frozen=True)
class ReplaySelection:
    """Which failed (or filtered) messages a replay puts back.

    Attributes:
        destinations: The destination block names.
        since: Only messages that were being attempted at or after this time.
        until: Only messages that were being attempted before this time.
        created_after: Only messages created at or after this time.
        created_before: Only messages created before this time.
        reason_prefix: Only messages whose reason starts with this (``expired``, ``permanent: HTTP 410``,
            ``disabled``…).
        filtered: Messages a destination filter dropped instead of failed ones.
    """

    destinations: tuple[str, ...]
    since: datetime | None = None
    until: datetime | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    reason_prefix: str | None = None
    filtered: bool = False

    def conditions(self) -> list[Any]:
        """The selection as SQL conditions on the outbox."""
        conditions = [OUTBOX.c.destination.in_(list(self.destinations)),
                      OUTBOX.c.state == (FILTERED if self.filtered else FAILED), OUTBOX.c.body.is_not(None)]
        if self.since is not None:
            conditions.append(OUTBOX.c.next_attempt_at >= to_store_time(self.since))
        if self.until is not None:
            started = func.coalesce(OUTBOX.c.first_attempt_at, OUTBOX.c.next_attempt_at)
            conditions.append(started < to_store_time(self.until))
        if self.created_after is not None:
            conditions.append(OUTBOX.c.created_at >= to_store_time(self.created_after))
        if self.created_before is not None:
            conditions.append(OUTBOX.c.created_at < to_store_time(self.created_before))
        if self.reason_prefix:
            conditions.append(OUTBOX.c.reason.startswith(self.reason_prefix, autoescape=True))
        return conditions


def count_selected(engine: Engine, selection: ReplaySelection) -> int:
    """How many messages ``selection`` matches now."""
    with engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(OUTBOX).where(*selection.conditions())).scalar_one()


def replay_chunk(engine: Engine, selection: ReplaySelection, after_id: int, chunk: int) -> tuple[int, int | None]:
    """Put back the next ``chunk`` matching messages with ids above ``after_id``, in one transaction.

    Returns:
        How many were put back, and the highest id looked at (None when nothing is left).
    """
    ids = (select(OUTBOX.c.id).where(*selection.conditions(), OUTBOX.c.id > after_id).order_by(OUTBOX.c.id)
           .limit(chunk))
    with engine.begin() as connection:
        found = list(connection.execute(ids).scalars())
        if not found:
            return 0, None
        statement = (
            update(OUTBOX)
            .where(and_(OUTBOX.c.id.in_(found), *selection.conditions()))
            .values(state=PENDING, reason=None, attempts=0, first_attempt_at=None, next_attempt_at=store_now(),
                    lease_owner=None, lease_expires_at=None)
        )
        return connection.execute(statement).rowcount, max(found)


def replay_selection(
    selection: ReplaySelection,
    *,
    chunk: int = DEFAULT_CHUNK,
    engine: Engine | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> int:
    """Put back every message ``selection`` matches, ``chunk`` at a time; ``on_chunk`` gets the running total.

    Returns:
        How many messages were put back.
    """
    engine = engine or get_engine()
    total, after_id = 0, 0
    while True:
        count, highest = replay_chunk(engine, selection, after_id, chunk)
        if highest is None:
            return total
        total, after_id = total + count, highest
        if on_chunk is not None:
            on_chunk(total)


def replay_failed(
    destination: str | Sequence[str],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    reason_prefix: str | None = None,
    filtered: bool = False,
    engine: Engine | None = None,
) -> int:
    """Put ``failed`` (or ``filtered``) messages of destinations back to pending, due now, with a fresh deadline.

    Args:
        destination: A destination block name, or several.
        since: Only rows that were being attempted at or after this time (see the module).
        until: Only rows that were being attempted before this time.
        created_after: Only rows created at or after this time.
        created_before: Only rows created before this time.
        reason_prefix: Only rows whose reason starts with this (e.g. ``"expired"`` or ``"permanent: HTTP 410"``).
        filtered: Put back rows a destination filter dropped instead of failed ones (after a rule was changed:
            the destination's current rules apply to them again).
        engine: The store; the configured one by default.

    Returns:
        How many rows were put back.
    """
    names = (destination,) if isinstance(destination, str) else tuple(destination)
    selection = ReplaySelection(names, since, until, created_after, created_before, reason_prefix, filtered)
    return replay_selection(selection, engine=engine)
