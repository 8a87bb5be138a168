"""Remembered messageIds, for the dedupe window: one table per period, and a filter over each sealed one.

What a call's dedupe reads and writes is bounded by the window's structure, not by how many ids it holds:

- An id is remembered in the table of the period that holds its receipt (``seen_ids_<start>_<seconds>``, listed in
  ``seen_id_periods``) as a 16-byte key (BLAKE2b of source and messageId: the same id from two sources is two keys)
  with its receipt time. A period is short enough to hold about ``IDS_PER_PERIOD`` ids at the rate the one before it
  filled, so the key index that every insert lands in at random stays small enough to be cached, whatever the
  window holds.
- A period that ended ``SEALED_AFTER`` ago gets no more ids. Its filter (a Bloom filter over its keys, 16 to 32
  bits per id, about 1 false hit in 3,000 keys or fewer) is built once, kept in its list row, and held in memory
  by each process that dedupes: for a new id, nearly every call, it answers "not here" without reading the table.
  Only the filters' hits, and the few periods still open, are looked up in their tables.
- Retention drops a period whole once all of it is older than the window and ``SEALED_AFTER`` more (no call still
  looks at it then); nothing is deleted row by row.
- A store from before these tables keeps its ``seen_messages`` until retention has emptied it, and until then it is
  looked up as well.

A process that dedupes holds the filters in memory, 2 to 3 bytes per remembered id (about 200 MB for a day at
1,000 events/s), as Segment's bloom filters over its four-week window are held.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    case,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateTable

from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.log.key_filters import FilterSet, KeyFilter, Probe
from prefect_webhooks.store.log.pacing import Pacer, paced
from prefect_webhooks.store.log.partitions import PERIODS, period_bounds, period_for_rate
from prefect_webhooks.store.schema.driver import driver_executemany, driver_rows
from prefect_webhooks.store.schema.tables import (
    SeenIdPeriod,
    dialect_insert,
    read_store_time,
    store_now,
    store_time_text,
)

logger = logging.getLogger("prefect_webhooks.store.seen_ids")  # its name before store/dedupe/

PERIOD_LIST = SeenIdPeriod.__table__
IDS_PER_PERIOD = 2_000_000
SEALED_AFTER = timedelta(minutes=5)
# Whether a store from before these tables still holds ids in ``seen_messages`` is asked again this often.
LIST_SECONDS = 10.0
_IN_CHUNK = 500
_EPOCH = datetime(1970, 1, 1)

_legacy_metadata = MetaData()
LEGACY = Table("seen_messages", _legacy_metadata, Column("source", String(255), primary_key=True),
               Column("message_id", String(1024), primary_key=True), Column("received_at", DateTime))
_tables_metadata = MetaData()
_tables: dict[str, Table] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=1 << 15)  # a call looks its ids up, then remembers the new ones: one hash each
def message_key(source: str, message_id: str) -> bytes:
    """The key an id is remembered by: 16 bytes of BLAKE2b over the source and the messageId."""
    return hashlib.blake2b(f"{source}\0{message_id}".encode(), digest_size=16).digest()


def period_table(name: str) -> Table:
    """The table of one period (the same shape for every one)."""
    with _lock:
        table = _tables.get(name)
        if table is None:
            table = Table(name, _tables_metadata, Column("key", LargeBinary(16), primary_key=True),
                          Column("received_ms", BigInteger, nullable=False), sqlite_with_rowid=False)
            _tables[name] = table
        return table


def _ms(moment: datetime) -> int:
    return int((moment - _EPOCH).total_seconds() * 1000)


@dataclass(frozen=True)
class Period:
    """A period of remembered ids, as ``seen_id_periods`` lists it."""

    name: str
    starts_at: datetime
    ends_at: datetime
    has_filter: bool = False

    @property
    def table(self) -> Table:
        return period_table(self.name)


@dataclass
class _Memory:
    """What one process holds for one store: the sealed periods' filters, and whether legacy ids remain."""

    listed_at: float = float("-inf")
    filters: FilterSet = field(default_factory=FilterSet)
    legacy: bool | None = None
    sealing: bool = False


# Per engine, not per URL: a store made anew at the same place (a test's, or after ``dispose_engines``) starts empty.
_memory: weakref.WeakKeyDictionary[Engine, _Memory] = weakref.WeakKeyDictionary()


