"""The ``deletions`` flow on a real Prefect API: Source blocks, fan-out, purge, suppression and the artifact."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from prefect import get_client
from sqlalchemy import select

from prefect_webhooks.deletions.requests import request_deletion, user_reference
from prefect_webhooks.flows.deletions import ARTIFACT_KEY, deletions
from prefect_webhooks.messages.outcomes import DELIVERED
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.queue.outbox import enqueue
from prefect_webhooks.store.schema.tables import OutboxMessage, SuppressedUser
from tests.servers import save_destination, save_source, task_names
from tests.stored import every_message, finish

pytestmark = pytest.mark.usefixtures("prefect_harness")
OUTBOX = OutboxMessage.__table__


def track(user: str) -> dict[str, Any]:
    return {"version": 1, "type": "track", "userId": user, "event": "Signed Up", "properties": {"plan": "pro"},
            "timestamp": "2026-01-01T00:00:00.000Z"}


@pytest.fixture
def blocks() -> dict[str, str]:
    """web → two destinations, app → one, crm → none enabled; legacy has events but no block."""
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"{kind}-{tag}" for kind in ("hooks-a", "hooks-b", "hooks-c", "web", "app", "crm", "legacy")}
    for destination in ("hooks-a", "hooks-b", "hooks-c"):
        save_destination(names[destination], [f"http://127.0.0.1:9/{destination}"])
    save_source(names["web"], f"wk-web-{tag}", [names["hooks-a"], names["hooks-b"]])
    save_source(names["app"], f"wk-app-{tag}", [names["hooks-c"]])
    save_source(names["crm"], f"wk-crm-{tag}", [])
    return names


def rows() -> list[Any]:
    return every_message()


def test_flow_fans_out_purges_suppresses_and_shows_a_table(store_url: str, blocks: dict[str, str]) -> None:
    for source in ("web", "app", "crm", "legacy"):
        enqueue(blocks["hooks-a"], [track("alice")], source=blocks[source])
    enqueue(blocks["hooks-a"], [track("bob")], source=blocks["web"])
    finish(get_engine(), [1], DELIVERED)

    state = deletions(user_id="alice", suppress=True, return_state=True)
    [outcome] = state.result()
    assert outcome.delete_messages == 3
    assert outcome.notified == {blocks["web"]: [blocks["hooks-a"], blocks["hooks-b"]],
                                blocks["app"]: [blocks["hooks-c"]]}
    assert set(outcome.skipped_sources) == {blocks["crm"], blocks["legacy"]}

    stored = rows()
    deletes = [row for row in stored if row.message_type == "delete"]
    assert sorted((row.source, row.destination) for row in deletes) == sorted(
        [(blocks["web"], blocks["hooks-a"]), (blocks["web"], blocks["hooks-b"]), (blocks["app"], blocks["hooks-c"])])
    assert all(set(orjson.loads(row.body)) == {"type", "userId", "timestamp"} for row in deletes)
    assert all(row.body is None and row.user_id is None for row in stored[:4])
    assert [row.state for row in stored[:4]] == ["delivered", "failed", "failed", "failed"]
    assert stored[4].user_id == "bob" and stored[4].body is not None
    with get_engine().connect() as connection:
        assert connection.execute(select(SuppressedUser.__table__.c.source)).scalars().all() == ["*"]

    assert task_names(state.state_details.flow_run_id) == {"process-deletion-batch"}
    with get_client(sync_client=True) as client:
        # A plain request: this client version's read_artifacts sends nulls the server rejects.
        artifacts = client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(state.state_details.flow_run_id)]}}, "limit": 100,
                  "offset": 0, "sort": "CREATED_DESC"}).json()
    [artifact] = [artifact for artifact in artifacts if artifact["key"] == ARTIFACT_KEY]
    data = orjson.loads(artifact["data"]) if isinstance(artifact["data"], str) else artifact["data"]
    assert data == [{
        "request": outcome.request_id,
        "user": user_reference("alice"),
        "sources notified": ", ".join(sorted([blocks["web"], blocks["app"]])),
        "sources skipped": f"{blocks['crm']} (no Webhooks destination enabled), {blocks['legacy']} (no such source)",
        "delete messages": 3,
        "rows purged": 1,
        "pending dropped": 3,
        "audience state removed": 0,
        "suppressed": "*",
    }]
    assert "alice" not in str(artifact["data"])


def test_flow_processes_every_pending_request(store_url: str, blocks: dict[str, str]) -> None:
    enqueue(blocks["hooks-a"], [track("carol"), track("dave")], source=blocks["web"])
    first = request_deletion("carol")
    second = request_deletion("dave", [blocks["app"]])
    outcomes = deletions()
    assert [(outcome.request_id, outcome.delete_messages) for outcome in outcomes] == [(first, 2), (second, 1)]
    assert deletions() == []
