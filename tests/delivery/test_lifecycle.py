"""Endpoint lifecycle against a real Prefect server: an endpoint failing for longer than ``disable_after`` is
disabled (block, no requests, ``disabled:`` failures), enabled again with the CLI; every operational event is read
back from the server's event API and each ready-made automation in deployments/automations fires on it."""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import update

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.delivery.endpoints.admin import endpoint_views
from prefect_webhooks.delivery.endpoints.events import (
    DELIVERY_EXHAUSTED,
    ENDPOINT_DISABLED,
    ENDPOINT_FAILING,
    ENDPOINT_RECOVERED,
)
from prefect_webhooks.messages.outcomes import DELIVERED, DISABLED_REASON, FAILED
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import OUTBOX, enqueue
from prefect_webhooks.store.schema.tables import store_now
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message

ROOT = Path(__file__).resolve().parents[2]
AUTOMATIONS = ROOT / "deployments" / "automations"
FILES = {ENDPOINT_FAILING: "endpoint-failing.yaml", ENDPOINT_DISABLED: "endpoint-disabled.yaml",
         ENDPOINT_RECOVERED: "endpoint-recovered.yaml", DELIVERY_EXHAUSTED: "delivery-exhausted.yaml"}

pytestmark = pytest.mark.usefixtures("prefect_harness")


def read_events(prefix: str, since: datetime) -> list[dict[str, Any]]:
    """The events of resources whose id starts with ``prefix`` since ``since``, from the Prefect server's API."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        answer = client.request("POST", "/events/filter", json={"limit": 50, "filter": {
            "occurred": {"since": since.isoformat()}, "resource": {"id_prefix": [prefix]},
            "event": {"prefix": ["prefect-webhooks."]}}})
    return answer.json()["events"]


def wait_for_events(prefix: str, since: datetime, names: set[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        events = read_events(prefix, since)
        if names <= {event["event"] for event in events} or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def create_automations(block_id: str, resource_prefixes: dict[str, str]) -> list[str]:
    """Each automation file as shipped, with the notification block filled in and its match narrowed to this
    test's resources (the session's server also sees other tests' events); returns the automations' ids."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    ids = []
    with get_client(sync_client=True) as client:
        for event, file in FILES.items():
            document = yaml.safe_load((AUTOMATIONS / file).read_text())
            assert document["trigger"]["expect"] == [event]
            shipped = document["trigger"]["match"]["prefect.resource.id"]
            assert fnmatch.fnmatch(resource_prefixes[event] + "x", shipped)
            document["trigger"]["match"]["prefect.resource.id"] = resource_prefixes[event] + "*"
            document["actions"][0]["block_document_id"] = block_id
            document["name"] = f"{document['name']} {uuid.uuid4().hex[:6]}"
            ids.append(str(client.create_automation(AutomationCore.model_validate(document))))
    return ids


