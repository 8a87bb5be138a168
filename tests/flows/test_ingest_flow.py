"""The ``ingest`` flow: every input kind through the same ingestion path, and its artifacts."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from sqlalchemy import select

from prefect_webhooks.blocks.saved import save_block
from prefect_webhooks.blocks.source import Source
from prefect_webhooks.flows.ingest import ingest, load_calls, record_to_call
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import OutboxMessage

OUTBOX = OutboxMessage.__table__


@pytest.fixture
async def source(prefect_harness: None) -> str:
    name = f"import-{uuid.uuid4().hex[:8]}"
    await save_block(Source(write_key=uuid.uuid4().hex, destinations=["crm"]), name)
    return name


def rows(store_url: str) -> list:
    with get_engine(store_url).connect() as connection:
        return list(connection.execute(select(OUTBOX).order_by(OUTBOX.c.id)))


CALLS = [
    {"type": "identify", "userId": "u1", "traits": {"plan": "pro"}, "messageId": "m1"},
    {"type": "track", "userId": "u1", "event": "Paid", "properties": {"amount": 12.5}, "messageId": "m2",
     "timestamp": "2019-01-02T03:04:05Z"},
    {"type": "track", "userId": "u2", "messageId": "m3"},  # no event: rejected
    {"type": "identify", "userId": "u1", "messageId": "m1"},  # duplicate of the first
]


async def artifacts_of(flow_run_id: uuid.UUID) -> dict[str, list]:
    async with get_client() as client:
        # A plain filter request: this client's read_artifacts sends filters the server reads as "match nothing".
        response = await client.request(
            "POST", "/artifacts/filter", json={"flow_runs": {"id": {"any_": [str(flow_run_id)]}}}
        )
    return {artifact["key"]: orjson.loads(artifact["data"]) for artifact in response.json()}


def check_outcome(result: dict, store_url: str) -> None:
    assert (result["accepted"], result["rejected"], result["duplicates"]) == (2, 1, 1)
    assert result["rejections"] == [{"row": 3, "field": "event", "reason": "event is required"}]
    stored = rows(store_url)
    assert [(row.message_id, row.message_type) for row in stored] == [("m1", "identify"), ("m2", "track")]
    track = orjson.loads(stored[1].body)
    assert track["properties"] == {"amount": 12.5} or track["properties"] == {"amount": "12.5"}
    # A historical timestamp without sentAt is kept.
    assert track["timestamp"] == "2019-01-02T03:04:05.000Z"


async def test_list_input_and_artifacts(store_url: str, source: str) -> None:
    state = await ingest(source, CALLS, batch_size=2, return_state=True)
    result = await state.result()
    check_outcome(result, store_url)
    artifacts = await artifacts_of(state.state_details.flow_run_id)
    assert artifacts["ingest-summary"] == [
        {"source": source, "calls": 4, "accepted": 2, "rejected": 1, "duplicates": 1, "suppressed": 0,
         "rows_written": 2}
    ]
    assert artifacts["ingest-rejected"] == [{"row": 3, "field": "event", "reason": "event is required"}]


async def test_json_lines_input_rejects_unreadable_lines(store_url: str, source: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    lines = [orjson.dumps(call) for call in CALLS] + [b"", b"{broken"]
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = await ingest(source, str(path))
    assert (result["accepted"], result["rejected"], result["duplicates"]) == (2, 2, 1)
    assert result["rejections"][1]["row"] == 5 and "JSON" in result["rejections"][1]["reason"]


def table() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"type": "identify", "userId": "u1", "messageId": "m1", "traits": '{"plan": "pro"}',
             "properties.amount": None, "event": None, "timestamp": None},
            {"type": "track", "userId": "u1", "messageId": "m2", "traits": None, "properties.amount": "12.5",
             "event": "Paid", "timestamp": "2019-01-02T03:04:05Z"},
            {"type": "track", "userId": "u2", "messageId": "m3", "traits": None, "properties.amount": None,
             "event": None, "timestamp": None},
            {"type": "identify", "userId": "u1", "messageId": "m1", "traits": None, "properties.amount": None,
             "event": None, "timestamp": None},
        ]
    )


async def test_csv_input(store_url: str, source: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.csv"
    table().to_csv(path, index=False)
    check_outcome(await ingest(source, path), store_url)
    assert orjson.loads(rows(store_url)[0].body)["traits"] == {"plan": "pro"}


async def test_parquet_input(store_url: str, source: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.parquet"
    table().to_parquet(path)
    check_outcome(await ingest(source, str(path)), store_url)


async def test_dataframe_input(store_url: str, source: str) -> None:
    frame = table()
    frame["properties.amount"] = [None, 12.5, None, None]
    check_outcome(await ingest(source, frame), store_url)
    assert orjson.loads(rows(store_url)[1].body)["properties"] == {"amount": 12.5}


async def test_context_integrations_route_imported_calls(store_url: str, source: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.csv"
    pd.DataFrame(
        [
            {"type": "track", "userId": "u1", "event": "Kept", "messageId": "kept", "context": None},
            {"type": "track", "userId": "u1", "event": "Off", "messageId": "off",
             "context": '{"integrations": {"All": false}}'},
            {"type": "track", "userId": "u1", "event": "Off too", "messageId": "off-too",
             "context": '{"integrations": {"Webhooks": false}}'},
        ]
    ).to_csv(path, index=False)
    result = await ingest(source, str(path))
    assert (result["accepted"], result["rejected"]) == (3, 0)
    assert [row.message_id for row in rows(store_url)] == ["kept"]


async def test_disabled_source_is_refused(store_url: str, prefect_harness: None) -> None:
    name = f"off-{uuid.uuid4().hex[:8]}"
    await save_block(Source(write_key=uuid.uuid4().hex, enabled=False), name)
    state = await ingest(name, CALLS, return_state=True)
    assert state.is_failed()
    assert rows(store_url) == []


async def test_a_missing_source_is_refused_naming_it(store_url: str, prefect_harness: None) -> None:
    name = f"missing-{uuid.uuid4().hex[:8]}"
    state = await ingest(name, CALLS, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match=f"no Source block named '{name}'"):
        await state.result()
    assert rows(store_url) == []


def test_record_to_call_combines_json_and_dot_columns() -> None:
    call = record_to_call(
        {"type": "track", "context": '{"ip": "1.2.3.4"}', "context.os.name": "iOS", "properties.plan": "pro",
         "event": "", "anonymousId": float("nan")}
    )
    assert call == {"type": "track", "context": {"ip": "1.2.3.4", "os": {"name": "iOS"}},
                    "properties": {"plan": "pro"}}


def test_unsupported_file_type(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported file type"):
        load_calls(tmp_path / "calls.xlsx")
