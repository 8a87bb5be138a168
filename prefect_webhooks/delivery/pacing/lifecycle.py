"""Endpoint lifecycle: health from each batch's requests, operational events, disabling after ``disable_after``.

After a batch sends, its requests are summed up per endpoint (``HealthReport``) and, when they change anything (a
failure, or a success after failures), added to the endpoint's row in the store, which says what changed:
``failing`` (``endpoint_failing_threshold`` failures in a row), ``recovered`` (a 2xx after that) or ``disabled``
(failing without a success for the destination's ``disable_after``). Each change is decided under the row's lock,
so exactly one process emits its event; for ``disabled`` that process also adds the endpoint to the block's
``disabled_endpoints``. A healthy endpoint costs no store write.

A disabled endpoint gets no requests. When every endpoint of a destination is disabled its messages fail at once
with the reason ``disabled: …`` (no ``delivery.failed`` event each: ``endpoint.disabled`` said it already);
``replay --reason-prefix disabled`` sends them once an endpoint is enabled again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone

from prefect_webhooks.blocks.enabling import adisable_endpoint
from prefect_webhooks.delivery.endpoints.events import emit_endpoint_event, in_background
from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.sending.circuit import CIRCUIT_OPEN_ERROR
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.delivery.sending.request_shape import Endpoint
from prefect_webhooks.delivery.sending.sender import RequestResult, display_url
from prefect_webhooks.messages.outcomes import DELIVERED, DISABLED_REASON, Failed, OutcomeRecords
from prefect_webhooks.store.endpoints.destination_changes import note_destination_changed
from prefect_webhooks.store.endpoints.states import (
    DISABLED,
    FAILING,
    RECOVERED,
    HealthReport,
    Transition,
    needs_recording,
    record_health,
    undo_disable,
)
from prefect_webhooks.store.queue.outbox import Claimed

logger = logging.getLogger("prefect_webhooks.delivery")

Ready = tuple[Claimed, ResolvedDestination]


async def fail_where_all_disabled(ready: list[Ready], records: OutcomeRecords,
                                  context: DeliveryContext) -> list[Ready]:
    """Fail the messages of destinations whose every endpoint is disabled; the others go on.

    Failing is final for a message, so the block is read again first unless this process's copy is a second old or
    less: a user who just enabled an endpoint (``endpoint enable --replay``) is not answered from a copy taken
    before the enable.
    """
    refreshed: dict[str, ResolvedDestination] = {}
    for name in {destination.name for _, destination in ready if not destination.endpoints}:
        fresh = await context.destinations.fresh(name)
        if fresh is not None:
            refreshed[name] = fresh
    sendable = []
    for row, destination in ready:
        if destination.name in refreshed:
            fresh = refreshed[destination.name]
            # A row bound to one endpoint (``fan_out``) looks at that endpoint only.
            destination = (fresh.narrowed(destination.only) or destination) if destination.only else fresh
        if destination.endpoints:
            sendable.append((row, destination))
            continue
        if destination.only is not None:
            url = display_url(destination.disabled[0].url) if destination.disabled else "its endpoint"
            reason = (f"{DISABLED_REASON} endpoint {url} of destination {destination.name!r} is disabled; enable it, "
                      "then replay with reason prefix 'disabled'")
        else:
            reason = (f"{DISABLED_REASON} every endpoint of destination {destination.name!r} is disabled; enable "
                      "one, then replay with reason prefix 'disabled'")
        records.failed.append(Failed(row.id, reason, row.attempts, row.first_attempt_at, row.destination))
    return sendable


def health_reports(
    ready: Sequence[Ready], results_by_row: Sequence[Sequence[RequestResult]]
) -> dict[str, tuple[ResolvedDestination, list[HealthReport]]]:
    """Per destination, what the batch's requests came to per endpoint (requests not sent are left out)."""
    by_endpoint: dict[tuple[str, str], list[RequestResult]] = {}
    destinations: dict[str, ResolvedDestination] = {}
    # A fan-out destination's rows come narrowed to one endpoint each (``fan_out``): its endpoints are gathered.
    endpoints: dict[str, dict[str, Endpoint]] = {}
    counted: set[int] = set()
    for (_, destination), results in zip(ready, results_by_row, strict=True):
        destinations[destination.name] = destination
        endpoints.setdefault(destination.name, {}).update((e.url, e) for e in destination.endpoints)
        for result in results:
            # The messages of one batch share its request's result: it counts once.
            if result.error != CIRCUIT_OPEN_ERROR and id(result) not in counted:
                counted.add(id(result))
                by_endpoint.setdefault((destination.name, result.url), []).append(result)
    for name, destination in destinations.items():
        if destination.only is not None:
            destinations[name] = replace(destination, endpoints=tuple(endpoints[name].values()), only=None)
    reports: dict[str, tuple[ResolvedDestination, list[HealthReport]]] = {}
    for (name, url), results in by_endpoint.items():
        destination = destinations[name]
        endpoint = endpoints[name].get(url)
        if endpoint is None:
            continue
        results.sort(key=lambda result: result.attempted_at)
        last_success = max((i for i, result in enumerate(results) if result.outcome == DELIVERED), default=-1)
        trailing = results[last_success + 1:]
        report = HealthReport(endpoint.key, display_url(url), last_success >= 0, len(trailing),
                              trailing[0].attempted_at if trailing else None,
                              trailing[-1].summary() if trailing else None)
        reports.setdefault(name, (destination, []))[1].append(report)
    return reports


