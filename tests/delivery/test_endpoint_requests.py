"""What a request carries: the seed's exact contract when no option is set, and another method with a mapped body
(a receiver behind a PUT mapping, checking the signature over the bytes it got)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.messages.payloads import serialize
from prefect_webhooks.store.queue.outbox import enqueue
from tests.delivery.test_delivery import deliver, outbox, track
from tests.receivers import Receiver

pytestmark = pytest.mark.usefixtures("prefect_harness")

SECRET = "sh4red-s3cret-0001"


async def test_with_no_option_set_the_request_is_the_seeds_exactly(store_url: str) -> None:
    payload = track(7)
    enqueue("d", [payload])
    with Receiver() as receiver:
        block = WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"X-Tenant": "42"}}],
                                   shared_secret=SECRET)
        await deliver({"d": block})
        (request,) = receiver.wait_for(1)
    (row,) = outbox()
    assert request.method == "POST" and request.path == "/hook"
    assert request.body == serialize(payload)
    assert request.headers.pop("Idempotency-Key").endswith(f"_{row.id}")
    assert request.headers == {
        "Host": f"127.0.0.1:{receiver.port}", "User-Agent": "prefect-webhooks/1.0",
        "Content-Type": "application/json", "X-Tenant": "42",
        "X-Signature": hmac.new(SECRET.encode(), request.body, hashlib.sha1).hexdigest(),
        "Accept": "*/*", "Content-Length": str(len(request.body)),
    }


class CrmReceiver:
    """A receiver behind a PUT mapping: it checks X-Signature over the raw bytes, then reads the mapped fields."""

    def __init__(self) -> None:
        self.contacts: dict[str, dict[str, object]] = {}

    def accept(self, body: bytes, headers: dict[str, str]) -> bool:
        expected = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, headers.get("X-Signature", "")):
            return False
        contact = json.loads(body)
        self.contacts[contact["external_id"]] = contact
        return True


MAPPING = {"external_id": {"@path": "$.userId"}, "last_event": {"@path": "$.event"},
           "attributes": {"order": {"@path": "$.properties.n"}, "plan": {"@path": "$.traits.plan", "@default": "free"}},
           "source": "prefect-webhooks"}


async def test_a_put_mapping_builds_the_body_the_receiver_asked_for(store_url: str) -> None:
    enqueue("crm", [track(1), track(2)])
    crm = CrmReceiver()
    with Receiver(verifier=crm.accept) as receiver:
        block = WebhookDestination(endpoints=[{"url": receiver.url, "method": "PUT", "mapping": MAPPING}],
                                   shared_secret=SECRET)
        await deliver({"crm": block})
        requests = receiver.wait_for(2)
    assert {request.method for request in requests} == {"PUT"} and receiver.rejected == []
    assert crm.contacts["u1"] == {"external_id": "u1", "last_event": "E", "attributes": {"order": 1, "plan": "free"},
                                  "source": "prefect-webhooks"}
    assert set(crm.contacts) == {"u1", "u2"}
    assert {row.state for row in outbox()} == {DELIVERED}


async def test_a_mapping_applies_to_each_item_of_a_batch(store_url: str) -> None:
    enqueue("crm", [track(1), track(2)])
    with Receiver() as receiver:
        block = WebhookDestination(endpoints=[{"url": receiver.url, "method": "PATCH", "mapping": MAPPING}],
                                   shared_secret=SECRET, batch_size=10)
        await deliver({"crm": block})
        (request,) = receiver.wait_for(1)
    assert request.method == "PATCH"
    assert [item["message"]["external_id"] for item in json.loads(request.body)] == ["u1", "u2"]
    assert request.headers["X-Signature"] == hmac.new(SECRET.encode(), request.body, hashlib.sha1).hexdigest()


def test_a_bad_mapping_is_refused_when_the_block_is_built_naming_the_path() -> None:
    with pytest.raises(ValueError, match=r"mapping\.attributes\.order: '\$\.propertie\.n': unknown field 'propertie'"):
        WebhookDestination(endpoints=[{"url": "https://crm.example.com", "mapping": {
            "attributes": {"order": {"@path": "$.propertie.n"}}}}])
    with pytest.raises(ValueError, match="method"):
        WebhookDestination(endpoints=[{"url": "https://crm.example.com", "method": "DELETE"}])
