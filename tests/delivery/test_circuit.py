"""Per-endpoint isolation: the circuit breaker's states, and a broken endpoint not slowing healthy ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, DeliveryStats, Sender, deliver_due
from prefect_webhooks.delivery.sending.circuit import (
    CIRCUIT_OPEN_ERROR,
    CLOSED,
    HALF_OPEN,
    OPEN,
    Circuit,
    EndpointGuard,
)
from prefect_webhooks.messages.outcomes import DELIVERED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message


def send(circuit: Circuit, now: float) -> int:
    """Admit a request the circuit must let through; its generation."""
    generation = circuit.admit(now)
    assert generation is not None
    return generation


async def send_to(guard: EndpointGuard, url: str) -> int:
    generation = await guard.admit(url)
    assert generation is not None
    return generation


def test_circuit_opens_after_threshold_half_opens_after_cooldown_and_closes_on_success() -> None:
    circuit = Circuit(threshold=3, cooldown=10.0)
    for now in (0.0, 1.0):
        circuit.record(send(circuit, now), False, now)
    assert circuit.state == CLOSED
    circuit.record(send(circuit, 2.0), False, 2.0)
    assert circuit.state == OPEN
    assert circuit.admit(5.0) is None
    assert circuit.admit(11.9) is None
    # Cool-down over: exactly one probe goes through while it is out.
    probe = circuit.admit(12.0)
    assert probe is not None and circuit.state == HALF_OPEN
    assert circuit.admit(12.1) is None
    circuit.record(probe, True, 12.2)
    assert circuit.state == CLOSED
    assert circuit.admit(12.3) is not None
    assert circuit.skipped == 3


def test_failed_probe_opens_again_for_a_full_cooldown() -> None:
    circuit = Circuit(threshold=1, cooldown=5.0)
    circuit.record(send(circuit, 0.0), False, 0.0)
    probe = circuit.admit(5.0)
    assert probe is not None
    circuit.record(probe, False, 6.0)
    assert circuit.state == OPEN
    assert circuit.admit(10.0) is None
    assert circuit.admit(11.0) is not None


def test_success_resets_the_consecutive_count() -> None:
    circuit = Circuit(threshold=2, cooldown=5.0)
    first, second, third = (send(circuit, 0.0) for _ in range(3))
    circuit.record(first, False, 0.0)
    circuit.record(second, True, 0.1)
    circuit.record(third, False, 0.2)
    assert circuit.state == CLOSED


def test_an_answer_sent_before_the_circuit_opened_does_not_end_the_probes_turn() -> None:
    circuit = Circuit(threshold=2, cooldown=5.0)
    early = [send(circuit, 0.0) for _ in range(3)]
    circuit.record(early[0], False, 2.5)
    circuit.record(early[1], False, 2.5)
    assert circuit.state == OPEN
    probe = circuit.admit(7.5)
    assert probe is not None and circuit.state == HALF_OPEN
    # The third early request times out while the probe is out: no new opening, no second probe beside the first.
    circuit.record(early[2], False, 7.6)
    assert circuit.state == HALF_OPEN and circuit.opened_count == 1
    assert circuit.admit(7.7) is None
    circuit.record(probe, True, 8.0)
    assert circuit.state == CLOSED and circuit.recovered
    # Nor does a late success close an open circuit: only its probe can.
    late = send(circuit, 8.1)
    circuit.record(send(circuit, 8.1), False, 9.0)
    circuit.record(send(circuit, 8.1), False, 9.0)
    assert circuit.state == OPEN
    circuit.record(late, True, 9.1)
    assert circuit.state == OPEN and circuit.in_flight == 0


async def test_after_a_failure_a_request_waits_while_the_answers_in_flight_could_open_the_circuit() -> None:
    guard = EndpointGuard(threshold=3, cooldown=30.0, concurrency=4)
    url = "http://a"
    # A healthy endpoint: nothing has failed, so four go out at once (more than the threshold).
    in_flight = [await send_to(guard, url) for _ in range(4)]
    assert guard.circuit(url).in_flight == 4
    guard.record(url, in_flight.pop(), False)
    # One failed and three are out: were they all to fail, the circuit would open, so the next request waits.
    waiting = asyncio.create_task(guard.admit(url))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    guard.record(url, in_flight.pop(), False)
    await asyncio.sleep(0.05)
    assert not waiting.done()  # two failures, one out: still enough to open it
    guard.record(url, in_flight.pop(), True)  # a success ends the run of failures: it may go
    assert await asyncio.wait_for(waiting, 1.0) is not None
    # A hanging endpoint: the answers in flight open the circuit, and the waiting request is refused, never sent.
    in_flight = [in_flight.pop(), waiting.result(), await send_to(guard, url)]
    guard.record(url, in_flight.pop(), False)
    refused = asyncio.create_task(guard.admit(url))
    await asyncio.sleep(0.05)
    assert not refused.done()
    for generation in in_flight:
        guard.record(url, generation, False)
    assert await asyncio.wait_for(refused, 1.0) is None
    assert guard.state(url) == OPEN and guard.circuit(url).in_flight == 0


async def test_a_cooled_down_circuit_asks_once_for_a_probe_and_a_successful_probe_reports_the_recovery() -> None:
    guard = EndpointGuard(threshold=1, cooldown=0.05, concurrency=4)
    guard.record("http://a", await send_to(guard, "http://a"), False)
    assert guard.state("http://a") == OPEN
    assert guard.take_due_probes() == []
    time.sleep(0.06)
    # Cooled down with nothing sent: one request is wanted to probe with, asked for once.
    assert guard.take_due_probes() == ["http://a"]
    assert guard.take_due_probes() == []
    probe = await guard.admit("http://a")
    assert probe is not None and guard.state("http://a") == HALF_OPEN
    assert guard.take_recovered() == []
    guard.record("http://a", probe, True)
    assert guard.take_recovered() == ["http://a"]
    assert guard.take_recovered() == []
    # A success that was not a probe is no recovery.
    guard.record("http://a", await send_to(guard, "http://a"), True)
    assert guard.take_recovered() == []


async def test_a_failed_probe_asks_for_the_next_probe_after_a_new_cooldown() -> None:
    guard = EndpointGuard(threshold=1, cooldown=0.05, concurrency=4)
    guard.record("http://a", await send_to(guard, "http://a"), False)
    time.sleep(0.06)
    assert guard.take_due_probes() == ["http://a"]
    probe = await guard.admit("http://a")
    assert probe is not None
    guard.record("http://a", probe, False)
    assert guard.take_due_probes() == [] and guard.take_recovered() == []
    time.sleep(0.06)
    assert guard.take_due_probes() == ["http://a"]


@pytest.fixture
def isolated(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # A healthy receiver answers at once, but on a loaded machine its first answers can take over a second (it is a
    # thread of this process): 2.5 s keeps them inside the timeout, and the hanging receiver answers after 6 s.
    monkeypatch.setenv("PREFECT_WEBHOOKS_REQUEST_TIMEOUT", "2.5")
    monkeypatch.setenv("PREFECT_WEBHOOKS_DELIVERY_CONCURRENCY", "16")
    monkeypatch.setenv("PREFECT_WEBHOOKS_ENDPOINT_CONCURRENCY", "4")
    monkeypatch.setenv("PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD", "3")
    monkeypatch.setenv("PREFECT_WEBHOOKS_CIRCUIT_COOLDOWN_SECONDS", "0.6")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "60")
    get_settings.cache_clear()
    return store_url


async def test_sender_skips_an_open_circuit_and_probes_after_cooldown(isolated: str) -> None:
    with Receiver(script=[500, 500, 500], default=200) as receiver:
        async with Sender() as sender:
            outcomes = [await sender.post(receiver.url, b"{}", {}) for _ in range(5)]
            assert [result.status for result in outcomes[:3]] == [500, 500, 500]
            assert [result.error for result in outcomes[3:]] == [CIRCUIT_OPEN_ERROR] * 2
            assert len(receiver.requests) == 3
            assert sender.guard.state(receiver.url) == OPEN
            time.sleep(0.7)
            probe = await sender.post(receiver.url, b"{}", {})
            assert probe.status == 200 and sender.guard.state(receiver.url) == CLOSED
            assert len(receiver.requests) == 4


def messages(destination: str, count: int) -> list[dict[str, Any]]:
    return [{"type": "track", "userId": f"u{index}", "event": "E",
             "properties": {"messageId": f"{destination}-{index}"}} for index in range(count)]


async def drain(blocks: dict[str, str], **kwargs: Any) -> DeliveryStats:
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        for name, url in blocks.items():
            context.destinations.remember(name, WebhookDestination(endpoints=[{"url": url}]))
        return await deliver_due(DeliveryOptions(**kwargs), context=context)


async def timed_drain(healthy: Receiver, broken_url: str | None, healthy_count: int, broken_count: int) -> float:
    """Enqueue interleaved healthy/broken messages, drain, return seconds until the healthy ones were received."""
    for index in range(max(healthy_count, broken_count) // 50):
        enqueue("healthy", messages("healthy", healthy_count)[index * 50:(index + 1) * 50])
        if broken_url:
            enqueue("broken", messages("broken", broken_count)[index * 50:(index + 1) * 50])
    blocks = {"healthy": healthy.url, **({"broken": broken_url} if broken_url else {})}
    before = len(healthy.requests)
    started = time.perf_counter()
    await drain(blocks, batch_size=100)
    elapsed = time.perf_counter() - started
    assert len(healthy.requests) - before == healthy_count
    return elapsed


async def test_hanging_endpoint_does_not_slow_a_healthy_destination(isolated: str) -> None:
    with Receiver() as healthy, Receiver(default={"status": 200, "delay": 6}) as hanging:
        baseline = await timed_drain(healthy, None, 300, 0)
        with get_engine().begin() as connection:
            connection.execute(OUTBOX.delete())
        with_broken = await timed_drain(healthy, hanging.url, 300, 300)
        broken = every_message(destination="broken")
        healthy_rows = every_message(destination="healthy")
        errors = [attempt.error for attempt in every_attempt(url=hanging.url)]
        print(f"\nhealthy 300 msgs alone: {baseline:.2f} s; with 300 msgs to a hanging endpoint: {with_broken:.2f} s; "
              f"requests that reached the hanging endpoint: {len(hanging.requests)}, "
              f"skipped (circuit open): {errors.count(CIRCUIT_OPEN_ERROR)}")
    assert all(row.state == DELIVERED for row in healthy_rows)
    assert all(row.state == PENDING for row in broken)
    # Only the first endpoint_concurrency (4) requests hang: the requests waiting for their slots are not sent while
    # those four could still open the circuit, and once it is open the rest are skipped; then up to two probes.
    assert len(hanging.requests) <= 4 + 2
    assert errors.count(CIRCUIT_OPEN_ERROR) >= 300 - 6
    # Without isolation 300 hanging requests at 16 in flight would cost ≥ 300 / 16 × 2.5 s ≈ 47 s; with it, at most
    # three timeouts in a row (the first requests, before the circuit opens, then the up to two probes above).
    assert with_broken < baseline + 10.0


@pytest.mark.slow
async def test_without_the_breaker_the_same_hang_costs_timeouts(
    prefect_harness: None, isolated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison figure: circuit effectively disabled and no per-endpoint limit. The failing endpoint's events
    go to the test server: without a Prefect API, Prefect would start a temporary server of its own to take them,
    which outlives the test (the slow tests' first, run alone, with no test server started yet)."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_CIRCUIT_FAILURE_THRESHOLD", "100000")
    monkeypatch.setenv("PREFECT_WEBHOOKS_ENDPOINT_CONCURRENCY", "16")
    get_settings.cache_clear()
    with Receiver() as healthy, Receiver(default={"status": 200, "delay": 6}) as hanging:
        baseline = await timed_drain(healthy, None, 50, 0)
        with get_engine().begin() as connection:
            connection.execute(OUTBOX.delete())
        with_broken = await timed_drain(healthy, hanging.url, 50, 50)
        print(f"\nno breaker: healthy 50 msgs alone {baseline:.2f} s; with 50 hanging: {with_broken:.2f} s; "
              f"requests to the hanging endpoint: {len(hanging.requests)}")
    assert len(hanging.requests) == 50
    # 50 requests at 16 in flight, each held for the 2.5 s timeout: four rounds.
    assert with_broken > baseline + 3 * 2.5


async def test_a_drain_brings_nothing_forward_for_a_probe_but_a_continuous_run_does(isolated: str) -> None:
    with Receiver(default=503) as down:
        enqueue("down", messages("down", 3))
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender)
            context.destinations.remember("down", WebhookDestination(endpoints=[{"url": down.url}]))
            # Three failures open the circuit; the messages wait for their 60 s backoff.
            first = await deliver_due(context=context)
            assert first.rescheduled == 3 and sender.guard.state(down.url) == OPEN
            time.sleep(0.7)  # cooled down: a probe is due
            # A drain ends once nothing is due: it does not make a message due to carry the probe.
            await deliver_due(context=context)
            assert len(down.requests) == 3
            # A continuous run does, so the probe goes out on time.
            await deliver_due(DeliveryOptions(run_for_seconds=1.0, idle_sleep=0.1), context=context)
            assert len(down.requests) >= 4


def test_the_recent_peak_rate_is_the_best_ten_seconds_of_the_last_two_minutes() -> None:
    from prefect_webhooks.delivery.sending.circuit import SuccessRate

    rate = SuccessRate()
    for second in range(1000, 1030):  # 2,000 a second for 30 s, then an outage: nothing
        for n in range(2000):
            rate.add(second + n / 2000)
    assert rate.peak(1040.0) == 2000.0
    assert rate.peak(1100.0) == 2000.0  # an outage of a minute still remembers the rate before it
    assert rate.peak(1200.0) == 0.0  # older than two minutes: forgotten
    guard = EndpointGuard(threshold=5, cooldown=30.0, concurrency=4)
    assert guard.recent_peak_rate("https://a.example.com/in") == 0.0
    for _ in range(30):
        guard.record("https://a.example.com/in", send(guard.circuit("https://a.example.com/in"), 0.0), True)
    guard.record("https://a.example.com/in", send(guard.circuit("https://a.example.com/in"), 0.0), False)
    assert guard.recent_peak_rate("https://a.example.com/in") == pytest.approx(3.0)  # 30 in one second, over ten
