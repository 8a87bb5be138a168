"""The outcome decision: what becomes of a message after its requests (delivered, retried when, or failed, and why).

Any 2xx delivers a message; otherwise any retryable result reschedules it, not before a receiver's ``Retry-After``
and never past its deadline; otherwise it failed for good. Each decision is added to the batch's ``BatchWrites``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from prefect_webhooks.delivery.endpoints.stats import DeliveryStats
from prefect_webhooks.delivery.sending.sender import RequestResult, display_url, ends_in_a_retry
from prefect_webhooks.messages.outcomes import (
    DELIVERED,
    PERMANENT,
    RETRY,
    Delivered,
    EndpointRequest,
    Failed,
    OutcomeRecords,
    Rescheduled,
)
from prefect_webhooks.messages.retry import RETRY_AFTER_REASON, deadline_of, next_attempt_at, parse_retry_after
from prefect_webhooks.settings import WebhooksSettings
from prefect_webhooks.store.queue.outbox import Claimed


class BatchWrites:
    """What one batch try writes back (``records``), gathered message by message, and what follows the write."""

    def __init__(self) -> None:
        self.records = OutcomeRecords()
        self.failures: list[tuple[Claimed, str, int]] = []
        """(row, reason, attempts) of each message failed for good: an event each once the batch is recorded."""
        self.held: list[int] = []
        """Rows kept leased for an in-process retry."""

    def take(self) -> BatchWrites:
        """Everything gathered so far, as writes of their own (a wave of the batch's outcomes, ``waves``); these
        start again empty, for what comes in while the wave is recorded."""
        taken = BatchWrites()
        taken.records, taken.failures, taken.held = self.records, self.failures, self.held
        self.records = OutcomeRecords(owner=taken.records.owner)
        self.failures, self.held = [], []
        return taken

    def fail(self, row: Claimed, reason: str, attempts: int, first_attempt_at: datetime | None) -> None:
        """Mark ``row`` failed for good (an event is emitted once the batch is recorded)."""
        self.records.failed.append(Failed(row.id, reason, attempts, first_attempt_at, row.destination))
        self.failures.append((row, reason, attempts))

    def count_requests(self, stats: DeliveryStats, destination: str, results: Sequence[RequestResult]) -> None:
        """Count requests once each: in the run's ``stats`` (its artifact) and in the store's per-endpoint counters
        (``/metrics``), which the batch's outcomes are written with."""
        stats.add_requests(destination, results)
        requests = self.records.requests
        for result in results:
            requests.append(EndpointRequest(destination, display_url(result.url), result.outcome, result.status,
                                            result.latency_ms))


def _reason(results: Sequence[RequestResult], outcome: str) -> str:
    relevant = [result for result in results if result.outcome == outcome] or list(results)
    if len(relevant) == 1:
        return relevant[0].summary()
    return "; ".join(f"{display_url(result.url)}: {result.summary()}" for result in relevant)


def _latest_retry_after(results: Sequence[RequestResult], now: datetime) -> datetime | None:
    times = [parse_retry_after(result.retry_after, now) for result in results if result.retry_after]
    times = [value for value in times if value is not None]
    return max(times) if times else None


def _answered_at(results: Sequence[RequestResult], now: datetime) -> datetime:
    """When the last of a message's requests ended: its backoff counts from there, not from the end of its batch (a
    batch that sends an ordered user's messages in turn lasts as long as its longest run)."""
    ended = [result.attempted_at + timedelta(milliseconds=result.latency_ms) for result in results]
    return min(max(ended, default=now), now)


def decide(
    row: Claimed,
    results: Sequence[RequestResult],
    writes: BatchWrites,
    *,
    now: datetime,
    hold_until: datetime | None,
    owner: str,
    settings: WebhooksSettings,
    sent_at: datetime | None = None,
) -> None:
    """Turn one message's request results into its new state, added to ``writes``.

    Any 2xx delivers it; otherwise any retryable result reschedules it (held under this process's lease when an
    in-process retry follows, else due at the backoff time, never after the deadline); otherwise it failed for good.
    """
    attempts = row.attempts + 1
    # A first attempt counts from when its batch began sending (shared by the batch, so updates group well).
    first_attempt_at = row.first_attempt_at or sent_at or min(result.attempted_at for result in results)
    records = writes.records
    if len(results) == 1:  # most messages: one URL, one request
        result = results[0]
        records.attempts.append(result.attempt(row.id))
        delivered = result.outcome == DELIVERED
    else:
        records.attempts.extend(result.attempt(row.id) for result in results)
        delivered = any(result.outcome == DELIVERED for result in results)
    if delivered:
        records.delivered.append(Delivered(row.id, attempts, first_attempt_at, now, row.destination))
        return
    if not ends_in_a_retry(results):
        writes.fail(row, f"permanent: {_reason(results, PERMANENT)}", attempts, first_attempt_at)
        return
    reason = _reason(results, RETRY)
    retry_after = _latest_retry_after(results, now)
    if retry_after is not None:
        # Said in the reason, so a recovered endpoint's backlog is not brought forward past the receiver's wish.
        reason = f"{reason}; {RETRY_AFTER_REASON} {retry_after:%Y-%m-%d %H:%M:%S} UTC"
    deadline = deadline_of(first_attempt_at, settings)
    if hold_until is not None and now < deadline and (retry_after is None or retry_after <= deadline):
        # The task retry waits the backoff; the lease keeps other runs away meanwhile.
        when, lease_owner, lease_expires_at = max(now, retry_after or now), owner, hold_until
        writes.held.append(row.id)
    else:
        when = next_attempt_at(_answered_at(results, now), attempts, first_attempt_at, retry_after, settings)
        lease_owner, lease_expires_at = None, None
    if when is None:
        writes.fail(row, f"expired: {reason} (after {attempts} attempts)", attempts, first_attempt_at)
        return
    records.rescheduled.append(Rescheduled(row.id, attempts, first_attempt_at, reason, when, lease_owner,
                                           lease_expires_at))
