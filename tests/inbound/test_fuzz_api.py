"""Fuzzing the ingest API over real HTTP: a real uvicorn subprocess, Source blocks on the session's Prefect API.

Whatever arrives — hostile bodies, random bytes, schema-driven (schemathesis) requests — the API answers 200 or a
4xx whose JSON body is ``{code, message}``; never a 5xx, and the server never logs a traceback.
"""

from __future__ import annotations

import base64
import gzip
import json
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prefect.settings import PREFECT_API_URL
from sqlalchemy import create_engine

from prefect_webhooks.inbound.api import create_app
from prefect_webhooks.messages.model import MAX_BATCH_BYTES, MESSAGE_TYPES
from prefect_webhooks.store.engine.engines import get_engine
from tests.servers import IngestServer, ingest_api_process, save_source

SERVER_ENV = {"PREFECT_WEBHOOKS_UNKNOWN_KEY_REFRESH_SECONDS": "0", "PREFECT_WEBHOOKS_BLOCK_CACHE_SECONDS": "30"}
PATHS = ["/v1/batch", "/v1/import", *(f"/v1/{call_type}" for call_type in MESSAGE_TYPES)]


@dataclass
class Api:
    server: IngestServer
    key: str
    client: httpx.Client

    def post(self, path: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        sent = {"Content-Type": "application/json", **basic(self.key), **(headers or {})}
        return self.client.post(f"{self.server.url}{path}", content=content, headers=sent)


def basic(key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:".encode()).decode()}


@pytest.fixture(scope="module")
def api(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    store_url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'store.db'}"
    get_engine(store_url)
    key = f"wk_{uuid.uuid4().hex}"
    save_source(f"fuzz-{uuid.uuid4().hex[:8]}", key, ["crm"])
    with (
        ingest_api_process(store_url, prefect_api_url=PREFECT_API_URL.value(), env=SERVER_ENV) as server,
        httpx.Client(timeout=30) as client,
    ):
        yield Api(server, key, client)
        output = server.output()
        assert "Traceback" not in output, output[-3000:]
        assert server.process.poll() is None, "the API died during the fuzzing"


def assert_answered(response: httpx.Response) -> Any:
    """200 with the ingest result, or a 4xx with a ``{code, message}`` reason; never a 5xx."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    body = response.json()
    if response.status_code == 200:
        assert body["success"] is True
        for rejection in body["rejected"]:
            assert rejection["field"] and rejection["reason"]
    else:
        assert 400 <= response.status_code < 500
        assert isinstance(body["code"], str) and body["code"]
        assert isinstance(body["message"], str) and body["message"]
    return body


def assert_refused(response: httpx.Response, status: int = 400, code: str | None = None) -> dict[str, Any]:
    body = assert_answered(response)
    assert response.status_code == status, (response.status_code, body)
    if code is not None:
        assert body["code"] == code, body
    return body


def track(**extra: Any) -> dict[str, Any]:
    return {"type": "track", "userId": "u1", "event": "Fuzzed", **extra}


def batch_of(*calls: Any) -> bytes:
    return orjson.dumps({"batch": list(calls)})


def nested_json(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# --- hand-picked hostile bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_body_is_refused(api: Api, path: str) -> None:
    assert_refused(api.post(path, b""), code="invalid_json")


@pytest.mark.parametrize("path", ["/v1/batch", "/v1/track"])
def test_an_oversized_body_is_refused(api: Api, path: str) -> None:
    body = batch_of(track(properties={"blob": "x" * (MAX_BATCH_BYTES + 10)}))
    assert_refused(api.post(path, body), code="body_too_large")


def test_an_oversized_chunked_body_without_length_is_refused(api: Api) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"batch": [], "pad": "'
        for _ in range(70):
            yield b"x" * 10_000
        yield b'"}'

    response = api.client.post(f"{api.server.url}/v1/batch", content=chunks(), headers=basic(api.key))
    assert_refused(response, code="body_too_large")


@pytest.mark.parametrize("depth", [100, 1_000, 10_000])
def test_deeply_nested_json_is_answered(api: Api, depth: int) -> None:
    body = b'{"batch": [{"type": "track", "userId": "u", "event": "E", "properties": ' + nested_json(depth) + b"}]}"
    assert_answered(api.post("/v1/batch", body))
    assert_refused(api.post("/v1/batch", b"[" * depth + b"]" * depth), code="invalid_batch" if depth < 1000 else None)


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe\xfd", b'{"batch": [{"type": "track", "userId": "\xc3\x28", "event": "E"}]}', b"\x00" * 64,
     '{"batch": []}'.encode("utf-16"), b'{"batch": [{"userId": "\xed\xa0\x80"}]}'],
    ids=["garbage", "bad-utf8-in-string", "nul-bytes", "utf-16", "surrogate"],
)
def test_non_utf8_bytes_are_refused(api: Api, body: bytes) -> None:
    assert_refused(api.post("/v1/batch", body), code="invalid_json")


@pytest.mark.parametrize(
    "literal", [b"1" + b"0" * 400, b"-1" + b"0" * 400, b"1e400", b"NaN", b"Infinity", b"-Infinity", b"1" + b"0" * 30],
    ids=["10**400", "-10**400", "1e400", "NaN", "Infinity", "-Infinity", "10**30"],
)
@pytest.mark.parametrize("field", ["properties", "userId", "timestamp", "event"])
def test_huge_numbers_and_nan_literals_are_answered(api: Api, literal: bytes, field: str) -> None:
    value = b'{"n": ' + literal + b"}" if field == "properties" else literal
    body = b'{"batch": [{"type": "track", "userId": "u", "event": "E", "' + field.encode() + b'": ' + value + b"}]}"
    assert_answered(api.post("/v1/batch", body))


def test_duplicate_keys_are_answered(api: Api) -> None:
    body = b'{"batch": [{"type": "track", "type": "identify", "userId": "u", "userId": 5, "event": "E"}], "batch": []}'
    assert_answered(api.post("/v1/batch", body))
    single = b'{"userId": "u", "event": "E", "event": "", "writeKey": "x", "writeKey": null}'
    assert_answered(api.post("/v1/track", single))


def test_an_impossible_clock_correction_is_a_rejection_not_a_5xx(api: Api) -> None:
    # sentAt in year 9999 and timestamp in year 1: correcting the clock overflows the date range.
    skewed = track(timestamp="0001-01-01T00:00:00Z", sentAt="9999-12-31T23:59:59Z")
    body = assert_answered(api.post("/v1/batch", batch_of(skewed, track())))
    assert body["accepted"] == 1 and [rejection["field"] for rejection in body["rejected"]] == ["sentAt"]
    assert_refused(api.post("/v1/track", orjson.dumps(skewed)), code="invalid_message")


WRONG_VALUES = [None, True, 0, -1, 1.5, "", [], ["x"], {}, {"a": 1}, "x" * 2000]
CALL_FIELDS = ["type", "userId", "anonymousId", "messageId", "timestamp", "originalTimestamp", "sentAt", "context",
               "integrations", "event", "properties", "traits", "name", "groupId", "previousId"]


@pytest.mark.parametrize("field", CALL_FIELDS)
def test_wrong_types_for_every_call_field_are_answered(api: Api, field: str) -> None:
    calls = [track(**{field: value}) for value in WRONG_VALUES]
    body = assert_answered(api.post("/v1/batch", batch_of(*calls)))
    assert body["accepted"] + body["duplicates"] + body["suppressed"] + len(body["rejected"]) == len(calls)
    for value in WRONG_VALUES:
        assert_answered(api.post("/v1/track", orjson.dumps(track(**{field: value}))))


@pytest.mark.parametrize("field", ["batch", "context", "integrations", "sentAt", "writeKey"])
def test_wrong_types_for_every_batch_field_are_answered(api: Api, field: str) -> None:
    for value in WRONG_VALUES:
        assert_answered(api.post("/v1/batch", orjson.dumps({"batch": [track()], field: value})))


@pytest.mark.parametrize("field", ["context", "integrations"])
def test_a_call_field_of_the_wrong_type_under_batch_level_objects_is_answered(api: Api, field: str) -> None:
    # The batch-level objects merge into each call's own: a call's own value of the wrong type must be refused
    # by name, not break the merge (found by schemathesis: a 503 for a list-valued context).
    calls = [track(**{field: value}) for value in WRONG_VALUES]
    envelope = {"batch": calls, "context": {"": None, "integrations": {"All": True}}, "integrations": {"All": True}}
    body = assert_answered(api.post("/v1/batch", orjson.dumps(envelope)))
    assert body["accepted"] + body["duplicates"] + body["suppressed"] + len(body["rejected"]) == len(calls)
    assert any(rejection["field"].endswith(field) for rejection in body["rejected"]), body["rejected"]


@pytest.mark.parametrize("body", [b"[]", b"null", b"1", b'"batch"', b"true", b"[{}]"])
@pytest.mark.parametrize("path", ["/v1/batch", "/v1/identify"])
def test_json_that_is_not_an_object_is_refused(api: Api, body: bytes, path: str) -> None:
    assert_refused(api.post(path, body))


def test_a_gzip_bomb_is_refused_without_inflating_it(api: Api) -> None:
    bomb = gzip.compress(b'{"batch": [' + b" " * (200 * 1024 * 1024) + b"]}", compresslevel=9)
    assert len(bomb) < 300 * 1024
    response = api.post("/v1/batch", bomb, headers={"Content-Encoding": "gzip"})
    assert_refused(response, code="body_too_large")
    deflated = zlib.compress(b" " * (50 * 1024 * 1024), 9)
    assert_refused(api.post("/v1/batch", deflated, headers={"Content-Encoding": "deflate"}), code="body_too_large")


@pytest.mark.parametrize(
    ("encoding", "body"),
    [("gzip", b"not gzip at all"), ("gzip", gzip.compress(batch_of(track()))[:-12]), ("br", b"x"),
     ("deflate", b"\x78\x9c garbage"), ("gzip, gzip", gzip.compress(gzip.compress(batch_of(track()))))],
    ids=["not-gzip", "truncated", "unsupported", "bad-deflate", "stacked"],
)
def test_bad_compression_is_refused(api: Api, encoding: str, body: bytes) -> None:
    assert_refused(api.post("/v1/batch", body, headers={"Content-Encoding": encoding}), code="invalid_encoding")


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "",
     "application/json; charset=latin-1"],
)
def test_wrong_content_types_are_answered(api: Api, content_type: str) -> None:
    assert_answered(api.post("/v1/batch", batch_of(track()), headers={"Content-Type": content_type}))
    assert_answered(api.post("/v1/batch", b"a=1&b=2", headers={"Content-Type": content_type}))


@pytest.mark.parametrize(
    "authorization",
    ["Basic", "Basic !!!", "Basic " + base64.b64encode(b"\xff\xfe:").decode(), "Bearer x", "Basic " + "A" * 10_000,
     "Basic " + base64.b64encode(b":").decode()],
    ids=["no-value", "not-base64", "not-utf8", "bearer", "huge", "empty-user"],
)
def test_malformed_authorization_is_a_401_with_a_reason(api: Api, authorization: str) -> None:
    response = api.post("/v1/batch", batch_of(track()), headers={"Authorization": authorization})
    assert_refused(response, status=401)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/batch"), ("PUT", "/v1/track"), ("POST", "/v1/nothing"),
                                              ("DELETE", "/health"), ("POST", "/v2/batch")])
def test_routing_refusals_carry_a_code_and_message(api: Api, method: str, path: str) -> None:
    response = api.client.request(method, f"{api.server.url}{path}", content=batch_of(track()), headers=basic(api.key))
    assert_refused(response, status=405 if path in ("/v1/batch", "/v1/track", "/health") else 404)


# --- property-based: random bytes and random JSON ----------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
calls = st.dictionaries(
    st.sampled_from(CALL_FIELDS) | st.text(max_size=6), json_values, max_size=8
) | json_values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), body=st.binary(max_size=400))
def test_random_bytes_never_cause_a_5xx(api: Api, path: str, body: bytes) -> None:
    assert_answered(api.post(path, body))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), envelope=st.fixed_dictionaries(
    {"batch": st.lists(calls, max_size=5)},
    optional={"context": json_values, "integrations": json_values, "sentAt": json_values},
))
def test_random_json_calls_never_cause_a_5xx(api: Api, path: str, envelope: dict[str, Any]) -> None:
    body = envelope if path in ("/v1/batch", "/v1/import") else (envelope["batch"] or [{}])[0]
    # The stdlib encoder: it writes integers of any size, which orjson refuses to.
    assert_answered(api.post(path, json.dumps(body).encode()))


# --- schemathesis against the published OpenAPI schema ----------------------------------------------------------


def published_schema() -> dict[str, Any]:
    """The OpenAPI document the server publishes at /openapi.json (built from the same app, without serving it)."""
    return create_app(engine=create_engine("sqlite://")).openapi()


# Loaded at import (schemathesis' lazy ``from_fixture`` does not work with this pytest version); the requests go to
# the real server of the ``api`` fixture. A test below checks the served document is this one.
schema = schemathesis.openapi.from_dict(published_schema()).include(method="POST")


def test_the_fuzzed_schema_is_the_served_one(api: Api) -> None:
    served = api.client.get(f"{api.server.url}/openapi.json").json()
    assert served["paths"].keys() == published_schema()["paths"].keys()
    assert served["paths"]["/v1/batch"] == published_schema()["paths"]["/v1/batch"]


def check_case(case: Any, api: Api) -> None:
    """Send a generated request to the real server; the answer must be 200 or a 4xx with a reason."""
    response = case.call(base_url=api.server.url, headers=basic(api.key))
    assert response.status_code < 500, (case.path, case.body, response.text[:300])
    body = response.json()
    if response.status_code != 200:
        assert body.get("code") and body.get("message"), (response.status_code, case.path, body)


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_requests_never_cause_a_5xx(case: Any, api: Api) -> None:
    check_case(case, api)


@pytest.mark.slow
@pytest.mark.shares_machine
@schema.parametrize()
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_long_run_never_causes_a_5xx(case: Any, api: Api) -> None:
    check_case(case, api)
