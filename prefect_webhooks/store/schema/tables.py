"""The store's tables: every message, attempt, audience state and deletion request, and how times are kept.

One schema for SQLite and PostgreSQL; ``engines`` creates it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import NaiveDatetime
from sqlalchemy import JSON, BigInteger, Column, Index, Integer, LargeBinary, or_, text
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlmodel import Field, SQLModel

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.schema.clock import (
    store_now as store_now,  # the store's clock (``clock``), imported from here
)

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

# Times are kept as naive UTC (NaiveDatetime columns): one representation on SQLite and PostgreSQL. What "now" is
# when they are written and compared is the store's clock (``clock.store_now``): the database's on PostgreSQL.


class OutboxMessage(SQLModel, table=True):
    """One outbound message for one destination while it is queued: the hot queue.

    A message stays here until it is delivered, filtered or failed; then it moves to the message log
    (``message_log``), so what the queue's indexes hold is what is pending, whatever the store keeps. ``state`` is
    ``pending`` for every row (a store from before the message log is upgraded at its first start).
    """

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_due", "state", "next_attempt_at"),
        Index("ix_outbox_user", "user_id"),
        # Ordered destinations claim only a user's oldest pending message: this finds an earlier one in one probe.
        Index("ix_outbox_pending_user", "destination", "user_id", "id",
              sqlite_where=text("state = 'pending' AND user_id IS NOT NULL"),
              postgresql_where=text("state = 'pending' AND user_id IS NOT NULL")),
        # A message keeps its id in the log after it leaves the queue; SQLite would hand the highest id of an empty
        # queue out again (ids name messages to receivers), so it keeps the highest id ever given.
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(
        default=None, sa_column=Column(BIG_ID, primary_key=True, autoincrement=True)
    )
    destination: str = Field(max_length=255, description="Name of the WebhookDestination block.")
    source: str | None = Field(default=None, max_length=255, description="Name of the Source block it came from.")
    message_type: str = Field(max_length=16)
    message_id: str | None = Field(default=None, max_length=1024)
    user_id: str | None = Field(default=None, max_length=1024)
    body: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    state: str = Field(default=PENDING, max_length=16)
    reason: str | None = Field(default=None)
    attempts: int = Field(default=0)
    created_at: NaiveDatetime
    first_attempt_at: NaiveDatetime | None = None
    next_attempt_at: NaiveDatetime = Field(
        description="Pending: when the message is next due. Delivered, failed or filtered: when it got there."
    )
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: NaiveDatetime | None = None
    endpoint: str | None = Field(default=None, max_length=32, description=(
        "The one endpoint (its key) this row goes to, for a destination that delivers to each endpoint; every "
        "endpoint of the destination when unset (``delivery.batches.fan_out``)."))
    earlier_attempts: int | None = Field(default=None, description=(
        "Attempts it had before it was sent again (``messages resend``, replay): its record counts them with the new "
        "ones, while ``attempts`` and ``first_attempt_at`` (its retries and deadline) start afresh."))
    earlier_first_attempt_at: NaiveDatetime | None = Field(default=None, description=(
        "Its first attempt before it was sent again: its record keeps this time."))


class EndpointState(SQLModel, table=True):
    """What every delivery process of a store shares about one endpoint: its request budget and its health.

    A row exists only for an endpoint that is rate limited, paused by a ``Retry-After``, ramping up or failing.
    Budget times are seconds since the epoch by the database's clock (``endpoints.states`` explains them).
    """

    __tablename__ = "endpoint_states"

    destination: str = Field(primary_key=True, max_length=255)
    url_key: str = Field(primary_key=True, max_length=32, description="SHA-256 of the URL, hex, first 32 digits.")
    url: str = Field(default="", description="The URL without query or credentials, for status and events.")
    rate: float | None = Field(default=None, description="The rate limit last seen in the block (requests/s).")
    burst: int = Field(default=1)
    tat: float = Field(default=0.0, description="GCRA theoretical arrival time: when the next slot is free.")
    parked_until: float = Field(default=0.0, description="Where the next message put off for budget is placed.")
    paused_until: float = Field(default=0.0, description="No request before this (a receiver's Retry-After).")
    ramp_started_at: float = Field(default=0.0, description="When the endpoint began ramping up again.")
    ramp_start_rate: float | None = Field(default=None, description=(
        "Requests per second the ramp began from: a share of the endpoint's recent healthy rate, at least the "
        "ramp_up_start_rate setting (None: that setting)."))
    failures: int = Field(default=0, description="Requests in a row that got no 2xx.")
    failing_since: NaiveDatetime | None = None
    last_error: str | None = None
    failing_notified_at: NaiveDatetime | None = None
    disabled_at: NaiveDatetime | None = Field(default=None, description="When delivery last disabled it.")
    updated_at: NaiveDatetime


class OrderedDestination(SQLModel, table=True):
    """A destination whose block asks for ordered delivery: claims take only each user's oldest pending message."""

    __tablename__ = "ordered_destinations"

    destination: str = Field(primary_key=True, max_length=255)