@pytest.fixture
def fast_failures(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {"BLOCK_CACHE_SECONDS": "0", "RETRY_BASE_DELAY": "0.2", "RETRY_MAX_DELAY": "0.4",
                        "CIRCUIT_COOLDOWN_SECONDS": "0.3", "ENDPOINT_FAILING_THRESHOLD": "3"}.items():
        monkeypatch.setenv(f"PREFECT_WEBHOOKS_{name}", value)
    get_settings.cache_clear()
    return store_url


async def deliver(seconds: float) -> None:
    async with Sender() as sender:
        await deliver_due(DeliveryOptions(run_for_seconds=seconds, idle_sleep=0.1),
                          context=DeliveryContext(get_engine(), sender))


def attempts_to(url: str) -> list[Any]:
    return every_attempt(url=url)


def rows(destination: str) -> list[Any]:
    return every_message(destination=destination)


@pytest.mark.timeout(240)
async def test_disable_events_automations_and_enable_again(fast_failures: str, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prefect_webhooks.delivery")
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    name, doomed = f"lc-{uuid.uuid4().hex[:8]}", f"lc-exp-{uuid.uuid4().hex[:8]}"
    started = datetime.now(timezone.utc) - timedelta(seconds=5)
    with Receiver(default=503) as endpoint, Receiver(default=503) as other, Receiver() as notifications:
        block_id = await CustomWebhookNotificationBlock(
            name="ops", url=notifications.url, json_data={"subject": "{{subject}}", "body": "{{body}}"}
        ).save(f"ops-{name}", overwrite=True)
        endpoint_prefix = f"prefect-webhooks.endpoint.{name}."
        automations = create_automations(str(block_id), {
            ENDPOINT_FAILING: endpoint_prefix, ENDPOINT_DISABLED: endpoint_prefix, ENDPOINT_RECOVERED: endpoint_prefix,
            DELIVERY_EXHAUSTED: "prefect-webhooks.outbox."})
        try:
            await WebhookDestination(endpoints=[{"url": endpoint.url}], disable_after=timedelta(seconds=2)).save(name)
            await WebhookDestination(endpoints=[{"url": other.url}]).save(doomed)
            enqueue(name, [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(5)])
            # A message whose retries ran out long ago: it expires at its next claim.
            enqueue(doomed, [{"type": "track", "userId": "x", "event": "E"}])
            with get_engine().begin() as connection:
                connection.execute(update(OUTBOX).where(OUTBOX.c.destination == doomed).values(
                    attempts=3, first_attempt_at=store_now() - timedelta(hours=5), reason="HTTP 503"))
            await deliver(5.0)
            # On a loaded machine a slow Prefect API is taken for an outage (delivery then goes on with the cached
            # block, without the disabled endpoint) and the messages fail a few seconds later: give it a minute.
            deadline = time.monotonic() + 60
            while {row.state for row in rows(name)} != {FAILED} and time.monotonic() < deadline:
                await deliver(2.0)
            block = await WebhookDestination.load(name)
            (entry,) = block.disabled_endpoints
            assert entry.position == 1 and "HTTP 503" in entry.reason
            # ``endpoint list`` still says since when it was failing once the store's failure run ended.
            assert entry.failing_since is not None
            (view, *_) = await endpoint_views(name)
            assert view.state.startswith("disabled") and view.failing_since == entry.failing_since
            assert (entry.disabled_at - entry.failing_since).total_seconds() >= 0
            # Once the endpoint was disabled, a message is sent to it at most once more: the batch that was already
            # claimed (waiting for a request slot) when the disable was saved may still send; no later claim does.
            # Checked from the attempt records, whose time is taken as a request is sent (the clock of
            # ``disabled_at``), not from arrival times, which a loaded machine delays.
            disabled_at = entry.disabled_at.astimezone(timezone.utc).replace(tzinfo=None)
            sent = [attempt for attempt in attempts_to(endpoint.url) if attempt.status_code is not None]
            assert sent and len(endpoint.requests) >= len(sent)
            sent_after = Counter(attempt.outbox_id for attempt in sent if attempt.attempted_at > disabled_at)
            assert all(count == 1 for count in sent_after.values()), sent_after
            assert {row.state for row in rows(name)} == {FAILED}
            assert all(row.reason.startswith(DISABLED_REASON) for row in rows(name))
            (expired,) = rows(doomed)
            assert expired.state == FAILED and expired.reason.startswith("expired")

            events = wait_for_events(endpoint_prefix, started, {ENDPOINT_FAILING, ENDPOINT_DISABLED})
            # One of each; or two when the block could not be saved disabled at once (a stalled Prefect API, as
            # Prefect 3.4.9's test server has while its automation loads the notification block): delivery then
            # meets the endpoint failing again and disables it again.
            assert {event["event"] for event in events} == {ENDPOINT_DISABLED, ENDPOINT_FAILING}
            disabled = next(event for event in events if event["event"] == ENDPOINT_DISABLED)
            assert disabled["payload"]["position"] == 1 and disabled["payload"]["url"] == endpoint.url
            exhausted = wait_for_events(f"prefect-webhooks.outbox.{expired.id}", started, {DELIVERY_EXHAUSTED})
            assert DELIVERY_EXHAUSTED in {event["event"] for event in exhausted}

            # Fixed receiver; enabled again from the command line, with the messages failed meanwhile put back.
            endpoint.default = 200
            enabled = subprocess.run(
                [sys.executable, "-m", "prefect_webhooks.cli", "endpoint", "enable", name, "--replay"],
                env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(),
                     "PREFECT_WEBHOOKS_DATABASE_URL": fast_failures},
                capture_output=True, text=True, timeout=120)
            assert enabled.returncode == 0, enabled.stdout + enabled.stderr
            assert "enabled endpoint(s) [1]" in enabled.stdout and "5 message(s) pending again" in enabled.stdout
            assert (await WebhookDestination.load(name)).disabled_endpoints == []
            await deliver(2.0)
            assert {row.state for row in rows(name)} == {DELIVERED}
            events = wait_for_events(endpoint_prefix, started, {ENDPOINT_RECOVERED})
            assert ENDPOINT_RECOVERED in {event["event"] for event in events}
            # What serve's console says of it: the endpoint named with its last error, then its return.
            said = [record.getMessage() for record in caplog.records if record.name == "prefect_webhooks.delivery"]
            assert any(re.fullmatch(rf"endpoint 1 \({re.escape(endpoint.url)}\) of destination {name} is failing: "
                                    r"\d+ attempt\(s\) in a row failed since [\d-]+ [\d:]+ UTC, the last with HTTP 503",
                                    line) for line in said), said
            assert any(line.startswith(f"endpoint 1 ({endpoint.url}) of destination {name} answers again (it was "
                                       "failing since") for line in said), said

            # Each shipped automation fired on its event: one notification per endpoint event (two `failing` ones
            # when the endpoint failed twice, see above) and one for the exhausted message.
            expected = len(read_events(endpoint_prefix, started)) + 1
            deadline = time.monotonic() + 60
            while len(notifications.requests) < expected and time.monotonic() < deadline:
                time.sleep(0.5)
            subjects = sorted(request.body.decode() for request in notifications.requests)
            assert len(subjects) == expected, subjects
            for word in ("is failing", "disabled", "recovered", "retries exhausted"):
                assert any(word in subject for subject in subjects), (word, subjects)
        finally:
            async with get_client() as client:
                for automation in automations:
                    await client.delete_automation(automation)


async def test_a_long_lived_process_delivers_what_enable_replay_puts_back(store_url: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A running ``serve`` keeps its copy of a block for a minute: the enable must not be answered from the copy
    taken before it (79 replayed messages failed again at once as ``disabled``)."""
    from prefect_webhooks.delivery.endpoints.admin import aenable
    from prefect_webhooks.delivery.sending.destinations import DestinationCache

    monkeypatch.setenv("PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS", "60")
    get_settings.cache_clear()
    name = f"lc-replay-{uuid.uuid4().hex[:8]}"
    with Receiver() as endpoint:
        await WebhookDestination(endpoints=[{"url": endpoint.url}], disabled_endpoints=[
            {"position": 1, "disabled_at": datetime.now(timezone.utc), "reason": "by hand"}]).save(name)
        async with Sender() as sender:
            context = DeliveryContext(get_engine(), sender, destinations=DestinationCache())
            enqueue(name, [{"type": "track", "userId": f"u{n}", "event": "E"} for n in range(20)])
            await deliver_due(DeliveryOptions(until_empty=True, idle_sleep=0.05), context=context)
            assert {row.state for row in rows(name)} == {FAILED}
            time.sleep(1.1)  # the copy is older than a second, younger than its minute
            enabled, replayed = await aenable(name, None, True)
            assert (enabled, replayed) == ([1], 20)
            await deliver_due(DeliveryOptions(until_empty=True, idle_sleep=0.05), context=context)
    assert {row.state for row in rows(name)} == {DELIVERED}
    assert len({request.body for request in endpoint.requests}) == 20
