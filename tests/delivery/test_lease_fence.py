"""A batch sends only the rows it still holds: a lease that lapsed while the batch waited cannot make a duplicate.

The mechanism behind the duplicates of a Prefect outage: a batch waited for the API (its destination block), its
lease lapsed, another run claimed and delivered the rows, then the first batch sent them again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.batches import waves as waves_module
from prefect_webhooks.delivery.batches.batch import process_batch
from prefect_webhooks.delivery.pacing.context import ClaimedBatch
from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.ordering import set_ordered
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
from tests.delivery.test_delivery import outbox, track
from tests.outages import switched_api
from tests.receivers import ReceivedRequest, Receiver


@pytest.fixture
def short_lease(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PREFECT_WEBHOOKS_LEASE_SECONDS", "0.3")
    monkeypatch.setenv("PREFECT_WEBHOOKS_API_WAIT_SECONDS", "1.0")
    get_settings.cache_clear()
    return store_url


def numbers(request: ReceivedRequest) -> list[int]:
    """The messages' ``n`` in a request: one message, or the items of a batch."""
    body = orjson.loads(request.body)
    messages = [item["message"] for item in body] if isinstance(body, list) else [body]
    return [message["properties"]["n"] for message in messages]


# The fence sits in the step every batch goes through: messages sent one per request and batched requests alike.
@pytest.mark.parametrize("batch_size", [None, 8], ids=["one-per-request", "batched"])
async def test_a_batch_whose_lease_lapsed_while_it_waited_for_prefect_sends_nothing_twice(
    prefect_harness: None, short_lease: str, batch_size: int | None
) -> None:
    enqueue("fence-dest", [track(n) for n in range(20)])
    with Receiver() as receiver:
        block = WebhookDestination(endpoints=[{"url": receiver.url}], batch_size=batch_size)
        await asyncio.to_thread(block.save, "fence-dest", overwrite=True)
        with switched_api() as switch:
            async with Sender() as sender:
                waiting = DestinationCache(ttl=0)
                await waiting.get("fence-dest")  # loaded once: every later batch reloads it first
                first = DeliveryContext(get_engine(), sender, owner="first", destinations=waiting)
                rows = claim_due_deliveries(get_engine(), 100, "first", lease_seconds=0.3)
                assert len(rows) == 20
                switch.hang()
                # The first batch waits up to api_wait_seconds for the block; its 0.3 s lease lapses meanwhile.
                held_up = asyncio.ensure_future(process_batch(ClaimedBatch(rows), first))
                await asyncio.sleep(0.5)
                other = DeliveryContext(get_engine(), sender, owner="other")
                other.destinations.remember("fence-dest", block)
                taken_over = await deliver_due(DeliveryOptions(), context=other)
                late = await held_up
        received = Counter(n for request in receiver.requests for n in numbers(request))
    assert taken_over.delivered == 20
    assert late.delivered == 0 and late.rescheduled == 0
    assert sorted(received) == list(range(20)) and set(received.values()) == {1}
    assert {row.state for row in outbox()} == {"delivered"}


async def test_a_batch_keeps_its_leases_until_its_outcomes_are_recorded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record slower than the lease: the store's disk busy (simulated: a slow fsync cannot be made on demand). The
    # run's own claim loop claims again meanwhile; delivered rows stay claimable until the record's DELETE commits.
    monkeypatch.setenv("PREFECT_WEBHOOKS_LEASE_SECONDS", "0.3")
    get_settings.cache_clear()
    real_record = waves_module.record_outcomes

    def slow_record(*args: object, **kwargs: object) -> None:
        time.sleep(1.0)
        real_record(*args, **kwargs)

    monkeypatch.setattr(waves_module, "record_outcomes", slow_record)
    enqueue("keeper-dest", [track(n) for n in range(20)])
    with Receiver() as receiver:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender, owner="keeper")
            context.destinations.remember("keeper-dest", WebhookDestination(endpoints=[{"url": receiver.url}]))
            stats = await deliver_due(DeliveryOptions(parallel_batches=2, idle_sleep=0.05), context=context)
        received = Counter(n for request in receiver.requests for n in numbers(request))
    assert stats.delivered == 20
    assert sorted(received) == list(range(20)) and set(received.values()) == {1}
    assert {row.state for row in outbox()} == {"delivered"}


