"""The headers the engine adds per message — idempotency key, X-Signature, Standard Webhooks — as real receivers get
them: delivered through the outbox and the delivery engine, from blocks saved on the test Prefect server, and
verified by receivers built with the published ``standardwebhooks`` and ``svix`` libraries."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import standardwebhooks.webhooks
from standardwebhooks.webhooks import Webhook as StandardWebhook
from standardwebhooks.webhooks import WebhookVerificationError
from svix.webhooks import Webhook as SvixWebhook

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import deliver_due
from prefect_webhooks.messages.model import parse_message
from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.messages.payloads import delete_payload, outbound_payload
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing.headers import MessageSigner, message_key_prefix
from prefect_webhooks.store.engine.engines import dispose_engines, get_engine, store_key
from prefect_webhooks.store.queue.outbox import enqueue, replay_failed
from tests.docs_pages import page, section
from tests.receivers import ReceivedRequest, Receiver
from tests.stored import every_message

pytestmark = pytest.mark.usefixtures("prefect_harness")

WHEN = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)
SECRET = WebhookDestination.generate_secret().get_secret_value()
# What the transport (libcurl) adds to every request besides the headers the engine and the block set.
TRANSPORT_HEADERS = {"Host", "Accept", "Content-Length"}


@pytest.fixture
def fast(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Short backoff; every batch reads the block again, as a delivery process does once its cache entry ages out."""
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.05")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "0.1")
    monkeypatch.setenv("PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS", "0")
    get_settings.cache_clear()
    return store_url


def block_name() -> str:
    return f"hdr-{uuid.uuid4().hex[:8]}"


def track(n: int, event: str = "Order Completed") -> dict[str, Any]:
    return outbound_payload(parse_message({"type": "track", "userId": f"u{n}", "event": event,
                                           "properties": {"n": n, "city": "Zürich"}}), WHEN)


def every_type() -> list[dict[str, Any]]:
    raws = [
        {"type": "identify", "userId": "u1", "traits": {"email": "zoë@example.com"}},
        {"type": "track", "userId": "u2", "event": "Café Ordered", "properties": {"total": 4.5}},
        {"type": "page", "userId": "u3", "name": "Home", "properties": {"path": "/"}},
        {"type": "screen", "userId": "u4", "name": "Settings", "context": {"os": {"name": "iOS"}}},
        {"type": "group", "userId": "u5", "groupId": "g1", "traits": {"name": "Acme"}},
        {"type": "alias", "previousId": "anon-6", "userId": "u6"},
        {"type": "track", "anonymousId": "anon-7", "event": "Viewed"},
    ]
    return [outbound_payload(parse_message(raw), WHEN) for raw in raws] + [delete_payload("u8", WHEN)]


def outbox_ids() -> list[int]:
    return [message.id for message in every_message()]


def expected_key(outbox_id: int) -> str:
    return f"{message_key_prefix(store_key(get_engine()))}{outbox_id}"


def libraries_accept(*secrets: str) -> Callable[[bytes, dict[str, str]], bool]:
    """A receiver's check: both libraries verify the request with one of ``secrets`` (strict, as published)."""

    def check(body: bytes, headers: dict[str, str]) -> bool:
        for library in (StandardWebhook, SvixWebhook):
            verified = False
            for secret in secrets:
                try:
                    library(secret).verify(body, headers)
                    verified = True
                except WebhookVerificationError:
                    pass
            if not verified:
                return False
        return True

    return check


async def test_with_nothing_enabled_only_the_idempotency_key_is_added(fast: str) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"X-Tenant": "42"}}]).save(name)
        enqueue(name, [track(1)])
        await deliver_due()
    (request,) = receiver.requests
    (outbox_id,) = outbox_ids()
    assert set(request.headers) == TRANSPORT_HEADERS | {"User-Agent", "Content-Type", "X-Tenant", "Idempotency-Key"}
    assert (request.headers["User-Agent"], request.headers["Content-Type"]) == ("prefect-webhooks/1.0",
                                                                                "application/json")
    assert request.headers["Idempotency-Key"] == expected_key(outbox_id)
    assert request.body == orjson.dumps(track(1))


