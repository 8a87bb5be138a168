"""Security: write keys (constant-time check, one key one source), secrets kept out of logs, artifacts, errors and
the block UI, outbound URL schemes, and the SSRF guard end to end through a ``deliver`` run.

Real parts throughout: the ingest API as a uvicorn subprocess, blocks and flow runs on the session's Prefect API,
real receivers on 127.0.0.1.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import logging
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from prefect import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.settings import PREFECT_API_URL
from pydantic import ValidationError

from prefect_webhooks.blocks.destination import WebhookDestination
from prefect_webhooks.blocks.endpoint import WebhookEndpoint
from prefect_webhooks.blocks.source import Source
from prefect_webhooks.flows.deliver import deliver
from prefect_webhooks.inbound import sources
from prefect_webhooks.inbound.sources import SourceInfo, SourceRegistry
from prefect_webhooks.messages.outcomes import DELIVERED, FAILED
from prefect_webhooks.settings import get_settings
from prefect_webhooks.store.engine.engines import get_engine
from prefect_webhooks.store.log.lookups import MessageQuery, find_messages, message_document
from prefect_webhooks.store.queue.outbox import enqueue
from tests.receivers import Receiver
from tests.servers import ROOT, IngestServer, _wait_healthy, free_port, ingest_api_process, save_source
from tests.stored import every_message

pytestmark = pytest.mark.usefixtures("prefect_harness")

SERVER_ENV = {"PREFECT_WEBHOOKS_UNKNOWN_KEY_REFRESH_SECONDS": "0", "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "1"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


def track(user: str) -> dict[str, Any]:
    return {"type": "track", "userId": user, "event": "Signed Up", "messageId": unique("m")}


# --- write keys --------------------------------------------------------------------------------------------------


def test_the_final_key_check_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The registry finds a candidate by the key's SHA-256 and confirms it with hmac.compare_digest on the digests
    # (it keeps no key in the clear); `==` would return early at the first differing byte.
    source_code = inspect.getsource(SourceRegistry._find)
    assert "hmac.compare_digest" in source_code and "==" not in source_code
    compared: list[tuple[bytes, bytes]] = []
    real = sources.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(sources.hmac, "compare_digest", spy)
    registry = SourceRegistry(cache_seconds=3600, unknown_key_refresh_seconds=3600)
    registry.load([("wk_live_abcdef", SourceInfo("web")), ("wk_live_abcdeg", SourceInfo("ios"))])
    assert registry._find("wk_live_abcdef") == SourceInfo("web")
    digest = hashlib.sha256(b"wk_live_abcdef").digest()
    assert compared == [(digest, digest)]
    assert registry._find("wk_live_abcdeh") is None
    assert registry._find("wk_live_abcde") is None
    assert registry._find("wk_live_abcdef ") is None


@dataclass
class Api:
    server: IngestServer
    store_url: str

    def post(self, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{self.server.url}{path}", content=orjson.dumps(body),
                          headers={"Content-Type": "application/json", **headers}, timeout=30)

    def rows(self, source: str) -> list[Any]:
        return every_message(self.store_url, source=source)


@pytest.fixture(scope="module")
def api(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('security') / 'store.db'}"
    get_engine(store_url)
    with ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=SERVER_ENV) as server:
        yield Api(server, store_url)


def test_right_key_accepted_and_a_key_differing_in_the_last_char_refused(api: Api) -> None:
    key = f"wk_{uuid.uuid4().hex}"
    name = unique("src")
    save_source(name, key, ["crm"])
    assert api.post("/v1/batch", {"batch": [track("u1")]}, basic(key)).status_code == 200
    near = key[:-1] + ("0" if key[-1] != "0" else "1")
    for headers, body in [(basic(near), {"batch": [track("u2")]}), ({}, {"batch": [track("u3")], "writeKey": near}),
                          (basic(key[:-1]), {"batch": [track("u4")]}), (basic(key + "x"), {"batch": [track("u5")]})]:
        response = api.post("/v1/batch", body, headers)
        assert response.status_code == 401
        assert response.json()["code"] == "invalid_write_key"
        # The refusal never echoes a key, neither the one sent nor the real one.
        assert key[:-1] not in response.text
    assert [orjson.loads(row.body)["userId"] for row in api.rows(name)] == ["u1"]


def test_a_write_key_admits_messages_only_into_its_own_source(api: Api) -> None:
    web, ios = unique("web"), unique("ios")
    web_key, ios_key = f"wk_{uuid.uuid4().hex}", f"wk_{uuid.uuid4().hex}"
    save_source(web, web_key, ["crm", "ads"])
    save_source(ios, ios_key, ["warehouse"])
    assert api.post("/v1/batch", {"batch": [track("web-user")]}, basic(web_key)).status_code == 200
    # A body writeKey naming the other source does not win over the Basic key.
    assert api.post("/v1/batch", {"batch": [track("ios-user")], "writeKey": web_key}, basic(ios_key)).status_code == 200
    assert api.post("/v1/track", {**track("ios-single"), "writeKey": ios_key}, {}).status_code == 200

    web_rows, ios_rows = api.rows(web), api.rows(ios)
    assert sorted((orjson.loads(row.body)["userId"], row.destination) for row in web_rows) == [
        ("web-user", "ads"), ("web-user", "crm")]
    assert sorted((orjson.loads(row.body)["userId"], row.destination) for row in ios_rows) == [
        ("ios-single", "warehouse"), ("ios-user", "warehouse")]


@pytest.fixture(scope="module")
def verbose_api(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IngestServer]:
    """The ingest API at debug level with the access log on, and Prefect's client logging at debug too."""
    store_url = f"sqlite:///{tmp_path_factory.mktemp('verbose') / 'store.db'}"
    port = free_port()
    env = {**os.environ, **SERVER_ENV, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PREFECT_WEBHOOKS_DATABASE_URL": store_url, "PREFECT_LOGGING_LEVEL": "DEBUG",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect_webhooks.cli", "ingest", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "debug", "--access-log"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        server = IngestServer(url=f"http://127.0.0.1:{port}", process=process, log=log)
        try:
            _wait_healthy(server, 60)
            yield server
        finally:
            process.terminate()
            process.wait(15)


def test_the_api_never_logs_write_keys_even_at_debug_level(verbose_api: IngestServer) -> None:
    key, wrong = f"wk_{uuid.uuid4().hex}", f"wk_{uuid.uuid4().hex}"
    save_source(unique("src"), key, ["crm"])
    api = Api(verbose_api, "")
    assert api.post("/v1/batch", {"batch": [track("u")]}, basic(key)).status_code == 200
    assert api.post("/v1/batch", {"batch": [track("u")], "writeKey": wrong}, {}).status_code == 401
    assert api.post("/v1/batch", {"batch": [track("u")]}, basic(wrong)).status_code == 401
    assert api.post("/v1/track", {**track("u"), "writeKey": key}, {}).status_code == 200
    api.post("/v1/batch", {"batch": [{"type": "nope", "userId": key}]}, basic(key))
    output = verbose_api.output()
    assert "POST /v1/batch" in output and "401" in output, output[-2000:]  # the log was captured
    for secret in (key, wrong, base64.b64encode(f"{key}:".encode()).decode(), key[3:]):
        assert secret not in output


# --- secrets in blocks: errors and the UI form --------------------------------------------------------------------

SECRET_HEADER = "Bearer hdr-s3cret-9f8e7d"
SHARED_SECRET = "shared-s3cret-1a2b3c"
URL_TOKEN = "urltok-s3cret-4d5e6f"


@pytest.mark.parametrize(
    "endpoint",
    [
        {"url": "https://hooks.example.com/in", "headers": {"Authorization": SECRET_HEADER + "\r\nX-Evil: 1"}},
        {"url": "https://hooks.example.com/in", "headers": {"X-Signature": SECRET_HEADER}},
        {"url": "https://hooks.example.com/in", "headers": {"Bad Name": SECRET_HEADER}},
        {"url": "ftp://hooks.example.com/in", "headers": {"Authorization": SECRET_HEADER}},
        {"url": "https://hooks.example.com/in", "headers": {"Authorization": SECRET_HEADER}, "extra": SECRET_HEADER},
    ],
    ids=["line-break", "reserved", "bad-name", "bad-scheme", "extra-field"],
)
def test_block_validation_errors_never_echo_secrets(endpoint: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        WebhookDestination(endpoints=[endpoint], shared_secret=SHARED_SECRET)
    # The message (what gets logged or shown) never holds the input. ``errors()`` keeps the raw input by pydantic's
    # design; code that forwards errors must pass include_input=False, which is checked too.
    assert "s3cret" not in str(caught.value) + repr(caught.value)
    details = caught.value.errors(include_url=False, include_input=False)
    assert "s3cret" not in orjson.dumps(details, default=str).decode()


def test_source_validation_errors_never_echo_the_write_key() -> None:
    with pytest.raises(ValidationError) as caught:
        Source(write_key="wk_s3cret_key", destinations="not-a-list")
    assert "wk_s3cret_key" not in str(caught.value) + repr(caught.value)
    with pytest.raises(ValidationError) as caught:
        Source(write_key=" \t ")
    assert "write_key" in str(caught.value)


@pytest.mark.parametrize(
    "url",
    ["ftp://hooks.example.com/in", "file:///etc/passwd", "javascript:alert(1)", "gopher://h/x", "hooks.example.com/in",
     "//hooks.example.com/in", "http:///no-host", "ws://hooks.example.com/", "data:text/plain,x", ""],
)
def test_outbound_urls_must_be_http_or_https(url: str) -> None:
    with pytest.raises(ValidationError):
        WebhookEndpoint(url=url)


@pytest.mark.parametrize("url", ["http://hooks.example.com/in", "https://hooks.example.com:8443/in?x=1", "HTTPS://H.io"])
def test_http_and_https_urls_are_accepted(url: str) -> None:
    assert WebhookEndpoint(url=url).url == url


async def test_the_block_ui_form_masks_every_secret() -> None:
    destination_name, source_name = unique("dest"), unique("src")
    write_key = f"wk_s3cret_{uuid.uuid4().hex}"
    await WebhookDestination(
        endpoints=[{"url": f"https://hooks.example.com/in?token={URL_TOKEN}",
                    "headers": {"Authorization": SECRET_HEADER, "X-Api-Key": "k3y-s3cret"}}],
        shared_secret=SHARED_SECRET,
    ).save(destination_name)
    await Source(write_key=write_key, destinations=[destination_name]).save(source_name)
    async with get_client() as client:
        masked_destination = await client.read_block_document_by_name(
            destination_name, WebhookDestination.get_block_type_slug(), include_secrets=False)
        masked_source = await client.read_block_document_by_name(
            source_name, Source.get_block_type_slug(), include_secrets=False)
        listed = await client.read_block_documents(include_secrets=False)
    for document in (masked_destination, masked_source, *listed):
        dumped = orjson.dumps(document.model_dump(mode="json")).decode()
        for secret in (SECRET_HEADER, "k3y-s3cret", SHARED_SECRET, URL_TOKEN, write_key):
            assert secret not in dumped, (document.name, secret)
    assert set(masked_destination.data["shared_secret"]) == {"*"}
    assert set(masked_source.data["write_key"]) == {"*"}
    # The secrets are still there for the code that loads the block.
    loaded = await WebhookDestination.load(destination_name)
    assert loaded.secret() == SHARED_SECRET
    assert loaded.endpoints[0].header_values()["Authorization"] == SECRET_HEADER


# --- secrets in delivery logs and artifacts ----------------------------------------------------------------------


@pytest.fixture
def fast_delivery(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in {"RETRY_BASE_DELAY": "0.1", "RETRY_MAX_DELAY": "0.2", "TASK_RETRIES": "1",
                        "REQUEST_TIMEOUT": "1", "BLOCK_CACHE_SECONDS": "0"}.items():
        monkeypatch.setenv(f"PREFECT_WEBHOOKS_{name}", value)
    get_settings.cache_clear()
    yield store_url
    get_settings.cache_clear()


async def flow_run_logs(flow_run_id: uuid.UUID) -> str:
    await APILogHandler.aflush()
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
    return "\n".join(log.message for log in logs)


async def flow_run_artifacts(flow_run_id: uuid.UUID) -> list[dict[str, Any]]:
    async with get_client() as client:
        response = await client.request(
            "POST", "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 100, "offset": 0,
                  "sort": "CREATED_DESC"})
    return response.json()


async def test_a_delivery_run_keeps_secrets_out_of_logs_and_artifacts(
    fast_delivery: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    name = unique("dest")
    headers = {"Authorization": SECRET_HEADER, "X-Api-Key": "k3y-s3cret"}
    # One endpoint fails for good (400), one times out then succeeds, one is refused: every log path is taken.
    with Receiver(default=400) as rejecting, Receiver(script=[{"status": 200, "delay": 3}, 200]) as slow:
        endpoints = [{"url": f"{rejecting.url}?token={URL_TOKEN}", "headers": headers},
                     {"url": f"{slow.url}?token={URL_TOKEN}", "headers": headers},
                     {"url": f"http://127.0.0.1:9/hook?token={URL_TOKEN}", "headers": headers}]
        await WebhookDestination(endpoints=endpoints, shared_secret=SHARED_SECRET).save(name)
        enqueue(name, [{"version": 1, "type": "track", "userId": "u1", "event": "E",
                        "timestamp": "2026-01-01T00:00:00.000Z"}])
        state = await deliver(return_state=True)
        await state.result()
        assert rejecting.requests and all(r.headers["Authorization"] == SECRET_HEADER for r in rejecting.requests)
    flow_run_id = state.state_details.flow_run_id
    logs = await flow_run_logs(flow_run_id)
    artifacts = await flow_run_artifacts(flow_run_id)
    assert "deliver:" in logs and artifacts, "the run's logs and artifacts were read"
    reasons = " ".join(str(row.reason) for row in every_message())
    # What the store keeps of each attempt, as `messages show`, the admin API and the console show it.
    with get_engine().connect() as connection:
        shown = orjson.dumps([message_document(m) for m in find_messages(connection, MessageQuery())]).decode()
    assert "127.0.0.1:9/hook" in shown
    for text in (logs, caplog.text, orjson.dumps(artifacts).decode(), reasons, shown):
        for secret in (SECRET_HEADER, "hdr-s3cret", "k3y-s3cret", SHARED_SECRET, URL_TOKEN):
            assert secret not in text


# --- the SSRF guard end to end -----------------------------------------------------------------------------------


async def test_ssrf_guard_refuses_a_loopback_destination_in_a_deliver_run(
    fast_delivery: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_WEBHOOKS_BLOCK_PRIVATE_NETWORKS", "true")
    get_settings.cache_clear()
    name = unique("dest")
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url.replace("127.0.0.1", "localhost")},
                                            {"url": receiver.url}]).save(name)
        enqueue(name, [{"version": 1, "type": "track", "userId": "u1", "event": "E",
                        "timestamp": "2026-01-01T00:00:00.000Z"}])
        summary = await deliver()
        assert receiver.requests == []
    assert summary["failed"] == 1 and summary["delivered"] == 0
    (row,) = every_message()
    assert row.state == FAILED and "private or loopback" in (row.reason or "")


async def test_without_the_guard_the_same_destination_is_delivered(fast_delivery: str) -> None:
    name = unique("dest")
    with Receiver() as receiver:
        await WebhookDestination(endpoints=[{"url": receiver.url}]).save(name)
        enqueue(name, [{"version": 1, "type": "track", "userId": "u1", "event": "E",
                        "timestamp": "2026-01-01T00:00:00.000Z"}])
        summary = await deliver()
        assert len(receiver.requests) == 1
    assert summary["delivered"] == 1
    assert [row.state for row in every_message()] == [DELIVERED]
