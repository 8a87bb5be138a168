"""The schema: every table of the store, the clock its times are read by, and many rows written at once. It takes
in nothing from the rest of the store (the lowest of its sub-packages) and hands on the tables, ``store_now``,
``insert_rows`` and ``driver_rows`` to every other one.

Read in this order:

- ``tables``: the store's tables (queue, attempts, log, counters, audiences, deletions…) and how times are kept.
- ``clock``: the store's one "now": on PostgreSQL the database's clock decides, on SQLite the host's.
- ``bulk_insert``: many rows of one shape into a table, in the caller's transaction.
- ``driver``: the hot path's statements straight to the driver's cursor, in the caller's transaction.
"""

from prefect_webhooks.store.schema.bulk_insert import insert_rows
from prefect_webhooks.store.schema.clock import (
    follow_database_clock,
    read_database_clock,
    store_seconds,
    use_as_process_clock,
)
from prefect_webhooks.store.schema.driver import driver_executemany, driver_rows
from prefect_webhooks.store.schema.tables import (
    DELETION_REQUESTED,
    Audience,
    AudienceState,
    DeletionRequest,
    DeliveryAttempt,
    DestinationChange,
    EndpointCounter,
    EndpointState,
    LogName,
    LogPartition,
    LogPartitionSeal,
    OrderedDestination,
    OutboxMessage,
    OutcomeCounter,
    OutcomeMinute,
    ReasonMinute,
    SeenIdPeriod,
    StoreIdentity,
    StoreLease,
    StoreUpgrade,
    SuppressedUser,
    UserSource,
    UserSourceKey,
    dialect_insert,
    free_of_lease,
    read_store_time,
    store_now,
    store_time_text,
    to_store_time,
)

__all__ = [
    "Audience",
    "AudienceState",
    "DELETION_REQUESTED",
    "DeletionRequest",
    "DeliveryAttempt",
    "DestinationChange",
    "EndpointCounter",
    "EndpointState",
    "LogName",
    "LogPartition",
    "LogPartitionSeal",
    "OrderedDestination",
    "OutboxMessage",
    "OutcomeCounter",
    "OutcomeMinute",
    "ReasonMinute",
    "SeenIdPeriod",
    "StoreIdentity",
    "StoreLease",
    "StoreUpgrade",
    "SuppressedUser",
    "UserSource",
    "UserSourceKey",
    "dialect_insert",
    "driver_executemany",
    "driver_rows",
    "follow_database_clock",
    "free_of_lease",
    "insert_rows",
    "read_database_clock",
    "read_store_time",
    "store_now",
    "store_seconds",
    "store_time_text",
    "to_store_time",
    "use_as_process_clock",
]
