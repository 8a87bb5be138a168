"""The claim loop: claim due messages batch after batch and keep batches in flight until done.

Claiming, sending and recording overlap. A batch is prepared (its store calls before sending), sends, and then only
waits for its answers, recording what has finished in waves (``waves``). ``parallel_batches`` bounds the batches being
prepared or sending; a batch that only waits counts against ``waiting_batches`` instead, so slow answers hold up no
claim. A retry this process scheduled is claimed just before it falls due (``retry_wakeups``), with one batch more
than both bounds allow.

``deliver_due`` is what the ``deliver`` flow, the delivery worker and the benchmarks run; ``DeliveryOptions`` says
which messages, how many at a time and for how long, and whether each batch is a Prefect task run. In a delivery
worker each run is a ``Shift`` that hands over to the next without a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Engine

from prefect_webhooks.delivery.batches.batch import process_batch
from prefect_webhooks.delivery.batches.task import TaskWindows
from prefect_webhooks.delivery.endpoints.events import wait_for_queued_events
from prefect_webhooks.delivery.endpoints.stats import DeliveryStats
from prefect_webhooks.delivery.pacing.context import ClaimedBatch, DeliveryContext, is_store_unavailable, store_call
from prefect_webhooks.delivery.pacing.rate_limits import start_ramp
from prefect_webhooks.delivery.pacing.retry_wakeups import LEAD
from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.delivery.sending.sender import Sender, display_url
from prefect_webhooks.messages.retry import RetryableDeliveryError
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import bring_forward, claim_due_deliveries
from prefect_webhooks.store.schema.tables import store_now

logger = logging.getLogger("prefect_webhooks.delivery")
# How long a run outside a delivery worker waits at its end for its events (the first of a process may wait seconds
# for Prefect's events client).
EVENTS_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class DeliveryOptions:
    """What one ``deliver_due`` call delivers, and how.

    Attributes:
        destination: Only this destination block's messages; all when None.
        batch_size: Messages per claim; ``settings.delivery.claim_batch_size`` by default.
        max_batches: Stop after claiming this many batches.
        run_for_seconds: Keep going this long (continuous mode); None means stop as soon as nothing is due and no
            batch is in flight.
        until_empty: In continuous mode, stop early once nothing is due and no batch is in flight.
        parallel_batches: Batches in flight at once that are still being prepared or still have messages to send
            (they share one HTTP session and its concurrency limit). A batch whose every message is on its way only
            waits for answers, and counts against ``waiting_batches`` instead.
        waiting_batches: Batches in flight at most besides those ``parallel_batches`` counts, waiting for answers
            (an endpoint that answers slowly or hangs); one more is claimed for a retry of this process that is due.
            Bounds what a process holds and claims when answers take long. 20: a hanging endpoint keeps each batch
            for ``request_timeout`` (5 s), and claims come every ``idle_sleep`` (0.3 s): 17 batches wait at once.
        idle_sleep: Continuous mode: seconds from a claim that was not full (or found nothing) to the next claim.
        prefect_tasks: Run the batches as Prefect task runs (``deliver-batches``, one per ``task_run_seconds``)
            whose retries resend what is left within the run; otherwise one plain try, and retryable messages wait
            in the outbox for their backoff.
    """

    destination: str | None = None
    batch_size: int | None = None
    max_batches: int | None = None
    run_for_seconds: float | None = None
    until_empty: bool = False
    parallel_batches: int = 2
    waiting_batches: int = 20
    idle_sleep: float = 0.3
    prefect_tasks: bool = False


@dataclass(eq=False)
class Shift:
    """A run's turn in a delivery worker: the worker's open sender and destination cache, and the handover.

    A delivery worker (``prefect_webhooks.serving.delivery_worker``) runs the ``deliver`` flow back to back in one
    process; each run is a shift. The run's claim loop sets ``claiming`` once it has made its first claim, so the worker
    knows the successor is delivering; the worker then sets the predecessor's ``handed_over``, and that run stops
    claiming, finishes the batches it holds and ends. The two overlap by at least one claim: delivery never pauses.
    A shift ends only when handed over, whatever its ``run_for_seconds``: while no successor can start (the Prefect
    API is down), the current one goes on.
    """

    sender: Sender
    destinations: DestinationCache
    claiming: asyncio.Event = field(default_factory=asyncio.Event)
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)
    batches_claimed: int = 0
    """Batches the run has claimed so far: none means a quiet run, which the worker lets go on."""
    unrecorded: DeliveryStats | None = None
    """What the run did, when its artifacts could not be published (the worker publishes them on the API's return)."""


current_shift: contextvars.ContextVar[Shift | None] = contextvars.ContextVar("prefect_webhooks_shift", default=None)
"""The shift of the run executing in this context (set by the delivery worker; None elsewhere)."""


async def deliver_due(
    options: DeliveryOptions | None = None,
    *,
    engine: Engine | None = None,
    context: DeliveryContext | None = None,
) -> DeliveryStats:
    """Claim due messages batch after batch and deliver them until nothing is due (or for a while).

    Args:
        options: What to deliver and how; ``DeliveryOptions()`` (everything due, plain tries) by default.
        engine: The store; the configured one by default.
        context: A prepared context (its sender must be open); in a delivery worker the shift's, else one is made
            for the call.

    Returns:
        What the run did, with per-endpoint request stats.
    """
    options = options or DeliveryOptions()
    shift = current_shift.get()
    if context is None and shift is not None:
        # In a delivery worker: the worker's warm session, circuit breakers and destination cache.
        context = DeliveryContext(engine or get_engine(), shift.sender, destinations=shift.destinations,
                                  settings=shift.sender.settings)
    if context is not None:
        return await _claim_loop(context, options)
    settings = get_settings()
    async with Sender(settings) as sender:
        stats = await _claim_loop(DeliveryContext(engine or get_engine(), sender, settings=settings), options)
    # A run outside a delivery worker is often its process's last: its endpoint events go before it may end.
    await asyncio.to_thread(wait_for_queued_events, EVENTS_WAIT_SECONDS)
    return stats


async def _claim_loop(context: DeliveryContext, options: DeliveryOptions) -> DeliveryStats:
    idle_sleep, parallel_batches, max_batches = options.idle_sleep, options.parallel_batches, options.max_batches
    size = options.batch_size or context.settings.delivery.claim_batch_size
    stop_at = time.monotonic() + options.run_for_seconds if options.run_for_seconds is not None else None
    # Continuous mode: after a claim that was not full (no backlog) the next one waits ``idle_sleep``, so it finds
    # more. Each batch is a Prefect task run, which costs the Prefect server ~10-25 ms of CPU whatever its size:
    # this keeps task runs to a few per second at any rate, their batches growing with the rate.
    spacing = idle_sleep if stop_at is not None else 0.0
    keeps_delivering = stop_at is not None and not options.until_empty
    # A run that keeps delivering claims each retry when it is due; one that ends once nothing is due would not come
    # back for it, so there the task's next try sends it.
    windows = TaskWindows(context, holds_retries=not keeps_delivering) if options.prefect_tasks else None
    run_batch = windows.run if windows is not None else process_batch
    shift = current_shift.get()
    in_flight: dict[asyncio.Task[Any], ClaimedBatch] = {}
    # Batches wake the loop when they only wait for answers, and so do retries noted to fall due sooner than planned.
    wake = asyncio.Event()
    context.claim_waker = wake.set
    claimed_batches = 0
    next_claim_at = 0.0
    seen_until = 0.0  # the last claim took every message due by then (monotonic)
    exhausted = False
    while True:
        wake.clear()
        retry_due = False
        if keeps_delivering:
            # A retry this process scheduled is claimed when due, not at the next idle tick.
            next_claim_at, retry_due = _retries_due(context, next_claim_at, seen_until)
        # In a delivery worker only the worker ends a shift (a handover): a run whose successor cannot start, the
        # Prefect API being down, goes on delivering.
        out_of_time = (shift.handed_over.is_set() if shift is not None
                       else stop_at is not None and time.monotonic() >= stop_at)
        out_of_batches = max_batches is not None and claimed_batches >= max_batches
        exhausted = False
        # Only a run that keeps delivering brings messages forward for a circuit's probe or recovery: in a run that
        # ends once nothing is due, each probe would make one more message due, and a hanging endpoint would keep it
        # going.
        if keeps_delivering:
            await _follow_circuits(context)
        while (not (out_of_time or out_of_batches) and time.monotonic() >= next_claim_at
               and _may_claim(in_flight.values(), parallel_batches, options.waiting_batches, retry_due)):
            claimed_at = seen_until = time.monotonic()
            due_by = None
            if retry_due:
                # Made just before the retry falls due; the batch sends it at its due time.
                context.retry_wakeups.claiming(claimed_at)
                due_by, seen_until, retry_due = store_now() + timedelta(seconds=LEAD), claimed_at + LEAD, False
            try:
                rows = await store_call(context.settings, claim_due_deliveries, context.engine, size, context.owner,
                                        options.destination, lease_seconds=context.settings.delivery.lease_seconds,
                                        in_order=context.shared.may_be_ordered(), due_by=due_by)
            except Exception as exc:
                if stop_at is None or not is_store_unavailable(exc):
                    raise
                # Continuous mode outlives a store outage: claim again after a pause.
                logger.error("claiming failed, store unavailable: %s", type(exc).__name__)
                next_claim_at = time.monotonic() + max(idle_sleep, 1.0)
                break
            if shift is not None:
                shift.claiming.set()
            if not rows:
                exhausted = True
                next_claim_at = time.monotonic() + spacing
                break
            claimed_batches += 1
            context.stats.batches += 1
            if shift is not None:
                shift.batches_claimed += 1
            batch = ClaimedBatch(rows, lease_seconds=context.settings.delivery.lease_seconds, due_by=due_by)
            in_flight[asyncio.ensure_future(run_batch(batch, context))] = batch
            out_of_batches = max_batches is not None and claimed_batches >= max_batches
            if len(rows) < size:
                next_claim_at = time.monotonic() + spacing
        if keeps_delivering:
            # The claims above planned the next one at the idle spacing: a retry due sooner comes first.
            next_claim_at, _ = _retries_due(context, next_claim_at, seen_until)
        if not in_flight:
            if out_of_time or out_of_batches or (exhausted and (stop_at is None or options.until_empty)):
                break
            await _idle(max(next_claim_at - time.monotonic(), 0.0) if next_claim_at else idle_sleep, shift)
            continue
        wait = next_claim_at - time.monotonic()
        timeout = wait if wait > 0 else (idle_sleep if exhausted else None)
        woken = asyncio.ensure_future(wake.wait())
        done, _ = await asyncio.wait([*in_flight, woken], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        woken.cancel()
        for finished in done:
            if finished is not woken:
                del in_flight[finished]
                _log_batch_failure(finished)
    context.claim_waker = None
    if windows is not None:
        await windows.finish()
    return context.stats


def _retries_due(context: DeliveryContext, next_claim_at: float, seen_until: float) -> tuple[float, bool]:
    """The next claim's time, brought forward to the claim for the first retry of this process the last claim did not
    take (``retry_wakeups``: just before it falls due, as the pace of claims for retries allows), and whether that
    claim is due now."""
    due = context.retry_wakeups.first_after(seen_until)
    if due is None:
        return next_claim_at, False
    return min(next_claim_at, due), due <= time.monotonic()


def _may_claim(batches: Iterable[ClaimedBatch], parallel: int, waiting: int, retry_due: bool) -> bool:
    """Whether another batch may be claimed beside ``batches``: fewer than ``parallel`` of them are still being
    prepared or sending, and fewer than ``parallel + waiting`` in all; one more of each for a due retry."""
    extra = 1 if retry_due else 0
    count = sending = 0
    for batch in batches:
        count += 1
        sending += not batch.waiting
    return sending < max(parallel, 1) + extra and count < max(parallel, 1) + max(waiting, 0) + extra


async def _idle(seconds: float, shift: Shift | None) -> None:
    """Sleep between claims; a handover ends the sleep at once."""
    if shift is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        await asyncio.wait_for(shift.handed_over.wait(), seconds)


async def _follow_circuits(context: DeliveryContext) -> None:
    """Bring waiting messages forward for endpoints whose circuit is due a probe (one) or recovered (all)."""
    guard = context.sender.guard
    for url, limit in [*((url, 1) for url in guard.take_due_probes()), *((url, None) for url in
                                                                          guard.take_recovered())]:
        names = context.destinations.names_for_url(url)
        if limit is None:
            # The backlog comes due at once; the ramp paces it into the endpoint.
            await start_ramp(context, url, names)
        try:
            moved = await store_call(context.settings, bring_forward, context.engine, names, limit=limit)
        except Exception as exc:
            # Only a shortcut: the messages are still due at their backoff time.
            logger.warning("bringing messages forward for %s failed: %s", display_url(url), type(exc).__name__)
            continue
        if moved and limit is None:
            logger.info("%s answers again: %d waiting message(s) are due now", display_url(url), moved)


def _log_batch_failure(finished: asyncio.Task[Any]) -> None:
    exc = finished.exception()
    if exc is not None and not isinstance(exc, RetryableDeliveryError):
        # The batch's rows stay leased and come back when the lease expires; nothing is lost.
        logger.error("delivery batch failed: %s: %s", type(exc).__name__, exc)
