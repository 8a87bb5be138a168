"""SIGKILL during a load: of the ingest API (every batch answered 200 is in the store) and of a delivery worker
(everything is delivered after restart; duplicates only among the rows the killed worker held)."""

from __future__ import annotations

import base64
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from prefect.settings import PREFECT_API_URL
from sqlalchemy import func, select

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.messages.outcomes import PENDING
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from tests.faults import accounting, received_ids, start_worker, worker_result
from tests.receivers import Receiver
from tests.servers import free_port, ingest_api_process, save_source
from tests.signing.test_headers import libraries_accept
from tests.stored import every_message

pytestmark = pytest.mark.slow

SERVER_ENV = {"PREFECT_WEBHOOKS_UNKNOWN_KEY_REFRESH_SECONDS": "0"}


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


def batch_body(batch_id: str, size: int) -> dict[str, Any]:
    return {"batch": [{"type": "track", "userId": f"u{n}", "event": "E", "messageId": f"{batch_id}-{n}"}
                      for n in range(size)]}


def stored_message_ids(url: str) -> Counter[str]:
    return Counter(message.message_id for message in every_message(url))


def test_sigkill_of_the_ingest_api_loses_no_accepted_batch(prefect_harness: None, store_url: str) -> None:
    key, size = f"wk_{uuid.uuid4().hex}", 50
    save_source(f"kill-{uuid.uuid4().hex[:8]}", key, ["crm"])
    port = free_port()
    answered: dict[str, int | None] = {}
    lock, stop = threading.Lock(), threading.Event()

    def sender(worker: int, url: str) -> None:
        with httpx.Client(timeout=10) as client:
            for number in range(10_000):
                if stop.is_set():
                    return
                batch_id = f"w{worker}b{number}"
                try:
                    status: int | None = client.post(f"{url}/v1/batch", json=batch_body(batch_id, size),
                                                     headers=basic(key)).status_code
                except httpx.HTTPError:
                    status = None
                with lock:
                    answered[batch_id] = status
                if status is None:
                    return

    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), port=port, env=SERVER_ENV) as api:
        threads = [threading.Thread(target=sender, args=(worker, api.url)) for worker in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        api.kill()
        stop.set()
        for thread in threads:
            thread.join(30)
    accepted = [batch for batch, status in answered.items() if status == 200]
    unanswered = [batch for batch, status in answered.items() if status != 200]
    stored = stored_message_ids(store_url)
    lost = [batch for batch in accepted if any(stored[f"{batch}-{n}"] != 1 for n in range(size))]
    print(f"\ningest SIGKILL: batches answered 200: {len(accepted)}, unanswered (connection died): {len(unanswered)}, "
          f"accepted but missing from the store: {len(lost)}")
    assert accepted and unanswered
    assert lost == []
    assert set(answered.values()) <= {200, None}

    # A client retries what was not answered (as the SDKs do); messageId dedupe keeps that from duplicating.
    with (ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), port=port, env=SERVER_ENV) as api,
          httpx.Client(timeout=10) as client):
        for batch in unanswered:
            assert client.post(f"{api.url}/v1/batch", json=batch_body(batch, size),
                               headers=basic(key)).status_code == 200
    stored = stored_message_ids(store_url)
    sent = len(answered) * size
    duplicates = sum(count - 1 for count in stored.values())
    print(f"after the client's retries: sent={sent} stored unique={len(stored)} duplicates={duplicates}")
    assert len(stored) == sent and duplicates == 0


def pending(url: str) -> int:
    with get_engine(url).connect() as connection:
        return connection.execute(select(func.count()).where(OUTBOX.c.state == PENDING)).scalar_one()


