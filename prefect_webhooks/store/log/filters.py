"""Which partitions of the message log may hold a messageId, a user or a message number, without reading them.

The log keeps a partition per kind and period, about a million messages each (``partitions``), so a lookup that
read every partition's index would cost in proportion to what is kept: at 50M kept, a hundred index probes per
messageId, most of them cold pages. Once a partition's period has ended (``SEALED_AFTER``) the pruning pass seals
it: two Bloom filters over its rows' keys (messageIds and users, ``key_filters.KeyFilter``) and the range of its
message numbers go into a row of ``message_log_seals``, and its count into its list row. A process that looks
messages up holds the filters it has read, about 2 bytes per kept message for each kind, and tests a key against all
of them at once (``FilterSet``); it reads only the partitions that may hold the key, and every partition not sealed
yet. A partition that gets messages again after its seal (a store upgraded in place, history built for a benchmark)
loses its filters with its count (``partitions._unseal``) and is read whole until the next pass seals it again.
Retention drops a partition's seal with it.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from prefect_webhooks.store.log.key_filters import FilterSet, KeyFilter, Probe
from prefect_webhooks.store.log.pacing import Pacer, paced
from prefect_webhooks.store.log.partitions import (
    PARTITIONS,
    SEALED_AFTER,
    SEALS,
    Partition,
    kept_partitions,
    partition_table,
)
from prefect_webhooks.store.log.records import text_key
from prefect_webhooks.store.schema.tables import dialect_insert, store_now


def seal_log_partitions(engine: Engine, now: datetime | None = None, pacer: Pacer | None = None) -> int:
    """Build the filters, id range and count of every partition whose period ended ``SEALED_AFTER`` ago and that
    has none (its read and its write each a step of ``pacer``); returns how many were sealed."""
    cutoff = (now or store_now()) - SEALED_AFTER
    with engine.connect() as connection:
        names = connection.execute(select(PARTITIONS.c.name).where(
            PARTITIONS.c.ends_at < cutoff, PARTITIONS.c.name.not_in(select(SEALS.c.name)))).scalars().all()
    sealed = 0
    for name in names:
        table = partition_table(name)
        message_keys, user_keys = array("q"), array("q")  # a million rows as 16 MB, not as Python tuples
        messages = 0
        try:
            with paced(pacer), engine.connect() as connection:
                lowest, highest = connection.execute(select(func.min(table.c.id), func.max(table.c.id))).one()
                for chunk in connection.execute(select(table.c.message_key, table.c.user_key)).partitions(50_000):
                    messages += len(chunk)
                    # A message a deletion request purged keeps neither key: nothing finds it by them.
                    message_keys.extend(key for key, _ in chunk if key is not None)
                    user_keys.extend(key for _, key in chunk if key is not None)
                seal = {"name": name, "messages": messages, "lowest_id": lowest, "highest_id": highest,
                        "message_filter": KeyFilter.of_probe(Probe.of_numbers(message_keys)).to_bytes(),
                        "user_filter": KeyFilter.of_probe(Probe.of_numbers(sorted(set(user_keys)))).to_bytes()}
        except (OperationalError, ProgrammingError):
            continue  # dropped by retention since the list was read
        with paced(pacer), engine.begin() as connection:
            # Messages that reached the partition after the read above (only history written into the past does
            # that) would be missing from its filters: then it is sealed at a later pass.
            if connection.execute(select(func.count()).select_from(table)).scalar_one() != messages:
                continue
            listed = connection.execute(update(PARTITIONS).where(PARTITIONS.c.name == name)
                                        .values(messages=messages)).rowcount
            if listed:  # not dropped by retention meanwhile
                connection.execute(dialect_insert(connection)(SEALS).on_conflict_do_nothing(), [seal])
        sealed += 1
    return sealed


@dataclass
class _HeldFilters:
    """The filters of one column (messageIds or users) this process has read, with the count each was built at."""

    column: str
    filters: FilterSet = field(default_factory=FilterSet)
    built_at: dict[str, int] = field(default_factory=dict)

    def read(self, connection: Connection, sealed: dict[str, tuple[int, int | None, int | None]]) -> FilterSet:
        """Bring the filters in line with the seals: read the new ones, forget the gone or rebuilt."""
        for name in set(self.built_at) - set(sealed):
            self.filters.discard(name)
            del self.built_at[name]
        stale = [name for name, (count, _, _) in sealed.items() if self.built_at.get(name) != count]
        for start in range(0, len(stale), 20):
            for name, count, data in connection.execute(
                    select(SEALS.c.name, SEALS.c.messages, SEALS.c[self.column])
                    .where(SEALS.c.name.in_(stale[start:start + 20]))):
                self.filters.add(name, KeyFilter.from_bytes(bytes(data)))
                self.built_at[name] = count
        return self.filters


def hold_filters(engine: Engine) -> int:
    """Read every seal's filters of both kinds into this process now, as its first lookup of each kind would (at
    50M kept, 0.5-1.6 s and about 100 MB each): a process that serves lookups does it at start, so the first person
    to look a message up does not wait for it. Returns how many partitions are sealed."""
    with engine.connect() as connection:
        partitions = kept_partitions(connection)
        may_hold(connection, partitions, message_id="", user_id="")
        return connection.execute(select(func.count()).select_from(SEALS)).scalar_one()


# Per store and column: a lookup by messageId reads only the messageId filters, one by user only the users'.
_held: dict[tuple[Engine, str], _HeldFilters] = {}
_lock = threading.Lock()


def may_hold(
    connection: Connection,
    partitions: Sequence[Partition],
    *,
    message_id: str | None = None,
    user_id: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[Partition]:
    """The partitions of ``partitions`` that may hold a message with all of the keys given (in their order): the
    sealed ones whose filters and id range do not rule it out, and every one not sealed."""
    if message_id is None and user_id is None and not ids:
        return list(partitions)
    wanted = {partition.name for partition in partitions}
    sealed = {name: (count, lowest, highest) for name, count, lowest, highest in connection.execute(
        select(SEALS.c.name, SEALS.c.messages, SEALS.c.lowest_id, SEALS.c.highest_id)) if name in wanted}
    ruled_out: set[str] = set()
    if ids:
        ruled_out |= {name for name, (_, lowest, highest) in sealed.items()
                      if lowest is None or not any(lowest <= number <= highest for number in ids)}
    with _lock:  # the API's threads share a process's filters
        for key, column in ((message_id, "message_filter"), (user_id, "user_filter")):
            if key is not None:
                filters = _held.setdefault((connection.engine, column), _HeldFilters(column)).read(connection, sealed)
                candidates = filters.candidates(Probe.of_numbers([text_key(key)]))
                ruled_out |= {name for name in sealed if name in filters and name not in candidates}
    return [partition for partition in partitions if partition.name not in ruled_out]
