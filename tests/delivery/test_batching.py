"""Batched delivery against real receivers: arrays signed whole, items in acceptance order, 413 halves, retries of
the whole batch, per-message deadlines and attempt logs, ``batch_bytes`` and ``batch_wait``; SQLite and PostgreSQL.

The receiver's checks use only the standard library and the published Standard Webhooks library, as a receiver
written outside the project would: it verifies both signatures over the bytes it received, then processes each
item once by its id.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import update
from standardwebhooks.webhooks import Webhook

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.messages.payloads import serialize
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from tests.delivery.test_delivery import attempts, deliver, outbox, track, wait_until_due
from tests.receivers import ReceivedRequest, Receiver

pytestmark = pytest.mark.usefixtures("prefect_harness")

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def fast_store(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh store on each backend, with short retry delays."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.05")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "0.1")
    get_settings.cache_clear()
    yield backend_url
    get_settings.cache_clear()


class BatchReceiver:
    """What a receiver of batches does: verify the signatures over the raw bytes, then process items once by id."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.webhook = Webhook(secret)
        self.processed: dict[str, dict[str, Any]] = {}
        self.duplicates = 0

    def verify(self, body: bytes, headers: dict[str, str]) -> bool:
        expected = hmac.new(self.secret.encode(), body, hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, headers.get("X-Signature", "")):
            return False
        self.webhook.verify(body, {name.lower(): value for name, value in headers.items()})  # raises if wrong
        return True

    def handle(self, body: bytes) -> None:
        for item in json.loads(body):
            if item["id"] in self.processed:
                self.duplicates += 1
            else:
                self.processed[item["id"]] = item["message"]


def destination(url: str, **options: Any) -> WebhookDestination:
    return WebhookDestination(endpoints=[{"url": url}], shared_secret=SECRET, standard_webhooks=True, **options)


def items(request: ReceivedRequest) -> list[dict[str, Any]]:
    return json.loads(request.body)


async def test_a_batch_is_one_array_signed_whole_in_acceptance_order(fast_store: str) -> None:
    payloads = [track(n) for n in range(250)]
    enqueue("d", payloads)
    checker = BatchReceiver(SECRET)
    with Receiver(verifier=checker.verify) as receiver:
        stats = await deliver({"d": destination(receiver.url, batch_size=100)})
        requests = receiver.wait_for(3)
    assert receiver.rejected == [] and stats.delivered == 250
    assert sorted(len(items(request)) for request in requests) == [50, 100, 100]
    rows = outbox()
    prefix, first = items(requests[0])[0]["id"].rsplit("_", 1)[0] + "_", rows[0].id
    for request in requests:
        ids = [int(item["id"].removeprefix(prefix)) for item in items(request)]
        assert ids == sorted(ids)
        # Each item's message is, byte for byte, the body the message would be sent with alone.
        assert request.body == b"[" + b",".join(
            b'{"id":"%s%d","message":%s}' % (prefix.encode(), outbox_id, serialize(payloads[outbox_id - first]))
            for outbox_id in ids) + b"]"
        assert request.headers["webhook-id"].startswith("batch_")
        assert "Idempotency-Key" not in request.headers
        checker.handle(request.body)
    assert sorted(checker.processed) == sorted(f"{prefix}{row.id}" for row in rows)
    # A request received twice (at-least-once) changes nothing for the receiver.
    checker.handle(requests[0].body)
    assert checker.duplicates == len(items(requests[0])) and len(checker.processed) == 250
    assert {row.state for row in rows} == {DELIVERED}
    assert len(attempts()) == 250


async def test_a_413_splits_the_batch_in_halves_and_each_message_logs_its_attempts(fast_store: str) -> None:
    enqueue("d", [track(n) for n in range(100)])
    with Receiver(script=[413, 413, 200, 200, 200]) as receiver:
        stats = await deliver({"d": destination(receiver.url, batch_size=100)})
        requests = receiver.wait_for(5)
    assert [len(items(request)) for request in requests] == [100, 50, 25, 25, 50]
    sent_ids = [item["id"] for request in requests[2:] for item in items(request)]
    assert sent_ids == [item["id"] for item in items(requests[0])]  # every message once, in order
    assert len({request.headers["webhook-id"] for request in requests}) == 5
    assert stats.delivered == 100
    rows = outbox()
    assert {row.state for row in rows} == {DELIVERED} and {row.attempts for row in rows} == {1}
    outcomes: dict[int, list[str]] = {}
    for attempt in attempts():
        outcomes.setdefault(attempt.outbox_id, []).append(attempt.outcome)
    first = rows[0].id
    assert outcomes[first] == ["split", "split", DELIVERED]
    assert outcomes[first + 99] == ["split", DELIVERED]


