"""Outcomes per destination and minute: what the console's charts draw, read without touching a message.

``add_outcomes`` (``counters``) adds each batch's outcomes to the minute it was recorded in, in the same transaction
as the running totals. A chart of the last 24 hours reads at most 1,440 minutes × 3 outcomes (× shards on
PostgreSQL) rows of one destination through the primary key; ``prune_minutes`` removes the minutes older than
``KEPT_FOR`` in each pruning pass (a few thousand rows per destination and day, whatever the traffic).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.tables import OutcomeMinute, dialect_insert

MINUTES = OutcomeMinute.__table__
KEPT_FOR = timedelta(hours=25)
OUTCOMES = (DELIVERED, FAILED, FILTERED)


def minute_of(moment: datetime) -> datetime:
    """The start of the minute ``moment`` (naive UTC) falls in."""
    return moment.replace(second=0, microsecond=0)


def add_minute_outcomes(
    connection: Connection, counts: Mapping[tuple[str, str], int], moment: datetime, shard: int
) -> None:
    """Add ``{(destination, outcome): n}`` to the minute of ``moment``, in the caller's transaction (sorted keys:
    two transactions lock rows in the same order)."""
    minute = minute_of(moment)
    rows = [{"destination": destination, "minute": minute, "outcome": outcome, "shard": shard, "count": count}
            for (destination, outcome), count in sorted(counts.items()) if count]
    if not rows:
        return
    statement = dialect_insert(connection)(MINUTES).values(rows)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[MINUTES.c.destination, MINUTES.c.minute, MINUTES.c.outcome, MINUTES.c.shard],
        set_={"count": MINUTES.c.count + statement.excluded.count},
    ))


@dataclass
class MinuteSeries:
    """One destination's outcomes per minute from ``start`` on, one entry per minute (zeros included).

    Attributes:
        start: The first minute (naive UTC).
        counts: Per outcome, one count per minute.
    """

    start: datetime
    counts: dict[str, list[int]] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        """Per outcome, the sum over the series."""
        return {outcome: sum(values) for outcome, values in self.counts.items()}


def minute_series(connection: Connection, destination: str, until: datetime, minutes: int = 1440) -> MinuteSeries:
    """The ``minutes`` minutes of ``destination`` that end with the minute of ``until`` (naive UTC)."""
    last = minute_of(until)
    start = last - timedelta(minutes=minutes - 1)
    series = MinuteSeries(start=start, counts={outcome: [0] * minutes for outcome in OUTCOMES})
    query = (
        select(MINUTES.c.minute, MINUTES.c.outcome, func.sum(MINUTES.c.count))
        .where(MINUTES.c.destination == destination, MINUTES.c.minute >= start, MINUTES.c.minute <= last)
        .group_by(MINUTES.c.minute, MINUTES.c.outcome)
    )
    for minute, outcome, total in connection.execute(query):
        if isinstance(minute, str):  # SQLite may hand a grouped datetime back as text
            minute = datetime.fromisoformat(minute)
        index = int((minute - start).total_seconds() // 60)
        if outcome in series.counts and 0 <= index < minutes:
            series.counts[outcome][index] += int(total or 0)
    return series


def prune_minutes(connection: Connection, now: datetime) -> int:
    """Remove the minutes older than ``KEPT_FOR`` before ``now``; returns how many rows."""
    return connection.execute(delete(MINUTES).where(MINUTES.c.minute < minute_of(now) - KEPT_FOR)).rowcount or 0
