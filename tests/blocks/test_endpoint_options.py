"""A destination's endpoints with every option (method, mapping, bearer, OAuth2, client certificate) and batching
saved and loaded through a real Prefect API: every endpoint comes back as saved, secrets masked in API reads."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trustme
from prefect import get_client

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.saved import load_block, revealed

pytestmark = pytest.mark.usefixtures("prefect_harness")


def five_endpoints() -> list[dict[str, Any]]:
    issued = trustme.CA().issue_cert("sender")
    return [
        {"url": "https://a.example.com/1", "headers": {"X-One": "1"}},
        {"url": "https://b.example.com/2", "method": "PUT", "mapping": {"id": {"@path": "$.userId"}},
         "auth": {"type": "bearer", "token": "bearer-s3cret"}},
        {"url": "https://c.example.com/3", "headers": {"X-Three": "3"},
         "auth": {"type": "oauth2_client_credentials", "token_url": "https://idp.example.com/token",
                  "client_id": "c", "client_secret": "client-s3cret", "scope": "a b"}},
        {"url": "https://d.example.com/4", "method": "PATCH",
         "client_certificate": {"certificate": issued.cert_chain_pems[0].bytes().decode(),
                                "private_key": issued.private_key_pem.bytes().decode()}},
        {"url": "https://e.example.com/5", "headers": {"X-Five": "5"}},
    ]


async def test_five_endpoints_with_every_option_come_back_as_saved() -> None:
    # Prefect's own serialiser wrote the third of three endpoints with secrets as a copy of the first.
    name = f"options-{uuid.uuid4().hex[:8]}"
    block = WebhookDestination(endpoints=five_endpoints(), batch_size=100, batch_wait=1.5)
    await block.save(name)
    loaded = await load_block(WebhookDestination, name)
    assert revealed(loaded.endpoints) == revealed(block.endpoints)
    assert [endpoint.url for endpoint in loaded.endpoints] == [f"https://{host}.example.com/{n}"
                                                               for n, host in enumerate("abcde", start=1)]
    assert (loaded.batch_size, loaded.batch_bytes, loaded.batch_wait) == (100, None, 1.5)
    async with get_client() as client:
        document = await client.read_block_document_by_name(name, "webhook-destination", include_secrets=False)
    assert document.data["endpoints"] == "********"
    for secret in ("bearer-s3cret", "client-s3cret", "PRIVATE KEY"):
        assert secret not in str(document.data)


async def test_three_plain_endpoints_with_headers_come_back_in_order() -> None:
    name = f"three-{uuid.uuid4().hex[:8]}"
    endpoints = [{"url": "https://x.example.com", "headers": {"a": "1"}}, {"url": "https://y.example.com"},
                 {"url": "https://z.example.com"}]
    await WebhookDestination(endpoints=endpoints).save(name)
    loaded = await load_block(WebhookDestination, name)
    assert [(endpoint.url, endpoint.header_values()) for endpoint in loaded.endpoints] == [
        ("https://x.example.com", {"a": "1"}), ("https://y.example.com", {}), ("https://z.example.com", {})]
