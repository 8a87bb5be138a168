"""One-time changes an older store gets when a process of this release first opens it.

``create_all`` adds missing tables; what it cannot do is here, each step idempotent and safe for several processes
starting at once:

- the index ``ix_deletion_requests_state`` is added (``serve`` asks every minute whether a request waits);
- the index ``ix_outbox_destination_state`` is dropped: monitoring reads counters and pending rows now, and the
  index cost every message of history about 32 bytes;
- ``outcome_counters`` is seeded from the outbox once, so the totals of a store that kept its history go on from
  what it holds (one ``GROUP BY`` over the outbox, at the first start only);
- a SQLite queue made before the message log is rebuilt with ``AUTOINCREMENT`` (its rows copied once, in id
  order): once finished messages leave it, SQLite would otherwise give the id of a message kept in the log to a
  new one;
- delivered, filtered and failed messages a store from before the message log kept in its queue move to the log
  with their attempts (``move_history_to_log``), a few thousand per transaction, after the schema is made: a
  failed message can still be replayed, and the queue is left with what is pending.
"""

from __future__ import annotations

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.log.message_log import move_to_log
from prefect_webhooks.store.log.rows import Leaving
from prefect_webhooks.store.schema.tables import (
    DeletionRequest,
    OutboxMessage,
    OutcomeCounter,
    StoreUpgrade,
    dialect_insert,
    store_now,
)

OUTBOX = OutboxMessage.__table__
COUNTERS = OutcomeCounter.__table__
UPGRADES = StoreUpgrade.__table__
REQUESTS = DeletionRequest.__table__
DROPPED_INDEXES = ("ix_outbox_destination_state",)
COUNTERS_SEEDED = "outcome_counters_seeded"


def upgrade_store(connection: Connection) -> list[str]:
    """Apply the steps an older store still needs, in the caller's transaction (on SQLite too: ``create_schema``
    opens one before its DDL); returns what was done."""
    done = []
    if connection.dialect.name == "sqlite" and _rebuild_queue_with_autoincrement(connection):
        done.append("rebuilt the outbox with AUTOINCREMENT")
    existing = {index["name"] for index in inspect(connection).get_indexes(OUTBOX.name)}
    for name in DROPPED_INDEXES:
        if name in existing:
            connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
            done.append(f"dropped index {name}")
    requests_indexes = {index["name"] for index in inspect(connection).get_indexes(REQUESTS.name)}
    for index in REQUESTS.indexes:
        if index.name not in requests_indexes:
            # IF NOT EXISTS: several processes may start at once.
            connection.execute(CreateIndex(index, if_not_exists=True))
            done.append(f"added index {index.name}")
    if connection.execute(select(UPGRADES.c.name).where(UPGRADES.c.name == COUNTERS_SEEDED)).first() is None:
        # Whoever inserts the marker seeds, in the same transaction; a concurrent starter finds the marker taken.
        marked = connection.execute(
            dialect_insert(connection)(UPGRADES).values(name=COUNTERS_SEEDED, applied_at=store_now())
            .on_conflict_do_nothing().returning(UPGRADES.c.name)
        ).first()
        if marked is not None:
            seed = (
                select(OUTBOX.c.destination, OUTBOX.c.state, func.count())
                .where(OUTBOX.c.state.in_((DELIVERED, FAILED, FILTERED)))
                .group_by(OUTBOX.c.destination, OUTBOX.c.state)
            )
            rows = [{"destination": destination, "outcome": state, "shard": 0, "count": count}
                    for destination, state, count in connection.execute(seed)]
            if rows:
                connection.execute(COUNTERS.insert(), rows)
            done.append(f"seeded {len(rows)} outcome counter(s)")
    return done


def move_history_to_log(engine: Engine, *, batch: int = 5_000) -> int:
    """Move the finished messages an older store kept in its queue to the message log; returns how many.

    Each batch is its own transaction; processes starting together each move what their ``DELETE`` took, so no
    message moves twice. A store made by this release has none, and the check is one index probe.
    """
    finished = (select(OUTBOX.c.id, OUTBOX.c.state, OUTBOX.c.reason, OUTBOX.c.attempts, OUTBOX.c.first_attempt_at,
                       OUTBOX.c.next_attempt_at)
                .where(OUTBOX.c.state.in_((DELIVERED, FAILED, FILTERED))).order_by(OUTBOX.c.id).limit(batch))
    moved = 0
    while True:
        with engine.begin() as connection:
            rows = connection.execute(finished).all()
            if not rows:
                return moved
            moved += sum(move_to_log(connection, [Leaving(*row) for row in rows], only_pending=False).values())


def _rebuild_queue_with_autoincrement(connection: Connection) -> bool:
    made = connection.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'outbox'").scalar()
    if made is None or "AUTOINCREMENT" in made.upper():
        return False
    connection.exec_driver_sql("ALTER TABLE outbox RENAME TO outbox_before_log")
    indexes = connection.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index' "
                                         "AND tbl_name = 'outbox_before_log' AND sql IS NOT NULL").scalars().all()
    for index in indexes:
        connection.exec_driver_sql(f'DROP INDEX "{index}"')
    OUTBOX.create(connection)
    columns = ", ".join(column.name for column in OUTBOX.columns)
    connection.exec_driver_sql(f"INSERT INTO outbox ({columns}) SELECT {columns} FROM outbox_before_log ORDER BY id")
    connection.exec_driver_sql("DROP TABLE outbox_before_log")
    return True