async def observe_health(
    ready: Sequence[Ready], results_by_row: Sequence[Sequence[RequestResult]], context: DeliveryContext
) -> None:
    """Add a sent batch's outcomes to its endpoints' health; emit events and disable endpoints as it says."""
    all_delivered = all(result.outcome == DELIVERED for results in results_by_row for result in results)
    if all_delivered and not any(context.shared.endpoint(name, key) is not None
                                 for name, key in {(d.name, e.key) for _, d in ready for e in d.endpoints}):
        # The common case: healthy endpoints with no failure run to end; nothing to record.
        return
    for name, (destination, reports) in health_reports(ready, results_by_row).items():
        changed = [report for report in reports if needs_recording(report, context.shared.endpoint(name, report.key))]
        if not changed:
            continue
        try:
            transitions = await store_call(
                context.settings, record_health, context.engine, name, changed,
                failing_threshold=context.settings.delivery.endpoint_failing_threshold,
                disable_after=destination.disable_after)
        except Exception as exc:
            # Health is bookkeeping: the batch's messages are recorded all the same.
            logger.warning("recording the health of %s's endpoints failed: %s", name, type(exc).__name__)
            continue
        context.shared.mark_stale()
        for transition in transitions:
            await _act_on(transition, destination, context)


def _clock(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment else "an unknown time"


async def _act_on(transition: Transition, destination: ResolvedDestination, context: DeliveryContext) -> None:
    endpoint = next(e for e in destination.endpoints if e.key == transition.key)
    position: int | None = endpoint.position
    if transition.kind == DISABLED:
        reason = f"failing since {transition.failing_since:%Y-%m-%d %H:%M:%S} UTC: {transition.last_error}"
        # Disabled from now: its messages fail with ``disabled:`` while the block is saved, and ``enable --replay``
        # puts back what failed from this moment on.
        disabled_at = datetime.now(timezone.utc)
        context.destinations.hold_out(destination.name, endpoint.key)
        try:
            position = await adisable_endpoint(destination.name, endpoint.url, reason, at=disabled_at,
                                               failing_since=transition.failing_since)
        except Exception as exc:
            # The failure run goes on as if nothing happened: the next failure tries again.
            context.destinations.held_out_saved(destination.name, saved=False)
            await store_call(context.settings, undo_disable, context.engine, destination.name, transition.key,
                             transition.failing_since)
            logger.error("disabling endpoint %d of %s failed: %s", endpoint.position, destination.name,
                         type(exc).__name__)
            return
        context.destinations.held_out_saved(destination.name, saved=True)
        if position is None:
            # Disabled already (by another process, whose event is the run's one) or no longer in the block.
            return
        try:
            await store_call(context.settings, note_destination_changed, context.engine, destination.name)
        except Exception as exc:
            # The other processes then see the disable when their copy of the block ages out.
            logger.warning("telling the other delivery processes of the disable failed: %s", type(exc).__name__)
        logger.error("endpoint %s of destination %s is disabled: %s", position, destination.name, reason)
    elif transition.kind == FAILING:
        logger.warning("endpoint %s (%s) of destination %s is failing: %d attempt(s) in a row failed since %s UTC, "
                       "the last with %s", position, display_url(transition.url), destination.name,
                       transition.failures, _clock(transition.failing_since), transition.last_error)
    elif transition.kind == RECOVERED:
        logger.info("endpoint %s (%s) of destination %s answers again (it was failing since %s UTC)", position,
                    display_url(transition.url), destination.name, _clock(transition.failing_since))
    in_background(emit_endpoint_event, transition.kind, destination.name, transition.key, transition.url,
                  position=position, failures=transition.failures, failing_since=transition.failing_since,
                  last_error=transition.last_error)
