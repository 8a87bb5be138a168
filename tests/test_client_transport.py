"""The client's transport: retry rules, and the connection itself (the rest of the HTTP behaviour is in
test_client.py)."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from prefect_webhooks.batching import QueuedMessage
from prefect_webhooks.client_transport import (
    BatchPoster,
    DeliveryError,
    RetryPolicy,
    basic_auth,
    batch_url,
    deliver,
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


# -- the HTTP connection ------------------------------------------------------------------------------------------


def _one_request_per_connection_server(answered: list[int]) -> tuple[socket.socket, threading.Thread]:
    """A server that answers each connection's first request as keep-alive, then closes the connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += connection.recv(65536)
                answered.append(length)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_a_retry() -> None:
    answered: list[int] = []
    listener, _ = _one_request_per_connection_server(answered)
    poster = BatchPoster(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/batch", {}, 5.0, False)
    batch = [QueuedMessage(1, b'{"type":"track"}')]
    try:
        for _ in range(3):
            time.sleep(0.05)  # the server has closed the previous connection by now
            assert deliver(poster, batch, RetryPolicy(max_retries=0), threading.Event()) == 1
    finally:
        poster.close()
        listener.close()
    assert len(answered) == 3


def test_an_untrusted_certificate_fails_at_once_without_sending(tmp_path: Path) -> None:
    import trustme

    from tests.receivers import Receiver

    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    with Receiver(ssl_context=server_context) as receiver:
        poster = BatchPoster(f"https://127.0.0.1:{receiver.port}/v1/batch", {}, 5.0, False)
        with pytest.raises(DeliveryError, match="TLS certificate verification failed") as caught:
            deliver(poster, [QueuedMessage(1, b"{}")], RetryPolicy(max_retries=3), threading.Event())
        poster.close()
    assert caught.value.retryable is False and receiver.requests == []


def test_a_url_without_http_is_refused_for_good() -> None:
    poster = BatchPoster("ftp://127.0.0.1/v1/batch", {}, 5.0, False)
    with pytest.raises(DeliveryError, match="unusable endpoint URL") as caught:
        deliver(poster, [QueuedMessage(1, b"{}")], RetryPolicy(max_retries=3), threading.Event())
    assert caught.value.retryable is False