async def test_with_a_shared_secret_x_signature_is_unchanged(fast: str) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret="plain-s3cret-0001").save(name)
        enqueue(name, [track(1)])
        await deliver_due()
    (request,) = receiver.requests
    assert set(request.headers) == TRANSPORT_HEADERS | {"User-Agent", "Content-Type", "X-Signature",
                                                        "Idempotency-Key"}
    assert request.headers["X-Signature"] == hmac.new(b"plain-s3cret-0001", request.body, hashlib.sha1).hexdigest()


@pytest.mark.parametrize("secret", ["k", "s3cr3t!x", "migrated-00014"], ids=lambda secret: f"{len(secret)} characters")
async def test_a_short_secret_moved_from_segment_signs_exactly_as_openssl_does(fast: str, secret: str) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret=secret).save(name)
        enqueue(name, [track(1)])
        await deliver_due()
    (request,) = receiver.requests
    openssl = subprocess.run(["openssl", "dgst", "-sha1", "-hmac", secret], input=request.body, capture_output=True,
                             check=True, timeout=30)
    assert request.headers["X-Signature"] == openssl.stdout.decode().split()[-1]


async def test_the_message_id_is_stable_across_retries_urls_and_replays(fast: str) -> None:
    name = block_name()
    with Receiver(script=[500, 500], default=404) as first, Receiver(script=[503, 503], default=410) as second:
        await WebhookDestination(endpoints=[{"url": first.url}, {"url": second.url}]).save(name)
        enqueue(name, [track(1), track(2)])
        await deliver_due()
        await asyncio.sleep(0.3)
        failed = await deliver_due()  # the retry: 404 and 410, failed for good
        assert failed.failed == 2 and len(first.requests) == len(second.requests) == 4
        # Replayed after the receiver is fixed: the same message, the same id.
        first.default = 200
        assert replay_failed(name) == 2
        stats = await deliver_due()
    assert stats.delivered == 2
    ids = outbox_ids()
    for outbox_id, user in zip(ids, ["u1", "u2"], strict=True):
        copies = [request for request in first.requests + second.requests
                  if orjson.loads(request.body)["userId"] == user]
        assert len(copies) == 6
        assert {request.headers["Idempotency-Key"] for request in copies} == {expected_key(outbox_id)}
    assert expected_key(ids[0]) != expected_key(ids[1])


def test_message_ids_of_two_stores_never_collide_and_a_store_keeps_its_key(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = f"sqlite:///{tmp_path / 'one.db'}", f"sqlite:///{tmp_path / 'two.db'}"
    key = store_key(get_engine(first))
    assert key != store_key(get_engine(second))
    assert len(key) == 12 and int(key, 16) >= 0
    dispose_engines()
    # Read back from the store by a new process-level engine, not remembered in memory.
    assert store_key(get_engine(first)) == key
    dispose_engines()


async def test_standard_webhooks_receivers_verify_every_delivery(fast: str) -> None:
    name = block_name()
    with Receiver(verifier=libraries_accept(SECRET)) as first, Receiver(verifier=libraries_accept(SECRET)) as second:
        await WebhookDestination(endpoints=[{"url": first.url}, {"url": second.url}], shared_secret=SECRET,
                                 standard_webhooks=True).save(name)
        payloads = every_type() + [track(n) for n in range(40)]
        enqueue(name, payloads)
        stats = await deliver_due()
    assert stats.delivered == len(payloads)
    assert first.rejected == [] and second.rejected == []
    requests = first.requests + second.requests
    assert len(requests) == 2 * len(payloads)
    keys = {expected_key(outbox_id) for outbox_id in outbox_ids()}
    for request in requests:
        headers = request.headers
        assert set(headers) == TRANSPORT_HEADERS | {"User-Agent", "Content-Type", "X-Signature", "webhook-id",
                                                    "webhook-timestamp", "webhook-signature"}
        assert headers["webhook-id"] in keys
        assert abs(int(headers["webhook-timestamp"]) - request.at) < 5
        # Both signatures at once: X-Signature is the seed's, keyed by the same secret string.
        assert headers["X-Signature"] == hmac.new(SECRET.encode(), request.body, hashlib.sha1).hexdigest()
    # One id per message, the same at both URLs.
    assert {request.headers["webhook-id"] for request in first.requests} == keys
    assert {request.headers["webhook-id"] for request in second.requests} == keys


def tampered(request: ReceivedRequest) -> bytes:
    return request.body.replace(b'"u1"', b'"u9"')


async def test_the_libraries_reject_a_tampered_body_and_a_replay_outside_their_window(
    fast: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret=SECRET,
                                 standard_webhooks=True, x_signature=False).save(name)
        enqueue(name, [track(1)])
        await deliver_due()
    (request,) = receiver.requests
    assert "X-Signature" not in request.headers
    check = libraries_accept(SECRET)
    assert check(request.body, request.headers)
    assert tampered(request) != request.body and not check(tampered(request), request.headers)
    forged = {**request.headers, "webhook-timestamp": str(int(request.headers["webhook-timestamp"]) + 1)}
    assert not check(request.body, forged)
    assert not libraries_accept(WebhookDestination.generate_secret().get_secret_value())(request.body, request.headers)

    # The same request presented again six minutes later (the libraries tolerate five): refused as a replay.
    class SixMinutesLater(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> SixMinutesLater:  # type: ignore[override]
            return super().now(tz) + dt.timedelta(minutes=6)

    monkeypatch.setattr(standardwebhooks.webhooks, "datetime", SixMinutesLater)
    for library in (StandardWebhook, SvixWebhook):
        with pytest.raises(WebhookVerificationError, match="too old"):
            library(SECRET).verify(request.body, request.headers)


async def test_webhook_timestamp_is_each_attempts_time(fast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "1.6")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "1.6")
    get_settings.cache_clear()
    name = block_name()
    with Receiver(script=[500], verifier=libraries_accept(SECRET)) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret=SECRET,
                                 standard_webhooks=True).save(name)
        enqueue(name, [track(1)])
        await deliver_due()
        await asyncio.sleep(2.0)
        stats = await deliver_due()
    assert stats.delivered == 1 and receiver.rejected == []
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) >= int(first.headers["webhook-timestamp"]) + 1
    assert first.headers["webhook-signature"] != second.headers["webhook-signature"]
    assert [message.state for message in every_message()] == [DELIVERED]


