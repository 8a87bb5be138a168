"""Pacing: when each message of a claimed batch may go, and when it goes again. It takes in a claimed batch with the
process's context and hands on the messages that may be sent now (rate budget, user order and endpoint health
allowing) and, after the requests, each message's decision: delivered, retried when, or failed and why.

Read in this order:

- ``context``: what the batches of a process share, and store calls that ride out a store restart.
- ``retry_wakeups``: when this process's retries fall due, so the claim loop claims them on time.
- ``controls``: what a batch does before it sends and after (the three below, in turn).
- ``rate_limits``: which messages may go now and at which instant, which wait in the outbox, and pauses.
- ``ordering``: an ordered destination's messages held back or sent one after another per user.
- ``lifecycle``: endpoint health from each batch's requests, operational events, disabling.
- ``decision``: what becomes of one message after its requests: delivered, retried when, or failed and why.
"""

from prefect_webhooks.delivery.pacing.context import ClaimedBatch, DeliveryContext, is_store_unavailable, store_call
from prefect_webhooks.delivery.pacing.controls import after_sending, before_sending
from prefect_webhooks.delivery.pacing.decision import BatchWrites, decide
from prefect_webhooks.delivery.pacing.ordering import take_in_order
from prefect_webhooks.delivery.pacing.rate_limits import Slots, slots_for, start_ramp
from prefect_webhooks.delivery.pacing.retry_wakeups import LEAD

__all__ = [
    "BatchWrites",
    "ClaimedBatch",
    "DeliveryContext",
    "LEAD",
    "Slots",
    "after_sending",
    "before_sending",
    "decide",
    "is_store_unavailable",
    "slots_for",
    "start_ramp",
    "store_call",
    "take_in_order",
]
