"""What a test reads back from a store: every message, queued or kept, and every attempt, in one shape.

The queue (``outbox``) holds pending messages and the message log the others (``store.log.message_log``); a test that
asks "what happened to each message" reads both through these, never one table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import Attempt
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import StoredMessage, find_messages
from prefect_webhooks.store.log.message_log import find_kept
from prefect_webhooks.store.schema.tables import DeliveryAttempt, OutboxMessage

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__


@dataclass
class StoredRow(StoredMessage):
    """A message as a test sees it: the store's answer, and the queue's lease of a queued one."""

    lease_owner: str | None = None
    lease_expires_at: datetime | None = None

    @property
    def next_attempt_at(self) -> datetime:
        """A queued message's next due time; a kept one's finish time (the queue's column name)."""
        return self.at


def _engine(store: Engine | str | None) -> Engine:
    return store if isinstance(store, Engine) else get_engine(store)


def every_message(store: Engine | str | None = None, **filters: Any) -> list[StoredRow]:
    """Every message in id order; ``filters`` are attribute values to match (``destination="crm"``)."""
    engine = _engine(store)
    with engine.connect() as connection:
        messages = find_messages(connection, limit=10**9)
        leases = {row.id: (row.lease_owner, row.lease_expires_at) for row in connection.execute(
            select(OUTBOX.c.id, OUTBOX.c.lease_owner, OUTBOX.c.lease_expires_at))}
    rows = [StoredRow(**{field.name: getattr(message, field.name) for field in fields(message)},
                      lease_owner=leases.get(message.id, (None, None))[0],
                      lease_expires_at=leases.get(message.id, (None, None))[1])
            for message in sorted(messages, key=lambda message: message.id)]
    return [row for row in rows if all(getattr(row, name) == value for name, value in filters.items())]


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
    from prefect_webhooks.store.log.message_log import move_to_log
    from prefect_webhooks.store.log.rows import Leaving
    from prefect_webhooks.store.schema.tables import store_now

    at = at or store_now()
    with _engine(store).begin() as connection:
        moved = move_to_log(connection, [Leaving(i, state, reason, attempts, first_attempt_at, at) for i in ids])
    return sum(moved.values())


def to_ms(moment: datetime) -> datetime:
    """A time as the message log keeps it: to the millisecond, truncated."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
