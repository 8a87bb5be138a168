"""Per-endpoint request counters: added with the outcomes, read without the attempt log, scraped from a served
``/metrics`` after real deliveries to real receivers."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from sqlalchemy import delete, func, select

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.messages.outcomes import DELIVERED, PERMANENT, RETRY, EndpointRequest
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.figures.endpoint_counters import (
    ENDPOINT_COUNTERS,
    add_requests,
    endpoint_totals,
    status_class,
)
from prefect_webhooks.store.log.partitions import kept_partitions
from prefect_webhooks.store.queue.outbox import ATTEMPTS, enqueue
from tests.receivers import Receiver

SECRET = "sh4red-s3cret-0001"


def test_status_classes() -> None:
    assert [status_class(code) for code in (200, 204, 301, 404, 429, 503, None)] == [
        "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "none"]


def test_totals_add_up_across_transactions(backend_url: str) -> None:
    engine = get_engine()
    first = [EndpointRequest("crm", "https://a.example/h", DELIVERED, 200, 40.0),
             EndpointRequest("crm", "https://a.example/h", RETRY, 503, 300.0),
             EndpointRequest("crm", "https://b.example/h", RETRY, None, 5000.0)]
    second = [EndpointRequest("crm", "https://a.example/h", DELIVERED, 201, 50.0),
              EndpointRequest("ads", "https://a.example/h", PERMANENT, 410, 12000.0)]
    for requests in (first, second):
        with engine.begin() as connection:
            add_requests(connection, requests)

    with engine.connect() as connection:
        totals = {(endpoint.destination, endpoint.url): endpoint for endpoint in endpoint_totals(connection)}
    assert sorted(totals) == [("ads", "https://a.example/h"), ("crm", "https://a.example/h"),
                              ("crm", "https://b.example/h")]
    crm_a = totals["crm", "https://a.example/h"]
    assert crm_a.requests == {(DELIVERED, "2xx"): 2, (RETRY, "5xx"): 1}
    assert dict(crm_a.cumulative_buckets())["0.05"] == 2
    assert dict(crm_a.cumulative_buckets())["0.25"] == 2
    assert dict(crm_a.cumulative_buckets())["0.5"] == 3
    assert crm_a.latency_sum_seconds == pytest.approx(0.39)
    # A latency equal to a bound falls in that bucket; one past the last bound only in +Inf.
    assert dict(totals["crm", "https://b.example/h"].cumulative_buckets())["5"] == 1
    assert dict(totals["ads", "https://a.example/h"].cumulative_buckets()) == {
        **{bound: 0 for bound in ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10")}, "+Inf": 1}


def _samples(text: str, name: str) -> dict[str, float]:
    """``{label text: value}`` of every sample of metric ``name``."""
    return {labels: float(value) for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE)}


def test_served_metrics_count_real_requests_per_endpoint(prefect_harness: None, store_url: str) -> None:
    from prefect.settings import PREFECT_API_URL

    from tests.servers import ingest_api_process

    with Receiver() as good, Receiver(default=500) as bad, Receiver() as batched:
        # The second URL carries credentials and a token in its query: neither may reach a label.
        bad_url = bad.url.replace("http://", "http://user:pa55word@") + "?token=s3cret-token"
        blocks = {
            "shop": WebhookDestination(endpoints=[{"url": good.url}, {"url": bad_url}], shared_secret=SECRET),
            "bulk": WebhookDestination(endpoints=[{"url": batched.url}], shared_secret=SECRET, batch_size=10),
        }
        enqueue("shop", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(3)])
        enqueue("bulk", [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(4)])

        async def deliver() -> None:
            async with Sender() as sender:
                context = DeliveryContext(get_engine(), sender)
                for name, block in blocks.items():
                    context.destinations.remember(name, block)
                await deliver_due(DeliveryOptions(), context=context)

        asyncio.run(deliver())
        good.wait_for(3)
        batched.wait_for(1)
        # The figures come from the counters, not the attempt log: it may be pruned away.
        with get_engine().begin() as connection:
            assert connection.execute(select(func.count()).select_from(ENDPOINT_COUNTERS)).scalar_one() > 0
            connection.execute(delete(ATTEMPTS))
            for partition in kept_partitions(connection):
                connection.execute(delete(partition.table))

        with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value()) as server:
            text = httpx.get(f"{server.url}/metrics").text

    assert "pa55word" not in text and "s3cret-token" not in text
    requests = _samples(text, "prefect_webhooks_endpoint_requests_total")
    shop_good = f'destination="shop",endpoint="{good.url}"'
    shop_bad = f'destination="shop",endpoint="{bad.url}"'
    bulk = f'destination="bulk",endpoint="{batched.url}"'
    assert requests == {
        f'{shop_good},outcome="delivered",status_class="2xx"': 3,
        f'{shop_bad},outcome="retry",status_class="5xx"': 3,
        # Four messages in one batch request: one request.
        f'{bulk},outcome="delivered",status_class="2xx"': 1,
    }
    counts = _samples(text, "prefect_webhooks_endpoint_latency_seconds_count")
    assert counts == {shop_good: 3, shop_bad: 3, bulk: 1}
    buckets = _samples(text, "prefect_webhooks_endpoint_latency_seconds_bucket")
    assert buckets[f'{shop_good},le="+Inf"'] == 3
    assert 0 < _samples(text, "prefect_webhooks_endpoint_latency_seconds_sum")[shop_good] < 15
    assert "# TYPE prefect_webhooks_endpoint_latency_seconds histogram" in text
