"""Fan-out in the queue: a message of a destination that delivers to each endpoint becomes one row per endpoint.

A message enters the queue as one row, whatever its destination (ingestion does not load destination blocks). The
first delivery process that claims it for a destination with ``each_endpoint`` splits it, in one transaction: the
row itself is bound to the first endpoint (its ``endpoint`` column holds the endpoint's key) and a copy is added,
leased to the same process, for each other endpoint. From then on each row is an ordinary queued message with its
own attempts, retries, deadline, outcome and log record, and it goes only to its endpoint: one endpoint down never
holds back or hides behind another.

The endpoints are those the block lists when the message is first claimed; one added later gets the messages
accepted after that. Copies take ids in their messages' order, so ordered delivery (``store.queue.ordering``) keeps each
user's messages in order per endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.queue.outbox import CLAIMED_COLUMNS, OUTBOX, Claimed, to_claimed
from prefect_webhooks.store.schema.tables import store_now

# What a copy takes from the row it is split from, besides its endpoint and its lease.
_COPIED = ("destination", "source", "message_type", "message_id", "user_id", "body", "created_at",
           "next_attempt_at")


def split_by_endpoint(
    engine: Engine, splits: Sequence[tuple[int, Sequence[str]]], owner: str, *, lease_seconds: float
) -> dict[int, list[Claimed]]:
    """Bind each row ``owner`` holds to its destination's first endpoint, and add a leased copy for each other one.

    Args:
        engine: The store.
        splits: ``(outbox id, endpoint keys in the block's order)`` of rows not bound to an endpoint yet.
        owner: The claimer holding the rows; the copies are leased to it.
        lease_seconds: The copies' lease.

    Returns:
        Per outbox id, its rows (itself first, then the copies, in endpoint order). A row that is no longer pending,
        no longer held by ``owner`` or already bound is left out: whoever holds it now sends it.
    """
    keys_of = {row_id: list(keys) for row_id, keys in splits if keys}
    if not keys_of:
        return {}
    until = store_now(engine) + timedelta(seconds=lease_seconds)
    split: dict[int, list[Claimed]] = {}
    copies: list[tuple[int, dict[str, Any]]] = []  # (the row it is split from, the copy's values)
    with engine.begin() as connection:
        for first_key in sorted({keys[0] for keys in keys_of.values()}):
            ids = sorted(row_id for row_id, keys in keys_of.items() if keys[0] == first_key)
            bound = connection.execute(
                update(OUTBOX)
                .where(OUTBOX.c.id.in_(ids), OUTBOX.c.endpoint.is_(None), OUTBOX.c.state == PENDING,
                       OUTBOX.c.lease_owner == owner)
                .values(endpoint=first_key)
                .returning(*CLAIMED_COLUMNS, *(OUTBOX.c[name] for name in _COPIED))
            ).all()
            for row in bound:
                split[row[0]] = [to_claimed(row)]
                copied = dict(zip(_COPIED, row[len(CLAIMED_COLUMNS):], strict=True))
                copies.extend((row[0], {**copied, "endpoint": key, "state": PENDING, "attempts": 0,
                                        "lease_owner": owner, "lease_expires_at": until})
                              for key in keys_of[row[0]][1:])
        # In the messages' order, so each endpoint's copies of one user's messages keep their order by id.
        copies.sort(key=lambda copy: copy[0])
        if copies:
            made = connection.execute(OUTBOX.insert().returning(*CLAIMED_COLUMNS, sort_by_parameter_order=True),
                                      [values for _, values in copies])
            for (split_from, _), row in zip(copies, made.all(), strict=True):
                split[split_from].append(to_claimed(row))
    return split
