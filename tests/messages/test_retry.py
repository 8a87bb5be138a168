from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from prefect.states import Completed, Failed

from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT, RETRY
from prefect_webhooks.messages.retry import (
    CLIENT_JITTER,
    DELIVERY_JITTER,
    RetryableDeliveryError,
    backoff_delay,
    classify_status,
    deadline_of,
    is_retryable_delivery_error,
    is_retryable_status,
    next_attempt_at,
    parse_retry_after,
    retry_after_seconds,
    retry_delay,
)
from prefect_webhooks.settings import DeliverySettings, WebhooksSettings

NOW = datetime(2026, 1, 1, 12, 0, 0)
SETTINGS = WebhooksSettings(
    delivery=DeliverySettings(retry_base_delay=5, retry_max_delay=1800, max_retry_age=4 * 3600, task_retries=3)
)


def with_task_retries(retries: int) -> WebhooksSettings:
    return WebhooksSettings(delivery=SETTINGS.delivery.model_copy(update={"task_retries": retries}))


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, DELIVERED), (201, DELIVERED), (204, DELIVERED), (299, DELIVERED),
        (500, RETRY), (502, RETRY), (503, RETRY), (599, RETRY), (408, RETRY), (429, RETRY),
        (400, PERMANENT), (401, PERMANENT), (403, PERMANENT), (404, PERMANENT), (410, PERMANENT),
        (413, PERMANENT), (301, PERMANENT), (100, PERMANENT),
    ],
)
def test_classify_status(status: int, outcome: str) -> None:
    assert classify_status(status) == outcome
    # The client retries exactly what delivery retries.
    assert is_retryable_status(status) is (outcome == RETRY)


def test_retry_after_in_seconds() -> None:
    assert parse_retry_after("30", NOW) == NOW + timedelta(seconds=30)
    assert parse_retry_after(" 0 ", NOW) == NOW


def test_retry_after_as_http_date() -> None:
    when = datetime(2026, 1, 1, 12, 2, 0, tzinfo=timezone.utc)
    assert parse_retry_after(format_datetime(when, usegmt=True), NOW) == NOW + timedelta(minutes=2)
    # A date in the past means "now".
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW) == NOW


def test_retry_after_absent_or_unreadable_is_ignored() -> None:
    assert parse_retry_after(None, NOW) is None
    assert parse_retry_after("", NOW) is None
    assert parse_retry_after("soon", NOW) is None
    assert parse_retry_after("-5", NOW) is None


def test_retry_after_is_capped_at_a_day() -> None:
    assert parse_retry_after("99999999", NOW) == NOW + timedelta(days=1)


def test_retry_after_seconds_reads_both_forms_against_an_aware_or_naive_now() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(" 0.5 ") == 0.5
    when = format_datetime(datetime(2026, 1, 1, 12, 0, 30, tzinfo=timezone.utc), usegmt=True)
    assert retry_after_seconds(when, NOW) == 30.0
    assert retry_after_seconds(when, NOW.replace(tzinfo=timezone.utc)) == 30.0
    # Without ``now``, the clock: a date far ahead is far ahead (capped), one long past is now.
    assert retry_after_seconds("Wed, 21 Oct 2099 07:28:00 GMT") == 24 * 3600
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "inf", "1e3", "\u00b2", "\u0663"])
def test_retry_after_seconds_ignores_what_is_not_a_delay(value: str | None) -> None:
    assert retry_after_seconds(value, NOW) is None
    assert parse_retry_after(value, NOW) is None


def test_backoff_delay_doubles_to_the_cap_without_overflowing() -> None:
    assert [backoff_delay(n, 0.5, 4.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff_delay(0, 0.5, 4.0) == 0.5
    assert backoff_delay(5_000, 0.5, 4.0) == 4.0


@pytest.mark.parametrize(("jitter", "low", "high"), [(CLIENT_JITTER, 0.5, 1.0), (DELIVERY_JITTER, 0.8, 1.2)])
def test_backoff_jitter_stays_in_each_senders_range(jitter: tuple[float, float], low: float, high: float) -> None:
    for retry, ceiling in [(1, 0.5), (3, 2.0), (9, 4.0)]:
        delays = [backoff_delay(retry, 0.5, 4.0, jitter) for _ in range(300)]
        assert all(low * ceiling <= delay <= high * ceiling for delay in delays)
        assert len(set(delays)) > 200  # jittered, not a fixed schedule


def test_backoff_doubles_from_the_base_to_the_maximum() -> None:
    assert [backoff_delay(n, 5, 1800) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert backoff_delay(20, 5, 1800) == 1800
    assert backoff_delay(10_000, 5, 1800) == 1800


def test_retry_delay_has_twenty_percent_jitter() -> None:
    delays = [retry_delay(3, SETTINGS) for _ in range(500)]
    assert all(16 <= delay <= 24 for delay in delays)
    # Jitter really varies the delay (500 identical draws would mean no jitter).
    assert max(delays) - min(delays) > 4


def test_task_retry_delays_are_the_start_of_the_schedule() -> None:
    from prefect_webhooks.delivery.batches.task import task_retry_delays

    assert task_retry_delays(SETTINGS) == [5, 10, 20]
    assert task_retry_delays(with_task_retries(0)) == []
    # Prefect's exponential_backoff, capped at retry_max_delay as the outbox's backoff is.
    assert task_retry_delays(with_task_retries(12))[-3:] == [1800, 1800, 1800]


def test_next_attempt_is_backoff_within_the_deadline() -> None:
    first = NOW - timedelta(minutes=10)
    when = next_attempt_at(NOW, 2, first, settings=SETTINGS)
    assert when is not None
    assert NOW + timedelta(seconds=8) <= when <= NOW + timedelta(seconds=12)


def test_next_attempt_never_after_the_deadline() -> None:
    first = NOW - timedelta(hours=4) + timedelta(seconds=3)
    assert next_attempt_at(NOW, 30, first, settings=SETTINGS) == deadline_of(first, SETTINGS)


def test_no_attempt_at_or_after_the_deadline() -> None:
    first = NOW - timedelta(hours=4)
    assert next_attempt_at(NOW, 5, first, settings=SETTINGS) is None


def test_retry_after_pushes_the_next_attempt() -> None:
    when = next_attempt_at(NOW, 1, NOW, NOW + timedelta(seconds=90), settings=SETTINGS)
    assert when == NOW + timedelta(seconds=90)
    # A Retry-After beyond the deadline cannot be honoured: the message expires.
    assert next_attempt_at(NOW, 1, NOW - timedelta(hours=3, minutes=59), NOW + timedelta(minutes=5),
                           settings=SETTINGS) is None


def test_retry_condition_accepts_only_retryable_delivery_errors() -> None:
    assert is_retryable_delivery_error(None, None, Failed(data=RetryableDeliveryError("x")))
    assert not is_retryable_delivery_error(None, None, Failed(data=RuntimeError("x")))
    assert not is_retryable_delivery_error(None, None, Completed(data=1))
