"""The message log's partitions: one table per kind and period, listed in ``message_log_partitions``.

A message that leaves the queue goes to the partition of its kind (``delivered`` holds delivered and filtered
messages, ``failed`` the failed ones: each kind has its own retention) whose period holds its finish time; the first
transaction that needs a partition makes it. A period (``PERIODS``: a minute to a day) is at most a quarter of the
kind's retention, so retention, which drops a partition whole once all of its period is older than the retention,
keeps a message for its retention and at most a quarter more; and short enough that a partition holds about
``ROWS_PER_PARTITION`` messages at the rate the last one filled. Before a partition goes, its (user, source) pairs
are kept by user key, so an unscoped deletion request still finds every source that saw the user.

A process remembers only partitions it read as committed, and consults that list only for recent times (an older
partition may have been dropped by retention since), so a rolled-back batch never leaves it believing in a table
that does not exist.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    delete,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.schema import CreateIndex, CreateTable

from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.log.pacing import Pacer, paced
from prefect_webhooks.store.schema.tables import (
    LogPartition,
    LogPartitionSeal,
    UserSourceKey,
    dialect_insert,
    store_now,
)

PARTITIONS = LogPartition.__table__
SEALS = LogPartitionSeal.__table__
USER_SOURCE_KEYS = UserSourceKey.__table__

# Which partitions a finished state goes to: the kinds have their own retention.
KIND_OF_STATE = {DELIVERED: "delivered", FILTERED: "delivered", FAILED: "failed"}
STATES_OF_KIND = {"delivered": (DELIVERED, FILTERED), "failed": (FAILED,)}
# A kept message's state, as a small number in its row.
STATE_CODES = {DELIVERED: 1, FILTERED: 2, FAILED: 3}
STATE_OF_CODE = {code: state for state, code in STATE_CODES.items()}
PERIODS = (60, 120, 180, 300, 600, 900, 1800, 3600, 7200, 6 * 3600, 12 * 3600, 86400)
# A partition's indexes on random keys (messageId, user) take a new page for most inserts once they outgrow the
# cache: its period is kept short enough that it holds about this many messages at the rate the last one filled, so
# what an insert costs follows the rate, not the retention or what is kept.
ROWS_PER_PARTITION = 1_000_000

_tables_metadata = MetaData()
_tables: dict[str, Table] = {}
_lock = threading.Lock()


def partition_period(kept_for: float) -> int:
    """The period of new partitions for a kind kept ``kept_for`` seconds (see the module)."""
    fitting = [period for period in PERIODS if period * 4 <= kept_for]
    return fitting[-1] if fitting else PERIODS[0]


def partition_table(name: str) -> Table:
    """The table object of a partition (the same shape for every one)."""
    with _lock:
        table = _tables.get(name)
        if table is None:
            table = Table(
                name, _tables_metadata,
                Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=False),
                Column("destination_id", Integer, nullable=False),
                Column("state", Integer, nullable=False, comment="STATE_CODES: 1 delivered, 2 filtered, 3 failed."),
                Column("finished_ms", BigInteger, nullable=False),
                Column("message_key", BigInteger),
                Column("user_key", BigInteger),
                Column("source_id", Integer),
                Column("record", LargeBinary, nullable=False),
                Index(f"ix_{name}_message", "message_key"),
                Index(f"ix_{name}_user", "user_key"),
                Index(f"ix_{name}_destination", "destination_id", "finished_ms"),
            )
            _tables[name] = table
        return table


def _store(connection: Connection | Engine) -> str:
    return connection.engine.url.render_as_string(hide_password=False)


@dataclass(frozen=True)
class Partition:
    """A partition of the message log, as ``message_log_partitions`` lists it."""

    name: str
    kind: str
    starts_at: datetime
    ends_at: datetime

    @property
    def table(self) -> Table:
        return partition_table(self.name)


def kept_partitions(
    connection: Connection, kind: str | None = None, *, since: datetime | None = None, until: datetime | None = None
) -> list[Partition]:
    """The partitions kept, newest first; those of ``kind``, and overlapping ``[since, until)``, when given."""
    query = select(PARTITIONS.c.name, PARTITIONS.c.kind, PARTITIONS.c.starts_at, PARTITIONS.c.ends_at)
    if kind is not None:
        query = query.where(PARTITIONS.c.kind == kind)
    if since is not None:
        query = query.where(PARTITIONS.c.ends_at > since)
    if until is not None:
        query = query.where(PARTITIONS.c.starts_at < until)
    return [Partition(*row) for row in connection.execute(query.order_by(PARTITIONS.c.starts_at.desc(),
                                                                            PARTITIONS.c.name))]


def _containing(partitions: Sequence[Partition], kind: str, at: datetime) -> Partition | None:
    for partition in partitions:
        if partition.kind == kind and partition.starts_at <= at < partition.ends_at:
            return partition
    return None


_recent: dict[str, list[Partition]] = {}
RECENT_SECONDS = 300.0
# A finish time is read before its transaction commits: a partition whose period ended this long ago gets no more.
SEALED_AFTER = timedelta(minutes=10)


def partitions_for(connection: Connection, wanted: Iterable[tuple[str, datetime]]) -> dict[
        tuple[str, datetime], Partition]:
    """The partition each (kind, naive-UTC finish time) goes to, made in the caller's transaction where missing.

    A new partition's period is at most ``partition_period`` of its kind's retention setting, and shorter where
    the rate asks for it (``ROWS_PER_PARTITION``). The process remembers only
    partitions it read as committed, and consults that list only for recent times (an older partition may have been
    dropped by retention since).
    """
    store = _store(connection)
    pairs = set(wanted)
    found: dict[tuple[str, datetime], Partition] = {}
    recent_since = store_now() - timedelta(seconds=RECENT_SECONDS)
    for kind, at in pairs:
        partition = _containing(_recent.get(store, ()), kind, at) if at >= recent_since else None
        if partition is not None:
            found[kind, at] = partition
    missing = pairs - set(found)
    if not missing:
        return found
    if connection.dialect.name == "postgresql":
        # Concurrent CREATE TABLE IF NOT EXISTS still race on the catalog: one creator at a time, until commit.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7243052)")
    known = kept_partitions(connection)
    with _lock:
        _recent[store] = [partition for partition in known if partition.ends_at > recent_since]
    longest = log_periods()
    for kind, at in sorted(missing):
        partition = _containing(known, kind, at)
        if partition is None:
            earlier = [p for p in known if p.kind == kind and p.starts_at <= at]
            previous = max(earlier, key=lambda p: p.ends_at) if earlier else None
            period = _period_after(connection, previous, longest[kind])
            partition = _new_partition(connection, kind, at, period, previous)
            known.append(partition)
        found[kind, at] = partition
    _unseal(connection, {partition.name for partition in found.values()})
    return found


def _unseal(connection: Connection, names: set[str]) -> None:
    """Forget the count and filters of sealed partitions that get messages again (a store upgraded in place, history
    built for a benchmark): the next ``kept_counts`` counts them anew, lookups read them whole until the next seal."""
    sealed_before = store_now() - SEALED_AFTER
    old = [name for name in names if _end_of(name) < sealed_before]
    if old:
        connection.execute(update(PARTITIONS).where(PARTITIONS.c.name.in_(old), PARTITIONS.c.messages.is_not(None))
                           .values(messages=None))
        connection.execute(delete(SEALS).where(SEALS.c.name.in_(old)))


def _end_of(name: str) -> datetime:
    start, seconds = name.rsplit("_", 2)[-2:]
    return datetime.strptime(start, "%Y%m%d%H%M") + timedelta(seconds=int(seconds))


def kept_counts(engine: Engine, now: datetime | None = None) -> dict[str, int]:
    """How many messages the log keeps, per kind, without reading history.

    A partition whose period ended ``SEALED_AFTER`` ago gets no more messages: it is counted once and its count kept
    in the list. Only the partitions still open (at most ``ROWS_PER_PARTITION`` messages each, whatever is kept)
    are counted on each call.
    """
    now = now or store_now()
    counts = {"delivered": 0, "failed": 0}
    with engine.connect() as connection:
        listed = connection.execute(select(PARTITIONS.c.name, PARTITIONS.c.kind, PARTITIONS.c.ends_at,
                                           PARTITIONS.c.messages)).all()
    for name, kind, ends_at, messages in listed:
        if messages is None:
            try:
                with engine.connect() as connection:
                    messages = connection.execute(select(func.count()).select_from(partition_table(name)))\
                        .scalar_one()
            except (OperationalError, ProgrammingError):
                continue  # dropped by retention since the list was read
            if ends_at < now - SEALED_AFTER:
                with engine.begin() as connection:
                    connection.execute(update(PARTITIONS).where(PARTITIONS.c.name == name)
                                       .values(messages=messages))
        counts[kind] += messages
    return counts


def log_periods() -> dict[str, int]:
    """Per kind, the longest period of a partition made now: a quarter of the kind's retention setting."""
    retention = get_settings().retention
    return {"delivered": partition_period(retention.retention_delivered),
            "failed": partition_period(retention.retention_failed)}


