"""What a test reads back from a store: every message, queued or kept, and every attempt, in one shape.

The queue (``outbox``) holds pending messages and the message log the others (``store.message_log``); a test that
asks "what happened to each message" reads both through these, never one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import Attempt
from prefect_webhooks.store.engines import get_engine
from prefect_webhooks.store.message_log import find_kept
from prefect_webhooks.store.tables import DeliveryAttempt, OutboxMessage

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__


@dataclass
class StoredMessage:
    """A message as a test sees it, wherever the store keeps it (the queue's column names)."""

    id: int
    destination: str
    source: str | None
    message_type: str
    message_id: str | None
    user_id: str | None
    body: bytes | None
    state: str
    reason: str | None
    attempts: int
    created_at: datetime
    first_attempt_at: datetime | None
    next_attempt_at: datetime
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None


def _engine(store: Engine | str | None) -> Engine:
    return store if isinstance(store, Engine) else get_engine(store)


def every_message(store: Engine | str | None = None, **filters: Any) -> list[StoredMessage]:
    """Every message in id order; ``filters`` are attribute values to match (``destination="crm"``)."""
    engine = _engine(store)
    with engine.connect() as connection:
        queued = [StoredMessage(**row._mapping) for row in connection.execute(select(OUTBOX))]
        kept = [StoredMessage(id=m.id, destination=m.destination, source=m.content.source,
                              message_type=m.content.message_type, message_id=m.content.message_id,
                              user_id=m.content.user_id, body=m.content.body, state=m.state, reason=m.content.reason,
                              attempts=m.content.attempts, created_at=m.content.created_at,
                              first_attempt_at=m.content.first_attempt_at, next_attempt_at=m.finished_at)
                for m in find_kept(connection)]
    messages = sorted(queued + kept, key=lambda message: message.id)
    return [m for m in messages if all(getattr(m, name) == value for name, value in filters.items())]


def every_attempt(store: Engine | str | None = None, **filters: Any) -> list[Attempt]:
    """Every attempt in the order they were made; ``filters`` as ``every_message``'s.

    A kept message's attempts are in its record, a queued one's in ``delivery_attempts``: both, in one shape.
    """
    engine = _engine(store)
    with engine.connect() as connection:
        attempts = [Attempt(*row) for row in connection.execute(select(
            ATTEMPTS.c.outbox_id, ATTEMPTS.c.attempted_at, ATTEMPTS.c.url, ATTEMPTS.c.status_code, ATTEMPTS.c.error,
            ATTEMPTS.c.latency_ms, ATTEMPTS.c.outcome))]
        attempts += [attempt for m in find_kept(connection) for attempt in m.content.tries]
    attempts.sort(key=lambda attempt: (to_ms(attempt.attempted_at), attempt.outbox_id))
    return [a for a in attempts if all(getattr(a, name) == value for name, value in filters.items())]


def finish(
    store: Engine | str | None,
    ids: list[int],
    state: str,
    *,
    reason: str | None = None,
    attempts: int | None = None,
    first_attempt_at: datetime | None = None,
    at: datetime | None = None,
) -> int:
    """Give queued messages an outcome as delivery would (moved to the log at ``at``, now by default); returns how
    many moved."""
    from prefect_webhooks.store.message_log import Leaving, move_to_log
    from prefect_webhooks.store.tables import store_now

    at = at or store_now()
    with _engine(store).begin() as connection:
        moved = move_to_log(connection, [Leaving(i, state, reason, attempts, first_attempt_at, at) for i in ids])
    return sum(moved.values())


def to_ms(moment: datetime) -> datetime:
    """A time as the message log keeps it: to the millisecond, truncated."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
