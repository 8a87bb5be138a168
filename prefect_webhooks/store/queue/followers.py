"""A user's next messages, claimed behind the one an ordered destination's claim took (``store.queue.ordering``).

The claim takes only each user's oldest pending message of an ordered destination, so a user with 20 messages
waiting needs 20 claims, one round trip each. A batch that holds such a head may also lease the user's following
pending messages, in id order, as long as each is due and free: nothing else can claim them meanwhile (the head
is pending before them), and the batch sends them one after another, stopping at the first that is to be retried
(``delivery.pacing.ordering``). The run of messages taken is contiguous: it stops at the first that is not due (waiting
for a retry or for rate budget) or leased elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.queue.outbox import CLAIMED_COLUMNS, OUTBOX, Claimed, release_leases, to_claimed
from prefect_webhooks.store.schema.tables import free_of_lease, store_now

_HEAD = aliased(OUTBOX, name="head")


def claim_followers(
    engine: Engine, head_ids: Sequence[int], owner: str, *, per_user: int, lease_seconds: float
) -> dict[int, list[Claimed]]:
    """Lease, behind each of ``head_ids``, up to ``per_user`` of its user's next pending messages that are due and free.

    Args:
        engine: The store.
        head_ids: Rows ``owner`` holds of ordered destinations, each its user's oldest pending one.
        owner: The claimer's id; the followers are leased to it.
        per_user: Most messages taken behind one head.
        lease_seconds: Lease length.

    Returns:
        Per head id, the messages leased behind it, in the order they go (an empty run is left out).
    """
    if not head_ids or per_user <= 0:
        return {}
    now = store_now(engine)
    ranked = (
        select(OUTBOX.c.id, _HEAD.c.id.label("head_id"), OUTBOX.c.next_attempt_at, OUTBOX.c.lease_expires_at,
               func.row_number().over(partition_by=_HEAD.c.id, order_by=OUTBOX.c.id).label("n"))
        .join(_HEAD, and_(_HEAD.c.destination == OUTBOX.c.destination, _HEAD.c.user_id == OUTBOX.c.user_id,
                          OUTBOX.c.id > _HEAD.c.id))
        .where(_HEAD.c.id.in_(list(head_ids)), _HEAD.c.user_id.is_not(None), OUTBOX.c.state == PENDING)
        .subquery()
    )
    wanted: dict[int, list[int]] = {}
    stopped: set[int] = set()
    with engine.connect() as connection:
        rows = connection.execute(select(ranked).where(ranked.c.n <= per_user).order_by(ranked.c.head_id, ranked.c.n))
        for row in rows:
            if row.head_id in stopped:
                continue
            if row.next_attempt_at > now or (row.lease_expires_at is not None and row.lease_expires_at >= now):
                stopped.add(row.head_id)
                continue
            wanted.setdefault(row.head_id, []).append(row.id)
    if not wanted:
        return {}
    statement = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_([row_id for run in wanted.values() for row_id in run]), OUTBOX.c.state == PENDING,
               OUTBOX.c.next_attempt_at <= now,
               free_of_lease(now))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds))
        .returning(*CLAIMED_COLUMNS)
    )
    with engine.begin() as connection:
        leased = {claimed.id: claimed for claimed in map(to_claimed, connection.execute(statement))}
    runs: dict[int, list[Claimed]] = {}
    for head_id, ids in wanted.items():
        # Another claimer may have taken one meanwhile (a row whose earlier message just left): the run ends there.
        taken = []
        for row_id in ids:
            if row_id not in leased:
                break
            taken.append(leased.pop(row_id))
        if taken:
            runs[head_id] = taken
    if leased:
        release_leases(engine, list(leased), owner)
    return runs
