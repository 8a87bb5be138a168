"""Engines for the store: one per URL and process, SQLite tuned for WAL, the schema created idempotently.

SQLite (WAL) by default, PostgreSQL for scale-out; the same schema and code serve both. ``create_schema`` is
idempotent, so every process may call it at start: it makes a new store, and upgrades a store an earlier release
wrote (missing tables, columns and indexes, then the steps of ``upgrades``), one process at a time. Whatever opens a
store does it, ``serve``'s processes (``get_engine``) and every command (``open_existing_store``), and the process
that upgraded says on standard error what it did and how long it took.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import SQLModel, create_engine

try:
    import fcntl
except ImportError:  # not on Windows: there, processes opening a new store at once may race (see create_schema)
    fcntl = None  # type: ignore[assignment]

from prefect_webhooks.settings import get_settings, store_location
from prefect_webhooks.store.engine.checkpointer import WAL_SIZE_LIMIT, Checkpointer
from prefect_webhooks.store.engine.file_modes import prepare_store_file
from prefect_webhooks.store.engine.upgrades import move_history_to_log, upgrade_store
from prefect_webhooks.store.engine.write_gate import GatedConnection
from prefect_webhooks.store.schema.bulk_insert import insert_rows as insert_rows  # its home before bulk_insert
from prefect_webhooks.store.schema.clock import follow_database_clock, use_as_process_clock
from prefect_webhooks.store.schema.tables import OutboxMessage, StoreIdentity, dialect_insert

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
    configured_url = get_settings().store.resolved_database_url()
    url = url or configured_url
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _make_engine(url, checkpointed=True)
            _engines[url] = engine
            path = _sqlite_file(url)
            if path:
                _checkpointers[url] = Checkpointer(path).start()
            if url == configured_url:
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


class StoreNotUpgraded(LookupError):
    """A store an earlier release wrote, which this process could not upgrade (it may not write there)."""


def open_existing_store(url: str | None = None) -> Engine:
    """The engine of the store at ``url`` (default: the configured one) if it exists, upgraded as ``serve``'s
    processes upgrade it when an earlier release wrote it; no store is created.

    Raises:
        StoreNotFound: no SQLite file there, or a database without the store's tables; the message names the
            location (a URL without its password) and the settings that choose it.
        StoreNotUpgraded: the store needs an upgrade this process cannot write; the message says why and what to
            run.
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
        raise StoreNotFound(f"cannot open the store at {where} ({_first_line(exc)}): {hint}") from None
    if not found:
        engine.dispose()
        raise StoreNotFound(f"no prefect-webhooks store at {where} (it has no {OutboxMessage.__tablename__} table): "
                            f"{hint}")
    try:
        create_schema(engine)
    except DBAPIError as exc:
        engine.dispose()
        raise StoreNotUpgraded(f"the store at {where} was written by an earlier release and this process cannot "
                               f"upgrade it ({_first_line(exc)}): run `prefect-webhooks serve`, or this command, as "
                               "a user that may write to the store") from None
    return engine


def _first_line(exc: DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__


# libpq's URL: scheme, then everything up to the path (user, password, the hosts), the path, the query.
_LIBPQ_URL = re.compile(r"^(?P<scheme>postgres(?:ql)?(?:\+psycopg)?)://(?P<netloc>[^/?#]*)(?P<path>[^?#]*)"
                        r"(?:\?(?P<query>[^#]*))?$")


def sqlalchemy_url(url: str) -> str:
    """A PostgreSQL store URL as SQLAlchemy's psycopg dialect reads it; other URLs as they are.

    People copy libpq's form, ``postgresql://user:pw@db1:5432,db2:5432/webhooks?target_session_attrs=read-write``
    (a primary and its standby: libpq connects to the one that takes writes). SQLAlchemy parses the port of that
    netloc as one integer and fails (``invalid literal for int() ... '5432,db2:5432'``); it takes several hosts as
    ``host=`` query parameters instead: ``postgresql+psycopg://user:pw@/webhooks?host=db1:5432&host=db2:5432&...``.
    ``postgresql://`` and ``postgres://`` (libpq's other scheme) get psycopg, the driver the store is tested with.
    """
    match = _LIBPQ_URL.match(url)
    if match is None:
        return url
    userinfo, at, hosts = match["netloc"].rpartition("@")
    netloc, query = match["netloc"], match["query"]
    if "," in hosts:
        netloc = userinfo + at
        query = "&".join([*(f"host={host}" for host in hosts.split(",")), *([query] if query else [])])
    return f"postgresql+psycopg://{netloc}{match['path']}" + (f"?{query}" if query is not None else "")


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
        engine = create_engine(sqlalchemy_url(url), pool_size=10, max_overflow=20, pool_pre_ping=True)
        event.listen(engine, "handle_error", _read_only_server_is_a_disconnect)
        # Times that decide ownership and due-ness come from the database's clock (``clock``).
        follow_database_clock(engine)
    if create:
        create_schema(engine)
    return engine


READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction: "cannot execute INSERT in a read-only transaction"


def _read_only_server_is_a_disconnect(context: Any) -> None:
    """A statement refused because the server takes no writes (a standby, a demoted primary) ends its connection.

    ``target_session_attrs=read-write`` keeps new connections off such a server, but a pooled connection made
    earlier stays where it is, and the pool's pre-ping (``SELECT 1``) passes on a standby: without this every retry
    of the store call would take the same connection and be refused again. Counted as a disconnect, the pool drops
    its connections and the next checkout connects anew, to the server that takes writes; the caller sees an error
    with ``connection_invalidated`` and retries it as a store that is unavailable for a moment.
    """
    if getattr(context.original_exception, "sqlstate", None) == READ_ONLY_SQLSTATE:
        context.is_disconnect = True


@dataclass
class SchemaChanges:
    """What ``create_schema`` did: made a new store, upgraded one an earlier release wrote, or nothing.

    Attributes:
        made: The store was new (it had no queue).
        upgraded: What an existing store got, one phrase a step.
        seconds: How long it took, waits for another process's upgrade not counted.
    """

    made: bool = False
    upgraded: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self, where: str) -> str:
        """One line for people: which store, how long, what was done."""
        return f"upgraded the store at {where} in {self.seconds:.2f} s: {'; '.join(self.upgraded)}"


