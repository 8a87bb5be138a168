"""The outbox: the queue of messages waiting for delivery, and how they enter and leave it.

``enqueue`` is the one entry point ingestion, audience syncs and deletions use; ``add_to_outbox`` does the same
inside a caller's transaction so a caller's own writes (dedupe keys, audience state) commit together with the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, and_, bindparam, or_, select, type_coerce, update
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING, THROTTLED_REASON, OutcomeRecords
from prefect_webhooks.messages.payloads import serialize
from prefect_webhooks.messages.retry import RETRY_AFTER_REASON
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine, insert_rows
from prefect_webhooks.store.figures.counters import add_outcomes
from prefect_webhooks.store.figures.endpoint_counters import add_requests
from prefect_webhooks.store.log.message_log import attempt_rows, move_to_log, place_late_attempts
from prefect_webhooks.store.log.rows import Leaving
from prefect_webhooks.store.queue.ordering import claimable_in_order
from prefect_webhooks.store.queue.replay import replay_failed as replay_failed  # its home before the replay module
from prefect_webhooks.store.schema.tables import (
    DeliveryAttempt,
    OutboxMessage,
    free_of_lease,
    read_store_time,
    store_now,
    store_time_text,
    to_store_time,
)

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__


def payload_user(payload: dict[str, Any]) -> str | None:
    """The user an outbound message is about (alias: the new id)."""
    return payload.get("userId") or payload.get("User ID") or payload.get("anonymousId")


def outbox_row(
    destination: str, payload: dict[str, Any], *, source: str | None, message_id: str | None, stored_at: datetime
) -> dict[str, Any]:
    """One row for ``payload`` bound to ``destination``, due at ``stored_at`` (naive UTC); the body serialised here."""
    return {
        "destination": destination,
        "source": source,
        "message_type": payload["type"],
        "message_id": message_id,
        "user_id": payload_user(payload),
        "body": serialize(payload),
        "state": PENDING,
        "attempts": 0,
        "created_at": stored_at,
        "next_attempt_at": stored_at,
    }


def outbox_rows(
    destination: str,
    payloads: Iterable[dict[str, Any]],
    *,
    source: str | None = None,
    message_ids: Sequence[str | None] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows for ``payloads`` bound to ``destination``, due at once; each body serialised here, once."""
    stored_at = to_store_time(now) if now else store_now()
    return [
        outbox_row(destination, payload, source=source, message_id=message_ids[index] if message_ids else None,
                   stored_at=stored_at)
        for index, payload in enumerate(payloads)
    ]


def add_to_outbox(connection: Connection, rows: Sequence[dict[str, Any]]) -> int:
    """Insert prepared rows (all of one shape, as ``outbox_rows`` makes them) in the caller's transaction."""
    return insert_rows(connection, OUTBOX, rows)


def enqueue(
    destination: str,
    payloads: Sequence[dict[str, Any]],
    *,
    source: str | None = None,
    engine: Engine | None = None,
) -> int:
    """Put outbound messages for one destination into the outbox, committed before returning.

    Args:
        destination: Name of a saved ``WebhookDestination`` block.
        payloads: Outbound messages (see ``prefect_webhooks.messages.payloads``).
        source: Name of the Source block they came from, if any.
        engine: The store; the configured one by default.

    Returns:
        The number of rows written.
    """
    engine = engine or get_engine()
    with engine.begin() as connection:
        return add_to_outbox(connection, outbox_rows(destination, payloads, source=source))


@dataclass(slots=True)
class Claimed:
    """An outbox row leased by a delivery process: what it needs to send it and decide its fate."""

    id: int
    destination: str
    body: bytes
    attempts: int
    first_attempt_at: datetime | None
    next_attempt_at: datetime
    reason: str | None = None
    created_at: datetime | None = None
    endpoint: str | None = None
    """The key of the one endpoint it goes to (``store.queue.fan_out``); every endpoint of its destination when None."""


