"""resend_messages: a kept message sent again through the normal path, to a real receiver on 127.0.0.1."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, FILTERED, PENDING
from prefect_webhooks.store.engines import get_engine
from prefect_webhooks.store.kept_purges import purge_kept
from prefect_webhooks.store.outbox import enqueue
from prefect_webhooks.store.replay import RESENT, resend_messages
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message, finish

pytestmark = pytest.mark.usefixtures("prefect_harness")

OLD_SECRET, NEW_SECRET = "old-s3cret-000001", "new-s3cret-000002"


def track(user: str, n: int) -> dict:
    return {"type": "track", "userId": user, "event": "E", "properties": {"n": n},
            "timestamp": "2026-03-04T05:06:07.123Z"}


async def deliver(url: str, secret: str) -> None:
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        context.destinations.remember("crm", WebhookDestination(endpoints=[{"url": url}], shared_secret=secret))
        await deliver_due(DeliveryOptions(), context=context)


async def test_a_delivered_and_a_failed_message_are_sent_again_with_their_id_and_the_current_secret(
    store_url: str,
) -> None:
    with Receiver(script=[200, 410]) as receiver:
        for n in range(2):  # one at a time: the first answered 200, the second 410
            enqueue("crm", [track("ann", n)])
            await deliver(receiver.url, OLD_SECRET)
        first = receiver.wait_for(2)
        assert [row.state for row in every_message()] == [DELIVERED, FAILED]
        assert resend_messages([1, 2]) == {1: RESENT, 2: RESENT}
        assert [(row.state, row.attempts) for row in every_message()] == [(PENDING, 0), (PENDING, 0)]
        # The secret was rotated since: the new requests are signed with the one the block holds now.
        await deliver(receiver.url, NEW_SECRET)
        again = receiver.wait_for(4)[2:]
    assert [row.state for row in every_message()] == [DELIVERED, DELIVERED]
    assert sorted(r.headers["Idempotency-Key"] for r in again) == sorted(r.headers["Idempotency-Key"] for r in first)
    for request in again:
        assert request.headers["X-Signature"] == hmac.new(NEW_SECRET.encode(), request.body,
                                                          hashlib.sha1).hexdigest()
    # Each keeps the attempts it had and gets the new one.
    assert [(a.outbox_id, a.status_code) for a in every_attempt()] == [(1, 200), (2, 410), (1, 200), (2, 200)]


def test_what_cannot_be_sent_again_is_named(store_url: str) -> None:
    enqueue("crm", [track("ann", 0), track("bob", 1), track("cy", 2)])
    finish(store_url, [2], FILTERED, reason="filtered: rule 1")
    finish(store_url, [3], DELIVERED)
    with get_engine().begin() as connection:
        purge_kept(connection, "cy")
    outcomes = resend_messages([1, 2, 3, 99])
    assert outcomes[1].startswith("still queued")
    assert outcomes[2].startswith("filtered: the destination's rules dropped it")
    assert outcomes[3].startswith("purged by a deletion request")
    assert outcomes[99].startswith("neither queued nor kept")
    assert [row.state for row in every_message()] == [PENDING, FILTERED, DELIVERED]
