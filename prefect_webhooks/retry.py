"""The retry policy: which responses are retried, how long to wait, and when a message stops being attempted.

| Outcome of one request | Result |
|---|---|
| 2xx | delivered |
| timeout, connection error or reset, 5xx, 408, 429 | retried later (429/503 honour ``Retry-After``) |
| any other status (other 4xx, 1xx, 3xx) | permanent: not retried |
| TLS certificate not trusted (self-signed…) | permanent: no request is sent |

A message is retried with exponential backoff and ±20 % jitter; it is never attempted later than ``max_retry_age``
after its first attempt (the deadline is kept in the row, so it survives restarts).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from prefect_webhooks.settings import WebhooksSettings, get_settings

DELIVERED = "delivered"
RETRY = "retry"
PERMANENT = "permanent"

RETRYABLE_STATUSES = frozenset({408, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})
# Marks the reason of a message whose next attempt a receiver's Retry-After set ("HTTP 429; Retry-After <time> UTC").
RETRY_AFTER_REASON = "Retry-After"
JITTER = 0.2
# A Retry-After further away than this is treated as this (a receiver must not park a message for days).
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0


class RetryableDeliveryError(Exception):
    """Raised by a delivery batch when some of its messages should be tried again in-process."""


def classify_status(status: int) -> str:
    """The outcome of one HTTP response: ``delivered``, ``retry`` or ``permanent``."""
    if 200 <= status < 300:
        return DELIVERED
    if status >= 500 or status in RETRYABLE_STATUSES:
        return RETRY
    return PERMANENT


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """The time a ``Retry-After`` header asks us to wait for (delta-seconds or an HTTP-date), naive UTC.

    Args:
        value: The header value, or None.
        now: The current time, naive UTC (the store's convention).

    Returns:
        The earliest time of the next attempt, or None when the header is absent or unreadable.
    """
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when.astimezone(timezone.utc).replace(tzinfo=None) - now).total_seconds()
    seconds = min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)
    return now + timedelta(seconds=seconds)


def base_delay(attempt_number: int, settings: WebhooksSettings | None = None) -> float:
    """The backoff before attempt ``attempt_number + 1``, without jitter: base doubling up to the maximum."""
    settings = settings or get_settings()
    exponent = max(attempt_number - 1, 0)
    # Cap the exponent so a long-lived row cannot overflow the float.
    return min(settings.retry_base_delay * 2 ** min(exponent, 60), settings.retry_max_delay)


def retry_delay(attempt_number: int, settings: WebhooksSettings | None = None) -> float:
    """Seconds to wait after the ``attempt_number``-th failed attempt (1-based), with ±20 % jitter.

    Args:
        attempt_number: How many attempts the message has had, including the one that just failed.
        settings: Settings to read ``retry_base_delay``/``retry_max_delay`` from; the process's by default.

    Returns:
        The delay in seconds.
    """
    return base_delay(attempt_number, settings) * random.uniform(1 - JITTER, 1 + JITTER)


def task_retry_delays(settings: WebhooksSettings | None = None) -> list[float]:
    """The Prefect task ``retry_delay_seconds``: the first delays of the same backoff schedule."""
    settings = settings or get_settings()
    return [base_delay(number, settings) for number in range(1, settings.task_retries + 1)]


def deadline_of(first_attempt_at: datetime, settings: WebhooksSettings | None = None) -> datetime:
    """The last moment a message whose first attempt was at ``first_attempt_at`` may be attempted."""
    settings = settings or get_settings()
    return first_attempt_at + timedelta(seconds=settings.max_retry_age)


def next_attempt_at(
    now: datetime,
    attempts: int,
    first_attempt_at: datetime,
    retry_after: datetime | None = None,
    settings: WebhooksSettings | None = None,
) -> datetime | None:
    """When a message that just failed with a retryable outcome is tried next, or None when it has expired.

    Args:
        now: The time of the failed attempt (naive UTC).
        attempts: Attempts made so far, including this one.
        first_attempt_at: The message's first attempt (naive UTC).
        retry_after: The receiver's ``Retry-After`` time, if any: the next attempt is not before it.
        settings: Settings to read; the process's by default.

    Returns:
        The next attempt time, never after the deadline; None when no attempt is allowed any more.
    """
    settings = settings or get_settings()
    deadline = deadline_of(first_attempt_at, settings)
    if now >= deadline:
        return None
    candidate = now + timedelta(seconds=retry_delay(attempts, settings))
    if retry_after is not None:
        if retry_after > deadline:
            # Honouring Retry-After would mean attempting after the deadline.
            return None
        candidate = max(candidate, retry_after)
    return min(candidate, deadline)


def is_retryable_delivery_error(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a delivery task only when it raised ``RetryableDeliveryError``.

    It is a plain function on purpose: Prefect silently ignores a condition that is a partial or callable object.
    """
    return isinstance(getattr(state, "data", None), RetryableDeliveryError)