# What a claim reads of each row, in the order ``to_claimed`` takes them.
CLAIMED_COLUMNS = (
    OUTBOX.c.id,
    OUTBOX.c.destination,
    OUTBOX.c.body,
    OUTBOX.c.attempts,
    OUTBOX.c.first_attempt_at,
    OUTBOX.c.next_attempt_at,
    OUTBOX.c.reason,
    OUTBOX.c.created_at,
    OUTBOX.c.endpoint,
)


# The same, with the times read as the store's text on SQLite: SQLAlchemy's DATETIME reader (a pattern per value) cost
# more than the rest of a claimed row; ``read_store_time`` reads that text with ``fromisoformat``.
_TEXT_TIMES = {OUTBOX.c.first_attempt_at.name, OUTBOX.c.next_attempt_at.name, OUTBOX.c.created_at.name}
CLAIMED_COLUMNS_AS_TEXT = tuple(type_coerce(column, String()).label(column.name) if column.name in _TEXT_TIMES
                                else column for column in CLAIMED_COLUMNS)


def claimed_columns(connection: Connection) -> tuple[Any, ...]:
    """``CLAIMED_COLUMNS`` as ``to_claimed`` reads them fastest on ``connection``'s database."""
    return CLAIMED_COLUMNS_AS_TEXT if connection.dialect.name == "sqlite" else CLAIMED_COLUMNS


def to_claimed(row: Any) -> Claimed:
    """The claim of a row read with ``claimed_columns`` (or ``CLAIMED_COLUMNS``)."""
    return Claimed(row[0], row[1], bytes(row[2] or b""), row[3], read_store_time(row[4]), read_store_time(row[5]),
                   row[6], read_store_time(row[7]), row[8])


def claim_due_deliveries(
    engine: Engine,
    limit: int,
    owner: str,
    destination: str | None = None,
    *,
    lease_seconds: float | None = None,
    in_order: bool = True,
    due_by: datetime | None = None,
) -> list[Claimed]:
    """Lease up to ``limit`` due pending rows for ``owner`` in one statement, oldest due first.

    A row is due when it is pending, its ``next_attempt_at`` has come and no live lease holds it. A killed
    process's rows come back once their lease expires, so delivery is at-least-once. PostgreSQL skips rows
    another claimer has locked; SQLite serialises writers, so the single statement is already atomic.

    Args:
        engine: The store.
        limit: Most rows to claim.
        owner: The claimer's id, written to ``lease_owner``.
        destination: Only rows for this destination block name; all destinations when None.
        lease_seconds: Lease length; ``settings.delivery.lease_seconds`` by default.
        in_order: Take only each user's oldest pending row of an ordered destination (``store.queue.ordering``); a
            caller that knows no destination is ordered passes False and saves the check.
        due_by: Take rows due by this time (naive UTC) rather than now: a caller that sends each at its due time
            (a claim made just before a retry falls due).

    Returns:
        The claimed rows (any order).
    """
    now = store_now(engine)  # the database's clock on PostgreSQL (``clock``): every host compares leases by it
    lease = lease_seconds if lease_seconds is not None else get_settings().delivery.lease_seconds
    due = (
        select(OUTBOX.c.id)
        .where(
            OUTBOX.c.state == PENDING,
            OUTBOX.c.next_attempt_at <= max(now, due_by or now),
            free_of_lease(now),
        )
        .order_by(OUTBOX.c.next_attempt_at)
        .limit(limit)
    )
    if in_order:
        due = due.where(claimable_in_order())
    if destination is not None:
        due = due.where(OUTBOX.c.destination == destination)
    if engine.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    statement = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_(due.scalar_subquery()))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease))
    )
    with engine.begin() as connection:
        statement = statement.returning(*claimed_columns(connection))
        if in_order and engine.dialect.name == "postgresql":
            # A prepared claim may get a generic plan after a few runs; with the ordered-delivery condition that plan
            # took seconds instead of milliseconds (the due time is only known per run).
            connection.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
        return [to_claimed(row) for row in connection.execute(statement)]