async def test_a_single_message_answered_413_fails_for_good(fast_store: str) -> None:
    enqueue("d", [track()])
    with Receiver(default=413) as receiver:
        await deliver({"d": destination(receiver.url, batch_size=10)})
        receiver.wait_for(1)
    (row,) = outbox()
    assert row.state == FAILED and row.reason == "permanent: HTTP 413"


async def test_a_retryable_failure_retries_the_whole_batch_under_the_same_id(
    fast_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A backoff of about a second, and a first run of one claim: it ends before the retry comes due, however loaded
    # the machine (a run that went on until nothing was due sent the retry itself once, beside a CPU hog).
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "1")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "1")
    get_settings.cache_clear()
    enqueue("d", [track(n) for n in range(10)])
    with Receiver(script=[503]) as receiver:
        block = destination(receiver.url, batch_size=10)
        await deliver({"d": block}, max_batches=1)
        rows = outbox()
        assert {row.state for row in rows} == {PENDING}
        assert len({row.next_attempt_at for row in rows}) == 1  # due together
        await wait_until_due()
        await deliver({"d": block})
        first, second = receiver.wait_for(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] and first.body == second.body
    assert {row.state for row in outbox()} == {DELIVERED}
    assert {row.attempts for row in outbox()} == {2}


async def test_the_four_hour_bound_holds_per_message(fast_store: str) -> None:
    enqueue("d", [track(n) for n in range(5)])
    old = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(hours=5)
    first_id = outbox()[0].id
    with get_engine().begin() as connection:
        connection.execute(update(OUTBOX).where(OUTBOX.c.id == first_id)
                           .values(first_attempt_at=old, attempts=3, reason="HTTP 503"))
    with Receiver() as receiver:
        await deliver({"d": destination(receiver.url, batch_size=10)})
        (request,) = receiver.wait_for(1)
    assert len(items(request)) == 4
    states = {row.id: (row.state, row.reason) for row in outbox()}
    assert states.pop(first_id) == (FAILED, "expired: HTTP 503 (after 3 attempts)")
    assert {state for state, _ in states.values()} == {DELIVERED}


async def test_batch_bytes_bounds_every_body(fast_store: str) -> None:
    enqueue("d", [track(n) for n in range(30)])
    with Receiver() as receiver:
        await deliver({"d": destination(receiver.url, batch_size=100, batch_bytes=1024)})
        rows = outbox()
        requests = receiver.wait_for(1)
    assert {row.state for row in rows} == {DELIVERED}
    assert len(requests) > 3 and all(len(request.body) <= 1024 for request in requests)
    assert sum(len(items(request)) for request in requests) == 30


async def test_batch_wait_holds_a_partial_batch_until_its_first_message_waited(fast_store: str) -> None:
    enqueue("d", [track(n) for n in range(3)])
    with Receiver() as receiver:
        block = destination(receiver.url, batch_size=100, batch_wait=2)
        stats = await deliver({"d": block})
        assert receiver.requests == [] and stats.delivered == 0
        assert {(row.state, row.attempts, row.lease_owner) for row in outbox()} == {(PENDING, 0, None)}
        enqueue("d", [track(n) for n in range(3, 5)])
        await wait_until_due()
        await deliver({"d": block})
        (request,) = receiver.wait_for(1)
    assert len(items(request)) == 5
    assert {row.state for row in outbox()} == {DELIVERED}


async def test_fan_out_one_endpoint_accepting_the_batch_delivers_every_item(fast_store: str) -> None:
    enqueue("d", [track(n) for n in range(4)])
    with Receiver(default=500) as failing, Receiver() as accepting:
        block = WebhookDestination(endpoints=[{"url": failing.url}, {"url": accepting.url}], batch_size=4)
        await deliver({"d": block})
        (request,) = accepting.wait_for(1)
    assert failing.requests[0].body == request.body
    assert {row.state for row in outbox()} == {DELIVERED}


def test_batch_options_are_refused_without_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_wait: applies to batches; set batch_size too"):
        WebhookDestination(endpoints=[{"url": "https://a.example.com"}], batch_wait=1)
    with pytest.raises(ValueError, match="batch_size"):
        WebhookDestination(endpoints=[{"url": "https://a.example.com"}], batch_size=4001)
