"""Fan-out (``each_endpoint``) at real receivers: every endpoint gets every message, each with its own retries and
outcome; one endpoint down neither holds back the other nor is hidden by it (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict

import orjson
import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.endpoint_counters import endpoint_totals
from prefect_webhooks.store.queue.fan_out import split_by_endpoint
from prefect_webhooks.store.queue.ordering import set_ordered
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
from prefect_webhooks.store.queue.replay import replay_failed
from prefect_webhooks.utilities.urls import display_url
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message

QUICK = DeliveryOptions(run_for_seconds=3.0, until_empty=True, idle_sleep=0.05)


@pytest.fixture
def quick_retries(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {"RETRY_BASE_DELAY": "0.2", "RETRY_MAX_DELAY": "0.4", "CIRCUIT_COOLDOWN_SECONDS": "0.3",
                        "RAMP_UP_SECONDS": "0"}.items():
        monkeypatch.setenv(f"PREFECT_WEBHOOKS_{name}", value)
    get_settings.cache_clear()
    return backend_url


async def deliver_until_settled(context: DeliveryContext, timeout: float = 30.0) -> None:
    """Deliver until no message is queued (retries included), for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while every_message(state=PENDING) and time.monotonic() < deadline:
        await deliver_due(DeliveryOptions(run_for_seconds=0.5, idle_sleep=0.05), context=context)


def events(count: int, users: int = 1) -> list[dict]:
    return [{"type": "track", "userId": f"u{n % users}", "event": "E", "messageId": f"m{n}",
             "properties": {"seq": n}} for n in range(count)]