# Built once: made anew on every call, the statement and its cache key cost SQLAlchemy ten times the query (a tenth
# of the ingest API's CPU at 2,500 events/s: it runs twice per group commit). Whether a period has its filter is a
# CASE: SQLite reads a whole 2 MB blob for ``id_filter IS NOT NULL`` as a result column (23 ms a call with 50
# periods), not for the CASE.
_LIST_ALL = select(PERIOD_LIST.c.name, PERIOD_LIST.c.starts_at, PERIOD_LIST.c.ends_at,
                   case((PERIOD_LIST.c.id_filter.is_(None), 0), else_=1)).order_by(PERIOD_LIST.c.starts_at)
_LIST_ENDING_AFTER = _LIST_ALL.where(
    PERIOD_LIST.c.ends_at > bindparam("ending_after", type_=PERIOD_LIST.c.ends_at.type))


# The same list for SQLite, straight to the driver: it runs twice in every group commit of the ingest API, where
# SQLAlchemy's execution of the built statement cost four times the query (a fifth of a one-call commit).
_SQLITE_LIST_ENDING_AFTER = (
    f"SELECT name, starts_at, ends_at, CASE WHEN id_filter IS NULL THEN 0 ELSE 1 END FROM {PERIOD_LIST.name} "
    "WHERE ends_at > ? ORDER BY starts_at")


def _listed(connection: Connection, *, ending_after: datetime | None = None) -> list[Period]:
    if ending_after is not None and connection.dialect.name == "sqlite":
        return [Period(name, read_store_time(starts_at), read_store_time(ends_at), bool(sealed))
                for name, starts_at, ends_at, sealed in driver_rows(
                    connection, _SQLITE_LIST_ENDING_AFTER, (store_time_text(ending_after),))]
    rows = (connection.execute(_LIST_ALL) if ending_after is None
            else connection.execute(_LIST_ENDING_AFTER, {"ending_after": ending_after}))
    return [Period(name, starts_at, ends_at, bool(sealed)) for name, starts_at, ends_at, sealed in rows]


def _periods(connection: Connection, memory: _Memory, since: datetime) -> list[Period]:
    """The periods that may hold a receipt at or after ``since``, read in the caller's transaction (a period made
    by another process, or by this transaction, is seen at once; one that rolled back, never). A few hundred rows
    at most: a period holds about ``IDS_PER_PERIOD`` ids."""
    periods = _listed(connection, ending_after=since)
    for name in memory.filters.names() - {p.name for p in periods if p.has_filter}:
        memory.filters.discard(name)  # dropped by retention, or past ``since``
    if memory.legacy is not False and time.monotonic() - memory.listed_at > LIST_SECONDS:
        memory.listed_at = time.monotonic()
        memory.legacy = (LEGACY.name in _table_names(connection) and
                         connection.execute(select(LEGACY.c.source).limit(1)).first() is not None)
    return periods


