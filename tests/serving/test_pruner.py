"""serve's pruner: a pass every PREFECT_WEBHOOKS_RETENTION_INTERVAL, as a tagged prune flow run, and the store pruned
all the same while the Prefect API cannot be reached."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
from prefect.settings import PREFECT_API_URL, temporary_settings

from prefect_webhooks.flows.old_runs import OUR_TAG
from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.serving.pruner import prune_every, run_one_pass
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import store_now
from tests.servers import free_port
from tests.stored import every_message, finish


def _old_delivered_rows(count: int) -> None:
    enqueue("crm", [{"type": "track", "userId": "u", "event": "E"}] * count, source="web")
    finish(get_engine(), [message.id for message in every_message()], DELIVERED,
           at=store_now() - timedelta(hours=1))


def _outbox_rows() -> int:
    return len(every_message())


async def _prune_runs() -> list:
    async with get_client() as client:
        return await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["prune"])), limit=50)


async def test_passes_come_every_interval_as_tagged_prune_runs(
    prefect_harness: None, store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "60s")
    get_settings.cache_clear()
    before = {run.id for run in await _prune_runs()}
    _old_delivered_rows(3)
    stop = threading.Event()
    pruner = threading.Thread(target=prune_every, args=(1.0, stop))
    pruner.start()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            runs = [run for run in await _prune_runs() if run.id not in before and run.state and run.state.is_final()]
            if len(runs) >= 2:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        pruner.join(30)
    assert not pruner.is_alive()
    assert len(runs) >= 2 and all(OUR_TAG in run.tags and run.state.is_completed() for run in runs)
    assert _outbox_rows() == 0
    # Each pass is the flow run alone: not the flow, then the store pass again because its call was mishandled.
    assert "the prune flow could not run" not in caplog.text


def test_without_prefect_the_store_is_pruned_all_the_same(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "60s")
    get_settings.cache_clear()
    _old_delivered_rows(2)
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}), caplog.at_level(
            logging.INFO, logger="prefect_webhooks.pruner"):
        run_one_pass()
    assert _outbox_rows() == 0
    assert "pruning the store without a flow run" in caplog.text and "pruned 2 delivered" in caplog.text
