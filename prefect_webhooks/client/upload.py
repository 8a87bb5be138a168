"""Uploading one batch to the ingest API: one request, and the retries within the client's bounds.

What is retried, how long to wait and how ``Retry-After`` is read is the project's one retry policy
(``prefect_webhooks.messages.retry``): connection errors and timeouts, 5xx, 408 and 429 are retried; any other
status, a TLS certificate failure or a URL the client cannot use is permanent.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefect_webhooks.client.batching import QueuedMessage, encode_batch
from prefect_webhooks.client.connection import BatchPoster, UnusableUrl
from prefect_webhooks.client.errors import UploadError
from prefect_webhooks.client.logs import logger
from prefect_webhooks.messages.retry import CLIENT_JITTER, backoff_delay, is_retryable_status, retry_after_seconds
from prefect_webhooks.messages.timestamps import format_timestamp, utcnow


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on retrying one batch: attempts, total time, and the backoff between them (``ClientOptions``' values)."""

    max_retries: int
    max_retry_time: float
    backoff_base: float
    backoff_cap: float

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based): doubling from the base, capped, 50–100 % of that."""
        return backoff_delay(retry, self.backoff_base, self.backoff_cap, CLIENT_JITTER)


def upload_batch(
    poster: BatchPoster, batch: Sequence[QueuedMessage], policy: RetryPolicy, abort: threading.Event
) -> None:
    """Post a batch, retrying transient failures within ``policy``.

    Args:
        poster: The sender's connection.
        batch: The messages; ``sentAt`` is set again on every attempt.
        policy: Retry bounds.
        abort: Set when the client is closing out of time: stop waiting and give up.

    Raises:
        UploadError: the last error, when the batch failed for good.
    """
    started = time.monotonic()
    retries = 0
    while True:
        error, retry_after = _attempt(poster, batch)
        if error is None:
            return
        if not error.retryable:
            raise error
        retries += 1
        if retries > policy.max_retries:
            raise UploadError(f"gave up after {retries} attempts: {error}", error.status)
        wait = retry_after if retry_after is not None else policy.delay(retries)
        if time.monotonic() - started + wait > policy.max_retry_time:
            raise UploadError(
                f"gave up after {retries} attempts ({policy.max_retry_time:g}s retry budget): {error}", error.status
            )
        logger.debug("retrying %d messages in %.2fs after: %s", len(batch), wait, error)
        if abort.wait(wait):
            raise UploadError(f"client closed while retrying: {error}", error.status)


def _attempt(poster: BatchPoster, batch: Sequence[QueuedMessage]) -> tuple[UploadError | None, float | None]:
    """Post once; return (None, None) on success, else the error and the server's Retry-After in seconds if any."""
    body = encode_batch(batch, format_timestamp(utcnow()))
    started = time.monotonic()
    try:
        response = poster.post(body)
    except UnusableUrl as exc:
        return UploadError(f"unusable endpoint URL: {exc}"), None
    except (OSError, http.client.HTTPException) as exc:
        if _is_certificate_failure(exc):
            return UploadError("TLS certificate verification failed"), None
        return UploadError(f"connection error: {type(exc).__name__}: {exc}", retryable=True), None
    status = response.status
    logger.debug(
        "POST %s: %d messages, %d bytes -> %d in %.3fs", poster.url, len(batch), len(body), status,
        time.monotonic() - started,
    )
    if 200 <= status < 300:
        return None, None
    detail = response.text[:200].strip()
    reason = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    error = UploadError(reason, status, is_retryable_status(status))
    return error, retry_after_seconds(response.retry_after) if error.retryable else None


def _is_certificate_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
