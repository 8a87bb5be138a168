"""The ``deliver`` flow on a real Prefect test server, with real receivers and saved blocks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prefect import get_client
from prefect.client.schemas.actions import BlockDocumentUpdate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import TaskRunSort
from prefect.events.clients import AssertingEventsClient
from prefect.events.worker import EventsWorker
from prefect.testing.fixtures import asserting_events_worker  # noqa: F401  (a pytest fixture)

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED, PENDING
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue
from tests.receivers import Receiver
from tests.stored import every_attempt, every_message

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def settings_env(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Fast retries, no block cache: everything in a flow run happens within a second or two."""
    for name, value in {"RETRY_BASE_DELAY": "0.2", "RETRY_MAX_DELAY": "0.4", "TASK_RETRIES": "2",
                        "REQUEST_TIMEOUT": "1", "BLOCK_CACHE_SECONDS": "0"}.items():
        monkeypatch.setenv(f"PREFECT_WEBHOOKS_{name}", value)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def block_name() -> str:
    return f"dest-{uuid.uuid4().hex[:10]}"


def track(n: int = 1) -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": f"u{n}", "timestamp": "2026-01-01T00:00:00.000Z",
            "event": "E", "properties": {"n": n}}


def outbox() -> list[Any]:
    return every_message()


async def task_runs_of(flow_run_id: uuid.UUID, expected: int) -> list[Any]:
    """Task runs are recorded through events; wait until the server has them."""
    async with get_client() as client:
        for _ in range(100):
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), limit=100,
                sort=TaskRunSort.EXPECTED_START_TIME_ASC)
            if len(runs) >= expected and all(run.state and run.state.is_final() for run in runs):
                return runs
            await asyncio.sleep(0.1)
    return runs


async def artifacts_of(flow_run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The flow run's artifacts, read over the API (``read_artifacts`` of this client version sends nulls)."""
    async with get_client() as client:
        response = await client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 100, "offset": 0,
                  "sort": "CREATED_DESC"})
    return response.json()


async def test_deliver_flow_delivers_and_publishes_one_artifact_per_endpoint(settings_env: Any) -> None:
    name = block_name()
    with Receiver() as first, Receiver() as second:
        await WebhookDestination(endpoints=[{"url": first.url, "headers": {"X-Key": "v4lue-secret"}},
                                            {"url": second.url}], shared_secret="s3cret-s3cret-01").save(name)
        enqueue(name, [track(n) for n in range(25)])
        state = await deliver(batch_size=10, return_state=True)
        summary = await state.result()
    assert summary == {"delivered": 25, "failed": 0, "rescheduled": 0, "filtered": 0, "batches": 3}
    assert len(first.requests) == 25 and len(second.requests) == 25
    assert all(request.headers["X-Key"] == "v4lue-secret" for request in first.requests)
    assert all(row.state == DELIVERED for row in outbox())
    flow_run_id = state.state_details.flow_run_id
    artifacts = await artifacts_of(flow_run_id)
    tables = [orjson.loads(artifact["data"]) for artifact in artifacts if artifact["type"] == "table"]
    rows = sorted((table[0] for table in tables), key=lambda row: row["endpoint"])
    assert [row["endpoint"] for row in rows] == sorted([first.url, second.url])
    assert len({artifact["key"] for artifact in artifacts}) == 2
    assert all(artifact["key"].startswith(f"delivery-{name}-") for artifact in artifacts)
    for row in rows:
        assert (row["destination"], row["delivered"], row["retried"], row["failed"]) == (name, 25, 0, 0)
        assert 0 < row["p50_ms"] <= row["p95_ms"]
    assert not any("v4lue-secret" in artifact["data"] for artifact in artifacts)
    # One task run for the three batches claimed within one window (task_run_seconds), not one per batch.
    (run,) = await task_runs_of(flow_run_id, 1)
    assert run.name.startswith("deliver-batches")
    await asyncio.sleep(0.5)
    assert len(await task_runs_of(flow_run_id, 1)) == 1


