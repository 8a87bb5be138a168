"""Uploading one batch: the client's retry bounds and what fails at once (the retry rules themselves are
tests/messages/test_retry.py; retries against a misbehaving server are in test_analytics.py)."""

from __future__ import annotations

import ssl
import threading

import pytest

from prefect_webhooks.client.batching import QueuedMessage
from prefect_webhooks.client.connection import BatchPoster
from prefect_webhooks.client.errors import UploadError
from prefect_webhooks.client.upload import RetryPolicy, upload_batch

THREE_RETRIES = RetryPolicy(max_retries=3, max_retry_time=60, backoff_base=0.05, backoff_cap=0.2)


def test_backoff_doubles_from_the_base_to_the_cap_with_jitter_of_half_to_all() -> None:
    policy = RetryPolicy(max_retries=10, max_retry_time=120, backoff_base=0.5, backoff_cap=4.0)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0), (5_000, 4.0)]:
        delays = [policy.delay(retry) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not a fixed schedule


def test_an_untrusted_certificate_fails_at_once_without_sending() -> None:
    import trustme

    from tests.receivers import Receiver

    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    with Receiver(ssl_context=server_context) as receiver:
        poster = BatchPoster(f"https://127.0.0.1:{receiver.port}/v1/batch", {}, 5.0, False)
        with pytest.raises(UploadError, match="TLS certificate verification failed") as caught:
            upload_batch(poster, [QueuedMessage(1, b"{}")], THREE_RETRIES, threading.Event())
        poster.close()
    assert caught.value.retryable is False and receiver.requests == []


def test_a_url_without_http_is_refused_for_good() -> None:
    poster = BatchPoster("ftp://127.0.0.1/v1/batch", {}, 5.0, False)
    with pytest.raises(UploadError, match="unusable endpoint URL") as caught:
        upload_batch(poster, [QueuedMessage(1, b"{}")], THREE_RETRIES, threading.Event())
    assert caught.value.retryable is False