class DestinationChange(SQLModel, table=True):
    """How many times a destination's block was changed by a command (enable, disable, a secret rotated) or by
    delivery (an endpoint disabled): a process whose copy is older reads it again
    (``store.endpoints.destination_changes``)."""

    __tablename__ = "destination_changes"

    destination: str = Field(primary_key=True, max_length=255)
    generation: int = Field(default=0)


class StoreIdentity(SQLModel, table=True):
    """One row: a random key naming this store, so message ids stay unique across stores (see ``store_key``)."""

    __tablename__ = "store_identity"

    id: int = Field(default=1, primary_key=True)
    key: str = Field(max_length=32)


class DeliveryAttempt(SQLModel, table=True):
    """One HTTP request (or refusal to send one) to one endpoint URL."""

    __tablename__ = "delivery_attempts"
    __table_args__ = (Index("ix_attempts_outbox", "outbox_id"),)

    id: int | None = Field(default=None, sa_column=Column(BIG_ID, primary_key=True, autoincrement=True))
    outbox_id: int = Field(sa_column=Column(BigInteger, nullable=False))
    attempted_at: NaiveDatetime
    url: str
    status_code: int | None = None
    error: str | None = None
    latency_ms: float = 0.0
    outcome: str = Field(max_length=16, description="delivered, retry or permanent.")
    response: str | None = Field(default=None, description="The start of the receiver's answer, secrets masked.")


class SeenIdPeriod(SQLModel, table=True):
    """One table of remembered messageIds: the ids received in ``[starts_at, ends_at)`` (``seen_ids``)."""

    __tablename__ = "seen_id_periods"

    name: str = Field(primary_key=True, max_length=64)
    starts_at: NaiveDatetime
    ends_at: NaiveDatetime = Field(index=True)
    ids: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True), description=(
        "How many ids it holds, counted when its filter was built; None before."))
    id_filter: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True), description=(
        "The Bloom filter over its keys (``seen_ids.KeyFilter``), built once the period is sealed."))


class Audience(SQLModel, table=True):
    """An audience or computed trait; ``key`` is fixed at creation."""

    __tablename__ = "audiences"

    key: str = Field(primary_key=True, max_length=255)
    name: str
    kind: str = Field(default="audience", max_length=32, description="audience or computed_trait.")
    sources: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: NaiveDatetime
    updated_at: NaiveDatetime
    member_count: int | None = Field(
        default=None, description="Members (or users with a value) at the last completed sync; guards empty ones."
    )
    last_synced_at: NaiveDatetime | None = Field(default=None, description="When the last sync completed.")


class AudienceState(SQLModel, table=True):
    """The last value of an audience or trait that reached the outbox, per destination and user."""

    __tablename__ = "audience_state"

    audience_key: str = Field(primary_key=True, max_length=255)
    destination: str = Field(primary_key=True, max_length=255)
    user_id: str = Field(primary_key=True, max_length=1024)
    value: str = Field(description="JSON-encoded value last sent.")


# The state of a deletion request not processed yet (the user's rows are still needed to find its sources).
DELETION_REQUESTED = "requested"