class Switch:
    """A receiver's answer that is 503 until turned up."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.accepted: Counter[str] = Counter()

    def __call__(self, body: bytes) -> int | None:
        if not self.up.is_set():
            return 503
        self.accepted[orjson.loads(body)["messageId"]] += 1
        return None


async def test_each_endpoint_gets_every_message_once_while_the_other_is_down(quick_retries: str) -> None:
    down = Switch()
    with Receiver() as healthy, Receiver(answer_for=down) as flaky:
        enqueue("fan", events(30))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("fan", WebhookDestination(
                endpoints=[{"url": healthy.url}, {"url": flaky.url}], each_endpoint=True))
            await deliver_due(DeliveryOptions(run_for_seconds=1.5, idle_sleep=0.05), context=context)
            # The healthy endpoint has every message at once; the other has refused each of them so far.
            got_while_down = Counter(orjson.loads(r.body)["messageId"] for r in healthy.requests)
            refused = len(flaky.requests)
            rows = every_message()
            down.up.set()
            await deliver_until_settled(context)
    assert got_while_down == Counter(f"m{n}" for n in range(30))
    assert refused >= 30
    assert all(row.state == DELIVERED for row in rows if any(
        a.url == display_url(healthy.url) for a in every_attempt(outbox_id=row.id)))
    # Then the other gets every message after it recovers, each exactly once; the healthy one got nothing more.
    assert down.accepted == Counter(f"m{n}" for n in range(30))
    assert len(healthy.requests) == 30
    # One kept message per message and endpoint, each with its own outcome and attempts.
    kept = every_message()
    assert len(kept) == 60 and {row.state for row in kept} == {DELIVERED}
    urls = defaultdict(set)
    for attempt in every_attempt():
        urls[attempt.outbox_id].add(attempt.url)
    assert Counter(frozenset(found) for found in urls.values()) == {
        frozenset({display_url(healthy.url)}): 30, frozenset({display_url(flaky.url)}): 30}
    retried = [row for row in kept if display_url(flaky.url) in urls[row.id]]
    assert all(row.attempts >= 2 for row in retried)
    assert all(row.attempts == 1 for row in kept if row not in retried)
    # Each endpoint's counters: 30 delivered requests each, and the refused ones on the flaky endpoint only.
    with get_engine().connect() as connection:
        totals = {totals.url: totals.requests for totals in endpoint_totals(connection)}
    assert totals[display_url(healthy.url)] == {("delivered", "2xx"): 30}
    assert totals[display_url(flaky.url)][("delivered", "2xx")] == 30
    assert totals[display_url(flaky.url)][("retry", "5xx")] == len(flaky.requests) - 30


async def test_an_ordered_fan_out_destination_keeps_each_endpoints_order_and_one_does_not_wait_for_the_other(
        quick_retries: str) -> None:
    rng = random.Random(7)
    down = Switch()

    def sometimes_503(body: bytes) -> int | None:
        return 503 if rng.random() < 0.1 else None

    with Receiver(answer_for=sometimes_503) as first, Receiver(answer_for=down) as second:
        enqueue("fan", events(60, users=6))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("fan", WebhookDestination(
                endpoints=[{"url": first.url}, {"url": second.url}], each_endpoint=True, ordered=True))
            set_ordered(get_engine(), "fan", True)
            await deliver_due(DeliveryOptions(run_for_seconds=4.0, idle_sleep=0.05), context=context)
            first_while_down = Counter(orjson.loads(r.body)["messageId"] for r in first.requests)
            down.up.set()
            await deliver_until_settled(context)

    def order_per_user(requests: list) -> dict[str, list[int]]:
        seen: dict[str, list[int]] = defaultdict(list)
        for request in requests:
            body = orjson.loads(request.body)
            if not seen[body["userId"]] or seen[body["userId"]][-1] != body["properties"]["seq"]:
                seen[body["userId"]].append(body["properties"]["seq"])
        return dict(seen)

    expected = {f"u{u}": list(range(u, 60, 6)) for u in range(6)}
    # The first endpoint had every message, in each user's order, while the second refused everything.
    assert set(first_while_down) == {f"m{n}" for n in range(60)}
    assert order_per_user(first.requests) == expected
    assert order_per_user([r for r in second.requests
                           if orjson.loads(r.body)["messageId"] in down.accepted]) == expected
    assert down.accepted == Counter(f"m{n}" for n in range(60))
    assert Counter(row.state for row in every_message()) == {DELIVERED: 120}


async def test_a_replay_of_one_endpoints_failures_goes_to_that_endpoint_only(quick_retries: str) -> None:
    with Receiver() as healthy, Receiver(default=400) as refusing:
        enqueue("fan", events(10))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            block = WebhookDestination(endpoints=[{"url": healthy.url}, {"url": refusing.url}], each_endpoint=True)
            context.destinations.remember("fan", block)
            await deliver_due(QUICK, context=context)
            outcomes = Counter(row.state for row in every_message())
            refusing.default = 200
            assert replay_failed("fan") == 10
            await deliver_until_settled(context)
    assert outcomes == {DELIVERED: 10, FAILED: 10}
    assert len(healthy.requests) == 10
    assert len(refusing.requests) == 20
    assert Counter(orjson.loads(r.body)["messageId"] for r in refusing.requests[10:]) == Counter(
        f"m{n}" for n in range(10))
    assert Counter(row.state for row in every_message()) == {DELIVERED: 20}


async def test_a_disabled_endpoint_fails_only_its_own_copies(quick_retries: str) -> None:
    with Receiver() as healthy, Receiver() as disabled:
        enqueue("fan", events(5))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("fan", WebhookDestination(
                endpoints=[{"url": healthy.url}, {"url": disabled.url}], each_endpoint=True,
                disabled_endpoints=[{"position": 2, "reason": "maintenance", "disabled_at": "2026-11-27T00:00:00Z"}]))
            await deliver_due(QUICK, context=context)
    assert len(healthy.requests) == 5 and not disabled.requests
    failed = every_message(state=FAILED)
    assert len(failed) == 5
    assert all(row.reason.startswith(f"disabled: endpoint {display_url(disabled.url)} of destination 'fan'")
               for row in failed), failed[0].reason
    assert len(every_message(state=DELIVERED)) == 5


async def test_a_message_bound_to_an_endpoint_the_block_dropped_fails_with_the_reason(quick_retries: str) -> None:
    with Receiver() as first, Receiver(default=503) as second:
        enqueue("fan", events(3))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("fan", WebhookDestination(
                endpoints=[{"url": first.url}, {"url": second.url}], each_endpoint=True))
            await deliver_due(DeliveryOptions(max_batches=1), context=context)
            context.destinations.remember("fan", WebhookDestination(endpoints=[{"url": first.url}],
                                                                    each_endpoint=True))
            await deliver_until_settled(context)
    failed = every_message(state=FAILED)
    assert len(failed) == 3
    assert {row.reason for row in failed} == {
        "permanent: the endpoint this message was bound to is no longer in destination block 'fan'"}
    assert len(every_message(state=DELIVERED)) == 3 and len(first.requests) == 3


def test_a_split_binds_the_row_and_adds_copies_in_message_order(backend_url: str) -> None:
    engine = get_engine()
    enqueue("fan", events(3))
    claimed = claim_due_deliveries(engine, 10, "worker-1")
    split = split_by_endpoint(engine, [(row.id, ["k1", "k2", "k3"]) for row in claimed], "worker-1",
                              lease_seconds=30)
    assert sorted(split) == sorted(row.id for row in claimed)
    for row in claimed:
        rows = split[row.id]
        assert [one.endpoint for one in rows] == ["k1", "k2", "k3"]
        assert rows[0].id == row.id and all(one.body == row.body for one in rows)
    # Copies take ids in their messages' order, endpoint by endpoint within a message.
    copy_ids = [one.id for row in sorted(claimed, key=lambda r: r.id) for one in split[row.id][1:]]
    assert copy_ids == sorted(copy_ids) and min(copy_ids) > max(row.id for row in claimed)
    # A second split of the same rows, or by a claimer that does not hold them, changes nothing.
    assert split_by_endpoint(engine, [(row.id, ["k1", "k2"]) for row in claimed], "worker-1", lease_seconds=30) == {}
    assert len(every_message()) == 9
    assert {row.lease_owner for row in every_message()} == {"worker-1"}


async def test_a_batching_fan_out_destination_sends_each_endpoint_its_own_batches_and_filters_each_copy(
        quick_retries: str) -> None:
    up, accepted = threading.Event(), []

    def batches_once_up(body: bytes) -> int | None:
        if not up.is_set():
            return 503
        accepted.extend(item["message"]["messageId"] for item in orjson.loads(body))
        return None

    with Receiver() as healthy, Receiver(answer_for=batches_once_up) as flaky:
        calls = events(20)
        for call in calls[:4]:
            call["event"] = "Debug Ping"
        enqueue("fan", calls)
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("fan", WebhookDestination(
                endpoints=[{"url": healthy.url}, {"url": flaky.url}], each_endpoint=True, batch_size=8,
                filters=[{"name": "no-debug", "action": "drop", "events": ["Debug Ping"]}]))
            await deliver_due(DeliveryOptions(run_for_seconds=1.0, idle_sleep=0.05), context=context)
            healthy_while_down = [item["message"]["messageId"] for request in healthy.requests
                                  for item in orjson.loads(request.body)]
            up.set()
            await deliver_until_settled(context)
    wanted = [f"m{n}" for n in range(4, 20)]
    # Every request is a batch to one endpoint: the healthy one had its 16 messages in two batches at once.
    assert sorted(healthy_while_down) == sorted(wanted) and len(healthy.requests) == 2
    assert sorted(accepted) == sorted(wanted)
    assert all(len(orjson.loads(request.body)) <= 8 for request in (*healthy.requests, *flaky.requests))
    # Each endpoint's copy of a dropped message is filtered; each copy of the others is delivered.
    assert Counter(row.state for row in every_message()) == {DELIVERED: 32, "filtered": 8}
