"""The store: the source of truth for every message. It takes in outbox rows (from ingestion, audience syncs and
deletions, through ``enqueue``/``add_to_outbox``, in the caller's transaction) into the queue and hands them on to
delivery as leased claims (``claim_due_deliveries``); a message that reaches its outcome moves with its attempts to
the message log (``record_outcomes``), kept in time partitions that retention drops whole, and looked up by
messageId, user or destination and time (``find_kept``).

One folder per mechanism, lowest first (a mechanism imports only from the ones before it; each ``__init__`` lists
its modules in reading order):

- ``schema``: every table, the store's clock, many rows at once.
- ``log``: the message log: partitions, compressed records, lookups, sealed partitions' Bloom filters.
- ``dedupe``: the messageIds seen within the dedupe window, in periods sealed as the log's partitions are.
- ``engine``: opening a store: SQLite (WAL, its writers in turn at the write gate) or PostgreSQL, the schema created
  and upgraded.
- ``figures``: outcome and request totals, per-minute counts, and the backlog snapshot for ``/metrics`` and
  ``status``.
- ``endpoints``: what every delivering process shares about endpoints: states, the rate budget, block generations.
- ``queue``: the outbox: messages in, leased claims out, outcomes recorded; ordering, fan-out, replay and resend.
- ``upkeep``: the pruning pass (retention), its lease, and the room the store takes.
"""

from prefect_webhooks.store.engine.engines import create_schema, dispose_engines, get_engine, insert_rows, store_key
from prefect_webhooks.store.figures.metrics import backlog_snapshot
from prefect_webhooks.store.log.message_log import KeptMessage, find_kept
from prefect_webhooks.store.queue.outbox import add_to_outbox, claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.queue.replay import replay_failed, resend_messages
from prefect_webhooks.store.schema.tables import (
    Audience,
    AudienceState,
    DeletionRequest,
    DeliveryAttempt,
    OutboxMessage,
    StoreIdentity,
    SuppressedUser,
    store_now,
    to_store_time,
)

__all__ = [
    "Audience",
    "AudienceState",
    "DeletionRequest",
    "KeptMessage",
    "DeliveryAttempt",
    "OutboxMessage",
    "StoreIdentity",
    "SuppressedUser",
    "add_to_outbox",
    "backlog_snapshot",
    "claim_due_deliveries",
    "create_schema",
    "dispose_engines",
    "enqueue",
    "find_kept",
    "get_engine",
    "insert_rows",
    "record_outcomes",
    "replay_failed",
    "resend_messages",
    "store_key",
    "store_now",
    "to_store_time",
]
