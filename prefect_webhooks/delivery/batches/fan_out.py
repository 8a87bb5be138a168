"""Fan-out in a batch: messages of destinations that deliver to each endpoint go to one endpoint per row.

A destination block with ``each_endpoint`` gives every endpoint every message independently. The queue holds one
row per message and endpoint (``store.queue.fan_out`` splits a message at its first claim); here each such row is paired
with its destination narrowed to its endpoint (``ResolvedDestination.narrowed``), so everything after this step
(filters, disabled endpoints, rate limits, ordering, batching, sending, the decision, the attempt log) treats it as
a message of a one-endpoint destination. A row bound to an endpoint the block no longer lists fails for good.
"""

from __future__ import annotations

from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.pacing.decision import BatchWrites
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.store.queue.fan_out import split_by_endpoint
from prefect_webhooks.store.queue.outbox import Claimed

Pair = tuple[Claimed, ResolvedDestination]


async def bind_to_endpoints(
    ready: list[Pair], context: DeliveryContext, writes: BatchWrites
) -> tuple[list[Pair], list[Claimed]]:
    """Split the messages of fan-out destinations per endpoint and narrow each row's destination to its endpoint.

    Returns:
        The rows to send (copies made by the split included), each with the destination it goes to; and the copies
        the split made (the batch holds them from now on).
    """
    if not any(row.endpoint is not None or destination.each_endpoint for row, destination in ready):
        return ready, []
    unbound = [(row.id, destination.endpoint_keys()) for row, destination in ready
               if row.endpoint is None and destination.each_endpoint]
    split = await store_call(context.settings, split_by_endpoint, context.engine, unbound, context.owner,
                             lease_seconds=context.settings.delivery.lease_seconds) if unbound else {}
    narrowed: dict[tuple[str, str], ResolvedDestination | None] = {}
    bound: list[Pair] = []
    copies: list[Claimed] = []
    for row, destination in ready:
        if row.endpoint is None and not destination.each_endpoint:
            bound.append((row, destination))
            continue
        # A row the split left out is held by another claimer now, which sends it.
        rows = split.get(row.id, []) if row.endpoint is None else [row]
        copies.extend(rows[1:])
        for one in rows:
            assert one.endpoint is not None
            key = (destination.name, one.endpoint)
            if key not in narrowed:
                narrowed[key] = destination.narrowed(one.endpoint)
            target = narrowed[key]
            if target is None:
                writes.fail(one, f"permanent: the endpoint this message was bound to is no longer in destination "
                                 f"block {destination.name!r}", one.attempts, one.first_attempt_at)
            else:
                bound.append((one, target))
    return bound, copies
