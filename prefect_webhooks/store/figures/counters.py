"""Running totals of outcomes per destination: real counters, read in O(destinations).

Each batch's outcomes are added in the transaction that records them (``outbox.record_outcomes``, the deletion
purge), counting only the rows that statement changed. Pruning, purges and restarts leave them alone, so
``prefect_webhooks_delivered_total`` never goes down. On PostgreSQL each transaction adds to one of ``SHARDS`` rows
per (destination, outcome), chosen at random, so several delivery processes do not queue on one hot row; the total
is the sum. SQLite has one writer at a time anyway and uses one row.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from prefect_webhooks.store.figures.minute_counts import add_minute_outcomes, add_minute_reasons
from prefect_webhooks.store.schema.tables import OutcomeCounter, dialect_insert, store_now

COUNTERS = OutcomeCounter.__table__
SHARDS = 16


def add_outcomes(connection: Connection, counts: Mapping[tuple[str, str], int],
                 ended: Iterable[tuple[str, str, str | None, int]] = ()) -> None:
    """Add ``{(destination, outcome): n}`` to the totals and to this minute's counts, and the reasons of ``ended``
    ``(destination, outcome, reason, id)`` failed and filtered messages to this minute's, in the caller's
    transaction.

    The rows are written in sorted key order: two transactions adding to the same destinations lock them in the
    same order and cannot deadlock.
    """
    shard = 0 if connection.dialect.name == "sqlite" else random.randrange(SHARDS)
    rows = [{"destination": destination, "outcome": outcome, "shard": shard, "count": count}
            for (destination, outcome), count in sorted(counts.items()) if count]
    if not rows:
        return
    now = store_now()
    add_minute_reasons(connection, ended, now, shard)
    statement = dialect_insert(connection)(COUNTERS).values(rows)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[COUNTERS.c.destination, COUNTERS.c.outcome, COUNTERS.c.shard],
        set_={"count": COUNTERS.c.count + statement.excluded.count},
    ))
    add_minute_outcomes(connection, counts, now, shard)


def outcome_totals(connection: Connection) -> dict[str, dict[str, int]]:
    """``{destination: {outcome: total}}`` for every destination that ever had an outcome."""
    query = select(COUNTERS.c.destination, COUNTERS.c.outcome, func.sum(COUNTERS.c.count)).group_by(
        COUNTERS.c.destination, COUNTERS.c.outcome)
    totals: dict[str, dict[str, int]] = {}
    for destination, outcome, total in connection.execute(query):
        totals.setdefault(destination, {})[outcome] = int(total or 0)
    return totals