def leased_rows(engine: Engine, ids: Sequence[int], owner: str) -> list[Claimed]:
    """The rows among ``ids`` that are still pending and leased by ``owner`` (a task retry re-reads these)."""
    if not ids:
        return []
    with engine.connect() as connection:
        statement = select(*claimed_columns(connection)).where(
            OUTBOX.c.id.in_(list(ids)), OUTBOX.c.state == PENDING, OUTBOX.c.lease_owner == owner
        )
        return [to_claimed(row) for row in connection.execute(statement)]


def _renew(
    connection: Connection, ids: Sequence[int], owner: str, until: datetime, *, only_earlier: bool, returning: bool
) -> Any:
    """Push ``owner``'s lease on its pending rows among ``ids`` to ``until`` (``only_earlier``: only leases ending
    before it). On SQLite the statement goes straight to the driver: SQLAlchemy's expanding ``IN`` of a batch's ids
    cost more to compile than the update."""
    if connection.dialect.name == "sqlite":
        sql = (f"UPDATE outbox SET lease_expires_at = ? WHERE id IN ({', '.join('?' * len(ids))}) "
               "AND state = 'pending' AND lease_owner = ?")
        text = store_time_text(until)
        parameters: tuple[Any, ...] = (text, *ids, owner)
        if only_earlier:
            sql += " AND lease_expires_at < ?"
            parameters += (text,)
        return connection.exec_driver_sql(sql + (" RETURNING id" if returning else ""), parameters)
    statement = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_(list(ids)), OUTBOX.c.state == PENDING, OUTBOX.c.lease_owner == owner)
        .values(lease_expires_at=until)
    )
    if only_earlier:
        statement = statement.where(OUTBOX.c.lease_expires_at < until)
    return connection.execute(statement.returning(OUTBOX.c.id) if returning else statement)


def extend_leases(engine: Engine, ids: Sequence[int], owner: str, until: datetime) -> int:
    """Push the lease of ``owner``'s pending rows among ``ids`` to ``until``, never back; returns how many.

    Never back: a batch's lease keeper runs until its outcomes are recorded, and a renewal that commits just after
    the record must not shorten the longer lease the record gave a row held for the task's next try.
    """
    if not ids:
        return 0
    with engine.begin() as connection:
        return _renew(connection, ids, owner, until, only_earlier=True, returning=False).rowcount


def renew_leases(engine: Engine, ids: Sequence[int], owner: str, until: datetime) -> set[int]:
    """Push ``owner``'s lease on its pending rows among ``ids`` to ``until``; returns the ids it still holds.

    The fence before a batch sends: a row missing from the answer is no longer pending, or was claimed by another
    run after this one's lease lapsed (while it waited for something), and must not be sent from here.
    """
    if not ids:
        return set()
    with engine.begin() as connection:
        return {row[0] for row in _renew(connection, ids, owner, until, only_earlier=False, returning=True)}


def bring_forward(engine: Engine, destinations: Sequence[str], *, limit: int | None = None) -> int:
    """Make the waiting messages of ``destinations`` due now (the first ``limit`` to come due, or all).

    Messages put off by a retry backoff are brought forward when their endpoint is known to answer again (a circuit
    breaker probe succeeded), or one of them is, to carry the probe. Rows under a live lease (an in-process retry)
    and rows whose next attempt a receiver's ``Retry-After`` or the endpoint's rate budget set are left alone; the
    deadline and attempt count stay as they are.

    Returns:
        How many rows were brought forward.
    """
    if not destinations:
        return 0
    now = store_now(engine)
    waiting = (
        select(OUTBOX.c.id)
        .where(
            OUTBOX.c.destination.in_(list(destinations)),
            OUTBOX.c.state == PENDING,
            OUTBOX.c.next_attempt_at > now,
            free_of_lease(now),
            or_(OUTBOX.c.reason.is_(None), and_(OUTBOX.c.reason.not_like(f"%{RETRY_AFTER_REASON}%"),
                                                 OUTBOX.c.reason.not_like(f"{THROTTLED_REASON}%"))),
        )
        .order_by(OUTBOX.c.next_attempt_at)
    )
    if limit is not None:
        waiting = waiting.limit(limit)
    statement = update(OUTBOX).where(OUTBOX.c.id.in_(waiting.scalar_subquery())).values(next_attempt_at=now)
    with engine.begin() as connection:
        return connection.execute(statement).rowcount


