"""One try of a claimed batch: resolve destinations, drop filtered messages, send, decide, record, emit events.

What has finished is decided and recorded in waves while the batch's other requests are still out (``waves``): a
slow answer holds up no other message's outcome. While the batch sends, and until the outcomes of its rows are
recorded, their leases are renewed, so no other run claims and sends the same messages meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prefect_webhooks.delivery.batches.batching import hold_for_batch_wait, send_batched, take_batched
from prefect_webhooks.delivery.batches.fan_out import bind_to_endpoints
from prefect_webhooks.delivery.batches.waves import Waves
from prefect_webhooks.delivery.endpoints.stats import DeliveryStats, MessageCounts
from prefect_webhooks.delivery.pacing.context import ClaimedBatch, DeliveryContext, store_call
from prefect_webhooks.delivery.pacing.controls import before_sending
from prefect_webhooks.delivery.pacing.decision import BatchWrites
from prefect_webhooks.delivery.pacing.ordering import take_in_order
from prefect_webhooks.delivery.sending.destinations import DestinationNotFound, InvalidDestination, ResolvedDestination
from prefect_webhooks.delivery.sending.filters import split_filtered
from prefect_webhooks.messages.outcomes import Filtered, Rescheduled
from prefect_webhooks.messages.retry import deadline_of
from prefect_webhooks.signing.headers import message_key_prefix
from prefect_webhooks.store.engine.engines import store_key
from prefect_webhooks.store.queue.outbox import (
    Claimed,
    extend_leases,
    leased_rows,
    release_leases,
    renew_leases,
)
from prefect_webhooks.store.schema.tables import store_now

logger = logging.getLogger("prefect_webhooks.delivery")
# A batch that reaches its fence this soon after its claim (and within a quarter of its lease) is held as claimed.
FRESH_CLAIM_SECONDS = 1.0


@dataclass
class BatchResult(MessageCounts):
    """What one try of a batch did."""

    held: list[int] = field(default_factory=list)
    """Rows kept leased for an in-process retry."""


async def _resolve_all(
    rows: Sequence[Claimed], context: DeliveryContext, writes: BatchWrites
) -> tuple[list[tuple[Claimed, ResolvedDestination]], list[Claimed]]:
    """Pair rows with their destinations; unknown destinations fail, unreachable block storage defers."""
    resolved: dict[str, ResolvedDestination | None] = {}
    unavailable: dict[str, str] = {}
    names = {row.destination for row in rows}
    await context.shared.refresh(names)
    for name in names:
        # A change another process made (endpoint enable/disable) reaches this one within a second.
        context.destinations.follow(name, context.shared.generation(name))
        try:
            resolved[name] = await context.destinations.get(name)
        except DestinationNotFound:
            resolved[name] = None
        except InvalidDestination as exc:
            # Saved bypassing validation (API, UI): the rows wait until the block is fixed.
            unavailable[name] = str(exc)
            logger.warning("%s", unavailable[name])
        except Exception as exc:
            # Prefect API briefly unreachable: try these rows again later, not a reason to fail them.
            unavailable[name] = f"destination block {name!r} could not be loaded: {type(exc).__name__}"
            logger.warning("%s", unavailable[name])
    ready, deferred = [], []
    for row in rows:
        if row.destination in unavailable:
            deferred.append(row)
            continue
        destination = resolved[row.destination]
        if destination is None:
            writes.fail(row, f"permanent: destination block {row.destination!r} not found", row.attempts,
                        row.first_attempt_at)
        else:
            ready.append((row, destination))
    return ready, deferred


def _drop_filtered(
    ready: list[tuple[Claimed, ResolvedDestination]], writes: BatchWrites, stats: DeliveryStats
) -> list[tuple[Claimed, ResolvedDestination]]:
    """Take out the messages a destination filter drops: they end ``filtered`` with the rule as reason, unsent."""
    send, dropped = split_filtered(ready, lambda item: item[0].body, lambda item: item[1].filters)
    for (row, destination), reason in dropped:
        writes.records.filtered.append(Filtered(row.id, reason, row.destination))
        key = (destination.name, reason)
        stats.filtered_by_rule[key] = stats.filtered_by_rule.get(key, 0) + 1
    return send


async def process_batch(
    batch: ClaimedBatch,
    context: DeliveryContext,
    *,
    first_try: bool = True,
    hold_seconds: float | None = None,
    log: Any = None,
) -> BatchResult:
    """Deliver one claimed batch once: send, decide, record, emit events for messages that failed for good.

    Args:
        batch: Rows this process claimed.
        context: The process's sender, store and destination cache.
        first_try: False on a task retry: the rows are read again and only those still pending, still leased by
            this process and due are sent (the others are released to the outbox).
        hold_seconds: When an in-process retry follows after about this many seconds, retryable rows stay leased
            for it; None means retryable rows go back to the outbox at their backoff time.
        log: Logger to use (the task run's); the module logger by default.

    Returns:
        Counts, and the ids held for the in-process retry.
    """
    log = log or logger
    settings, engine = context.settings, context.engine
    rows = batch.rows
    if not first_try:
        rows = await store_call(settings, leased_rows, engine, batch.ids, context.owner)
    now = store_now()
    # A claim made just before a retry fell due took rows due by ``due_by``: they go at their due time (``send_at``).
    due_by = batch.due_by if first_try and batch.due_by is not None else now
    writes = BatchWrites()
    writes.records.owner = context.owner
    due, not_due, send_at = [], [], None
    for row in rows:
        if row.next_attempt_at > now:
            if row.next_attempt_at > due_by:
                not_due.append(row.id)
                continue
            send_at = row.next_attempt_at if send_at is None else max(send_at, row.next_attempt_at)
        if row.first_attempt_at is not None and now >= deadline_of(row.first_attempt_at, settings):
            writes.fail(row, f"expired: {row.reason or 'not delivered'} (after {row.attempts} attempts)",
                        row.attempts, row.first_attempt_at)
        else:
            due.append(row)
    if not_due:
        # A Retry-After longer than the task's wait: the outbox delivers these when they are due.
        await store_call(settings, release_leases, engine, not_due, context.owner)

    ready, deferred = await _resolve_all(due, context, writes)
    mine: set[int] = set()
    ready, deferred = await _still_held(ready, deferred, context, mine, log,
                                        fresh=first_try and batch.fresh(FRESH_CLAIM_SECONDS))
    # A batch can take longer than the lease (2,000 messages to a slow endpoint at 32 in flight and 2 s each: two
    # minutes; a store call riding out a restart): from the fence until its outcomes are recorded its leases are
    # renewed, so no other run claims and sends them meanwhile (a delivered row stays claimable until the record's
    # DELETE commits).
    keeper = asyncio.ensure_future(_keep_leases(context, mine))
    try:
        waves = await _send_and_record(batch, ready, deferred, mine, writes, context, now, hold_seconds, log,
                                       send_at)
    finally:
        keeper.cancel()
        context.give_up_rows(mine, mine)
        _waiting(batch, context)
    counts = waves.counts
    result = BatchResult(delivered=counts.delivered, failed=counts.failed, rescheduled=counts.rescheduled,
                         filtered=counts.filtered, held=waves.held)
    context.stats.add(result)
    return result


def _waiting(batch: ClaimedBatch, context: DeliveryContext) -> None:
    """The batch only waits for answers now: the claim loop no longer counts it against ``parallel_batches``."""
    if not batch.waiting:
        batch.waiting = True
        context.wake_claims()


async def _send_and_record(
    batch: ClaimedBatch,
    ready: list[tuple[Claimed, ResolvedDestination]],
    deferred: list[Claimed],
    mine: set[int],
    writes: BatchWrites,
    context: DeliveryContext,
    now: datetime,
    hold_seconds: float | None,
    log: Any,
    send_at: datetime | None,
) -> Waves:
    """The batch past its fence: bind, filter, send (not before ``send_at``), and record what has finished in waves
    (``waves``) as it finishes; ``mine`` grows with the rows it takes on and loses those recorded."""
    settings, engine = context.settings, context.engine
    ready, copies = await bind_to_endpoints(ready, context, writes)
    context.take_rows((row.id for row in copies), mine)
    batch.rows.extend(copies)  # a retry of this batch re-reads them with the others
    if any(destination.filters is not None for _, destination in ready):
        ready = _drop_filtered(ready, writes, context.stats)
    if context.key_prefix is None:
        context.key_prefix = message_key_prefix(await store_call(settings, store_key, engine))
    prefix = context.key_prefix
    ready, batched = take_batched(ready)
    if batched:
        batched = await hold_for_batch_wait(context, batched, prefix, now, mine)
    # Rate limits, disabled endpoints and per-user order apply alike to messages sent alone and in batches.
    ready, slots = await before_sending([*ready, *batched], context, writes.records, mine)
    ready, batched = take_batched(ready)
    ready, in_turn = await take_in_order(ready, slots, context,
                                         lambda added: _drop_filtered(added, writes, context.stats), mine)
    # Rows whose destination block could not be loaded are tried again later.
    retry_at = store_now() + timedelta(seconds=settings.delivery.retry_base_delay)
    writes.records.rescheduled += [Rescheduled(row.id, row.attempts, row.first_attempt_at, row.reason, retry_at)
                                   for row in deferred]
    if send_at is not None:
        await _not_before(send_at)
    waves = Waves([*ready, *batched], len(ready), writes, mine, context, sent_at=now, hold_seconds=hold_seconds,
                  log=log, on_started=lambda: _waiting(batch, context))
    try:
        await asyncio.gather(
            context.sender.send_all([(destination, row.body, f"{prefix}{row.id}") for row, destination in ready],
                                    slots.times_of(ready), in_turn,
                                    [row.first_attempt_at and deadline_of(row.first_attempt_at, settings)
                                     for row, _ in ready], progress=waves),
            send_batched(context, batched, prefix, writes, slots, finished=waves.batched_finished))
    except BaseException:
        waves.stop()
        raise
    await waves.close()
    return waves


async def _still_held(
    ready: list[tuple[Claimed, ResolvedDestination]],
    deferred: list[Claimed],
    context: DeliveryContext,
    mine: set[int],
    log: Any,
    *,
    fresh: bool = False,
) -> tuple[list[tuple[Claimed, ResolvedDestination]], list[Claimed]]:
    """The fence before sending: renew the lease and keep only the rows this run still holds (taken into ``mine``).

    A batch may wait between its claim and its requests (a store call riding out a restart, a slow block load). If
    its lease lapsed meanwhile and another run claimed the rows, that run sends them; sending them from here too
    would deliver them twice. A ``fresh`` batch (claimed moments ago, far inside its lease) is still held as claimed:
    it skips the store's round trip (a write transaction per batch) and only keeps to rows no other batch of this
    process holds.
    """
    ids = [row.id for row, _ in ready] + [row.id for row in deferred]
    if not ids:
        return ready, deferred
    if fresh:
        held = set(ids)
    else:
        until = store_now() + timedelta(seconds=context.settings.delivery.lease_seconds)
        held = await store_call(context.settings, renew_leases, context.engine, ids, context.owner, until)
    if len(held) < len(ids):
        log.warning("%d message(s) of this batch were taken over by another run after the batch's lease lapsed: "
                    "that run delivers them", len(ids) - len(held))
    taken = context.take_rows(held, mine)
    if len(taken) < len(held):
        log.warning("%d message(s) of this batch are in another batch of this process, which claimed them first and "
                    "whose lease lapsed: that batch delivers them", len(held) - len(taken))
    if len(taken) == len(ids):
        return ready, deferred
    return [item for item in ready if item[0].id in taken], [row for row in deferred if row.id in taken]


async def _not_before(moment: datetime) -> None:
    """Wait until the store's clock reaches ``moment``: a message claimed just before it fell due goes at its time."""
    while (wait := (moment - store_now()).total_seconds()) > 0:
        await asyncio.sleep(wait)


async def _keep_leases(context: DeliveryContext, ids: set[int]) -> None:
    """Renew this process's lease on ``ids`` (a set the batch adds to) every third of the lease until cancelled."""
    lease = context.settings.delivery.lease_seconds
    while True:
        await asyncio.sleep(lease / 3)
        if not ids:
            continue
        try:
            await store_call(context.settings, extend_leases, context.engine, sorted(ids), context.owner,
                             store_now() + timedelta(seconds=lease))
        except Exception as exc:
            # The lease runs out as it would have without renewal: at worst a message is sent twice.
            logger.warning("renewing the leases of a batch in flight failed: %s", type(exc).__name__)
