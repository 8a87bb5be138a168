"""Endpoint controls around a batch's requests: what a batch does before it sends and after.

Before: messages whose every endpoint is disabled fail (``lifecycle``), an ordered destination's messages behind
an earlier one of their user are given back (``ordering``), and messages to rate-limited, paused or ramping
endpoints take budget or wait in the outbox (``rate_limits``). After: ``Retry-After`` answers pause their endpoint
for every process (``rate_limits``) and the requests feed each endpoint's health and events (``lifecycle``).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect_webhooks.delivery.pacing.context import DeliveryContext
from prefect_webhooks.delivery.pacing.lifecycle import fail_where_all_disabled, observe_health
from prefect_webhooks.delivery.pacing.ordering import hold_back, sync_ordered
from prefect_webhooks.delivery.pacing.rate_limits import Ready, Slots, admit_ready, record_pauses
from prefect_webhooks.delivery.sending.sender import RequestResult
from prefect_webhooks.messages.outcomes import OutcomeRecords


async def before_sending(
    ready: list[Ready], context: DeliveryContext, records: OutcomeRecords, held: set[int]
) -> tuple[list[Ready], Slots]:
    """The messages to send now (those of batching destinations included), and when those that took budget go.

    ``held`` is the batch's rows; those given back to the outbox leave it.
    """
    if not ready:
        return ready, Slots()
    ready = await fail_where_all_disabled(ready, records, context)
    await sync_ordered(ready, context)
    ready = await hold_back(ready, context, held)
    return await admit_ready(ready, context, records)


async def after_sending(
    ready: Sequence[Ready], results_by_row: Sequence[Sequence[RequestResult]], context: DeliveryContext
) -> None:
    """Share what the requests said about their endpoints: pauses, health, events."""
    if ready:
        await record_pauses(ready, results_by_row, context)
        await observe_health(ready, results_by_row, context)
