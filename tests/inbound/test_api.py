"""The ingest API over real HTTP: a real uvicorn subprocess, a real Prefect API holding the Source blocks."""

from __future__ import annotations

import base64
import gzip
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import orjson
import pytest
from prefect.settings import PREFECT_API_URL
from sqlalchemy import func, select

from prefect_webhooks.blocks.source import Source
from prefect_webhooks.messages.model import MAX_BATCH_BYTES, MAX_MESSAGE_BYTES, MESSAGE_TYPES
from prefect_webhooks.settings import get_settings
from prefect_webhooks.signing.signatures import verify
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.schema.tables import OutboxMessage
from tests.receivers import Receiver
from tests.servers import IngestServer, ingest_api_process, save_destination, save_source

OUTBOX = OutboxMessage.__table__
SERVER_ENV = {
    # New sources are saved right before they are used: reload on every unknown key.
    "PREFECT_WEBHOOKS_UNKNOWN_KEY_REFRESH_SECONDS": "0",
    "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "1",
}


@dataclass
class Api:
    server: IngestServer
    store_url: str

    @property
    def url(self) -> str:
        return self.server.url

    def rows(self, source: str) -> list:
        with get_engine(self.store_url).connect() as connection:
            return list(connection.execute(select(OUTBOX).where(OUTBOX.c.source == source).order_by(OUTBOX.c.id)))


@pytest.fixture(scope="module")
def api(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'store.db'}"
    get_engine(store_url)
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=SERVER_ENV) as server:
        yield Api(server, store_url)


@dataclass
class NewSource:
    name: str
    key: str


@pytest.fixture
def source(prefect_harness: None) -> NewSource:
    """A freshly saved source with one destination (each test gets its own, so tests share one server)."""
    name = f"src-{uuid.uuid4().hex[:10]}"
    key = f"wk_{uuid.uuid4().hex}"
    save_source(name, key, ["crm"])
    return NewSource(name, key)


def basic(key: str, password: str = "") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:{password}".encode()).decode()}


def track(message_id: str | None = None, **extra: object) -> dict:
    return {"type": "track", "userId": "u1", "event": "Clicked", "messageId": message_id or uuid.uuid4().hex, **extra}


def post(api: Api, path: str, body: object, **kwargs: object) -> httpx.Response:
    return httpx.post(f"{api.url}{path}", content=orjson.dumps(body), timeout=10, **kwargs)


class TestAccept:
    def test_basic_auth_batch_is_committed_before_the_200(self, api: Api, source: NewSource) -> None:
        response = post(api, "/v1/batch", {"batch": [track("a"), track("b")]}, headers=basic(source.key))
        assert response.status_code == 200
        assert response.json()["accepted"] == 2 and response.json()["success"] is True
        # The answer came after the commit: the rows are there without waiting.
        assert sorted(row.message_id for row in api.rows(source.name)) == ["a", "b"]

    def test_write_key_in_body(self, api: Api, source: NewSource) -> None:
        response = post(api, "/v1/batch", {"writeKey": source.key, "batch": [track("a")]})
        assert response.status_code == 200
        assert [row.message_id for row in api.rows(source.name)] == ["a"]

    def test_import_is_the_same_as_batch(self, api: Api, source: NewSource) -> None:
        assert post(api, "/v1/import", {"batch": [track("i")]}, headers=basic(source.key)).status_code == 200
        assert [row.message_id for row in api.rows(source.name)] == ["i"]

    def test_gzip_body(self, api: Api, source: NewSource) -> None:
        body = gzip.compress(orjson.dumps({"batch": [track("g")], "writeKey": source.key}))
        response = httpx.post(
            f"{api.url}/v1/batch", content=body, headers={"Content-Encoding": "gzip"}, timeout=10
        )
        assert response.status_code == 200
        assert [row.message_id for row in api.rows(source.name)] == ["g"]

    def test_batch_context_and_integrations_merge(self, api: Api, source: NewSource) -> None:
        body = {
            "batch": [
                {"type": "screen", "userId": "u", "name": "Home", "messageId": "s1"},
                {**track("t1"), "integrations": {"Webhooks": True}},
                track("t2"),
            ],
            "context": {"os": {"name": "Android", "version": "14"}},
            "integrations": {"All": False},
        }
        assert post(api, "/v1/batch", body, headers=basic(source.key)).status_code == 200
        rows = api.rows(source.name)
        assert [row.message_id for row in rows] == ["t1"]

    def test_rejected_calls_are_listed_and_the_rest_accepted(self, api: Api, source: NewSource) -> None:
        body = {"batch": [track("ok"), {"type": "track", "userId": "u"}, {"type": "group", "userId": "u"}]}
        response = post(api, "/v1/batch", body, headers=basic(source.key))
        assert response.status_code == 200
        assert response.json()["accepted"] == 1
        assert [(r["index"], r["field"]) for r in response.json()["rejected"]] == [(1, "event"), (2, "groupId")]
        assert all(r["reason"] for r in response.json()["rejected"])
        assert [row.message_id for row in api.rows(source.name)] == ["ok"]

    def test_duplicate_message_id_is_accepted_once(self, api: Api, source: NewSource) -> None:
        for _ in range(2):
            assert post(api, "/v1/batch", {"batch": [track("dup")]}, headers=basic(source.key)).status_code == 200
        assert len(api.rows(source.name)) == 1

    def test_clock_skew_is_corrected(self, api: Api, source: NewSource) -> None:
        # The client's clock is two hours slow; it stamped the event one second before sending.
        body = {"batch": [track("skew", timestamp="2020-01-01T00:00:00Z")], "sentAt": "2020-01-01T00:00:01Z"}
        before = time.time()
        assert post(api, "/v1/batch", body, headers=basic(source.key)).status_code == 200
        stamp = orjson.loads(api.rows(source.name)[0].body)["timestamp"]
        event_time = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        # receivedAt − 1 s, whatever the client's clock said.
        assert before - 1.5 <= event_time <= time.time()

    @pytest.mark.parametrize("call_type", MESSAGE_TYPES)
    def test_single_call_endpoints_take_the_type_from_the_path(
        self, api: Api, source: NewSource, call_type: str
    ) -> None:
        body = {"userId": "u1", "event": "E", "groupId": "g", "previousId": "p", "type": "track", "messageId": "x"}
        response = post(api, f"/v1/{call_type}", body, headers=basic(source.key))
        assert response.status_code == 200, response.text
        rows = api.rows(source.name)
        assert [row.message_type for row in rows] == [call_type]

    def test_single_call_with_write_key_in_body(self, api: Api, source: NewSource) -> None:
        response = post(api, "/v1/identify", {"userId": "u1", "writeKey": source.key, "traits": {"a": 1}})
        assert response.status_code == 200
        assert orjson.loads(api.rows(source.name)[0].body)["traits"] == {"a": 1}

    def test_new_source_works_without_restart(self, api: Api, prefect_harness: None) -> None:
        name, key = f"late-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        assert post(api, "/v1/batch", {"batch": [track()]}, headers=basic(key)).status_code == 401
        save_source(name, key, ["crm"])
        assert post(api, "/v1/batch", {"batch": [track()]}, headers=basic(key)).status_code == 200


