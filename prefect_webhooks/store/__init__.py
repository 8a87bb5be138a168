"""The store: the source of truth for every message. It takes in outbox rows (from ingestion, audience syncs and
deletions, through ``outbox.enqueue``/``add_to_outbox``, in the caller's transaction) into the queue and hands them
on to delivery as leased claims (``outbox.claim_due_deliveries``); a message that reaches its outcome moves with its
attempts to the message log (``outbox.record_outcomes`` ▶ ``message_log``), kept in time partitions that retention
drops whole, and looked up by messageId, user or destination and time (``message_log.find_kept``). Ingestion's
dedupe remembers messageIds per period of receipt, each sealed period behind a filter (``seen_ids``).
``tables`` defines the schema, ``engines`` opens SQLite (WAL, the default; its writers take the writer lock in
turn at ``write_gate``) or PostgreSQL and creates the schema idempotently, and ``metrics`` reads the backlog and
totals for ``/metrics``, ``/health/backlog`` and ``status``.
"""

from prefect_webhooks.store.engines import create_schema, dispose_engines, get_engine, insert_rows, store_key
from prefect_webhooks.store.message_log import KeptMessage, find_kept
from prefect_webhooks.store.metrics import backlog_snapshot
from prefect_webhooks.store.outbox import add_to_outbox, claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.replay import replay_failed, resend_messages
from prefect_webhooks.store.tables import (
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
