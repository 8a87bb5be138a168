"""What a receiver answered, kept with the attempt: its start, with what the request carried masked."""

from __future__ import annotations

import json

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.sending.answers import ACCEPTANCE_BYTES, MASK, REFUSAL_BYTES, answer_excerpt
from prefect_webhooks.messages.outcomes import FAILED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import MessageQuery, find_messages
from prefect_webhooks.store.queue.outbox import enqueue
from tests.receivers import Receiver

TOKEN = "t0k3n-very-secret-value"


def test_a_refusal_keeps_its_first_kilobyte_and_an_acceptance_a_little() -> None:
    long = b"x" * 5000
    assert answer_excerpt(long, 422, "https://r.example.com/h", {}) == "x" * REFUSAL_BYTES
    assert answer_excerpt(long, 200, "https://r.example.com/h", {}) == "x" * ACCEPTANCE_BYTES
    assert answer_excerpt(b"", 500, "https://r.example.com/h", {}) is None
    assert answer_excerpt(b"bad \xff byte", 400, "https://r.example.com/h", {}) == "bad \ufffd byte"


def test_what_the_request_carried_is_masked_wherever_the_answer_repeats_it() -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "key-0123456789", "Content-Type": "application/json",
               "X-Tenant": "42"}
    answer = json.dumps({"seen": f"Bearer {TOKEN}", "alone": TOKEN, "key": "key-0123456789",
                         "ct": "application/json", "tenant": "42"}).encode()
    kept = answer_excerpt(answer, 401, "https://user:pa%24%24word-123@r.example.com/h", headers)
    assert TOKEN not in kept and "key-0123456789" not in kept and kept.count(MASK) == 3
    assert '"ct": "application/json"' in kept and '"tenant": "42"' in kept  # no secret, or too short to mask
    echoed = answer_excerpt(b"your password pa$$word-123 is wrong", 401,
                            "https://user:pa%24%24word-123@r.example.com/h", {})
    assert echoed == f"your password {MASK} is wrong"
    # A secret the cut would split is masked whole, not left as a prefix.
    straddling = b"y" * (REFUSAL_BYTES - 5) + TOKEN.encode()
    kept = answer_excerpt(straddling, 500, "https://r.example.com/h", {"Authorization": TOKEN})
    assert kept == "y" * (REFUSAL_BYTES - 5) + MASK[:5] and TOKEN[:5] not in kept[-10:]


@pytest.mark.usefixtures("prefect_harness")
async def test_the_receivers_answer_is_kept_with_each_attempt_without_the_secret_it_echoed(store_url: str) -> None:
    enqueue("crm", [{"type": "track", "userId": "ann", "event": "E", "timestamp": "2026-03-04T05:06:07.123Z"}])
    refusal = {"status": 422, "echo_headers": True, "text": '{"error": "field plan is required"}'}
    with Receiver(script=[refusal]) as receiver:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("crm", WebhookDestination(
                endpoints=[{"url": receiver.url, "headers": {"Authorization": f"Bearer {TOKEN}"}}]))
            await deliver_due(DeliveryOptions(), context=context)
        receiver.wait_for(1)
    with get_engine().connect() as connection:
        (message,) = find_messages(connection, MessageQuery())
    assert message.state == FAILED
    (attempt,) = message.tries
    assert attempt.status_code == 422 and attempt.response.endswith('{"error": "field plan is required"}')
    assert '"Authorization": "****"' in attempt.response and TOKEN not in attempt.response
    assert '"Content-Type": "application/json"' in attempt.response  # what holds no secret stays readable