def create_schema(engine: Engine) -> SchemaChanges:
    """Create every table and index that is missing and upgrade a store an earlier release wrote; safe to call from
    any number of processes, which make or upgrade it one at a time. An upgrade is said on standard error."""
    with _one_at_a_time(engine):
        started = time.monotonic()
        with engine.begin() as connection:
            if engine.dialect.name == "sqlite":
                # Python's sqlite3 runs DDL outside a transaction unless one is open: the queue's rebuild (rename,
                # create, copy, drop) would show other processes a store without its queue for a moment, and a kill
                # in between would leave its messages in a table nothing reads. One transaction makes the upgrade
                # all or nothing. IMMEDIATE takes the writer's turn first, so a running serve's commits cannot
                # invalidate what the upgrade read.
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            changes = _create_missing(connection)
            changes.upgraded += upgrade_store(connection)
        moved = move_history_to_log(engine)
        if moved:
            changes.upgraded.append(f"moved {moved:,} finished message(s) from the queue to the message log")
        changes.seconds = time.monotonic() - started
    if changes.upgraded and not changes.made:
        where = store_location(engine.url.set(drivername=engine.url.get_backend_name()).render_as_string())
        print(f"prefect-webhooks: {changes.summary(where)}", file=sys.stderr, flush=True)
    return changes


@contextmanager
def _one_at_a_time(engine: Engine) -> Iterator[None]:
    """Held while a process makes or upgrades the store: the others wait, then find nothing left to do.

    SQLite: Python's sqlite3 runs DDL outside a transaction, so two processes starting on a new store (serve's ingest
    API and delivery workers) could both find a table missing and both create it ("table outbox already exists"):
    an exclusive flock on the store's folder. Not on the store file itself: closing any descriptor of that file would
    drop the POSIX locks SQLite's open connections in this process hold on it. PostgreSQL: concurrent CREATE TABLEs
    race on its catalog (duplicate pg_type rows): an advisory lock of the session of a connection of its own, so
    that it also spans the history's move, a transaction a few thousand messages.
    """
    if engine.dialect.name != "postgresql":
        with _schema_lock(engine.url.database):
            yield
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as holder:
        holder.exec_driver_sql("SELECT pg_advisory_lock(7243051)")
        try:
            yield
        finally:
            holder.exec_driver_sql("SELECT pg_advisory_unlock(7243051)")


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


def _create_missing(connection: Connection) -> SchemaChanges:
    inspector = inspect(connection)
    existing = set(inspector.get_table_names())
    SQLModel.metadata.create_all(connection, checkfirst=True)
    tables = SQLModel.metadata.sorted_tables
    made = [table.name for table in tables if table.name not in existing]
    changes = SchemaChanges(made=OutboxMessage.__tablename__ in made)
    if made and not changes.made:
        changes.upgraded.append(f"created table(s) {', '.join(made)}")
    # create_all makes a table's indexes only with the table: an index added in a later release must be created on
    # a store made before it.
    # Nor does it add a column a later release gave an existing table: nullable ones are added here (a column that
    # must hold a value comes with an upgrade step that fills it, in ``upgrades``).
    columns, indexes = [], []
    for table in tables:
        if table.name not in existing:
            continue  # made whole just now, with its indexes
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                kind = column.type.compile(dialect=connection.dialect)
                connection.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}')
                columns.append(f"{table.name}.{column.name}")
        indexed = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexed:
                index.create(connection, checkfirst=True)
                indexes.append(str(index.name))
    if columns:
        changes.upgraded.append(f"added column(s) {', '.join(columns)}")
    if indexes:
        changes.upgraded.append(f"added index(es) {', '.join(indexes)}")
    return changes


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
