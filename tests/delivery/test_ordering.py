"""Ordered delivery per user at a real receiver: a user's messages go in turn behind the claimed one and stop at a
retry; two delivery processes, a third of the requests failing (retried), and still every user's messages arrive in
the order they were accepted (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.batches.batch import process_batch
from prefect_webhooks.delivery.pacing.context import ClaimedBatch
from prefect_webhooks.messages.outcomes import DELIVERED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.ordering import set_ordered
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
from tests.faults import start_workers, worker_result
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message

USERS, PER_USER = 40, 6


def seqs_received(receiver: Receiver) -> dict[str, list[int]]:
    sent: dict[str, list[int]] = defaultdict(list)
    for request in receiver.requests:
        body = orjson.loads(request.body)
        sent[body["userId"]].append(body["properties"]["seq"])
    return dict(sent)


@pytest.fixture
def quick_retries(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.2")
    get_settings.cache_clear()
    return store_url


async def test_a_users_messages_go_in_turn_in_one_batch_and_stop_at_a_retry(quick_retries: str) -> None:
    answered = set()

    def once_503_for_a3(body: bytes) -> int | None:
        message = orjson.loads(body)
        if (message["userId"], message["properties"]["seq"]) == ("a", 3) and "a3" not in answered:
            answered.add("a3")
            return 503
        return None

    with Receiver(answer_for=once_503_for_a3) as receiver:
        enqueue("ordered", [{"type": "track", "userId": "a", "event": "E", "properties": {"seq": seq}}
                            for seq in range(10)])
        enqueue("ordered", [{"type": "track", "userId": "b", "event": "E", "properties": {"seq": 0}}])
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("ordered", WebhookDestination(
                endpoints=[{"url": receiver.url}], ordered=True))
            set_ordered(get_engine(), "ordered", True)
            # One claim takes each user's oldest message; the batch sends a's next ones behind it, one at a time.
            claimed = claim_due_deliveries(get_engine(), 100, context.owner)
            assert len(claimed) == 2
            result = await process_batch(ClaimedBatch(claimed), context)
            first_batch = seqs_received(receiver)
            messages = {message.id: message for message in every_message()}
            await deliver_due(DeliveryOptions(run_for_seconds=2.0, idle_sleep=0.05), context=context)
        sent = seqs_received(receiver)
    # a's run stopped at the 503: 0-3 sent, 4-9 left unsent, unleased, with no attempt, behind the retry.
    assert first_batch == {"a": [0, 1, 2, 3], "b": [0]}, first_batch
    assert (result.delivered, result.rescheduled) == (4, 1)
    waiting = [message for message in messages.values() if message.state == PENDING]
    assert [message.id for message in waiting] == list(range(4, 11))
    assert [message.attempts for message in waiting] == [1] + [0] * 6
    assert all(message.lease_owner is None for message in waiting[1:])
    # Then the retry, and the rest in turn behind it: each message once, in the order accepted.
    assert sent == {"a": [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9], "b": [0]}, sent
    assert Counter(message.state for message in every_message()) == {DELIVERED: 11}
    assert len(every_attempt()) == 12


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_each_users_messages_arrive_in_order_through_retries_and_two_workers(backend_url: str, tmp_path: Path) -> None:
    chance = random.Random(20)
    # A third of all requests answer 503, whichever message they carry: retries everywhere. Each answer takes 20 ms, so
    # a worker's two batches in flight hold 16 users for a few hundred ms, and the other worker still finds users to
    # claim if its first claim comes a little late.
    script = [{"status": 503 if chance.random() < 0.33 else 200, "delay": 0.02} for _ in range(3 * USERS * PER_USER)]
    with Receiver(script=script) as receiver:
        for seq in range(PER_USER):
            # One call per user at a time, as a client that waits for each answer sends them.
            enqueue("ordered", [{"type": "track", "userId": f"u{user}", "event": "E", "properties": {"seq": seq}}
                                for user in range(USERS)])
        block = {"endpoints": [{"url": receiver.url}], "ordered": True}
        # A claim takes 8 users' first messages and their followers (48 of the 240), and both workers make their
        # first claim together: each has users to deliver however slowly its interpreter started.
        env = {"PREFECT_WEBHOOKS_RETRY_BASE_DELAY": "0.1", "PREFECT_WEBHOOKS_RETRY_MAX_DELAY": "0.3",
               "PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD": "1000", "PREFECT_WEBHOOKS_CLAIM_BATCH_SIZE": "8"}
        workers = start_workers(2, tmp_path, backend_url, {"ordered": block}, run_seconds=7, until_empty=False, env=env)
        results = [worker_result(worker) for worker in workers]
    states = Counter(message.state for message in every_message())
    assert states == {DELIVERED: USERS * PER_USER}
    # Both processes delivered.
    assert all(result["delivered"] > 0 for result in results), results
    sent = seqs_received(receiver)
    retried = sum(len(seqs) - PER_USER for seqs in sent.values())
    print(f"\n{USERS * PER_USER} messages, {retried} retries, delivered per worker "
          f"{[result['delivered'] for result in results]}; per-user arrival order kept")
    assert retried > 50
    # Every attempt of a user's message comes after the previous message's last attempt: a retry holds back only
    # that user's later messages, never skips ahead.
    for user, seqs in sent.items():
        assert seqs == sorted(seqs), (user, seqs)
        assert sorted(set(seqs)) == list(range(PER_USER))


async def test_a_retry_is_claimed_when_due_not_at_the_next_idle_claim(quick_retries: str) -> None:
    # Three of the user's messages are refused once: their retries come one after another, each when its backoff
    # (0.2 s) says, although the loop's idle spacing between claims is 2 s.
    refused: dict[int, float] = {}

    def refuse_odd_seqs_once(body: bytes) -> int | None:
        seq = orjson.loads(body)["properties"]["seq"]
        if seq % 2 and seq not in refused:
            refused[seq] = time.time()
            return 503
        return None

    with Receiver(answer_for=refuse_odd_seqs_once) as receiver:
        enqueue("ordered", [{"type": "track", "userId": "a", "event": "E", "properties": {"seq": seq}}
                            for seq in range(6)])
        set_ordered(get_engine(), "ordered", True)
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("ordered", WebhookDestination(
                endpoints=[{"url": receiver.url}], ordered=True))
            await deliver_due(DeliveryOptions(run_for_seconds=2.5, idle_sleep=2.0), context=context)
        arrivals = [(orjson.loads(request.body)["properties"]["seq"], request.at) for request in receiver.requests]
    assert [seq for seq, _ in arrivals] == [0, 1, 1, 2, 3, 3, 4, 5, 5], arrivals
    retried_at = {seq: at for seq, at in arrivals if seq in refused}  # the last request of each refused seq
    gaps = {seq: retried_at[seq] - refused[seq] for seq in refused}
    assert all(0.15 <= gap < 1.0 for gap in gaps.values()), gaps
    assert Counter(message.state for message in every_message()) == {DELIVERED: 6}
