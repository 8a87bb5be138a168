"""The outcome decision for one message's requests: delivered, retried when, or failed for good."""

from __future__ import annotations

from datetime import timedelta

from prefect_webhooks.delivery.pacing.decision import BatchWrites, decide
from prefect_webhooks.delivery.sending.sender import RequestResult
from prefect_webhooks.messages.outcomes import RETRY
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.queue.outbox import Claimed
from prefect_webhooks.store.schema.tables import store_now


def test_a_retrys_backoff_counts_from_the_refused_requests_answer_not_the_end_of_its_batch() -> None:
    settings = get_settings()
    base = settings.delivery.retry_base_delay
    sent_at = store_now()
    # Refused early in a batch that ended 30 s later (an ordered user's run behind it, a slow receiver elsewhere).
    refused = RequestResult("http://127.0.0.1:1/hook", sent_at, RETRY, status=503, latency_ms=200.0)
    batch_ended = sent_at + timedelta(seconds=30)
    writes = BatchWrites()
    decide(Claimed(1, "d", b"{}", 0, None, sent_at), [refused], writes, now=batch_ended, hold_until=None,
           owner="o", settings=settings, sent_at=sent_at)
    [rescheduled] = writes.records.rescheduled
    answered = sent_at + timedelta(milliseconds=200)
    assert answered + timedelta(seconds=0.8 * base) <= rescheduled.next_attempt_at
    assert rescheduled.next_attempt_at <= answered + timedelta(seconds=1.2 * base)
