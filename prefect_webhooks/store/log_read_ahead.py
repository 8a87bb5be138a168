"""Read ahead of a lookup in the message log: bring the pages of the partitions it will read next into memory,
several partitions at once.

A lookup reads its partitions one after another on one connection (``message_log.find_kept``). With the store's
file in the page cache that costs a few milliseconds; with the file on disk each partition costs a few random page
reads (its index, then its rows), waited for one at a time: a user's newest 50 over a week of history read about 70
partitions, 107 ms at p99 against 30 ms from memory (bench/README.md, "Capacity with a week kept"). A disk serves
many reads at once about as fast as one. So once a lookup's first group of partitions has not met its limit (a
lookup that ends there, such as a busy destination's newest messages, reads nothing ahead), side connections run
the same statement over the partitions left, newest first, a few partitions each and several at a time; their rows
are dropped, only the pages they read stay in the operating system's cache, where the lookup's own statements find
them. What the lookup answers still comes from its own connection and transaction: reading ahead changes when its
pages are read, never what it sees.

SQLite store files only: a PostgreSQL lookup is one server's work, and an in-memory SQLite store is in memory.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.store.log_statements import group_statement

# Side connections reading at once, and partitions per statement: enough to keep a disk's queue full for the
# 30-70 partitions a lookup by user reads, few enough that a lookup's ahead reads end soon after it does.
READERS = 8
PARTITIONS_PER_READ = 4

_executor: ThreadPoolExecutor | None = None
_side_engines: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class ReadAhead:
    """The reads ahead of one lookup; ``stop`` drops those not started (the lookup has what it needs)."""

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def read(self, engine: Engine, names: Sequence[str], parameters: Mapping[str, Any]) -> None:
        if self._stopped.is_set():
            return
        try:
            with engine.connect() as connection:
                connection.execute(group_statement(tuple(names), frozenset(parameters)), dict(parameters)).all()
        except Exception:  # noqa: BLE001 - a partition retention dropped meanwhile; the lookup itself reads on
            return


def can_read_ahead(connection: Connection) -> bool:
    """Whether ``connection``'s store is a SQLite file (see the module)."""
    database = connection.engine.url.database
    return connection.dialect.name == "sqlite" and bool(database) and database != ":memory:" \
        and "mode=memory" not in str(connection.engine.url)


def read_ahead(connection: Connection, names: Sequence[str], parameters: Mapping[str, Any]) -> ReadAhead:
    """Start reading the partitions ``names`` (in the order given) as the lookup on ``connection`` with
    ``parameters`` will; call ``stop`` on the answer once the lookup is done."""
    ahead = ReadAhead()
    side = _side_engine(connection.engine)
    executor = _readers()
    for start in range(0, len(names), PARTITIONS_PER_READ):
        executor.submit(ahead.read, side, names[start:start + PARTITIONS_PER_READ], parameters)
    return ahead


def _readers() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(READERS, thread_name_prefix="log-read-ahead")
        return _executor


def _side_engine(engine: Engine) -> Engine:
    """A pool of read-only connections to ``engine``'s file, apart from its own pool: reading ahead never waits for
    a connection the API or delivery needs, nor holds one."""
    with _lock:
        side = _side_engines.get(engine)
        if side is None:
            side = create_engine(engine.url, pool_size=READERS, max_overflow=0,
                                 connect_args={"check_same_thread": False, "timeout": 5})
            event.listen(side, "connect", _read_only)
            event.listen(engine, "engine_disposed", _dispose_side)
            _side_engines[engine] = side
        return side


def _dispose_side(engine: Engine) -> None:
    with _lock:
        side = _side_engines.pop(engine, None)
    if side is not None:
        side.dispose()


def _read_only(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA query_only=1")
