"""Rate limits in a batch: which messages may go now (and at which instant), which wait in the outbox, and pauses.

An endpoint needs budget when its block sets ``rate_limit``, or when the store says it is paused by a receiver's
``Retry-After`` or ramping up after a recovery (``store.endpoints.budget`` explains the slots). For each destination
with such an endpoint the batch takes slots in one store transaction, one per request (a batching destination's batch is
one request); a message with a slot is sent at that instant, one
without is put off to its estimated turn with the reason ``throttled: …`` and moves out of the due messages (no
claim reads it before then). Messages to other endpoints never touch any of this.

Waiting for budget never counts against ``max_retry_age``: a message that already had attempts has its first
attempt time moved later by the wait when it is put off (a message never attempted has no deadline yet).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.sending.batch_bodies import cut, item_size
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.delivery.sending.request_shape import Endpoint
from prefect_webhooks.delivery.sending.sender import RequestResult, display_url
from prefect_webhooks.messages.outcomes import THROTTLED_REASON, OutcomeRecords, Rescheduled
from prefect_webhooks.messages.retry import retry_after_seconds
from prefect_webhooks.store.endpoints.budget import Admission, Limit, Ramp, admit, release_parked
from prefect_webhooks.store.endpoints.states import pause, start_ramps, url_key
from prefect_webhooks.store.queue.outbox import Claimed
from prefect_webhooks.store.schema.clock import store_seconds
from prefect_webhooks.store.schema.tables import store_now

logger = logging.getLogger("prefect_webhooks.delivery")
# Slots further ahead than this are not taken: the message waits in the outbox instead of in the batch. Longer than
# the claim loop's pause, so messages coming back at the rate find their slot in the next claim.
HORIZON_SECONDS = 1.0

Ready = tuple[Claimed, ResolvedDestination]


def ramp_of(context: DeliveryContext) -> Ramp:
    """The ramp after a recovery, from the settings."""
    delivery = context.settings.delivery
    return Ramp(delivery.ramp_up_start_rate, delivery.ramp_up_seconds)


def ramp_start_of(context: DeliveryContext, url: str) -> float | None:
    """The rate ``url`` ramps up from after a recovery: ``ramp_up_share`` of the rate it took in its best recent
    seconds (as this process sent to it), at least ``ramp_up_start_rate``; None when recovered endpoints get their
    backlog at once."""
    delivery = context.settings.delivery
    if delivery.ramp_up_seconds <= 0:
        return None
    return max(delivery.ramp_up_start_rate, delivery.ramp_up_share * context.sender.guard.recent_peak_rate(url))


def limits_of(destination: ResolvedDestination, context: DeliveryContext) -> list[Limit]:
    """The endpoints of ``destination`` that need budget now (limited, paused, ramping, or a limit just removed)."""
    now, ramp, limits = store_seconds(), ramp_of(context), []
    for endpoint in destination.endpoints:
        row = context.shared.endpoint(destination.name, endpoint.key)
        constrained = row is not None and (row.paused_until > now or row.rate is not None
                                           or not math.isinf(ramp.rate(row.ramp_started_at, now,
                                                                       row.ramp_start_rate)))
        if endpoint.rate_limit is not None or constrained:
            limits.append(Limit(endpoint.key, display_url(endpoint.url), endpoint.rate_limit, endpoint.burst))
    return limits


@dataclass(slots=True)
class Slots:
    """When the messages that took budget go: per outbox id, its request's event loop time; for batching
    destinations also the number of its request (the messages of one request share a slot)."""

    at: dict[int, float] = field(default_factory=dict)
    request_of: dict[int, int] = field(default_factory=dict)

    def times_of(self, ready: Sequence[Ready]) -> list[float] | None:
        """Each message's time to go, in ``ready`` order (0: at once), or None when none took budget."""
        if not self.at:
            return None
        return [self.at.get(row.id, 0.0) for row, _ in ready]


async def admit_ready(
    ready: list[Ready], context: DeliveryContext, records: OutcomeRecords
) -> tuple[list[Ready], Slots]:
    """Take budget for the messages to limited endpoints; put off those without it (added to ``records``).

    A batching destination takes one slot per request: its messages are cut into batches here as they will be
    sent (``batch_size``, and ``batch_bytes`` for the largest body any endpoint gets), one slot each.

    Returns:
        The messages to send and the slots of those that took budget.
    """
    slots = Slots()
    await context.shared.refresh({destination.name for _, destination in ready})
    # By lane: a fan-out destination's rows are narrowed to one endpoint each, and each endpoint has its budget.
    limits_by_lane = {destination.lane: limits_of(destination, context) for destination in
                      {destination.lane: destination for _, destination in ready}.values()}
    limited: dict[tuple[str, str | None], tuple[ResolvedDestination, list[Limit], list[Claimed]]] = {}
    free: list[Ready] = []
    for row, destination in ready:
        limits = limits_by_lane[destination.lane]
        if not limits:
            free.append((row, destination))
            continue
        limited.setdefault(destination.lane, (destination, limits, []))[2].append(row)
    if not limited:
        return ready, slots
    for destination, limits, rows in limited.values():
        free += await _admit_destination(destination, limits, rows, context, records, slots)
    return free, slots


