"""The Prefect task of delivery (``deliver-batches`` in the UI): the batches claimed within one window, and their
retries.

Prefect's server stores every task run with its states and events whatever its size, so a task run per claimed batch
grew the server's database with the event rate (2.6 task runs a second at 3,000 events/s). Here the batches a
process claims within ``task_run_seconds`` (10 s) of a window's start share one task run: at most one task run per
window per delivering process, whatever the rate, plus the window's retries. Each batch is still sent as soon as it
is claimed, and its claim slot is free once its first try is recorded.

Retries are paced by their schedule, never by a window. In a run that keeps delivering (a delivery worker's shifts,
runs with ``run_for_seconds``) a message to retry goes back to the outbox at its backoff time and the claim loop
sends it when it is due: holding it for the task's next try would make it wait for the window to close first (up to
``task_run_seconds`` more per retry). In a run that ends once nothing is due, nothing would claim it again, so there a
task retry is the short-term policy: the messages a window's first try could not deliver stay leased by this process
and are sent again after Prefect's wait, ``exponential_backoff`` from ``retry_base_delay`` capped at
``retry_max_delay`` (the first steps of the outbox's own backoff). On the final try whatever is left goes back to the
outbox at its backoff time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.logging import get_run_logger
from prefect.tasks import exponential_backoff

from prefect_webhooks.delivery.batches.batch import BatchResult, process_batch
from prefect_webhooks.delivery.pacing.context import ClaimedBatch, DeliveryContext
from prefect_webhooks.messages.retry import JITTER, RetryableDeliveryError, is_retryable_delivery_error
from prefect_webhooks.settings import WebhooksSettings
from prefect_webhooks.store.queue.outbox import Claimed

logger = logging.getLogger("prefect_webhooks.delivery")


def task_retry_delays(settings: WebhooksSettings) -> list[float]:
    """The task's ``retry_delay_seconds``: ``retry_base_delay`` doubling per retry, at most ``retry_max_delay``."""
    delays = exponential_backoff(backoff_factor=settings.delivery.retry_base_delay)(settings.delivery.task_retries)
    return [min(delay, settings.delivery.retry_max_delay) for delay in delays]