class DeletionRequest(SQLModel, table=True):
    """A request to delete a user's data, and its outcome."""

    __tablename__ = "deletion_requests"
    # Whether a request waits is one probe, however many requests were carried out before.
    __table_args__ = (Index("ix_deletion_requests_state", "state"),)

    id: int | None = Field(default=None, primary_key=True)
    user_id: str = Field(max_length=1024)
    sources: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    suppress: bool = False
    state: str = Field(default=DELETION_REQUESTED, max_length=16)
    outcome: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    created_at: NaiveDatetime
    completed_at: NaiveDatetime | None = None


class SuppressedUser(SQLModel, table=True):
    """A user whose further events are dropped at ingestion (after a deletion request asked for it)."""

    __tablename__ = "suppressed_users"

    user_id: str = Field(primary_key=True, max_length=1024)
    source: str = Field(primary_key=True, max_length=255, description="Source name, or * for every source.")
    created_at: NaiveDatetime


class OutcomeCounter(SQLModel, table=True):
    """Part of a running total of outcomes per destination; the total is the sum over ``shard``.

    Written in the transaction that records the outcomes, never decreased, untouched by pruning: a Prometheus
    counter. Several delivery processes on PostgreSQL each add to a random shard, so none waits on one hot row.
    """

    __tablename__ = "outcome_counters"

    destination: str = Field(primary_key=True, max_length=255)
    outcome: str = Field(primary_key=True, max_length=16, description="delivered, failed or filtered.")
    shard: int = Field(primary_key=True, default=0)
    count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class EndpointCounter(SQLModel, table=True):
    """Part of a running total of requests to one endpoint URL of a destination; the total is the sum over ``shard``.

    ``series`` names what is counted (``endpoint_counters`` spells them out): requests by outcome and status class,
    latency histogram buckets and the latency sum. Written in the transaction that records the outcomes, never
    decreased, untouched by pruning, sharded on PostgreSQL as ``OutcomeCounter`` is.
    """

    __tablename__ = "endpoint_counters"

    destination: str = Field(primary_key=True, max_length=255)
    url_key: str = Field(primary_key=True, max_length=32, description="SHA-256 of ``url``, hex, first 32 digits.")
    series: str = Field(primary_key=True, max_length=64)
    shard: int = Field(primary_key=True, default=0)
    url: str = Field(default="", description="The URL without query or credentials: the metrics' label.")
    count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class LogPartition(SQLModel, table=True):
    """One table of the message log: the messages of one kind that left the queue in ``[starts_at, ends_at)``."""

    __tablename__ = "message_log_partitions"

    name: str = Field(primary_key=True, max_length=64)
    kind: str = Field(max_length=16, description="delivered (delivered and filtered messages) or failed.")
    starts_at: NaiveDatetime
    ends_at: NaiveDatetime
    messages: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True), description=(
        "How many messages it holds, counted once no more can arrive (``log.partitions.kept_counts``); None before."))


class LogPartitionSeal(SQLModel, table=True):
    """What a sealed partition of the message log may hold (``log.filters``): the range of its message numbers and
    Bloom filters over its messageIds and users. A row of its own, not columns of the partition's list row: SQLite
    walks a row's whole overflow chain to read a column stored after a blob of megabytes."""

    __tablename__ = "message_log_seals"

    name: str = Field(primary_key=True, max_length=64)
    messages: int = Field(sa_column=Column(BigInteger, nullable=False), description="How many messages it held.")
    lowest_id: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True), description=(
        "Its smallest message number; None when it held none."))
    highest_id: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True), description=(
        "Its largest message number; None when it held none."))
    message_filter: bytes = Field(sa_column=Column(LargeBinary, nullable=False), description=(
        "A Bloom filter over its messageIds' keys."))
    user_filter: bytes = Field(sa_column=Column(LargeBinary, nullable=False), description=(
        "A Bloom filter over its users' keys."))


class LogName(SQLModel, table=True):
    """A destination, source or URL named by a small number in the message log's rows and records."""

    __tablename__ = "message_log_names"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)


class UserSourceKey(SQLModel, table=True):
    """A source that sent events about a user whose kept messages retention dropped, by the user's lookup key.

    Written when a message log partition is dropped (``message_log``), read by deletion requests as ``user_sources``
    is; a deletion request removes the user's rows here too.
    """

    __tablename__ = "user_source_keys"

    user_key: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    source_id: int = Field(primary_key=True, description="The source's number in ``message_log_names``.")


