"""No message waits on another's answer: a retry due while slow answers are in flight goes out on time, a fast
destination keeps its pace beside a slow one, and the batches a process keeps in flight stay bounded.

Real parts: receivers on 127.0.0.1 (``tests/receivers.py``), a store on SQLite and on PostgreSQL, and one
continuous ``deliver_due`` run, as a delivery worker runs it. Times come from the receivers' arrival clocks and from
the store (each retry's due time as the outbox held it, each message's creation time).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.batches import claims as claims_module
from prefect_webhooks.delivery.batches import waves as waves_module
from prefect_webhooks.messages.outcomes import DELIVERED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from tests.receivers import ReceivedRequest, Receiver
from tests.stored import every_attempt, every_message

# Messages that fail, endpoints that start failing: their events go to the session's test server.
pytestmark = pytest.mark.usefixtures("prefect_harness")

# The promise of docs/reference/outcomes.md: a retry this process scheduled is claimed within 50 ms of its due time.
RETRY_ON_TIME = 0.05


@pytest.fixture
def one_second_retries(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Retries due 0.8-1.2 s after a failure (the issue's case); no circuit opening on the flaky endpoint, whose
    every first attempt fails."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "1")
    monkeypatch.setenv("PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD", "100000")
    monkeypatch.setenv("PREFECT_WEBHOOKS_ENDPOINT_FAILING_THRESHOLD", "100000")
    get_settings.cache_clear()
    yield backend_url
    get_settings.cache_clear()


def track(n: int) -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": f"u{n}", "timestamp": "2026-03-04T05:06:07.123Z", "event": "E",
            "properties": {"n": n}}


def failing_once() -> Receiver:
    """A receiver answering 500 to each message's first request and 200 to the others."""
    seen: set[bytes] = set()

    def answer(body: bytes) -> int:
        first = body not in seen
        seen.add(body)
        return 500 if first else 200

    return Receiver(answer_for=answer)


def enqueue_ids(destination: str, payloads: list[dict[str, Any]]) -> list[Any]:
    """``enqueue``, then the destination's messages it added (the newest)."""
    enqueue(destination, payloads)
    return every_message(destination=destination)[-len(payloads):]


def epoch(moment: dt.datetime) -> float:
    """A store time (naive UTC) on the receivers' clock."""
    return moment.replace(tzinfo=dt.timezone.utc).timestamp()


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


