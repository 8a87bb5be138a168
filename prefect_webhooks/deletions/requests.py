"""Deletion requests: recorded by ``request_deletion``, read back by the ``deletions`` flow (``processing``)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import BaseModel
from sqlalchemy import insert, select
from sqlalchemy.engine import Engine

from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import DELETION_REQUESTED, DeletionRequest, store_now

REQUESTS = DeletionRequest.__table__
REQUESTED = DELETION_REQUESTED
COMPLETED = "completed"
PURGED = "purged"
EVERY_SOURCE = "*"


class DeletionError(RuntimeError):
    """A deletion request that cannot be processed (unknown, or already processed)."""


class PendingRequest(BaseModel):
    """A recorded request not yet processed."""

    id: int
    user_id: str
    sources: list[str] | None
    suppress: bool


def user_reference(user_id: str) -> str:
    """A stable, non-reversible label for a user in artifacts and logs (the id itself is personal data)."""
    return "user#" + hashlib.sha256(user_id.encode()).hexdigest()[:12]


def request_deletion(
    user_id: str, sources: Sequence[str] | None = None, suppress: bool = False, *, engine: Engine | None = None
) -> int:
    """Record a deletion request; the ``deletions`` flow processes it.

    Args:
        user_id: The user whose data is to be deleted.
        sources: Source block names to notify; every source that has received events for the user when None.
        suppress: Also drop the user's further events at ingestion.
        engine: The store; the configured one by default.

    Returns:
        The request id.
    """
    if not user_id or not user_id.strip():
        raise ValueError("a deletion request needs a userId")
    engine = engine or get_engine()
    with engine.begin() as connection:
        result = connection.execute(
            insert(REQUESTS).values(
                user_id=user_id,
                sources=list(sources) if sources is not None else None,
                suppress=suppress,
                state=REQUESTED,
                created_at=store_now(),
            )
        )
        return int(result.inserted_primary_key[0])


def has_pending_requests(engine: Engine | None = None) -> bool:
    """Whether a request waits to be processed (one probe of the requests' state index)."""
    engine = engine or get_engine()
    with engine.connect() as connection:
        waiting = connection.execute(select(REQUESTS.c.id).where(REQUESTS.c.state == REQUESTED).limit(1)).first()
    return waiting is not None


def pending_requests(engine: Engine | None = None, request_ids: Sequence[int] | None = None) -> list[PendingRequest]:
    """Requests still to process (oldest first), optionally only those among ``request_ids``."""
    engine = engine or get_engine()
    statement = select(REQUESTS.c.id, REQUESTS.c.user_id, REQUESTS.c.sources, REQUESTS.c.suppress).where(
        REQUESTS.c.state == REQUESTED
    )
    if request_ids is not None:
        statement = statement.where(REQUESTS.c.id.in_(list(request_ids)))
    with engine.connect() as connection:
        rows = connection.execute(statement.order_by(REQUESTS.c.id)).all()
    return [PendingRequest(id=row.id, user_id=row.user_id, sources=row.sources, suppress=row.suppress) for row in rows]
