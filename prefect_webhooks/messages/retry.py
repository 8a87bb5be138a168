"""The retry policy: which responses are retried, how long to wait, and when a message stops being attempted.

Both senders use it: the delivery engine (outbox → webhook URLs) and the Analytics client (client → ingest API).

| Outcome of one request | Result |
|---|---|
| 2xx | delivered |
| timeout, connection error or reset, 5xx, 408, 429 | retried later, not before ``Retry-After`` (see below) |
| any other status (other 4xx, 1xx, 3xx) | permanent: not retried |
| TLS certificate not trusted (self-signed…) | permanent: no request is sent |

Delivery reads ``Retry-After`` on 429 and 503, the client on any retryable status; both cap it at a day.

Backoff is exponential: a base delay doubling per retry up to a cap, times a random factor (the jitter), drawn from a
range each sender chooses:

| sender | base → cap | jitter (factor of the capped delay) |
|---|---|---|
| delivery | ``retry_base_delay`` (5 s) → ``retry_max_delay`` (30 min) | ±20 %: ``DELIVERY_JITTER`` |
| Analytics client | ``backoff_base`` (0.5 s) → ``backoff_cap`` (30 s) | 50–100 %: ``CLIENT_JITTER`` |

A delivered message is never attempted later than ``max_retry_age`` after its first attempt (the deadline is kept in
the row, so it survives restarts); a client batch stops after ``max_retries`` retries or ``max_retry_time`` seconds.
"""

from __future__ import annotations

import random
import re
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT, RETRY
from prefect_webhooks.settings import WebhooksSettings, get_settings

RETRYABLE_STATUSES = frozenset({408, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})
# Marks the reason of a message whose next attempt a receiver's Retry-After set ("HTTP 429; Retry-After <time> UTC").
RETRY_AFTER_REASON = "Retry-After"
# Prefect's ``retry_jitter_factor`` for the delivery task, and the spread of the delivery backoff.
JITTER = 0.2
# The jitter ranges of the two senders, as (lowest, highest) factors of the capped delay.
DELIVERY_JITTER = (1 - JITTER, 1 + JITTER)
# Never sooner than half the delay: many clients failing together spread out without hammering the API early.
CLIENT_JITTER = (0.5, 1.0)
# A Retry-After further away than this is treated as this (a receiver must not park a message for days).
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0
# Delta-seconds (RFC 9110 allows digits only; a fraction is accepted too). ASCII digits: "²".isdigit() is true.
_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


class RetryableDeliveryError(Exception):
    """Raised by a delivery batch when some of its messages should be tried again in-process."""


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status means "try again later": 5xx, 408 or 429."""
    return status >= 500 or status in RETRYABLE_STATUSES


def classify_status(status: int) -> str:
    """The outcome of one HTTP response: ``delivered``, ``retry`` or ``permanent``."""
    if 200 <= status < 300:
        return DELIVERED
    return RETRY if is_retryable_status(status) else PERMANENT


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP-date), at most a day.

    Args:
        value: The header value, or None.
        now: The current time an HTTP-date is measured from (naive means UTC); the clock's by default.

    Returns:
        Seconds, 0 for a date in the past; None when the header is absent or unreadable.
    """
    if not value:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        now = now or datetime.now(timezone.utc)
        seconds = (_as_utc(when) - _as_utc(now)).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """The time a ``Retry-After`` header asks us to wait for, naive UTC (the store's convention).

    Args:
        value: The header value, or None.
        now: The current time, naive UTC.

    Returns:
        The earliest time of the next attempt, or None when the header is absent or unreadable.
    """
    seconds = retry_after_seconds(value, now)
    return None if seconds is None else now + timedelta(seconds=seconds)


def backoff_delay(retry: int, base: float, cap: float, jitter: tuple[float, float] | None = None) -> float:
    """Seconds before retry number ``retry`` (1-based): ``base`` doubled per earlier retry, at most ``cap``.

    Args:
        retry: 1 for the first retry (the wait after the first failed attempt).
        base: The first delay in seconds.
        cap: The largest delay in seconds, before jitter.
        jitter: ``(low, high)``: the delay is multiplied by a random factor between them; None for no jitter.

    Returns:
        The delay in seconds.
    """
    # Cap the exponent so a long-lived row or a large max_retries cannot overflow the float.
    delay = min(base * 2 ** min(max(retry - 1, 0), 60), cap)
    return delay if jitter is None else delay * random.uniform(*jitter)


def retry_delay(attempt_number: int, settings: WebhooksSettings | None = None) -> float:
    """Seconds to wait after the ``attempt_number``-th failed delivery attempt (1-based), with ±20 % jitter.

    Args:
        attempt_number: How many attempts the message has had, including the one that just failed.
        settings: Settings to read ``retry_base_delay``/``retry_max_delay`` from; the process's by default.

    Returns:
        The delay in seconds.
    """
    settings = settings or get_settings()
    delivery = settings.delivery
    return backoff_delay(attempt_number, delivery.retry_base_delay, delivery.retry_max_delay, DELIVERY_JITTER)


def deadline_of(first_attempt_at: datetime, settings: WebhooksSettings | None = None) -> datetime:
    """The last moment a message whose first attempt was at ``first_attempt_at`` may be attempted."""
    settings = settings or get_settings()
    return first_attempt_at + timedelta(seconds=settings.delivery.max_retry_age)


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
