"""How the Analytics client posts a batch to the ingest API and when it tries again.

Retryable: connection errors and timeouts, 5xx, 408 and 429 (``Retry-After`` honoured). Everything else that is not
2xx is permanent, as is a TLS certificate failure or a URL the client cannot use.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import logging
import random
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

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


@dataclass(frozen=True)
class PostResult:
    """The parts of an answer the client uses."""

    status: int
    retry_after: str | None
    text: str


# Errors of a request on a kept-alive connection that the server had already closed: sent again at once, once.
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class BatchPoster:
    """One keep-alive HTTP connection posting batch bodies; one per sender thread.

    Built on ``http.client``: a batch carries at most ``flush_at`` (20) messages, so a busy client makes thousands of
    requests a second, and httpx's per-request CPU (~0.5 ms measured here, against ~0.1 ms) took the GIL from the
    calling threads. TLS uses httpx's context (the same trust as before: certifi's bundle), built here, in the
    calling thread, not in the sender thread: an ``os.fork()`` landing mid-construction would leave OpenSSL's lock
    held in the child. HTTP proxies from the environment are not used: the client connects to the endpoint.
    """

    def __init__(self, url: str, headers: dict[str, str], timeout: float, use_gzip: bool) -> None:
        self.url = url
        self.use_gzip = use_gzip
        self.timeout = timeout
        self._headers = headers
        parts = urlsplit(url)
        self._scheme = parts.scheme.lower()
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl = httpx.create_ssl_context() if self._scheme == "https" else None
        self._connection: http.client.HTTPConnection | None = None
        self._used = False  # whether the open connection already carried a request

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme not in ("http", "https") or not self._host:
            raise UnusableUrl(f"{self.url!r} is not an http or https URL with a host")
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def post(self, body: bytes) -> PostResult:
        """Send one request body (gzipped when configured); a stale kept-alive connection is replaced once.

        Raises:
            UnusableUrl: the endpoint URL cannot be used.
            OSError, http.client.HTTPException: the request did not get an answer.
        """
        headers = dict(self._headers)
        if self.use_gzip:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        headers["Content-Length"] = str(len(body))
        try:
            return self._exchange(body, headers)
        except _STALE_CONNECTION:
            reused = self._used
            self.close()
            if not reused:
                raise
        except BaseException:
            self.close()
            raise
        try:
            return self._exchange(body, headers)
        except BaseException:
            self.close()
            raise

    def _exchange(self, body: bytes, headers: dict[str, str]) -> PostResult:
        if self._connection is None:
            self._connection = self._connect()
            self._used = False
        self._connection.request("POST", self._path, body=body, headers=headers)
        response = self._connection.getresponse()
        text = response.read(65_536).decode("utf-8", "replace")
        if response.will_close or not response.isclosed():
            # Not kept alive, or an answer longer than read: start afresh next time.
            self.close()
        else:
            self._used = True
        return PostResult(response.status, response.getheader("retry-after"), text)

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._used = False


class UnusableUrl(ValueError):
    """An endpoint URL the client cannot send to (not http/https, no host)."""


def _attempt(poster: BatchPoster, batch: Sequence[QueuedMessage]) -> tuple[DeliveryError | None, float | None]:
    """Post once; return (None, None) on success, else the error and the server's Retry-After if any."""
    body = encode_batch(batch, format_timestamp(utcnow()))
    started = time.monotonic()
    try:
        response = poster.post(body)
    except UnusableUrl as exc:
        return DeliveryError(f"unusable endpoint URL: {exc}"), None
    except (OSError, http.client.HTTPException) as exc:
        if _is_certificate_failure(exc):
            return DeliveryError("TLS certificate verification failed"), None
        return DeliveryError(f"connection error: {type(exc).__name__}: {exc}", retryable=True), None
    status = response.status
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
    return error, parse_retry_after(response.retry_after) if error.retryable else None


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