class DueTimes:
    """Reads the outbox every 50 ms in a thread of its own: the due time each retried message had, as stored."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        self.due: dict[int, dt.datetime] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        statement = select(OUTBOX.c.id, OUTBOX.c.next_attempt_at).where(
            OUTBOX.c.destination == self.destination, OUTBOX.c.state == PENDING, OUTBOX.c.attempts == 1)
        while not self._stop.wait(0.05):
            with get_engine().connect() as connection:
                for outbox_id, due in connection.execute(statement):
                    self.due.setdefault(outbox_id, due)

    def __enter__(self) -> DueTimes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def by_message(requests: list[ReceivedRequest]) -> dict[int, list[float]]:
    """Arrival times per outbox id (the request's idempotency key ends with it)."""
    arrivals: dict[int, list[float]] = {}
    for request in requests:
        arrivals.setdefault(int(request.headers["Idempotency-Key"].rsplit("_", 1)[1]), []).append(request.at)
    return arrivals


async def stream(steps: int, slow_from: int) -> None:
    """One message to ``flaky`` every 0.1 s; from step ``slow_from`` on, one to ``slow`` every other step."""
    for step in range(steps):
        await asyncio.to_thread(enqueue, "flaky", [track(step)])
        if step >= slow_from and step % 2 == 0:
            await asyncio.to_thread(enqueue, "slow", [track(1000 + step)])
        await asyncio.sleep(0.1)


# A bound of 50 ms at p99 on when a retry goes: measured one test at a time (the slow suite), not beside another
# worker's tests on 2 cores (clean-clone runs of 2026-12-04: 0.5 s late once on each store there), with the garbage
# collector tuned as the delivery worker tunes it (``serving_gc``): untuned, a full collection of this process's heap
# stopped the event loop for 0.22-0.25 s, and a retry due then went that late (1 run in 10 on PostgreSQL).
@pytest.mark.slow
async def test_a_retry_goes_out_on_time_while_slow_answers_are_in_flight(one_second_retries: str,
                                                                        serving_gc: None) -> None:
    steps, slow_from = 45, 15
    with failing_once() as flaky, Receiver(default={"status": 200, "delay": 2.0}) as slow, DueTimes("flaky") as due:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("flaky", WebhookDestination(endpoints=[{"url": flaky.url}]))
            context.destinations.remember("slow", WebhookDestination(endpoints=[{"url": slow.url}]))
            # A first message through the run pays what a process pays once (connections, statements, threads).
            (warm_up,) = [row.id for row in await asyncio.to_thread(enqueue_ids, "flaky", [track(-1)])]
            run = asyncio.ensure_future(deliver_due(DeliveryOptions(run_for_seconds=steps * 0.1 + 3.5),
                                                    context=context))
            await asyncio.to_thread(flaky.wait_for, 1)
            await stream(steps, slow_from)
            stats = await run
    messages = every_message()
    flaky_rows = [row for row in messages if row.destination == "flaky" and row.id != warm_up]
    assert all(row.state == DELIVERED for row in messages), [(row.id, row.state, row.reason) for row in messages]
    assert stats.delivered == len(messages) == 1 + steps + (steps - slow_from + 1) // 2
    arrivals = by_message(flaky.requests)
    assert all(len(arrivals[row.id]) == 2 for row in flaky_rows)
    assert set(due.due) - {warm_up} == {row.id for row in flaky_rows}, "a retry's due time was not seen"
    # When each retry was sent: its attempt's time in the store (the sender's clock as the request went out), and
    # when it arrived (the receiver's, which runs in this process: its own thread's turn adds to it).
    sent = {attempt.outbox_id: epoch(attempt.attempted_at) for attempt in every_attempt(url=flaky.url)
            if attempt.status_code == 200}
    late = sorted(sent[row.id] - epoch(due.due[row.id]) for row in flaky_rows)
    arrived_late = sorted(arrivals[row.id][1] - epoch(due.due[row.id]) for row in flaky_rows)
    # First attempts: from the message's creation to its first request (the claim loop's spacing, 0.3 s), before
    # the slow destination's stream began and while its answers were in flight.
    first = {row.id: arrivals[row.id][0] - epoch(row.created_at) for row in flaky_rows}
    alone = [first[row.id] for row in flaky_rows[:slow_from]]
    beside_slow = [first[row.id] for row in flaky_rows[slow_from + 5:]]
    print(f"\nretries sent after their due time: p50 {statistics.median(late) * 1000:.1f} ms, p99 "
          f"{p99(late) * 1000:.1f} ms, max {late[-1] * 1000:.1f} ms (arrived: p50 "
          f"{statistics.median(arrived_late) * 1000:.1f} ms, p99 {p99(arrived_late) * 1000:.1f} ms); first attempt "
          f"p99 alone {p99(alone) * 1000:.0f} ms, beside the 2 s endpoint {p99(beside_slow) * 1000:.0f} ms")
    # The log keeps an attempt's time to the millisecond, truncated.
    assert arrived_late[0] >= 0 and late[0] >= -0.001, "a retry went out before it was due"
    assert p99(late) <= RETRY_ON_TIME
    assert p99(beside_slow) <= max(p99(alone), 0.3) + 0.15


@pytest.fixture
def two_second_timeout(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("PREFECT_WEBHOOKS_REQUEST_TIMEOUT", "2")
    get_settings.cache_clear()
    yield store_url
    get_settings.cache_clear()


async def test_with_an_endpoint_that_hangs_the_batches_in_flight_stay_bounded(
    two_second_timeout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight = most = 0
    real_process_batch = claims_module.process_batch

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            return await real_process_batch(*args, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(claims_module, "process_batch", counted)
    parallel, waiting = 2, 4
    with Receiver(default={"status": 200, "delay": 30}) as hanging, Receiver() as healthy:
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("hanging", WebhookDestination(endpoints=[{"url": hanging.url}]))
            context.destinations.remember("healthy", WebhookDestination(endpoints=[{"url": healthy.url}]))
            # A claim every 50 ms, each finding a message to the hanging endpoint: 40 batches would wait for their
            # timeouts at once without the bound.
            # Claims go on for 3.5 s: past the first hanging batches' 2 s timeouts, so claims made once they end
            # show the bound is a bound, not a stop (within 2 s a loaded machine's first batches can all hang).
            run = asyncio.ensure_future(deliver_due(
                DeliveryOptions(run_for_seconds=3.5, idle_sleep=0.05, parallel_batches=parallel,
                                waiting_batches=waiting), context=context))
            for n in range(70):
                await asyncio.to_thread(enqueue, "hanging", [track(n)])
                await asyncio.to_thread(enqueue, "healthy", [track(100 + n)])
                await asyncio.sleep(0.05)
            stats = await run
    print(f"\nat most {most} batches in flight; {len(hanging.requests)} requests reached the hanging endpoint")
    # Batches waiting only for answers do not hold up claims, up to the bound: more than parallel_batches at once,
    # never more than parallel_batches + waiting_batches (no retry of this run was due).
    assert parallel < most <= parallel + waiting
    assert stats.batches > parallel + waiting
    # While the bound holds claims back, messages wait in the outbox, unleased once the run ends: nothing is lost.
    assert stats.delivered == len(every_message(destination="healthy", state=DELIVERED)) > 0
    assert all(row.state == DELIVERED or row.lease_owner is None for row in every_message())


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