def release_leases(engine: Engine, ids: Sequence[int], owner: str, *, due_at: datetime | None = None) -> int:
    """Give up ``owner``'s lease on pending rows among ``ids`` so any run may claim them when due (at ``due_at``
    when given: a batch waiting to fill; attempts and deadline unchanged)."""
    if not ids:
        return 0
    values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if due_at is not None:
        values["next_attempt_at"] = due_at
    statement = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_(list(ids)), OUTBOX.c.state == PENDING, OUTBOX.c.lease_owner == owner)
        .values(**values)
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount


_RESCHEDULE = (
    update(OUTBOX)
    .where(OUTBOX.c.id == bindparam("b_id"), OUTBOX.c.state == PENDING,
           or_(bindparam("b_owner", type_=String()).is_(None),
               OUTBOX.c.lease_owner == bindparam("b_owner", type_=String())))
    .values(
        reason=bindparam("b_reason"),
        attempts=bindparam("b_attempts"),
        first_attempt_at=bindparam("b_first_attempt_at"),
        next_attempt_at=bindparam("b_next_attempt_at"),
        lease_owner=bindparam("b_lease_owner"),
        lease_expires_at=bindparam("b_lease_expires_at"),
    )
)


def record_outcomes(engine: Engine, records: OutcomeRecords) -> None:
    """Write one batch's results in one transaction: delivered, filtered and failed messages move from the queue
    to the message log with their attempts (``message_log.move_to_log``), rescheduled ones stay queued with their
    attempts beside them, and the outcome and per-endpoint request counters are added.

    Only rows still queued move (a row a deletion purged meanwhile has left already), and only those count. The
    attempts of a row that left the queue meanwhile (another worker finished it after this one's lease ran out)
    join its kept record: every request a receiver got is in its message's history.
    """
    finished_at = store_now()
    leaving = [Leaving(row.id, DELIVERED, None, row.attempts, row.first_attempt_at, row.at)
               for row in records.delivered]
    leaving += [Leaving(row.id, FAILED, row.reason, row.attempts, row.first_attempt_at, finished_at)
                for row in records.failed]
    leaving += [Leaving(row.id, FILTERED, row.reason, None, None, finished_at) for row in records.filtered]
    leaving_ids = {row.id for row in leaving}
    staying = [attempt for attempt in records.attempts if attempt.outbox_id not in leaving_ids]
    moved: set[int] = set()
    # Not packed ahead (``log.rows.pack_ahead``): it halves the lock this transaction holds, but no run showed more
    # capacity with it, and the A/B pair of capacity steps showed less (bench/README.md, "Records packed before the
    # write lock").
    with engine.begin() as connection:
        counts = move_to_log(connection, leaving, records.attempts, owner=records.owner, moved=moved)
        if records.rescheduled:
            updated = connection.execute(_RESCHEDULE, [
                {"b_id": row.id, "b_attempts": row.attempts, "b_first_attempt_at": row.first_attempt_at,
                 "b_reason": row.reason, "b_next_attempt_at": row.next_attempt_at, "b_lease_owner": row.lease_owner,
                 "b_lease_expires_at": row.lease_expires_at, "b_owner": records.owner}
                for row in records.rescheduled]).rowcount
            all_updated = connection.dialect.supports_sane_multi_rowcount and updated == len(records.rescheduled)
            if staying and not all_updated:
                # Another worker took some row over after this one's lease ran out: it stays as that worker has it,
                # and the attempts made here join its history (beside it in the queue, or in its kept record).
                place_late_attempts(connection, staying)
                staying = []
        insert_rows(connection, ATTEMPTS, attempt_rows(staying))
        # Reasons of the rows that moved only, as the counts: a failure the lease fence kept queued is not one.
        add_outcomes(connection, counts, [(row.destination, FAILED, row.reason, row.id) for row in records.failed
                                          if row.id in moved]
                     + [(row.destination, FILTERED, row.reason, row.id) for row in records.filtered if row.id in moved])
        add_requests(connection, records.requests)
