"""The client's queue and batch framing, without HTTP."""

from __future__ import annotations

import threading
import time

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_webhooks.client.batching import MessageQueue, encode_batch
from prefect_webhooks.client.errors import QueueFullError
from prefect_webhooks.messages.model import MAX_BATCH_BYTES


def message(size: int) -> bytes:
    return orjson.dumps({"type": "track", "pad": "x" * size})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=32_000), min_size=1, max_size=120))
def test_batches_stay_under_500kb_keep_order_and_lose_nothing(sizes: list[int]) -> None:
    queue = MessageQueue(max_size=1_000, flush_at=10_000)
    for size in sizes:
        queue.put(message(size), block_timeout=0)
    queue.close()
    seqs = []
    while (taken := queue.take(flush_after=60)) is not None:
        batch_id, batch = taken
        body = encode_batch(batch, "2026-01-01T00:00:00.000Z")
        assert len(body) <= MAX_BATCH_BYTES
        assert len(orjson.loads(body)["batch"]) == len(batch)
        seqs.extend(item.seq for item in batch)
        queue.settle(batch_id)
    assert seqs == list(range(1, len(sizes) + 1))


def test_flush_at_caps_a_batch_and_the_remainder_waits_for_the_next_trigger() -> None:
    queue = MessageQueue(max_size=100, flush_at=20)
    for _ in range(45):  # queued faster than the sender takes them
        queue.put(message(1), block_timeout=0)
    sizes = []
    for _ in range(2):  # the count trigger fires twice: 45 and then 25 are waiting
        batch_id, batch = queue.take(flush_after=60)
        sizes.append(len(batch))
        queue.settle(batch_id)
    assert sizes == [20, 20] and len(queue) == 5
    # 5 < flush_at: nothing more until flush_after passes (here: the timer of a short flush_after).
    started = time.monotonic()
    batch_id, batch = queue.take(flush_after=0.3)
    assert len(batch) == 5 and time.monotonic() - started >= 0.2


def test_a_flush_sends_a_backlog_in_batches_of_flush_at() -> None:
    queue = MessageQueue(max_size=100, flush_at=7)
    for _ in range(20):
        queue.put(message(1), block_timeout=0)
    queue.close()
    sizes = []
    while (taken := queue.take(flush_after=60)) is not None:
        sizes.append(len(taken[1]))
        queue.settle(taken[0])
    assert sizes == [7, 7, 6]


def test_put_fails_at_once_when_full_without_blocking() -> None:
    queue = MessageQueue(max_size=2, flush_at=10)
    queue.put(b"{}", block_timeout=0)
    queue.put(b"{}", block_timeout=0)
    try:
        queue.put(b"{}", block_timeout=0)
    except QueueFullError:
        pass
    else:
        raise AssertionError("a full queue accepted a message")
    assert len(queue) == 2


def test_wait_settled_waits_for_the_batch_in_flight_not_for_later_messages() -> None:
    queue = MessageQueue(max_size=100, flush_at=1_000)
    queue.put(b"{}", block_timeout=0)
    queue.close()  # makes take() hand out the partial batch at once
    batch_id, _ = queue.take(flush_after=60)
    assert queue.wait_settled(timeout=0.1) is False  # the batch is still in flight
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(queue.wait_settled(timeout=5)))
    waiter.start()
    threading.Event().wait(0.1)
    queue.put(b"{}", block_timeout=0)  # queued after the flush began: not waited for
    queue.settle(batch_id)
    waiter.join(5)
    assert outcome == [True] and len(queue) == 1
