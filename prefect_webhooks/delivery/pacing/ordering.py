"""Ordered delivery in a batch: keep the store's list of ordered destinations in step with the blocks, hold back
any message claimed before its destination was listed (``store.queue.ordering`` explains the claim rule), and send each
user's next messages behind the one claimed, in turn.

The claim already takes only each user's oldest pending message of a listed destination. A destination whose
block was just switched to ``ordered`` may have had a user's later messages claimed before the switch reached the
store: a batch re-checks the messages of ordered destinations in one query and gives back those that have an
earlier pending message of their user, unsent; the claim skips them until their turn.

One message per user per claim would make a user's backlog of 20 take 20 claims. So the batch also leases the
user's following messages that are due (``store.queue.followers``) and sends them one after another behind the claimed
one, each once the one before was delivered or failed for good; the first to be retried ends the run, and the ones
after it go back to the outbox unsent, behind it. Destinations with rate budget to take (each request has its own
slot) or that batch messages keep one message per user per claim.
"""

from __future__ import annotations

from collections.abc import Callable

from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.pacing.rate_limits import Slots, limits_of
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.store.queue.followers import claim_followers
from prefect_webhooks.store.queue.ordering import behind_earlier, set_ordered
from prefect_webhooks.store.queue.outbox import Claimed, release_leases

Ready = tuple[Claimed, ResolvedDestination]
# Most messages of one user a batch takes behind the claimed one: a user's backlog goes in a few claims, and one
# user's run does not hold a sender's worker for long.
FOLLOWERS_PER_USER = 50


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


async def hold_back(ready: list[Ready], context: DeliveryContext, held: set[int]) -> list[Ready]:
    """Give back the messages of ordered destinations that wait for an earlier message of their user (they leave
    ``held``, the batch's rows)."""
    ids = [row.id for row, destination in ready if destination.ordered]
    if not ids:
        return ready
    behind = set(await store_call(context.settings, behind_earlier, context.engine, ids))
    if not behind:
        return ready
    context.give_up_rows(behind, held)
    await store_call(context.settings, release_leases, context.engine, sorted(behind), context.owner)
    return [(row, destination) for row, destination in ready if row.id not in behind]


async def take_in_order(
    ready: list[Ready],
    slots: Slots,
    context: DeliveryContext,
    keep: Callable[[list[Ready]], list[Ready]],
    held: set[int],
) -> tuple[list[Ready], list[list[int]]]:
    """Add to ``ready`` each ordered user's next messages that can go in this batch, behind the claimed one.

    Args:
        ready: The batch's messages to send now, unbatched, each its user's oldest pending one where ordered.
        slots: The rate budget they took (a message with a slot is never a run's head).
        context: The process's store and shared endpoint state.
        keep: What of the added messages is sent (a destination filter records the ones it drops).
        held: The rows the batch holds until its outcomes are recorded; the followers it takes are added.

    Returns:
        The messages to send, and the runs that go in turn, as indexes into them (head first).
    """
    # limits_of reads the shared state of each endpoint: once per destination, not per message. A row bound to one
    # endpoint of a fan-out destination takes no followers: the user's later messages are not split yet.
    candidates = {destination.name: destination for _, destination in ready
                  if destination.ordered and destination.batching is None and destination.only is None}
    in_turn = {name for name, destination in candidates.items() if not limits_of(destination, context)}
    heads = {row.id: destination for row, destination in ready
             if destination.name in in_turn and destination.only is None and row.id not in slots.at}
    if not heads:
        return ready, []
    followers = await store_call(context.settings, claim_followers, context.engine, sorted(heads), context.owner,
                                 per_user=FOLLOWERS_PER_USER, lease_seconds=context.settings.delivery.lease_seconds)
    followers = await _not_sent_elsewhere(followers, context, held)
    if not followers:
        return ready, []
    added = keep([(row, heads[head_id]) for head_id, rows in followers.items() for row in rows])
    index_of = {row.id: index for index, (row, _) in enumerate(ready) if row.id in heads}
    runs: dict[int, list[int]] = {}
    behind = {row.id: head_id for head_id, rows in followers.items() for row in rows}
    for offset, (row, _) in enumerate(added, start=len(ready)):
        head_id = behind[row.id]
        runs.setdefault(head_id, [index_of[head_id]]).append(offset)
    return [*ready, *added], list(runs.values())


async def _not_sent_elsewhere(
    followers: dict[int, list[Claimed]], context: DeliveryContext, held: set[int]
) -> dict[int, list[Claimed]]:
    """Cut each run at its first row another batch of this process is sending (the follower claim took it again
    after that batch's lease lapsed); the rows after a cut go back to the outbox, the rest join ``held``."""
    runs: dict[int, list[Claimed]] = {}
    cut: list[int] = []
    for head_id, rows in followers.items():
        taken = context.take_rows((row.id for row in rows), held)
        length = next((n for n, row in enumerate(rows) if row.id not in taken), len(rows))
        run = rows[:length]
        cut += [row.id for row in rows[length:] if row.id in taken]
        if run:
            runs[head_id] = run
    if cut:
        context.give_up_rows(cut, held)
        await store_call(context.settings, release_leases, context.engine, cut, context.owner)
    return runs
