"""Numbers for the message log's names: destinations, sources and URLs kept as small numbers (``message_log_names``).

A number is given once per name, in the transaction that first needs it, and never reused; a process remembers
only numbers it read as committed (a rolled-back transaction takes its new numbers with it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from prefect_webhooks.store.log.partitions import _store
from prefect_webhooks.store.schema.tables import LogName, dialect_insert

NAMES = LogName.__table__

_names: dict[tuple[str, str], int] = {}  # (store, name) -> id; ids are never reused
_lock = threading.Lock()


def known_name_ids(connection: Connection, names: Iterable[str]) -> dict[str, int]:
    """The numbers of those of ``names`` that already have one (committed); reads only, so it needs no write
    transaction."""
    store = _store(connection)
    wanted = set(names)
    found = {name: _names[store, name] for name in wanted if (store, name) in _names}
    missing = sorted(wanted - set(found))
    if not missing:
        return found
    committed = dict(connection.execute(select(NAMES.c.name, NAMES.c.id).where(NAMES.c.name.in_(missing))).all())
    with _lock:
        for name, name_id in committed.items():
            _names[store, name] = name_id
    found.update(committed)
    return found


def name_ids(connection: Connection, names: Iterable[str]) -> dict[str, int]:
    """The numbers of ``names``, given one in the caller's transaction the first time each is seen."""
    wanted = set(names)
    found = known_name_ids(connection, wanted)
    new = sorted(wanted - set(found))
    if new:
        connection.execute(dialect_insert(connection)(NAMES).on_conflict_do_nothing(), [{"name": name} for name in new])
        found.update(connection.execute(select(NAMES.c.name, NAMES.c.id).where(NAMES.c.name.in_(new))).all())
    return found


def names_of(connection: Connection, ids: Iterable[int]) -> dict[int, str]:
    """The names of numbers ``name_ids`` gave."""
    wanted = sorted({code for code in ids if code is not None})
    if not wanted:
        return {}
    return dict(connection.execute(select(NAMES.c.id, NAMES.c.name).where(NAMES.c.id.in_(wanted))).all())