async def test_prefect_task_retries_redeliver_within_the_run(settings_env: Any) -> None:
    name = block_name()
    with Receiver(script=[500, 503]) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track()])
        state = await deliver(return_state=True)
        summary = await state.result()
        assert len(receiver.requests) == 3
    assert summary["delivered"] == 1
    (row,) = outbox()
    assert row.state == DELIVERED and row.attempts == 3
    runs = await task_runs_of(state.state_details.flow_run_id, 1)
    assert [(run.name.rsplit("-", 1)[0], run.run_count, run.state.type.value) for run in runs] == [
        ("deliver-batches", 3, "COMPLETED")]
    # The wait between tries follows the backoff (0.2 s then 0.4 s); Prefect's jitter (factor 0.2) draws from
    # about 0.36x to 1.2x of each.
    gaps = [b.at - a.at for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)]
    assert gaps[0] >= 0.07 and gaps[1] >= 0.14


async def test_rows_waiting_for_a_task_retry_stay_leased(settings_env: Any) -> None:
    settings_env.setenv("PREFECT_WEBHOOKS_TASK_RETRIES", "1")
    settings_env.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "1.5")
    get_settings.cache_clear()
    name = block_name()
    with Receiver(script=[500]) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track()])
        running = asyncio.create_task(deliver())
        await asyncio.to_thread(receiver.wait_for, 1, 20)
        await asyncio.sleep(0.3)
        # Due by its own next_attempt_at, but held by the waiting task: another run cannot take it.
        assert await asyncio.to_thread(claim_due_deliveries, get_engine(), 10, "another-run") == []
        (row,) = outbox()
        assert row.state == PENDING and row.lease_owner is not None
        summary = await running
        assert len(receiver.requests) == 2
    assert summary["delivered"] == 1


async def test_after_the_final_task_try_the_outbox_keeps_the_message(settings_env: Any) -> None:
    settings_env.setenv("PREFECT_WEBHOOKS_TASK_RETRIES", "1")
    settings_env.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.1")
    settings_env.setenv("PREFECT_WEBHOOKS_RETRY_MAX_DELAY", "5")
    get_settings.cache_clear()
    name = block_name()
    with Receiver(default=500) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track()])
        summary = await deliver()
        assert len(receiver.requests) == 2
    assert summary["rescheduled"] == 1
    (row,) = outbox()
    assert (row.state, row.attempts, row.lease_owner) == (PENDING, 2, None)
    assert row.next_attempt_at > row.first_attempt_at


async def test_a_long_retry_after_is_left_to_the_outbox(settings_env: Any) -> None:
    name = block_name()
    with Receiver(script=[{"status": 503, "headers": {"Retry-After": "30"}}]) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track()])
        await deliver()
        assert len(receiver.requests) == 1
    (row,) = outbox()
    assert row.state == PENDING and row.lease_owner is None
    assert (row.next_attempt_at - row.first_attempt_at).total_seconds() >= 29.9


async def test_an_edited_block_is_used_by_later_batches(settings_env: Any) -> None:
    name = block_name()
    with Receiver() as old, Receiver() as new:
        await WebhookDestination(endpoints=[{"url": old.url}], shared_secret="secret-number-one").save(name)
        enqueue(name, [track(1)])
        await deliver()
        await WebhookDestination(endpoints=[{"url": new.url}],
                                 shared_secret="secret-number-two").save(name, overwrite=True)
        enqueue(name, [track(2)])
        await deliver()
    (first,) = old.requests
    (second,) = new.requests
    assert first.headers["X-Signature"] == hmac.new(b"secret-number-one", first.body, hashlib.sha1).hexdigest()
    assert second.headers["X-Signature"] == hmac.new(b"secret-number-two", second.body, hashlib.sha1).hexdigest()
    assert orjson.loads(second.body)["userId"] == "u2"


