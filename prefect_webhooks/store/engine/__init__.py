"""The engine: opening a store. It takes in a store URL (SQLite by default, PostgreSQL for scale-out) and hands on an
engine whose schema is created and upgraded; every mechanism above reads and writes through it (``get_engine``).
It sits above the log because an upgrade moves an older store's history into the message log.

Read in this order:

- ``engines``: one engine per URL and process, SQLite tuned for WAL, the schema created and upgraded once.
- ``upgrades``: the one-time changes an older store gets when a process of this release first opens it.
- ``write_gate``: SQLite's one writer, taken in turn at a gate the kernel keeps.
- ``checkpointer``: SQLite's WAL copied back by a thread of its own, never inside a committing transaction.
- ``file_modes``: the SQLite store's files readable by their owner only.
"""

from prefect_webhooks.store.engine.engines import (
    StoreNotFound,
    StoreNotUpgraded,
    create_schema,
    dispose_engines,
    get_engine,
    open_existing_store,
    store_key,
)

__all__ = [
    "StoreNotFound",
    "StoreNotUpgraded",
    "create_schema",
    "dispose_engines",
    "get_engine",
    "open_existing_store",
    "store_key",
]
