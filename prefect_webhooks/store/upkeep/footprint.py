"""How much room the store takes: what a pruning pass reports, and what the soak benchmark watches level off."""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel


@dataclass(frozen=True)
class StoreSize:
    """The store's size in bytes.

    Attributes:
        total_bytes: SQLite: the database file and its WAL. PostgreSQL: every table of the store with its indexes
            and TOAST data.
        wal_bytes: SQLite's WAL file (0 on PostgreSQL, whose WAL is the server's).
        free_bytes: SQLite: pages inside the file that are free for reuse (freed by pruning). PostgreSQL: 0 (its
            free space map is not read here).
    """

    total_bytes: int
    wal_bytes: int = 0
    free_bytes: int = 0


def store_size(engine: Engine) -> StoreSize:
    """Measure the store (a few catalog reads; no table is scanned)."""
    if engine.dialect.name == "sqlite":
        path = engine.url.database or ""
        with engine.connect() as connection:
            page_size = connection.exec_driver_sql("PRAGMA page_size").scalar_one()
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = connection.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        wal = os.path.getsize(path + "-wal") if path and os.path.exists(path + "-wal") else 0
        return StoreSize(total_bytes=pages * page_size + wal, wal_bytes=wal, free_bytes=free * page_size)
    tables = sorted(SQLModel.metadata.tables)
    query = text("SELECT coalesce(sum(pg_total_relation_size(to_regclass(name))), 0) "
                 "FROM (SELECT unnest(CAST(:names AS text[])) AS name UNION ALL "
                 "SELECT name FROM message_log_partitions) AS tables")
    with engine.connect() as connection:
        total = connection.execute(query, {"names": tables}).scalar_one()
    return StoreSize(total_bytes=int(total))
