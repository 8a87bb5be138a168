"""Per-endpoint isolation: a concurrency limit and a circuit breaker per endpoint URL.

One broken endpoint must not slow delivery to the others. Two things keep it in its corner:

- **Concurrency per URL.** A request first takes a slot of its URL (``endpoint_concurrency``), then a slot of the
  process (``delivery_concurrency``); an endpoint that hangs can hold at most its own slots, never all of them.
- **Circuit breaker per URL.** After ``circuit_failure_threshold`` retryable failures in a row (timeouts,
  connection errors, 5xx, 408, 429) the circuit opens: requests to that URL are not sent, the message is
  rescheduled like any retryable outcome and an attempt with the error ``circuit open`` is recorded. After
  ``circuit_cooldown_seconds`` it half-opens: one probe request goes through (the others still skip); a success
  closes it, a failure opens it for another cool-down. When the cool-down ends the delivery engine makes one
  waiting message due (``take_due_probes``), so the probe goes out on time, and when a probe succeeds it makes every
  waiting message of the endpoint's destinations due (``take_recovered``): a backlog built up during an outage
  moves at the first probe that gets through, not when each message's backoff ends.
- **No request the breaker might have refused.** Once a request has failed since the last success, a new one waits
  for answers in flight while, were they all failures too, the circuit would open: requests that were already
  waiting for a slot when an endpoint began to hang do not go out to it one by one as its timeouts free their slots.
  A healthy endpoint keeps its full concurrency (its first success lifts the wait).
- **Outcomes count in the period they were sent in.** Each opening starts a new generation; the answer of a request
  sent before the circuit opened changes nothing, so a timeout that arrives late cannot end the probe's turn and let
  a second probe out beside it.

The state lives in the delivering process (each worker learns on its own); nothing here touches the store.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"
CIRCUIT_OPEN_ERROR = "circuit open"


@dataclass
class Circuit:
    """The breaker of one endpoint URL."""

    threshold: int
    cooldown: float
    state: str = CLOSED
    failures: int = 0
    opened_at: float = 0.0
    probing: bool = False
    opened_count: int = 0
    skipped: int = 0
    recovered: bool = False
    probe_requested: bool = False
    generation: int = 0
    in_flight: int = 0
    _answer_waiters: list[asyncio.Future[None]] = field(default_factory=list, repr=False)

    def holding(self) -> bool:
        """Whether a request must wait for an answer in flight: requests have failed since the last success, and
        if every request in flight failed too the circuit would open before this one."""
        return self.state == CLOSED and self.failures > 0 and self.failures + self.in_flight >= self.threshold

    async def next_answer(self) -> None:
        """Wait until a request in flight is answered."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answer_waiters.append(waiter)
        await waiter

    def admit(self, now: float) -> int | None:
        """The generation a request is sent in, or ``None`` when it may not be sent now; in half-open state only
        one probe at a time is let through."""
        if self.state == OPEN and now - self.opened_at >= self.cooldown:
            self.state = HALF_OPEN
        if self.state == HALF_OPEN and not self.probing:
            self.probing = True
        elif self.state != CLOSED:
            self.skipped += 1
            return None
        self.in_flight += 1
        return self.generation

    def record(self, generation: int, success: bool, now: float) -> None:
        """Count the answer of a request sent in ``generation``: success closes the circuit, failures open it."""
        self.in_flight -= 1
        if self._answer_waiters:
            waiters, self._answer_waiters = self._answer_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if generation != self.generation:
            return
        if success:
            # A probe that succeeds ends an outage: what was put off meanwhile may go now.
            self.recovered = self.recovered or self.state == HALF_OPEN
            self.state, self.failures, self.probing = CLOSED, 0, False
            return
        self.failures += 1
        if self.state == HALF_OPEN or self.failures >= self.threshold:
            if self.state != OPEN:
                self.opened_count += 1
            self.state, self.opened_at, self.probing, self.probe_requested = OPEN, now, False, False
            self.generation += 1