class UserSource(SQLModel, table=True):
    """A source that sent events about a user whose outbox rows retention has removed.

    An unscoped deletion request notifies every source that saw the user: the outbox rows tell it while they are
    kept, these rows after. A deletion request removes the user's rows here too.
    """

    __tablename__ = "user_sources"

    user_id: str = Field(primary_key=True, max_length=1024)
    source: str = Field(primary_key=True, max_length=255)


class StoreLease(SQLModel, table=True):
    """A named piece of maintenance (a pruning pass) that one process at a time may run, until ``expires_at``."""

    __tablename__ = "store_leases"

    name: str = Field(primary_key=True, max_length=64)
    owner: str = Field(max_length=128)
    expires_at: NaiveDatetime


class StoreUpgrade(SQLModel, table=True):
    """A one-time change an older store got (for instance its counters seeded from its rows), so it runs once."""

    __tablename__ = "store_upgrades"

    name: str = Field(primary_key=True, max_length=64)
    applied_at: NaiveDatetime


def free_of_lease(now: datetime) -> Any:
    """The condition on an outbox row that no live lease holds it at ``now`` (never leased, or its lease ran out)."""
    lease_expires_at = OutboxMessage.__table__.c.lease_expires_at
    return or_(lease_expires_at.is_(None), lease_expires_at < now)


def read_store_time(value: datetime | str | None) -> datetime | None:
    """A time read back from the store: SQLite hands back an aggregate (``min()``) or a ``RETURNING`` value of a
    DATETIME column as its text."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def store_time_text(value: datetime) -> str:
    """A naive-UTC time as SQLite's DATETIME columns hold it (SQLAlchemy's own text), for statements that go to the
    driver: compared as text, it must be exactly this shape."""
    return value.isoformat(sep=" ", timespec="microseconds")


def to_store_time(value: datetime) -> datetime:
    """Any datetime as naive UTC for the store."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value



def dialect_insert(connection: Connection) -> Any:
    """The store's ``insert`` construct, with ``on_conflict_do_nothing`` and ``on_conflict_do_update``."""
    return sqlite_insert if connection.dialect.name == "sqlite" else postgresql_insert


class OutcomeMinute(SQLModel, table=True):
    """Outcomes per destination and minute, for the console's charts: a counter per minute, never a scan.

    Written with the running totals (``counters.add_outcomes``) in the transaction that records the outcomes;
    pruning removes minutes older than ``minute_counts.KEPT_FOR``. On PostgreSQL a transaction adds to one of
    ``counters.SHARDS`` rows, as the totals do.
    """

    __tablename__ = "outcome_minutes"

    destination: str = Field(primary_key=True, max_length=255)
    minute: NaiveDatetime = Field(primary_key=True, description="The minute's start, naive UTC.")
    outcome: str = Field(primary_key=True, max_length=16, description="delivered, failed or filtered.")
    shard: int = Field(primary_key=True, default=0)
    count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class ReasonMinute(SQLModel, table=True):
    """Failed and filtered messages per destination, minute and kind of reason, with the newest one as a sample:
    the console's top failure reasons, read without touching a message.

    Written with ``OutcomeMinute`` in the transaction that records the outcomes (``minute_counts.add_minute_reasons``)
    and pruned with it. ``reason`` is the reason with what varies per message taken out (``minute_counts.reason_kind``).
    """

    __tablename__ = "reason_minutes"

    destination: str = Field(primary_key=True, max_length=255)
    minute: NaiveDatetime = Field(primary_key=True, description="The minute's start, naive UTC.")
    outcome: str = Field(primary_key=True, max_length=16, description="failed or filtered.")
    reason: str = Field(primary_key=True, max_length=200, description="The kind of reason (see reason_kind).")
    shard: int = Field(primary_key=True, default=0)
    count: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    sample_id: int = Field(default=0, sa_column=Column(BigInteger, nullable=False),
                           description="The newest message with this reason in this minute.")