def readme_example(heading: str) -> str:
    """The first ```python block under a heading of the receivers guide, as written."""
    return section(page("guides/receivers.md"), heading).split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_readme_receiver_processes_each_message_once_despite_a_duplicate(
    fast: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first request is processed by the receiver but answered too late: the engine times out and sends it again.
    monkeypatch.setenv("PREFECT_WEBHOOKS_REQUEST_TIMEOUT", "0.5")
    get_settings.cache_clear()
    name = block_name()
    orders = [outbound_payload(parse_message({"type": "track", "userId": f"u{n}", "event": "Order Completed",
                                              "properties": {"total": float(n)}}), WHEN) for n in (1, 2)]
    with Receiver(script=[{"status": 200, "delay": 1.0}]) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, orders)
        for _ in range(20):
            await deliver_due()
            if len(receiver.requests) == 3:
                break
            await asyncio.sleep(0.1)
    assert [message.state for message in every_message()] == [DELIVERED, DELIVERED]
    assert len(receiver.requests) == 3
    namespace: dict[str, Any] = {}
    exec(compile(readme_example("Dropping duplicates: the message id"), "receivers.md", "exec"), namespace)
    namespace["receiver_db"].execute("DELETE FROM orders")  # the example's own sample order
    assert [namespace["handle_once"](request.body, request.headers) for request in receiver.requests] == [200] * 3
    rows = namespace["receiver_db"].execute("SELECT user_id, total FROM orders ORDER BY user_id").fetchall()
    assert rows == [("u1", 1.0), ("u2", 2.0)]


def test_turning_standard_webhooks_on_during_a_rotation_from_a_plain_secret() -> None:
    # The old secret predates Standard Webhooks: it keeps X-Signature going through the window, and only the new
    # whsec_ secret can sign webhook-signature.
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
    block = WebhookDestination(endpoints=[{"url": "https://hooks.example.com/in"}], shared_secret=SECRET,
                               standard_webhooks=True, previous_secret="plain-old-secret",
                               previous_secret_expires_at=until)
    body = orjson.dumps(track(1))
    headers = MessageSigner.for_block(block).headers(body, "msg_0123456789ab_7")
    assert headers["X-Signature"] == hmac.new(b"plain-old-secret", body, hashlib.sha1).hexdigest()
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert libraries_accept(SECRET)(body, headers)
    ended = block.model_copy(update={"previous_secret_expires_at": dt.datetime.now(dt.timezone.utc)})
    after = MessageSigner.for_block(ended).headers(body, "msg_0123456789ab_7")
    assert after["X-Signature"] == hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
