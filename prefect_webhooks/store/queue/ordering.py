"""Ordered delivery in the store: for an ordered destination only each user's oldest pending message is claimable.

A destination is ordered while its name is in ``ordered_destinations`` (delivery keeps that table in step with the
blocks' ``ordered`` field). Its messages of one user (``user_id``: userId, else anonymousId) then go one at a time,
lowest outbox id first: the id is taken when the row is inserted, so a client that waits for each answer gets the
order it sent in. A message waiting for a retry, for rate budget or under a lease still holds back the user's later
ones; one delivered or failed for good lets the next go. The partial index ``ix_outbox_pending_user`` answers
"is there an earlier pending message of this user?" in one probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, exists, or_, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.schema.tables import OrderedDestination, OutboxMessage

OUTBOX = OutboxMessage.__table__
ORDERED = OrderedDestination.__table__
_EARLIER = aliased(OUTBOX, name="earlier")


def _has_earlier_pending() -> Any:
    """True for an outbox row with an earlier pending row of the same destination and user that it waits for.

    A row bound to one endpoint of a fan-out destination (``store.queue.fan_out``) waits for the user's earlier rows of
    that endpoint and for earlier messages not split yet; a row not bound waits for earlier rows not bound. So each
    endpoint keeps the user's order, and one endpoint down holds back only its own rows.
    """
    return exists().where(
        _EARLIER.c.destination == OUTBOX.c.destination,
        _EARLIER.c.user_id == OUTBOX.c.user_id,
        _EARLIER.c.state == PENDING,
        _EARLIER.c.user_id.is_not(None),
        _EARLIER.c.id < OUTBOX.c.id,
        or_(_EARLIER.c.endpoint.is_(None), _EARLIER.c.endpoint == OUTBOX.c.endpoint),
    )


def claimable_in_order() -> Any:
    """The claim's condition: every row of an unordered destination, only users' oldest rows of an ordered one."""
    return or_(~OUTBOX.c.destination.in_(select(ORDERED.c.destination)), OUTBOX.c.user_id.is_(None),
               ~_has_earlier_pending())


def set_ordered(engine: Engine, destination: str, ordered: bool) -> None:
    """Record whether ``destination``'s block asks for ordered delivery."""
    with engine.begin() as connection:
        if ordered:
            dialect_insert = postgresql_insert if connection.dialect.name == "postgresql" else sqlite_insert
            connection.execute(dialect_insert(ORDERED).values(destination=destination).on_conflict_do_nothing())
        else:
            connection.execute(delete(ORDERED).where(ORDERED.c.destination == destination))


def ordered_destinations(engine: Engine) -> set[str]:
    """The destinations recorded as ordered."""
    with engine.connect() as connection:
        return set(connection.execute(select(ORDERED.c.destination)).scalars())


def behind_earlier(engine: Engine, ids: Sequence[int]) -> list[int]:
    """The rows among ``ids`` that have an earlier pending row of the same destination and user."""
    if not ids:
        return []
    statement = select(OUTBOX.c.id).where(OUTBOX.c.id.in_(list(ids)), OUTBOX.c.user_id.is_not(None),
                                             _has_earlier_pending())
    with engine.connect() as connection:
        return list(connection.execute(statement).scalars())
