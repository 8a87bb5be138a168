"""The ``audience-sync`` flow on a real Prefect API: Source blocks, the sync, and its artifacts."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
from prefect import get_client
from sqlalchemy import select

from prefect_webhooks.audiences.snapshots import SqlSnapshot
from prefect_webhooks.audiences.sync import AudienceDefinition, AudienceError
from prefect_webhooks.flows.audience_sync import artifact_key, audience_sync
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import OutboxMessage
from tests.servers import save_destination, save_source, task_names

pytestmark = pytest.mark.usefixtures("prefect_harness")


def run_artifacts(flow_run_id: UUID) -> list[dict[str, Any]]:
    """The flow run's artifacts (a plain request: this client version's ``read_artifacts`` sends nulls)."""
    with get_client(sync_client=True) as client:
        response = client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 100, "offset": 0,
                  "sort": "CREATED_DESC"})
    return response.json()


def table(artifact: dict[str, Any]) -> list[dict[str, Any]]:
    data = artifact["data"]
    return orjson.loads(data) if isinstance(data, str) else data


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    """A warehouse with members, and Source blocks: web → crm, ads; app → ads; quiet → nothing."""
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"{kind}-{tag}" for kind in ("crm", "ads", "web", "app", "quiet")}
    save_destination(names["crm"], ["http://127.0.0.1:9/crm"])
    save_destination(names["ads"], ["http://127.0.0.1:9/ads"])
    save_source(names["web"], f"wk-web-{tag}", [names["crm"], names["ads"]])
    save_source(names["app"], f"wk-app-{tag}", [names["ads"]])
    save_source(names["quiet"], f"wk-quiet-{tag}", [])
    warehouse = tmp_path / "warehouse.db"
    with sqlite3.connect(warehouse) as connection:
        connection.execute("CREATE TABLE members (user_id TEXT)")
        connection.executemany("INSERT INTO members VALUES (?)", [(f"u{i}",) for i in range(50)])
    return {"names": names, "warehouse": warehouse, "tag": tag}


def definition(setup: dict[str, Any], **extra: Any) -> AudienceDefinition:
    names = setup["names"]
    return AudienceDefinition(
        name=f"Flow Buyers {setup['tag']}",
        sources=[names["web"], names["app"], names["quiet"]],
        snapshot=SqlSnapshot(url=f"sqlite:///{setup['warehouse']}", query="SELECT user_id FROM members"),
        **extra,
    )


def outbox_count() -> int:
    with get_engine().connect() as connection:
        return len(connection.execute(select(OutboxMessage.__table__.c.id)).all())


def test_flow_syncs_and_shows_progress_and_table(store_url: str, setup: dict[str, Any]) -> None:
    names = setup["names"]
    state = audience_sync(definition(setup), return_state=True)
    result = state.result()
    assert {row.destination: row.queued for row in result.destinations} == {names["crm"]: 50, names["ads"]: 50}
    assert outbox_count() == 100
    assert task_names(state.state_details.flow_run_id) == {"read-source-destinations", "sync-audience-snapshot"}

    artifacts = run_artifacts(state.state_details.flow_run_id)
    progress = [artifact for artifact in artifacts if artifact["type"] == "progress"]
    assert len(progress) == 1 and float(progress[0]["data"]) == 100.0
    [summary] = [artifact for artifact in artifacts if artifact["type"] == "table"]
    assert summary["key"] == artifact_key(result.key)
    rows = {row["destination"]: row for row in table(summary)}
    assert rows[names["crm"]] == {
        "audience": result.key, "destination": names["crm"], "source": names["web"], "members": 50, "added": 50,
        "removed": 0, "changed": 0, "unchanged": 0, "messages queued": 50,
    }

    with sqlite3.connect(setup["warehouse"]) as connection:
        connection.execute("DELETE FROM members WHERE user_id IN ('u1', 'u2')")
        connection.execute("INSERT INTO members VALUES ('new')")
    second = audience_sync(definition(setup), return_state=True)
    rows = {row["destination"]: row for row in table(
        next(a for a in run_artifacts(second.state_details.flow_run_id) if a["type"] == "table"))}
    assert (rows[names["ads"]]["added"], rows[names["ads"]]["removed"], rows[names["ads"]]["unchanged"],
            rows[names["ads"]]["messages queued"], rows[names["ads"]]["members"]) == (1, 2, 48, 3, 49)
    assert outbox_count() == 106


def test_bad_snapshot_fails_the_run_and_writes_nothing(store_url: str, setup: dict[str, Any]) -> None:
    with sqlite3.connect(setup["warehouse"]) as connection:
        connection.execute("INSERT INTO members VALUES ('u3')")
    state = audience_sync(definition(setup), return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="2 rows have a duplicate user id"):
        state.result()
    assert outbox_count() == 0


def test_empty_snapshot_needs_allow_empty(store_url: str, setup: dict[str, Any]) -> None:
    audience_sync(definition(setup))
    with sqlite3.connect(setup["warehouse"]) as connection:
        connection.execute("DELETE FROM members")
    assert audience_sync(definition(setup), return_state=True).is_failed()
    assert outbox_count() == 100
    result = audience_sync(definition(setup), allow_empty=True)
    assert all(row.removed == 50 for row in result.destinations) and outbox_count() == 200


def test_a_missing_source_block_fails_the_run(store_url: str, setup: dict[str, Any]) -> None:
    broken = definition(setup).model_copy(update={"sources": [f"missing-{setup['tag']}"]})
    state = audience_sync(broken, return_state=True)
    assert state.is_failed()
    with pytest.raises(AudienceError, match=f"no Source block named 'missing-{setup['tag']}'"):
        state.result()
    assert outbox_count() == 0
