"""No message waits on another's answer: a batch records what has finished while its slow answers are out, and in
one transaction when its answers all come quickly.

Real parts: receivers on 127.0.0.1 (``tests/receivers.py``) and a store.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery import waves as waves_module
from prefect_webhooks.messages.outcomes import DELIVERED, PENDING
from prefect_webhooks.store.engines import get_engine
from prefect_webhooks.store.outbox import enqueue
from tests.receivers import Receiver
from tests.stored import every_message

# Messages that fail, endpoints that start failing: their events go to the session's test server.
pytestmark = pytest.mark.usefixtures("prefect_harness")

def track(n: int) -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": f"u{n}", "timestamp": "2026-03-04T05:06:07.123Z", "event": "E",
            "properties": {"n": n}}


async def test_a_batch_records_what_finished_while_its_slow_answers_are_out(store_url: str) -> None:
    enqueue("refusing", [track(1)])
    enqueue("taking", [track(2)])
    enqueue("slow", [track(3)])
    seen: dict[str, float] = {}
    slowly_answering = Receiver(default={"status": 200, "delay": 2.5})
    with Receiver(default=500) as refusing, Receiver() as taking, slowly_answering as slow:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            for name, receiver in (("refusing", refusing), ("taking", taking), ("slow", slow)):
                context.destinations.remember(name, WebhookDestination(endpoints=[{"url": receiver.url}]))
            run = asyncio.ensure_future(deliver_due(DeliveryOptions(max_batches=1), context=context))
            started = time.monotonic()
            while not run.done():
                for row in every_message():
                    if row.destination != "slow" and (row.state == DELIVERED or row.attempts == 1):
                        seen.setdefault(row.destination, time.monotonic() - started)
                if len(seen) == 2:
                    # Recorded, and no longer among the rows the batch holds: only the slow one is.
                    (held,) = [row.id for row in every_message(destination="slow")]
                    assert set(context.sending) == {held}
                    break
                await asyncio.sleep(0.02)
            stats = await run
    assert not run.exception()
    # Both within a wave's wait (0.25 s) and its transaction of their answers, while the slow one took 2.5 s.
    assert seen.keys() == {"refusing", "taking"} and max(seen.values()) < 2.0, seen
    refused, taken, slowly = every_message()
    assert (refused.state, refused.attempts, refused.lease_owner) == (PENDING, 1, None)
    assert taken.state == DELIVERED and slowly.state == DELIVERED
    assert (stats.delivered, stats.rescheduled, stats.batches) == (2, 1, 1)
    assert not context.sending


async def test_a_batch_whose_answers_all_come_quickly_is_recorded_in_one_transaction(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions = []
    real_record = waves_module.record_outcomes

    def counted(*args: Any, **kwargs: Any) -> None:
        transactions.append(args[1])
        real_record(*args, **kwargs)

    monkeypatch.setattr(waves_module, "record_outcomes", counted)
    # 8 requests in flight, each answered after 20 ms: the batch takes about 0.8 s to send its 305 messages.
    monkeypatch.setenv("PREFECT_WEBHOOKS_DELIVERY_CONCURRENCY", "8")
    get_settings.cache_clear()
    enqueue("quick", [track(n) for n in range(300)])
    enqueue("refusing", [track(1000 + n) for n in range(5)])
    with Receiver(default={"status": 200, "delay": 0.02}) as quick, Receiver(default=503) as refusing:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("quick", WebhookDestination(endpoints=[{"url": quick.url}]))
            context.destinations.remember("refusing", WebhookDestination(endpoints=[{"url": refusing.url}]))
            started = time.monotonic()
            stats = await deliver_due(DeliveryOptions(max_batches=1), context=context)
            took = time.monotonic() - started
    # Sending took longer than a wave's wait (0.25 s): still one transaction, as the batch waited for nothing but its
    # own pace, and its retries fall due in 4-6 s.
    print(f"\none batch of 305 messages in {took:.2f} s, recorded in {len(transactions)} transaction(s)")
    assert took > 0.5
    assert (stats.delivered, stats.rescheduled) == (300, 5)
    (records,) = transactions
    assert (len(records.delivered), len(records.rescheduled), len(records.attempts)) == (300, 5, 305)
