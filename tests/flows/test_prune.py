"""The ``prune`` flow: a pass over the store shown in Prefect, and our old runs removed from Prefect."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import orjson
import pytest
from prefect import flow, get_client, tags
from prefect.artifacts import create_table_artifact
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled

from prefect_webhooks.flows.old_runs import OUR_TAG
from prefect_webhooks.flows.prune import ARTIFACT_KEY, prune
from prefect_webhooks.messages.outcomes import DELIVERED, Attempt, Delivered, OutcomeRecords
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import claim_due_deliveries, enqueue, record_outcomes
from prefect_webhooks.store.schema.tables import store_now

pytestmark = pytest.mark.usefixtures("prefect_harness")


@flow(name="prune-test-ours")
def ours() -> None:
    create_table_artifact(table=[{"a": 1}], key="prune-test-ours")


@flow(name="prune-test-foreign")
def foreign() -> None:
    create_table_artifact(table=[{"a": 1}], key="prune-test-foreign")


async def artifacts_of(flow_run_id: Any) -> list[dict[str, Any]]:
    async with get_client() as client:
        response = await client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 10, "offset": 0,
                  "sort": "CREATED_DESC"})
    return response.json()


async def exists(flow_run_id: Any) -> bool:
    async with get_client() as client:
        try:
            await client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            return False
    return True


async def test_a_pass_prunes_the_store_shows_a_table_and_removes_only_our_old_runs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = get_engine(store_url)
    enqueue("crm", [{"type": "track", "userId": "u", "event": "E"}] * 3, source="web")
    rows = claim_due_deliveries(engine, 10, "test")
    now = store_now() - timedelta(days=2)  # delivered two days ago: their whole partition is past any retention here
    record_outcomes(engine, OutcomeRecords(
        delivered=[Delivered(row.id, 1, now, now, row.destination) for row in rows],
        attempts=[Attempt(row.id, now, "http://127.0.0.1:9/", 200, None, 1.0, DELIVERED) for row in rows]))
    with tags(OUR_TAG):
        old_ours = ours(return_state=True).state_details.flow_run_id
    old_foreign = foreign(return_state=True).state_details.flow_run_id
    async with get_client() as client:
        # A run that never started (superseded by the catch-up after an outage): the oldest Prefect we support leaves
        # its start time empty (it counts from its slot then); newer ones set it to the time it ended.
        never_started = (await client.create_flow_run(ours, tags=[OUR_TAG], state=Cancelled(message="superseded"))).id
    await asyncio.sleep(1.5)
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_DELIVERED", "1s")
    monkeypatch.setenv("PREFECT_WEBHOOKS_RETENTION_RUNS", "1s")
    get_settings.cache_clear()

    with tags(OUR_TAG):
        state = await prune(return_state=True)
    result = await state.result()
    assert result[DELIVERED] == 3 and result["store_bytes"] > 0
    assert result["flow_runs"] >= 1 and result["artifacts"] >= 1
    assert not await exists(old_ours) and not await exists(never_started) and await exists(old_foreign)
    assert await artifacts_of(old_ours) == [] and len(await artifacts_of(old_foreign)) == 1
    (artifact,) = await artifacts_of(state.state_details.flow_run_id)
    assert artifact["key"] == ARTIFACT_KEY and "Store:" in artifact["description"]
    table = {row["rows"]: row for row in orjson.loads(artifact["data"])}
    assert table["delivered messages"]["removed"] == 3 and "attempt records" not in table  # inside their messages
    assert table["pending messages"]["kept for"] == "until delivered or failed"
