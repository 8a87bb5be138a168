"""A delivery worker started while the Prefect API is down delivers at once, then registers and records it.

The worker runs in the test's event loop against the session's Prefect server behind a forwarder that is down at
the start and comes back (``tests.outages``); a real receiver and a real SQLite store.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.client.schemas.objects import FlowRun

from prefect_webhooks.delivery.sending.destinations import DestinationCache
from prefect_webhooks.serving.delivery_worker import DeliveryWorker
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.queue.outbox import enqueue
from tests.delivery.test_delivery import outbox, track
from tests.outages import switched_api
from tests.receivers import Receiver
from tests.servers import save_destination


async def offline_runs(client: PrefectClient, earlier: frozenset[object] = frozenset()) -> list[FlowRun]:
    """The runs recording a delivery made without Prefect, but those in ``earlier``: the session's Prefect server
    also holds those of tests before this one (a serve that delivered through an outage records one too)."""
    found = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="offline-")))
    return [run for run in found if run.id not in earlier]


async def eventually(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_worker_started_during_an_outage_delivers_then_registers_and_records_it(
    prefect_harness: None, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_API_PROBE_SECONDS", "0.5")
    get_settings.cache_clear()
    async with get_client() as client:
        earlier = frozenset(run.id for run in await offline_runs(client))
    with Receiver() as receiver:
        await asyncio.to_thread(save_destination, "offline-dest", [receiver.url], "offline-secret-of-16")
        with switched_api() as switch:
            await DestinationCache().get("offline-dest")  # an earlier process of this host loaded it: the copy
            switch.down()
            enqueue("offline-dest", [track(n) for n in range(20)])
            worker = DeliveryWorker(poll_seconds=1)
            running = asyncio.ensure_future(worker.run())
            try:
                await asyncio.to_thread(receiver.wait_for, 20, 30)
                assert worker.deployment_id is None and worker.offline is not None
                switch.up()

                async def recorded() -> bool:
                    async with get_client() as client:
                        found = await offline_runs(client, earlier)
                        # The run is created first and its artifacts published after it: recorded means both.
                        published = {artifact.flow_run_id for artifact in await client.read_artifacts()}
                    return (bool(found) and found[0].id in published and worker.offline is None
                            and bool(worker.runs))

                await eventually(recorded, 60, "registered, a run took over, the offline delivery recorded")
            finally:
                worker.stop()
                await asyncio.wait_for(running, 60)
            async with get_client() as client:
                offline = await offline_runs(client, earlier)
                artifacts = await client.read_artifacts()
    assert len(receiver.requests) == 20 and {row.state for row in outbox()} == {"delivered"}
    assert len(offline) == 1 and offline[0].state.is_completed(), [(run.name, run.state_name) for run in offline]
    assert "Delivered 20 message(s)" in offline[0].state.message and "without task runs" in offline[0].state.message
    assert any(artifact.flow_run_id == offline[0].id for artifact in artifacts)