def _period_after(connection: Connection, previous: Partition | None, longest: int) -> int:
    """The period of a kind's next partition: the longest its retention allows that would have held at most
    ``ROWS_PER_PARTITION`` messages at the rate the previous partition filled (the shortest for a kind's first)."""
    if previous is None:
        return PERIODS[0]
    cap = ROWS_PER_PARTITION * 4
    counted = select(previous.table.c.id).limit(cap).subquery()
    rows = connection.execute(select(func.count()).select_from(counted)).scalar_one()
    return period_for_rate(rows, previous.ends_at - previous.starts_at, longest, ROWS_PER_PARTITION)


def period_for_rate(rows: int, lasted: timedelta, longest: float, per_period: int) -> int:
    """The longest of ``PERIODS``, at most ``longest`` seconds, that would have held at most ``per_period`` rows at
    the rate of ``rows`` over ``lasted`` (the shortest when none would)."""
    rate = rows / max(lasted.total_seconds(), 1.0)
    fitting = [period for period in PERIODS if period <= longest and rate * period <= per_period]
    return fitting[-1] if fitting else PERIODS[0]


def period_bounds(at: datetime, seconds: int, previous_end: datetime | None) -> tuple[datetime, datetime]:
    """The period of ``seconds`` holding the naive-UTC ``at``, aligned to its length; it starts no earlier than the
    end of the period before it when the period grew."""
    epoch = int(at.replace(tzinfo=timezone.utc).timestamp())
    start = datetime.fromtimestamp(epoch - epoch % seconds, timezone.utc).replace(tzinfo=None)
    if previous_end is not None and start < previous_end <= at:
        start = previous_end
    end = datetime.fromtimestamp(epoch - epoch % seconds + seconds, timezone.utc).replace(tzinfo=None)
    return start, end


