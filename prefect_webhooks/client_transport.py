"""How the Analytics client posts a batch to the ingest API and when it tries again.

Retryable: connection errors and timeouts, 5xx, 408 and 429 (``Retry-After`` honoured). Everything else that is not
2xx is permanent, as is a TLS certificate failure or a URL the client cannot use.
"""

from __future__ import annotations

import base64
import gzip
import logging
import random
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpcore  # noqa: F401  (httpx imports it lazily in the sender thread; a fork mid-import breaks the child)
import httpx

from prefect_webhooks.batching import QueuedMessage, encode_batch
from prefect_webhooks.timestamps import format_timestamp, utcnow

logger = logging.getLogger("prefect_webhooks.client")

BATCH_PATH = "/v1/batch"


class DeliveryError(Exception):
    """A batch (or a message) that did not reach the ingest API; ``status`` is the HTTP status when there was one."""

    def __init__(self, reason: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(reason)
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on retrying one batch: attempts, total time, and the jittered exponential backoff between them."""

    max_retries: int = 10
    max_retry_time: float = 120.0
    backoff_base: float = 0.5
    backoff_cap: float = 30.0

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based): exponential, capped, with jitter in [50 %, 100 %]."""
        ceiling = min(self.backoff_cap, self.backoff_base * 2 ** (retry - 1))
        return random.uniform(ceiling / 2, ceiling)


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status means "try again later" (5xx, 408, 429)."""
    return status >= 500 or status in (408, 429)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max((parsedate_to_datetime(value) - utcnow()).total_seconds(), 0.0)
    except (TypeError, ValueError):
        return None


def batch_url(endpoint: str) -> str:
    """The batch URL for an ingest API base URL (a URL already ending in ``/v1/batch`` is kept)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(BATCH_PATH) else endpoint + BATCH_PATH


def basic_auth(write_key: str) -> str:
    """The ``Authorization`` value: HTTP Basic with the write key as user and an empty password."""
    return "Basic " + base64.b64encode(f"{write_key}:".encode()).decode("ascii")


def _is_certificate_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class BatchPoster:
    """One keep-alive HTTP connection pool posting batch bodies; one per sender thread."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float, use_gzip: bool) -> None:
        self.url = url
        self.use_gzip = use_gzip
        self._client = httpx.Client(
            headers=headers,
            timeout=timeout,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    def post(self, body: bytes) -> httpx.Response:
        """Send one request body (gzipped when configured)."""
        if self.use_gzip:
            return self._client.post(
                self.url, content=gzip.compress(body, compresslevel=6), headers={"Content-Encoding": "gzip"}
            )
        return self._client.post(self.url, content=body)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def _attempt(poster: BatchPoster, batch: Sequence[QueuedMessage]) -> tuple[DeliveryError | None, float | None]:
    """Post once; return (None, None) on success, else the error and the server's Retry-After if any."""
    body = encode_batch(batch, format_timestamp(utcnow()))
    started = time.monotonic()
    try:
        response = poster.post(body)
    except httpx.UnsupportedProtocol as exc:
        return DeliveryError(f"unusable endpoint URL: {exc}"), None
    except httpx.TransportError as exc:
        if _is_certificate_failure(exc):
            return DeliveryError("TLS certificate verification failed"), None
        return DeliveryError(f"connection error: {type(exc).__name__}: {exc}", retryable=True), None
    status = response.status_code
    logger.debug(
        "POST %s: %d messages, %d bytes -> %d in %.3fs",
        poster.url,
        len(batch),
        len(body),
        status,
        time.monotonic() - started,
    )
    if 200 <= status < 300:
        return None, None
    detail = response.text[:200].strip()
    reason = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    error = DeliveryError(reason, status, is_retryable_status(status))
    return error, parse_retry_after(response.headers.get("retry-after")) if error.retryable else None


def deliver(poster: BatchPoster, batch: Sequence[QueuedMessage], policy: RetryPolicy, abort: threading.Event) -> int:
    """Post a batch, retrying transient failures within ``policy``; return the number of attempts made.

    Args:
        poster: The sender's connection pool.
        batch: The messages; ``sentAt`` is set again on every attempt.
        policy: Retry bounds.
        abort: Set when the client is closing out of time: stop waiting and give up.

    Raises:
        DeliveryError: the last error, when the batch failed for good.
    """
    started = time.monotonic()
    retries = 0
    while True:
        error, retry_after = _attempt(poster, batch)
        if error is None:
            return retries + 1
        if not error.retryable:
            raise error
        retries += 1
        if retries > policy.max_retries:
            raise DeliveryError(f"gave up after {retries} attempts: {error}", error.status)
        wait = retry_after if retry_after is not None else policy.delay(retries)
        if time.monotonic() - started + wait > policy.max_retry_time:
            raise DeliveryError(
                f"gave up after {retries} attempts ({policy.max_retry_time:g}s retry budget): {error}", error.status
            )
        logger.debug("retrying %d messages in %.2fs after: %s", len(batch), wait, error)
        if abort.wait(wait):
            raise DeliveryError(f"client closed while retrying: {error}", error.status)
