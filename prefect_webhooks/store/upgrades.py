"""One-time changes an older store gets when a process of this release first opens it.

``create_all`` adds missing tables; what it cannot do is here, each step idempotent and safe for several processes
starting at once:

- the index ``ix_outbox_destination_state`` is dropped: monitoring reads counters and pending rows now, and the
  index cost every message of history about 32 bytes;
- ``outcome_counters`` is seeded from the outbox once, so the totals of a store that kept its history go on from
  what it holds (one ``GROUP BY`` over the outbox, at the first start only).
"""

from __future__ import annotations

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.tables import OutboxMessage, OutcomeCounter, StoreUpgrade, dialect_insert, store_now

OUTBOX = OutboxMessage.__table__
COUNTERS = OutcomeCounter.__table__
UPGRADES = StoreUpgrade.__table__
DROPPED_INDEXES = ("ix_outbox_destination_state",)
COUNTERS_SEEDED = "outcome_counters_seeded"


def upgrade_store(connection: Connection) -> list[str]:
    """Apply the steps an older store still needs, in the caller's transaction; returns what was done."""
    done = []
    existing = {index["name"] for index in inspect(connection).get_indexes(OUTBOX.name)}
    for name in DROPPED_INDEXES:
        if name in existing:
            connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
            done.append(f"dropped index {name}")
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
