"""The outbox: how messages enter the store for delivery.

``enqueue`` is the one entry point ingestion, audience syncs and deletions use; ``add_to_outbox`` does the same
inside a caller's transaction so a caller's own writes (dedupe keys, audience state) commit together with the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Connection, Engine

from prefect_webhooks.payloads import serialize
from prefect_webhooks.store import PENDING, OutboxMessage, get_engine, store_now, to_store_time


def payload_user(payload: dict[str, Any]) -> str | None:
    """The user an outbound message is about (alias: the new id)."""
    return payload.get("userId") or payload.get("User ID") or payload.get("anonymousId")


def outbox_rows(
    destination: str,
    payloads: Iterable[dict[str, Any]],
    *,
    source: str | None = None,
    message_ids: Sequence[str | None] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows for ``payloads`` bound to ``destination``, due at once; each body serialised here, once."""
    now = to_store_time(now) if now else store_now()
    rows = []
    for index, payload in enumerate(payloads):
        rows.append(
            {
                "destination": destination,
                "source": source,
                "message_type": payload["type"],
                "message_id": message_ids[index] if message_ids else None,
                "user_id": payload_user(payload),
                "body": serialize(payload),
                "state": PENDING,
                "attempts": 0,
                "created_at": now,
                "next_attempt_at": now,
            }
        )
    return rows


def add_to_outbox(connection: Connection, rows: Sequence[dict[str, Any]]) -> int:
    """Insert prepared rows in the caller's transaction; returns how many."""
    if rows:
        connection.execute(insert(OutboxMessage.__table__), list(rows))
    return len(rows)


def enqueue(
    destination: str,
    payloads: Sequence[dict[str, Any]],
    *,
    source: str | None = None,
    engine: Engine | None = None,
) -> int:
    """Put outbound messages for one destination into the outbox, committed before returning.

    Args:
        destination: Name of a saved ``WebhookDestination`` block.
        payloads: Outbound messages (see ``prefect_webhooks.payloads``).
        source: Name of the Source block they came from, if any.
        engine: The store; the configured one by default.

    Returns:
        The number of rows written.
    """
    engine = engine or get_engine()
    with engine.begin() as connection:
        return add_to_outbox(connection, outbox_rows(destination, payloads, source=source))
