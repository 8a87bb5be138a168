"""Deletion requests: notify every affected source's Webhooks destinations, purge the user's data, suppress.

What one request does, in one transaction (after the Source blocks have been read):

1. Affected sources: the ones the request names, or else every source that sent events about the user (its outbox
   queued and kept messages, and what retention recorded of the messages it removed).
2. Purge, so delivery records keep no personal data:
   - the user's messages in the message log: body, user id and messageId removed from their records;
   - queued messages of the user (not yet sent): dropped, i.e. moved to the log as ``failed`` with reason
     ``purged`` and without those fields (counted in the failed totals), because sending a deleted user's data
     after the deletion request would defeat it;
   - pending ``delete`` notifications (of an earlier request) are left alone: they are the one thing still owed;
   - the user's ``audience_state`` rows are deleted (a later audience sync treats the user as new, unless the
     request also suppressed the user, in which case audience syncs leave the user out), and so are its
     ``user_sources`` rows.
3. One ``delete`` message (type, userId, timestamp; no version) per affected source and per WebhookDestination
   enabled on it, with ``source`` set; these rows keep ``user_id`` because their delivery needs it.
4. With ``suppress=True``: a ``suppressed_users`` row per named source, or ``*`` (every source) when none was
   named; ingestion drops the user's further events and audience syncs leave the user out.
5. The request is marked ``completed`` with its outcome (counts, sources, destinations).

A named source whose block does not exist, or a source with no destinations, is recorded in the outcome and gets
no delete message. Known limit: an ``alias`` row whose *previous* id is the user is found only by its new id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import delete, select, union, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.deletions.requests import (
    COMPLETED,
    EVERY_SOURCE,
    PURGED,
    REQUESTED,
    REQUESTS,
    DeletionError,
    PendingRequest,
)
from prefect_webhooks.messages.outcomes import FAILED, PENDING
from prefect_webhooks.messages.payloads import delete_payload
from prefect_webhooks.messages.timestamps import utcnow
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.log.kept_purges import forget_pruned_sources, pruned_sources, purge_kept
from prefect_webhooks.store.log.message_log import find_kept, move_to_log
from prefect_webhooks.store.log.rows import Leaving
from prefect_webhooks.store.queue.outbox import add_to_outbox, outbox_rows
from prefect_webhooks.store.schema.tables import (
    AudienceState,
    OutboxMessage,
    SuppressedUser,
    UserSource,
    store_now,
    to_store_time,
)

OUTBOX = OutboxMessage.__table__
SUPPRESSED = SuppressedUser.__table__
STATE = AudienceState.__table__
USER_SOURCES = UserSource.__table__


class DeletionOutcome(BaseModel):
    """What processing one deletion request did (kept in ``deletion_requests.outcome``; no user id inside)."""

    request_id: int
    notified: dict[str, list[str]] = {}
    skipped_sources: dict[str, str] = {}
    delete_messages: int = 0
    purged_rows: int = 0
    dropped_pending: int = 0
    audience_state_rows: int = 0
    suppressed: list[str] = []



def sources_with_events(user_id: str, engine: Engine | None = None) -> list[str]:
    """Every source that sent events about the user (what an unscoped request notifies), sorted: the sources of its
    queued and kept messages, and those retention recorded when it removed older ones."""
    engine = engine or get_engine()
    queued = select(OUTBOX.c.source).where(OUTBOX.c.user_id == user_id, OUTBOX.c.source.is_not(None))
    pruned = select(USER_SOURCES.c.source).where(USER_SOURCES.c.user_id == user_id)
    with engine.connect() as connection:
        found = {row[0] for row in connection.execute(union(queued, pruned))}
        found.update(message.content.source for message in find_kept(connection, user_id=user_id)
                     if message.content.source is not None)
        found.update(pruned_sources(connection, user_id))
    return sorted(found)


def affected_sources(request: PendingRequest, engine: Engine | None = None) -> list[str]:
    """The sources a request notifies: the named ones, or every source that has received the user's events."""
    if request.sources is not None:
        return list(dict.fromkeys(request.sources))
    return sources_with_events(request.user_id, engine)


