"""Ordered delivery per user at a real receiver: two delivery processes, a third of the requests failing (retried),
and still every user's messages arrive in the order they were accepted (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import orjson
import pytest

from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.store.outbox import enqueue
from tests.faults import start_worker, worker_result
from tests.receivers import Receiver
from tests.stored import every_message

USERS, PER_USER = 40, 6


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_each_users_messages_arrive_in_order_through_retries_and_two_workers(backend_url: str) -> None:
    chance = random.Random(20)
    # A third of all requests answer 503, whichever message they carry: retries everywhere.
    script = [503 if chance.random() < 0.33 else 200 for _ in range(3 * USERS * PER_USER)]
    with Receiver(script=script) as receiver:
        for seq in range(PER_USER):
            # One call per user at a time, as a client that waits for each answer sends them.
            enqueue("ordered", [{"type": "track", "userId": f"u{user}", "event": "E", "properties": {"seq": seq}}
                                for user in range(USERS)])
        block = {"endpoints": [{"url": receiver.url}], "ordered": True}
        env = {"PREFECT_WEBHOOKS_RETRY_BASE_DELAY": "0.1", "PREFECT_WEBHOOKS_RETRY_MAX_DELAY": "0.3",
               "PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD": "1000"}
        workers = [start_worker(backend_url, {"ordered": block}, run_seconds=7, until_empty=False, env=env)
                   for _ in range(2)]
        results = [worker_result(worker) for worker in workers]
    states = Counter(message.state for message in every_message())
    assert states == {DELIVERED: USERS * PER_USER}
    # Both processes delivered.
    assert all(result["delivered"] > 0 for result in results), results
    sent: dict[str, list[int]] = defaultdict(list)
    for request in receiver.requests:
        body = orjson.loads(request.body)
        sent[body["userId"]].append(body["properties"]["seq"])
    retried = sum(len(seqs) - PER_USER for seqs in sent.values())
    print(f"\n{USERS * PER_USER} messages, {retried} retries; per-user arrival order kept")
    assert retried > 50
    # Every attempt of a user's message comes after the previous message's last attempt: a retry holds back only
    # that user's later messages, never skips ahead.
    for user, seqs in sent.items():
        assert seqs == sorted(seqs), (user, seqs)
        assert sorted(set(seqs)) == list(range(PER_USER))
