"""Engines for the store: one per URL and process, SQLite tuned for WAL, the schema created idempotently.

SQLite (WAL) by default, PostgreSQL for scale-out; the same schema and code serve both. ``create_schema`` is
idempotent, so every process may call it at start.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import SQLModel, create_engine

try:
    import fcntl
except ImportError:  # not on Windows: there, processes opening a new store at once may race (see create_schema)
    fcntl = None  # type: ignore[assignment]

from prefect_webhooks.settings import get_settings, store_location
from prefect_webhooks.store.bulk_insert import insert_rows as insert_rows  # its home before bulk_insert
from prefect_webhooks.store.checkpointer import WAL_SIZE_LIMIT, Checkpointer
from prefect_webhooks.store.clock import follow_database_clock, use_as_process_clock
from prefect_webhooks.store.file_modes import prepare_store_file
from prefect_webhooks.store.tables import OutboxMessage, StoreIdentity, dialect_insert
from prefect_webhooks.store.upgrades import move_history_to_log, upgrade_store
from prefect_webhooks.store.write_gate import GatedConnection

_engines: dict[str, Engine] = {}
_checkpointers: dict[str, Checkpointer] = {}
_engines_lock = threading.Lock()


def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=30000")
    # WAL lets the API write while delivery reads; NORMAL sync is durable across a process kill. Switching a new
    # store to WAL needs it alone: processes opening it at the same moment (serve's parts starting) are answered
    # "database is locked" at once, without the busy timeout, so the switch is tried again for as long.
    deadline = time.monotonic() + 30
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    # 64 MB of page cache per connection instead of 2 MB: the outbox's indexes on random keys (user, messageId)
    # outgrow 2 MB after a few hundred thousand rows and every insert then rereads index pages.
    cursor.execute("PRAGMA cache_size=-65536")
    # After a checkpoint the WAL file is cut back to 64 MB: a burst (a pruning pass, a replay) does not leave a
    # WAL as big as its peak for the life of the store.
    cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    cursor.close()


def get_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: the configured store), created once per process. The configured store's
    clock becomes the process's store clock (``clock.store_now``)."""
    configured = url is None
    url = url or get_settings().store.resolved_database_url()
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _make_engine(url, checkpointed=True)
            _engines[url] = engine
            path = _sqlite_file(url)
            if path:
                _checkpointers[url] = Checkpointer(path).start()
            if configured or url == get_settings().store.resolved_database_url():
                use_as_process_clock(engine)
        return engine


def _sqlite_file(url: str) -> str | None:
    path = url.split("///", 1)[-1] if url.startswith("sqlite") and "///" in url else ""
    return path if path and path != ":memory:" else None


def _no_autocheckpoint(dbapi_connection: Any, _record: Any) -> None:
    """The engine's ``Checkpointer`` copies the WAL back, not the commits (see ``checkpointer``)."""
    dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")


class StoreNotFound(LookupError):
    """No store where the settings point: ``open_existing_store`` looked and creates nothing."""


def open_existing_store(url: str | None = None) -> Engine:
    """The engine of the store at ``url`` (default: the configured one) if it exists; nothing is created.

    Raises:
        StoreNotFound: no SQLite file there, or a database without the store's tables; the message names the
            location (a URL without its password) and the settings that choose it.
    """
    url = url or get_settings().store.resolved_database_url()
    where = store_location(url)
    creates = "creates it" if url.startswith("sqlite") else "creates its tables in an existing database"
    hint = (f"`prefect-webhooks serve` {creates}; the store is PREFECT_WEBHOOKS_DATABASE_URL, or webhooks.db in "
            "PREFECT_WEBHOOKS_HOME (~/.prefect-webhooks by default)")
    if url.startswith("sqlite") and not Path(url.split("///", 1)[-1]).is_file():
        raise StoreNotFound(f"no store at {where}: {hint}")
    engine = _make_engine(url, create=False)
    try:
        found = inspect(engine).has_table(OutboxMessage.__tablename__)
    except OperationalError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        raise StoreNotFound(f"cannot open the store at {where} ({reason}): {hint}") from None
    if not found:
        engine.dispose()
        raise StoreNotFound(f"no prefect-webhooks store at {where} (it has no {OutboxMessage.__tablename__} table): "
                            f"{hint}")
    return engine


def _make_engine(url: str, *, create: bool = True, checkpointed: bool = False) -> Engine:
    if url.startswith("sqlite"):
        path = _sqlite_file(url)
        if create and path:
            prepare_store_file(Path(path))
        # Write transactions take SQLite's one writer in turn (``write_gate``), not by its busy handler's polls.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30,
                                                  "factory": GatedConnection})
        event.listen(engine, "connect", _tune_sqlite)
        if checkpointed and path:
            event.listen(engine, "connect", _no_autocheckpoint)
    else:
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        engine = create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)
        # Times that decide ownership and due-ness come from the database's clock (``clock``).
        follow_database_clock(engine)
    if create:
        create_schema(engine)
    return engine


def create_schema(engine: Engine) -> None:
    """Create every table and index that is missing; safe to call from any number of processes."""
    if engine.dialect.name != "postgresql":
        # Python's sqlite3 runs DDL outside a transaction, so two processes starting on a new store (serve's ingest
        # API and delivery workers) could both find a table missing and both create it ("table outbox already
        # exists"). One creator at a time: an exclusive flock on the store's folder, held while the tables are
        # checked and made. Not on the store file itself: closing any descriptor of that file would drop the POSIX
        # locks SQLite's open connections in this process hold on it.
        with _schema_lock(engine.url.database), engine.begin() as connection:
            _create_missing(connection)
            upgrade_store(connection)
        move_history_to_log(engine)
        return
    with engine.begin() as connection:
        # Concurrent CREATE TABLEs race on PostgreSQL's catalog (duplicate pg_type rows): one creator at a time,
        # the lock held until this transaction commits; the others then find every table and create nothing.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7243051)")
        _create_missing(connection)
        upgrade_store(connection)
    move_history_to_log(engine)


@contextmanager
def _schema_lock(database: str | None) -> Iterator[None]:
    if fcntl is None or not database or database == ":memory:" or not Path(database).exists():
        yield
        return
    descriptor = os.open(Path(database).resolve().parent, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # the flock ends with the descriptor


def _create_missing(connection: Connection) -> None:
    SQLModel.metadata.create_all(connection, checkfirst=True)
    # create_all makes a table's indexes only with the table: an index added in a later release must be created on
    # a store made before it.
    # Nor does it add a column a later release gave an existing table: nullable ones are added here (a column that
    # must hold a value comes with an upgrade step that fills it, in ``upgrades``).
    inspector = inspect(connection)
    for table in SQLModel.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                kind = column.type.compile(dialect=connection.dialect)
                connection.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}')
        for index in table.indexes:
            index.create(connection, checkfirst=True)


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
            # Concurrent first callers race to insert; whichever row landed is the store's key.
            first = dialect_insert(connection)(table).values(id=1, key=secrets.token_hex(6))
            connection.execute(first.on_conflict_do_nothing())
            key = connection.execute(select(table.c.key).where(table.c.id == 1)).scalar_one()
    _store_keys[url] = key
    return key


def dispose_engines() -> None:
    """Close every pooled connection (tests and forked children call this)."""
    with _engines_lock:
        for checkpointer in _checkpointers.values():
            checkpointer.stop()
        _checkpointers.clear()
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _store_keys.clear()
        use_as_process_clock(None)