class TestRefuse:
    def assert_error(self, response: httpx.Response, status: int, code: str) -> dict:
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code and body["message"]
        return body

    def test_missing_write_key_is_401(self, api: Api) -> None:
        self.assert_error(post(api, "/v1/batch", {"batch": [track()]}), 401, "missing_write_key")

    def test_unknown_write_key_is_401_by_basic_and_body(self, api: Api) -> None:
        self.assert_error(post(api, "/v1/batch", {"batch": [track()]}, headers=basic("nope")), 401, "invalid_write_key")
        self.assert_error(post(api, "/v1/batch", {"batch": [track()], "writeKey": "nope"}), 401, "invalid_write_key")

    def test_disabled_source_is_403(self, api: Api, prefect_harness: None) -> None:
        name, key = f"off-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        Source(write_key=key, destinations=["crm"], enabled=False).save(name)
        self.assert_error(post(api, "/v1/batch", {"batch": [track()]}, headers=basic(key)), 403, "source_disabled")

    def test_disabling_a_source_is_seen_after_the_cache_period(self, api: Api, source: NewSource) -> None:
        assert post(api, "/v1/batch", {"batch": [track()]}, headers=basic(source.key)).status_code == 200
        Source(write_key=source.key, destinations=["crm"], enabled=False).save(source.name, overwrite=True)
        time.sleep(1.2)
        assert post(api, "/v1/batch", {"batch": [track()]}, headers=basic(source.key)).status_code == 403

    def test_invalid_json_is_400(self, api: Api, source: NewSource) -> None:
        response = httpx.post(f"{api.url}/v1/batch", content=b"{not json", headers=basic(source.key), timeout=10)
        self.assert_error(response, 400, "invalid_json")

    def test_body_that_is_not_a_batch_is_400(self, api: Api, source: NewSource) -> None:
        self.assert_error(post(api, "/v1/batch", {"batch": "x"}, headers=basic(source.key)), 400, "invalid_batch")

    def test_body_over_500kb_is_400(self, api: Api, source: NewSource) -> None:
        batch = [track(properties={"pad": "x" * 20_000}) for _ in range(30)]
        body = orjson.dumps({"batch": batch})
        assert len(body) > MAX_BATCH_BYTES
        response = httpx.post(f"{api.url}/v1/batch", content=body, headers=basic(source.key), timeout=10)
        self.assert_error(response, 400, "body_too_large")
        assert api.rows(source.name) == []

    def test_gzip_bomb_is_400_without_inflating_it(self, api: Api, source: NewSource) -> None:
        bomb = gzip.compress(b'{"batch": [' + b" " * 50_000_000 + b"]}", compresslevel=9)
        assert len(bomb) < MAX_BATCH_BYTES
        headers = {**basic(source.key), "Content-Encoding": "gzip"}
        response = httpx.post(f"{api.url}/v1/batch", content=bomb, headers=headers, timeout=30)
        self.assert_error(response, 400, "body_too_large")

    def test_bad_gzip_is_400(self, api: Api, source: NewSource) -> None:
        headers = {**basic(source.key), "Content-Encoding": "gzip"}
        response = httpx.post(f"{api.url}/v1/batch", content=b"not gzip at all", headers=headers, timeout=10)
        self.assert_error(response, 400, "invalid_encoding")

    def test_deflate_is_accepted(self, api: Api, source: NewSource) -> None:
        headers = {**basic(source.key), "Content-Encoding": "deflate"}
        body = zlib.compress(orjson.dumps({"batch": [track("d")]}))
        assert httpx.post(f"{api.url}/v1/batch", content=body, headers=headers, timeout=10).status_code == 200

    def test_message_over_32kb_is_400_naming_its_index(self, api: Api, source: NewSource) -> None:
        batch = [track(), track(), track(properties={"pad": "x" * MAX_MESSAGE_BYTES})]
        body = self.assert_error(post(api, "/v1/batch", {"batch": batch}, headers=basic(source.key)), 400,
                                 "message_too_large")
        assert "index 2" in body["message"]
        assert api.rows(source.name) == []

    def test_invalid_single_call_is_400(self, api: Api, source: NewSource) -> None:
        body = self.assert_error(post(api, "/v1/track", {"userId": "u"}, headers=basic(source.key)), 400,
                                 "invalid_message")
        assert "event" in body["message"]

    def test_errors_never_echo_the_write_key(self, api: Api) -> None:
        secret = "wk_secret_never_echoed"
        response = post(api, "/v1/batch", {"batch": [track()]}, headers=basic(secret))
        assert secret not in response.text


