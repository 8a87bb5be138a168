"""Outcomes per destination and minute: what the console's charts and top failure reasons show, read without
touching a message.

``add_outcomes`` (``counters``) adds each batch's outcomes to the minute it was recorded in, in the same transaction
as the running totals. A chart of the last 24 hours reads at most 1,440 minutes × 3 outcomes (× shards on
PostgreSQL) rows of one destination through the primary key. ``add_minute_reasons`` does the same for the kinds
of reason failed and filtered messages end with (``reason_kind``: what varies per message taken out), with the
newest message of each as a sample. ``prune_minutes`` removes the minutes older than ``KEPT_FOR`` from both in each
pruning pass (a few thousand rows per destination and day, whatever the traffic).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.engine import Connection

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.store.schema.tables import OutcomeMinute, ReasonMinute, dialect_insert

MINUTES = OutcomeMinute.__table__
REASONS = ReasonMinute.__table__
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


# What varies per message in a reason: its attempt count, a receiver's Retry-After time, a failure run's start.
_VARYING = (
    (re.compile(r" \(after \d+ attempts?\)"), ""),
    (re.compile(r"; Retry-After [^;]*UTC"), ""),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?( UTC)?"), "…"),
)
REASON_CHARS = 200


def reason_kind(reason: str | None) -> str:
    """The kind of a failed or filtered message's reason: ``expired: HTTP 503 (after 9 attempts)`` and ``expired:
    HTTP 503 (after 12 attempts)`` are one kind, ``expired: HTTP 503``."""
    kind = reason or "(no reason)"
    for pattern, replacement in _VARYING:
        kind = pattern.sub(replacement, kind)
    return kind if len(kind) <= REASON_CHARS else kind[: REASON_CHARS - 1] + "…"


def add_minute_reasons(
    connection: Connection, ended: Iterable[tuple[str, str, str | None, int]], moment: datetime, shard: int
) -> None:
    """Count ``(destination, outcome, reason, message id)`` of failed and filtered messages in the minute of
    ``moment``, keeping the newest id of each kind as its sample, in the caller's transaction."""
    tallies: dict[tuple[str, str, str], list[int]] = {}
    for destination, outcome, reason, number in ended:
        tally = tallies.setdefault((destination, outcome, reason_kind(reason)), [0, 0])
        tally[0] += 1
        tally[1] = max(tally[1], number)
    if not tallies:
        return
    minute = minute_of(moment)
    rows = [{"destination": destination, "minute": minute, "outcome": outcome, "reason": reason, "shard": shard,
             "count": count, "sample_id": sample} for (destination, outcome, reason), (count, sample)
            in sorted(tallies.items())]
    statement = dialect_insert(connection)(REASONS).values(rows)
    newest = func.max(REASONS.c.sample_id, statement.excluded.sample_id) if connection.dialect.name == "sqlite" \
        else func.greatest(REASONS.c.sample_id, statement.excluded.sample_id)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[REASONS.c.destination, REASONS.c.minute, REASONS.c.outcome, REASONS.c.reason,
                        REASONS.c.shard],
        set_={"count": REASONS.c.count + statement.excluded.count, "sample_id": newest},
    ))


@dataclass(frozen=True)
class ReasonCount:
    """One kind of reason over a span of minutes: how many messages ended with it and the newest of them."""

    outcome: str
    reason: str
    count: int
    sample_id: int


def top_reasons(connection: Connection, destination: str, until: datetime, minutes: int = 1440,
                limit: int = 5) -> list[ReasonCount]:
    """The ``limit`` commonest kinds of reason of ``destination`` over the ``minutes`` that end with ``until``'s."""
    last = minute_of(until)
    total = func.sum(REASONS.c.count)
    query = (
        select(REASONS.c.outcome, REASONS.c.reason, total, func.max(REASONS.c.sample_id))
        .where(REASONS.c.destination == destination, REASONS.c.minute > last - timedelta(minutes=minutes),
               REASONS.c.minute <= last)
        .group_by(REASONS.c.outcome, REASONS.c.reason)
        .order_by(total.desc(), REASONS.c.reason)
        .limit(limit)
    )
    return [ReasonCount(outcome, reason, int(count), int(sample))
            for outcome, reason, count, sample in connection.execute(query)]


def prune_minutes(connection: Connection, now: datetime) -> int:
    """Remove the minutes older than ``KEPT_FOR`` before ``now`` (outcomes and reasons); returns how many rows."""
    cutoff = minute_of(now) - KEPT_FOR
    removed = connection.execute(delete(MINUTES).where(MINUTES.c.minute < cutoff)).rowcount or 0
    return removed + (connection.execute(delete(REASONS).where(REASONS.c.minute < cutoff)).rowcount or 0)
