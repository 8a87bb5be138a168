"""A batch's outcomes recorded in waves: what has finished is recorded while the batch's other requests are out.

A batch's requests end at different times: most within milliseconds, some seconds later (a slow endpoint, a
timeout). Recording the batch once its last answer was in made every message wait for the slowest: a message
answered 500 in 10 ms, due again a second later, was not even rescheduled before the batch's 2 s answers came back,
and was sent a second late. Here a message is decided and recorded in a wave of its own batch when it has to be:

- A message to retry, before it can fall due: its wave goes ``retry_wait`` after its answer, the shortest retry
  delay less ``RETRY_LEAD`` (3.75 s with the 5 s default; never under ``GATHER``, so answers that come in together
  share a transaction). Messages put off before sending (a rate-limit turn, a block not loaded) go within
  ``WAVE_WAIT``.
- Any other, once it waits on slow answers: when every request of the batch has started and only answers are
  awaited, what has finished goes ``WAVE_WAIT`` (0.25 s) after the first of it. While the batch is still starting
  requests, its messages wait for its own pace, not for slow answers.
- The rest when the last answer is in. A batch whose answers come quickly is recorded in one transaction, as
  before, whatever its size; the outcomes decided before it sent (filtered, expired...) go with its first wave.

What a wave recorded leaves the batch at once: its rows leave the batch's lease keeping, its retries' due times go
to the claim loop (``retry_wakeups``), the rows an ordered run left unsent go back to the outbox, its requests feed
their endpoints' health and pauses (``after_sending``), its failures their events. A destination that batches
messages has its messages decided together, once all its requests are answered (``batching.send_batched``), so its
batch is still retried whole. Waves are recorded one after another, in the order their messages finished. The work
per message is the decision, as before (and a look at whether its first request delivered it); a wave's own work
(its transaction, its notes) is per wave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from prefect_webhooks.delivery.batches.batching import retry_together
from prefect_webhooks.delivery.endpoints.events import emit_delivery_failed
from prefect_webhooks.delivery.endpoints.stats import MessageCounts
from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.pacing.controls import after_sending
from prefect_webhooks.delivery.pacing.decision import BatchWrites, decide
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.delivery.sending.sender import RequestResult, display_url, ends_in_a_retry
from prefect_webhooks.messages.outcomes import DELIVERED, OutcomeRecords
from prefect_webhooks.messages.retry import JITTER
from prefect_webhooks.settings import WebhooksSettings
from prefect_webhooks.store.queue.outbox import Claimed, record_outcomes, release_leases
from prefect_webhooks.store.schema.tables import store_now

logger = logging.getLogger("prefect_webhooks.delivery")

WAVE_WAIT = 0.25
"""Seconds a finished message waits for others once its batch only waits for answers."""
RETRY_LEAD = 0.25
"""Seconds at least between a wave and the soonest a retry it records can fall due (its transaction, the claim)."""
GATHER = 0.005
"""The shortest wait of a wave: answers that arrive together share a transaction."""

Pair = tuple[Claimed, ResolvedDestination]
NO_RESULTS: Sequence[RequestResult] = ()


def retry_wait(settings: WebhooksSettings) -> float:
    """How long a message to retry may wait for its wave: until ``RETRY_LEAD`` before it can fall due."""
    delivery = settings.delivery
    soonest_retry = min(delivery.retry_base_delay, delivery.retry_max_delay) * (1 - JITTER)
    return max(GATHER, soonest_retry - RETRY_LEAD)


def has_outcomes(records: OutcomeRecords) -> bool:
    """Whether ``records`` holds anything to write."""
    return bool(records.delivered or records.failed or records.rescheduled or records.filtered or records.attempts
                or records.requests)


class Waves:
    """A batch past its send start: hears of each finished message (``sender.SendProgress``), records them in waves.

    Args:
        pairs: The messages sent, those sent one per request (the first ``alone``) before those of batching
            destinations.
        alone: How many of ``pairs`` are sent one per request.
        writes: The batch's writes: what was decided before sending is in them; each wave takes what they hold.
        mine: The batch's rows (``DeliveryContext.take_rows``); a wave's rows leave it once recorded.
        context: The process's store, sender and claim loop.
        sent_at: When the batch began sending (a first attempt's time).
        hold_seconds: Retryable rows stay leased for an in-process retry after about this long (``decide``).
        log: The batch's logger.
        on_started: Called once every message is on its way (the batch only waits for answers from then on).
    """

    def __init__(
        self,
        pairs: list[Pair],
        alone: int,
        writes: BatchWrites,
        mine: set[int],
        context: DeliveryContext,
        *,
        sent_at: datetime,
        hold_seconds: float | None,
        log: Any,
        on_started: Callable[[], None],
    ) -> None:
        self.pairs, self.alone, self.writes, self.mine, self.context = pairs, alone, writes, mine, context
        self.sent_at, self.hold_seconds, self.log, self.on_started = sent_at, hold_seconds, log, on_started
        self.results: list[Sequence[RequestResult]] = [NO_RESULTS] * len(pairs)
        self.counts = MessageCounts()
        self.held: list[int] = []
        """Rows kept leased for an in-process retry."""
        self.waves = 0
        self._loop = asyncio.get_running_loop()
        self._finished: list[int] = []
        self._first_finished: float | None = None
        """When the first message finished since the last wave (event loop time)."""
        self._retry_wait = retry_wait(context.settings)
        self._waiting = False
        self._timer: asyncio.TimerHandle | None = None
        self._recording: asyncio.Task[None] | None = None
        self._overdue = False
        self._stopped = False
        self._error: BaseException | None = None
        if has_outcomes(writes.records):  # decided before sending: they finished now
            self._first_finished = self._loop.time()
            if writes.records.rescheduled:  # put off to their rate-limit turn, maybe a second away
                self._wave_by(self._first_finished + WAVE_WAIT)

    def finished(self, index: int, results: Sequence[RequestResult]) -> None:
        """``pairs[index]`` has its final results (none: not sent); it goes in the next wave."""
        self.results[index] = results
        self._finished.append(index)
        if self._first_finished is None:
            self._first_finished = self._loop.time()
            if self._waiting:
                self._wave_by(self._first_finished + WAVE_WAIT)
        if results and results[0].outcome != DELIVERED and ends_in_a_retry(results):
            self._wave_by(self._loop.time() + self._retry_wait)

    def batched_finished(self, index: int, results: Sequence[RequestResult]) -> None:
        """``finished`` for the ``index``-th message of batching destinations."""
        self.finished(self.alone + index, results)

    def all_started(self) -> None:
        """Every message is on its way: from now on what has finished waits only for slow answers."""
        self._waiting = True
        if self._first_finished is not None:
            # What finished before waited for the batch's own pace; its wait for slow answers begins now.
            self._first_finished = self._loop.time()
            self._wave_by(self._first_finished + WAVE_WAIT)
        self.on_started()

    def _wave_by(self, when: float) -> None:
        """Have a wave go at ``when`` (event loop time) at the latest."""
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._wave_due)

    def _wave_due(self) -> None:
        self._timer = None
        if self._stopped or self._error is not None:
            return
        if self._recording is None or self._recording.done():
            self._recording = asyncio.ensure_future(self._record_waves())
        else:
            self._overdue = True  # taken by the wave after the one being recorded

    async def _record_waves(self) -> None:
        try:
            await self._wave()
            while self._overdue:
                self._overdue = False
                await self._wave()
        except Exception as exc:
            # The rows stay leased and come back when the lease expires; the batch fails when it ends.
            self._error = exc

    def stop(self) -> None:
        """No more waves (the sends failed or were cancelled); a wave being recorded goes on."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stopped = True

    async def close(self) -> None:
        """Every answer is in: record what is left once the wave being recorded is, and raise a wave's error."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._recording is not None:
            await self._recording
        if self._error is not None:
            raise self._error
        await self._wave()

    async def _wave(self) -> None:
        """Decide and record the messages finished so far, with everything else the batch's writes hold."""
        indexes, self._finished, self._first_finished = self._finished, [], None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wave = self.writes.take()
        if not indexes and not has_outcomes(wave.records):
            return
        self.waves += 1
        context = self.context
        settings = context.settings
        finished_at = store_now()
        hold_until = None
        if self.hold_seconds is not None:
            hold_until = finished_at + timedelta(
                seconds=self.hold_seconds * (1 + JITTER) + settings.delivery.lease_seconds)
        sent: list[Pair] = []
        results: list[Sequence[RequestResult]] = []
        unsent: list[int] = []
        for index in indexes:
            row, destination = pair = self.pairs[index]
            answers = self.results[index]
            # Not sent: behind a message of its user that is to be retried (``ordering.take_in_order``), or its
            # deadline came before its turn (its next claim records it expired).
            if not answers:
                unsent.append(row.id)
                continue
            sent.append(pair)
            results.append(answers)
            # An ordered destination's retry is never held for the task's next try (which waits for the window to
            # close, up to task_run_seconds): it is due at its backoff time and the claim loop sends it then, since
            # the user's later messages wait behind it.
            decide(row, answers, wave, now=finished_at, hold_until=None if destination.ordered else hold_until,
                   owner=context.owner, settings=settings, sent_at=self.sent_at)
            if destination.batching is None:  # a batch's requests were counted as they were sent
                wave.count_requests(context.stats, destination.name, answers)
        if self.alone < len(self.pairs):
            retry_together(wave.records.rescheduled, [pair for pair in sent if pair[1].batching is not None])
        records = wave.records
        finished = [*(entry.id for entry in records.delivered), *(entry.id for entry in records.failed),
                    *(entry.id for entry in records.rescheduled), *(entry.id for entry in records.filtered), *unsent]
        context.open_to_claims(finished, self.mine)
        if has_outcomes(records):
            await store_call(settings, record_outcomes, context.engine, records)
        context.give_up_rows(finished, self.mine)
        if context.retry_wakeups.note(entry.next_attempt_at for entry in records.rescheduled
                                      if entry.lease_owner is None):
            context.wake_claims()
        if unsent:
            await store_call(settings, release_leases, context.engine, unsent, context.owner)
        await after_sending(sent, results, context)
        log_timeouts([answers for (_, destination), answers in zip(sent, results, strict=True)
                      if destination.batching is None], self.log)
        for row, reason, attempts in wave.failures:
            emit_delivery_failed(row.id, row.destination, reason, attempts)
        self.counts.add(MessageCounts(delivered=len(records.delivered), failed=len(records.failed),
                                      rescheduled=len(records.rescheduled) - len(wave.held),
                                      filtered=len(records.filtered)))
        self.held += wave.held


def log_timeouts(results_by_row: Sequence[Sequence[RequestResult]], log: Any) -> None:
    """One error line per URL whose requests among ``results_by_row`` timed out."""
    timeouts: dict[str, int] = {}
    for results in results_by_row:
        for result in results:
            if result.error and result.error.startswith("timeout"):
                timeouts[result.url] = timeouts.get(result.url, 0) + 1
    for url, count in timeouts.items():
        log.error("%d request(s) to %s timed out; they will be retried", count, display_url(url))