def test_health_reports_the_store(api: Api) -> None:
    response = httpx.get(f"{api.url}/health", timeout=10)
    assert response.status_code == 200
    assert response.json()["ok"] is True and response.json()["store"] is True


def test_openapi_documents_the_request_bodies(api: Api) -> None:
    schema = httpx.get(f"{api.url}/openapi.json", timeout=10).json()
    batch = schema["paths"]["/v1/batch"]["post"]
    assert "batch" in batch["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert set(schema["paths"]) >= {f"/v1/{t}" for t in (*MESSAGE_TYPES, "batch", "import")} | {"/health"}
    # No stray query parameters on the single-call routes.
    assert "parameters" not in schema["paths"]["/v1/track"]["post"]


@pytest.mark.slow
def test_kill_during_load_keeps_every_acknowledged_batch(
    prefect_harness: None, source: NewSource, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'kill.db'}"
    get_engine(store_url)
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load(server_url: str) -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                batch = [track() for _ in range(100)]
                try:
                    response = client.post(
                        f"{server_url}/v1/batch", content=orjson.dumps({"batch": batch}), headers=basic(source.key)
                    )
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    with lock:
                        acknowledged.extend(m["messageId"] for m in batch)

    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=SERVER_ENV) as server:
        threads = [threading.Thread(target=load, args=(server.url,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while len(acknowledged) < 5000 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()
        stop.set()
        for thread in threads:
            thread.join(15)
    assert server.process.returncode == -9
    assert len(acknowledged) >= 5000
    with get_engine(store_url).connect() as connection:
        stored = set(connection.execute(select(OUTBOX.c.message_id).where(OUTBOX.c.source == source.name)).scalars())
        total = connection.execute(select(func.count()).select_from(OUTBOX)).scalar_one()
    missing = set(acknowledged) - stored
    assert not missing, f"{len(missing)} acknowledged calls missing after the kill"
    assert total >= len(acknowledged)



def test_sdk_calls_reach_a_receiver_signed(
    api: Api, prefect_harness: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from segment.analytics import Client

    from prefect_webhooks.flows.deliver import deliver

    destination = f"e2e-dest-{uuid.uuid4().hex[:6]}"
    save_destination(destination, [receiver.url], shared_secret="e2e-secret-000001")
    name, key = f"e2e-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    save_source(name, key, [destination])
    client = Client(write_key=key, host=api.url, sync_mode=True)
    client.identify("e2e-user", {"plan": "pro"})
    client.track("e2e-user", "Order Completed", {"total": 10})
    client.alias("anon-9", "e2e-user")
    client.flush()

    # The deliver flow runs here and reads the API's store from the settings.
    monkeypatch.setenv("PREFECT_WEBHOOKS_DATABASE_URL", api.store_url)
    get_settings.cache_clear()
    try:
        summary = deliver(destination=destination)
    finally:
        get_settings.cache_clear()
    assert summary["delivered"] == 3
    bodies = {}
    for request in receiver.requests:
        assert verify(request.body, request.headers["X-Signature"], "e2e-secret-000001")
        body = orjson.loads(request.body)
        bodies[body["type"]] = body
    assert bodies["identify"]["userId"] == "e2e-user" and bodies["identify"]["traits"] == {"plan": "pro"}
    assert bodies["track"]["event"] == "Order Completed" and bodies["track"]["properties"] == {"total": 10}
    assert bodies["alias"]["Previous ID"] == "anon-9" and bodies["alias"]["User ID"] == "e2e-user"