async def _admit_destination(
    destination: ResolvedDestination,
    limits: list[Limit],
    rows: list[Claimed],
    context: DeliveryContext,
    records: OutcomeRecords,
    slots: Slots,
) -> list[Ready]:
    # Messages coming back from being put off go first, then the others as they came due.
    rows.sort(key=lambda row: (not _was_parked(row), row.next_attempt_at, row.id))
    requests = _requests_of(destination, rows, context.key_prefix or "")
    asked_at = store_seconds()
    admission = await store_call(context.settings, admit, context.engine, destination.name, limits,
                                 [any(map(_was_parked, request)) for request in requests], horizon=HORIZON_SECONDS,
                                 ramp=ramp_of(context))
    loop_now, store_time = _loop_time_of(admission, asked_at), store_now()
    why = f"{THROTTLED_REASON} waiting for the request budget of {', '.join(limit.url for limit in limits)}"
    sending = []
    for number, (request, admitted, delay) in enumerate(
            zip(requests, admission.admitted, admission.delays, strict=True)):
        for row in request:
            if admitted:
                slots.at[row.id], slots.request_of[row.id] = loop_now + delay, number
                sending.append((row, destination))
                continue
            wait = timedelta(seconds=delay)
            first_attempt_at = row.first_attempt_at + wait if row.first_attempt_at is not None else None
            records.rescheduled.append(Rescheduled(row.id, row.attempts, first_attempt_at, why, store_time + wait))
    if admission.config_changed:
        # Messages put off at the old pace come back now and are placed at the new one.
        await store_call(context.settings, release_parked, context.engine, destination.name)
    context.shared.mark_stale()
    return sending


def _requests_of(destination: ResolvedDestination, rows: list[Claimed], key_prefix: str) -> list[list[Claimed]]:
    """The messages of each request ``rows`` make: one each, or the batches a batching destination cuts."""
    if destination.batching is None:
        return [[row] for row in rows]
    return cut(rows, destination.batching, lambda row: max(
        item_size(f"{key_prefix}{row.id}", endpoint.render(row.body)) for endpoint in destination.endpoints))


async def slots_for(context: DeliveryContext, destination: ResolvedDestination, endpoint: Endpoint,
                    count: int) -> list[float]:
    """Event loop times for ``count`` more requests to ``endpoint`` (the halves of a batch it refused with 413):
    the next slots of its budget, or now when it needs none."""
    limits = [limit for limit in limits_of(destination, context) if limit.key == endpoint.key]
    if not limits:
        return [asyncio.get_running_loop().time()] * count
    asked_at = store_seconds()
    admission = await store_call(context.settings, admit, context.engine, destination.name, limits, [True] * count,
                                 horizon=math.inf, ramp=ramp_of(context))
    admitted_at = _loop_time_of(admission, asked_at)
    return [admitted_at + delay for delay in admission.delays]


def _loop_time_of(admission: Admission, asked_at: float) -> float:
    """The event loop time of the database's now the admission's delays count from.

    The store call returns a while after that now (its commit, a thread's turn on a busy machine). Counting the
    delays from when it returned would shift each batch's slots later by that while, and a batch that waited longer
    would then overlap the next one's slots: more requests in a second than the limit. ``store_seconds`` is the
    database's clock as this process carries it (``store.schema.clock``), so the while is never taken as longer than the
    call itself either.
    """
    returned_at = store_seconds()
    elapsed = min(max(returned_at - admission.now, 0.0), returned_at - asked_at)
    return asyncio.get_running_loop().time() - elapsed


def _was_parked(row: Claimed) -> bool:
    return bool(row.reason and row.reason.startswith(THROTTLED_REASON))


async def record_pauses(ready: Sequence[Ready], results_by_row: Sequence[Sequence[RequestResult]],
                        context: DeliveryContext) -> None:
    """Pause every endpoint that answered with a ``Retry-After``, for all processes, for as long as it asked."""
    longest: dict[tuple[str, str], tuple[Endpoint, float]] = {}
    cap = context.settings.delivery.retry_max_delay
    for (_, destination), results in zip(ready, results_by_row, strict=True):
        for result in results:
            if not result.retry_after:
                continue
            seconds = retry_after_seconds(result.retry_after)
            endpoint = _endpoint_for(destination, result.url)
            if not seconds or endpoint is None:
                continue
            key, seconds = (destination.name, endpoint.key), min(seconds, cap)
            if seconds > longest.get(key, (endpoint, 0.0))[1]:
                longest[key] = (endpoint, seconds)
    for (name, key), (endpoint, seconds) in longest.items():
        try:
            await store_call(context.settings, pause, context.engine, name, key, display_url(endpoint.url), seconds,
                             ramp_start_of(context, endpoint.url))
        except Exception as exc:
            # Only the shared pause is lost: the message itself already waits for its Retry-After.
            logger.warning("recording a Retry-After pause failed: %s", type(exc).__name__)
    if longest:
        context.shared.mark_stale()


def _endpoint_for(destination: ResolvedDestination, url: str) -> Endpoint | None:
    return next((endpoint for endpoint in destination.endpoints if endpoint.url == url), None)


async def start_ramp(context: DeliveryContext, url: str, names: Sequence[str]) -> None:
    """Make ``url`` ramp up again in every destination that posts to it (its circuit just closed)."""
    ramp_from = ramp_start_of(context, url)
    if ramp_from is None or not names:
        return
    endpoints: list[Any] = [(name, url_key(url), display_url(url)) for name in names]
    try:
        await store_call(context.settings, start_ramps, context.engine, endpoints, ramp_from)
    except Exception as exc:
        logger.warning("starting the ramp-up of %s failed: %s", display_url(url), type(exc).__name__)
    context.shared.mark_stale()
