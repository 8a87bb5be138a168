"""Find messages wherever the store keeps them: queued ones in the queue (``outbox``), the others in the message log.

One answer shape for both (``StoredMessage``), newest first: what ``prefect-webhooks messages`` prints. Every
filter goes through an index of the queue or of each log partition; nothing scans history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import PENDING, Attempt
from prefect_webhooks.store.log.message_log import find_kept
from prefect_webhooks.store.log.rows import ATTEMPT_COLUMNS, with_earlier
from prefect_webhooks.store.schema.tables import DeliveryAttempt, OutboxMessage, to_store_time
from prefect_webhooks.utilities.urls import display_url

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__


@dataclass
class StoredMessage:
    """A message as the store holds it, queued or kept.

    Attributes:
        id: Its number (the webhook id is ``msg_<store key>_<id>``).
        destination: The destination block name.
        source: The source block name it came from, if any.
        message_type: track, identify, page, screen, group, alias or delete.
        message_id: The messageId it was sent with, if kept.
        user_id: The user it is about.
        state: pending, delivered, filtered or failed.
        reason: Why it failed, was filtered, or waits (a pending message's last error).
        attempts: Attempts made.
        created_at: When it was stored (naive UTC).
        first_attempt_at: When it was first attempted.
        at: When it got its outcome; for a pending message, when it is next due.
        body: The body sent (None once a deletion request purged it).
        tries: Every attempt, oldest first.
        endpoint: The key of the one endpoint it goes to (a fan-out destination's message: ``store.queue.fan_out``);
            None when it goes to every endpoint of its destination.
    """

    id: int
    destination: str
    source: str | None
    message_type: str
    message_id: str | None
    user_id: str | None
    state: str
    reason: str | None
    attempts: int
    created_at: datetime
    first_attempt_at: datetime | None
    at: datetime
    body: bytes | None
    tries: list[Attempt] = field(default_factory=list)
    endpoint: str | None = None

    @property
    def position(self) -> tuple[datetime, int]:
        """Where it stands in ``find_messages``' order (newest first): its time (stored, for a pending message; its
        outcome, for the others), then its id."""
        return (self.created_at if self.state == PENDING else self.at), self.id


@dataclass(frozen=True)
class MessageQuery:
    """Which messages ``find_messages`` answers with: every filter given must match.

    Attributes:
        ids: These messages' numbers.
        message_id: The messageId.
        user_id: The user (userId, or anonymousId without one).
        destination: The destination block name.
        states: pending, delivered, filtered, failed.
        since: At or after (stored, for a pending message; its outcome, for the others).
        until: Before.
        before: Only messages after this one in the answer's order (``StoredMessage.position`` of the last message
            of a page: the next page).
    """

    ids: Sequence[int] | None = None
    message_id: str | None = None
    user_id: str | None = None
    destination: str | None = None
    states: Sequence[str] | None = None
    since: datetime | None = None
    until: datetime | None = None
    before: tuple[datetime, int] | None = None


def find_messages(connection: Connection, query: MessageQuery | None = None, *, limit: int = 50) -> list[
        StoredMessage]:
    """Messages ``query`` matches (all without one), newest first (a pending one by when it was stored, others by
    when they got their outcome), at most ``limit``.

    Example:
        ```python
        from prefect_webhooks.store import get_engine
        from prefect_webhooks.store.log.lookups import MessageQuery, find_messages

        with get_engine().connect() as connection:
            for message in find_messages(connection, MessageQuery(states=["failed"]), limit=10):
                print(message.id, message.destination, message.reason)
        ```
    """
    query = query or MessageQuery()
    since = to_store_time(query.since) if query.since is not None else None
    until = to_store_time(query.until) if query.until is not None else None
    states = query.states
    found: list[StoredMessage] = []
    if not states or PENDING in states:
        found += _queued(connection, query, since, until, limit)
    finished = [state for state in states or () if state != PENDING]
    kept_until, kept_limit = until, limit
    if query.before is not None:
        # Kept times are whole milliseconds: read up to the cursor's millisecond and drop what came before it, with
        # room for the messages of that millisecond already shown.
        kept_until = min(filter(None, (until, query.before[0] + timedelta(milliseconds=1))))
        kept_limit = limit * 2 + 100
    if not states or finished:
        found += [
            StoredMessage(m.id, m.destination, m.content.source, m.content.message_type, m.content.message_id,
                          m.content.user_id, m.state, m.content.reason, m.content.attempts, m.content.created_at,
                          m.content.first_attempt_at, m.finished_at, m.content.body, m.content.tries,
                          m.content.endpoint)
            for m in find_kept(connection, ids=query.ids, message_id=query.message_id, user_id=query.user_id,
                               destination=query.destination, states=finished or None, since=since,
                               until=kept_until, limit=kept_limit)]
    if query.before is not None:
        found = [message for message in found if message.position < query.before]
    found.sort(key=lambda message: message.position, reverse=True)
    return found[:limit]


def _queued(
    connection: Connection, query: MessageQuery, since: datetime | None, until: datetime | None, limit: int
) -> list[StoredMessage]:
    """Pending messages ``query`` matches, newest first: the queue holds only what is pending, so its size bounds
    a filter without an index (messageId)."""
    statement = select(OUTBOX).where(OUTBOX.c.state == PENDING)
    if query.ids is not None:
        statement = statement.where(OUTBOX.c.id.in_(list(query.ids)))
    if query.message_id is not None:
        statement = statement.where(OUTBOX.c.message_id == query.message_id)
    if query.user_id is not None:
        statement = statement.where(OUTBOX.c.user_id == query.user_id)
    if query.destination is not None:
        statement = statement.where(OUTBOX.c.destination == query.destination)
    if since is not None:
        statement = statement.where(OUTBOX.c.created_at >= since)
    if until is not None:
        statement = statement.where(OUTBOX.c.created_at < until)
    if query.before is not None:
        at, number = to_store_time(query.before[0]), query.before[1]
        statement = statement.where(or_(OUTBOX.c.created_at < at,
                                        and_(OUTBOX.c.created_at == at, OUTBOX.c.id < number)))
    rows = connection.execute(statement.order_by(OUTBOX.c.created_at.desc(), OUTBOX.c.id.desc()).limit(limit)).all()
    tries: dict[int, list[Attempt]] = {}
    if rows:
        for attempt in connection.execute(select(*ATTEMPT_COLUMNS).where(
                ATTEMPTS.c.outbox_id.in_([row.id for row in rows])).order_by(ATTEMPTS.c.attempted_at)):
            tries.setdefault(attempt[0], []).append(Attempt(*attempt))
    found = []
    for row in rows:
        # A message sent again counts the attempts it had before, from its first (``replay``).
        attempts, first = with_earlier(row.attempts, row.first_attempt_at, row.earlier_attempts,
                                       row.earlier_first_attempt_at)
        found.append(StoredMessage(row.id, row.destination, row.source, row.message_type, row.message_id, row.user_id,
                                   row.state, row.reason, attempts, row.created_at, first, row.next_attempt_at,
                                   row.body, tries.get(row.id, []), row.endpoint))
    return found


def time_text(value: datetime | None) -> str:
    """A store time as the message views show it: naive UTC to the millisecond; empty for None."""
    return value.isoformat(sep=" ", timespec="milliseconds") if value else ""


def message_document(message: StoredMessage) -> dict[str, Any]:
    """``message`` as JSON-ready data: what ``messages list --json`` and ``show --json`` print and the admin API
    answers (times as naive-UTC text to the millisecond; the body as JSON; every attempt with the receiver's
    answer)."""
    return {
        "id": message.id, "state": message.state, "destination": message.destination, "source": message.source,
        "type": message.message_type, "messageId": message.message_id, "userId": message.user_id,
        "reason": message.reason, "attempts": message.attempts, "created_at": time_text(message.created_at),
        "first_attempt_at": time_text(message.first_attempt_at),
        ("next_attempt_at" if message.state == PENDING else "finished_at"): time_text(message.at),
        "body": None if message.body is None else orjson.loads(message.body),
        "endpoint": message.endpoint,
        # display_url again: attempts recorded before attempt records dropped a URL's query and credentials.
        "tries": [{"attempted_at": time_text(attempt.attempted_at), "url": display_url(attempt.url),
                   "status_code": attempt.status_code, "latency_ms": round(attempt.latency_ms, 1),
                   "error": attempt.error, "outcome": attempt.outcome, "response": attempt.response}
                  for attempt in message.tries],
    }
