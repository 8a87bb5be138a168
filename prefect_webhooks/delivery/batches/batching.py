"""Batched delivery: the due messages of a destination with ``batch_size`` go out as JSON arrays, one request per
batch and endpoint (bodies and ids: ``batch_bodies``).

- A 2xx delivers every item; a 413 splits the batch in halves, sent at once (first half first), down to single
  items (a single item's 413 fails it for good, as for one message); any other answer applies to every item.
- Each message then goes through the same decision as a message sent alone (``decision.decide``), so its attempt
  count, attempt log and 4-hour deadline stay its own; the 413 requests are logged per message too (outcome
  ``split``). Messages of a destination rescheduled by one try come due together, so the batch retries whole.
- A rate-limited endpoint's budget counts requests: each batch takes one slot (``rate_limits`` cuts the batches
  when it takes them), and the halves of a 413 take two more.
- ``batch_wait``: a destination's due messages that do not fill a batch wait until the oldest was accepted
  ``batch_wait`` seconds ago (released to the outbox until then; no attempt is counted). Messages being retried
  do not wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from prefect_webhooks.delivery.pacing.context import DeliveryContext, store_call
from prefect_webhooks.delivery.pacing.decision import BatchWrites
from prefect_webhooks.delivery.pacing.rate_limits import Slots, slots_for
from prefect_webhooks.delivery.sending.batch_bodies import Item, batch_request, endpoint_batches, item_size
from prefect_webhooks.delivery.sending.destinations import ResolvedDestination
from prefect_webhooks.delivery.sending.request_shape import Endpoint
from prefect_webhooks.delivery.sending.sender import RequestResult, display_url, run_paced
from prefect_webhooks.messages.outcomes import Rescheduled
from prefect_webhooks.store.queue.outbox import Claimed, release_leases

logger = logging.getLogger("prefect_webhooks.delivery")

SPLIT = "split"
"""Outcome logged for each message of a batch a receiver answered 413 (it was sent again in a smaller batch)."""

Pair = tuple[Claimed, ResolvedDestination]


def take_batched(ready: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """``ready`` split into messages sent one per request and messages of batching destinations."""
    single = [pair for pair in ready if pair[1].batching is None]
    if len(single) == len(ready):
        return ready, []
    return single, [pair for pair in ready if pair[1].batching is not None]


def _by_destination(pairs: Sequence[Pair]) -> dict[tuple[str, str | None], list[Pair]]:
    groups: dict[tuple[str, str | None], list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(pair[1].lane, []).append(pair)
    for group in groups.values():
        group.sort(key=lambda pair: pair[0].id)  # acceptance order
    return groups


async def hold_for_batch_wait(
    context: DeliveryContext, pairs: list[Pair], key_prefix: str, now: datetime, held: set[int]
) -> list[Pair]:
    """The messages to send now; the others (partial batches still within ``batch_wait``) go back to the outbox,
    due when their oldest message was accepted ``batch_wait`` seconds ago, and leave ``held`` (the batch's rows)."""
    send: list[Pair] = []
    postponed: dict[datetime, list[int]] = {}
    for group in _by_destination(pairs).values():
        batching = group[0][1].batching
        assert batching is not None
        until = min(row.created_at or row.next_attempt_at for row, _ in group) + timedelta(seconds=batching.wait)
        size = 2 + sum(item_size(f"{key_prefix}{row.id}", row.body) for row, _ in group)
        if until <= now or len(group) >= batching.size or size >= batching.max_bytes or any(
                row.attempts for row, _ in group):
            send.extend(group)
        else:
            postponed.setdefault(until, []).extend(row.id for row, _ in group)
    for until, ids in postponed.items():
        context.give_up_rows(ids, held)
        await store_call(context.settings, release_leases, context.engine, ids, context.owner, due_at=until)
    return send


async def send_batched(
    context: DeliveryContext,
    pairs: list[Pair],
    key_prefix: str,
    writes: BatchWrites,
    slots: Slots | None = None,
    finished: Callable[[int, list[RequestResult]], None] | None = None,
) -> list[list[RequestResult]]:
    """Send the messages of batching destinations; each message's results (one per endpoint), in ``pairs`` order.

    The messages that took rate budget (``slots``) go as the requests they took it for, each at its slot.
    ``finished`` hears of a destination's messages (index in ``pairs``, results) once all its requests are answered:
    together, so they are decided together and their batch is retried whole (``retry_together``).
    """
    index_of = {row.id: index for index, (row, _) in enumerate(pairs)}
    results: list[list[RequestResult]] = [[] for _ in pairs]

    async def lane(job: Awaitable[Sent], group: list[Pair]) -> None:
        for outbox_id, result in await job:
            results[index_of[outbox_id]].append(result)
        if finished is not None:
            for row, _ in group:
                finished(index_of[row.id], results[index_of[row.id]])

    jobs = []
    for group in _by_destination(pairs).values():
        destination = group[0][1]
        if slots is not None and group[0][0].id in slots.at:
            requests: dict[int, list[Claimed]] = {}
            for row, _ in group:
                requests.setdefault(slots.request_of[row.id], []).append(row)
            jobs.append(lane(_paced([
                (slots.at[request[0].id], _batches_job(context, destination, request, key_prefix, writes))
                for request in requests.values()]), group))
        else:
            jobs.append(lane(_batches_job(context, destination, [row for row, _ in group], key_prefix, writes)(),
                             group))
    await asyncio.gather(*jobs)
    return results


Sent = list[tuple[int, RequestResult]]


def _batches_job(
    context: DeliveryContext, destination: ResolvedDestination, rows: list[Claimed], key_prefix: str,
    writes: BatchWrites,
) -> Callable[[], Awaitable[Sent]]:
    """A job sending ``rows`` to every endpoint of ``destination``, in as many batches as their size needs."""
    assert destination.batching is not None
    messages = [(row.id, row.body) for row in rows]

    async def job() -> Sent:
        sends = [_send(context, destination, endpoint, batch, key_prefix, writes)
                 for endpoint in destination.endpoints
                 for batch in endpoint_batches(endpoint, destination.batching, key_prefix, messages)]
        return [pair for sent in await asyncio.gather(*sends) for pair in sent]

    return job


async def _paced(jobs: list[tuple[float, Callable[[], Awaitable[Sent]]]]) -> Sent:
    """Run each request's job at its slot; everything the jobs sent."""
    sent: Sent = []

    def collecting(job: Callable[[], Awaitable[Sent]]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            sent.extend(await job())
        return run

    await run_paced([(at, collecting(job)) for at, job in jobs])
    return sent


async def _send(
    context: DeliveryContext,
    destination: ResolvedDestination,
    endpoint: Endpoint,
    items: list[Item],
    key_prefix: str,
    writes: BatchWrites,
) -> Sent:
    result = await context.sender.request(batch_request(endpoint, destination.signer, key_prefix, items))
    writes.count_requests(context.stats, destination.name, [result])
    if result.status == 413 and len(items) > 1:
        reason = f"batch of {len(items)} too large, sent again in halves"
        writes.records.attempts.extend(result.attempt(outbox_id, error=reason, outcome=SPLIT)
                                       for outbox_id, _, _ in items)
        half = len(items) // 2
        # The halves are two more requests: a rate-limited endpoint's budget paces them too.
        first_at, second_at = await slots_for(context, destination, endpoint, 2)
        await _sleep_until(first_at)
        first = await _send(context, destination, endpoint, items[:half], key_prefix, writes)
        await _sleep_until(second_at)
        return first + await _send(context, destination, endpoint, items[half:], key_prefix, writes)
    if result.error and result.error.startswith("timeout"):
        logger.error("a batch of %d message(s) to %s timed out; it will be retried", len(items),
                     display_url(result.url))
    return [(outbox_id, result) for outbox_id, _, _ in items]


async def _sleep_until(at: float) -> None:
    delay = at - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def retry_together(rescheduled: list[Rescheduled], pairs: Sequence[Pair]) -> None:
    """Make the messages of a destination that this try rescheduled for the same reason due at the earliest of
    their times, so their batch is retried whole: never later than any message's own time (no deadline is passed),
    never before a receiver's ``Retry-After`` (it is part of the reason)."""
    destination_of = {row.id: destination.lane for row, destination in pairs}
    waiting = [entry for entry in rescheduled if entry.id in destination_of and entry.lease_owner is None]
    earliest: dict[tuple[tuple[str, str | None], str | None], datetime] = {}
    for entry in waiting:
        group = destination_of[entry.id], entry.reason
        earliest[group] = min(earliest.get(group, entry.next_attempt_at), entry.next_attempt_at)
    for entry in waiting:
        entry.next_attempt_at = earliest[destination_of[entry.id], entry.reason]
