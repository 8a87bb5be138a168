"""The message log: every message that left the queue (delivered, filtered or failed), kept for its retention.

The queue (``outbox``) holds what is pending; a message that reaches its outcome moves here in the transaction
that records it, with every attempt folded into its record. The log is built to be kept and to be looked up:

- **Partitioned by time** (``partitions``): one table per kind and period, dropped whole by retention: no
  per-row delete at the ingest rate, nothing to vacuum.
- **Compact.** The columns are the lookups' keys (numbers) and one compressed record (``records``): 246 bytes
  a kept message, indexes included, for the seed's shapes (550 in the queue-as-history layout before it).
  Destinations, sources and URLs are small numbers (``names``).
- **Packed outside the lock, when given.** A caller may pack log rows before its write transaction opens
  (``rows.pack_ahead``); the transaction checks each against the queue row it takes and packs again only one
  that changed meanwhile. The delivery worker does not: it was measured, not a gain (see ``outbox.record_outcomes``).
- **Looked up by index.** Each partition has three indexes: messageId key, user key, and (destination, time). A
  lookup probes the partitions that may hold what it asks for (``filters``), newest first, a group per
  statement, and stops once its limit is met by messages newer than any partition left (``find_kept``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import takewhile
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import FAILED, Attempt
from prefect_webhooks.store.log.filters import may_hold
from prefect_webhooks.store.log.names import name_ids, names_of
from prefect_webhooks.store.log.partitions import (
    KIND_OF_STATE,
    STATE_OF_CODE,
    Partition,
    kept_partitions,
    partition_table,
    partitions_for,
)
from prefect_webhooks.store.log.records import (
    EpochMillis,
    PackedRecord,
    RecordContent,
    from_epoch_ms,
    pack_record,
)
from prefect_webhooks.store.log.rows import (
    ATTEMPT_COLUMNS,
    Leaving,
    PackedAhead,
    attempt_of,
    by_message,
    in_order,
    log_row,
    queued_rows,
    row_names,
)
from prefect_webhooks.store.log.statements import group_statement, lookup_parameters
from prefect_webhooks.store.schema.bulk_insert import insert_rows
from prefect_webhooks.store.schema.tables import (
    DeliveryAttempt,
    LogName,
    LogPartition,
    OutboxMessage,
)

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__
PARTITIONS = LogPartition.__table__
NAMES = LogName.__table__

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
    packed: Mapping[int, PackedAhead] | None = None,
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
        packed: Log rows ``rows.pack_ahead`` packed before the transaction; each is used only if its queue row
            and earlier attempts are still those it was packed from, else the row is packed here.

    Returns:
        ``{(destination, state): moved}``: only rows that were still queued count.
    """
    by_id = {row.id: row for row in leaving}
    if not by_id:
        return {}
    fenced = [row.id for row in leaving if row.state == FAILED] if owner is not None else []
    queued = queued_rows(connection, sorted(by_id), take=True, only_pending=only_pending, fenced=fenced, owner=owner)
    moved_ids = {row[0] for row in queued}
    if moved is not None:
        moved |= moved_ids
    place_late_attempts(connection, [attempt for attempt in new_attempts
                                     if attempt.outbox_id in by_id and attempt.outbox_id not in moved_ids])
    if not queued:
        return {}
    partitions = partitions_for(connection, {(KIND_OF_STATE[row.state], row.finished_at) for row in leaving})
    earlier = by_message(attempt_of(row) for row in connection.execute(
        delete(ATTEMPTS).where(ATTEMPTS.c.outbox_id.in_(moved_ids)).returning(*ATTEMPT_COLUMNS)))
    rows: list[tuple[Leaving, dict[str, Any]]] = []
    to_pack: list[tuple[Sequence[Any], list[Attempt]]] = []
    for queued_row in queued:
        before = in_order(earlier.get(queued_row[0], []))
        ahead = packed.get(queued_row[0]) if packed else None
        if ahead is not None and ahead.still(queued_row, before):
            rows.append((by_id[queued_row[0]], ahead.row))
        else:
            to_pack.append((queued_row, before))
    if to_pack:
        new = by_message(new_attempts)
        tries = {queued_row[0]: in_order([*before, *new.get(queued_row[0], [])]) for queued_row, before in to_pack}
        names = name_ids(connection, {name for queued_row, _ in to_pack
                                      for name in row_names(queued_row, tries[queued_row[0]])})
        millis = EpochMillis()
        rows += [(by_id[queued_row[0]], log_row(queued_row, by_id[queued_row[0]], tries[queued_row[0]], names, millis))
                 for queued_row, _ in to_pack]
    destinations = {queued_row[0]: queued_row[1] for queued_row in queued}
    rows_by_partition: dict[str, list[dict[str, Any]]] = {}
    counts: dict[tuple[str, str], int] = {}
    for outcome, row in rows:
        partition = partitions[KIND_OF_STATE[outcome.state], outcome.finished_at]
        rows_by_partition.setdefault(partition.name, []).append(row)
        key = (destinations[outcome.id], outcome.state)
        counts[key] = counts.get(key, 0) + 1
    for name, partition_rows in rows_by_partition.items():
        insert_rows(connection, partition_table(name), partition_rows)
    return counts


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
    by_id = by_message(attempts)
    if not by_id:
        return 0
    kept = find_kept(connection, ids=sorted(by_id))
    for message in kept:
        content = message.content
        content.tries = in_order([*content.tries, *by_id[message.id]])
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
