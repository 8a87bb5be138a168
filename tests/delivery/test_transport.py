"""The request path (``delivery.sending.transport``): libcurl on the event loop, against a real receiver on loopback."""

from __future__ import annotations

import asyncio
import time

import pytest

from prefect_webhooks.delivery.sending.transport import READ_LIMIT, CurlTransport, TransportError
from tests.receivers import Receiver


async def test_an_answer_longer_than_the_limit_is_read_up_to_it_and_its_status_stands() -> None:
    long_text = "x" * (4 * READ_LIMIT)
    with Receiver(script=[{"status": 500, "text": long_text}]) as receiver:
        transport = CurlTransport(timeout=5)
        try:
            answer = await transport.request("POST", receiver.url, b"{}", {})
            after = await transport.request("POST", receiver.url, b"{}", {})
        finally:
            await transport.close()
    assert answer.status == 500
    assert len(answer.body) == READ_LIMIT
    assert set(answer.body) == {ord("x")}
    # The cut transfer's connection is closed; the next request opens another and is answered in full.
    assert (after.status, after.body) == (200, b"ok")


async def test_connections_are_kept_alive_and_shared_by_requests_in_turn() -> None:
    with Receiver() as receiver:
        transport = CurlTransport(timeout=5)
        try:
            for _ in range(20):
                assert (await transport.request("POST", receiver.url, b"{}", {})).status == 200
            await asyncio.gather(*(transport.request("POST", receiver.url, b"{}", {}) for _ in range(8)))
        finally:
            await transport.close()
    peers = [request.peer for request in receiver.requests]
    assert len(set(peers[:20])) == 1
    # Eight at once need eight connections at most, the first one's among them.
    assert len(set(peers)) <= 8


async def test_method_body_and_headers_arrive_as_given() -> None:
    with Receiver() as receiver:
        transport = CurlTransport(timeout=5)
        try:
            await transport.request("PATCH", receiver.url, b'{"a":1}',
                                    {"X-One": "1", "Content-Type": "application/json"})
        finally:
            await transport.close()
    (request,) = receiver.requests
    assert (request.method, request.body) == ("PATCH", b'{"a":1}')
    assert request.headers["X-One"] == "1" and request.headers["Content-Type"] == "application/json"
    # No 100-continue round trip, no compression asked for, no cookies.
    assert "Expect" not in request.headers and "Accept-Encoding" not in request.headers


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    with Receiver() as receiver:
        transport = CurlTransport(timeout=5)
        try:
            with pytest.raises(ValueError, match="line break"):
                await transport.request("POST", receiver.url, b"{}", {"X-Bad": "a\r\nX-Injected: 1"})
        finally:
            await transport.close()
        assert receiver.requests == []


async def test_retry_after_is_read_from_the_answer() -> None:
    with Receiver(script=[{"status": 429, "headers": {"Retry-After": "7"}}]) as receiver:
        transport = CurlTransport(timeout=5)
        try:
            answer = await transport.request("POST", receiver.url, b"{}", {})
        finally:
            await transport.close()
    assert (answer.status, answer.header(b"retry-after"), answer.header(b"x-missing")) == (429, "7", None)


async def test_the_timeout_covers_the_whole_request() -> None:
    with Receiver(default={"status": 200, "delay": 3.0}) as receiver:
        transport = CurlTransport(timeout=0.5)
        started = time.monotonic()
        try:
            with pytest.raises(TransportError) as caught:
                await transport.request("POST", receiver.url, b"{}", {})
            waited = time.monotonic() - started
        finally:
            await transport.close()
    assert caught.value.timed_out
    assert 0.4 <= waited < 2.5


async def test_a_cancelled_request_leaves_the_transport_working() -> None:
    with Receiver(script=[{"status": 200, "delay": 3.0}]) as receiver:
        transport = CurlTransport(timeout=5)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(transport.request("POST", receiver.url, b"{}", {}), 0.2)
            answer = await transport.request("POST", receiver.url, b"{}", {})
        finally:
            await transport.close()
    assert answer.status == 200


async def test_a_refused_connection_is_a_transport_error_naming_it() -> None:
    with Receiver() as receiver:
        port = receiver.port
    transport = CurlTransport(timeout=5)
    try:
        with pytest.raises(TransportError) as caught:
            await transport.request("POST", f"http://127.0.0.1:{port}/hook", b"{}", {})
    finally:
        await transport.close()
    assert not caught.value.timed_out and "connect" in caught.value.detail.lower()