def _table_names(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _load_filters(connection: Connection, memory: _Memory, periods: Iterable[Period]) -> bool:
    """Load the kept filters of sealed periods not yet in memory; True when a sealed period has had none for longer
    than a pruning pass takes to come (``serve``'s pruner builds them; without it, the caller's process does)."""
    wanted = [p.name for p in periods if p.has_filter and p.name not in memory.filters]
    for start in range(0, len(wanted), 50):
        for name, data in connection.execute(select(PERIOD_LIST.c.name, PERIOD_LIST.c.id_filter).where(
                PERIOD_LIST.c.name.in_(wanted[start:start + 50]))):
            if data is not None:
                memory.filters.add(name, KeyFilter.from_bytes(bytes(data)))
    overdue = store_now() - SEALED_AFTER - timedelta(seconds=get_settings().retention.retention_interval + 60)
    return any(not p.has_filter and p.ends_at < overdue for p in periods)


def seen_receipts(
    connection: Connection, source: str, message_ids: Sequence[str], since: datetime
) -> dict[str, datetime]:
    """The latest receipt of each of ``message_ids`` from ``source`` remembered at or after ``since`` (naive UTC)."""
    if not message_ids:
        return {}
    with _lock:
        memory = _memory.setdefault(connection.engine, _Memory())
    keys = {message_key(source, message_id): message_id for message_id in set(message_ids)}
    ordered = list(keys)
    periods = _periods(connection, memory, since)
    if _load_filters(connection, memory, periods):
        _seal_in_background(connection.engine, memory)
    found_ms: dict[bytes, int] = {}
    hits = memory.filters.candidates(Probe(ordered)) if memory.filters.names() else {}
    for period in periods:
        candidates = ([ordered[position] for position in hits.get(period.name, ())] if period.name in memory.filters
                      else ordered)
        for key, received_ms in _look_up(connection, period.table, candidates):
            found_ms[bytes(key)] = max(received_ms, found_ms.get(bytes(key), received_ms))
    found = {keys[key]: _EPOCH + timedelta(milliseconds=ms) for key, ms in found_ms.items()}
    if memory.legacy:
        for chunk in _chunks(sorted(set(message_ids))):
            for message_id, received_at in connection.execute(select(LEGACY.c.message_id, LEGACY.c.received_at).where(
                    LEGACY.c.source == source, LEGACY.c.message_id.in_(chunk), LEGACY.c.received_at >= since)):
                if message_id not in found or found[message_id] < received_at:
                    found[message_id] = received_at
    return found


def _chunks(values: Sequence[Any], size: int = _IN_CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _look_up(connection: Connection, table: Table, keys: Sequence[bytes]) -> list[tuple[bytes, int]]:
    rows: list[tuple[bytes, int]] = []
    for chunk in _chunks(keys):
        if connection.dialect.name == "sqlite":
            # Straight to the driver: SQLAlchemy's expanding IN cost more than the lookup itself.
            statement = f'SELECT key, received_ms FROM "{table.name}" WHERE key IN ({", ".join("?" * len(chunk))})'
            rows.extend(driver_rows(connection, statement, tuple(chunk)))
        else:
            rows.extend(connection.execute(select(table.c.key, table.c.received_ms).where(table.c.key.in_(chunk))))
    return rows


def remember_receipts(connection: Connection, source: str, receipts: Sequence[tuple[str, datetime]]) -> None:
    """Remember each (messageId, naive-UTC receipt) from ``source`` in the caller's transaction."""
    if not receipts:
        return
    by_period: dict[str, list[tuple[bytes, int]]] = {}
    listed = _listed(connection, ending_after=min(received for _, received in receipts))
    period_of: dict[datetime, str] = {}
    for message_id, received in receipts:
        name = period_of.get(received)
        if name is None:
            period = next((p for p in listed if p.starts_at <= received < p.ends_at), None)
            if period is None:
                period = _period_for(connection, received)
                listed.append(period)
            name = period_of[received] = period.name
        by_period.setdefault(name, []).append((message_key(source, message_id), _ms(received)))
    for name, rows in by_period.items():
        table = period_table(name)
        if connection.dialect.name == "sqlite":
            driver_executemany(connection, f'INSERT OR REPLACE INTO "{name}" (key, received_ms) VALUES (?, ?)', rows)
        else:
            statement = dialect_insert(connection)(table)
            connection.execute(statement.on_conflict_do_update(
                index_elements=[table.c.key], set_={"received_ms": statement.excluded.received_ms}),
                [{"key": key, "received_ms": ms} for key, ms in rows])


def _period_for(connection: Connection, at: datetime) -> Period:
    """The period of ``at`` that the caller did not find listed: made here, unless another process just made it."""
    if connection.dialect.name == "postgresql":
        # Concurrent CREATE TABLE IF NOT EXISTS still race on the catalog: one creator at a time, until commit.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7243053)")
    known = _listed(connection)
    for period in known:
        if period.starts_at <= at < period.ends_at:
            return period
    earlier = [p for p in known if p.starts_at <= at]
    previous = max(earlier, key=lambda p: p.ends_at) if earlier else None
    return _new_period(connection, at, _period_after(connection, previous), previous)


def _period_after(connection: Connection, previous: Period | None) -> int:
    """The longest period, at most a quarter of the window, that would have held at most ``IDS_PER_PERIOD`` ids at
    the rate the previous period filled (the shortest for the first)."""
    if previous is None:
        return PERIODS[0]
    counted = select(previous.table.c.key).limit(IDS_PER_PERIOD * 4).subquery()
    ids = connection.execute(select(func.count()).select_from(counted)).scalar_one()
    return period_for_rate(ids, previous.ends_at - previous.starts_at, get_settings().dedupe_window() / 4,
                           IDS_PER_PERIOD)


def _new_period(connection: Connection, at: datetime, seconds: int, previous: Period | None) -> Period:
    start, end = period_bounds(at, seconds, previous.ends_at if previous is not None else None)
    period = Period(f"seen_ids_{start:%Y%m%d%H%M%S}_{int((end - start).total_seconds())}", start, end)
    connection.execute(CreateTable(period.table, if_not_exists=True))
    connection.execute(dialect_insert(connection)(PERIOD_LIST).values(
        name=period.name, starts_at=start, ends_at=end).on_conflict_do_nothing())
    return period


def _seal_in_background(engine: Engine, memory: _Memory) -> None:
    """Build the missing filters in a thread of their own: reading a period's keys and building its filter takes
    seconds for a few million ids, too long for a call's transaction. Until then the calls look those periods up in
    their tables."""
    with _lock:
        if memory.sealing:
            return
        memory.sealing = True

    def seal() -> None:
        try:
            seal_periods(engine)
        except Exception as exc:  # the calls go on looking the periods up; the next call tries again
            logger.warning("building the dedupe filters failed: %s", type(exc).__name__)
        finally:
            memory.sealing = False

    threading.Thread(target=seal, name="seal-seen-ids", daemon=True).start()


def seal_periods(engine: Engine, now: datetime | None = None, pacer: Pacer | None = None) -> int:
    """Build and keep the filter of every sealed period that has none (each a step of ``pacer``); returns how many
    were built."""
    sealed_before = (now or store_now(engine)) - SEALED_AFTER
    with engine.connect() as connection:
        waiting = [p for p in _listed(connection) if p.ends_at <= sealed_before and not p.has_filter]
    for period in waiting:
        with paced(pacer), engine.connect() as connection:
            keys = [bytes(key) for key in connection.execute(select(period.table.c.key)).scalars()]
            built = KeyFilter.of_keys(keys)
        with paced(pacer), engine.begin() as connection:
            connection.execute(update(PERIOD_LIST).where(PERIOD_LIST.c.name == period.name,
                                                         PERIOD_LIST.c.id_filter.is_(None))
                               .values(ids=len(keys), id_filter=built.to_bytes()))
    return len(waiting)


def expired_periods(connection: Connection, window_seconds: float, now: datetime) -> list[Period]:
    """Periods no call looks at any more: all of each older than the window and ``SEALED_AFTER`` more."""
    cutoff = now - timedelta(seconds=window_seconds) - SEALED_AFTER
    return [period for period in _listed(connection) if period.ends_at <= cutoff]


def drop_period(engine: Engine, period: Period, pacer: Pacer | None = None) -> int:
    """Take a period out of the list, then drop its table, a transaction each; returns the ids it held.

    Its table is counted first, outside any write: SQLite reads every page of a table it drops, with the write lock
    held, and a period's pages are cold by the time it expires (1.6 s for one of 2.7M ids read from disk, 0.08 s for
    one read just before). Each of the three is a step of ``pacer``.
    """
    with paced(pacer), engine.connect() as connection:
        counted = connection.execute(select(func.count()).select_from(period.table)).scalar_one()
        held = connection.execute(select(PERIOD_LIST.c.ids).where(PERIOD_LIST.c.name == period.name)).scalar()
    with paced(pacer), engine.begin() as connection:
        connection.execute(PERIOD_LIST.delete().where(PERIOD_LIST.c.name == period.name))
    drop_unlisted_period(engine, period.name, pacer)
    return int(counted if held is None else held)


def drop_unlisted_period(engine: Engine, name: str, pacer: Pacer | None = None) -> None:
    """Drop the table of a period no longer in the list."""
    with paced(pacer), engine.begin() as connection:
        connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')


def unlisted_periods(engine: Engine) -> list[str]:
    """Period tables the list no longer names (a pass stopped between its two steps)."""
    with engine.connect() as connection:
        listed = set(connection.execute(select(PERIOD_LIST.c.name)).scalars())
        return sorted(name for name in _table_names(connection) - listed if name.startswith("seen_ids_"))


def remembered_ids(engine: Engine) -> int:
    """How many ids the window holds: sealed periods by their kept count, the few open ones counted, and the ids a
    store from before these tables still holds in ``seen_messages`` (until retention has emptied it)."""
    total = 0
    with engine.connect() as connection:
        for name, ids in connection.execute(select(PERIOD_LIST.c.name, PERIOD_LIST.c.ids)).all():
            total += ids if ids is not None else connection.execute(
                select(func.count()).select_from(period_table(name))).scalar_one()
        if LEGACY.name in _table_names(connection):
            total += connection.execute(select(func.count()).select_from(LEGACY)).scalar_one()
    return total


def hold_seen_filters(engine: Engine) -> int:
    """Read the filters of the window's sealed periods into this process now, as its first dedupe would (about
    100 MB with 50M ids in the window): a process that ingests does it before it takes a call, so the first calls
    after a start do not wait for it. Returns how many filters the process holds."""
    with _lock:
        memory = _memory.setdefault(engine, _Memory())
    with engine.connect() as connection:
        since = store_now() - timedelta(seconds=get_settings().dedupe_window())
        _load_filters(connection, memory, _periods(connection, memory, since))
    return len(memory.filters.names())
