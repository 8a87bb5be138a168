"""Ordered delivery in a batch: keep the store's list of ordered destinations in step with the blocks, and hold back
any message claimed before its destination was listed (``store.ordering`` explains the claim rule).

The claim already takes only each user's oldest pending message of a listed destination. A destination whose
block was just switched to ``ordered`` may have had a user's later messages claimed before the switch reached the
store: a batch re-checks the messages of ordered destinations in one query and gives back those that have an
earlier pending message of their user, unsent; the claim skips them until their turn.
"""

from __future__ import annotations

from prefect_webhooks.delivery.context import DeliveryContext, store_call
from prefect_webhooks.delivery.destinations import ResolvedDestination
from prefect_webhooks.store.ordering import behind_earlier, set_ordered
from prefect_webhooks.store.outbox import Claimed, release_leases

Ready = tuple[Claimed, ResolvedDestination]


async def sync_ordered(ready: list[Ready], context: DeliveryContext) -> None:
    """Record in the store each batch destination whose ``ordered`` field differs from the store's list."""
    await context.shared.refresh({destination.name for _, destination in ready})
    seen: set[str] = set()
    for _, destination in ready:
        if destination.name in seen:
            continue
        seen.add(destination.name)
        if context.shared.is_ordered(destination.name) != destination.ordered:
            await store_call(context.settings, set_ordered, context.engine, destination.name, destination.ordered)
            context.shared.note_ordered(destination.name, destination.ordered)


async def hold_back(ready: list[Ready], context: DeliveryContext) -> list[Ready]:
    """Give back the messages of ordered destinations that wait for an earlier message of their user."""
    ids = [row.id for row, destination in ready if destination.ordered]
    if not ids:
        return ready
    behind = set(await store_call(context.settings, behind_earlier, context.engine, ids))
    if not behind:
        return ready
    await store_call(context.settings, release_leases, context.engine, sorted(behind), context.owner)
    return [(row, destination) for row, destination in ready if row.id not in behind]