async def test_failed_for_good_emits_an_event_and_a_missing_block_fails(
    settings_env: Any, asserting_events_worker: EventsWorker  # noqa: F811
) -> None:
    name = block_name()
    with Receiver(default=410) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"Authorization": "t0ps3cret"}}],
                                 shared_secret="k3y-k3y-k3y-k3y-1").save(name)
        enqueue(name, [track(1)])
        enqueue("no-such-block", [track(2)])
        summary = await deliver()
    assert summary["failed"] == 2
    gone, missing = outbox()
    assert (gone.state, gone.reason) == (FAILED, "permanent: HTTP 410")
    assert (missing.state, missing.reason) == (FAILED, "permanent: destination block 'no-such-block' not found")
    await asyncio.to_thread(asserting_events_worker.drain)
    events = [event for event in AssertingEventsClient.last.events
              if event.event == "prefect-webhooks.delivery.failed"]
    by_resource = {event.resource.id: event for event in events}
    assert set(by_resource) == {f"prefect-webhooks.outbox.{gone.id}", f"prefect-webhooks.outbox.{missing.id}"}
    payload = by_resource[f"prefect-webhooks.outbox.{gone.id}"].payload
    assert payload == {"outbox_id": gone.id, "destination": name, "reason": "permanent: HTTP 410", "attempts": 1}
    dumped = str([event.model_dump() for event in events])
    assert "t0ps3cret" not in dumped and "k3y-k3y-k3y-k3y-1" not in dumped and '"event":"E"' not in dumped


async def test_events_and_artifacts_link_to_the_console_while_it_is_on(
    settings_env: Any, asserting_events_worker: EventsWorker  # noqa: F811
) -> None:
    settings_env.setenv("PREFECT_WEBHOOKS_ADMIN_TOKEN", "console-link-t0ken")
    settings_env.setenv("PREFECT_WEBHOOKS_CONSOLE_URL", "https://webhooks.example.com/console/")
    get_settings.cache_clear()
    name = block_name()
    with Receiver(default=410) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [track(1)])
        state = await deliver(return_state=True)
        assert (await state.result())["failed"] == 1
    (gone,) = outbox()
    await asyncio.to_thread(asserting_events_worker.drain)
    (event,) = [event for event in AssertingEventsClient.last.events
                if event.event == "prefect-webhooks.delivery.failed" and event.payload["destination"] == name]
    assert event.payload["console_url"] == f"https://webhooks.example.com/console/messages/{gone.id}"
    (artifact,) = await artifacts_of(state.state_details.flow_run_id)
    assert f"(https://webhooks.example.com/console/destinations/{name})" in artifact["description"]
    assert "console-link-t0ken" not in str(event.model_dump()) + str(artifact)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_retry_is_sent_when_due_not_when_the_task_window_closes(settings_env: Any, ordered: bool) -> None:
    settings_env.setenv("PREFECT_WEBHOOKS_RETRY_BASE_DELAY", "0.5")
    settings_env.setenv("PREFECT_WEBHOOKS_TASK_RUN_SECONDS", "30")
    get_settings.cache_clear()
    name = block_name()
    with Receiver(script=[503]) as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], ordered=ordered).save(name)
        enqueue(name, [{**track(n), "userId": "same-user"} for n in (1, 2)])
        # The run (5 s) ends before its task window would close (30 s): a retry held for the task's next try
        # would wait for the run's end.
        summary = await deliver(destination=name, run_for_seconds=5, idle_sleep=0.05)
    assert summary["delivered"] == 2
    sent = [orjson.loads(request.body)["properties"]["n"] for request in receiver.requests]
    assert sorted(sent) == [1, 1, 2]
    if ordered:
        assert sent == [1, 1, 2]  # the user's next message only after the retry
    refused = receiver.requests[0]
    retry = receiver.requests[1 + sent[1:].index(sent[0])]
    # Due 0.5 s after the 503 (plus jitter): sent then by the claim loop.
    assert retry.at - refused.at < 3.0, retry.at - refused.at