def _new_partition(
    connection: Connection, kind: str, at: datetime, period: int, previous: Partition | None
) -> Partition:
    start, end = period_bounds(at, period, previous.ends_at if previous is not None else None)
    partition = Partition(f"message_log_{kind}_{start:%Y%m%d%H%M}_{int((end - start).total_seconds())}", kind,
                          start, end)
    table = partition.table
    connection.execute(CreateTable(table, if_not_exists=True))
    for index in table.indexes:
        connection.execute(CreateIndex(index, if_not_exists=True))
    connection.execute(dialect_insert(connection)(PARTITIONS).values(
        name=partition.name, kind=kind, starts_at=partition.starts_at, ends_at=partition.ends_at,
    ).on_conflict_do_nothing())
    return partition


def expired_partitions(connection: Connection, kept_for: dict[str, float], now: datetime) -> list[Partition]:
    """Partitions whose whole period is older than their kind's retention, oldest first."""
    return [partition for partition in reversed(kept_partitions(connection))
            if partition.ends_at <= now - timedelta(seconds=kept_for[partition.kind])]


def partition_states(engine: Engine, partition: Partition) -> dict[str, int]:
    """How many messages of each state a partition holds (one read of the table, outside any write)."""
    table = partition.table
    with engine.connect() as connection:
        return {STATE_OF_CODE[code]: count for code, count in connection.execute(
            select(table.c.state, func.count()).group_by(table.c.state))}


