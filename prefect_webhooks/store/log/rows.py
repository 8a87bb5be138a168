"""A message's row in the message log, and its record packed before the write transaction that moves it.

Packing records (a header of numbers, the attempts, the compressed body) is most of the Python work of recording a
batch's outcomes. Done inside the transaction that takes the rows from the queue, it held the store's write lock
meanwhile; on SQLite that is the one lock every writer waits for, the ingest API's group commit among them (profiled
at 2,500 events/s: a third of the recording transaction's time). So ``pack_ahead`` reads the leaving rows and their
earlier attempts first, with no write lock, and packs their log rows. The transaction then takes the rows from the
queue as before and uses a row packed ahead only when the queue row and the earlier attempts it took are exactly those
read (``PackedAhead.still``); any other (another worker's attempts since, a name not yet numbered) is packed there,
as every row was before.

The delivery worker does not call it: the lock it saves did not turn into capacity (bench/README.md, "Records packed
before the write lock"). Its lease keeper now runs until the outcomes are recorded, which packing ahead needs, since
it keeps delivered rows claimable until the ``DELETE`` commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import Attempt
from prefect_webhooks.store.log.names import known_name_ids
from prefect_webhooks.store.log.partitions import STATE_CODES
from prefect_webhooks.store.log.records import EpochMillis, pack_fields, text_key
from prefect_webhooks.store.schema.tables import DeliveryAttempt, OutboxMessage, read_store_time

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__

# What a leaving queue row gives its log row, in the order ``log_row`` takes them.
QUEUED_COLUMNS = (OUTBOX.c.id, OUTBOX.c.destination, OUTBOX.c.source, OUTBOX.c.message_type, OUTBOX.c.message_id,
                  OUTBOX.c.user_id, OUTBOX.c.body, OUTBOX.c.created_at, OUTBOX.c.attempts, OUTBOX.c.first_attempt_at,
                  OUTBOX.c.endpoint, OUTBOX.c.earlier_attempts, OUTBOX.c.earlier_first_attempt_at)
# An attempt's columns in ``Attempt``'s order.
ATTEMPT_COLUMNS = (ATTEMPTS.c.outbox_id, ATTEMPTS.c.attempted_at, ATTEMPTS.c.url, ATTEMPTS.c.status_code,
                   ATTEMPTS.c.error, ATTEMPTS.c.latency_ms, ATTEMPTS.c.outcome, ATTEMPTS.c.response)


@dataclass(slots=True)
class Leaving:
    """A queued message reaching its outcome: what the log keeps besides what the queue row holds.

    Attributes:
        id: The queue row.
        state: delivered, filtered or failed.
        reason: Why it failed or was filtered.
        attempts: Attempts made; None keeps the queue row's count and first attempt time (a filtered message).
        first_attempt_at: When it was first attempted.
        finished_at: When it got there (naive UTC).
        purge: Keep no personal data (body, user id, messageId): a deletion request dropped it.
    """

    id: int
    state: str
    reason: str | None
    attempts: int | None
    first_attempt_at: datetime | None
    finished_at: datetime
    purge: bool = False


def attempt_of(row: Sequence[Any]) -> Attempt:
    """An attempt read with ``ATTEMPT_COLUMNS``."""
    outbox_id, attempted_at, *rest = row
    return Attempt(outbox_id, read_store_time(attempted_at), *rest)


def by_message(attempts: Iterable[Attempt]) -> dict[int, list[Attempt]]:
    """``attempts`` by the queue row they were made for."""
    grouped: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        grouped.setdefault(attempt.outbox_id, []).append(attempt)
    return grouped


def in_order(attempts: Iterable[Attempt]) -> list[Attempt]:
    """A message's attempts as its record keeps them: oldest first."""
    attempts = list(attempts)
    if len(attempts) < 2:  # most messages: one attempt, or none before this batch's
        return attempts
    return sorted(attempts, key=lambda attempt: (attempt.attempted_at, attempt.url, attempt.outcome))


def row_names(queued: Sequence[Any], tries: Iterable[Attempt]) -> set[str]:
    """The names a log row of ``queued`` with ``tries`` numbers: its destination, its source and its URLs."""
    return {name for name in (queued[1], queued[2]) if name is not None} | {attempt.url for attempt in tries}


def with_earlier(attempts: int, first: datetime | None, earlier: int | None, earlier_first: Any) -> tuple[
        int, datetime | None]:
    """A message's attempts and first attempt time, with those it had before it was sent again (the queue row's
    ``earlier_attempts`` and ``earlier_first_attempt_at``)."""
    if not earlier:
        return attempts, first
    return attempts + earlier, read_store_time(earlier_first) or first