def purge_user(connection: Connection, user_id: str, reason: str) -> tuple[int, int, int]:
    """Remove the user's personal data from delivery records, in the caller's transaction.

    Returns:
        (kept messages purged, queued messages dropped, audience state rows deleted).
    """
    now = store_now()
    queued = connection.execute(
        select(OUTBOX.c.id, OUTBOX.c.destination)
        .where(OUTBOX.c.user_id == user_id, OUTBOX.c.state == PENDING, OUTBOX.c.message_type != "delete")
    ).all()
    dropped_destinations = move_to_log(connection, [
        Leaving(row.id, FAILED, reason, None, None, now, purge=True) for row in queued])
    # Dropped messages failed: they count as such, in this transaction.
    add_outcomes(connection, dropped_destinations)
    dropped = sum(dropped_destinations.values())
    purged = purge_kept(connection, user_id)
    state_rows = connection.execute(delete(STATE).where(STATE.c.user_id == user_id)).rowcount
    connection.execute(delete(USER_SOURCES).where(USER_SOURCES.c.user_id == user_id))
    forget_pruned_sources(connection, user_id)
    return purged, dropped, state_rows


def suppress_user(connection: Connection, user_id: str, sources: Sequence[str]) -> list[str]:
    """Add ``suppressed_users`` rows (idempotent); ``*`` when no source is named. Returns the sources."""
    scopes = list(sources) or [EVERY_SOURCE]
    statement = (sqlite_insert if connection.dialect.name == "sqlite" else postgresql_insert)(SUPPRESSED)
    connection.execute(
        statement.on_conflict_do_nothing(),
        [{"user_id": user_id, "source": scope, "created_at": store_now()} for scope in scopes],
    )
    return scopes


def process_deletion(
    request: PendingRequest,
    destinations_of: Mapping[str, Sequence[str] | None],
    *,
    engine: Engine | None = None,
    timestamp: datetime | None = None,
) -> DeletionOutcome:
    """Carry out one request in one transaction: purge, queue the delete notifications, suppress, record.

    Args:
        request: The request (see ``pending_requests``).
        destinations_of: For each affected source, its enabled WebhookDestination names, or None when the
            Source block does not exist (the flow reads the blocks).
        engine: The store; the configured one by default.
        timestamp: The delete messages' time; now by default.

    Returns:
        The outcome, also stored on the request.
    """
    engine = engine or get_engine()
    timestamp = to_store_time(timestamp or utcnow())
    outcome = DeletionOutcome(request_id=request.id)
    rows = []
    for source in affected_sources(request, engine):
        destinations = destinations_of.get(source)
        if destinations is None:
            outcome.skipped_sources[source] = "no such source"
        elif not destinations:
            outcome.skipped_sources[source] = "no Webhooks destination enabled"
        else:
            outcome.notified[source] = list(destinations)
            payload = delete_payload(request.user_id, timestamp)
            for destination in destinations:
                rows.extend(outbox_rows(destination, [payload], source=source, now=timestamp))
    with engine.begin() as connection:
        # Purge first: the delete rows inserted next are the only rows of the user that may keep its id.
        outcome.purged_rows, outcome.dropped_pending, outcome.audience_state_rows = purge_user(
            connection, request.user_id, f"{PURGED}: deletion request {request.id}"
        )
        outcome.delete_messages = add_to_outbox(connection, rows)
        if request.suppress:
            outcome.suppressed = suppress_user(connection, request.user_id, request.sources or [])
        marked = connection.execute(
            update(REQUESTS)
            .where(REQUESTS.c.id == request.id, REQUESTS.c.state == REQUESTED)
            .values(state=COMPLETED, outcome=outcome.model_dump(mode="json"), completed_at=store_now())
        ).rowcount
        if marked != 1:
            # Another run completed it meanwhile: roll everything back rather than notify twice.
            raise DeletionError(f"deletion request {request.id} is not pending any more")
    return outcome
