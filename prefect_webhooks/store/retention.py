"""Retention: the store removes what it no longer needs to keep, so it stops growing under a constant load.

One pruning pass removes, oldest first:

- delivered and filtered messages that got there more than ``retention_delivered`` ago, failed ones after
  ``retention_failed`` (a finished row's ``next_attempt_at`` is when it finished; the due index finds them), each
  with its attempt records; the (user, source) pairs of the removed rows go to ``user_sources``, so an unscoped
  deletion request still finds every source that saw the user;
- messageIds remembered for deduplication longer than the dedupe window;
- the console's per-minute outcome counts older than a day (``minute_counts``).

Never a pending message, and never a row of a user whose deletion request is still waiting: processing it needs
them. The work is done in transactions of at most ``batch_rows`` messages, each followed by a pause as long as it
took, so ingestion and delivery keep the write lock at least half the time. One pass at a time per store, across
processes and hosts (the ``prune`` lease). Freed pages are reused by new rows (SQLite keeps them in the file, free;
PostgreSQL's autovacuum marks them reusable), so the files level off instead of growing.
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

from sqlalchemy import delete, func, or_, select, tuple_
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.settings import WebhooksSettings, get_settings
from prefect_webhooks.store.engines import get_engine
from prefect_webhooks.store.footprint import StoreSize, store_size
from prefect_webhooks.store.leases import release_lease, take_lease
from prefect_webhooks.store.minute_counts import prune_minutes
from prefect_webhooks.store.tables import (
    DELETION_REQUESTED,
    DeletionRequest,
    DeliveryAttempt,
    OutboxMessage,
    SeenMessage,
    UserSource,
    dialect_insert,
    store_now,
)

OUTBOX = OutboxMessage.__table__
ATTEMPTS = DeliveryAttempt.__table__
SEEN = SeenMessage.__table__
USER_SOURCES = UserSource.__table__
REQUESTS = DeletionRequest.__table__
PRUNE_LEASE = "prune"
LEASE_SECONDS = 120.0
# Messages per transaction: a batch of 500 holds SQLite's write lock for 5-30 ms (2,000: 15-50 ms, which showed in
# the ingest API's answer times under 3,000 events/s).
BATCH_ROWS = 500
ATTEMPTS_REMOVED = "attempts"
SEEN_REMOVED = "seen_message_ids"
MINUTES_REMOVED = "outcome_minutes"


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of row is kept, and how a pass paces itself.

    Attributes:
        delivered_seconds: Delivered and filtered messages, after they got there.
        failed_seconds: Failed messages, after they failed.
        seen_seconds: Remembered messageIds, after they were received (the dedupe window).
        batch_rows: Most messages (or messageIds) removed per transaction.
        pause_ratio: After each transaction, pause this many times as long as it took.
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
        removed: Rows removed: per message state, ``attempts`` and ``seen_message_ids``.
        oldest_kept: Per state, when the oldest message still kept got there (pending: when the first is due).
        kept_for: Per finished state, the retention in seconds.
        size: The store's size after the pass.
        batches: Transactions the pass used.
        seconds: How long the pass took, pauses included.
        skipped: Why no pass ran (another process holds the lease); None when it ran.
    """

    removed: dict[str, int] = field(default_factory=dict)
    oldest_kept: dict[str, datetime | None] = field(default_factory=dict)
    kept_for: dict[str, float] = field(default_factory=dict)
    size: StoreSize | None = None
    batches: int = 0
    seconds: float = 0.0
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
        rows.append({"rows": "attempt records", "removed": self.removed.get(ATTEMPTS_REMOVED, 0),
                     "oldest kept": "-", "kept for": "with their message"})
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
        return f"pruned {removed} in {self.batches} transaction(s), {self.seconds:.1f} s{size}"


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
        from prefect_webhooks.store.retention import prune_store
        print(prune_store().summary())
        ```
    """
    engine = engine or get_engine()
    policy = policy or RetentionPolicy.from_settings()
    owner = pass_owner()
    report = PruneReport(removed=dict.fromkeys((DELIVERED, FILTERED, FAILED, ATTEMPTS_REMOVED, SEEN_REMOVED), 0),
                         kept_for={state: policy.kept_for(state) for state in (DELIVERED, FILTERED, FAILED)})
    if not take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS):
        report.skipped = "another process is running a pruning pass on this store"
        return report
    started = time.monotonic()
    renewed = started
    now = now or store_now()
    steps: list[tuple[str, Callable[[Connection], int]]] = [
        (state, _message_step(state, now - timedelta(seconds=policy.kept_for(state)), policy.batch_rows, report))
        for state in (DELIVERED, FILTERED, FAILED)
    ]
    steps.append((SEEN_REMOVED, _seen_step(now - timedelta(seconds=policy.seen_seconds), policy.batch_rows)))
    try:
        for name, step in steps:
            while True:
                if time.monotonic() - renewed > LEASE_SECONDS / 3:
                    take_lease(engine, PRUNE_LEASE, owner, LEASE_SECONDS)
                    renewed = time.monotonic()
                began = time.monotonic()
                with engine.begin() as connection:
                    removed = step(connection)
                report.batches += 1
                report.removed[name] = report.removed.get(name, 0) + removed
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
    return report


def _message_step(state: str, cutoff: datetime, limit: int, report: PruneReport) -> Callable[[Connection], int]:
    """One transaction's work for ``state``: up to ``limit`` messages that finished before ``cutoff``."""
    under_deletion = select(REQUESTS.c.user_id).where(REQUESTS.c.state == DELETION_REQUESTED)

    def step(connection: Connection) -> int:
        chosen = (
            select(OUTBOX.c.id)
            .where(OUTBOX.c.state == state, OUTBOX.c.next_attempt_at < cutoff,
                   or_(OUTBOX.c.user_id.is_(None), OUTBOX.c.user_id.not_in(under_deletion)))
            .order_by(OUTBOX.c.next_attempt_at)
            .limit(limit)
        )
        if connection.dialect.name == "postgresql":
            # Rows another transaction holds (a replay, a purge) are left for the next pass: never a lock wait. The
            # choice is materialized once: as a plain ``IN (subquery)`` PostgreSQL may run it again inside the
            # join, and a locking LIMIT subquery run twice removes more than ``limit`` rows.
            chosen = chosen.with_for_update(skip_locked=True)
        picked = chosen.cte("chosen").prefix_with("MATERIALIZED")
        # By id alone: the choice is made in this statement, so the rows still have ``state``. A ``state = ?`` term
        # here let SQLite read every row of that state through the due index (0.6 s with 5M delivered rows kept)
        # while holding the write lock.
        removed = connection.execute(
            delete(OUTBOX).where(OUTBOX.c.id.in_(select(picked.c.id)))
            .returning(OUTBOX.c.id, OUTBOX.c.user_id, OUTBOX.c.source)
        ).all()
        if not removed:
            return 0
        attempts = connection.execute(delete(ATTEMPTS).where(ATTEMPTS.c.outbox_id.in_([row[0] for row in removed])))
        report.removed[ATTEMPTS_REMOVED] = report.removed.get(ATTEMPTS_REMOVED, 0) + attempts.rowcount
        pairs = sorted({(row[1], row[2]) for row in removed if row[1] is not None and row[2] is not None})
        if pairs:
            connection.execute(dialect_insert(connection)(USER_SOURCES).on_conflict_do_nothing(),
                               [{"user_id": user_id, "source": source} for user_id, source in pairs])
        return len(removed)

    return step


def _seen_step(cutoff: datetime, limit: int) -> Callable[[Connection], int]:
    """One transaction's work for remembered messageIds: up to ``limit`` received before ``cutoff``."""

    def step(connection: Connection) -> int:
        key = tuple_(SEEN.c.source, SEEN.c.message_id)
        chosen = select(SEEN.c.source, SEEN.c.message_id).where(SEEN.c.received_at < cutoff).order_by(
            SEEN.c.received_at).limit(limit)
        return connection.execute(delete(SEEN).where(key.in_(chosen))).rowcount or 0

    return step


def oldest_kept(engine: Engine) -> dict[str, datetime | None]:
    """Per state, the time the oldest message kept got there (pending: the oldest one's due time); one index
    lookup each."""
    found: dict[str, datetime | None] = {}
    with engine.connect() as connection:
        for state in (DELIVERED, FILTERED, FAILED, PENDING):
            value = connection.execute(select(func.min(OUTBOX.c.next_attempt_at)).where(OUTBOX.c.state == state))
            found[state] = _as_datetime(value.scalar())
    return found


def _as_datetime(value: datetime | str | None) -> datetime | None:
    # SQLite hands back min() over a datetime column as text.
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _checkpoint(engine: Engine) -> None:
    """SQLite: copy the WAL back into the database now, so the WAL restarts small (``journal_size_limit``)."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
