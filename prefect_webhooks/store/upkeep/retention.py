"""Retention: the store removes what it no longer needs to keep, so it stops growing under a constant load.

One pruning pass removes, oldest first:

- the message log's partitions whose whole period is older than their kind's retention (``retention_delivered``
  for delivered and filtered messages, ``retention_failed`` for failed ones): each is a table dropped whole, with
  its messages' attempts inside their records (``message_log``). Before a partition goes, its (user, source) pairs
  are kept, so an unscoped deletion request still finds every source that saw the user;
- the periods of messageIds remembered for deduplication (``seen_ids``) whose whole period is older than the
  dedupe window, each a table dropped whole; the filters of periods newly sealed are built first, out of the
  ingest path. A store from before these periods has its ``seen_messages`` emptied in transactions of at most
  ``batch_rows``, each followed by a pause as long as it took;
- the console's per-minute outcome counts older than a day (``minute_counts``).

Each read and each transaction of the pass is followed by a pause as long as it took (``pacing``): ingest and
delivery take the store's write lock and the CPU between them. Never a queued message. One pass at a time per
store, across processes and hosts (the ``prune`` lease). Freed pages are reused by new rows (SQLite keeps them in
the file, free; PostgreSQL returns a dropped table's files to the system at once), so the files level off instead of
growing.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, inspect, select, tuple_
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.dedupe.seen_ids import (
    LEGACY,
    drop_period,
    drop_unlisted_period,
    expired_periods,
    seal_periods,
    unlisted_periods,
)
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.minute_counts import prune_minutes
from prefect_webhooks.store.log.filters import seal_log_partitions
from prefect_webhooks.store.log.pacing import Pacer
from prefect_webhooks.store.log.partitions import (
    KIND_OF_STATE,
    drop_partition,
    drop_unlisted,
    expired_partitions,
    kept_partitions,
    partition_states,
    record_user_sources,
    unlisted_partitions,
)
from prefect_webhooks.store.schema.tables import OutboxMessage, read_store_time, store_now
from prefect_webhooks.store.upkeep.footprint import StoreSize, store_size
from prefect_webhooks.store.upkeep.leases import release_lease, take_lease

OUTBOX = OutboxMessage.__table__
SEEN = LEGACY
PRUNE_LEASE = "prune"
LEASE_SECONDS = 120.0
# MessageIds per transaction: a batch of 500 holds SQLite's write lock for 5-30 ms (2,000: 15-50 ms, which showed in
# the ingest API's answer times under 3,000 events/s).
BATCH_ROWS = 500
SEEN_REMOVED = "seen_message_ids"
MINUTES_REMOVED = "outcome_minutes"


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of row is kept, and how a pass paces itself.

    Attributes:
        delivered_seconds: Delivered and filtered messages, after they got there.
        failed_seconds: Failed messages, after they failed.
        seen_seconds: Remembered messageIds, after they were received (the dedupe window).
        batch_rows: Most messageIds removed per transaction.
        pause_ratio: After each read and transaction, pause this many times as long as it took (0: no pause).
    """

    delivered_seconds: float
    failed_seconds: float
    seen_seconds: float
    batch_rows: int = BATCH_ROWS
    pause_ratio: float = 1.0

    @classmethod
    def from_settings(cls, settings: WebhooksSettings | None = None) -> RetentionPolicy:
        """The policy of the ``PREFECT_WEBHOOKS_RETENTION_*`` settings and the dedupe window."""
        settings = settings or get_settings()
        return cls(delivered_seconds=settings.retention.retention_delivered,
                   failed_seconds=settings.retention.retention_failed,
                   seen_seconds=settings.dedupe_window())

    def kept_for(self, state: str) -> float:
        """Seconds a finished message in ``state`` is kept."""
        return self.failed_seconds if state == FAILED else self.delivered_seconds


@dataclass
class PruneReport:
    """What one pass did.

    Attributes:
        removed: Rows removed: per message state and ``seen_message_ids``.
        oldest_kept: Per finished state, where the oldest partition kept begins (pending: when the first is due).
        kept_for: Per finished state, the retention in seconds.
        size: The store's size after the pass.
        batches: Partitions dropped and transactions of messageIds removed.
        seconds: How long the pass took, pauses included.
        paused: How much of it the pass paused, leaving the store and the CPU to ingest and delivery.
        skipped: Why no pass ran (another process holds the lease); None when it ran.
    """

    removed: dict[str, int] = field(default_factory=dict)
    oldest_kept: dict[str, datetime | None] = field(default_factory=dict)
    kept_for: dict[str, float] = field(default_factory=dict)
    size: StoreSize | None = None
    batches: int = 0
    seconds: float = 0.0
    paused: float = 0.0
    skipped: str | None = None

    def messages_removed(self) -> int:
        """Messages removed, all states together."""
        return sum(self.removed.get(state, 0) for state in (DELIVERED, FILTERED, FAILED))

    def table(self) -> list[dict[str, Any]]:
        """One row per kind of row: removed, the oldest kept, the retention (the pass's table artifact)."""
        rows = []
        for state in (DELIVERED, FILTERED, FAILED, PENDING):
            oldest = self.oldest_kept.get(state)
            kept_for = self.kept_for.get(state)
            rows.append({
                "rows": f"{state} messages",
                "removed": self.removed.get(state, 0),
                "oldest kept": oldest.isoformat(sep=" ", timespec="seconds") if oldest else "-",
                "kept for": f"{kept_for:g} s" if kept_for is not None else "until delivered or failed",
            })
        rows.append({"rows": "remembered messageIds", "removed": self.removed.get(SEEN_REMOVED, 0),
                     "oldest kept": "-", "kept for": "the dedupe window"})
        return rows

    def summary(self) -> str:
        """One log line."""
        if self.skipped:
            return f"pruning skipped: {self.skipped}"
        removed = ", ".join(f"{count} {name}" for name, count in self.removed.items())
        size = f"; store {self.size.total_bytes / 1e6:.1f} MB ({self.size.free_bytes / 1e6:.1f} MB free for reuse, " \
               f"WAL {self.size.wal_bytes / 1e6:.1f} MB)" if self.size else ""
        return (f"pruned {removed} in {self.batches} transaction(s), {self.seconds:.1f} s ({self.paused:.1f} s of "
                f"it paused){size}")


