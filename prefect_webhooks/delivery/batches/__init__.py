"""Batches: the claim loop and one try of each claimed batch. It takes in due outbox rows (claimed from the store's
queue) and hands their outcomes and attempt records back to the store, recorded in waves as requests finish.

Read in this order:

- ``claims``: ``deliver_due``, the claim loop, with its ``DeliveryOptions`` (and a delivery worker's ``Shift``).
- ``task``: the Prefect task ``deliver-batches`` (the batches of one window), whose retries resend what is left.
- ``batch``: one try of a claimed batch: send every message to every URL of its destination, decide, record.
- ``batching``: messages of a destination with ``batch_size`` sent as signed arrays, halved when too large.
- ``fan_out``: messages of destinations that deliver to each endpoint paired with one endpoint each.
- ``waves``: a batch's outcomes recorded as its requests finish, not once the slowest is in.
"""

from prefect_webhooks.delivery.batches.claims import DeliveryOptions, Shift, current_shift, deliver_due

__all__ = [
    "DeliveryOptions",
    "Shift",
    "current_shift",
    "deliver_due",
]