async def test_continuous_mode_keeps_delivering(settings_env: Any) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        # Long enough for a loaded machine (the run's start alone took over 2 s in a CI run); it ends after the
        # three batches, one per message sent while it runs.
        running = asyncio.create_task(deliver(destination=name, run_for_seconds=60, max_batches=3, idle_sleep=0.05))
        for n in range(3):
            await asyncio.sleep(0.5)
            await asyncio.to_thread(enqueue, name, [track(n)])
            await asyncio.to_thread(receiver.wait_for, n + 1, 20)
        summary = await asyncio.wait_for(running, 30)
    assert summary["delivered"] == 3


DELIVER_SCRIPT = """
import asyncio, sys
from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.delivery import DeliveryContext, DeliveryOptions, Sender, deliver_due
from prefect_webhooks.store.engine.engines import get_engine

async def main() -> None:
    async with Sender() as sender:
        context = DeliveryContext(get_engine(), sender)
        context.destinations.remember("crm", WebhookDestination(endpoints=[{"url": sys.argv[1]}]))
        stats = await deliver_due(DeliveryOptions(batch_size=50), context=context)
        print("delivered", stats.delivered, flush=True)

asyncio.run(main())
"""


@pytest.mark.shares_machine
@pytest.mark.slow
def test_a_killed_delivery_process_loses_nothing(store_url: str, tmp_path: Path) -> None:
    enqueue("crm", [track(n) for n in range(200)])
    env = {**os.environ, "PREFECT_WEBHOOKS_DATABASE_URL": store_url, "PREFECT_WEBHOOKS_LEASE_SECONDS": "3",
           "PYTHONPATH": str(Path(__file__).parents[2])}
    script = tmp_path / "deliver_once.py"
    script.write_text(DELIVER_SCRIPT)
    with Receiver(default={"status": 200, "delay": 0.05}) as receiver:
        process = subprocess.Popen([sys.executable, str(script), receiver.url], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        receiver.wait_for(60, timeout=60)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        killed_at = time.monotonic()
        before = {row.state for row in outbox()}
        assert PENDING in before, "the kill came too late to test anything"
        leased = [row for row in outbox() if row.lease_owner is not None and row.state == PENDING]
        assert leased, "rows the dead process had claimed still carry its lease"
        restarted = subprocess.run([sys.executable, str(script), receiver.url], env=env, capture_output=True,
                                   text=True, timeout=120)
        assert restarted.returncode == 0, restarted.stderr[-2000:]
        # What the dead process held comes back only when the lease has expired: run again until it has.
        while any(row.state == PENDING for row in outbox()) and time.monotonic() - killed_at < 30:
            time.sleep(0.5)
            subprocess.run([sys.executable, str(script), receiver.url], env=env, capture_output=True, timeout=120)
    rows = outbox()
    assert all(row.state == DELIVERED for row in rows)
    received = [orjson.loads(request.body)["userId"] for request in receiver.requests]
    assert set(received) == {f"u{n}" for n in range(200)}
    duplicates = len(received) - len(set(received))
    print(f"200 messages, {len(received)} requests received, {duplicates} duplicates (at-least-once)")
    assert len(every_attempt()) <= len(received)


async def test_filtered_messages_are_counted_in_the_summary_and_an_artifact(settings_env: Any) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url, "headers": {"X-Key": "v4lue-secret"}}],
                                 filters=[{"name": "odd-only", "action": "allow",
                                           "conditions": [{"field": "properties.n", "in": [1, 3, 5, 7, 9]}]},
                                          {"action": "drop", "conditions": [{"field": "properties.n",
                                                                             "equals": 9}]}]).save(name)
        enqueue(name, [track(n) for n in range(10)])
        state = await deliver(return_state=True)
        summary = await state.result()
    assert summary == {"delivered": 4, "failed": 0, "rescheduled": 0, "filtered": 6, "batches": 1}
    assert sorted(orjson.loads(request.body)["properties"]["n"] for request in receiver.requests) == [1, 3, 5, 7]
    artifacts = await artifacts_of(state.state_details.flow_run_id)
    (filtered,) = [artifact for artifact in artifacts if artifact["key"].startswith(f"filtered-{name}-")]
    assert orjson.loads(filtered["data"]) == [
        {"destination": name, "rule": "allow rule 'odd-only' not matched", "filtered": 5},
        {"destination": name, "rule": "drop rule #2", "filtered": 1},
    ]
    assert not any("v4lue-secret" in artifact["data"] for artifact in artifacts)