def test_sigkill_of_a_delivery_worker_during_a_load(backend_url: str) -> None:
    total, lease = 3000, 3.0
    env = {"PREFECT_WEBHOOKS_LEASE_SECONDS": str(lease), "PREFECT_WEBHOOKS_CLAIM_BATCH_SIZE": "100"}
    for start in range(0, total, 500):
        enqueue("d", [{"type": "track", "userId": "u", "event": "E", "properties": {"messageId": f"m{n}"}}
                      for n in range(start, start + 500)])
    with Receiver(default={"status": 200, "delay": 0.02}) as receiver:
        destinations = {"d": [receiver.url]}
        victim = start_worker(backend_url, destinations, env=env)
        survivor = start_worker(backend_url, destinations, env=env)
        receiver.wait_for(600, timeout=60)
        victims_rows = select(OUTBOX.c.id, OUTBOX.c.body).where(
            OUTBOX.c.state == PENDING, OUTBOX.c.lease_owner.like(f"%:{victim.pid}:%"))
        # Killed while it holds a claim (between two batches it holds none, and the kill would test nothing).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with get_engine().connect() as connection:
                if connection.execute(victims_rows.limit(1)).first() is not None:
                    break
            time.sleep(0.005)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        with get_engine().connect() as connection:
            held = {row.id: orjson.loads(row.body)["properties"]["messageId"]
                    for row in connection.execute(victims_rows)}
        held_ids = set(held.values())
        worker_result(survivor)
        restarts = 0
        deadline = time.monotonic() + 45
        # The killed worker's rows come back once their lease expires; a restarted worker delivers them.
        while pending(backend_url) and time.monotonic() < deadline:
            worker_result(start_worker(backend_url, destinations, env=env))
            restarts += 1
            time.sleep(0.3)
        received = received_ids(receiver.requests)
    report = accounting(total, received)
    duplicated = {message for message, count in received.items() if count > 1}
    print(f"\n{report.report('delivery worker SIGKILLed')}; rows the killed worker held: {len(held)}, "
          f"restarted workers: {restarts}, duplicated messages outside them: {len(duplicated - held_ids)}")
    assert report.delivered == total and report.failed == report.pending == 0
    assert report.received_unique == total
    assert held, "the kill must land while the worker holds leases"
    assert duplicated <= held_ids
    assert report.duplicates <= len(held)


@pytest.mark.parametrize("standard_webhooks", [False, True], ids=["idempotency-key", "webhook-id"])
def test_duplicates_after_a_sigkill_are_dropped_by_their_key(
    prefect_harness: None, store_url: str, standard_webhooks: bool
) -> None:
    """The kill leaves requests the receiver got but the worker never recorded; they are sent again after the lease
    expires, with the same message id, so a receiver keeping the ids it processed drops every duplicate."""
    total, name = 2000, f"dedupe-{uuid.uuid4().hex[:8]}"
    secret = WebhookDestination.generate_secret().get_secret_value()
    env = {"PREFECT_WEBHOOKS_LEASE_SECONDS": "3", "PREFECT_WEBHOOKS_CLAIM_BATCH_SIZE": "100",
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    # A slow receiver keeps many requests in flight when the worker dies.
    verifier = libraries_accept(secret) if standard_webhooks else None
    with Receiver(default={"status": 200, "delay": 0.1}, verifier=verifier) as receiver:
        WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret=secret,
                           standard_webhooks=standard_webhooks).save(name)
        enqueue(name, [{"type": "track", "userId": "u", "event": "E", "properties": {"messageId": f"m{n}"}}
                       for n in range(total)])
        victim = start_worker(store_url, {name: []}, env=env)
        receiver.wait_for(300, timeout=60)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        deadline = time.monotonic() + 60
        while pending(store_url) and time.monotonic() < deadline:
            worker_result(start_worker(store_url, {name: []}, env=env))
            time.sleep(0.3)
        requests = list(receiver.requests)
    assert pending(store_url) == 0 and receiver.rejected == []
    header = "webhook-id" if standard_webhooks else "Idempotency-Key"
    processed: dict[str, bytes] = {}
    dropped = 0
    for request in requests:
        key = request.headers[header]
        if key in processed:
            dropped += 1
            # The duplicate is the same message: same body (a new webhook-timestamp and signature at most).
            assert request.body == processed[key]
        else:
            processed[key] = request.body
    by_body = received_ids(requests)
    duplicates = sum(count - 1 for count in by_body.values())
    print(f"\n[{header}] {total} messages, {len(requests)} requests after a SIGKILL, {duplicates} duplicates, "
          f"{dropped} dropped by key, {len(processed)} processed")
    assert duplicates > 0, "the kill must leave in-flight requests to send again"
    assert dropped == duplicates
    assert len(processed) == total
    assert sorted(orjson.loads(body)["properties"]["messageId"] for body in processed.values()) == sorted(
        f"m{n}" for n in range(total))
