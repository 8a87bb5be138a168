"""Replay: failed (or filtered) messages from the message log back into the queue, due now, with a fresh deadline,
in bounded chunks.

A selection names one or more destinations and narrows them by a time window, creation times and a reason prefix.
The window is Svix's ``recover {since, until}``: the failed messages that were being attempted during it, from
their first attempt (or, never attempted, their failure) to the time they failed. A replay of a million messages
runs as chunks of ``chunk`` messages, each its own short transaction, so it neither holds locks for long nor stalls
claims; ``on_chunk`` reports progress. Each partition of the log is read through its (destination, time) index.

A message keeps its number, so a receiver sees the same webhook id; its retries start afresh (backoff from the first
delay, a full ``max_retry_age`` from its next attempt), while its history stays whole: its earlier attempts go back
beside it, and its record counts them with the new ones and keeps its first attempt's time (the queue row's
``earlier_attempts`` and ``earlier_first_attempt_at``). A message whose body a deletion request purged stays failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.store.engine.engines import get_engine, insert_rows
from prefect_webhooks.store.log.message_log import KeptMessage, attempt_rows, decode_rows, find_kept
from prefect_webhooks.store.log.partitions import STATE_CODES, Partition, kept_partitions, partition_table
from prefect_webhooks.store.log.records import epoch_ms
from prefect_webhooks.store.schema.tables import DeliveryAttempt, LogName, OutboxMessage, store_now, to_store_time

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__
NAMES = LogName.__table__
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

    @property
    def state(self) -> str:
        return FILTERED if self.filtered else FAILED

    def matches(self, message: KeptMessage) -> bool:
        """Whether a kept message of the selection's destinations and state is selected (the record's filters)."""
        content = message.content
        if content.body is None:
            return False
        if self.until is not None:
            started = content.first_attempt_at or message.finished_at
            if started >= to_store_time(self.until):
                return False
        if self.created_after is not None and content.created_at < to_store_time(self.created_after):
            return False
        if self.created_before is not None and content.created_at >= to_store_time(self.created_before):
            return False
        return not (self.reason_prefix and not (content.reason or "").startswith(self.reason_prefix))


def _chunks(connection: Connection, selection: ReplaySelection, chunk: int) -> Iterator[tuple[Partition,
                                                                                             list[KeptMessage]]]:
    """The selected messages, partition by partition (oldest first), at most ``chunk`` rows read at a time."""
    destination_ids = list(connection.execute(select(NAMES.c.id).where(
        NAMES.c.name.in_(list(selection.destinations)))).scalars())
    if not destination_ids:
        return
    since = to_store_time(selection.since) if selection.since is not None else None
    kind = "failed" if selection.state == FAILED else "delivered"
    for partition in reversed(kept_partitions(connection, kind, since=since)):
        table = partition.table
        after = (-1, -1)
        while True:
            query = (select(table).where(table.c.destination_id.in_(destination_ids),
                                         table.c.state == STATE_CODES[selection.state],
                                         (table.c.finished_ms > after[0])
                                         | ((table.c.finished_ms == after[0]) & (table.c.id > after[1])))
                     .order_by(table.c.finished_ms, table.c.id).limit(chunk))
            if since is not None:
                query = query.where(table.c.finished_ms >= epoch_ms(since))
            rows = connection.execute(query).all()
            if not rows:
                break
            yield partition, [message for message in decode_rows(connection, rows, partition)
                              if selection.matches(message)]
            after = (rows[-1].finished_ms, rows[-1].id)


def count_selected(engine: Engine, selection: ReplaySelection) -> int:
    """How many messages ``selection`` matches now."""
    with engine.connect() as connection:
        return sum(len(messages) for _, messages in _chunks(connection, selection, DEFAULT_CHUNK))


def put_back(connection: Connection, partition: Partition | str, messages: Sequence[KeptMessage]) -> int:
    """Move ``messages`` of ``partition`` (or the partition of that name) back into the queue, pending and due now,
    in the caller's transaction.

    Returns:
        How many were put back (a message another replay or retention took meanwhile is left alone).
    """
    table = partition_table(partition) if isinstance(partition, str) else partition.table
    taken = set(connection.execute(delete(table).where(table.c.id.in_([m.id for m in messages]))
                                   .returning(table.c.id)).scalars())
    now = store_now()
    back = [message for message in messages if message.id in taken]
    insert_rows(connection, OUTBOX, [
        {"id": m.id, "destination": m.destination, "source": m.content.source, "message_type": m.content.message_type,
         "message_id": m.content.message_id, "user_id": m.content.user_id, "body": m.content.body, "state": PENDING,
         "attempts": 0, "created_at": m.content.created_at, "next_attempt_at": now, "endpoint": m.content.endpoint,
         "earlier_attempts": m.content.attempts or None,
         "earlier_first_attempt_at": m.content.first_attempt_at if m.content.attempts else None}
        for m in back])
    insert_rows(connection, ATTEMPTS, attempt_rows(attempt for message in back for attempt in message.content.tries))
    return len(back)


def replay_chunks(engine: Engine, selection: ReplaySelection, chunk: int = DEFAULT_CHUNK) -> Iterator[int]:
    """Put back every message ``selection`` matches, ``chunk`` at a time, each chunk its own transaction; yields the
    running total after each."""
    total = 0
    with engine.connect() as reader:
        for partition, messages in _chunks(reader, selection, chunk):
            if not messages:
                continue
            with engine.begin() as connection:
                total += put_back(connection, partition, messages)
            yield total


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
    total = 0
    for total in replay_chunks(engine or get_engine(), selection, chunk):
        if on_chunk is not None:
            on_chunk(total)
    return total


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


RESENT = "queued again"


def resend_messages(ids: Sequence[int], *, engine: Engine | None = None) -> dict[int, str]:
    """Send kept messages again: each delivered or failed one goes back into the queue with its number (the receiver
    sees the same webhook id), due now, and is signed with the destination's current secret when it is sent; its
    earlier attempts stay with it, the new one is added to its count and its first attempt's time is kept.

    Args:
        ids: The messages' numbers (as ``messages list`` shows them).
        engine: The store; the configured one by default.

    Returns:
        Per id, ``RESENT`` or why it was not: still queued, filtered, purged by a deletion request, or neither queued
        nor kept.
    """
    engine = engine or get_engine()
    wanted = list(dict.fromkeys(ids))
    outcome: dict[int, str] = {}
    with engine.begin() as connection:
        queued = set(connection.execute(select(OUTBOX.c.id).where(OUTBOX.c.id.in_(wanted))).scalars())
        outcome.update((number, "still queued: it is sent when it is due") for number in queued)
        by_partition: dict[str, list[KeptMessage]] = {}
        for message in find_kept(connection, ids=[number for number in wanted if number not in queued]):
            if message.content.body is None:
                outcome[message.id] = "purged by a deletion request: nothing to send"
            elif message.state not in (DELIVERED, FAILED):
                outcome[message.id] = (f"{message.state}: the destination's rules dropped it (replay --filtered "
                                       "puts filtered messages back)")
            else:
                by_partition.setdefault(message.partition, []).append(message)
        for partition, messages in by_partition.items():
            put_back(connection, partition, messages)
            outcome.update((message.id, RESENT) for message in messages)
    return {number: outcome.get(number, "neither queued nor kept (removed by retention, or never stored)")
            for number in wanted}
