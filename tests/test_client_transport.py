"""Retry rules of the client's transport (the HTTP behaviour itself is tested in test_client.py)."""

from __future__ import annotations

import base64

import pytest

from prefect_webhooks.client_transport import (
    RetryPolicy,
    basic_auth,
    batch_url,
    is_retryable_status,
    parse_retry_after,
)


def test_parse_retry_after() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2099 07:28:00 GMT") > 50
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (500, True),
        (503, True),
        (408, True),
        (429, True),
        (400, False),
        (401, False),
        (404, False),
        (413, False),
        (301, False),
    ],
)
def test_retryable_statuses(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(backoff_base=0.5, backoff_cap=4.0)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        delays = [policy.delay(retry) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not a fixed schedule


def test_batch_url_and_basic_auth() -> None:
    assert batch_url("http://h:1/") == "http://h:1/v1/batch"
    assert batch_url("http://h:1/v1/batch") == "http://h:1/v1/batch"
    assert base64.b64decode(basic_auth("wk_1").removeprefix("Basic ")) == b"wk_1:"