async def test_rows_claimed_again_by_their_own_process_after_its_lease_lapsed_go_out_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process stalled past the lease (a loaded machine, a store outage longer than the lease) and its own claim
    # loop took the rows again: the same owner, so the store's fence lets both batches through (CI, 2026-11-29: 20
    # messages delivered twice). The first batch to reach its fence sends them; the other leaves them to it.
    monkeypatch.setenv("PREFECT_WEBHOOKS_LEASE_SECONDS", "0.3")
    get_settings.cache_clear()
    enqueue("again-dest", [track(n) for n in range(20)])
    with Receiver() as receiver:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender, owner="stalled")
            context.destinations.remember("again-dest", WebhookDestination(endpoints=[{"url": receiver.url}]))
            first = claim_due_deliveries(get_engine(), 100, context.owner, lease_seconds=0.3)
            await asyncio.sleep(0.4)
            again = claim_due_deliveries(get_engine(), 100, context.owner, lease_seconds=0.3)
            assert sorted(row.id for row in again) == sorted(row.id for row in first) and len(first) == 20
            results = await asyncio.gather(process_batch(ClaimedBatch(first), context),
                                           process_batch(ClaimedBatch(again), context))
        received = Counter(n for request in receiver.requests for n in numbers(request))
    assert sorted(received) == list(range(20)) and set(received.values()) == {1}
    assert sorted(result.delivered for result in results) == [0, 20]
    assert {row.state for row in outbox()} == {"delivered"} and not context.sending


async def test_an_ordered_run_stops_at_a_row_another_batch_of_its_process_is_sending(
    store_url: str,
) -> None:
    enqueue("ordered-dest", [{**track(n), "userId": "one-user"} for n in range(6)])
    with Receiver() as receiver:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender, owner="runs")
            context.destinations.remember("ordered-dest", WebhookDestination(
                endpoints=[{"url": receiver.url}], ordered=True))
            set_ordered(get_engine(), "ordered-dest", True)
            head = claim_due_deliveries(get_engine(), 100, context.owner)
            elsewhere = [row.id for row in outbox()][2]
            context.take_rows([elsewhere], set())  # as another batch of this process holding the third message
            result = await process_batch(ClaimedBatch(head), context)
        received = [n for request in receiver.requests for n in numbers(request)]
    # The run stops before the third message; the ones after it go back to the outbox, unleased.
    assert received == [0, 1] and result.delivered == 2
    after = [row for row in outbox() if row.id > elsewhere]
    assert [row.state for row in after] == ["pending"] * 3 and all(row.lease_owner is None for row in after)
    assert list(context.sending) == [elsewhere]


async def test_a_retry_claimed_again_as_its_record_commits_goes_out_then_not_a_lease_later(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim loop's next claim can land between the commit of a wave's record and the moment the batch that
    # recorded it resumes (a loaded machine: CI, 2026-12-04, a fan-out message sent 120 s late). The retry is due
    # already; that claim's batch reaches its fence first. The record's commit is made to be followed at once, in
    # its thread, by that claim and its batch (the interleaving cannot be had on demand otherwise).
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.01")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "0.01")
    get_settings.cache_clear()
    real_record = waves_module.record_outcomes
    claimed_again: list[Any] = []
    loop = asyncio.get_running_loop()

    def record_then_claim(*args: object, **kwargs: object) -> None:
        real_record(*args, **kwargs)
        if claimed_again:
            return
        time.sleep(0.05)  # the retry falls due
        rows = claim_due_deliveries(get_engine(), 100, context.owner)
        claimed_again.append(rows)
        claimed_again.append(asyncio.run_coroutine_threadsafe(
            process_batch(ClaimedBatch(rows), context), loop).result(timeout=30))

    monkeypatch.setattr(waves_module, "record_outcomes", record_then_claim)
    enqueue("again-dest", [track(0)])
    with Receiver(script=[500]) as receiver:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender, owner="one-process")
            context.destinations.remember("again-dest", WebhookDestination(endpoints=[{"url": receiver.url}]))
            first = await process_batch(ClaimedBatch(claim_due_deliveries(get_engine(), 100, context.owner)),
                                        context)
    rows, again = claimed_again
    assert first.rescheduled == 1 and len(rows) == 1
    # The second batch sends the retry at once; before, its fence left it to the first batch, which had recorded it
    # and sent nothing more, and the claim's lease kept it from every claim for the lease (120 s).
    assert again.delivered == 1 and len(receiver.requests) == 2
    assert [row.state for row in outbox()] == ["delivered"] and not context.sending