def record_user_sources(engine: Engine, partition: Partition, *, batch: int = 5_000, pacer: Pacer | None = None) -> int:
    """Keep the (user, source) pairs of a partition about to be dropped, so a later deletion request still finds
    every source that saw the user. Read outside any write; written ``batch`` pairs per transaction; each a step of
    ``pacer``."""
    table = partition.table
    with paced(pacer), engine.connect() as connection:
        pairs = connection.execute(select(table.c.user_key, table.c.source_id).distinct().where(
            table.c.user_key.is_not(None), table.c.source_id.is_not(None))).all()
    for start in range(0, len(pairs), batch):
        with paced(pacer), engine.begin() as connection:
            connection.execute(dialect_insert(connection)(USER_SOURCE_KEYS).on_conflict_do_nothing(), [
                {"user_key": user_key, "source_id": source_id} for user_key, source_id in pairs[start:start + batch]])
    return len(pairs)


def drop_partition(engine: Engine, partition: Partition, pacer: Pacer | None = None) -> None:
    """Take a partition out of the list, then drop its indexes and its table, each in a transaction of its own.

    Each step is short, so ingestion and delivery write between them (``pacer`` pauses after each; on SQLite the
    table is emptied in steps first: ``drop_unlisted``). Readers stop
    looking at the partition with the first step, so none meets it without its indexes. A pass stopped between the
    steps leaves a table no list names; the next pass drops it (``unlisted_partitions``).
    """
    with paced(pacer), engine.begin() as connection:
        connection.execute(delete(PARTITIONS).where(PARTITIONS.c.name == partition.name))
        connection.execute(delete(SEALS).where(SEALS.c.name == partition.name))
    with _lock:
        for store, partitions in _recent.items():
            _recent[store] = [known for known in partitions if known.name != partition.name]
    drop_unlisted(engine, partition.name, pacer)


def drop_unlisted(engine: Engine, name: str, pacer: Pacer | None = None) -> None:
    """Drop a partition table no longer in the list: its indexes, then itself, a transaction each.

    On SQLite its rows are deleted first, ``DROP_ROWS`` per transaction in the order of their numbers: SQLite frees
    a dropped table's pages one by one with the write lock held, and a table of 500,000 messages kept a writer
    waiting 0.5 s however the pass paced itself. Nothing reads the table any more, and new rows reuse the pages its
    rows leave, so these deletes leave nothing behind to clean up.
    """
    for index in partition_table(name).indexes:
        with paced(pacer), engine.begin() as connection:
            connection.exec_driver_sql(f'DROP INDEX IF EXISTS "{index.name}"')
    while engine.dialect.name == "sqlite":
        try:
            with paced(pacer), engine.begin() as connection:
                removed = connection.exec_driver_sql(
                    f'DELETE FROM "{name}" WHERE id <= (SELECT id FROM "{name}" ORDER BY id LIMIT 1 OFFSET '
                    f'{DROP_ROWS - 1})').rowcount
        except OperationalError:  # dropped already, by a pass stopped after it
            break
        if not removed:  # fewer than DROP_ROWS left: the drop below is as short
            break
    with paced(pacer), engine.begin() as connection:
        connection.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')


# Rows per transaction when a partition is emptied before its table is dropped (SQLite).
DROP_ROWS = 25_000


def unlisted_partitions(engine: Engine) -> list[str]:
    """Partition tables the list no longer names (a pass stopped while it dropped one)."""
    with engine.connect() as connection:
        tables = set(inspect(connection).get_table_names())
        listed = set(connection.execute(select(PARTITIONS.c.name)).scalars())
    return sorted(name for name in tables - listed
                  if name.startswith(("message_log_delivered_", "message_log_failed_")))