def _docs_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])


async def test_the_artifact_keys_and_task_runs_the_docs_show_are_the_ones_a_run_makes(settings_env: Any) -> None:
    docs = _docs_text()
    shown_keys = set(re.findall(r"`((?:delivery|filtered)-<destination>-<hash>)`", docs))
    shown_tasks = set(re.findall(r"`(deliver-[a-z-]+)` task runs?", docs))
    assert shown_keys == {"delivery-<destination>-<hash>", "filtered-<destination>-<hash>"}
    assert shown_tasks == {"deliver-batches"}
    for untrue in ("artifact per destination", "one task per batch"):
        assert untrue not in docs
    name = block_name()
    with Receiver() as first, Receiver() as second:
        await WebhookDestination(endpoints=[{"url": first.url}, {"url": second.url}], shared_secret="s3cret-s3cret-01",
                                 filters=[{"action": "drop", "conditions": [{"field": "properties.n", "equals": 0}]}],
                                 ).save(name)
        enqueue(name, [track(n) for n in range(5)])
        state = await deliver(batch_size=2, return_state=True)
        assert (await state.result())["delivered"] == 4
    flow_run_id = state.state_details.flow_run_id
    keys = [artifact["key"] for artifact in await artifacts_of(flow_run_id)]
    patterns = {shown: re.escape(shown).replace(re.escape("<destination>"), re.escape(name))
                .replace(re.escape("<hash>"), "[0-9a-f]{10}") for shown in shown_keys}
    made = {shown: [key for key in keys if re.fullmatch(pattern, key)] for shown, pattern in patterns.items()}
    # One delivery artifact per endpoint URL, one filtered artifact for the destination, and nothing else.
    assert sorted(len(found) for found in made.values()) == [1, 2] and len(made["delivery-<destination>-<hash>"]) == 2
    assert sorted(keys) == sorted(key for found in made.values() for key in found)
    # Three batches of two claimed within one window: one task run, named as the docs name it.
    (run,) = await task_runs_of(flow_run_id, 1)
    assert run.name.rsplit("-", 1)[0] in shown_tasks


async def test_a_block_saved_with_a_bad_rule_through_the_api_holds_its_messages(
    settings_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    name = block_name()
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}], shared_secret="k3y-secret-0000001").save(name)
        # What the UI or a raw API call can store: the server does not run the block's validation.
        async with get_client() as client:
            document = await client.read_block_document_by_name(name, "webhook-destination")
            data = {**document.data, "filters": [{"name": "typo", "action": "drop",
                                                  "conditions": [{"field": "propertes.plan", "equals": "x"}]}]}
            await client.update_block_document(document.id, BlockDocumentUpdate(data=data))
        enqueue(name, [track(1)])
        summary = await deliver()
        assert receiver.requests == []
    assert summary["rescheduled"] == 1
    (row,) = outbox()
    assert row.state == PENDING and row.attempts == 0
    warning = next(record.getMessage() for record in caplog.records if "is invalid" in record.getMessage())
    assert f"destination block {name!r} is invalid" in warning
    assert "rule 'typo': condition on field 'propertes.plan': unknown field 'propertes'" in warning
    assert "k3y-secret-0000001" not in caplog.text