def pass_owner() -> str:
    """A lease owner naming this process (host, pid) and this pass."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def prune_store(
    engine: Engine | None = None,
    policy: RetentionPolicy | None = None,
    *,
    now: datetime | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> PruneReport:
    """Run one pruning pass (see the module); skipped when another process is running one.

    Args:
        engine: The store; the configured one by default.
        policy: What to keep; the settings' by default.
        now: The time retention counts back from (naive UTC); the current time by default.
        sleep: How to pause between transactions.

    Returns:
        What the pass removed and kept, and the store's size after it.

    Example:
        ```python
        from prefect_webhooks.store.upkeep.retention import prune_store
        print(prune_store().summary())
        ```
    """
    engine = engine or get_engine()
    policy = policy or RetentionPolicy.from_settings()
    owner = pass_owner()
    report = PruneReport(removed=dict.fromkeys((DELIVERED, FILTERED, FAILED, SEEN_REMOVED), 0),
                         kept_for={state: policy.kept_for(state) for state in (DELIVERED, FILTERED, FAILED)})
    if not take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS):
        report.skipped = "another process is running a pruning pass on this store"
        return report
    started = time.monotonic()
    renewed = started
    now = now or store_now(engine)
    kept_for = {"delivered": policy.delivered_seconds, "failed": policy.failed_seconds}
    pacer = Pacer(ratio=policy.pause_ratio, floor=Pacer.floor if policy.pause_ratio else 0.0, sleep=sleep)
    try:
        for name in unlisted_partitions(engine):
            drop_unlisted(engine, name, pacer)
        with engine.connect() as connection:
            expired = expired_partitions(connection, kept_for, now)
        for partition in expired:
            if time.monotonic() - renewed > LEASE_SECONDS / 3:
                take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS)
                renewed = time.monotonic()
            for state, count in partition_states(engine, partition).items():
                report.removed[state] = report.removed.get(state, 0) + count
            record_user_sources(engine, partition, pacer=pacer)
            drop_partition(engine, partition, pacer)
            report.batches += 1
        for name in unlisted_periods(engine):
            drop_unlisted_period(engine, name, pacer)
        seal_periods(engine, pacer=pacer)
        seal_log_partitions(engine, pacer=pacer)
        with engine.connect() as connection:
            expired_ids = expired_periods(connection, policy.seen_seconds, now)
            legacy = SEEN.name in inspect(connection).get_table_names()
        for period in expired_ids:
            if time.monotonic() - renewed > LEASE_SECONDS / 3:
                take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS)
                renewed = time.monotonic()
            report.removed[SEEN_REMOVED] += drop_period(engine, period, pacer)
            report.batches += 1
        step = _seen_step(now - timedelta(seconds=policy.seen_seconds), policy.batch_rows)
        while legacy:
            if time.monotonic() - renewed > LEASE_SECONDS / 3:
                take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS)
                renewed = time.monotonic()
            began = time.monotonic()
            with engine.begin() as connection:
                removed = step(connection)
            report.batches += 1
            report.removed[SEEN_REMOVED] += removed
            if removed < policy.batch_rows:
                break
            sleep((time.monotonic() - began) * policy.pause_ratio)
        with engine.begin() as connection:
            report.removed[MINUTES_REMOVED] = prune_minutes(connection, now)
        report.oldest_kept = oldest_kept(engine)
        _checkpoint(engine)
        report.size = store_size(engine)
    finally:
        release_lease(engine, PRUNE_LEASE, owner)
    report.seconds = time.monotonic() - started
    report.paused = pacer.paused
    return report


def _seen_step(cutoff: datetime, limit: int) -> Callable[[Connection], int]:
    """One transaction's work for a store from before ``seen_ids``: up to ``limit`` of the messageIds in its
    ``seen_messages`` received before ``cutoff``."""

    def step(connection: Connection) -> int:
        key = tuple_(SEEN.c.source, SEEN.c.message_id)
        chosen = select(SEEN.c.source, SEEN.c.message_id).where(SEEN.c.received_at < cutoff).order_by(
            SEEN.c.received_at).limit(limit)
        return connection.execute(delete(SEEN).where(key.in_(chosen))).rowcount or 0

    return step


def oldest_kept(engine: Engine) -> dict[str, datetime | None]:
    """Per state, where what is kept begins: for finished messages the start of the oldest partition of their kind
    (a message is removed with its whole partition), for pending ones the oldest one's due time. No table scan."""
    found: dict[str, datetime | None] = {}
    with engine.connect() as connection:
        partitions = kept_partitions(connection)
        for state in (DELIVERED, FILTERED, FAILED):
            starts = [p.starts_at for p in partitions if p.kind == KIND_OF_STATE[state]]
            found[state] = min(starts) if starts else None
        value = connection.execute(select(func.min(OUTBOX.c.next_attempt_at)).where(OUTBOX.c.state == PENDING))
        found[PENDING] = read_store_time(value.scalar())
    return found


def _checkpoint(engine: Engine) -> None:
    """SQLite: copy the WAL back into the database now, so the WAL restarts small (``journal_size_limit``)."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