class SuccessRate:
    """Successful requests to one URL per whole second, for the last ``KEPT`` seconds."""

    KEPT = 120
    WINDOW = 10

    def __init__(self) -> None:
        self.counts: deque[list[int]] = deque()

    def add(self, now: float) -> None:
        second = int(now)
        if self.counts and self.counts[-1][0] == second:
            self.counts[-1][1] += 1
            return
        self.counts.append([second, 1])
        while self.counts[0][0] <= second - self.KEPT:
            self.counts.popleft()

    def peak(self, now: float) -> float:
        """The best rate over ``WINDOW`` consecutive seconds of the last ``KEPT``."""
        recent = {second: count for second, count in self.counts if second > int(now) - self.KEPT}
        best = max((sum(recent.get(second + offset, 0) for offset in range(self.WINDOW)) for second in recent),
                   default=0)
        return best / self.WINDOW


@dataclass
class EndpointGuard:
    """Every endpoint's circuit and concurrency slots in one delivering process."""

    threshold: int
    cooldown: float
    concurrency: int
    circuits: dict[str, Circuit] = field(default_factory=dict)
    _slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    _rates: dict[str, SuccessRate] = field(default_factory=dict)

    def circuit(self, url: str) -> Circuit:
        """The breaker of ``url`` (created closed on first use)."""
        found = self.circuits.get(url)
        if found is None:
            found = self.circuits[url] = Circuit(self.threshold, self.cooldown)
        return found

    def slots(self, url: str) -> asyncio.Semaphore:
        """The concurrency slots of ``url``."""
        found = self._slots.get(url)
        if found is None:
            found = self._slots[url] = asyncio.Semaphore(self.concurrency)
        return found

    async def admit(self, url: str) -> int | None:
        """The generation a request to ``url`` is sent in, once it may go (``Circuit.holding``), or ``None`` when
        its circuit is open; every admitted request's answer goes to ``record``."""
        circuit = self.circuit(url)
        while circuit.holding():
            await circuit.next_answer()
        return circuit.admit(time.monotonic())

    def record(self, url: str, generation: int, success: bool) -> None:
        """Feed the answer of a request sent in ``generation`` to ``url``'s breaker (and a success to its recent
        rate)."""
        now = time.monotonic()
        self.circuit(url).record(generation, success, now)
        if success:
            rate = self._rates.get(url)
            if rate is None:
                rate = self._rates[url] = SuccessRate()
            rate.add(now)

    def recent_peak_rate(self, url: str) -> float:
        """Successful requests per second to ``url`` in its best ``SuccessRate.WINDOW`` seconds of the last
        ``SuccessRate.KEPT`` (0 when none): what it took while healthy, for the ramp after a recovery."""
        rate = self._rates.get(url)
        return rate.peak(time.monotonic()) if rate is not None else 0.0

    def take_due_probes(self) -> list[str]:
        """The URLs whose open circuit has cooled down but has had no request to probe with (each reported once).

        Messages skipped while a circuit was open wait for their backoff, which after a long outage is longer than
        the cool-down; the delivery engine brings one of them forward so the probe goes out on time.
        """
        now = time.monotonic()
        found = []
        for url, circuit in self.circuits.items():
            if circuit.state == OPEN and not circuit.probe_requested and now - circuit.opened_at >= circuit.cooldown:
                circuit.probe_requested = True
                found.append(url)
        return found

    def take_recovered(self) -> list[str]:
        """The URLs whose circuit closed after a successful probe since the last call (each reported once)."""
        found = [url for url, circuit in self.circuits.items() if circuit.recovered]
        for url in found:
            self.circuits[url].recovered = False
        return found

    def state(self, url: str) -> str:
        """``closed``, ``open`` or ``half-open`` (an open circuit past its cool-down reads as open until asked)."""
        return self.circuit(url).state