class BatchWindow:
    """The batches of one task run: handed in by the claim loop until the window closes.

    A plain object, so Prefect passes it to the task without walking into its queue.
    """

    def __init__(self, closes_at: float, *, holds_retries: bool = True) -> None:
        self.closes_at = closes_at
        self.holds_retries = holds_retries
        """Whether messages to retry stay leased for the task's next try (False: back to the outbox when due)."""
        self.closed = False
        self.queue: asyncio.Queue[tuple[ClaimedBatch, asyncio.Future[BatchResult]] | None] = asyncio.Queue()
        self.held: list[Claimed] = []
        """Rows kept leased for the window's next try."""
        self.futures: list[asyncio.Future[BatchResult]] = []

    def submit(self, batch: ClaimedBatch) -> asyncio.Future[BatchResult]:
        """Hand a batch to the window's task run; the future holds its first try's result."""
        future: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        self.queue.put_nowait((batch, future))
        return future

    def abandon(self, reason: BaseException) -> None:
        """The task run ended without sending some batches (it could not start, or was cancelled): fail them, so the
        claim loop goes on; their rows stay leased and come back when the lease expires."""
        self.close()
        for future in self.futures:
            if not future.done():
                future.set_exception(reason)

    def close(self) -> None:
        """Take no more batches; the task run ends its first try once the batches it has are recorded."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)

    def __repr__(self) -> str:
        return "BatchWindow()"


@task(
    name="deliver-batches",
    cache_policy=NO_CACHE,
    retry_condition_fn=is_retryable_delivery_error,
    retry_jitter_factor=JITTER,
    persist_result=False,
)
async def deliver_batches(window: BatchWindow, context: DeliveryContext) -> dict[str, int]:
    """Deliver the window's batches; raise ``RetryableDeliveryError`` so Prefect retries what is left.

    The first try sends each batch as it comes in (concurrently) and resolves its future once it is recorded. A
    retry sends the rows still pending, leased by this process and due among those the previous try held. The
    retries are those ``delivery_task`` configures from ``context.settings``; Prefect's jitter (factor 0.2) draws
    each wait from about 0.36x to 1.2x of it. On the final try the task returns normally and whatever is left waits
    in the outbox for a later run, with the same deadline.
    """
    task_context = TaskRunContext.get()
    run_count = max(task_context.task_run.run_count, 1) if task_context is not None else 1
    delays = task_retry_delays(context.settings)
    next_delay = delays[run_count - 1] if run_count <= len(delays) and window.holds_retries else None
    log = get_run_logger()
    if run_count == 1:
        results = await _first_try(window, context, next_delay, log)
    else:
        held, window.held = window.held, []
        result = await process_batch(ClaimedBatch(held), context, first_try=False, hold_seconds=next_delay, log=log)
        window.held = [row for row in held if row.id in set(result.held)]
        results = [result]
    if window.held:
        # ``decide`` already extended the held rows' lease past the task's wait.
        raise RetryableDeliveryError(f"{len(window.held)} message(s) will be retried in about {next_delay:g} s")
    totals: dict[str, int] = {}
    for result in results:
        for name, count in result.counts().items():
            totals[name] = totals.get(name, 0) + count
    return totals


async def _first_try(
    window: BatchWindow, context: DeliveryContext, hold_seconds: float | None, log: Any
) -> list[BatchResult]:
    """Send each batch of the window as it arrives; collect the rows held for a retry."""
    sending: list[asyncio.Task[BatchResult]] = []

    async def one(batch: ClaimedBatch, future: asyncio.Future[BatchResult]) -> BatchResult:
        try:
            result = await process_batch(batch, context, hold_seconds=hold_seconds, log=log)
        except BaseException as exc:
            # The claim loop logs it; the batch's rows stay leased and come back when the lease expires.
            if not future.done():
                future.set_exception(exc)
            raise
        held = set(result.held)
        window.held.extend(row for row in batch.rows if row.id in held)
        if not future.done():
            future.set_result(result)
        return result

    while (item := await window.queue.get()) is not None:
        sending.append(asyncio.ensure_future(one(*item)))
    done = await asyncio.gather(*sending, return_exceptions=True)
    failures = [outcome for outcome in done if isinstance(outcome, BaseException)]
    if failures and not window.held:
        raise failures[0]
    return [outcome for outcome in done if isinstance(outcome, BatchResult)]


class TaskWindows:
    """Hands each claimed batch to the open window's task run, opening one every ``task_run_seconds``."""

    def __init__(self, context: DeliveryContext, *, holds_retries: bool = True) -> None:
        """``holds_retries=False`` in a run that keeps delivering: its claim loop sends each retry when it is due."""
        self.context = context
        self.holds_retries = holds_retries
        self.task = delivery_task(context.settings)
        self.seconds = context.settings.delivery.task_run_seconds
        self.window: BatchWindow | None = None
        self.runs: set[asyncio.Future[Any]] = set()

    async def run(self, batch: ClaimedBatch, _context: DeliveryContext) -> BatchResult:
        """Deliver ``batch`` in the open window (the claim loop's ``run_batch``); returns its first try's result."""
        now = asyncio.get_running_loop().time()
        if self.window is None or self.window.closed or now >= self.window.closes_at:
            if self.window is not None:
                self.window.close()
            self.window = BatchWindow(now + self.seconds, holds_retries=self.holds_retries)
            window = self.window
            # Closed on time even if no batch comes after it: its held rows are retried within their lease.
            asyncio.get_running_loop().call_at(window.closes_at, window.close)
            run = asyncio.ensure_future(self.task(window, self.context))
            self.runs.add(run)
            run.add_done_callback(lambda ended: self._finished(ended, window))
        return await self.window.submit(batch)

    def _finished(self, run: asyncio.Future[Any], window: BatchWindow) -> None:
        self.runs.discard(run)
        error = None if run.cancelled() else run.exception()
        window.abandon(error or RuntimeError("the deliver-batches task run ended before sending this batch"))
        if error is not None:
            # Its batches' failures were logged by the claim loop; this is the task run's own state.
            logger.debug("a deliver-batches task run failed: %s", type(error).__name__)

    async def finish(self) -> None:
        """Close the open window and wait for every task run (retries included) to end."""
        if self.window is not None:
            self.window.close()
        while self.runs:
            await asyncio.wait(set(self.runs))


def delivery_task(settings: WebhooksSettings) -> Task[Any, Any]:
    """``deliver_batches`` with the retries of ``settings`` (the ones its runs get as ``context.settings``)."""
    return deliver_batches.with_options(
        retries=settings.delivery.task_retries, retry_delay_seconds=task_retry_delays(settings)
    )
