"""The store: the source of truth for every message, attempt, audience state and deletion request.

SQLite (WAL) by default, PostgreSQL for scale-out; the same schema and code serve both. ``create_schema`` is
idempotent, so every process may call it at start.
"""

from __future__ import annotations

import operator
import secrets
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic import NaiveDatetime
from sqlalchemy import JSON, BigInteger, Column, DateTime, Index, Integer, LargeBinary, event, insert, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Field, SQLModel, create_engine

# The states of an outbox row, defined in ``outcomes``, are importable from here too, next to the table.
from prefect_webhooks.outcomes import DELIVERED as DELIVERED
from prefect_webhooks.outcomes import FAILED as FAILED
from prefect_webhooks.outcomes import FILTERED as FILTERED
from prefect_webhooks.outcomes import PENDING
from prefect_webhooks.settings import get_settings

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

# Times are kept as naive UTC (NaiveDatetime columns): one representation on SQLite and PostgreSQL.


class OutboxMessage(SQLModel, table=True):
    """One outbound message for one destination: a row before its first attempt, then its outcome."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_due", "state", "next_attempt_at"),
        Index("ix_outbox_destination_state", "destination", "state"),
        Index("ix_outbox_user", "user_id"),
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
    next_attempt_at: NaiveDatetime
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: NaiveDatetime | None = None
    delivered_at: NaiveDatetime | None = None
    delivered_url: str | None = None


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


class SeenMessage(SQLModel, table=True):
    """A messageId accepted from a source, remembered for the dedupe window."""

    __tablename__ = "seen_messages"
    __table_args__ = (Index("ix_seen_received", "received_at"),)

    source: str = Field(primary_key=True, max_length=255)
    message_id: str = Field(primary_key=True, max_length=1024)
    received_at: NaiveDatetime


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


class DeletionRequest(SQLModel, table=True):
    """A request to delete a user's data, and its outcome."""

    __tablename__ = "deletion_requests"

    id: int | None = Field(default=None, primary_key=True)
    user_id: str = Field(max_length=1024)
    sources: list[str] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    suppress: bool = False
    state: str = Field(default="requested", max_length=16)
    outcome: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    created_at: NaiveDatetime
    completed_at: NaiveDatetime | None = None


class SuppressedUser(SQLModel, table=True):
    """A user whose further events are dropped at ingestion (after a deletion request asked for it)."""

    __tablename__ = "suppressed_users"

    user_id: str = Field(primary_key=True, max_length=1024)
    source: str = Field(primary_key=True, max_length=255, description="Source name, or * for every source.")
    created_at: NaiveDatetime


def store_now() -> datetime:
    """The current time as the store keeps times: naive UTC (identical on SQLite and PostgreSQL)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def to_store_time(value: datetime) -> datetime:
    """Any datetime as naive UTC for the store."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the API write while delivery reads; NORMAL sync is durable across a process kill.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    # 64 MB of page cache per connection instead of 2 MB: the outbox's indexes on random keys (user, messageId)
    # outgrow 2 MB after a few hundred thousand rows and every insert then rereads index pages.
    cursor.execute("PRAGMA cache_size=-65536")
    cursor.close()


def get_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: the configured store), created once per process."""
    url = url or get_settings().store.resolved_database_url()
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _make_engine(url)
            _engines[url] = engine
        return engine


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            from pathlib import Path

            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _tune_sqlite)
    else:
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        engine = create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)
    create_schema(engine)
    return engine


def create_schema(engine: Engine) -> None:
    """Create every table and index that is missing; safe to call from any number of processes."""
    if engine.dialect.name != "postgresql":
        # SQLite serialises the DDL under its write lock.
        SQLModel.metadata.create_all(engine, checkfirst=True)
        return
    with engine.begin() as connection:
        # Concurrent CREATE TABLEs race on PostgreSQL's catalog (duplicate pg_type rows): one creator at a time,
        # the lock held until this transaction commits; the others then find every table and create nothing.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7243051)")
        SQLModel.metadata.create_all(connection, checkfirst=True)


_store_keys: dict[str, str] = {}


def store_key(engine: Engine) -> str:
    """This store's random key (12 hex digits), made once when first asked for and kept in the store.

    Outbox ids restart at 1 in a new store (a fresh SQLite file, a new database): prefixed with this key they still
    never name two different messages, which a receiver deduplicating by message id relies on.
    """
    url = engine.url.render_as_string(hide_password=False)
    key = _store_keys.get(url)
    if key is not None:
        return key
    table = StoreIdentity.__table__
    with engine.begin() as connection:
        key = connection.execute(select(table.c.key).where(table.c.id == 1)).scalar()
        if key is None:
            dialect_insert = sqlite_insert if connection.dialect.name == "sqlite" else postgresql_insert
            # Concurrent first callers race to insert; whichever row landed is the store's key.
            connection.execute(dialect_insert(table).values(id=1, key=secrets.token_hex(6)).on_conflict_do_nothing())
            key = connection.execute(select(table.c.key).where(table.c.id == 1)).scalar_one()
    _store_keys[url] = key
    return key


def dispose_engines() -> None:
    """Close every pooled connection (tests and forked children call this)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _store_keys.clear()


def insert_rows(connection: Connection, table: Any, rows: Sequence[dict[str, Any]]) -> int:
    """Insert many rows of one shape into ``table`` in the caller's transaction; returns how many.

    On SQLite the rows go straight to the driver's ``executemany``: SQLAlchemy's per-row parameter processing
    (compiling each row's parameters, converting each datetime) cost more than the insert itself at 10,000+
    calls/s and more than half of a million-member audience sync. Other databases get the portable core ``insert``.
    """
    if not rows:
        return 0
    if connection.dialect.name != "sqlite":
        connection.execute(insert(table), list(rows))
        return len(rows)
    columns = list(rows[0])
    statement = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    times = [i for i, column in enumerate(columns) if isinstance(table.c[column].type, DateTime)]
    values = operator.itemgetter(*columns)
    formatted: dict[datetime, str] = {}
    parameters = []
    for row in rows:
        row_values = list(values(row)) if len(columns) > 1 else [values(row)]
        for i in times:
            moment = row_values[i]
            if moment is not None:
                text = formatted.get(moment)
                if text is None:
                    # SQLAlchemy's own SQLite DATETIME text, so every reader parses and compares it the same way.
                    text = formatted[moment] = moment.isoformat(sep=" ", timespec="microseconds")
                row_values[i] = text
        parameters.append(tuple(row_values))
    connection.exec_driver_sql(statement, parameters)
    return len(rows)
