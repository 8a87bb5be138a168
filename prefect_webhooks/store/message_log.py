"""The message log: every message that left the queue (delivered, filtered or failed), kept for its retention.

The queue (``outbox``) holds what is pending; a message that reaches its outcome moves here in the transaction
that records it, with every attempt folded into its record. The log is built to be kept and to be looked up:

- **Partitioned by time** (``log_partitions``): one table per kind and period, dropped whole by retention: no
  per-row delete at the ingest rate, nothing to vacuum.
- **Compact.** The columns are the lookups' keys (numbers) and one compressed record (``log_records``): 246 bytes
  a kept message, indexes included, for the seed's shapes (550 in the queue-as-history layout before it).
  Destinations, sources and URLs are small numbers (``message_log_names``).
- **Looked up by index.** Each partition has three indexes: messageId key, user key, and (destination, time). A
  lookup probes the partitions that may hold what it asks for (``log_filters``), newest first, a group per
  statement, and stops once its limit is met by messages newer than any partition left (``find_kept``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import takewhile
from typing import Any

from sqlalchemy import delete, or_, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import FAILED, Attempt
from prefect_webhooks.store.bulk_insert import insert_rows
from prefect_webhooks.store.log_filters import may_hold
from prefect_webhooks.store.log_partitions import (
    KIND_OF_STATE,
    STATE_CODES,
    STATE_OF_CODE,
    Partition,
    _store,
    kept_partitions,
    partition_table,
    partitions_for,
)
from prefect_webhooks.store.log_records import (
    PackedRecord,
    RecordContent,
    epoch_ms,
    from_epoch_ms,
    pack_record,
    text_key,
)
from prefect_webhooks.store.log_statements import group_statement, lookup_parameters
from prefect_webhooks.store.tables import (
    DeliveryAttempt,
    LogName,
    LogPartition,
    OutboxMessage,
    dialect_insert,
    read_store_time,
)

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__
PARTITIONS = LogPartition.__table__
NAMES = LogName.__table__

_names: dict[tuple[str, str], int] = {}  # (store, name) -> id; ids are never reused
_lock = threading.Lock()


def name_ids(connection: Connection, names: Iterable[str]) -> dict[str, int]:
    """The numbers of ``names`` (destinations, sources, URLs), given one in the caller's transaction the first time
    each is seen. Only a number read as already committed is remembered by the process (a rolled-back transaction
    takes its new numbers with it)."""
    store = _store(connection)
    wanted = set(names)
    found = {name: _names[store, name] for name in wanted if (store, name) in _names}
    missing = sorted(wanted - set(found))
    if not missing:
        return found
    committed = dict(connection.execute(select(NAMES.c.name, NAMES.c.id).where(NAMES.c.name.in_(missing))).all())
    with _lock:
        for name, name_id in committed.items():
            _names[store, name] = name_id
    found.update(committed)
    new = [name for name in missing if name not in committed]
    if new:
        connection.execute(dialect_insert(connection)(NAMES).on_conflict_do_nothing(), [{"name": name} for name in new])
        found.update(connection.execute(select(NAMES.c.name, NAMES.c.id).where(NAMES.c.name.in_(new))).all())
    return found


def names_of(connection: Connection, ids: Iterable[int]) -> dict[int, str]:
    """The names of numbers ``name_ids`` gave."""
    wanted = sorted({code for code in ids if code is not None})
    if not wanted:
        return {}
    return dict(connection.execute(select(NAMES.c.id, NAMES.c.name).where(NAMES.c.id.in_(wanted))).all())


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


_QUEUED_COLUMNS = (OUTBOX.c.id, OUTBOX.c.destination, OUTBOX.c.source, OUTBOX.c.message_type, OUTBOX.c.message_id,
                   OUTBOX.c.user_id, OUTBOX.c.body, OUTBOX.c.created_at, OUTBOX.c.attempts, OUTBOX.c.first_attempt_at,
                   OUTBOX.c.endpoint)
# An attempt's columns in ``Attempt``'s order.
ATTEMPT_COLUMNS = (ATTEMPTS.c.outbox_id, ATTEMPTS.c.attempted_at, ATTEMPTS.c.url, ATTEMPTS.c.status_code,
                   ATTEMPTS.c.error, ATTEMPTS.c.latency_ms, ATTEMPTS.c.outcome, ATTEMPTS.c.response)


def attempt_rows(attempts: Iterable[Attempt]) -> list[dict[str, Any]]:
    """``delivery_attempts`` rows of ``attempts`` (of queued messages)."""
    return [{"outbox_id": a.outbox_id, "attempted_at": a.attempted_at, "url": a.url, "status_code": a.status_code,
             "error": a.error, "latency_ms": a.latency_ms, "outcome": a.outcome, "response": a.response}
            for a in attempts]


def move_to_log(
    connection: Connection,
    leaving: Sequence[Leaving],
    new_attempts: Sequence[Attempt] = (),
    *,
    only_pending: bool = True,
    owner: str | None = None,
    moved: set[int] | None = None,
) -> dict[tuple[str, str], int]:
    """Move ``leaving`` from the queue to the log in the caller's transaction, with their attempts.

    Args:
        connection: The caller's transaction.
        leaving: The messages and their outcomes.
        new_attempts: Attempts of this batch not yet written; those of other rows are ignored.
        only_pending: Move only rows still pending (a row a deletion purged meanwhile has already left).
        owner: The delivering worker's lease owner. A message it failed moves only while that worker still holds
            its lease: one another worker took over after this one's lease ran out may yet be delivered there. (A
            delivered message moves whoever holds it: the receiver has it.)
        moved: When given, the ids of the rows that moved are added to it.

    Returns:
        ``{(destination, state): moved}``: only rows that were still queued count.
    """
    by_id = {row.id: row for row in leaving}
    if not by_id:
        return {}
    fenced = [row.id for row in leaving if row.state == FAILED] if owner is not None else []
    queued = _take_from_queue(connection, sorted(by_id), only_pending=only_pending, fenced=fenced, owner=owner)
    moved_ids = {row[0] for row in queued}
    if moved is not None:
        moved |= moved_ids
    place_late_attempts(connection, [attempt for attempt in new_attempts
                                     if attempt.outbox_id in by_id and attempt.outbox_id not in moved_ids])
    if not queued:
        return {}
    partitions = partitions_for(connection, {(KIND_OF_STATE[row.state], row.finished_at) for row in leaving})
    tries: dict[int, list[Attempt]] = {}
    for outbox_id, at, *rest in connection.execute(
            delete(ATTEMPTS).where(ATTEMPTS.c.outbox_id.in_(moved_ids)).returning(*ATTEMPT_COLUMNS)):
        tries.setdefault(outbox_id, []).append(Attempt(outbox_id, read_store_time(at), *rest))
    for attempt in new_attempts:
        if attempt.outbox_id in by_id:
            tries.setdefault(attempt.outbox_id, []).append(attempt)
    names = name_ids(connection, {name for row in queued for name in (row[1], row[2]) if name is not None}
                     | {attempt.url for attempts in tries.values() for attempt in attempts})
    rows_by_partition: dict[str, list[dict[str, Any]]] = {}
    counts: dict[tuple[str, str], int] = {}
    for (outbox_id, destination, source, message_type, message_id, user_id, body, created_at, attempts, first,
         endpoint) in queued:
        outcome = by_id[outbox_id]
        partition = partitions[KIND_OF_STATE[outcome.state], outcome.finished_at]
        purge = outcome.purge
        content = RecordContent(
            message_type=message_type, source=source, message_id=None if purge else message_id,
            user_id=None if purge else user_id, reason=outcome.reason,
            attempts=attempts if outcome.attempts is None else outcome.attempts, created_at=read_store_time(created_at),
            first_attempt_at=read_store_time(first) if outcome.attempts is None else outcome.first_attempt_at,
            body=None if purge or body is None else bytes(body),
            tries=sorted(tries.get(outbox_id, []), key=lambda attempt: attempt.attempted_at), endpoint=endpoint,
        )
        rows_by_partition.setdefault(partition.name, []).append({
            "id": outbox_id, "destination_id": names[destination], "state": STATE_CODES[outcome.state],
            "finished_ms": epoch_ms(outcome.finished_at), "message_key": text_key(content.message_id),
            "user_key": text_key(content.user_id), "source_id": names[source] if source is not None else None,
            "record": pack_record(content, outcome.finished_at, names),
        })
        counts[destination, outcome.state] = counts.get((destination, outcome.state), 0) + 1
    for name, rows in rows_by_partition.items():
        insert_rows(connection, partition_table(name), rows)
    return counts


def _take_from_queue(
    connection: Connection, ids: Sequence[int], *, only_pending: bool, fenced: Sequence[int], owner: str | None
) -> Sequence[Sequence[Any]]:
    """Delete ``ids`` from the queue (only pending ones, and of ``fenced`` only those ``owner`` holds) and return
    their ``_QUEUED_COLUMNS``.

    On SQLite the statement goes straight to the driver: compiling the expanding ``IN`` and converting each row's
    times took a third of a delivery worker's time to record its outcomes; the times come back as text, which
    ``read_store_time`` reads.
    """
    if connection.dialect.name != "sqlite":
        removal = delete(OUTBOX).where(OUTBOX.c.id.in_(ids))
        if only_pending:
            removal = removal.where(OUTBOX.c.state == "pending")
        if fenced:
            removal = removal.where(or_(OUTBOX.c.id.not_in(fenced), OUTBOX.c.lease_owner == owner))
        return connection.execute(removal.returning(*_QUEUED_COLUMNS)).all()
    statement = f"DELETE FROM outbox WHERE id IN ({', '.join('?' * len(ids))})"
    parameters: list[Any] = list(ids)
    if only_pending:
        statement += " AND state = 'pending'"
    if fenced:
        statement += f" AND (id NOT IN ({', '.join('?' * len(fenced))}) OR lease_owner = ?)"
        parameters += [*fenced, owner]
    returned = ", ".join(column.name for column in _QUEUED_COLUMNS)
    return connection.exec_driver_sql(f"{statement} RETURNING {returned}", tuple(parameters)).all()


def place_late_attempts(connection: Connection, attempts: Sequence[Attempt]) -> None:
    """Record ``attempts`` of messages another worker took over after this one's lease ran out, in the caller's
    transaction: beside the message while it is still queued, else in its kept record (``keep_late_attempts``)."""
    if not attempts:
        return
    ids = sorted({attempt.outbox_id for attempt in attempts})
    queued = set(connection.execute(select(OUTBOX.c.id).where(OUTBOX.c.id.in_(ids))).scalars())
    insert_rows(connection, ATTEMPTS, attempt_rows(attempt for attempt in attempts if attempt.outbox_id in queued))
    keep_late_attempts(connection, [attempt for attempt in attempts if attempt.outbox_id not in queued])


def keep_late_attempts(connection: Connection, attempts: Sequence[Attempt]) -> int:
    """Add ``attempts`` of messages that have already left the queue to their kept records, in the caller's
    transaction; returns how many kept messages gained attempts.

    A worker that stalled past its lease (a long pause, a frozen VM) records its attempts after another worker took
    the message over and reached its outcome. The receiver got those requests all the same, so they join the
    message's history rather than being dropped. This is rare, so the record is read back and written again (one
    primary-key probe per kept partition). A message no longer kept (purged or pruned) has no history to join.
    """
    by_id: dict[int, list[Attempt]] = {}
    for attempt in attempts:
        by_id.setdefault(attempt.outbox_id, []).append(attempt)
    if not by_id:
        return 0
    kept = find_kept(connection, ids=sorted(by_id))
    for message in kept:
        content = message.content
        content.tries = sorted([*content.tries, *by_id[message.id]], key=lambda attempt: attempt.attempted_at)
        codes = name_ids(connection, {attempt.url for attempt in content.tries})
        table = partition_table(message.partition)
        connection.execute(table.update().where(table.c.id == message.id).values(
            record=pack_record(content, message.finished_at, codes)))
    return len(kept)


@dataclass(slots=True)
class KeptMessage:
    """A message in the log, decoded.

    Attributes:
        id: Its number (the queue row's id, kept: the webhook's message id is built from it).
        destination: The destination block name.
        state: delivered, filtered or failed.
        finished_at: When it got there (naive UTC).
        content: Everything else: type, ids, reason, times, body and attempts.
        partition: The partition that holds it.
    """

    id: int
    destination: str
    state: str
    finished_at: datetime
    content: RecordContent
    partition: str


def decode_rows(
    connection: Connection, rows: Sequence[Any], partitions: Partition | Mapping[str, Partition]
) -> list[KeptMessage]:
    """Rows read from a partition (or, with a ``partition`` column naming theirs, from several) as kept messages:
    records decoded, names looked up."""
    records = [PackedRecord.read(row.record) for row in rows]
    names = names_of(connection, {row.destination_id for row in rows} | {row.source_id for row in rows}
                     | {code for record in records for code in record.url_codes})
    kept = []
    for row, record in zip(rows, records, strict=True):
        finished_at = from_epoch_ms(row.finished_ms) or datetime.min
        source = names.get(row.source_id) if row.source_id is not None else None
        partition = partitions if isinstance(partitions, Partition) else partitions[row.partition]
        kept.append(KeptMessage(row.id, names.get(row.destination_id, "?"), STATE_OF_CODE[row.state], finished_at,
                                record.content(row.id, finished_at, source, names), partition.name))
    return kept


def find_kept(
    connection: Connection,
    *,
    ids: Sequence[int] | None = None,
    message_id: str | None = None,
    user_id: str | None = None,
    destination: str | None = None,
    states: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> list[KeptMessage]:
    """Kept messages matching every filter given, newest first (each partition by index; no filter: all).

    Args:
        connection: The store.
        ids: These messages' numbers.
        message_id: The messageId (exact).
        user_id: The user (userId, or anonymousId without one).
        destination: The destination block name.
        states: delivered, filtered, failed.
        since: Finished at or after (naive UTC).
        until: Finished before (naive UTC).
        limit: At most this many.
    """
    destination_id = None
    if destination is not None:
        destination_id = connection.execute(select(NAMES.c.id).where(NAMES.c.name == destination)).scalar()
        if destination_id is None:
            return []
    kinds = {KIND_OF_STATE[state] for state in states} if states else None
    partitions = may_hold(connection, [partition for partition in kept_partitions(connection, since=since, until=until)
                                       if kinds is None or partition.kind in kinds],
                          message_id=message_id, user_id=user_id, ids=ids)
    # Newest period first, in groups sized by ``next_group_size`` (a statement each: SQLite's limit on a compound
    # select is 500 terms; each term takes its own newest ``limit`` rows through its index, the statement the newest
    # of those).
    # Once ``limit`` messages are found that are all newer than any period left, the older partitions are not read:
    # the newest 50 of a busy destination come from its newest partition, not from 50 rows of each one kept.
    partitions.sort(key=lambda partition: partition.ends_at, reverse=True)
    parameters = lookup_parameters(ids, message_id, user_id, destination_id, states, since, until, limit)
    found: list[KeptMessage] = []
    start, size = 0, FIRST_GROUP
    while start < len(partitions):
        group = partitions[start:start + size]
        start = start + len(group)
        statement = group_statement(tuple(partition.name for partition in group), frozenset(parameters))
        kept = decode_rows(connection, connection.execute(statement, parameters).all(), {p.name: p for p in group})
        # A key shared by two different ids (1 in 2^64) must not show the other's message.
        found.extend(message for message in kept
                     if (message_id is None or message.content.message_id == message_id)
                     and (user_id is None or message.content.user_id == user_id))
        found.sort(key=lambda message: (message.finished_at, message.id), reverse=True)
        if limit is not None and len(found) >= limit:
            del found[limit:]
            # Only a partition that ends after the oldest of these can still hold a newer one.
            newer = len(list(takewhile(lambda partition: partition.ends_at > found[-1].finished_at,
                                       partitions[start:])))
            if not newer:
                break
            size = min(newer, PARTITIONS_PER_STATEMENT)
        else:
            size = next_group_size(size, start, len(found), limit)
    return found


def next_group_size(size: int, read: int, found: int, limit: int | None) -> int:
    """How many partitions the next statement of a lookup short of its ``limit`` reads: twice the last group, or,
    when the ``read`` partitions so far found some, as many as should hold the rest at that rate and half again (a
    user with two messages in each partition needs 25 partitions for 50: doubling alone reads 3, 6, 12 and 24)."""
    doubled = min(size * 2, PARTITIONS_PER_STATEMENT)
    if limit is None or not found:
        return doubled
    return max(1, min(doubled, math.ceil(1.5 * (limit - found) * read / found)))


# The first group is the newest partitions of both kinds with one to spare.
FIRST_GROUP = 3
PARTITIONS_PER_STATEMENT = 200