def log_row(
    queued: Sequence[Any], outcome: Leaving, tries: list[Attempt], names: Mapping[str, int],
    millis: EpochMillis | None = None,
) -> dict[str, Any]:
    """The log row of a queue row read with ``QUEUED_COLUMNS`` that reached ``outcome`` after ``tries`` (oldest
    first), its names numbered in ``names``; the partition it goes to is the caller's. ``millis``: the times of the
    batch's rows as milliseconds, shared by its calls."""
    (outbox_id, destination, source, message_type, message_id, user_id, body, created_at, attempts, first,
     endpoint, earlier, earlier_first) = queued
    millis = millis if millis is not None else EpochMillis()
    if outcome.purge:
        message_id = user_id = body = None
    if outcome.attempts is None:
        first = read_store_time(first)
    else:
        attempts, first = outcome.attempts, outcome.first_attempt_at
    if earlier:  # sent again (resend, replay): its record counts the attempts it had before, from its first
        attempts, first = with_earlier(attempts, first, earlier, earlier_first)
    record = pack_fields(message_type, message_id, user_id, outcome.reason, attempts, created_at, first, tries,
                         None if body is None else bytes(body), endpoint, outcome.finished_at, names, millis)
    return {
        "id": outbox_id, "destination_id": names[destination], "state": STATE_CODES[outcome.state],
        "finished_ms": millis[outcome.finished_at], "message_key": text_key(message_id), "user_key": text_key(user_id),
        "source_id": names[source] if source is not None else None, "record": record,
    }


@dataclass(slots=True)
class PackedAhead:
    """A log row packed from a queue row and its earlier attempts as read before the write transaction."""

    queued: tuple[Any, ...]
    earlier: list[Attempt]
    row: dict[str, Any]

    def still(self, queued: Sequence[Any], earlier: list[Attempt]) -> bool:
        """Whether the queue row and earlier attempts the transaction took are those this row was packed from."""
        return tuple(queued) == self.queued and earlier == self.earlier


def queued_rows(
    connection: Connection,
    ids: Sequence[int],
    *,
    take: bool,
    only_pending: bool = True,
    fenced: Sequence[int] = (),
    owner: str | None = None,
) -> Sequence[Sequence[Any]]:
    """``QUEUED_COLUMNS`` of the queue rows ``ids`` (only pending ones when ``only_pending``, and of ``fenced`` only
    those ``owner`` holds), deleted from the queue when ``take``. Read or taken by the same statement, so what
    ``pack_ahead`` read compares equal with what the transaction took when nothing changed between.

    On SQLite the statement goes straight to the driver: compiling the expanding ``IN`` and converting each row's
    times took a third of a delivery worker's time to record its outcomes; the times come back as text, which
    ``read_store_time`` reads.
    """
    if connection.dialect.name != "sqlite":
        statement = OUTBOX.delete().returning(*QUEUED_COLUMNS) if take else select(*QUEUED_COLUMNS)
        statement = statement.where(OUTBOX.c.id.in_(ids))
        if only_pending:
            statement = statement.where(OUTBOX.c.state == "pending")
        if fenced:
            statement = statement.where(or_(OUTBOX.c.id.not_in(fenced), OUTBOX.c.lease_owner == owner))
        return connection.execute(statement).all()
    where = f"id IN ({', '.join('?' * len(ids))})"
    parameters: list[Any] = list(ids)
    if only_pending:
        where += " AND state = 'pending'"
    if fenced:
        where += f" AND (id NOT IN ({', '.join('?' * len(fenced))}) OR lease_owner = ?)"
        parameters += [*fenced, owner]
    columns = ", ".join(column.name for column in QUEUED_COLUMNS)
    statement = (f"DELETE FROM outbox WHERE {where} RETURNING {columns}" if take
                 else f"SELECT {columns} FROM outbox WHERE {where}")
    return connection.exec_driver_sql(statement, tuple(parameters)).all()


def pack_ahead(engine: Engine, leaving: Sequence[Leaving], new_attempts: Sequence[Attempt]) -> dict[int, PackedAhead]:
    """The log rows of ``leaving`` (with this batch's ``new_attempts``) packed from the queue as it is now, read
    without a write transaction; a row whose names are not all numbered yet is left to the transaction."""
    by_id = {row.id: row for row in leaving}
    if not by_id:
        return {}
    ids = sorted(by_id)
    with engine.connect() as connection:
        queued = queued_rows(connection, ids, take=False)
        earlier = by_message(attempt_of(row) for row in connection.execute(
            select(*ATTEMPT_COLUMNS).where(ATTEMPTS.c.outbox_id.in_(ids))))
        new = by_message(new_attempts)
        reads = []
        for row in queued:
            before = in_order(earlier.get(row[0], ()))
            tries = in_order([*before, *new.get(row[0], ())])
            reads.append((row, before, tries, row_names(row, tries)))
        names = known_name_ids(connection, set().union(*(needed for *_, needed in reads)))
    millis = EpochMillis()
    return {row[0]: PackedAhead(tuple(row), before, log_row(row, by_id[row[0]], tries, names, millis))
            for row, before, tries, needed in reads if needed <= names.keys()}
